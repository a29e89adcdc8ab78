/*
 * test_kernels.c — the arm64 NEON(+dotprod) kernel set against the scalar
 * reference, through the public API (ds4_dequantize_row / ds4_quantize_row /
 * ds4_vec_dot with DS4_ISA_NEON vs DS4_ISA_SCALAR).
 *
 * Built and run by `make test-neon`: cross-compiled with aarch64-linux-gnu-gcc
 * (static) and run under `qemu-aarch64 -cpu max`, whose CPU model has the
 * dot-product extension. It also runs natively on any arm64 Linux machine.
 *
 * What must hold (and why):
 *  - to_float: bit-exact (the NEON kernels repeat the reference's float ops).
 *  - from_float Q8_0/Q8_1/Q8_K: byte-exact, on random rows, rounding ties and
 *    rows holding NaN/Inf/huge values.
 *  - dots: within a derived float-reassociation bound, see dot_bound().
 *  - every NEON row is read from a buffer that ends at a PROT_NONE page, so a
 *    read past the last block faults; the NEON result must not change with
 *    the buffer's position (a fixed reduction order that depends on n only).
 * Prints one line per check, then "N passed, M failed"; exits 1 if M > 0.
 */
#include "ds4.h"
#include "cpu.h"
#include "quants/quants.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int g_pass, g_fail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) g_pass++; else g_fail++;
}

/* ------------------------------------------------------------- random -- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;  /* fixed seed: reproducible */

static uint64_t rnd(void) {  /* splitmix64 */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static int irange(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

/* A float of random sign and magnitude in [2^e0, 2^e1). */
static float rnd_mag(int e0, int e1) {
    float m = (float)ldexp(1.0 + unif(), irange(e0, e1 - 1));
    return (rnd() & 1) ? -m : m;
}
static uint16_t rnd_fp16(int e0, int e1) { return ds4_f32_to_fp16(rnd_mag(e0, e1)); }
static uint16_t rnd_bf16(int e0, int e1) { return ds4_f32_to_bf16(rnd_mag(e0, e1)); }

/* Activation-like floats: mostly O(1), a few outliers, some exact zeros. */
static void rnd_floats(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = rnd() % 64;
        x[i] = r == 0 ? 0.0f : r == 1 ? rnd_mag(2, 6) : (float)(unif() * 4.0 - 2.0);
    }
}

/* ------------------------------------------------------ guarded memory -- */
/* A region of `size` bytes that ends exactly where a PROT_NONE page starts,
 * so a kernel reading (or writing) past a row's end faults. */
typedef struct { void *base; size_t total; uint8_t *p; } guarded;

static guarded galloc(size_t size) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (size + pg - 1) / pg * pg;
    guarded g;
    g.total = body + pg;
    g.base = mmap(NULL, g.total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g.base == MAP_FAILED) { perror("mmap"); exit(2); }
    if (mprotect((uint8_t *)g.base + body, pg, PROT_NONE) != 0) { perror("mprotect"); exit(2); }
    g.p = (uint8_t *)g.base + body - size;
    return g;
}
static void gfree(guarded g) { munmap(g.base, g.total); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

/* ---------------------------------------------------------- the types -- */

typedef struct { int type; int64_t bs, ts; int act; } tinfo;

static tinfo info_of(int type) {
    ds4_type_info ti;
    ds4_error err;
    if (ds4_type_get_info(type, &ti, &err) != DS4_OK) { fprintf(stderr, "%s\n", err.message); exit(2); }
    tinfo t = {type, ti.block_size, ti.type_size, ti.vec_dot_type};
    return t;
}

static const int k_weight_types[] = {
    DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q4_0,
    DS4_TYPE_Q4_1, DS4_TYPE_Q5_0, DS4_TYPE_Q5_1, DS4_TYPE_Q4_K, DS4_TYPE_Q5_K,
    DS4_TYPE_Q6_K, DS4_TYPE_IQ4_NL, DS4_TYPE_IQ4_XS, DS4_TYPE_Q4_64A, DS4_TYPE_Q2_64A,
};
#define N_WEIGHT_TYPES ((int)(sizeof k_weight_types / sizeof k_weight_types[0]))

static const char *tname(int type) { return ds4_type_traits_table[type].name; }

/* Random valid weight blocks: random code bytes, then finite scales of
 * moderate size (fp16 2^-12..2^2, bf16 the same) in the scale fields. */
static void rnd_weights(int type, void *dst, int64_t nblk) {
    tinfo t = info_of(type);
    uint8_t *b = dst;
    for (int64_t i = 0; i < nblk * t.ts; i++) b[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < nblk; i++) {
        void *blk = b + i * t.ts;
        switch (type) {
        case DS4_TYPE_F32: { float f = rnd_mag(-8, 3); memcpy(blk, &f, 4); break; }
        case DS4_TYPE_F16: { uint16_t h = rnd_fp16(-12, 4); memcpy(blk, &h, 2); break; }
        case DS4_TYPE_BF16: { uint16_t h = rnd_bf16(-12, 4); memcpy(blk, &h, 2); break; }
        case DS4_TYPE_Q8_0: ((block_q8_0 *)blk)->d = rnd_fp16(-12, 2); break;
        case DS4_TYPE_Q4_0: ((block_q4_0 *)blk)->d = rnd_fp16(-12, 2); break;
        case DS4_TYPE_Q5_0: ((block_q5_0 *)blk)->d = rnd_fp16(-12, 2); break;
        case DS4_TYPE_IQ4_NL: ((block_iq4_nl *)blk)->d = rnd_fp16(-12, 2); break;
        case DS4_TYPE_IQ4_XS: ((block_iq4_xs *)blk)->d = rnd_fp16(-12, 2); break;
        case DS4_TYPE_Q6_K: ((block_q6_K *)blk)->d = rnd_fp16(-12, 2); break;
        case DS4_TYPE_Q4_1: {
            block_q4_1 *q = blk;
            q->d = rnd_fp16(-12, 2); q->m = rnd_fp16(-12, 2);
            break;
        }
        case DS4_TYPE_Q5_1: {
            block_q5_1 *q = blk;
            q->d = rnd_fp16(-12, 2); q->m = rnd_fp16(-12, 2);
            break;
        }
        case DS4_TYPE_Q4_K: {
            block_q4_K *q = blk;
            q->d = rnd_fp16(-12, 2); q->dmin = rnd_fp16(-12, 2);
            break;
        }
        case DS4_TYPE_Q5_K: {
            block_q5_K *q = blk;
            q->d = rnd_fp16(-12, 2); q->dmin = rnd_fp16(-12, 2);
            break;
        }
        case DS4_TYPE_Q4_64A: {
            block_q4_64a *q = blk;
            q->scale = rnd_bf16(-12, 2); q->bias = rnd_bf16(-12, 2);
            break;
        }
        case DS4_TYPE_Q2_64A: {
            block_q2_64a *q = blk;
            q->scale = rnd_bf16(-12, 2); q->bias = rnd_bf16(-12, 2);
            break;
        }
        default: break;
        }
    }
}

/* The additive (affine) part of weight j, from the stored fields: Q4_1/Q5_1
 * m, Q4_K/Q5_K -dmin*min_j, Q4_64A/Q2_64A bias; 0 for the other types. Used
 * only to size the dot error bound. */
static double weight_offset(int type, const void *row, int64_t j) {
    const uint8_t *r = row;
    tinfo t = info_of(type);
    const uint8_t *blk = r + (j / t.bs) * t.ts;
    int64_t e = j % t.bs;
    switch (type) {
    case DS4_TYPE_Q4_1: return ds4_fp16_to_f32(((const block_q4_1 *)blk)->m);
    case DS4_TYPE_Q5_1: return ds4_fp16_to_f32(((const block_q5_1 *)blk)->m);
    case DS4_TYPE_Q4_K:
    case DS4_TYPE_Q5_K: {
        /* Both lay out d, dmin, scales[12] first. */
        const block_q4_K *q = (const block_q4_K *)blk;
        int sub = (int)(e / 32), m;
        const uint8_t *s = q->scales;
        if (sub < 4) m = s[sub + 4] & 63;
        else m = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
        return -(double)ds4_fp16_to_f32(q->dmin) * m;
    }
    case DS4_TYPE_Q4_64A: return ds4_bf16_to_f32(((const block_q4_64a *)blk)->bias);
    case DS4_TYPE_Q2_64A: return ds4_bf16_to_f32(((const block_q2_64a *)blk)->bias);
    default: return 0.0;
    }
}

/* ------------------------------------------------------------- checks -- */

static int bits_equal(const float *a, const float *b, int64_t n, int64_t *first) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) { *first = i; return 0; }
    return 1;
}

static void check_dequant(int type, int64_t nblk) {
    tinfo t = info_of(type);
    const int64_t n = nblk * t.bs;
    const size_t wbytes = (size_t)(nblk * t.ts);
    guarded w = galloc(wbytes), out = galloc((size_t)n * 4);
    rnd_weights(type, w.p, nblk);
    float *ref = xmalloc((size_t)n * 4);
    ds4_error err;
    int rc1 = ds4_dequantize_row(DS4_ISA_SCALAR, type, w.p, ref, n, &err);
    int rc2 = ds4_dequantize_row(DS4_ISA_NEON, type, w.p, (float *)out.p, n, &err);
    int64_t at = -1;
    int ok = rc1 == DS4_OK && rc2 == DS4_OK && bits_equal(ref, (float *)out.p, n, &at);
    if (ok || at < 0) {
        check(ok, "dequant %-7s n=%-6lld bit-exact (rc %d/%d)", tname(type), (long long)n, rc1, rc2);
    } else {
        float a = ref[at], b = ((float *)out.p)[at];
        check(0, "dequant %-7s n=%-6lld bit-exact: element %lld scalar %.9g (0x%08x) neon %.9g (0x%08x)",
              tname(type), (long long)n, (long long)at, a, ds4_bits_from_f32(a), b, ds4_bits_from_f32(b));
    }
    free(ref);
    gfree(w);
    gfree(out);
}

/* Every one of the 65536 fp16 / bf16 patterns, NaNs and subnormals included:
 * the conversions are exact, so NEON must equal the reference bit for bit. */
static void check_dequant_all_halves(int type) {
    const int64_t n = 65536;
    guarded w = galloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) { uint16_t h = (uint16_t)i; memcpy(w.p + 2 * i, &h, 2); }
    float *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4);
    ds4_error err;
    int rc1 = ds4_dequantize_row(DS4_ISA_SCALAR, type, w.p, ref, n, &err);
    int rc2 = ds4_dequantize_row(DS4_ISA_NEON, type, w.p, got, n, &err);
    int64_t at = -1;
    int ok = rc1 == DS4_OK && rc2 == DS4_OK && bits_equal(ref, got, n, &at);
    if (ok || at < 0)
        check(ok, "dequant %-7s all 65536 bit patterns bit-exact", tname(type));
    else
        check(0, "dequant %-7s all 65536 bit patterns bit-exact: 0x%04llx -> scalar 0x%08x neon 0x%08x",
              tname(type), (long long)at, ds4_bits_from_f32(ref[at]), ds4_bits_from_f32(got[at]));
    free(ref);
    free(got);
    gfree(w);
}

static void check_quant_row(int type, const float *x, int64_t n, const char *what) {
    tinfo t = info_of(type);
    const size_t bytes = (size_t)(n / t.bs * t.ts);
    guarded src = galloc((size_t)n * 4), out = galloc(bytes);
    memcpy(src.p, x, (size_t)n * 4);
    uint8_t *ref = xmalloc(bytes);
    /* Distinct fill bytes, so a byte one side leaves unwritten differs. */
    memset(ref, 0xA5, bytes);
    memset(out.p, 0x5A, bytes);
    ds4_error err;
    int rc1 = ds4_quantize_row(DS4_ISA_SCALAR, type, x, ref, n, &err);
    int rc2 = ds4_quantize_row(DS4_ISA_NEON, type, (const float *)src.p, out.p, n, &err);
    size_t at = 0;
    int ok = rc1 == DS4_OK && rc2 == DS4_OK;
    if (ok) {
        for (at = 0; at < bytes; at++) if (ref[at] != out.p[at]) { ok = 0; break; }
    }
    if (ok)
        check(1, "quantize %-5s n=%-6lld %-10s byte-exact", tname(type), (long long)n, what);
    else
        check(0, "quantize %-5s n=%-6lld %-10s byte-exact: rc %d/%d, byte %zu (block %zu +%zu) scalar 0x%02x neon 0x%02x",
              tname(type), (long long)n, what, rc1, rc2, at, at / (size_t)t.ts, at % (size_t)t.ts,
              at < bytes ? ref[at] : 0, at < bytes ? out.p[at] : 0);
    free(ref);
    gfree(src);
    gfree(out);
}

static void check_quantizers(void) {
    const int types[] = {DS4_TYPE_Q8_0, DS4_TYPE_Q8_1, DS4_TYPE_Q8_K};
    const int64_t nblks[] = {1, 3, 7, 33};
    for (int ti = 0; ti < 3; ti++) {
        const int type = types[ti];
        const int64_t bs = info_of(type).bs;
        for (int k = 0; k < 4; k++) {
            const int64_t n = nblks[k] * bs;
            float *x = xmalloc((size_t)n * 4);
            rnd_floats(x, n);
            check_quant_row(type, x, n, "random");
            /* Scale-free data: each block's values at its own magnitude. */
            for (int64_t b = 0; b < nblks[k]; b++) {
                int e = irange(-30, 30);
                for (int64_t j = 0; j < bs; j++) x[b * bs + j] = (float)ldexp(unif() * 2 - 1, e);
            }
            check_quant_row(type, x, n, "wide-range");
            free(x);
        }
        /* Rounding ties: amax = 127 (id = 1, Q8_K iscale = 1 via max = -127)
         * makes x*id exact halves, which must round to even. */
        {
            const int64_t n = 2 * bs;
            float *x = xmalloc((size_t)n * 4);
            for (int64_t j = 0; j < n; j++) x[j] = (float)irange(-126, 125) + 0.5f;
            x[0] = type == DS4_TYPE_Q8_K ? -127.0f : 127.0f;
            x[bs] = -127.0f;
            check_quant_row(type, x, n, "ties");
            /* An all-zero block, then one of zeros and a few subnormals:
             * 127/amax overflows to Inf there (x86 gives -128 codes, Q8_K's
             * nearest_int its own bit pattern). */
            memset(x, 0, (size_t)n * 4);
            x[bs + 1] = 1e-40f;
            x[bs + 6] = -1e-40f;
            x[bs + 11] = 5e-41f;
            check_quant_row(type, x, n, "zeros");
            free(x);
        }
        /* Specials: NaN, +-Inf, -0, huge and tiny. Both sides define these
         * (x86 semantics for Q8_0/Q8_1, ggml's nearest_int for Q8_K) and
         * must still agree byte for byte. Block b of the row holds the special
         * at position b*bs/32, so every lane and vector position of the
         * max-reduction is hit; odd blocks also hold a second special. */
        {
            /* The last two are NaNs with payloads (one signalling), which
             * Q8_K's nearest_int turns into codes. */
            const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, -0.0f, 3e38f, -3e38f, 1e-30f,
                                      ds4_f32_from_bits(0x7F800005u), ds4_f32_from_bits(0xFFC00042u)};
            const int ns = (int)(sizeof specials / sizeof specials[0]);
            const int64_t nb = 32, n = nb * bs;
            float *x = xmalloc((size_t)n * 4);
            for (int s = 0; s < ns; s++) {
                rnd_floats(x, n);
                for (int64_t b = 0; b < nb; b++) {
                    x[b * bs + b * (bs / 32)] = specials[s];
                    if (b & 1) x[b * bs + (b * 7 + 3) % bs] = specials[(s + 3) % ns];
                }
                char what[16];
                snprintf(what, sizeof what, "special%d", s);
                check_quant_row(type, x, n, what);
            }
            free(x);
        }
    }
}

/* Error bound for a dot, from the data.
 *
 * Both implementations evaluate the same exact quantity E = sum of T terms,
 * each term a product of stored values (block scales, integer sums that are
 * computed exactly, activations), only with different float association.
 * With unit roundoff u = 2^-24, a sum of T terms in any order, each term
 * formed with at most K roundings, is within gamma(T+K) * sum|term| of E,
 * gamma(m) = m*u/(1-m*u) (Higham, Accuracy and Stability, 2nd ed., sec. 3.1,
 * 4.2). So |neon - scalar| <= 2 * gamma(T+K) * sum|term| (c = 2: one gamma
 * per side).
 *  - sum|term| <= M = sum_j (|w_j| + 2|off_j|) * |a_j|: a term of an affine
 *    type splits into a scaled part q*d (|q*d| <= |w| + |off|) and an offset
 *    part off*a; w_j, a_j are the dequantized values (exact up to a relative
 *    2u, covered by the 1.01 factor, as is the fp16 rounding of Q8_1's s).
 *  - T: float dots (F32/F16/BF16 and every vec_dot_f32) add n products; the
 *    quantized paired dots add at most 8 float terms per 32 weights (the
 *    exact integer sums kept as 4 SIMD lanes, times a scaled and an offset
 *    part; the scalar K-quants use 8 lanes + 1 min term per 256).
 *  - K = 4: the longest chain is int->float of a K-quant super-block sum,
 *    d_w*d_a, times the sum, (Q4_K dequant: d*sc, *q, -m1, *a) — at most 4
 *    roundings before a term enters the sum.
 * A tiny absolute term covers underflow, which this data never reaches. */
static double dot_bound(int64_t T, double M) {
    const double u = ldexp(1.0, -24);
    const double m = (double)(T + 4);
    const double gamma = m * u / (1.0 - m * u);
    return 2.0 * gamma * M * 1.01 + 1e-30;
}

static void check_dot(int type, int64_t nblk, int paired) {
    tinfo t = info_of(type);
    const int64_t n = nblk * t.bs;
    const int act_type = paired ? t.act : DS4_TYPE_F32;
    const tinfo at = info_of(act_type);
    const size_t wbytes = (size_t)(nblk * t.ts), abytes = (size_t)(n / at.bs * at.ts);
    guarded w = galloc(wbytes), a = galloc(abytes);
    rnd_weights(type, w.p, nblk);
    float *xf = xmalloc((size_t)n * 4);
    rnd_floats(xf, n);
    ds4_error err;
    int rc = ds4_quantize_row(DS4_ISA_SCALAR, act_type, xf, a.p, n, &err);
    if (rc != DS4_OK) {
        check(0, "dot %-7s x %-4s n=%-6lld: quantize activations: %s", tname(type),
              tname(act_type), (long long)n, err.message);
        goto done;
    }
    /* Magnitude M of the sum (see dot_bound). */
    float *wd = xmalloc((size_t)n * 4), *ad = xmalloc((size_t)n * 4);
    int rcw = ds4_dequantize_row(DS4_ISA_SCALAR, type, w.p, wd, n, &err);
    int rca = ds4_dequantize_row(DS4_ISA_SCALAR, act_type, a.p, ad, n, &err);
    double M = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double off = weight_offset(type, w.p, j);
        M += (fabs((double)wd[j]) + 2.0 * fabs(off)) * fabs((double)ad[j]);
    }
    const int float_dot = !paired || type == DS4_TYPE_F32 || type == DS4_TYPE_F16 ||
                          type == DS4_TYPE_BF16;
    const int64_t T = float_dot ? n : 8 * ((n + 31) / 32);
    const double bound = dot_bound(T, M);

    float s_ref = NAN, s_neon = NAN, s_neon2 = NAN;
    int rc1 = ds4_vec_dot(DS4_ISA_SCALAR, type, w.p, act_type, a.p, n, &s_ref, &err);
    int rc2 = ds4_vec_dot(DS4_ISA_NEON, type, w.p, act_type, a.p, n, &s_neon, &err);
    /* The same row at other addresses (malloc'd, odd offset) must give the
     * same bits: the reduction order depends on n only. */
    uint8_t *w2 = xmalloc(wbytes + 3), *a2 = xmalloc(abytes + 3);
    memcpy(w2 + 2, w.p, wbytes);
    memcpy(a2 + 2, a.p, abytes);
    int rc3 = ds4_vec_dot(DS4_ISA_NEON, type, w2 + 2, act_type, a2 + 2, n, &s_neon2, &err);
    const double diff = fabs((double)s_neon - (double)s_ref);
    const int ok = rcw == DS4_OK && rca == DS4_OK && rc1 == DS4_OK && rc2 == DS4_OK &&
                   rc3 == DS4_OK && isfinite(s_ref) && diff <= bound &&
                   memcmp(&s_neon, &s_neon2, 4) == 0;
    check(ok, "dot %-7s x %-4s n=%-6lld scalar %.9g neon %.9g |diff| %.3g <= bound %.3g (M %.3g)%s",
          tname(type), tname(act_type), (long long)n, s_ref, s_neon, diff, bound, M,
          memcmp(&s_neon, &s_neon2, 4) == 0 ? "" : " [neon result depends on address]");
    free(w2);
    free(a2);
    free(wd);
    free(ad);
done:
    free(xf);
    gfree(w);
    gfree(a);
}

/* The NEON set must really override the reference (else every comparison
 * above would pass trivially). */
static void check_overrides(void) {
    const ds4_kernel_set *sc = ds4_kernels_for(DS4_ISA_SCALAR), *ne = ds4_kernels_for(DS4_ISA_NEON);
    check(sc && ne, "kernel sets: scalar %s, neon %s", sc ? "present" : "MISSING", ne ? "present" : "MISSING");
    if (!sc || !ne) return;
    for (int i = 0; i < N_WEIGHT_TYPES; i++) {
        int t = k_weight_types[i];
        int ok = ne->to_float[t] && ne->vec_dot[t] && ne->vec_dot_f32[t] &&
                 ne->to_float[t] != sc->to_float[t] && ne->vec_dot[t] != sc->vec_dot[t] &&
                 ne->vec_dot_f32[t] != sc->vec_dot_f32[t];
        check(ok, "neon overrides to_float/vec_dot/vec_dot_f32 of %s", tname(t));
    }
    const int q[] = {DS4_TYPE_Q8_0, DS4_TYPE_Q8_1, DS4_TYPE_Q8_K};
    for (int i = 0; i < 3; i++)
        check(ne->from_float[q[i]] && ne->from_float[q[i]] != sc->from_float[q[i]],
              "neon overrides from_float of %s", tname(q[i]));
}

static void check_isa(void) {
    const int avail = ds4_isa_available();
    check((avail & (1 << DS4_ISA_NEON)) != 0, "ds4_isa_available() reports neon (0x%x)", avail);
    check((avail & (1 << DS4_ISA_SCALAR)) != 0, "ds4_isa_available() reports scalar (0x%x)", avail);
    check((avail & ((1 << DS4_ISA_AVX2) | (1 << DS4_ISA_AVX512))) == 0,
          "ds4_isa_available() reports no x86 ISA on arm64 (0x%x)", avail);

    unsetenv("DS4_FORCE_SCALAR");
    check(ds4_isa_auto() == DS4_ISA_NEON, "ds4_isa_auto() is neon (got %s)", ds4_isa_name(ds4_isa_auto()));
    setenv("DS4_FORCE_SCALAR", "1", 1);
    check(ds4_isa_auto() == DS4_ISA_SCALAR, "DS4_FORCE_SCALAR=1: ds4_isa_auto() is scalar (got %s)",
          ds4_isa_name(ds4_isa_auto()));
    setenv("DS4_FORCE_SCALAR", "0", 1);
    check(ds4_isa_auto() == DS4_ISA_NEON, "DS4_FORCE_SCALAR=0: ds4_isa_auto() is neon (got %s)",
          ds4_isa_name(ds4_isa_auto()));
    unsetenv("DS4_FORCE_SCALAR");

    /* Asking for an x86 ISA here is an error, not a crash. */
    float x[32] = {0}, out;
    ds4_error err;
    int rc = ds4_vec_dot(DS4_ISA_AVX2, DS4_TYPE_F32, x, DS4_TYPE_F32, x, 32, &out, &err);
    check(rc == DS4_ERR_UNSUPPORTED, "ds4_vec_dot(AVX2) on arm64 is DS4_ERR_UNSUPPORTED (rc %d)", rc);
    rc = ds4_vec_dot(DS4_ISA_AUTO, DS4_TYPE_F32, x, DS4_TYPE_F32, x, 32, &out, &err);
    check(rc == DS4_OK && out == 0.0f, "ds4_vec_dot(AUTO) works (rc %d)", rc);
}

int main(void) {
    check_isa();
    check_overrides();
    if (!(ds4_isa_available() & (1 << DS4_ISA_NEON))) {
        check(0, "NEON with dotprod is not available: kernel comparisons skipped");
        printf("%d passed, %d failed\n", g_pass, g_fail);
        return 1;
    }

    /* Block counts: 1, a few odd ones, and 33 (more than a power of two, so
     * no unrolled main loop alone covers the row). Block-1 types also get
     * lengths around the 4- and 16-wide steps. */
    const int64_t nblks[] = {1, 3, 7, 33};
    const int64_t nflt[] = {1, 3, 7, 15, 16, 17, 33, 100, 1027};

    check_dequant_all_halves(DS4_TYPE_F16);
    check_dequant_all_halves(DS4_TYPE_BF16);
    for (int i = 0; i < N_WEIGHT_TYPES; i++) {
        const int t = k_weight_types[i];
        const int fl = info_of(t).bs == 1;
        const int cnt = fl ? 9 : 4;
        for (int k = 0; k < cnt; k++) check_dequant(t, fl ? nflt[k] : nblks[k]);
    }

    check_quantizers();

    for (int i = 0; i < N_WEIGHT_TYPES; i++) {
        const int t = k_weight_types[i];
        const int fl = info_of(t).bs == 1;
        const int cnt = fl ? 9 : 4;
        for (int paired = 1; paired >= 0; paired--) {
            if (!paired && t == DS4_TYPE_F32) continue;  /* same kernel as paired */
            for (int k = 0; k < cnt; k++) check_dot(t, fl ? nflt[k] : nblks[k], paired);
        }
    }

    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
