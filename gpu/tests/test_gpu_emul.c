/*
 * test_gpu_emul.c — every shared GPU kernel under the threadgroup emulator
 * against the CPU reference, on small odd shapes (make test-gpu-emul;
 * tests/test_gpu_emul.py runs it per suite and with planted faults).
 *
 *   test_gpu_emul [suite ...]     suites: tables f16 rmsnorm quantize matvec
 *                                 rope attn (default: all)
 *
 * Prints one line per check, "PASS suite: ..." or "FAIL suite: ...", and
 * exits 1 if any check failed. References are the project's own CPU code
 * where it is callable (csrc/forward/norm.c ds4_rmsnorm, the scalar Q8_0
 * quantizer and dot of csrc/quants/scalar.c, ds4_f32_to_fp16), else written
 * here from the formula (RoPE, attention in double). Tolerances are the
 * bounds derived in docs/gpu.md; each says where it comes from.
 *
 * Planted faults (compile with -D...): PLANT_OFF_BY_ONE_ROW (matvec reads
 * the next weight row), PLANT_MISSING_BARRIER (attention drops the barrier
 * after the scores), PLANT_WRONG_ARG (matvec's params and activations
 * bound at each other's slot), PLANT_WRONG_ARG_UNCHECKED (the same, launched
 * without the host check: the kernel's own tag check must raise).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dialect/emul.h" /* k_h2f / k_f2h, under test too */
#include "../emul/emul.h"
#ifdef K_TEST_CUDA /* the same checks on the GPU (make cuda-test) */
int k_cuda_launch_host(int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb,
                       const void *opt, char *err, size_t cap);
#define emul_launch(id, grid, tg, b, nb, opt, err, cap) k_cuda_launch_host(id, grid, tg, b, nb, opt, err, cap)
#endif
#include "../kernels/attn_plan.h"
#include "../../csrc/forward/forward.h"
#include "../../csrc/quants/quants.h"

#define U (1.0 / 16777216.0) /* unit roundoff of float, 2^-24 */

static int n_fail, n_pass;
static const char *suite;

static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %s: ", ok ? "PASS" : "FAIL", suite);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) n_pass++;
    else n_fail++;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

static ds4_kernel_set scalar;
static uint32_t status[2];

/* Launch and report; 0 when the emulator found nothing and no status bit
 * was raised. */
static int launch(int id, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t tg, const k_binding *b,
                  int nb, int schedule, const char *what) {
    char err[600];
    const uint32_t grid[3] = {gx, gy, gz};
    emul_options opt = {schedule, 0};
#ifdef PLANT_WRONG_ARG_UNCHECKED
    opt.skip_host_check = 1;
#endif
    status[0] = status[1] = 0;
    if (emul_launch(id, grid, tg, b, nb, &opt, err, sizeof err)) {
        check(0, "%s: %s", what, err);
        return -1;
    }
    if (status[0]) {
        check(0, "%s: kernel raised status 0x%x (%s)", what, status[0],
              status[0] & K_ERR_TAG ? "K_ERR_TAG: params are not this kernel's" : "K_ERR_SHAPE");
        return -1;
    }
    return 0;
}

static void fill_nan(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* ------------------------------------------------------------ tables -- */
static void suite_tables(void) {
    char err[300];
    check(k_check_tables(err, sizeof err) == 0, "every table has slots 0..n-1, status at 0, params at 1 %s",
          err);
    /* The checker itself must refuse each kind of wrong binding. */
    const k_kernel_desc *d = k_kernel_desc_of(K_ID_rmsnorm);
    k_rmsnorm_params p = {K_TAG_OF(rmsnorm), 10, 2, 12, 1e-6f, 1};
    float x[24], w[10], y[24];
    k_binding ok[] = {K_BIND(rmsnorm, status, status, 8), K_BIND(rmsnorm, p, &p, sizeof p),
                      K_BIND(rmsnorm, x, x, sizeof x), K_BIND(rmsnorm, w, w, sizeof w),
                      K_BIND(rmsnorm, y, y, sizeof y)};
    check(k_check_bindings(d, ok, 5, err, sizeof err) == 0, "a correct binding passes %s", err);
    k_binding b[5];
    memcpy(b, ok, sizeof b);
    b[2].slot = K_ARG_rmsnorm_w;
    check(k_check_bindings(d, b, 5, err, sizeof err) != 0 && strstr(err, "bound twice"),
          "a slot bound twice is refused (%s)", err);
    check(k_check_bindings(d, ok, 4, err, sizeof err) != 0 && strstr(err, "not bound"),
          "an unbound slot is refused (%s)", err);
    memcpy(b, ok, sizeof b);
    b[2].bytes = 21 * sizeof(float);
    check(k_check_bindings(d, b, 5, err, sizeof err) != 0 && strstr(err, "(x) holds 84 bytes"),
          "a buffer smaller than the params need is refused (%s)", err);
    memcpy(b, ok, sizeof b);
    b[1].ptr = x, b[1].bytes = sizeof x, b[2].ptr = &p, b[2].bytes = sizeof p;
    check(k_check_bindings(d, b, 5, err, sizeof err) != 0 && strstr(err, "slot 1 (params)"),
          "params and a buffer bound at each other's slot are refused (%s)", err);
    k_quantize_q8_0_params other = {K_TAG_OF(quantize_q8_0), 0, 0, 0};
    memcpy(b, ok, sizeof b);
    (void)other;
    k_rmsnorm_params bad = p;
    bad.tag = K_TAG_OF(matvec_q8_0);
    b[1].ptr = &bad;
    check(k_check_bindings(d, b, 5, err, sizeof err) != 0 && strstr(err, "tag"),
          "params of another kernel are refused (%s)", err);
}

/* --------------------------------------------------------------- f16 -- */
static void suite_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = k_h2f((uint16_t)h), b = ds4_fp16_to_f32((uint16_t)h);
        if (memcmp(&a, &b, 4)) bad++;
    }
    check(bad == 0, "fp16 -> float equals the CPU's on all 65536 inputs (%d differ)", bad);
    bad = 0;
    const uint32_t edges[] = {0, 0x80000000u, 0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u,
                              0x477fe000u, 0x477fefffu, 0x477ff000u, 0x7f800000u, 0xff800000u,
                              0x7f800001u, 0x7fc00000u, 0x3f800000u, 0x3c7fe000u, 0x33800000u};
    for (uint32_t i = 0; i < (1u << 20); i++) {
        const uint32_t u = i < sizeof edges / 4 ? edges[i] : rnd() ^ (rnd() << 16);
        float f;
        memcpy(&f, &u, 4);
        if (k_f2h(f) != ds4_f32_to_fp16(f)) bad++;
    }
    check(bad == 0, "float -> fp16 (nearest even) equals the CPU's on 2^20 inputs (%d differ)", bad);
}

/* ----------------------------------------------------------- rmsnorm -- */
static void suite_rmsnorm(void) {
    const uint32_t ns[] = {1, 7, 33, 255, 1000, 2049};
    const uint32_t tgs[] = {32, 64, 256};
    for (size_t in = 0; in < sizeof ns / 4; in++)
        for (size_t it = 0; it < sizeof tgs / 4; it++) {
            const uint32_t n = ns[in], tg = tgs[it], rows = 3, stride = n + 3;
            float *x = malloc(sizeof(float) * rows * stride), *w = malloc(sizeof(float) * n);
            float *y = malloc(sizeof(float) * rows * stride), *y1 = malloc(sizeof(float) * stride);
            float *ref = malloc(sizeof(float) * n);
            for (uint32_t i = 0; i < rows * stride; i++) x[i] = frand(-3, 3) * (i % 5 ? 1.0f : 40.0f);
            for (uint32_t i = 0; i < n; i++) w[i] = frand(0.5f, 1.5f);
            fill_nan(y, rows * stride);
            k_rmsnorm_params p = {K_TAG_OF(rmsnorm), n, rows, stride, 1e-6f, 1};
            k_binding b[] = {K_BIND(rmsnorm, status, status, 8), K_BIND(rmsnorm, p, &p, sizeof p),
                             K_BIND(rmsnorm, x, x, sizeof(float) * rows * stride),
                             K_BIND(rmsnorm, w, w, sizeof(float) * n),
                             K_BIND(rmsnorm, y, y, sizeof(float) * rows * stride)};
            if (launch(K_ID_rmsnorm, rows, 1, 1, tg, b, 5, (int)(in + it) & 1, "rmsnorm")) goto next;
            /* Tolerance (docs/gpu.md "RMSNorm"): the float sum of squares has
             * depth m = ceil(n/tg) + 5 + tg/32 additions (relative error <=
             * m*u for non-negative terms; the CPU's double sum is exact to
             * ~u); mean, +eps, sqrt and 1/x add 4 roundings, halved by the
             * square root to the scale; the two final multiplies 2 more. */
            const double m = (n + tg - 1) / tg + 5 + tg / 32;
            const double rel = (m / 2 + 8) * U;
            double worst = 0;
            int ok = 1;
            for (uint32_t r = 0; r < rows; r++) {
                ds4_rmsnorm(x + r * stride, w, ref, n, 1e-6f);
                for (uint32_t i = 0; i < n; i++) {
                    const double e = fabs((double)y[r * stride + i] - ref[i]);
                    const double tol = rel * fabs(ref[i]) + 1e-37;
                    if (!(e <= tol)) ok = 0;
                    if (e / tol > worst) worst = e / tol;
                }
            }
            /* Batch invariance: row 1 alone gives the same bits. */
            p.n_rows = 1;
            fill_nan(y1, stride);
            b[2] = K_BIND(rmsnorm, x, x + stride, sizeof(float) * stride);
            b[4] = K_BIND(rmsnorm, y, y1, sizeof(float) * stride);
            if (launch(K_ID_rmsnorm, 1, 1, 1, tg, b, 5, EMUL_FORWARD, "rmsnorm one row")) goto next;
            check(ok && !memcmp(y1, y + stride, sizeof(float) * n),
                  "n=%u tg=%u rows=%u: within %.1f ulp-scaled bound (worst %.2f of it), row alone bit-identical",
                  n, tg, rows, rel / U, worst);
        next:
            free(x), free(w), free(y), free(y1), free(ref);
        }
}

/* ---------------------------------------------------------- quantize -- */
static void suite_quantize(void) {
    const uint32_t ns[] = {32, 96, 320, 1056};
    for (size_t in = 0; in < sizeof ns / 4; in++) {
        const uint32_t n = ns[in], rows = 3, stride = n + 5, nb = n / 32;
        float *x = malloc(sizeof(float) * rows * stride);
        for (uint32_t i = 0; i < rows * stride; i++) {
            const uint32_t k = rnd() % 8;
            x[i] = k == 0 ? 0.0f : k == 1 ? frand(-1e-6f, 1e-6f) : k == 2 ? (float)(int)(rnd() % 255) - 127.0f
                                                                : frand(-50, 50);
        }
        for (uint32_t i = 32; i < 64 && i < n; i++) x[i] = 0.0f; /* an all-zero block: d = 0 */
        uint8_t *q = malloc(rows * nb * 34), *ref = malloc(rows * nb * 34);
        memset(q, 0xAB, rows * nb * 34);
        k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), n, rows, stride};
        k_binding b[] = {K_BIND(quantize_q8_0, status, status, 8),
                         K_BIND(quantize_q8_0, p, &p, sizeof p),
                         K_BIND(quantize_q8_0, x, x, sizeof(float) * rows * stride),
                         K_BIND(quantize_q8_0, q, q, rows * nb * 34)};
        const uint32_t nsg = 4, blocks = rows * nb;
        if (!launch(K_ID_quantize_q8_0, (blocks + nsg - 1) / nsg, 1, 1, 32 * nsg, b, 4, (int)in & 1,
                    "quantize")) {
            for (uint32_t r = 0; r < rows; r++)
                scalar.from_float[DS4_TYPE_Q8_0](x + r * stride, ref + r * nb * 34, n);
            const int same = !memcmp(q, ref, rows * nb * 34);
            if (!same) /* say where, so a target-specific rounding difference can be read off */
                for (uint32_t i = 0; i < rows * nb * 34; i++)
                    if (q[i] != ref[i]) {
                        const uint32_t blk = i / 34, off = i % 34;
                        const float *xb = x + (blk / nb) * stride + (blk % nb) * 32;
                        fprintf(stderr, "  first difference: block %u byte %u: got 0x%02x want 0x%02x"
                                " (x[%d] = %.9g)\n", blk, off, q[i], ref[i], off >= 2 ? (int)off - 2 : -1,
                                off >= 2 ? xb[off - 2] : 0.0f);
                        fprintf(stderr, "  block %u got:", blk);
                        for (uint32_t j = 0; j < 34; j++) fprintf(stderr, " %02x", q[blk * 34 + j]);
                        fprintf(stderr, "\n  block %u want:", blk);
                        for (uint32_t j = 0; j < 34; j++) fprintf(stderr, " %02x", ref[blk * 34 + j]);
                        fprintf(stderr, "\n");
                        break;
                    }
            check(same, "n=%u rows=%u: Q8_0 blocks bit-identical to the CPU's", n, rows);
        }
        free(x), free(q), free(ref);
    }
}

/* ------------------------------------------------------------ matvec -- */
static void quantize_rows(const float *x, uint8_t *q, uint32_t rows, uint32_t n) {
    for (uint32_t r = 0; r < rows; r++)
        scalar.from_float[DS4_TYPE_Q8_0](x + (size_t)r * n, q + (size_t)r * (n / 32) * 34, n);
}

/* sum over blocks of |sumi * (d_w * d_x)|, computed here in double. */
static double abs_terms(const uint8_t *w, const uint8_t *x, uint32_t nb) {
    double s = 0;
    for (uint32_t ib = 0; ib < nb; ib++) {
        const block_q8_0 *a = (const block_q8_0 *)(w + ib * 34), *c = (const block_q8_0 *)(x + ib * 34);
        long sumi = 0;
        for (int j = 0; j < 32; j++) sumi += a->qs[j] * c->qs[j];
        s += fabs((double)sumi * ds4_fp16_to_f32(a->d) * ds4_fp16_to_f32(c->d));
    }
    return s;
}

static void suite_matvec(void) {
    const uint32_t n_ins[] = {32, 96, 1056, 2080};
    const uint32_t n_outs[] = {1, 5, 17};
    for (size_t ii = 0; ii < sizeof n_ins / 4; ii++)
        for (size_t io = 0; io < sizeof n_outs / 4; io++) {
            const uint32_t n_in = n_ins[ii], n_out = n_outs[io], nb = n_in / 32, R = K_MATVEC_MAX_ROWS;
            float *wf = malloc(sizeof(float) * n_out * n_in), *xf = malloc(sizeof(float) * R * n_in);
            for (uint32_t i = 0; i < n_out * n_in; i++) wf[i] = frand(-1, 1);
            for (uint32_t i = 0; i < R * n_in; i++) xf[i] = frand(-4, 4);
            uint8_t *w = malloc(n_out * nb * 34), *xq = malloc(R * nb * 34);
            quantize_rows(wf, w, n_out, n_in);
            quantize_rows(xf, xq, R, n_in);
            float *y1 = malloc(sizeof(float) * R * n_out), *yw = malloc(sizeof(float) * R * n_out);
            /* Width 1 for each row, then every verify width 2..16 (all
             * widths on the first shapes, a few on the rest to stay fast). */
            int ok = 1, inv = 1;
            double worst = 0;
            const uint32_t nsg = 2;
            for (uint32_t width = 1; width <= R; width++) {
                if (ii + io > 1 && width != 1 && width != 2 && width != 7 && width != 16) continue;
                const uint32_t reps = width == 1 ? R : 1;
                for (uint32_t rep = 0; rep < reps; rep++) {
                    float *y = width == 1 ? y1 + rep * n_out : yw;
                    const uint8_t *xa = width == 1 ? xq + rep * nb * 34 : xq;
                    if (width > 1) fill_nan(yw, R * n_out);
                    else fill_nan(y, n_out);
                    k_matvec_q8_0_params p = {K_TAG_OF(matvec_q8_0), n_in, n_out, width, n_out};
                    k_binding b[] = {K_BIND(matvec_q8_0, status, status, 8),
                                     K_BIND(matvec_q8_0, p, &p, sizeof p),
                                     K_BIND(matvec_q8_0, w, w, n_out * nb * 34),
                                     K_BIND(matvec_q8_0, xq, xa, width * nb * 34),
                                     K_BIND(matvec_q8_0, y, y, sizeof(float) * width * n_out)};
#if defined(PLANT_WRONG_ARG) || defined(PLANT_WRONG_ARG_UNCHECKED)
                    /* planted fault: params and activations at each other's slot */
                    b[1].slot = K_ARG_matvec_q8_0_xq;
                    b[3].slot = K_ARG_matvec_q8_0_p;
#endif
                    if (launch(K_ID_matvec_q8_0, (n_out + nsg - 1) / nsg, 1, 1, 32 * nsg, b, 5,
                               (int)(width & 1), "matvec"))
                        goto next;
                }
                if (width == 1) {
                    /* Tolerance (docs/gpu.md "Q8_0 matvec"): the same nb terms
                     * summed in two orders: the CPU's serial sum is within
                     * (nb-1)u sum|t| of the exact one, ours within
                     * (ceil(nb/32)+5)u sum|t|. */
                    const double k = (nb - 1) + (nb + 31) / 32 + 5;
                    for (uint32_t r = 0; r < R; r++)
                        for (uint32_t o = 0; o < n_out; o++) {
                            float ref;
                            scalar.vec_dot[DS4_TYPE_Q8_0](n_in, &ref, w + o * nb * 34, xq + r * nb * 34);
                            const double tol = k * U * abs_terms(w + o * nb * 34, xq + r * nb * 34, nb) * 1.0000001 + 1e-37;
                            const double e = fabs((double)y1[r * n_out + o] - ref);
                            if (!(e <= tol)) ok = 0;
                            if (e / tol > worst) worst = e / tol;
                        }
                } else if (memcmp(yw, y1, sizeof(float) * width * n_out)) {
                    inv = 0;
                }
            }
            check(ok && inv, "n_in=%u n_out=%u: within the reordering bound (worst %.2f of it); widths 2..16 "
                  "bit-identical to width 1 per row", n_in, n_out, worst);
        next:
            free(wf), free(xf), free(w), free(xq), free(y1), free(yw);
        }
}

/* -------------------------------------------------------------- rope -- */
static void suite_rope(void) {
    const uint32_t dims[][2] = {{8, 8}, {34, 16}, {64, 16}, {40, 2}}; /* head_dim, n_rot */
    for (size_t k = 0; k < 4; k++) {
        const uint32_t dh = dims[k][0], n_rot = dims[k][1], half = n_rot / 2, rows = 3, heads = 3;
        const uint32_t hs = dh + 1, stride = heads * hs + 2, nx = rows * stride;
        float *x = malloc(sizeof(float) * nx), *ref = malloc(sizeof(float) * nx);
        float *cs = malloc(sizeof(float) * rows * half), *sn = malloc(sizeof(float) * rows * half);
        for (uint32_t i = 0; i < nx; i++) x[i] = ref[i] = frand(-2, 2);
        for (uint32_t i = 0; i < rows * half; i++) {
            const float a = frand(-100, 100);
            cs[i] = cosf(a), sn[i] = sinf(a);
        }
        /* Reference: csrc/forward/attention.c rope(), per row and head. */
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t h = 0; h < heads; h++) {
                float *v = ref + r * stride + h * hs;
                for (uint32_t i = 0; i < half; i++) {
                    const float lo = v[i], hi = v[i + half];
                    v[i] = lo * cs[r * half + i] + (-hi) * sn[r * half + i];
                    v[i + half] = hi * cs[r * half + i] + lo * sn[r * half + i];
                }
            }
        k_rope_neox_params p = {K_TAG_OF(rope_neox), rows, heads, dh, n_rot, stride, hs};
        k_binding b[] = {K_BIND(rope_neox, status, status, 8), K_BIND(rope_neox, p, &p, sizeof p),
                         K_BIND(rope_neox, x, x, sizeof(float) * nx),
                         K_BIND(rope_neox, cs, cs, sizeof(float) * rows * half),
                         K_BIND(rope_neox, sn, sn, sizeof(float) * rows * half)};
        const uint32_t items = rows * heads * half;
        if (!launch(K_ID_rope_neox, (items + 63) / 64, 1, 1, 64, b, 5, (int)k & 1, "rope"))
            check(!memcmp(x, ref, sizeof(float) * nx), "head_dim=%u n_rot=%u: bit-identical (untouched "
                  "dims and gaps too)", dh, n_rot);
        free(x), free(ref), free(cs), free(sn);
    }
}

/* -------------------------------------------------------------- attn -- */
typedef struct {
    uint32_t n_head, n_head_kv, dh, pos0, n_rows, n_pages, n_blocks;
    uint16_t *kpool, *vpool;
    uint32_t *pages;
    float *q;
    float scale;
} attn_case;

/* out[t][h][d] for one launch pair (partials with bps blocks per split,
 * merge); 0 on success. */
static int run_attn(const attn_case *c, uint32_t pos0, uint32_t n_rows, const float *q, uint32_t bps,
                    int schedule, float *out) {
    const uint32_t nb = (pos0 + n_rows + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
    const uint32_t qs = c->n_head * c->dh;
    const size_t part_n = (size_t)n_rows * c->n_head * nb * (2 + c->dh);
    float *part = malloc(sizeof(float) * part_n);
    fill_nan(part, part_n);
    fill_nan(out, (size_t)n_rows * qs);
    k_attn_partials_params p = {K_TAG_OF(attn_partials), c->n_head, c->n_head_kv, c->dh, n_rows, pos0,
                                nb, bps, c->n_pages, qs, c->dh, c->scale};
    const size_t pool = (size_t)c->n_pages * c->n_head_kv * K_ATTN_BLOCK * c->dh * 2;
    k_binding b[] = {K_BIND(attn_partials, status, status, 8), K_BIND(attn_partials, p, &p, sizeof p),
                     K_BIND(attn_partials, q, q, sizeof(float) * n_rows * qs),
                     K_BIND(attn_partials, kpool, c->kpool, pool), K_BIND(attn_partials, vpool, c->vpool, pool),
                     K_BIND(attn_partials, pages, c->pages, 4 * nb),
                     K_BIND(attn_partials, part, part, sizeof(float) * part_n)};
    int rc = launch(K_ID_attn_partials, c->n_head_kv, k_attn_n_splits(nb, bps), n_rows, 128, b, 7, schedule,
                    "attn_partials");
    if (!rc) {
        k_attn_merge_params m = {K_TAG_OF(attn_merge), c->n_head, c->dh, n_rows, pos0, nb, qs};
        k_binding bm[] = {K_BIND(attn_merge, status, status, 8), K_BIND(attn_merge, p, &m, sizeof m),
                          K_BIND(attn_merge, part, part, sizeof(float) * part_n),
                          K_BIND(attn_merge, out, out, sizeof(float) * n_rows * qs)};
        rc = launch(K_ID_attn_merge, c->n_head, n_rows, 1, 32, bm, 4, schedule, "attn_merge");
    }
    free(part);
    return rc;
}

static const uint16_t *kv_row(const attn_case *c, const uint16_t *pool, uint32_t kvh, uint32_t pos) {
    return pool + (((size_t)c->pages[pos / K_ATTN_BLOCK] * c->n_head_kv + kvh) * K_ATTN_BLOCK +
                   pos % K_ATTN_BLOCK) * c->dh;
}

/* Exact attention in double over the same F16 K/V and float q; also the
 * tolerance of docs/gpu.md ("Attention"). Returns worst error / tolerance
 * over the row (> 1: out of bounds). */
static double attn_check_row(const attn_case *c, uint32_t pos, const float *q, const float *out) {
    const uint32_t n_vis = pos + 1, G = c->n_head / c->n_head_kv, dh = c->dh;
    const uint32_t nb = (n_vis + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
    double worst = 0;
    double *s = malloc(sizeof(double) * n_vis), *acc = malloc(sizeof(double) * dh);
    for (uint32_t h = 0; h < c->n_head; h++) {
        const uint32_t kvh = h / G;
        const float *qh = q + h * dh;
        double mx = -INFINITY, dmax = 0, vmax = 0;
        for (uint32_t t = 0; t < n_vis; t++) {
            const uint16_t *k = kv_row(c, c->kpool, kvh, t), *v = kv_row(c, c->vpool, kvh, t);
            double d = 0, da = 0;
            for (uint32_t i = 0; i < dh; i++) {
                d += (double)k_h2f(k[i]) * qh[i];
                da += fabs((double)k_h2f(k[i]) * qh[i]);
                if (fabs(k_h2f(v[i])) > vmax) vmax = fabs(k_h2f(v[i]));
            }
            s[t] = d * c->scale;
            if (s[t] > mx) mx = s[t];
            if (da * c->scale > dmax) dmax = da * c->scale;
        }
        double l = 0;
        for (uint32_t i = 0; i < dh; i++) acc[i] = 0;
        for (uint32_t t = 0; t < n_vis; t++) {
            const double e = exp(s[t] - mx);
            const uint16_t *v = kv_row(c, c->vpool, kvh, t);
            l += e;
            for (uint32_t i = 0; i < dh; i++) acc[i] += e * k_h2f(v[i]);
        }
        /* Score error delta: dot of depth ceil(dh/32) + 5 plus the product
         * and the scale (docs/gpu.md). Each weight's relative error eta:
         * 2 delta (its score and the max) + exp's error (4u allowed) + the
         * block sum / accumulation depth (<= 256 + 5) + the merge (3 per
         * block: two exps' arguments and products). The output, a weighted
         * mean of V, then moves by at most 2 eta max|v| (+ 4u |out|). */
        const double delta = ((dh + 31) / 32 + 7) * U * dmax;
        const double eta = 2 * delta + (4 + 261 + 8.0 * nb) * U;
        for (uint32_t i = 0; i < dh; i++) {
            const double ref = acc[i] / l;
            const double tol = 2.2 * eta * vmax + 4 * U * fabs(ref) + 1e-30;
            const double e = fabs(out[h * dh + i] - ref);
            const double r = e == e ? e / tol : INFINITY;
            if (r > worst) worst = r;
        }
    }
    free(s), free(acc);
    return worst;
}

static void suite_attn(void) {
    const uint32_t shapes[][4] = {
        /* n_head_kv, G, head_dim, pos0 */
        {1, 1, 32, 0},   {2, 3, 40, 5},  {1, 8, 64, 255}, {2, 4, 32, 256},
        {1, 5, 72, 300}, {2, 2, 64, 700}, {1, 6, 32, 520},
    };
    const uint32_t n_rows = 3;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        attn_case c;
        c.n_head_kv = shapes[k][0];
        c.n_head = shapes[k][0] * shapes[k][1];
        c.dh = shapes[k][2];
        c.pos0 = shapes[k][3];
        c.n_rows = n_rows;
        c.scale = 1.0f / sqrtf((float)c.dh);
        c.n_blocks = (c.pos0 + n_rows + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
        c.n_pages = c.n_blocks + 2; /* a pool with spare pages, mapped out of order */
        const size_t pe = (size_t)c.n_pages * c.n_head_kv * K_ATTN_BLOCK * c.dh;
        c.kpool = malloc(2 * pe), c.vpool = malloc(2 * pe);
        for (size_t i = 0; i < pe; i++) {
            c.kpool[i] = ds4_f32_to_fp16(frand(-2, 2));
            c.vpool[i] = ds4_f32_to_fp16(frand(-3, 3));
        }
        c.pages = malloc(4 * c.n_blocks);
        for (uint32_t b = 0; b < c.n_blocks; b++) c.pages[b] = (b * 5 + 1) % c.n_pages;
        const uint32_t qs = c.n_head * c.dh;
        c.q = malloc(sizeof(float) * n_rows * qs);
        for (uint32_t i = 0; i < n_rows * qs; i++) c.q[i] = frand(-2, 2) * (k == 3 ? 6.0f : 1.0f);
        float *base = malloc(sizeof(float) * n_rows * qs), *o = malloc(sizeof(float) * n_rows * qs);

        int split_ok = 1, ok = 1;
        if (run_attn(&c, c.pos0, n_rows, c.q, c.n_blocks, EMUL_FORWARD, base)) goto next;
        /* every split count from 1 block per split to 1 split */
        for (uint32_t bps = 1; bps < c.n_blocks; bps++) {
            if (run_attn(&c, c.pos0, n_rows, c.q, bps, bps & 1 ? EMUL_REVERSE : EMUL_FORWARD, o)) goto next;
            if (memcmp(o, base, sizeof(float) * n_rows * qs)) split_ok = 0;
        }
        /* each verify row alone (decode at its position) gives the same bits */
        int rows_ok = 1;
        for (uint32_t t = 0; t < n_rows; t++) {
            const uint32_t nb1 = (c.pos0 + t + 1 + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
            const uint32_t bps = k_attn_blocks_per_split(nb1, c.n_head_kv, 1, 16);
            if (run_attn(&c, c.pos0 + t, 1, c.q + t * qs, bps, EMUL_REVERSE, o)) goto next;
            if (memcmp(o, base + t * qs, sizeof(float) * qs)) rows_ok = 0;
        }
        double worst = 0;
        for (uint32_t t = 0; t < n_rows; t++) {
            const double r = attn_check_row(&c, c.pos0 + t, c.q + t * qs, base + t * qs);
            if (!(r <= 1.0)) ok = 0;
            if (r > worst) worst = r;
        }
        check(ok && split_ok && rows_ok,
              "n_head=%u kv=%u G=%u head_dim=%u pos0=%u rows=%u blocks=%u: within the derived bound (worst "
              "%.3f of it)%s%s", c.n_head, c.n_head_kv, c.n_head / c.n_head_kv, c.dh, c.pos0, n_rows,
              c.n_blocks, worst, split_ok ? ", bit-identical for split counts 1.." : ", SPLIT COUNTS DIFFER",
              rows_ok ? ", each row alone bit-identical" : ", A ROW ALONE DIFFERS");
    next:
        free(c.kpool), free(c.vpool), free(c.pages), free(c.q), free(base), free(o);
    }
    /* the split plan: never a split without a block, more splits for longer
     * contexts up to the target */
    int plan_ok = 1;
    for (uint32_t nb = 1; nb < 300; nb++)
        for (uint32_t kv = 1; kv <= 8; kv *= 2) {
            const uint32_t bps = k_attn_blocks_per_split(nb, kv, 1, 64), ns = k_attn_n_splits(nb, bps);
            if (bps < 1 || ns < 1 || (ns - 1) * bps >= nb || ns * bps < nb) plan_ok = 0;
        }
    check(plan_ok, "split plan covers every block with no empty split (n_blocks 1..299, kv heads 1..8)");
}

int main(int argc, char **argv) {
    ds4_kernels_init_scalar(&scalar);
    static const struct {
        const char *name;
        void (*fn)(void);
    } suites[] = {{"tables", suite_tables}, {"f16", suite_f16},   {"rmsnorm", suite_rmsnorm},
                  {"quantize", suite_quantize}, {"matvec", suite_matvec}, {"rope", suite_rope},
                  {"attn", suite_attn}};
    const int n_suites = (int)(sizeof suites / sizeof suites[0]);
    for (int i = 1; i < argc; i++) {
        int found = 0;
        for (int s = 0; s < n_suites; s++) found |= !strcmp(argv[i], suites[s].name);
        if (!found) {
            fprintf(stderr, "unknown suite '%s'\n", argv[i]);
            return 2;
        }
    }
    for (int s = 0; s < n_suites; s++) {
        int run = argc == 1;
        for (int i = 1; i < argc; i++) run |= !strcmp(argv[i], suites[s].name);
        if (!run) continue;
        suite = suites[s].name;
        suites[s].fn();
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
