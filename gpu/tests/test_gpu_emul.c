/*
 * test_gpu_emul.c — every shared GPU kernel under the threadgroup emulator
 * against the CPU reference, on small odd shapes (make test-gpu-emul;
 * tests/test_gpu_emul.py runs it per suite and with planted faults).
 *
 *   test_gpu_emul [suite ...]     suites: tables f16 rmsnorm quantize matvec
 *                                 rope attn kquant gdn argmax glue fused moe
 *                                 gdnseq gemm mma q4_64a (default: all; moe
 *                                 lives in test_gpu_moe.h, mma in
 *                                 test_gpu_mma.h, q4_64a in test_gpu_q4_64a.h)
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
 * after a K/V tile's copy), PLANT_WRONG_ARG (matvec's params and activations
 * bound at each other's slot), PLANT_WRONG_ARG_UNCHECKED (the same, launched
 * without the host check: the kernel's own tag check must raise),
 * PLANT_GDN_WRONG_KHEAD (GDN value heads read grouped, not tiled, k heads),
 * PLANT_ARGMAX_LAST_TIE (argmax ties to the highest index),
 * PLANT_FUSED_NO_BARRIER (norm_quant reads the Q8_K chunk winners without
 * the barrier), PLANT_FUSED_SWIGLU_ORDER (swiglu_quant regroups SiLU(g)*u),
 * PLANT_FUSED_ROPE_NO_BARRIER (qk_norm_rope rotates pairs without the barrier),
 * PLANT_FUSED_GATE_LAST_TIE (attn_gate_quant's Q8_K max ties to the higher index),
 * PLANT_KQ_OFF_BY_ONE_ROW (the K-quant matvec reads the next weight row),
 * PLANT_MOE_NEXT_EXPERT / PLANT_MOE_LAST_TIE (moe.h: the next expert's rows;
 * routing ties to the higher id), PLANT_GDN_SEQ_STALE_CONV (gdn_seq reads
 * the conv state it is replacing), PLANT_GEMM_OFF_BY_ONE_ROW (the prefill
 * GEMM reads the next weight row), PLANT_MMA_FRAGMENT_SWAP (the tensor-core
 * GEMMs swap two A fragment registers), PLANT_Q4_64A_NIBBLE_SWAP (the Q4_64A
 * matvec reads each byte's two codes swapped); tests/test_gpu_emul.py holds the list
 * it checks, with the suites each must turn red.
 *
 * Built with -DK_TEST_CUDA (make cuda-test), every launch goes to the GPU
 * through cuda/host.cu and every suite checks the GPU's results against
 * the same CPU references on the same data (gpu/tools/device_check.sh).
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
#include "../host/q8_0_rows.h"
#include "../../csrc/forward/forward.h"
#include "../../csrc/quants/quants.h"
/* A threadgroup larger than a kernel's bound: under CUDA the kernels carry
 * __launch_bounds__ (gpu/dialect/cuda.h), so the launch itself fails (rc != 0,
 * "invalid configuration") before the kernel's own shape check can raise
 * K_ERR_SHAPE; either way nothing runs. The emulator has no such bound: there
 * the kernel's check must answer. */
#ifdef K_TEST_CUDA
#define REFUSED_AT_LAUNCH(rc, tg, bound) ((rc) != 0 && (tg) > (bound))
#else
#define REFUSED_AT_LAUNCH(rc, tg, bound) 0
#endif


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
    k_rmsnorm_params p = {K_TAG_OF(rmsnorm), 10, 2, 12, 1e-6f, 1, 0};
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
            k_rmsnorm_params p = {K_TAG_OF(rmsnorm), n, rows, stride, 1e-6f, 1, 0};
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
            /* Rows written ystride apart (the nextn head's [e ; g] rows): the
             * same bits per row, nothing between the rows touched. */
            const uint32_t ys = 2 * stride + 1;
            float *yw = malloc(sizeof(float) * rows * ys);
            fill_nan(yw, rows * ys);
            p.n_rows = rows, p.ystride = ys;
            b[2] = K_BIND(rmsnorm, x, x, sizeof(float) * rows * stride);
            b[4] = K_BIND(rmsnorm, y, yw, sizeof(float) * ((rows - 1) * ys + n));
            if (launch(K_ID_rmsnorm, rows, 1, 1, tg, b, 5, EMUL_FORWARD, "rmsnorm ystride")) {
                free(yw);
                goto next;
            }
            for (uint32_t r = 0; r < rows; r++) {
                if (memcmp(yw + r * ys, y + r * stride, sizeof(float) * n)) ok = 0;
                for (uint32_t i = n; r + 1 < rows && i < ys; i++)
                    if (yw[r * ys + i] == yw[r * ys + i]) ok = 0; /* the gap stays NaN */
            }
            free(yw);
            check(ok && !memcmp(y1, y + stride, sizeof(float) * n),
                  "n=%u tg=%u rows=%u: within %.1f ulp-scaled bound (worst %.2f of it), row alone and rows "
                  "ystride apart bit-identical",
                  n, tg, rows, rel / U, worst);
        next:
            free(x), free(w), free(y), free(y1), free(ref);
        }
}

/* ---------------------------------------------------------- quantize -- */
/* The scale's bytes where fp16 rounding is decided by the last bit: amax
 * chosen so d = amax/127 lands on (or 1..2 float ulps beside) the midpoint
 * of two fp16 neighbours (round-to-nearest-even ties, normal and subnormal
 * halves), plus exact scales 1, 2, 0.5, 1/64 (the H200's miscompiled store
 * wrote d = 1.0 as 01 3c: a value-converted low byte; dialect/f16.h). Lane
 * (b % 32) holds +-amax, the others smaller values. */
static void quantize_scale_cases(void) {
    const uint16_t halves[] = {0x3c00, 0x3bff, 0x4000, 0x3800, 0x2400, 0x0400, 0x03ff, 0x0001,
                               0x0200, 0x5640, 0x7bfe, 0x1234, 0x2abc};
    const int nh = (int)(sizeof halves / 2), per = 7; /* 5 around the midpoint, 2 exact */
    const uint32_t nblk = (uint32_t)(nh * per), n = nblk * 32;
    float *x = malloc(sizeof(float) * n);
    uint32_t b = 0;
    for (int i = 0; i < nh; i++) {
        const double lo = k_h2f(halves[i]), hi = k_h2f((uint16_t)(halves[i] + 1));
        const float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
        uint32_t mbits;
        const float a0 = (float)((double)mid * 127.0);
        memcpy(&mbits, &a0, 4);
        float amax[7];
        for (int k = 0; k < 5; k++) {
            const uint32_t u = mbits + (uint32_t)(k - 2);
            memcpy(&amax[k], &u, 4);
        }
        amax[5] = (float)(lo * 127.0), amax[6] = (float)(hi * 127.0); /* d exactly representable */
        for (int k = 0; k < per; k++, b++)
            for (uint32_t j = 0; j < 32; j++)
                x[b * 32 + j] = j == b % 32 ? (b & 1 ? -amax[k] : amax[k]) : amax[k] * frand(-0.99f, 0.99f);
    }
    uint8_t *q = malloc(nblk * 34), *ref = malloc(nblk * 34);
    memset(q, 0xAB, nblk * 34);
    k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), n, 1, n};
    k_binding bd[] = {K_BIND(quantize_q8_0, status, status, 8), K_BIND(quantize_q8_0, p, &p, sizeof p),
                      K_BIND(quantize_q8_0, x, x, sizeof(float) * n), K_BIND(quantize_q8_0, q, q, nblk * 34)};
    if (!launch(K_ID_quantize_q8_0, (nblk + 3) / 4, 1, 1, 128, bd, 4, EMUL_REVERSE, "quantize scales")) {
        scalar.from_float[DS4_TYPE_Q8_0](x, ref, n);
        int bad = 0, first = -1;
        for (uint32_t i = 0; i < nblk; i++)
            if (memcmp(q + i * 34, ref + i * 34, 34)) {
                bad++;
                if (first < 0) first = (int)i;
            }
        if (first >= 0)
            fprintf(stderr, "  scale case block %d: got %02x %02x want %02x %02x\n", first, q[first * 34],
                    q[first * 34 + 1], ref[first * 34], ref[first * 34 + 1]);
        check(bad == 0, "%u blocks with fp16-tie and exact scales (normal and subnormal): bit-identical "
              "to the CPU's (%d differ)", nblk, bad);
    }
    free(x), free(q), free(ref);
}

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
    quantize_scale_cases();
}

/* ------------------------------------------------------------ matvec -- */
static void quantize_rows(const float *x, uint8_t *q, uint32_t rows, uint32_t n) {
    for (uint32_t r = 0; r < rows; r++)
        scalar.from_float[DS4_TYPE_Q8_0](x + (size_t)r * n, q + (size_t)r * (n / 32) * 34, n);
}

/* A copy of Q8_0 weight rows in the device layout (q8_0_rows.h: the
 * kernels read weights only so; the CPU reference reads the file's). */
static uint8_t *q8_rows_device(const uint8_t *w, uint32_t rows, uint32_t n_in) {
    uint8_t *d = malloc((size_t)rows * (n_in / 32) * 34);
    k_q8_0_rows_to_device(d, w, rows, n_in);
    return d;
}

/* The same in place. */
static void q8_rows_to_device_inplace(uint8_t *w, uint32_t rows, uint32_t n_in) {
    uint8_t *d = q8_rows_device(w, rows, n_in);
    memcpy(w, d, (size_t)rows * (n_in / 32) * 34);
    free(d);
}

/* One activation row copied to the start of a 4-aligned scratch buffer, to
 * be bound alone: bindings of Q8_0 activations are 4-aligned (the runner
 * binds whole row blocks of its buffers), a row of an odd number of Q8_0
 * blocks is not. */
static uint8_t *x_row_alone(const uint8_t *row, size_t bytes) {
    static uint32_t scratch[2048];
    if (bytes > sizeof scratch) abort();
    memcpy(scratch, row, bytes);
    return (uint8_t *)scratch;
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
    /* 1280 (40 blocks): rows 16-aligned, so 16-byte weight loads, and a
     * partial second window; the others take the 2-aligned loads */
    const uint32_t n_ins[] = {32, 96, 1056, 2080, 1280};
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
            uint8_t *wd = q8_rows_device(w, n_out, n_in), *x1 = malloc(nb * 34);
            float *y1 = malloc(sizeof(float) * R * n_out), *yw = malloc(sizeof(float) * R * n_out);
            /* Width 1 for each row, then every verify width 2..16 (all
             * widths on the first shapes, a few on the rest to stay fast). */
            int ok = 1, inv = 1;
            double worst = 0;
            for (uint32_t width = 1; width <= R; width++) {
                if (ii + io > 1 && width != 1 && width != 2 && width != 7 && width != 16) continue;
                const uint32_t reps = width == 1 ? R : 1;
                for (uint32_t rep = 0; rep < reps; rep++) {
                    float *y = width == 1 ? y1 + rep * n_out : yw;
                    /* one row bound alone: copied to the start of a buffer (bindings of
                     * Q8_0 activations are 4-aligned, as the runner's are) */
                    if (width == 1) memcpy(x1, xq + rep * nb * 34, nb * 34);
                    const uint8_t *xa = width == 1 ? x1 : xq;
                    if (width > 1) fill_nan(yw, R * n_out);
                    else fill_nan(y, n_out);
                    /* threadgroups of 1..4 SIMD-groups by width and row: a
                     * row's bits must not depend on the size either */
                    const uint32_t nsg = 1 + (width + rep) % 4;
                    k_matvec_q8_0_params p = {K_TAG_OF(matvec_q8_0), n_in, n_out, width, n_out};
                    k_binding b[] = {K_BIND(matvec_q8_0, status, status, 8),
                                     K_BIND(matvec_q8_0, p, &p, sizeof p),
                                     K_BIND(matvec_q8_0, w, wd, n_out * nb * 34),
                                     K_BIND(matvec_q8_0, xq, xa, width * nb * 34),
                                     K_BIND(matvec_q8_0, y, y, sizeof(float) * width * n_out)};
#if defined(PLANT_WRONG_ARG) || defined(PLANT_WRONG_ARG_UNCHECKED)
                    /* planted fault: params and activations at each other's slot */
                    b[1].slot = K_ARG_matvec_q8_0_xq;
                    b[3].slot = K_ARG_matvec_q8_0_p;
#endif
                    if (launch(K_ID_matvec_q8_0, K_MATVEC_GROUPS(n_out, nsg), 1, 1, 32 * nsg, b, 5,
                               (int)(width & 1), "matvec"))
                        goto next;
                }
                if (width == 1) {
                    /* Tolerance (docs/gpu.md "Q8_0 matvec"): the same nb terms
                     * summed in two orders: the CPU's serial sum is within
                     * (nb-1)u sum|t| of the exact one, ours (per-lane serial
                     * sums of at most ceil(nb/32) terms, the 32 lanes of a
                     * row, then the row's 5-level butterfly) within
                     * (ceil(nb/32) + 5)u sum|t|. */
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
            free(wf), free(xf), free(w), free(wd), free(x1), free(xq), free(y1), free(yw);
        }
    /* A grid one threadgroup short of n_out: refused with K_ERR_SHAPE, not
     * a silent hole in y. */
    {
        const uint32_t n_in = 64, n_out = 9, nsg = 1, nb = n_in / 32;
        uint8_t *w = calloc(n_out * nb, 34), *xq = calloc(nb, 34);
        float *y = calloc(n_out, sizeof(float));
        k_matvec_q8_0_params p = {K_TAG_OF(matvec_q8_0), n_in, n_out, 1, n_out};
        k_binding b[] = {K_BIND(matvec_q8_0, status, status, 8), K_BIND(matvec_q8_0, p, &p, sizeof p),
                         K_BIND(matvec_q8_0, w, w, n_out * nb * 34), K_BIND(matvec_q8_0, xq, xq, nb * 34),
                         K_BIND(matvec_q8_0, y, y, sizeof(float) * n_out)};
        const uint32_t grid[3] = {K_MATVEC_GROUPS(n_out, nsg) - 1, 1, 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_matvec_q8_0, grid, 32 * nsg, b, 5, &opt, err, sizeof err);
        check(rc == 0 && (status[0] & K_ERR_SHAPE), "a grid one threadgroup short of n_out=%u raises K_ERR_SHAPE",
              n_out);
        free(w), free(xq), free(y);
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

/* -------------------------------------------------------------- glue -- */
/* The layer loop's elementwise kernels (elementwise.h) against the CPU's
 * expressions (forward.c add_rows, ffn.c, attention.c output gate, the F16
 * K/V store): bit-identical under the emulator, where exp is libm's. */
/* SiLU / sigmoid outputs against the CPU's ds4_silu / ds4_sigmoid (libm
 * expf): under the emulator the kernels call the same expf, so the values
 * are bit-identical; CUDA's expf (<= 2 ulp) is not glibc's (<= 1), so on
 * the GPU each side is within (exp + add + divide + multiply) of the exact
 * value, GPU <= (2+1+1+1)u and CPU <= (1+1+1+1)u to first order (u =
 * 2^-24), and they differ by at most 9u |ref|: checked with 10u. Returns 1
 * when every element meets it. */
static int exp_close(const float *got, const float *ref, uint32_t n) {
#ifdef K_TEST_CUDA
    for (uint32_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - ref[i]) <= 10.0f * 0x1p-24f * fabsf(ref[i]))) return 0;
    return 1;
#else
    return !memcmp(got, ref, sizeof(float) * n);
#endif
}
#ifdef K_TEST_CUDA
#define EXP_PROMISE "within 10u of"
#else
#define EXP_PROMISE "bit-identical to"
#endif

static void suite_glue(void) {
    for (uint32_t n = 1; n <= 1000; n += 333) {
        float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
        for (uint32_t i = 0; i < n; i++) x[i] = frand(-30, 30), y[i] = ref[i] = frand(-30, 30);
        for (uint32_t i = 0; i < n; i++) ref[i] += x[i];
        k_add_rows_params pa = {K_TAG_OF(add_rows), n};
        k_binding ba[] = {K_BIND(add_rows, status, status, 8), K_BIND(add_rows, p, &pa, sizeof pa),
                          K_BIND(add_rows, x, x, sizeof(float) * n), K_BIND(add_rows, y, y, sizeof(float) * n)};
        if (!launch(K_ID_add_rows, (n + 63) / 64, 1, 1, 64, ba, 4, (int)n & 1, "add_rows"))
            check(!memcmp(y, ref, sizeof(float) * n), "add_rows n=%u: bit-identical", n);
        for (uint32_t i = 0; i < n; i++) ref[i] = ds4_silu(y[i]) * x[i];
        k_swiglu_params ps = {K_TAG_OF(swiglu), n};
        k_binding bs[] = {K_BIND(swiglu, status, status, 8), K_BIND(swiglu, p, &ps, sizeof ps),
                          K_BIND(swiglu, up, x, sizeof(float) * n), K_BIND(swiglu, gate, y, sizeof(float) * n)};
        if (!launch(K_ID_swiglu, (n + 63) / 64, 1, 1, 64, bs, 4, EMUL_REVERSE, "swiglu"))
            check(exp_close(y, ref, n), "swiglu n=%u: " EXP_PROMISE " ds4_silu(g) * u", n);
        free(x), free(y), free(ref);
    }
    {   /* output gate: rows x heads, the gate half after each head's query */
        const uint32_t rows = 3, nh = 5, dh = 7, qs = 2 * nh * dh + 3, na = rows * nh * dh;
        float *qf = malloc(sizeof(float) * rows * qs), *a = malloc(sizeof(float) * na), *ref = malloc(sizeof(float) * na);
        for (uint32_t i = 0; i < rows * qs; i++) qf[i] = frand(-8, 8);
        for (uint32_t i = 0; i < na; i++) a[i] = ref[i] = frand(-3, 3);
        for (uint32_t t = 0; t < rows; t++)
            for (uint32_t h = 0; h < nh; h++)
                for (uint32_t d = 0; d < dh; d++)
                    ref[(t * nh + h) * dh + d] *= ds4_sigmoid(qf[t * qs + 2 * h * dh + dh + d]);
        k_attn_gate_params pg = {K_TAG_OF(attn_gate), rows, nh, dh, qs};
        k_binding bg[] = {K_BIND(attn_gate, status, status, 8), K_BIND(attn_gate, p, &pg, sizeof pg),
                          K_BIND(attn_gate, qf, qf, sizeof(float) * rows * qs), K_BIND(attn_gate, a, a, sizeof(float) * na)};
        if (!launch(K_ID_attn_gate, (na + 31) / 32, 1, 1, 32, bg, 4, EMUL_FORWARD, "attn_gate"))
            check(exp_close(a, ref, na), "attn_gate: " EXP_PROMISE " a * ds4_sigmoid(gate)");
        free(qf), free(a), free(ref);
    }
    {   /* K/V rows into pages through a shuffled page table, crossing a page */
        const uint32_t nkv = 3, dh = 5, rows = 4, pos0 = K_ATTN_BLOCK - 2, n_pages = 3, stride = nkv * dh + 1;
        const uint32_t pages[2] = {2, 0};
        const size_t pool = (size_t)n_pages * nkv * K_ATTN_BLOCK * dh;
        uint16_t *kp = calloc(pool, 2), *vp = calloc(pool, 2), *kr = calloc(pool, 2), *vr = calloc(pool, 2);
        float *k = malloc(sizeof(float) * rows * stride), *v = malloc(sizeof(float) * rows * stride);
        for (uint32_t i = 0; i < rows * stride; i++) k[i] = frand(-70000, 70000), v[i] = frand(-1e-6f, 1e-6f);
        for (uint32_t t = 0; t < rows; t++)
            for (uint32_t h = 0; h < nkv; h++)
                for (uint32_t d = 0; d < dh; d++) {
                    const uint32_t pos = pos0 + t;
                    const size_t o = (((size_t)pages[pos / K_ATTN_BLOCK] * nkv + h) * K_ATTN_BLOCK + pos % K_ATTN_BLOCK) * dh + d;
                    kr[o] = ds4_f32_to_fp16(k[t * stride + h * dh + d]);
                    vr[o] = ds4_f32_to_fp16(v[t * stride + h * dh + d]);
                }
        k_kv_store_params pk = {K_TAG_OF(kv_store), rows, pos0, nkv, dh, stride, n_pages};
        k_binding bk[] = {K_BIND(kv_store, status, status, 8), K_BIND(kv_store, p, &pk, sizeof pk),
                          K_BIND(kv_store, k, k, sizeof(float) * rows * stride),
                          K_BIND(kv_store, v, v, sizeof(float) * rows * stride),
                          K_BIND(kv_store, pages, pages, sizeof pages), K_BIND(kv_store, kpool, kp, pool * 2),
                          K_BIND(kv_store, vpool, vp, pool * 2)};
        if (!launch(K_ID_kv_store, (rows * nkv * dh + 31) / 32, 1, 1, 32, bk, 7, EMUL_REVERSE, "kv_store"))
            check(!memcmp(kp, kr, pool * 2) && !memcmp(vp, vr, pool * 2),
                  "kv_store across a page boundary: the CPU's fp16 rows at the paged places, nothing else written");
        free(kp), free(vp), free(kr), free(vr), free(k), free(v);
    }
}

/* ------------------------------------------------------------- fused -- */
/* The fused glue (fused.h) against the unfused sequence of existing kernels
 * on the same data, bit for bit (the fused kernels promise the same
 * operations in the same order per value, so any difference is a bug), and
 * the quantized rows against the CPU's quantizers of the fused float rows
 * (also bit for bit: the quantizers are). */
static uint32_t fused_row_tg(uint32_t n) { /* runner.c row_tg */
    return n >= 4096 ? 1024 : n >= 256 ? 256 : (n + 31) / 32 * 32;
}

/* Unfused: add_rows per row, rmsnorm, quantize_q8_0 / quantize_q8_K. */
static int nq_unfused(uint32_t n, uint32_t rows, uint32_t stride, uint32_t fl, const float *y, float *h,
                      const float *w, float *x, uint8_t *q8, uint8_t *qk) {
    const size_t span = (size_t)(rows - 1) * stride + n;
    if (fl & K_NQ_ADD)
        for (uint32_t r = 0; r < rows; r++) {
            k_add_rows_params pa = {K_TAG_OF(add_rows), n};
            k_binding ba[] = {K_BIND(add_rows, status, status, 8), K_BIND(add_rows, p, &pa, sizeof pa),
                              K_BIND(add_rows, x, (float *)y + r * stride, sizeof(float) * n),
                              K_BIND(add_rows, y, h + r * stride, sizeof(float) * n)};
            if (launch(K_ID_add_rows, (n + 63) / 64, 1, 1, 64, ba, 4, EMUL_FORWARD, "unfused add_rows")) return -1;
        }
    k_rmsnorm_params pn = {K_TAG_OF(rmsnorm), n, rows, stride, 1e-6f, 1, 0};
    k_binding bn[] = {K_BIND(rmsnorm, status, status, 8), K_BIND(rmsnorm, p, &pn, sizeof pn),
                      K_BIND(rmsnorm, x, h, sizeof(float) * span), K_BIND(rmsnorm, w, w, sizeof(float) * n),
                      K_BIND(rmsnorm, y, x, sizeof(float) * span)};
    if (launch(K_ID_rmsnorm, rows, 1, 1, fused_row_tg(n), bn, 5, EMUL_REVERSE, "unfused rmsnorm")) return -1;
    if (fl & K_NQ_Q8_0) {
        k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), n, rows, stride};
        k_binding b[] = {K_BIND(quantize_q8_0, status, status, 8), K_BIND(quantize_q8_0, p, &p, sizeof p),
                         K_BIND(quantize_q8_0, x, x, sizeof(float) * span),
                         K_BIND(quantize_q8_0, q, q8, (size_t)rows * (n / 32) * 34)};
        if (launch(K_ID_quantize_q8_0, (rows * (n / 32) + 3) / 4, 1, 1, 128, b, 4, EMUL_FORWARD, "unfused q8_0"))
            return -1;
    }
    if (fl & K_NQ_Q8_K) {
        k_quantize_q8_K_params p = {K_TAG_OF(quantize_q8_K), n, rows, stride};
        k_binding b[] = {K_BIND(quantize_q8_K, status, status, 8), K_BIND(quantize_q8_K, p, &p, sizeof p),
                         K_BIND(quantize_q8_K, x, x, sizeof(float) * span),
                         K_BIND(quantize_q8_K, q, qk, (size_t)rows * (n / 256) * 292)};
        if (launch(K_ID_quantize_q8_K, (rows * (n / 256) + 3) / 4, 1, 1, 128, b, 4, EMUL_REVERSE, "unfused q8_K"))
            return -1;
    }
    return 0;
}

static int nq_fused(uint32_t n, uint32_t rows, uint32_t stride, uint32_t fl, int schedule, const float *y,
                    float *h, const float *w, float *x, uint8_t *q8, uint8_t *qk) {
    const size_t span = (size_t)(rows - 1) * stride + n;
    k_norm_quant_params p = {K_TAG_OF(norm_quant), n, rows, stride, 1e-6f, fl};
    k_binding b[] = {K_BIND(norm_quant, status, status, 8), K_BIND(norm_quant, p, &p, sizeof p),
                     K_BIND(norm_quant, y, (float *)y, sizeof(float) * span),
                     K_BIND(norm_quant, h, h, sizeof(float) * span), K_BIND(norm_quant, w, w, sizeof(float) * n),
                     K_BIND(norm_quant, x, x, sizeof(float) * span),
                     K_BIND(norm_quant, q8, q8, (size_t)rows * (n / 32) * 34 + 1),
                     K_BIND(norm_quant, qk, qk, (size_t)rows * (n / 256) * 292 + 1)};
    return launch(K_ID_norm_quant, rows, 1, 1, fused_row_tg(n), b, 8, schedule, "norm_quant");
}

/* qk_norm_rope vs per-token rmsnorm launches (q heads, then k heads) + rope_neox on q and k. */
static void fused_qk_norm_rope(void) {
    static const struct {
        uint32_t nh, nkv, dh, n_rot, rows;
    } cs_[] = {{5, 1, 40, 16, 3}, {4, 2, 64, 64, 2}, {3, 3, 256, 64, 2}, {2, 1, 72, 0, 1}, {8, 2, 256, 64, 1}};
    for (size_t ic = 0; ic < sizeof cs_ / sizeof cs_[0]; ic++) {
        const uint32_t nh = cs_[ic].nh, nkv = cs_[ic].nkv, dh = cs_[ic].dh, nr = cs_[ic].n_rot, rows = cs_[ic].rows;
        const uint32_t qs = 2 * nh * dh + 3, ks = nkv * dh + 1, half = nr / 2 ? nr / 2 : 1, tg = fused_row_tg(dh);
        const size_t nq = (size_t)rows * qs, nk = (size_t)rows * ks;
        float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *qw = malloc(sizeof(float) * dh),
              *kw = malloc(sizeof(float) * dh), *c = malloc(sizeof(float) * rows * half),
              *sn = malloc(sizeof(float) * rows * half);
        float *qo = malloc(sizeof(float) * nq), *ko = malloc(sizeof(float) * nk), *qr = malloc(sizeof(float) * nq),
              *kr = malloc(sizeof(float) * nk);
        for (size_t i = 0; i < nq; i++) q[i] = frand(-4, 4) * (i % 11 ? 1.0f : 25.0f);
        for (size_t i = 0; i < nk; i++) k[i] = frand(-4, 4);
        for (uint32_t i = 0; i < dh; i++) qw[i] = frand(0.5f, 1.5f), kw[i] = frand(0.5f, 1.5f);
        for (uint32_t i = 0; i < rows * half; i++) {
            const float a = frand(-3.2f, 3.2f);
            c[i] = cosf(a), sn[i] = sinf(a);
        }
        fill_nan(qo, nq), fill_nan(ko, nk), fill_nan(qr, nq), fill_nan(kr, nk);
        int bad = 0;
        for (uint32_t t = 0; t < rows && !bad; t++)
            for (int pass = 0; pass < 2 && !bad; pass++) {
                const uint32_t nrow = pass ? nkv : nh, st = pass ? dh : 2 * dh, o = t * (pass ? ks : qs);
                const size_t span = (size_t)(nrow - 1) * st + dh;
                k_rmsnorm_params pn = {K_TAG_OF(rmsnorm), dh, nrow, st, 1e-6f, 1, 0};
                k_binding bn[] = {K_BIND(rmsnorm, status, status, 8), K_BIND(rmsnorm, p, &pn, sizeof pn),
                                  K_BIND(rmsnorm, x, (pass ? k : q) + o, sizeof(float) * span),
                                  K_BIND(rmsnorm, w, pass ? kw : qw, sizeof(float) * dh),
                                  K_BIND(rmsnorm, y, (pass ? kr : qr) + o, sizeof(float) * span)};
                bad |= launch(K_ID_rmsnorm, nrow, 1, 1, tg, bn, 5, EMUL_FORWARD, "unfused head rmsnorm");
            }
        for (int pass = 0; pass < 2 && !bad && nr; pass++) {
            const uint32_t heads = pass ? nkv : nh, hs = pass ? dh : 2 * dh, rs = pass ? ks : qs;
            k_rope_neox_params pr = {K_TAG_OF(rope_neox), rows, heads, dh, nr, rs, hs};
            k_binding br[] = {K_BIND(rope_neox, status, status, 8), K_BIND(rope_neox, p, &pr, sizeof pr),
                              K_BIND(rope_neox, x, pass ? kr : qr, sizeof(float) * (pass ? nk : nq)),
                              K_BIND(rope_neox, cs, c, sizeof(float) * rows * half),
                              K_BIND(rope_neox, sn, sn, sizeof(float) * rows * half)};
            bad |= launch(K_ID_rope_neox, (rows * heads * half + 31) / 32, 1, 1, 32, br, 5, EMUL_REVERSE, "unfused rope");
        }
        /* fused: in place on copies of q and k */
        memcpy(qo, q, sizeof(float) * nq), memcpy(ko, k, sizeof(float) * nk);
        float *w2 = malloc(sizeof(float) * 2 * dh);
        memcpy(w2, qw, sizeof(float) * dh), memcpy(w2 + dh, kw, sizeof(float) * dh);
        for (uint32_t t = 0; t < rows; t++) /* the unfused outputs' gaps: the inputs, untouched */
            for (uint32_t i = 0; i < qs; i++)
                if (qr[t * qs + i] != qr[t * qs + i]) qr[t * qs + i] = q[t * qs + i];
        for (size_t i = 0; i < nk; i++)
            if (kr[i] != kr[i]) kr[i] = k[i];
        k_qk_norm_rope_params p = {K_TAG_OF(qk_norm_rope), rows, nh, nkv, dh, nr, qs, 2 * dh, ks, 1e-6f};
        k_binding b[] = {K_BIND(qk_norm_rope, status, status, 8), K_BIND(qk_norm_rope, p, &p, sizeof p),
                         K_BIND(qk_norm_rope, q, qo, sizeof(float) * nq), K_BIND(qk_norm_rope, k, ko, sizeof(float) * nk),
                         K_BIND(qk_norm_rope, w, w2, sizeof(float) * 2 * dh),
                         K_BIND(qk_norm_rope, cs, c, sizeof(float) * rows * half),
                         K_BIND(qk_norm_rope, sn, sn, sizeof(float) * rows * half)};
        if (!bad && !launch(K_ID_qk_norm_rope, nh + nkv, rows, 1, tg, b, 7, (int)ic & 1, "qk_norm_rope"))
            check(!memcmp(qo, qr, sizeof(float) * nq) && !memcmp(ko, kr, sizeof(float) * nk),
                  "qk_norm_rope n_head=%u n_head_kv=%u head_dim=%u n_rot=%u rows=%u tg=%u: q and k in place "
                  "bit-identical to rmsnorm per head + rope_neox (gate halves and gaps untouched)", nh, nkv, dh, nr,
                  rows, tg);
        free(w2);
        free(q), free(k), free(qw), free(kw), free(c), free(sn), free(qo), free(ko), free(qr), free(kr);
    }
}

/* attn_gate_quant vs attn_gate + quantize_q8_0 / quantize_q8_K. */
static void fused_attn_gate_quant(void) {
    static const struct {
        uint32_t nh, dh, rows, fl;
    } cs_[] = {{5, 32, 3, K_NQ_Q8_0}, {3, 96, 2, K_NQ_Q8_0}, {4, 64, 3, K_NQ_Q8_K}, {5, 256, 2, K_NQ_Q8_0 | K_NQ_Q8_K},
               {8, 256, 1, K_NQ_Q8_K}, /* then one SIMD-group per block (K_NQ_BLOCKS) */
               {5, 256, 2, K_NQ_Q8_0 | K_NQ_Q8_K | K_NQ_BLOCKS}, {4, 64, 3, K_NQ_Q8_K | K_NQ_BLOCKS}};
    for (size_t ic = 0; ic < sizeof cs_ / sizeof cs_[0]; ic++) {
        const uint32_t nh = cs_[ic].nh, dh = cs_[ic].dh, rows = cs_[ic].rows, fl = cs_[ic].fl, n = nh * dh;
        const uint32_t qs = 2 * n + 3;
        const size_t na = (size_t)rows * n, n8 = (size_t)rows * (n / 32) * 34 + 1, nk = (size_t)rows * (n / 256) * 292 + 1;
        float *qf = malloc(sizeof(float) * rows * qs), *a = malloc(sizeof(float) * na), *ar = malloc(sizeof(float) * na);
        uint8_t *q8 = malloc(n8), *q8r = malloc(n8), *qk = malloc(nk), *qkr = malloc(nk), *cpu = malloc(nk + n8);
        for (size_t i = 0; i < (size_t)rows * qs; i++) qf[i] = frand(-8, 8);
        for (size_t i = 0; i < na; i++) a[i] = ar[i] = frand(-3, 3);
        if (n >= 256) { /* row 0, first 256 values: equal gates, a |max| tie of opposite signs (7, 200) */
            for (uint32_t j = 0; j < 256; j++) qf[(2 * (j / dh) + 1) * dh + j % dh] = 5.0f;
            a[7] = ar[7] = -5.0f, a[200] = ar[200] = 5.0f;
        }
        memset(q8, 0xAB, n8), memset(q8r, 0xAB, n8), memset(qk, 0xCD, nk), memset(qkr, 0xCD, nk);
        int bad = 0;
        k_attn_gate_params pg = {K_TAG_OF(attn_gate), rows, nh, dh, qs};
        k_binding bg[] = {K_BIND(attn_gate, status, status, 8), K_BIND(attn_gate, p, &pg, sizeof pg),
                          K_BIND(attn_gate, qf, qf, sizeof(float) * rows * qs), K_BIND(attn_gate, a, ar, sizeof(float) * na)};
        bad |= launch(K_ID_attn_gate, (uint32_t)(na + 63) / 64, 1, 1, 64, bg, 4, EMUL_FORWARD, "unfused attn_gate");
        if (!bad && (fl & K_NQ_Q8_0)) {
            k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), n, rows, n};
            k_binding b[] = {K_BIND(quantize_q8_0, status, status, 8), K_BIND(quantize_q8_0, p, &p, sizeof p),
                             K_BIND(quantize_q8_0, x, ar, sizeof(float) * na), K_BIND(quantize_q8_0, q, q8r, n8)};
            bad |= launch(K_ID_quantize_q8_0, (rows * (n / 32) + 3) / 4, 1, 1, 128, b, 4, EMUL_FORWARD, "unfused q8_0");
        }
        if (!bad && (fl & K_NQ_Q8_K)) {
            k_quantize_q8_K_params p = {K_TAG_OF(quantize_q8_K), n, rows, n};
            k_binding b[] = {K_BIND(quantize_q8_K, status, status, 8), K_BIND(quantize_q8_K, p, &p, sizeof p),
                             K_BIND(quantize_q8_K, x, ar, sizeof(float) * na), K_BIND(quantize_q8_K, q, qkr, nk)};
            bad |= launch(K_ID_quantize_q8_K, (rows * (n / 256) + 3) / 4, 1, 1, 128, b, 4, EMUL_REVERSE, "unfused q8_K");
        }
        k_attn_gate_quant_params p = {K_TAG_OF(attn_gate_quant), rows, nh, dh, qs, fl};
        k_binding b[] = {K_BIND(attn_gate_quant, status, status, 8), K_BIND(attn_gate_quant, p, &p, sizeof p),
                         K_BIND(attn_gate_quant, qf, qf, sizeof(float) * rows * qs),
                         K_BIND(attn_gate_quant, a, a, sizeof(float) * na), K_BIND(attn_gate_quant, q8, q8, n8),
                         K_BIND(attn_gate_quant, qk, qk, nk)};
        const uint32_t units = K_ATTN_GATE_QUANT_UNITS(p), nsg = 1 + (uint32_t)ic % 3;
        if (!bad && !launch(K_ID_attn_gate_quant, (units + nsg - 1) / nsg, 1, 1, 32 * nsg, b, 6, (int)ic & 1,
                            "attn_gate_quant")) {
            int cpu_ok = 1;
            for (uint32_t r = 0; r < rows; r++) {
                if (fl & K_NQ_Q8_0) {
                    scalar.from_float[DS4_TYPE_Q8_0](ar + (size_t)r * n, cpu, n);
                    cpu_ok &= !memcmp(cpu, q8 + (size_t)r * (n / 32) * 34, (n / 32) * 34);
                }
                if (fl & K_NQ_Q8_K) {
                    scalar.from_float[DS4_TYPE_Q8_K](ar + (size_t)r * n, cpu, n);
                    cpu_ok &= !memcmp(cpu, qk + (size_t)r * (n / 256) * 292, (n / 256) * 292);
                }
            }
            check(!memcmp(q8, q8r, n8) && !memcmp(qk, qkr, nk) && cpu_ok,
                  "attn_gate_quant n_head=%u head_dim=%u rows=%u flags=0x%x tg=%u: Q8_0%s, Q8_K%s bit-identical to "
                  "attn_gate + quantize, quantized rows = the CPU's (%d)", nh, dh, rows, fl, 32 * nsg,
                  fl & K_NQ_Q8_0 ? "" : " (unwritten)", fl & K_NQ_Q8_K ? "" : " (unwritten)", cpu_ok);
        }
        free(qf), free(a), free(ar), free(q8), free(q8r), free(qk), free(qkr), free(cpu);
    }
}

static void suite_fused(void) {
    static const struct {
        uint32_t n, fl;
    } nc[] = {{33, K_NQ_ADD | K_NQ_X},
              {96, K_NQ_ADD | K_NQ_Q8_0},
              {800, K_NQ_ADD | K_NQ_X | K_NQ_Q8_0},
              {1280, K_NQ_ADD | K_NQ_Q8_0 | K_NQ_Q8_K},
              {1280, K_NQ_Q8_K},
              {2304, K_NQ_ADD | K_NQ_X | K_NQ_Q8_K},
              {5120, K_NQ_ADD | K_NQ_Q8_0 | K_NQ_Q8_K}};
    for (size_t ic = 0; ic < sizeof nc / sizeof nc[0]; ic++) {
        const uint32_t n = nc[ic].n, fl = nc[ic].fl, rows = 3, stride = n + 5;
        const size_t span = (size_t)(rows - 1) * stride + n, n8 = (size_t)rows * (n / 32) * 34 + 1,
                     nk = (size_t)rows * (n / 256) * 292 + 1;
        float *y = malloc(sizeof(float) * span), *h0 = malloc(sizeof(float) * span), *w = malloc(sizeof(float) * n);
        float *h = malloc(sizeof(float) * span), *hr = malloc(sizeof(float) * span);
        float *x = malloc(sizeof(float) * span), *xr = malloc(sizeof(float) * span);
        uint8_t *q8 = malloc(n8), *q8r = malloc(n8), *qk = malloc(nk), *qkr = malloc(nk), *cpu = malloc(nk + n8);
        for (size_t i = 0; i < span; i++) y[i] = frand(-2, 2), h0[i] = frand(-3, 3) * (i % 7 ? 1.0f : 30.0f);
        for (uint32_t i = 0; i < n; i++) w[i] = i % 3 ? frand(0.5f, 1.5f) : 1.0f;
        if (n >= 512) { /* row 1: an all-zero Q8_K block (and Q8_0 blocks); row 2: a |max| tie across chunks */
            for (uint32_t i = 256; i < 512; i++) h0[stride + i] = y[stride + i] = 0.0f;
            const uint32_t a = 2 * stride + 256 + 64 + 3, b = 2 * stride + 256 + 160 + 9; /* chunks 2 and 5, w 1 */
            w[a - 2 * stride] = w[b - 2 * stride] = 1.0f;
            h0[a] = -500.0f, h0[b] = 500.0f, y[a] = y[b] = 0.0f; /* |h + y| 500 at both */
        }
        memcpy(h, h0, sizeof(float) * span), memcpy(hr, h0, sizeof(float) * span);
        fill_nan(x, span), fill_nan(xr, span);
        memset(q8, 0xAB, n8), memset(q8r, 0xAB, n8), memset(qk, 0xCD, nk), memset(qkr, 0xCD, nk);
        if (nq_unfused(n, rows, stride, fl, y, hr, w, xr, q8r, qkr) ||
            nq_fused(n, rows, stride, fl, (int)ic & 1, y, h, w, x, q8, qk))
            goto next;
        int same_h = !memcmp(h, hr, sizeof(float) * span), same_x = 1;
        if (fl & K_NQ_X) /* row elements the rmsnorm's; gaps unwritten (NaN) in both */
            for (uint32_t r = 0; r < rows; r++) same_x &= !memcmp(x + r * stride, xr + r * stride, sizeof(float) * n);
        else
            for (size_t i = 0; i < span; i++) same_x &= x[i] != x[i]; /* x untouched */
        const int same_q8 = !memcmp(q8, q8r, n8), same_qk = !memcmp(qk, qkr, nk);
        /* and the CPU's quantizers of the (unfused) float rows */
        int cpu_ok = 1;
        for (uint32_t r = 0; r < rows; r++) {
            if (fl & K_NQ_Q8_0) {
                scalar.from_float[DS4_TYPE_Q8_0](xr + r * stride, cpu, n);
                cpu_ok &= !memcmp(cpu, q8 + (size_t)r * (n / 32) * 34, (n / 32) * 34);
            }
            if (fl & K_NQ_Q8_K) {
                scalar.from_float[DS4_TYPE_Q8_K](xr + r * stride, cpu, n);
                cpu_ok &= !memcmp(cpu, qk + (size_t)r * (n / 256) * 292, (n / 256) * 292);
            }
        }
        check(same_h && same_x && same_q8 && same_qk && cpu_ok,
              "norm_quant n=%u tg=%u flags=0x%x rows=%u: h%s, x%s, Q8_0%s, Q8_K%s bit-identical to add_rows + "
              "rmsnorm + quantize (h %d x %d q8 %d qk %d), quantized rows = the CPU's (%d)",
              n, fused_row_tg(n), fl, rows, fl & K_NQ_ADD ? "" : " (untouched)", fl & K_NQ_X ? "" : " (unwritten)",
              fl & K_NQ_Q8_0 ? "" : " (unwritten)", fl & K_NQ_Q8_K ? "" : " (unwritten)", same_h, same_x, same_q8,
              same_qk, cpu_ok);
        if (n >= 512 && (fl & K_NQ_Q8_K)) { /* the planted cases really are what they say */
            const uint8_t *blk = qk + (size_t)(n / 256) * 292 + 292; /* row 1, block 1 */
            int zero = 1;
            for (int i = 0; i < 292; i++) zero &= blk[i] == 0;
            float d2;
            memcpy(&d2, qk + (size_t)2 * (n / 256) * 292 + 292, 4);
            check(zero && d2 > 0 && (int8_t)qk[(size_t)2 * (n / 256) * 292 + 292 + 4 + 64 + 3] == -127,
                  "norm_quant n=%u: an all-zero Q8_K block is all zeros; a |max| tie across chunks goes to the "
                  "lower index (-500 -> code -127 as max, d > 0)", n);
        }
        {   /* batch invariance: row 2 alone (no add: h already holds the sum) gives the same bits */
            float *x1 = malloc(sizeof(float) * stride);
            uint8_t *a8 = malloc(n8), *ak = malloc(nk);
            float *h1 = malloc(sizeof(float) * n);
            memcpy(h1, hr + 2 * stride, sizeof(float) * n);
            fill_nan(x1, stride);
            const uint32_t f1 = fl & ~K_NQ_ADD;
            if (!nq_fused(n, 1, stride, f1 | K_NQ_X, EMUL_REVERSE, y, h1, w, x1, a8, ak))
                check(!memcmp(x1, xr + 2 * stride, sizeof(float) * n) &&
                          (!(fl & K_NQ_Q8_0) || !memcmp(a8, q8r + (size_t)2 * (n / 32) * 34, (n / 32) * 34)) &&
                          (!(fl & K_NQ_Q8_K) || !memcmp(ak, qkr + (size_t)2 * (n / 256) * 292, (n / 256) * 292)),
                      "norm_quant n=%u: a row alone, without the add, bit-identical to it in the batch", n);
            free(x1), free(a8), free(ak), free(h1);
        }
    next:
        free(y), free(h0), free(w), free(h), free(hr), free(x), free(xr), free(q8), free(q8r), free(qk), free(qkr),
            free(cpu);
    }
    {   /* n past K_NQ_MAX_N or not a multiple of the block: refused loudly */
        const uint32_t n = 1000;
        float *v = calloc(3 * n, sizeof(float));
        uint8_t q[1024];
        k_norm_quant_params p = {K_TAG_OF(norm_quant), n, 1, n, 1e-6f, K_NQ_Q8_K};
        k_binding b[] = {K_BIND(norm_quant, status, status, 8), K_BIND(norm_quant, p, &p, sizeof p),
                         K_BIND(norm_quant, y, v, sizeof(float) * n), K_BIND(norm_quant, h, v + n, sizeof(float) * n),
                         K_BIND(norm_quant, w, v + 2 * n, sizeof(float) * n), K_BIND(norm_quant, x, q, 4),
                         K_BIND(norm_quant, q8, q, 1), K_BIND(norm_quant, qk, q, sizeof q)};
        char err[300];
        const uint32_t grid[3] = {1, 1, 1};
        emul_options opt = {EMUL_FORWARD, 0};
        status[0] = 0;
        const int rc = emul_launch(K_ID_norm_quant, grid, 256, b, 8, &opt, err, sizeof err);
        check(rc == 0 && (status[0] & K_ERR_SHAPE), "norm_quant n=1000 with Q8_K: the kernel raises K_ERR_SHAPE (%s)",
              rc ? err : "launched");
        free(v);
    }
    /* swiglu_quant vs swiglu + quantize_q8_0 / quantize_q8_K; g and u in one
     * buffer, rows [g | pad | u | pad] (odd gaps), as the layer loop's [g | u] */
    static const struct {
        uint32_t n, fl;
    } sc[] = {{96, K_NQ_Q8_0}, {352, K_NQ_Q8_0}, {768, K_NQ_Q8_K}, {1280, K_NQ_Q8_0 | K_NQ_Q8_K},
              {3584, K_NQ_Q8_K}, /* then one SIMD-group per block (K_NQ_BLOCKS; a no-op without Q8_K) */
              {1280, K_NQ_Q8_0 | K_NQ_Q8_K | K_NQ_BLOCKS}, {768, K_NQ_Q8_K | K_NQ_BLOCKS}, {96, K_NQ_Q8_0 | K_NQ_BLOCKS}};
    for (size_t ic = 0; ic < sizeof sc / sizeof sc[0]; ic++) {
        const uint32_t n = sc[ic].n, fl = sc[ic].fl, rows = 3, up_off = n + (uint32_t)ic % 2 * 3,
                       stride = up_off + n + 5;
        const size_t span = (size_t)rows * n, n8 = (size_t)rows * (n / 32) * 34 + 1, nk = (size_t)rows * (n / 256) * 292 + 1;
        const size_t gspan = (size_t)(rows - 1) * stride + up_off + n;
        float *u = malloc(sizeof(float) * span), *gu = malloc(sizeof(float) * gspan), *gr = malloc(sizeof(float) * span);
        uint8_t *q8 = malloc(n8), *q8r = malloc(n8), *qk = malloc(nk), *qkr = malloc(nk), *cpu = malloc(nk + n8);
        fill_nan(gu, gspan); /* the gaps: a read of one would poison a block */
        for (size_t i = 0; i < span; i++) u[i] = frand(-4, 4), gr[i] = frand(-12, 12);
        if (n >= 512)
            for (uint32_t i = 256; i < 512; i++) u[n + i] = 0.0f; /* row 1: an all-zero Q8_K block */
        for (uint32_t r = 0; r < rows; r++) {
            memcpy(gu + (size_t)r * stride, gr + (size_t)r * n, sizeof(float) * n);
            memcpy(gu + (size_t)r * stride + up_off, u + (size_t)r * n, sizeof(float) * n);
        }
        memset(q8, 0xAB, n8), memset(q8r, 0xAB, n8), memset(qk, 0xCD, nk), memset(qkr, 0xCD, nk);
        k_swiglu_params ps = {K_TAG_OF(swiglu), (uint32_t)span};
        k_binding bs[] = {K_BIND(swiglu, status, status, 8), K_BIND(swiglu, p, &ps, sizeof ps),
                          K_BIND(swiglu, up, u, sizeof(float) * span), K_BIND(swiglu, gate, gr, sizeof(float) * span)};
        if (launch(K_ID_swiglu, (uint32_t)(span + 63) / 64, 1, 1, 64, bs, 4, EMUL_FORWARD, "unfused swiglu"))
            goto next2;
        if (fl & K_NQ_Q8_0) {
            k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), n, rows, n};
            k_binding b[] = {K_BIND(quantize_q8_0, status, status, 8), K_BIND(quantize_q8_0, p, &p, sizeof p),
                             K_BIND(quantize_q8_0, x, gr, sizeof(float) * span), K_BIND(quantize_q8_0, q, q8r, n8)};
            if (launch(K_ID_quantize_q8_0, (rows * (n / 32) + 3) / 4, 1, 1, 128, b, 4, EMUL_FORWARD, "unfused q8_0"))
                goto next2;
        }
        if (fl & K_NQ_Q8_K) {
            k_quantize_q8_K_params p = {K_TAG_OF(quantize_q8_K), n, rows, n};
            k_binding b[] = {K_BIND(quantize_q8_K, status, status, 8), K_BIND(quantize_q8_K, p, &p, sizeof p),
                             K_BIND(quantize_q8_K, x, gr, sizeof(float) * span), K_BIND(quantize_q8_K, q, qkr, nk)};
            if (launch(K_ID_quantize_q8_K, (rows * (n / 256) + 3) / 4, 1, 1, 128, b, 4, EMUL_REVERSE, "unfused q8_K"))
                goto next2;
        }
        k_swiglu_quant_params p = {K_TAG_OF(swiglu_quant), n, rows, stride, up_off, fl};
        k_binding b[] = {K_BIND(swiglu_quant, status, status, 8), K_BIND(swiglu_quant, p, &p, sizeof p),
                         K_BIND(swiglu_quant, gu, gu, sizeof(float) * gspan), K_BIND(swiglu_quant, q8, q8, n8),
                         K_BIND(swiglu_quant, qk, qk, nk)};
        const uint32_t units = K_SWIGLU_QUANT_UNITS(p), nsg = 1 + (uint32_t)ic % 4;
        if (launch(K_ID_swiglu_quant, (units + nsg - 1) / nsg, 1, 1, 32 * nsg, b, 5, (int)ic & 1, "swiglu_quant"))
            goto next2;
        int cpu_ok = 1;
        for (uint32_t r = 0; r < rows; r++) {
            if (fl & K_NQ_Q8_0) {
                scalar.from_float[DS4_TYPE_Q8_0](gr + (size_t)r * n, cpu, n);
                cpu_ok &= !memcmp(cpu, q8 + (size_t)r * (n / 32) * 34, (n / 32) * 34);
            }
            if (fl & K_NQ_Q8_K) {
                scalar.from_float[DS4_TYPE_Q8_K](gr + (size_t)r * n, cpu, n);
                cpu_ok &= !memcmp(cpu, qk + (size_t)r * (n / 256) * 292, (n / 256) * 292);
            }
        }
        check(!memcmp(q8, q8r, n8) && !memcmp(qk, qkr, nk) && cpu_ok,
              "swiglu_quant n=%u rows=%u stride=%u up_off=%u flags=0x%x tg=%u: Q8_0%s, Q8_K%s bit-identical to "
              "swiglu + quantize, quantized rows = the CPU's (%d)", n, rows, stride, up_off, fl, 32 * nsg,
              fl & K_NQ_Q8_0 ? "" : " (unwritten)", fl & K_NQ_Q8_K ? "" : " (unwritten)", cpu_ok);
    next2:
        free(u), free(gu), free(gr), free(q8), free(q8r), free(qk), free(qkr), free(cpu);
    }
    fused_qk_norm_rope();
    fused_attn_gate_quant();
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
 * hs threadgroups per GQA group of tg threads each, merge); 0 on success.
 * With expect_shape the partials launch must raise K_ERR_SHAPE instead
 * (1 when it does). */
static int run_attn_hs(const attn_case *c, uint32_t pos0, uint32_t n_rows, const float *q, uint32_t bps,
                       uint32_t hs, uint32_t rg, uint32_t tg, int schedule, float *out, int expect_shape) {
    const uint32_t nb = (pos0 + n_rows + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
    const uint32_t qs = c->n_head * c->dh;
    const size_t part_n = (size_t)n_rows * c->n_head * nb * (2 + c->dh);
    float *part = malloc(sizeof(float) * part_n);
    fill_nan(part, part_n);
    fill_nan(out, (size_t)n_rows * qs);
    k_attn_partials_params p = {K_TAG_OF(attn_partials), c->n_head, c->n_head_kv, c->dh, n_rows, pos0,
                                nb, bps, c->n_pages, qs, c->dh, c->scale, hs, rg};
    const uint32_t ng = rg ? (n_rows + rg - 1) / rg : 1;
    const size_t pool = (size_t)c->n_pages * c->n_head_kv * K_ATTN_BLOCK * c->dh * 2;
    k_binding b[] = {K_BIND(attn_partials, status, status, 8), K_BIND(attn_partials, p, &p, sizeof p),
                     K_BIND(attn_partials, q, q, sizeof(float) * n_rows * qs),
                     K_BIND(attn_partials, kpool, c->kpool, pool), K_BIND(attn_partials, vpool, c->vpool, pool),
                     K_BIND(attn_partials, pages, c->pages, 4 * nb),
                     K_BIND(attn_partials, part, part, sizeof(float) * part_n)};
    if (expect_shape) {
        const uint32_t grid[3] = {c->n_head_kv * (hs ? hs : 1), k_attn_n_splits(nb, bps), ng};
        emul_options opt = {schedule, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_attn_partials, grid, tg, b, 7, &opt, err, sizeof err);
        free(part);
        return rc == 0 && (status[0] & K_ERR_SHAPE);
    }
    int rc = launch(K_ID_attn_partials, c->n_head_kv * hs, k_attn_n_splits(nb, bps), ng, tg, b, 7, schedule,
                    "attn_partials");
    if (!rc) {
        k_attn_merge_params m = {K_TAG_OF(attn_merge), c->n_head, c->dh, n_rows, pos0, nb, qs};
        k_binding bm[] = {K_BIND(attn_merge, status, status, 8), K_BIND(attn_merge, p, &m, sizeof m),
                          K_BIND(attn_merge, part, part, sizeof(float) * part_n),
                          K_BIND(attn_merge, out, out, sizeof(float) * n_rows * qs)};
        rc = launch(K_ID_attn_merge, c->n_head, n_rows, 1, k_attn_merge_threads(c->dh), bm, 4, schedule, "attn_merge");
    }
    free(part);
    return rc;
}

static int run_attn(const attn_case *c, uint32_t pos0, uint32_t n_rows, const float *q, uint32_t bps,
                    int schedule, float *out) {
    return run_attn_hs(c, pos0, n_rows, q, bps, 1, 1, 128, schedule, out, 0);
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

/* The case's scale, block and page counts (spare pages past the blocks)
 * and random F16 K/V pools (K in [-2, 2], V in [-3, 3]); c->pages
 * allocated, its mapping left to the caller. */
static void attn_case_pools(attn_case *c, uint32_t n_rows, uint32_t spare) {
    c->scale = 1.0f / sqrtf((float)c->dh);
    c->n_blocks = (c->pos0 + n_rows + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
    c->n_pages = c->n_blocks + spare;
    const size_t pe = (size_t)c->n_pages * c->n_head_kv * K_ATTN_BLOCK * c->dh;
    c->kpool = malloc(2 * pe), c->vpool = malloc(2 * pe);
    for (size_t i = 0; i < pe; i++) {
        c->kpool[i] = ds4_f32_to_fp16(frand(-2, 2));
        c->vpool[i] = ds4_f32_to_fp16(frand(-3, 3));
    }
    c->pages = malloc(4 * c->n_blocks);
}

/* The partials of one attn_partials (hs 1, one row a threadgroup, 128
 * threads: the base) or attn_partials_wide (rg rows, K_ATTN_WIDE_TG
 * threads unless tg is given) launch into part (NaN where unwritten); 0 on
 * success, or with expect_shape 1 when the launch raises K_ERR_SHAPE. */
static int run_attn_part(const attn_case *c, uint32_t n_rows, uint32_t bps, int wide, uint32_t hs, uint32_t rg,
                         uint32_t tg, int schedule, float *part, size_t part_n, int expect_shape) {
    const uint32_t nb = (c->pos0 + n_rows + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK, qs = c->n_head * c->dh;
    fill_nan(part, part_n);
    k_attn_partials_params p = {wide ? K_TAG_OF(attn_partials_wide) : K_TAG_OF(attn_partials), c->n_head,
                                c->n_head_kv, c->dh, n_rows, c->pos0, nb, bps, c->n_pages, qs, c->dh, c->scale, hs, rg};
    const size_t pool = (size_t)c->n_pages * c->n_head_kv * K_ATTN_BLOCK * c->dh * 2;
    k_binding b[] = {K_BIND(attn_partials, status, status, 8), K_BIND(attn_partials, p, &p, sizeof p),
                     K_BIND(attn_partials, q, c->q, sizeof(float) * n_rows * qs),
                     K_BIND(attn_partials, kpool, c->kpool, pool), K_BIND(attn_partials, vpool, c->vpool, pool),
                     K_BIND(attn_partials, pages, c->pages, 4 * nb),
                     K_BIND(attn_partials, part, part, sizeof(float) * part_n)};
    const int id = wide ? K_ID_attn_partials_wide : K_ID_attn_partials;
    const uint32_t gx = c->n_head_kv * (wide ? 1 : hs), ng = (n_rows + rg - 1) / rg;
    if (expect_shape) {
        const uint32_t grid[3] = {gx, k_attn_n_splits(nb, bps), ng};
        emul_options opt = {schedule, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(id, grid, tg, b, 7, &opt, err, sizeof err);
        return rc == 0 && (status[0] & K_ERR_SHAPE);
    }
    return launch(id, gx, k_attn_n_splits(nb, bps), ng, tg, b, 7, schedule,
                  wide ? "attn_partials_wide" : "attn_partials");
}

/* attn_partials_wide against attn_partials: every partial (max, sum, acc)
 * bit for bit, for chunks of rows that cross block boundaries and the
 * diagonal, GQA factors 1..8 (row groups of 32 / G rows, a short last
 * group), head_dims from 32 to 256 (the constant-256 path), split counts
 * from one block a split to one split. */
static void attn_wide_checks(void) {
    const uint32_t shapes[][5] = {
        /* n_head_kv, G, head_dim, pos0, n_rows */
        {2, 4, 256, 0, 40},  /* the 0.8B shape's attention, a chunk from position 0 */
        {1, 8, 64, 250, 37}, /* G 8: 4 rows a group; the chunk crosses a block */
        {2, 6, 32, 700, 11}, /* G 6: 5 rows (30 vectors), one short group */
        {1, 1, 36, 255, 33}, /* G 1: 32 rows a group; 9 element quads a row */
        {3, 2, 128, 511, 20},
        {1, 3, 72, 5, 3},    /* fewer rows than a group */
        {1, 5, 256, 300, 7},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        attn_case c;
        c.n_head_kv = shapes[k][0];
        c.n_head = shapes[k][0] * shapes[k][1];
        c.dh = shapes[k][2];
        c.pos0 = shapes[k][3];
        c.n_rows = shapes[k][4];
        attn_case_pools(&c, c.n_rows, 1);
        for (uint32_t b = 0; b < c.n_blocks; b++) c.pages[b] = (c.n_blocks - b) % c.n_pages;
        const uint32_t qs = c.n_head * c.dh, G = shapes[k][1];
        c.q = malloc(sizeof(float) * c.n_rows * qs);
        for (uint32_t i = 0; i < c.n_rows * qs; i++) c.q[i] = frand(-2, 2) * (k == 1 ? 5.0f : 1.0f);
        const size_t part_n = (size_t)c.n_rows * c.n_head * c.n_blocks * (2 + c.dh);
        float *base = malloc(sizeof(float) * part_n), *o = malloc(sizeof(float) * part_n);
        int ok = run_attn_part(&c, c.n_rows, c.n_blocks, 0, 1, 1, 128, EMUL_FORWARD, base, part_n, 0) == 0;
        size_t diff = 0;
        int runs = 0;
        const uint32_t rg = K_ATTN_WIDE_QV / G; /* the kernel's bound (32; 16 in Metal's value's run) */
        for (uint32_t bps = 1; ok && bps <= c.n_blocks; bps++) {
            ok = run_attn_part(&c, c.n_rows, bps, 1, 1, rg, K_ATTN_WIDE_TG, bps & 1 ? EMUL_REVERSE : EMUL_FORWARD, o,
                               part_n, 0) == 0;
            for (size_t i = 0; ok && i < part_n; i++)
                if (memcmp(&o[i], &base[i], 4)) diff++;
            runs++;
        }
        /* fewer rows a group than fit: the same bits */
        if (ok && rg > 1) {
            ok = run_attn_part(&c, c.n_rows, c.n_blocks, 1, 1, rg - 1, K_ATTN_WIDE_TG, EMUL_REVERSE, o, part_n, 0) == 0;
            for (size_t i = 0; ok && i < part_n; i++)
                if (memcmp(&o[i], &base[i], 4)) diff++;
            runs++;
        }
        check(ok && diff == 0,
              "attn_partials_wide n_head=%u kv=%u G=%u head_dim=%u pos0=%u rows=%u (%u rows a group): every partial "
              "bit-identical to attn_partials (%d launches of %zu floats each, %zu floats differ)", c.n_head, c.n_head_kv, G, c.dh,
              c.pos0, c.n_rows, rg, runs, part_n, diff);
        free(c.kpool), free(c.vpool), free(c.pages), free(c.q), free(base), free(o);
    }
    /* what it refuses (the runner keeps attn_partials there) */
    {
        attn_case c = {4, 2, 32, 0, 4, 1, 1, NULL, NULL, NULL, NULL, 0.25f};
        const size_t pe = (size_t)c.n_pages * c.n_head_kv * K_ATTN_BLOCK * 36;
        c.kpool = calloc(pe, 2), c.vpool = calloc(pe, 2), c.pages = calloc(1, 4), c.q = calloc(4 * 4 * 36, 4);
        const size_t part_n = (size_t)4 * 4 * (2 + 36);
        float *o = malloc(sizeof(float) * part_n);
        const int hs2 = run_attn_part(&c, 4, 1, 1, 2, 2, K_ATTN_WIDE_TG, EMUL_FORWARD, o, part_n, 1);
        const int tg128 = run_attn_part(&c, 4, 1, 1, 1, 2, 128, EMUL_FORWARD, o, part_n, 1);
        const int over = run_attn_part(&c, 4, 1, 1, 1, K_ATTN_WIDE_QV / 2 + 1, K_ATTN_WIDE_TG, EMUL_FORWARD, o, part_n, 1);
        c.dh = 34; /* not a multiple of 4 */
        const int dh34 = run_attn_part(&c, 4, 1, 1, 1, 2, K_ATTN_WIDE_TG, EMUL_FORWARD, o, part_n, 1);
        check(hs2 && tg128 && over && dh34, "attn_partials_wide: a head split of 2, 128 threads, more than "
                                            "K_ATTN_WIDE_QV query vectors and head_dim 34 raise K_ERR_SHAPE");
        free(c.kpool), free(c.vpool), free(c.pages), free(c.q), free(o);
    }
}

static void suite_attn(void) {
    const uint32_t shapes[][4] = {
        /* n_head_kv, G, head_dim, pos0 */
        {1, 1, 32, 0},   {2, 3, 40, 5},  {1, 8, 64, 255}, {2, 4, 32, 256},
        {1, 5, 72, 300}, {2, 2, 64, 700}, {1, 6, 32, 520},
        {2, 4, 256, 254}, /* the real models' head_dim: the kernel's constant-256 path */
        {1, 2, 36, 40},   /* a head_dim that is no multiple of 8: tile rows split 16-byte chunks */
    };
    const uint32_t n_rows = 3;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        attn_case c;
        c.n_head_kv = shapes[k][0];
        c.n_head = shapes[k][0] * shapes[k][1];
        c.dh = shapes[k][2];
        c.pos0 = shapes[k][3];
        c.n_rows = n_rows;
        attn_case_pools(&c, n_rows, 2); /* a pool with spare pages, mapped out of order */
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
        /* every head split (each divisor of G), at threadgroups of 32 (head_dim
         * past the threadgroup: d strides), 128 and 256 threads (R rows of
         * threads sharing a head's elements), and at the plan's split count:
         * the same bits as one threadgroup serving the whole group */
        int hs_ok = 1, hs_n = 0;
        const uint32_t G = c.n_head / c.n_head_kv;
        for (uint32_t hs = 1; hs <= G; hs++) {
            if (G % hs) continue;
            const uint32_t tgs[] = {32, 128, 256};
            for (size_t ti = 0; ti < 3; ti++) {
                if (hs == 1 && tgs[ti] == 128) continue; /* the base run */
                const uint32_t bps = k_attn_blocks_per_split(c.n_blocks, c.n_head_kv, n_rows, 4);
                if (run_attn_hs(&c, c.pos0, n_rows, c.q, bps, hs, 1, tgs[ti], (hs + ti) & 1 ? EMUL_REVERSE : EMUL_FORWARD,
                                o, 0))
                    goto next;
                if (memcmp(o, base, sizeof(float) * n_rows * qs)) hs_ok = 0;
                hs_n++;
            }
        }
        /* query rows grouped per threadgroup (every K/V tile read once for
         * rg rows x G / hs heads; the group's rows see different lengths of
         * the last block): the same bits, at 64 and 256 threads */
        for (uint32_t rg = 2; rg <= n_rows; rg++)
            for (uint32_t hs = 1; hs <= G; hs++) {
                if (G % hs || (G / hs) * rg > K_ATTN_MAX_QV) continue;
                const uint32_t tg = (rg + hs) & 1 ? 64 : 256;
                const uint32_t bps = k_attn_blocks_per_split(c.n_blocks, c.n_head_kv, 1, 4);
                if (run_attn_hs(&c, c.pos0, n_rows, c.q, bps, hs, rg, tg, rg & 1 ? EMUL_REVERSE : EMUL_FORWARD, o, 0))
                    goto next;
                if (memcmp(o, base, sizeof(float) * n_rows * qs)) hs_ok = 0;
                hs_n++;
            }
        double worst = 0;
        for (uint32_t t = 0; t < n_rows; t++) {
            const double r = attn_check_row(&c, c.pos0 + t, c.q + t * qs, base + t * qs);
            if (!(r <= 1.0)) ok = 0;
            if (r > worst) worst = r;
        }
        check(ok && split_ok && rows_ok && hs_ok,
              "n_head=%u kv=%u G=%u head_dim=%u pos0=%u rows=%u blocks=%u: within the derived bound (worst "
              "%.3f of it)%s%s%s (%d head-split runs)", c.n_head, c.n_head_kv, c.n_head / c.n_head_kv, c.dh, c.pos0,
              n_rows, c.n_blocks, worst, split_ok ? ", bit-identical for split counts 1.." : ", SPLIT COUNTS DIFFER",
              rows_ok ? ", each row alone bit-identical" : ", A ROW ALONE DIFFERS",
              hs_ok ? ", every head split, row grouping and threadgroup size bit-identical" : ", HEAD SPLITS OR ROW GROUPS DIFFER", hs_n);
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
    /* the head split: a divisor of G, the smallest reaching the target, 1
     * once the splits alone reach it */
    int hsp_ok = 1;
    for (uint32_t G = 1; G <= 8; G++)
        for (uint32_t groups = 1; groups < 300; groups++) {
            const uint32_t hs = k_attn_head_split(G, groups, 128);
            if (hs < 1 || G % hs || (groups >= 128 && hs != 1) || (groups * hs < 128 && hs != G)) hsp_ok = 0;
            for (uint32_t h2 = 1; h2 < hs; h2++)
                if (G % h2 == 0 && groups * h2 >= 128) hsp_ok = 0; /* a smaller divisor would do */
        }
    check(hsp_ok, "head split plan: a divisor of G, the smallest reaching 128 threadgroups, 1 once splits reach it");
    /* a head split that does not divide G, or 0, is refused */
    {
        attn_case c = {6, 2, 32, 0, 1, 1, 1, NULL, NULL, NULL, NULL, 0.25f};
        const size_t pe = (size_t)c.n_pages * c.n_head_kv * K_ATTN_BLOCK * c.dh;
        c.kpool = calloc(pe, 2), c.vpool = calloc(pe, 2), c.pages = calloc(1, 4), c.q = calloc(6 * 32, 4);
        float *o = malloc(sizeof(float) * 6 * 32);
        const int r2 = run_attn_hs(&c, 0, 1, c.q, 1, 2, 1, 128, EMUL_FORWARD, o, 1);
        const int r0 = run_attn_hs(&c, 0, 1, c.q, 1, 0, 1, 128, EMUL_FORWARD, o, 1);
        const int g0 = run_attn_hs(&c, 0, 1, c.q, 1, 1, 0, 128, EMUL_FORWARD, o, 1);
        const int g3 = run_attn_hs(&c, 0, 1, c.q, 1, 1, K_ATTN_MAX_QV / 3 + 1, 128, EMUL_FORWARD, o, 1);
        check(r2 && r0 && g0 && g3, "attn_partials: a head split of 2 for G = 3, or 0, and group rows of 0 or "
                                    "past K_ATTN_MAX_QV query vectors raise K_ERR_SHAPE");
        free(c.kpool), free(c.vpool), free(c.pages), free(c.q), free(o);
    }
    attn_wide_checks();
}

/* ------------------------------------------------------------ kquant -- */
/* The test's own decoding of a K-quant super-block (from quants.h's block
 * structs, not the kernel's byte offsets): codes a[256], per-16 scales
 * sc[16], per-16 mins mn[16] (0 for Q6_K), d, dmin. */
static void kq_decode(int type, const uint8_t *blk, int *a, int *sc, int *mn, float *d, float *dmin) {
    if (type == DS4_TYPE_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)blk;
        for (int j = 0; j < 256; j++) {
            const int h = j / 128, q = (j % 128) / 32, l = j % 32;
            const uint8_t ql = b->ql[64 * h + l + (q & 1) * 32], qh = b->qh[32 * h + l];
            a[j] = (int)(((q < 2 ? ql & 15 : ql >> 4)) | (((qh >> (2 * q)) & 3) << 4)) - 32;
        }
        for (int s = 0; s < 16; s++) sc[s] = b->scales[s], mn[s] = 0;
        *d = ds4_fp16_to_f32(b->d), *dmin = 0;
        return;
    }
    const uint8_t *scales = type == DS4_TYPE_Q4_K ? ((const block_q4_K *)blk)->scales : ((const block_q5_K *)blk)->scales;
    const uint8_t *qs = type == DS4_TYPE_Q4_K ? ((const block_q4_K *)blk)->qs : ((const block_q5_K *)blk)->qs;
    for (int j = 0; j < 256; j++) {
        const int c = j / 64, hi = (j % 64) >= 32, l = j % 32;
        a[j] = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 15;
        if (type == DS4_TYPE_Q5_K && (((const block_q5_K *)blk)->qh[l] >> (2 * c + hi) & 1)) a[j] += 16;
    }
    for (int s = 0; s < 8; s++) { /* ggml get_scale_min_k4 */
        const int scv = s < 4 ? scales[s] & 63 : (scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4);
        const int mv = s < 4 ? scales[s + 4] & 63 : (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
        sc[2 * s] = sc[2 * s + 1] = scv, mn[2 * s] = mn[2 * s + 1] = mv;
    }
    *d = ds4_fp16_to_f32(((const uint16_t *)blk)[0]), *dmin = ds4_fp16_to_f32(((const uint16_t *)blk)[1]);
}

/* Sum over super-blocks of |d d_x| sum|sc a q8| + |dmin d_x| sum|bsums mn|:
 * at least the sum of the magnitudes of the float terms both sides add. */
static double kq_abs_terms(int type, const uint8_t *w, const uint8_t *x, uint32_t nb, size_t bs) {
    double s = 0;
    int a[256], sc[16], mn[16];
    float d, dmin;
    for (uint32_t ib = 0; ib < nb; ib++) {
        const block_q8_K *y = (const block_q8_K *)(x + ib * 292);
        kq_decode(type, w + ib * bs, a, sc, mn, &d, &dmin);
        double t = 0, tm = 0;
        for (int j = 0; j < 256; j++) t += fabs((double)sc[j / 16] * a[j] * y->qs[j]);
        for (int j = 0; j < 16; j++) tm += fabs((double)y->bsums[j] * mn[j]);
        s += fabs((double)d * y->d) * t + fabs((double)dmin * y->d) * tm;
    }
    return s;
}

static void suite_kquant(void) {
    /* quantize_q8_K: bit-identical to the CPU's quant_q8_K, with an
     * all-zero block and |max| ties (the first one must win) */
    const uint32_t qns[] = {256, 768};
    for (size_t in = 0; in < 2; in++) {
        const uint32_t n = qns[in], rows = 3, stride = n + 7, nb = n / 256;
        float *x = malloc(sizeof(float) * rows * stride);
        for (uint32_t i = 0; i < rows * stride; i++) x[i] = rnd() % 9 == 0 ? (float)(int)(rnd() % 61) - 30.0f : frand(-20, 20);
        for (uint32_t i = 256; i < 512 && i < n; i++) x[i] = 0.0f;           /* row 0 block 1: zeros */
        x[stride + 3] = -40.0f, x[stride + 77] = 40.0f;                       /* row 1 block 0: tie, - first */
        x[2 * stride + 9] = 35.0f, x[2 * stride + 200] = -35.0f;              /* row 2 block 0: tie, + first */
        uint8_t *q = malloc(rows * nb * 292), *ref = malloc(rows * nb * 292);
        memset(q, 0xAB, rows * nb * 292);
        k_quantize_q8_K_params p = {K_TAG_OF(quantize_q8_K), n, rows, stride};
        k_binding b[] = {K_BIND(quantize_q8_K, status, status, 8), K_BIND(quantize_q8_K, p, &p, sizeof p),
                         K_BIND(quantize_q8_K, x, x, sizeof(float) * rows * stride),
                         K_BIND(quantize_q8_K, q, q, rows * nb * 292)};
        if (!launch(K_ID_quantize_q8_K, (rows * nb + 1) / 2, 1, 1, 64, b, 4, (int)in & 1, "quantize_q8_K")) {
            for (uint32_t r = 0; r < rows; r++)
                scalar.from_float[DS4_TYPE_Q8_K](x + r * stride, ref + r * nb * 292, n);
            int bad = -1;
            for (uint32_t i = 0; i < rows * nb * 292 && bad < 0; i++)
                if (q[i] != ref[i]) bad = (int)i;
            if (bad >= 0) fprintf(stderr, "  first difference: block %d byte %d: got 0x%02x want 0x%02x\n",
                                  bad / 292, bad % 292, q[bad], ref[bad]);
            check(bad < 0, "quantize_q8_K n=%u rows=%u: blocks bit-identical to the CPU's (zero block, "
                  "|max| ties)", n, rows);
        }
        free(x), free(q), free(ref);
    }
    /* matvec_kq for each K-quant type */
    const int types[] = {DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K};
    const char *tnames[] = {"Q4_K", "Q5_K", "Q6_K"};
    const size_t tbytes[] = {sizeof(block_q4_K), sizeof(block_q5_K), sizeof(block_q6_K)};
    const uint32_t n_ins[] = {256, 1280, 2304};
    const uint32_t n_outs[] = {1, 7};
    for (int it = 0; it < 3; it++)
        for (size_t ii = 0; ii < 3; ii++)
            for (size_t io = 0; io < 2; io++) {
                const int type = types[it];
                const size_t bs = tbytes[it];
                const uint32_t n_in = n_ins[ii], n_out = n_outs[io], nb = n_in / 256, R = K_MATVEC_MAX_ROWS;
                uint8_t *w = malloc(n_out * nb * bs), *xq = malloc(R * nb * 292);
                for (size_t i = 0; i < n_out * nb * bs; i++) w[i] = (uint8_t)rnd();
                for (uint32_t blk = 0; blk < n_out * nb; blk++) { /* finite scales */
                    uint16_t *dd = (uint16_t *)(w + blk * bs + (type == DS4_TYPE_Q6_K ? 208 : 0));
                    dd[0] = ds4_f32_to_fp16(frand(0.001f, 0.03f));
                    if (type != DS4_TYPE_Q6_K) dd[1] = ds4_f32_to_fp16(frand(0.0f, 0.02f));
                }
                float *xf = malloc(sizeof(float) * R * n_in);
                for (uint32_t i = 0; i < R * n_in; i++) xf[i] = frand(-3, 3);
                for (uint32_t r = 0; r < R; r++)
                    scalar.from_float[DS4_TYPE_Q8_K](xf + r * n_in, xq + r * nb * 292, n_in);
                float *y1 = malloc(sizeof(float) * R * n_out), *yw = malloc(sizeof(float) * R * n_out);
                int ok = 1, inv = 1;
                double worst = 0;
                for (uint32_t width = 1; width <= R; width++) {
                    if (ii + io > 0 && width != 1 && width != 3 && width != 16) continue;
                    const uint32_t reps = width == 1 ? R : 1;
                    for (uint32_t rep = 0; rep < reps; rep++) {
                        float *y = width == 1 ? y1 + rep * n_out : yw;
                        fill_nan(y, width * n_out);
                        /* the width picks the variant (1, 2..4, 5..16): each
                         * must agree bit for bit with width 1 per row */
                        const int kid = K_MATVEC_KQ_KERNEL(width);
                        k_matvec_kq_params p = {K_TAG(kid), (uint32_t)type, n_in, n_out, width, n_out};
                        k_binding b[] = {K_BIND(matvec_kq, status, status, 8), K_BIND(matvec_kq, p, &p, sizeof p),
                                         K_BIND(matvec_kq, w, w, n_out * nb * bs),
                                         K_BIND(matvec_kq, xq, xq + (width == 1 ? rep * nb * 292 : 0), width * nb * 292),
                                         K_BIND(matvec_kq, y, y, sizeof(float) * width * n_out)};
                        /* threadgroups of 1..4 SIMD-groups by width and
                         * row: a row's bits must not depend on the size */
                        const uint32_t nsg = 1 + (width + rep) % 4;
                        if (launch(kid, K_MATVEC_KQ_GROUPS(width, n_out, nsg), 1, 1, 32 * nsg, b, 5, (int)(width & 1), "matvec_kq"))
                            goto next;
                    }
                    if (width == 1) {
                        /* Tolerance (docs/gpu.md "K-quant matvec"): both
                         * sides split the same exact value per super-block
                         * (d * S - dmin * M, S and M exact integers) into
                         * float terms whose magnitudes sum to at most
                         * sum|t| (all |products|, kq_abs_terms). The CPU's
                         * 8 terms d * lane_L (1 rounding each), 8 serial
                         * lane sums of depth nb, then 8 adds: within
                         * (nb + 9)u sum|t|. Ours: per lane d * share and
                         * dmin * mins (exact integers below 2^24, 1
                         * rounding each), per phase (super-blocks ib mod
                         * 4) 2 ceil(nb/4) terms added serially, then the
                         * octet butterfly (3 levels) and ((S0 + S1) + (S2 +
                         * S3)) (2): within (2 ceil(nb/4) + 6)u sum|t|. */
                        const double k = (nb + 9) + (2 * ((nb + 3) / 4) + 6);
                        for (uint32_t r = 0; r < R; r++)
                            for (uint32_t o = 0; o < n_out; o++) {
                                float ref;
                                scalar.vec_dot[type](n_in, &ref, w + o * nb * bs, xq + r * nb * 292);
                                const double tol = k * U * kq_abs_terms(type, w + o * nb * bs, xq + r * nb * 292, nb, bs) * 1.0000001 + 1e-37;
                                const double e = fabs((double)y1[r * n_out + o] - ref);
                                if (!(e <= tol)) ok = 0;
                                if (e / tol > worst) worst = e / tol;
                            }
                    } else if (memcmp(yw, y1, sizeof(float) * width * n_out)) {
                        inv = 0;
                    }
                }
                check(ok && inv, "matvec %s n_in=%u n_out=%u: within the reordering bound (worst %.2f of it); "
                      "verify widths bit-identical to width 1 per row", tnames[it], n_in, n_out, worst);
            next:
                free(w), free(xq), free(xf), free(y1), free(yw);
            }
    /* A grid one threadgroup short of n_out (each variant has its own rows
     * per SIMD-group): refused with K_ERR_SHAPE, not a silent hole in y. */
    for (uint32_t width = 1; width <= K_MATVEC_MAX_ROWS; width += width < 4 ? 3 : 12) {
        const uint32_t n_in = 256, n_out = 9, nsg = 1, bs = 144;
        uint8_t *w = calloc(n_out, bs), *xq = calloc(width, 292);
        float *y = calloc(width * n_out, sizeof(float));
        const int kid = K_MATVEC_KQ_KERNEL(width);
        k_matvec_kq_params p = {K_TAG(kid), K_TYPE_Q4_K, n_in, n_out, width, n_out};
        k_binding b[] = {K_BIND(matvec_kq, status, status, 8), K_BIND(matvec_kq, p, &p, sizeof p),
                         K_BIND(matvec_kq, w, w, n_out * bs), K_BIND(matvec_kq, xq, xq, width * 292),
                         K_BIND(matvec_kq, y, y, sizeof(float) * width * n_out)};
        const uint32_t grid[3] = {K_MATVEC_KQ_GROUPS(width, n_out, nsg) - 1, 1, 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(kid, grid, 32 * nsg, b, 5, &opt, err, sizeof err);
        check(rc == 0 && (status[0] & K_ERR_SHAPE), "matvec_kq width %u: a grid one threadgroup short of "
              "n_out=%u raises K_ERR_SHAPE", width, n_out);
        free(w), free(xq), free(y);
    }
}

/* --------------------------------------------------------------- gdn -- */
/* The conv step: the tap sum is the CPU's (csrc/forward/gdn.c conv_step)
 * operation for operation; SiLU's exp is the target's. */
static void suite_gdn_conv(void) {
    const uint32_t shapes[][2] = {{40, 4}, {97, 2}, {300, 4}, {64, 8}}; /* channels, taps */
    for (size_t k = 0; k < 4; k++) {
        const uint32_t nc = shapes[k][0], K = shapes[k][1];
        float *x = malloc(sizeof(float) * nc), *cw = malloc(sizeof(float) * nc * K);
        float *st = malloc(sizeof(float) * (K - 1) * nc), *st0 = malloc(sizeof(float) * (K - 1) * nc);
        float *out = malloc(sizeof(float) * nc), *ref = malloc(sizeof(float) * nc);
        for (uint32_t i = 0; i < nc; i++) x[i] = frand(-3, 3);
        for (uint32_t i = 0; i < nc * K; i++) cw[i] = frand(-1, 1);
        for (uint32_t i = 0; i < (K - 1) * nc; i++) st[i] = st0[i] = frand(-3, 3);
        fill_nan(out, nc);
        k_gdn_conv_params p = {K_TAG_OF(gdn_conv), nc, K};
        k_binding b[] = {K_BIND(gdn_conv, status, status, 8), K_BIND(gdn_conv, p, &p, sizeof p),
                         K_BIND(gdn_conv, x, x, sizeof(float) * nc), K_BIND(gdn_conv, cw, cw, sizeof(float) * nc * K),
                         K_BIND(gdn_conv, state, st, sizeof(float) * (K - 1) * nc),
                         K_BIND(gdn_conv, out, out, sizeof(float) * nc)};
        if (launch(K_ID_gdn_conv, (nc + 63) / 64, 1, 1, 64, b, 6, (int)k & 1, "gdn_conv")) goto next;
        double worst = 0;
        int shift_ok = 1;
        for (uint32_t ch = 0; ch < nc; ch++) {
            float acc = 0.0f;
            for (uint32_t kk = 0; kk < K; kk++) acc += cw[ch * K + kk] * (kk + 1 < K ? st0[kk * nc + ch] : x[ch]);
            ref[ch] = ds4_silu(acc);
            /* Tolerance: SiLU = a / (1 + exp(-a)); CUDA's expf is within
             * 2 ulp, glibc's within 1, Metal's precise::exp within 4 (MSL
             * spec): exp's relative difference <= 5u carries at most 1:1
             * into 1 + exp(-a) and the quotient, plus 2 roundings. */
            const double tol = 8 * U * fabs(ref[ch]) + 1e-37, e = fabs((double)out[ch] - ref[ch]);
            if (!(e <= tol)) worst = INFINITY;
            else if (e / tol > worst) worst = e / tol;
            for (uint32_t s = 0; s + 1 < K; s++) {
                const float want = s + 2 < K ? st0[(s + 1) * nc + ch] : x[ch];
                if (memcmp(&st[s * nc + ch], &want, 4)) shift_ok = 0;
            }
        }
        check(worst <= 1.0 && shift_ok, "conv channels=%u taps=%u: SiLU(tap sum) within 8u of the CPU's (worst "
              "%.2f of it), state shifted bit-exactly", nc, K, worst);
    next:
        free(x), free(cw), free(st), free(st0), free(out), free(ref);
    }
}

/* The CPU's fast-precision GDN step for one value head (csrc/forward/gdn.c
 * delta_heads, ds4_l2norm_ggml, ds4_rmsnorm, ds4_silu, ggml's softplus;
 * the dots are the scalar kernel set's, summed in double), and beside it
 * the same step in double with a first-order error bound carried along
 * (docs/gpu.md "GDN step"): returns the bound for each output and state
 * element; ref_o / ref_s get the CPU's values, ex_o / ex_s the double ones. */
typedef struct {
    uint32_t nk, nv, d;
    float eps;
    const float *cv, *z, *ab, *hp;
} gdn_case;

static void gdn_reference(const gdn_case *c, uint32_t j, const float *S0, float *ref_s, float *ref_o,
                          double *ex_s, double *ex_o, double *tol_s, double *tol_o) {
    const uint32_t d = c->d, kh = j % c->nk;
    float *q = malloc(sizeof(float) * d), *k = malloc(sizeof(float) * d);
    memcpy(q, c->cv + kh * d, sizeof(float) * d);
    memcpy(k, c->cv + (c->nk + kh) * d, sizeof(float) * d);
    ds4_l2norm_ggml(q, d, c->eps);
    ds4_l2norm_ggml(k, d, c->eps);
    const float *v = c->cv + (2 * c->nk + j) * d;
    const float beta = ds4_sigmoid(c->ab[j]);
    const float g = c->hp[j] * ds4_softplus_ggml(c->ab[c->nv + j] + c->hp[c->nv + j]);
    const float decay = expf(g);
    memcpy(ref_s, S0, sizeof(float) * d * d);
    float *o = malloc(sizeof(float) * d);
    for (uint32_t m = 0; m < d; m++) {
        float *Sm = ref_s + m * d, u = 0, s = 0;
        for (uint32_t i = 0; i < d; i++) Sm[i] *= decay;
        scalar.vec_dot_f32[DS4_TYPE_F32](d, &u, Sm, k);
        const float dm = (v[m] - u) * beta;
        for (uint32_t i = 0; i < d; i++) Sm[i] += k[i] * dm;
        scalar.vec_dot_f32[DS4_TYPE_F32](d, &s, Sm, q);
        o[m] = s * (1.0f / sqrtf((float)d));
    }
    memcpy(ref_o, o, sizeof(float) * d);
    ds4_rmsnorm(ref_o, c->hp + 2 * c->nv, ref_o, d, c->eps);
    for (uint32_t m = 0; m < d; m++) ref_o[m] *= ds4_silu(c->z[j * d + m]);

    /* The step in double, with first-order bounds. Relative errors (in
     * units of u) of the recurrence's inputs, on either side: normed q, k:
     * a sum of d squares (depth <= d, relative d u), mean, +eps, sqrt, 1/x
     * and two multiplies, the sum's part halved by the square root: d/2 + 8.
     * beta: exp (<= 5u between targets), 1 + e, 1/x: 8. decay = exp(g): an
     * absolute error of at most 2|g|u + 8u in g (softplus' exp, 1 + e, log
     * and the product with ssm_a) becomes that relative error of exp(g),
     * plus exp's own 5u: (13 + 2|g|) u. */
    double *qd = malloc(sizeof(double) * d), *kd = malloc(sizeof(double) * d);
    double sq = 0, sk = 0;
    for (uint32_t i = 0; i < d; i++) {
        sq += (double)c->cv[kh * d + i] * c->cv[kh * d + i];
        sk += (double)c->cv[(c->nk + kh) * d + i] * c->cv[(c->nk + kh) * d + i];
    }
    for (uint32_t i = 0; i < d; i++) {
        qd[i] = c->cv[kh * d + i] / sqrt(sq + c->eps);
        kd[i] = c->cv[(c->nk + kh) * d + i] / sqrt(sk + c->eps);
    }
    const double en = (d / 2.0 + 8) * U, eb = 8 * U;
    const double bd = 1 / (1 + exp(-(double)c->ab[j]));
    const double ad = (double)c->ab[c->nv + j] + c->hp[c->nv + j];
    const double gd = c->hp[j] * (ad > 20 ? ad : log1p(exp(ad)));
    const double dd = exp(gd), edec = (13 + 2 * fabs(gd)) * U;
    double *od = malloc(sizeof(double) * d), *eo = malloc(sizeof(double) * d);
    for (uint32_t m = 0; m < d; m++) {
        double u = 0, uabs = 0;
        double *Sx = ex_s + m * d, *Tx = tol_s + m * d;
        for (uint32_t i = 0; i < d; i++) {
            Sx[i] = S0[m * d + i] * dd;
            u += Sx[i] * kd[i];
            uabs += fabs(Sx[i] * kd[i]);
        }
        /* the dot: each term off by (edec + en + u) relative, the float sum
         * of depth d by d u sum|terms| */
        const double eu = uabs * (edec + en + (d + 2) * U);
        const double dm = (v[m] - u) * bd;
        const double edm = (eu + 2 * U * (fabs(v[m]) + fabs(u))) * bd + fabs(dm) * (eb + U);
        double o2 = 0, oabs = 0, eo2 = 0;
        for (uint32_t i = 0; i < d; i++) {
            const double s0 = Sx[i];
            Sx[i] = s0 + kd[i] * dm;
            Tx[i] = fabs(s0) * (edec + U) + fabs(kd[i]) * edm + fabs(kd[i] * dm) * (en + U) + 2 * U * fabs(Sx[i]);
            o2 += Sx[i] * qd[i];
            oabs += fabs(Sx[i] * qd[i]);
            eo2 += Tx[i] * fabs(qd[i]);
        }
        od[m] = o2 / sqrt((double)d);
        eo[m] = (eo2 + oabs * (en + (d + 3) * U)) / sqrt((double)d);
    }
    /* gated norm: y_m = o_m w_m silu(z_m) / r, r = sqrt(mean(o^2) + eps);
     * an error e_i in each o_i moves y_m by |w_m silu_m| (e_m + |o_m|
     * sum|o_i| e_i / (d r^2)) / r; the norm's own roundings (rmsnorm bound,
     * depth <= d) and SiLU (8u) add relatively. */
    double ss = 0, cross = 0;
    for (uint32_t m = 0; m < d; m++) ss += od[m] * od[m], cross += fabs(od[m]) * eo[m];
    const double r = sqrt(ss / d + c->eps);
    for (uint32_t m = 0; m < d; m++) {
        const double zm = c->z[j * d + m], sl = zm / (1 + exp(-zm)), wm = c->hp[2 * c->nv + m];
        ex_o[m] = od[m] * wm * sl / r;
        tol_o[m] = fabs(wm * sl) * (eo[m] + fabs(od[m]) * cross / (d * r * r)) / r +
                   fabs(ex_o[m]) * (d / 2.0 + 8 + 8 + 2) * U;
    }
    free(q), free(k), free(o), free(qd), free(kd), free(od), free(eo);
}

static void suite_gdn(void) {
    suite_gdn_conv();
    const uint32_t shapes[][4] = {{1, 1, 32, 32}, {2, 4, 64, 64}, {2, 3, 48, 32}, {1, 2, 128, 128}}; /* nk nv d tg */
    for (size_t sh = 0; sh < 4; sh++) {
        gdn_case c = {shapes[sh][0], shapes[sh][1], shapes[sh][2], 1e-6f, NULL, NULL, NULL, NULL};
        const uint32_t d = c.d, tg = shapes[sh][3], ncv = (2 * c.nk + c.nv) * d;
        float *cv = malloc(sizeof(float) * ncv), *z = malloc(sizeof(float) * c.nv * d);
        float *ab = malloc(sizeof(float) * 2 * c.nv), *hp = malloc(sizeof(float) * (2 * c.nv + d));
        for (uint32_t i = 0; i < ncv; i++) cv[i] = frand(-2, 2);
        for (uint32_t i = 0; i < c.nv * d; i++) z[i] = frand(-3, 3);
        for (uint32_t i = 0; i < 2 * c.nv; i++) ab[i] = frand(-3, 3);
        for (uint32_t i = 0; i < c.nv; i++) hp[i] = -expf(frand(-2, 1)), hp[c.nv + i] = frand(-1, 1);
        for (uint32_t i = 0; i < d; i++) hp[2 * c.nv + i] = frand(0.5f, 1.5f);
        c.cv = cv, c.z = z, c.ab = ab, c.hp = hp;
        const size_t ns = (size_t)c.nv * d * d;
        float *S = malloc(sizeof(float) * ns), *S0 = malloc(sizeof(float) * ns), *S1 = malloc(sizeof(float) * ns);
        float *o = malloc(sizeof(float) * c.nv * d), *o1 = malloc(sizeof(float) * c.nv * d);
        for (size_t i = 0; i < ns; i++) S[i] = S0[i] = frand(-0.5f, 0.5f);
        fill_nan(o, c.nv * d);
        k_gdn_delta_params p = {K_TAG_OF(gdn_delta), c.nk, c.nv, d, c.eps};
        k_binding b[] = {K_BIND(gdn_delta, status, status, 8), K_BIND(gdn_delta, p, &p, sizeof p),
                         K_BIND(gdn_delta, cv, cv, sizeof(float) * ncv),
                         K_BIND(gdn_delta, z, z, sizeof(float) * c.nv * d),
                         K_BIND(gdn_delta, ab, ab, sizeof(float) * 2 * c.nv),
                         K_BIND(gdn_delta, hp, hp, sizeof(float) * (2 * c.nv + d)),
                         K_BIND(gdn_delta, s, S, sizeof(float) * ns),
                         K_BIND(gdn_delta, o, o, sizeof(float) * c.nv * d)};
        if (launch(K_ID_gdn_delta, c.nv, 1, 1, tg, b, 8, (int)sh & 1, "gdn_delta")) goto next;
        /* the same step with another threadgroup size: the same bits (a
         * thread's rows are summed serially whatever the size) except the
         * norms' float sums, which depend on it; so compare per tg only */
        memcpy(S1, S0, sizeof(float) * ns);
        fill_nan(o1, c.nv * d);
        b[6] = K_BIND(gdn_delta, s, S1, sizeof(float) * ns);
        b[7] = K_BIND(gdn_delta, o, o1, sizeof(float) * c.nv * d);
        if (launch(K_ID_gdn_delta, c.nv, 1, 1, tg, b, 8, EMUL_REVERSE, "gdn_delta again")) goto next;
        const int repeat_ok = !memcmp(S, S1, sizeof(float) * ns) && !memcmp(o, o1, sizeof(float) * c.nv * d);
        double worst = 0, worst_cpu = 0;
        float *rs = malloc(sizeof(float) * d * d), *ro = malloc(sizeof(float) * d);
        double *es = malloc(sizeof(double) * d * d), *eo = malloc(sizeof(double) * d);
        double *ts = malloc(sizeof(double) * d * d), *to = malloc(sizeof(double) * d);
        for (uint32_t j = 0; j < c.nv; j++) {
            gdn_reference(&c, j, S0 + (size_t)j * d * d, rs, ro, es, eo, ts, to);
            for (uint32_t i = 0; i < d * d; i++) {
                const double t = ts[i] + 1e-30, e = fabs(S[(size_t)j * d * d + i] - es[i]), ec = fabs(rs[i] - es[i]);
                worst = e == e && e / t < worst ? worst : (e == e ? e / t : INFINITY);
                if (ec / t > worst_cpu) worst_cpu = ec / t;
            }
            for (uint32_t m = 0; m < d; m++) {
                const double t = to[m] + 1e-30, e = fabs(o[j * d + m] - eo[m]), ec = fabs(ro[m] - eo[m]);
                if (!(e == e) || e / t > worst) worst = e == e ? e / t : INFINITY;
                if (ec / t > worst_cpu) worst_cpu = ec / t;
            }
        }
        check(worst <= 1.0 && worst_cpu <= 1.0 && repeat_ok,
              "delta n_k=%u n_v=%u d=%u tg=%u: state and output within the first-order bound of the exact "
              "step (worst %.3f of it; the CPU's worst %.3f), a rerun bit-identical", c.nk, c.nv, d, tg,
              worst, worst_cpu);
        free(rs), free(ro), free(es), free(eo), free(ts), free(to);
    next:
        free(cv), free(z), free(ab), free(hp), free(S), free(S0), free(S1), free(o), free(o1);
    }
}

/* ------------------------------------------------------------ argmax -- */
static void suite_argmax(void) {
    const uint32_t ns[] = {1, 31, 1000, 151936 / 16};
    for (size_t in = 0; in < 4; in++) {
        const uint32_t n = ns[in], rows = 6, stride = n + 3, K = 5, W = 1 + K_TOPK_MAX;
        float *x = malloc(sizeof(float) * rows * stride);
        for (uint32_t i = 0; i < rows * stride; i++) x[i] = frand(-10, 10);
        /* row 1: ties at the maximum (the lowest index must win), and a
         * tie inside the top-k; row 2: all -inf; row 3: a NaN (refused);
         * row 4: few distinct values (integers) */
        if (n > 5) x[stride + n - 1] = 50.0f, x[stride + 2] = 50.0f, x[stride + n / 2] = 50.0f, x[stride + 4] = 40.0f, x[stride + 1] = 40.0f;
        for (uint32_t i = 0; i < n; i++) x[2 * stride + i] = -INFINITY;
        x[3 * stride + n / 2] = NAN;
        for (uint32_t i = 0; i < n; i++) x[4 * stride + i] = (float)(rnd() % 4);
        uint32_t *idx = malloc(4 * rows * W);
        memset(idx, 0x5A, 4 * rows * W);
        k_argmax_rows_params p = {K_TAG_OF(argmax_rows), n, rows, stride, K};
        k_binding b[] = {K_BIND(argmax_rows, status, status, 8), K_BIND(argmax_rows, p, &p, sizeof p),
                         K_BIND(argmax_rows, x, x, sizeof(float) * rows * stride),
                         K_BIND(argmax_rows, idx, idx, 4 * rows * W)};
        if (launch(K_ID_argmax_rows, rows, 1, 1, in == 3 ? 256 : 64, b, 4, (int)in & 1, "argmax_rows")) {
            free(x), free(idx);
            continue;
        }
        int ok = 1;
        for (uint32_t r = 0; r < rows; r++) {
            const float *xr = x + r * stride;
            /* the CPU's rule (csrc/spec_round.c argmax_row): strict > scan, NaN refused */
            int has_nan = 0;
            uint32_t best = 0;
            for (uint32_t i = 0; i < n; i++) has_nan |= xr[i] != xr[i];
            for (uint32_t i = 1; i < n; i++) if (xr[i] > xr[best]) best = i;
            if (has_nan) {
                for (uint32_t s = 0; s <= K; s++) ok &= idx[r * W + s] == K_ARGMAX_NAN;
                continue;
            }
            ok &= idx[r * W] == best;
            /* top-k: selection by (value desc, index asc), K passes */
            uint32_t prev = UINT32_MAX;
            for (uint32_t s = 0; s < K; s++) {
                uint32_t bi = UINT32_MAX;
                for (uint32_t i = 0; i < n; i++) {
                    if (prev != UINT32_MAX && !(xr[i] < xr[prev] || (xr[i] == xr[prev] && i > prev))) continue;
                    if (bi == UINT32_MAX || xr[i] > xr[bi]) bi = i;
                }
                const uint32_t want = bi == UINT32_MAX ? K_ARGMAX_NONE : bi;
                if (idx[r * W + 1 + s] != want) ok = 0;
                if (bi != UINT32_MAX) prev = bi;
                else break;
            }
        }
        check(ok, "n=%u rows=%u k=%u: argmax = the CPU's (ties to the lowest index, all -inf -> 0, NaN "
              "refused), top-k in (value desc, index asc) order", n, rows, K);
        free(x), free(idx);
    }
}

/* ------------------------------------------------------------ gdnseq -- */
/* gdn_seq (n tokens in one launch) against n launches of gdn_conv +
 * gdn_delta at the same threadgroup size, bit for bit: every token's
 * output row, the final recurrent state and the final conv state. The
 * shapes cover the register-resident state (d 128 at 256 threads: 16
 * rows per SIMD-group), rows past the register tile (d 128 at 128
 * threads), no register rows at all (d 160 > 32 K_GDN_SEQ_COLS), d not a
 * multiple of 32, GQA ratios 1..3, conv taps 2..4, n = 1 and odd n. */
static void suite_gdnseq(void) {
    /* n_k n_v d taps tg n_tok */
    const uint32_t shapes[][6] = {{1, 1, 32, 4, 32, 1},  {2, 4, 64, 4, 64, 5},   {2, 3, 48, 3, 64, 7},
                                  {1, 2, 128, 4, 128, 3}, {1, 3, 128, 4, 256, 4}, {1, 1, 160, 2, 64, 3},
                                  {2, 2, 32, 4, 32, 9},   {2, 2, 128, 4, 256, 2}}; /* last: the 0.8B's 1:1, d 128 */
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const uint32_t nk = shapes[sh][0], nv = shapes[sh][1], d = shapes[sh][2], K = shapes[sh][3];
        const uint32_t tg = shapes[sh][4], n = shapes[sh][5];
        const uint32_t cd = (2 * nk + nv) * d, vd = nv * d, gap = 3;
        const uint32_t z_off = cd + 1, ab_off = z_off + vd + 2, W = ab_off + 2 * nv + gap, os = vd + 5;
        const size_t ns = (size_t)nv * d * d, ncs = (size_t)(K - 1) * cd;
        float *in = malloc(sizeof(float) * n * W), *cw = malloc(sizeof(float) * cd * K);
        float *hp = malloc(sizeof(float) * (2 * nv + d)), *cs0 = malloc(sizeof(float) * ncs);
        float *S0 = malloc(sizeof(float) * ns), *S1 = malloc(sizeof(float) * ns), *S2 = malloc(sizeof(float) * ns);
        float *cs1 = malloc(sizeof(float) * ncs), *cs2 = malloc(sizeof(float) * 2 * ncs);
        float *o1 = malloc(sizeof(float) * n * os), *o2 = malloc(sizeof(float) * n * os);
        float *cv = malloc(sizeof(float) * cd);
        for (uint32_t i = 0; i < n * W; i++) in[i] = frand(-2, 2);
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t i = 0; i < 2 * nv; i++) in[t * W + ab_off + i] = frand(-3, 3);
        for (uint32_t i = 0; i < cd * K; i++) cw[i] = frand(-1, 1);
        for (uint32_t i = 0; i < nv; i++) hp[i] = -expf(frand(-2, 1)), hp[nv + i] = frand(-1, 1);
        for (uint32_t i = 0; i < d; i++) hp[2 * nv + i] = frand(0.5f, 1.5f);
        /* gdn_seq's conv state: half `cur` (alternating by shape) holds
         * the state, the other half is NaN until the kernel writes it */
        const uint32_t cur = (uint32_t)sh & 1;
        fill_nan(cs2, 2 * ncs);
        for (size_t i = 0; i < ncs; i++) cs0[i] = cs1[i] = cs2[cur * ncs + i] = frand(-2, 2);
        for (size_t i = 0; i < ns; i++) S0[i] = S1[i] = S2[i] = frand(-0.5f, 0.5f);
        /* o rows: gaps between rows stay NaN in both (nobody writes them) */
        fill_nan(o1, n * os), fill_nan(o2, n * os);
        int ok = 1;
        /* the reference: n single-token launches */
        for (uint32_t t = 0; t < n && ok; t++) {
            k_gdn_conv_params pc = {K_TAG_OF(gdn_conv), cd, K};
            k_binding bc[] = {K_BIND(gdn_conv, status, status, 8), K_BIND(gdn_conv, p, &pc, sizeof pc),
                              K_BIND(gdn_conv, x, in + t * W, sizeof(float) * cd),
                              K_BIND(gdn_conv, cw, cw, sizeof(float) * cd * K),
                              K_BIND(gdn_conv, state, cs1, sizeof(float) * ncs),
                              K_BIND(gdn_conv, out, cv, sizeof(float) * cd)};
            k_gdn_delta_params pd = {K_TAG_OF(gdn_delta), nk, nv, d, 1e-6f};
            k_binding bd[] = {K_BIND(gdn_delta, status, status, 8), K_BIND(gdn_delta, p, &pd, sizeof pd),
                              K_BIND(gdn_delta, cv, cv, sizeof(float) * cd),
                              K_BIND(gdn_delta, z, in + t * W + z_off, sizeof(float) * vd),
                              K_BIND(gdn_delta, ab, in + t * W + ab_off, sizeof(float) * 2 * nv),
                              K_BIND(gdn_delta, hp, hp, sizeof(float) * (2 * nv + d)),
                              K_BIND(gdn_delta, s, S1, sizeof(float) * ns),
                              K_BIND(gdn_delta, o, o1 + t * os, sizeof(float) * vd)};
            ok = !launch(K_ID_gdn_conv, (cd + 63) / 64, 1, 1, 64, bc, 6, 0, "gdn_conv") &&
                 !launch(K_ID_gdn_delta, nv, 1, 1, tg, bd, 8, 0, "gdn_delta");
        }
        if (!ok) goto next;
        /* split 1 (one threadgroup per head, the gated norm inline), then
         * each split G dividing d up to 4 (G threadgroups per head over
         * d/G state rows each, then gdn_norm over the raw rows): all the
         * bits of the single-token launches, from the same starting state */
        for (uint32_t G = 1; G <= 4; G *= 2) {
        if (d % G) continue;
        fill_nan(cs2, 2 * ncs);
        for (size_t i = 0; i < ncs; i++) cs2[cur * ncs + i] = cs0[i];
        memcpy(S2, S0, sizeof(float) * ns);
        fill_nan(o2, n * os);
        k_gdn_seq_params p = {K_TAG_OF(gdn_seq), nk, nv, d, K, n, W, z_off, ab_off, os, cur, 1e-6f, G};
        k_binding b[] = {K_BIND(gdn_seq, status, status, 8), K_BIND(gdn_seq, p, &p, sizeof p),
                         K_BIND(gdn_seq, in, in, sizeof(float) * n * W),
                         K_BIND(gdn_seq, cw, cw, sizeof(float) * cd * K),
                         K_BIND(gdn_seq, conv, cs2, sizeof(float) * 2 * ncs),
                         K_BIND(gdn_seq, hp, hp, sizeof(float) * (2 * nv + d)),
                         K_BIND(gdn_seq, s, S2, sizeof(float) * ns),
                         K_BIND(gdn_seq, o, o2, sizeof(float) * n * os)};
        if (launch(K_ID_gdn_seq, nv * G, 1, 1, tg, b, 8, (int)(sh + G) & 1, "gdn_seq")) goto next;
        if (G > 1) {
            k_gdn_norm_params pn = {K_TAG_OF(gdn_norm), nv, d, n, W, z_off, os, 1e-6f, 0u};
            k_binding bn[] = {K_BIND(gdn_norm, status, status, 8), K_BIND(gdn_norm, p, &pn, sizeof pn),
                              K_BIND(gdn_norm, in, in, sizeof(float) * n * W),
                              K_BIND(gdn_norm, hp, hp, sizeof(float) * (2 * nv + d)),
                              K_BIND(gdn_norm, o, o2, sizeof(float) * n * os)};
            if (launch(K_ID_gdn_norm, nv, n, 1, tg, bn, 5, (int)G & 1, "gdn_norm")) goto next;
        }
        const int same_o = !memcmp(o1, o2, sizeof(float) * n * os), same_s = !memcmp(S1, S2, sizeof(float) * ns);
        const int same_c = !memcmp(cs1, cs2 + (1 - cur) * ncs, sizeof(float) * ncs) &&
                           !memcmp(cs0, cs2 + cur * ncs, sizeof(float) * ncs), moved = memcmp(S0, S2, sizeof(float) * ns) != 0;
        check(same_o && same_s && same_c && moved,
              "n_k=%u n_v=%u d=%u taps=%u tg=%u tokens=%u split=%u: gdn_seq%s bit-identical to %u gdn_conv + "
              "gdn_delta launches (outputs %s, state %s, conv state %s)", nk, nv, d, K, tg, n, G,
              G > 1 ? " + gdn_norm" : " (one launch)", n,
              same_o ? "same" : "DIFFER", same_s ? "same" : "DIFFER", same_c ? "same" : "DIFFER");
        }
        /* the two-launch form (gdn_prep over every token, then gdn_rows,
         * then gdn_norm), where d fits gdn_rows' register rows */
        if ((d + 31) / 32 <= K_GDN_SEQ_COLS) {
            fill_nan(cs2, 2 * ncs);
            for (size_t i = 0; i < ncs; i++) cs2[cur * ncs + i] = cs0[i];
            memcpy(S2, S0, sizeof(float) * ns);
            fill_nan(o2, n * os);
            const size_t npq = (size_t)n * K_GDN_PQ_STRIDE(nk, nv, d);
            float *pq = malloc(sizeof(float) * npq);
            fill_nan(pq, npq);
            k_gdn_prep_params pp = {K_TAG_OF(gdn_prep), nk, nv, d, K, n, W, z_off, ab_off, os, cur, 1e-6f, 0};
            k_binding bp[] = {K_BIND(gdn_prep, status, status, 8), K_BIND(gdn_prep, p, &pp, sizeof pp),
                              K_BIND(gdn_prep, in, in, sizeof(float) * n * W),
                              K_BIND(gdn_prep, cw, cw, sizeof(float) * cd * K),
                              K_BIND(gdn_prep, conv, cs2, sizeof(float) * 2 * ncs),
                              K_BIND(gdn_prep, hp, hp, sizeof(float) * (2 * nv + d)),
                              K_BIND(gdn_prep, pq, pq, sizeof(float) * npq)};
            k_gdn_norm_params pn = {K_TAG_OF(gdn_norm), nv, d, n, W, z_off, os, 1e-6f, 0u};
            k_binding bn[] = {K_BIND(gdn_norm, status, status, 8), K_BIND(gdn_norm, p, &pn, sizeof pn),
                              K_BIND(gdn_norm, in, in, sizeof(float) * n * W),
                              K_BIND(gdn_norm, hp, hp, sizeof(float) * (2 * nv + d)),
                              K_BIND(gdn_norm, o, o2, sizeof(float) * n * os)};
            int okp = !launch(K_ID_gdn_prep, nk + nv, n, 1, tg, bp, 7, (int)sh & 1, "gdn_prep");
            float *pq0 = malloc(sizeof(float) * npq);
            memcpy(pq0, pq, sizeof(float) * npq);
            /* gdn_rows at every rows-per-SIMD-group (1..K_GDN_ROWS_MAX: 3
             * leaves a head's last SIMD-group short when 3 does not divide
             * d), at threadgroups of 1 and 3 SIMD-groups (the last
             * threadgroup partly idle): the bits depend on neither */
            for (uint32_t R = 1; R <= K_GDN_ROWS_MAX && okp; R++) {
                memcpy(S2, S0, sizeof(float) * ns);
                fill_nan(o2, n * os);
                memcpy(pq, pq0, sizeof(float) * npq);
                k_gdn_rows_params pr = {K_TAG_OF(gdn_rows), nk, nv, d, n, os, R};
                k_binding br[] = {K_BIND(gdn_rows, status, status, 8), K_BIND(gdn_rows, p, &pr, sizeof pr),
                                  K_BIND(gdn_rows, pq, pq, sizeof(float) * npq),
                                  K_BIND(gdn_rows, s, S2, sizeof(float) * ns),
                                  K_BIND(gdn_rows, o, o2, sizeof(float) * n * os)};
                const uint32_t rtg = ((sh + R) & 1) ? 96 : 32, rwarps = K_GDN_ROWS_WARPS(nv, d, R);
                okp = !launch(K_ID_gdn_rows, (rwarps + rtg / 32 - 1) / (rtg / 32), 1, 1, rtg, br, 5, (int)R & 1, "gdn_rows") &&
                      !launch(K_ID_gdn_norm, nv, n, 1, tg, bn, 5, 1, "gdn_norm");
                if (!okp) break;
                const int same_o = !memcmp(o1, o2, sizeof(float) * n * os), same_s = !memcmp(S1, S2, sizeof(float) * ns);
                const int same_c = !memcmp(cs1, cs2 + (1 - cur) * ncs, sizeof(float) * ncs) &&
                                   !memcmp(cs0, cs2 + cur * ncs, sizeof(float) * ncs);
                check(same_o && same_s && same_c,
                      "n_k=%u n_v=%u d=%u taps=%u tg=%u tokens=%u: gdn_prep + gdn_rows (%u rows a SIMD-group, %u "
                      "threads) + gdn_norm bit-identical to %u gdn_conv + gdn_delta launches (outputs %s, state %s, "
                      "conv state %s)", nk, nv, d, K, tg, n, R, rtg, n, same_o ? "same" : "DIFFER",
                      same_s ? "same" : "DIFFER", same_c ? "same" : "DIFFER");
            }
            free(pq0);
            free(pq);
        }
    next:
        free(in), free(cw), free(hp), free(cs0), free(cs1), free(cs2), free(S0), free(S1), free(S2);
        free(o1), free(o2), free(cv);
    }
    /* preconditions refused loudly: n_v < n_k (some k head's conv state
     * would have no writer) and a threadgroup above the register cap */
    const uint32_t bad[][3] = {{2, 1, 32}, {1, 1, K_GDN_SEQ_MAX_TG + 32}}; /* n_k n_v tg */
    for (size_t k = 0; k < 2; k++) {
        const uint32_t nk = bad[k][0], nv = bad[k][1], d = 32, cd = (2 * nk + nv) * d, W = cd + nv * d + 2 * nv;
        float *in = calloc(W, 4), *cw = calloc(cd * 4, 4), *c0 = calloc(cd * 6, 4);
        float *hp = calloc(2 * nv + d, 4), *S = calloc(nv * d * d, 4), *o = calloc(nv * d, 4);
        k_gdn_seq_params p = {K_TAG_OF(gdn_seq), nk, nv, d, 4, 1, W, cd, cd + nv * d, nv * d, 0, 1e-6f, 1};
        k_binding b[] = {K_BIND(gdn_seq, status, status, 8), K_BIND(gdn_seq, p, &p, sizeof p),
                         K_BIND(gdn_seq, in, in, 4 * W), K_BIND(gdn_seq, cw, cw, 4 * cd * 4),
                         K_BIND(gdn_seq, conv, c0, 4 * cd * 6),
                         K_BIND(gdn_seq, hp, hp, 4 * (2 * nv + d)), K_BIND(gdn_seq, s, S, 4 * nv * d * d),
                         K_BIND(gdn_seq, o, o, 4 * nv * d)};
        const uint32_t grid[3] = {nv, 1, 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_gdn_seq, grid, bad[k][2], b, 8, &opt, err, sizeof err);
        check((rc == 0 && (status[0] & K_ERR_SHAPE)) || REFUSED_AT_LAUNCH(rc, bad[k][2], K_GDN_SEQ_MAX_TG),
              "n_k=%u n_v=%u tg=%u: refused with K_ERR_SHAPE", nk, nv, bad[k][2]);
        free(in), free(cw), free(c0), free(hp), free(S), free(o);
    }
    /* gdn_rows: a row count outside 1..K_GDN_ROWS_MAX, or a grid one
     * SIMD-group short, raise K_ERR_SHAPE (no row is left unrun silently) */
    {
        const uint32_t nk = 1, nv = 2, d = 32, n = 2, qs = K_GDN_PQ_STRIDE(nk, nv, d);
        float *pq = calloc((size_t)n * qs, 4), *S = calloc(nv * d * d, 4), *o = calloc(n * nv * d, 4);
        const uint32_t cases[][2] = {{0, 64}, {K_GDN_ROWS_MAX + 1, 64}, {1, K_GDN_ROWS_WARPS(nv, d, 1) - 1}}; /* rows, SIMD-groups */
        for (size_t k = 0; k < 3; k++) {
            k_gdn_rows_params p = {K_TAG_OF(gdn_rows), nk, nv, d, n, nv * d, cases[k][0]};
            k_binding b[] = {K_BIND(gdn_rows, status, status, 8), K_BIND(gdn_rows, p, &p, sizeof p),
                             K_BIND(gdn_rows, pq, pq, 4 * (size_t)n * qs), K_BIND(gdn_rows, s, S, 4 * nv * d * d),
                             K_BIND(gdn_rows, o, o, 4 * n * nv * d)};
            const uint32_t grid[3] = {cases[k][1], 1, 1};
            emul_options opt = {0, 0};
            char err[600];
            status[0] = status[1] = 0;
            const int rc = emul_launch(K_ID_gdn_rows, grid, 32, b, 5, &opt, err, sizeof err);
            check(rc == 0 && (status[0] & K_ERR_SHAPE), "gdn_rows rows=%u SIMD-groups=%u (%u needed at 1 row): "
                  "refused with K_ERR_SHAPE", cases[k][0], cases[k][1], K_GDN_ROWS_WARPS(nv, d, 1));
        }
        free(pq), free(S), free(o);
    }
}

/* suite moe: the routed-MoE kernels (gpu/kernels/moe.h) */
#include "test_gpu_moe.h"

/* -------------------------------------------------------------- gemm -- */
/* The prefill GEMM against the width-1 matvec, bit for bit, every row of
 * every shape: Q8_0 (n_in 32..2080: a round of 32 blocks partly or wholly
 * past the row's end, and 1..3 rounds) and Q4_K/Q5_K/Q6_K (1, 5, 9
 * super-blocks: the same), weight rows not a multiple of the tile (1, 5,
 * 17, 23, 37), activation rows 1..37 (tails of the row tile), the output
 * with a row gap (y_stride > n_out; the gap must stay unwritten). The
 * matvec itself is checked against the CPU (suites matvec, kquant). */
static void gemm_case(int type, uint32_t n_in, uint32_t n_out, uint32_t n_rows, int schedule) {
    const int q8 = type == DS4_TYPE_Q8_0;
    const uint32_t bk = q8 ? 32 : 256, nb = n_in / bk, ys = n_out + 3;
    const size_t bs = q8 ? 34 : type == DS4_TYPE_Q4_K ? 144 : type == DS4_TYPE_Q5_K ? 176 : 210, xbs = q8 ? 34 : 292;
    const char *tn = q8 ? "Q8_0" : type == DS4_TYPE_Q4_K ? "Q4_K" : type == DS4_TYPE_Q5_K ? "Q5_K" : "Q6_K";
    uint8_t *w = malloc(n_out * nb * bs), *xq = malloc(n_rows * nb * xbs);
    float *xf = malloc(sizeof(float) * n_rows * n_in);
    for (uint32_t i = 0; i < n_rows * n_in; i++) xf[i] = frand(-3, 3);
    if (q8) {
        float *wf = malloc(sizeof(float) * n_out * n_in);
        for (uint32_t i = 0; i < n_out * n_in; i++) wf[i] = frand(-1, 1);
        quantize_rows(wf, w, n_out, n_in);
        q8_rows_to_device_inplace(w, n_out, n_in); /* matvec and GEMM read the device layout */
        quantize_rows(xf, xq, n_rows, n_in);
        free(wf);
    } else {
        for (size_t i = 0; i < n_out * nb * bs; i++) w[i] = (uint8_t)rnd();
        for (uint32_t blk = 0; blk < n_out * nb; blk++) { /* finite scales */
            uint16_t *dd = (uint16_t *)(w + blk * bs + (type == DS4_TYPE_Q6_K ? 208 : 0));
            dd[0] = ds4_f32_to_fp16(frand(0.001f, 0.03f));
            if (type != DS4_TYPE_Q6_K) dd[1] = ds4_f32_to_fp16(frand(0.0f, 0.02f));
        }
        for (uint32_t r = 0; r < n_rows; r++)
            scalar.from_float[DS4_TYPE_Q8_K](xf + r * n_in, xq + r * nb * 292, n_in);
    }
    const size_t ny = (size_t)(n_rows - 1) * ys + n_out;
    float *y1 = malloc(sizeof(float) * ny), *yg = malloc(sizeof(float) * ny);
    fill_nan(y1, ny), fill_nan(yg, ny);
    int ok = 1;
    for (uint32_t r = 0; r < n_rows && ok; r++) { /* the reference: one width-1 matvec per row */
        if (q8) {
            k_matvec_q8_0_params p = {K_TAG_OF(matvec_q8_0), n_in, n_out, 1, ys};
            k_binding b[] = {K_BIND(matvec_q8_0, status, status, 8), K_BIND(matvec_q8_0, p, &p, sizeof p),
                             K_BIND(matvec_q8_0, w, w, n_out * nb * bs),
                             K_BIND(matvec_q8_0, xq, x_row_alone(xq + r * nb * xbs, nb * xbs), nb * xbs),
                             K_BIND(matvec_q8_0, y, y1 + r * ys, sizeof(float) * n_out)};
            ok = !launch(K_ID_matvec_q8_0, K_MATVEC_GROUPS(n_out, 4), 1, 1, 128, b, 5, 0, "matvec_q8_0");
        } else {
            k_matvec_kq_params p = {K_TAG_OF(matvec_kq1), (uint32_t)type, n_in, n_out, 1, ys};
            k_binding b[] = {K_BIND(matvec_kq, status, status, 8), K_BIND(matvec_kq, p, &p, sizeof p),
                             K_BIND(matvec_kq, w, w, n_out * nb * bs),
                             K_BIND(matvec_kq, xq, xq + r * nb * xbs, nb * xbs),
                             K_BIND(matvec_kq, y, y1 + r * ys, sizeof(float) * n_out)};
            ok = !launch(K_ID_matvec_kq1, K_MATVEC_KQ_GROUPS(1, n_out, 4), 1, 1, 128, b, 5, 0, "matvec_kq1");
        }
    }
    if (ok) {
        const uint32_t gx = K_GEMM_GROUPS_X(n_rows), gy = K_GEMM_GROUPS_Y(n_out);
        if (q8) {
            k_gemm_q8_0_params p = {K_TAG_OF(gemm_q8_0), n_in, n_out, n_rows, ys};
            k_binding b[] = {K_BIND(gemm_q8_0, status, status, 8), K_BIND(gemm_q8_0, p, &p, sizeof p),
                             K_BIND(gemm_q8_0, w, w, n_out * nb * bs), K_BIND(gemm_q8_0, xq, xq, n_rows * nb * xbs),
                             K_BIND(gemm_q8_0, y, yg, sizeof(float) * ny)};
            ok = !launch(K_ID_gemm_q8_0, gx, gy, 1, K_GEMM_TG, b, 5, schedule, "gemm_q8_0");
        } else {
            k_gemm_kq_params p = {K_TAG_OF(gemm_kq), (uint32_t)type, n_in, n_out, n_rows, ys};
            k_binding b[] = {K_BIND(gemm_kq, status, status, 8), K_BIND(gemm_kq, p, &p, sizeof p),
                             K_BIND(gemm_kq, w, w, n_out * nb * bs), K_BIND(gemm_kq, xq, xq, n_rows * nb * xbs),
                             K_BIND(gemm_kq, y, yg, sizeof(float) * ny)};
            ok = !launch(K_ID_gemm_kq, gx, gy, 1, K_GEMM_TG, b, 5, schedule, "gemm_kq");
        }
        if (ok) {
            size_t bad = ny;
            for (size_t i = 0; i < ny && bad == ny; i++)
                if (memcmp(&y1[i], &yg[i], 4)) bad = i;
            if (bad < ny)
                fprintf(stderr, "  first difference: row %zu out %zu: gemm %.9g matvec %.9g\n", bad / ys, bad % ys,
                        yg[bad], y1[bad]);
            check(bad == ny, "%s n_in=%u n_out=%u rows=%u: every value bit-identical to the width-1 matvec, the "
                  "row gaps unwritten", tn, n_in, n_out, n_rows);
        }
    }
    free(w), free(xq), free(xf), free(y1), free(yg);
}

static void suite_gemm(void) {
    const uint32_t q8_ins[] = {32, 96, 1056, 2080, 1280}; /* 1280: 16-aligned rows (16-byte weight loads) */
    const uint32_t shapes[][2] = {{5, 17}, {17, 5}, {23, 37}, {1, 1}}; /* n_out, rows */
    for (size_t ii = 0; ii < 5; ii++)
        for (size_t s = 0; s < 4; s++) {
            if (ii >= 2 && s == 2) continue; /* the widest shape on the short rows only (emulator time) */
            gemm_case(DS4_TYPE_Q8_0, q8_ins[ii], shapes[s][0], shapes[s][1], (int)(ii + s) & 1);
        }
    const int types[] = {DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K};
    const uint32_t kq_ins[] = {256, 1280, 2304};
    for (int it = 0; it < 3; it++)
        for (size_t ii = 0; ii < 3; ii++)
            for (size_t s = 0; s < 4; s++) {
                if (ii >= 1 && s == 2) continue;
                gemm_case(types[it], kq_ins[ii], shapes[s][0], shapes[s][1], (int)(it + ii + s) & 1);
            }
    /* a grid one threadgroup short (either dimension) and a wrong
     * threadgroup size raise K_ERR_SHAPE */
    const uint32_t n_in = 256, n_out = 37, rows = 20, nb = 1;
    uint8_t *w = calloc(n_out * nb, 144), *xq = calloc(rows * nb, 292);
    float *y = malloc(sizeof(float) * rows * n_out);
    const uint32_t cases[][3] = {{K_GEMM_GROUPS_X(rows) - 1, K_GEMM_GROUPS_Y(n_out), K_GEMM_TG},
                                 {K_GEMM_GROUPS_X(rows), K_GEMM_GROUPS_Y(n_out) - 1, K_GEMM_TG},
                                 {K_GEMM_GROUPS_X(rows), K_GEMM_GROUPS_Y(n_out), K_GEMM_TG + 32}};
    for (int k = 0; k < 3; k++) {
        k_gemm_kq_params p = {K_TAG_OF(gemm_kq), K_TYPE_Q4_K, n_in, n_out, rows, n_out};
        k_binding b[] = {K_BIND(gemm_kq, status, status, 8), K_BIND(gemm_kq, p, &p, sizeof p),
                         K_BIND(gemm_kq, w, w, n_out * nb * 144), K_BIND(gemm_kq, xq, xq, rows * nb * 292),
                         K_BIND(gemm_kq, y, y, sizeof(float) * rows * n_out)};
        const uint32_t grid[3] = {cases[k][0], cases[k][1], 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_gemm_kq, grid, cases[k][2], b, 5, &opt, err, sizeof err);
        check((rc == 0 && (status[0] & K_ERR_SHAPE)) || REFUSED_AT_LAUNCH(rc, cases[k][2], K_GEMM_TG),
              "gemm_kq grid %ux%u tg %u for n_out=%u rows=%u: refused with "
              "K_ERR_SHAPE", cases[k][0], cases[k][1], cases[k][2], n_out, rows);
    }
    free(w), free(xq), free(y);
}

/* suite gdnnq: gdn_norm_quant (gdn.h) against its unfused sequence, gdn_norm
 * at a threadgroup of 256 then quantize_q8_0 / quantize_q8_K of the rows
 * (each tested against the CPU elsewhere): o's rows and the quantized
 * rows byte for byte. Heads of 32 / 64 / 128 / 256 (8 / 4 / 2 / 1 a
 * threadgroup), 1..3 tokens, a gap between o's rows. */
static void suite_gdnnq(void) {
    const uint32_t cases[][4] = {/* n_v, d, tokens, flags */
                                 {2, 128, 1, K_NQ_Q8_K}, {4, 128, 3, K_NQ_Q8_K}, {6, 128, 2, K_NQ_Q8_0},
                                 {8, 64, 2, K_NQ_Q8_K | K_NQ_Q8_0}, {2, 256, 1, K_NQ_Q8_K}, {16, 32, 2, K_NQ_Q8_K}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint32_t nv = cases[c][0], d = cases[c][1], n = cases[c][2], fl = cases[c][3];
        const uint32_t vd = nv * d, z_off = 7, W = z_off + vd + 3, os = vd + 5;
        float *in = malloc(sizeof(float) * n * W), *hp = malloc(sizeof(float) * (2 * nv + d));
        float *o1 = malloc(sizeof(float) * n * os), *o2 = malloc(sizeof(float) * n * os);
        const size_t b8 = (size_t)n * (vd / 32) * 34, bk = (size_t)n * (vd / 256) * 292;
        uint8_t *q8a = calloc(b8, 1), *q8b = calloc(b8, 1), *qka = calloc(bk, 1), *qkb = calloc(bk, 1);
        for (uint32_t i = 0; i < n * W; i++) in[i] = frand(-4, 4);
        for (uint32_t i = 0; i < 2 * nv + d; i++) hp[i] = frand(0.2f, 1.5f);
        for (uint32_t i = 0; i < n * os; i++) o1[i] = frand(-3, 3);
        if (c == 1) /* a row with a repeated |max| in one block (quantize_q8_K's tie rule) */
            o1[os + 3] = -o1[os + 200];
        memcpy(o2, o1, sizeof(float) * n * os);
        /* the unfused sequence on o1 */
        k_gdn_norm_params pn = {K_TAG_OF(gdn_norm), nv, d, n, W, z_off, os, 1e-6f, 0u};
        k_binding bn[] = {K_BIND(gdn_norm, status, status, 8), K_BIND(gdn_norm, p, &pn, sizeof pn),
                          K_BIND(gdn_norm, in, in, sizeof(float) * n * W),
                          K_BIND(gdn_norm, hp, hp, sizeof(float) * (2 * nv + d)),
                          K_BIND(gdn_norm, o, o1, sizeof(float) * n * os)};
        int ok = !launch(K_ID_gdn_norm, nv, n, 1, 256, bn, 5, 0, "gdn_norm");
        if (ok && (fl & K_NQ_Q8_0)) {
            k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), vd, n, os};
            k_binding b[] = {K_BIND(quantize_q8_0, status, status, 8), K_BIND(quantize_q8_0, p, &p, sizeof p),
                             K_BIND(quantize_q8_0, x, o1, sizeof(float) * n * os),
                             K_BIND(quantize_q8_0, q, q8a, b8)};
            ok = !launch(K_ID_quantize_q8_0, (n * vd / 32 + 3) / 4, 1, 1, 128, b, 4, 1, "quantize_q8_0");
        }
        if (ok && (fl & K_NQ_Q8_K)) {
            k_quantize_q8_K_params p = {K_TAG_OF(quantize_q8_K), vd, n, os};
            k_binding b[] = {K_BIND(quantize_q8_K, status, status, 8), K_BIND(quantize_q8_K, p, &p, sizeof p),
                             K_BIND(quantize_q8_K, x, o1, sizeof(float) * n * os),
                             K_BIND(quantize_q8_K, q, qka, bk)};
            ok = !launch(K_ID_quantize_q8_K, (n * vd / 256 + 3) / 4, 1, 1, 128, b, 4, 0, "quantize_q8_K");
        }
        if (ok) {
            k_gdn_norm_quant_params p = {K_TAG_OF(gdn_norm_quant), nv, d, n, W, z_off, os, 1e-6f, fl};
            k_binding b[] = {K_BIND(gdn_norm_quant, status, status, 8), K_BIND(gdn_norm_quant, p, &p, sizeof p),
                             K_BIND(gdn_norm_quant, in, in, sizeof(float) * n * W),
                             K_BIND(gdn_norm_quant, hp, hp, sizeof(float) * (2 * nv + d)),
                             K_BIND(gdn_norm_quant, o, o2, sizeof(float) * n * os),
                             K_BIND(gdn_norm_quant, q8, q8b, (fl & K_NQ_Q8_0) ? b8 : 1),
                             K_BIND(gdn_norm_quant, qk, qkb, (fl & K_NQ_Q8_K) ? bk : 1)};
            ok = !launch(K_ID_gdn_norm_quant, vd / 256, n, 1, 256, b, 7, (int)c & 1, "gdn_norm_quant");
        }
        if (ok) {
            int same_o = 1;
            for (uint32_t t = 0; t < n; t++) same_o &= !memcmp(o1 + t * os, o2 + t * os, sizeof(float) * vd);
            const int same8 = !(fl & K_NQ_Q8_0) || !memcmp(q8a, q8b, b8);
            const int samek = !(fl & K_NQ_Q8_K) || !memcmp(qka, qkb, bk);
            check(same_o && same8 && samek, "gdn_norm_quant n_v=%u d=%u tokens=%u%s%s: o (%s) and the quantized "
                  "rows (%s) bit-identical to gdn_norm then the quantizers", nv, d, n,
                  (fl & K_NQ_Q8_0) ? " Q8_0" : "", (fl & K_NQ_Q8_K) ? " Q8_K" : "", same_o ? "same" : "DIFFER",
                  same8 && samek ? "same" : "DIFFER");
        }
        free(in), free(hp), free(o1), free(o2), free(q8a), free(q8b), free(qka), free(qkb);
    }
    /* refused with K_ERR_SHAPE: a threadgroup other than 256, heads that do
     * not tile 256 values (d 48), no quantized output asked for */
    const uint32_t bad[][4] = {{4, 128, 128, K_NQ_Q8_K}, {16, 48, 256, K_NQ_Q8_K}, {2, 128, 256, 0}};
    for (int k = 0; k < 3; k++) {
        const uint32_t nv = bad[k][0], d = bad[k][1], tg = bad[k][2], fl = bad[k][3], vd = nv * d;
        float *in = calloc(vd + 8, sizeof(float)), *hp = calloc(2 * nv + d, sizeof(float)), *o = calloc(vd, sizeof(float));
        uint8_t *q = calloc(vd / 32 * 34 + vd / 256 * 292 + 1, 1);
        k_gdn_norm_quant_params p = {K_TAG_OF(gdn_norm_quant), nv, d, 1, vd + 8, 0, vd, 1e-6f, fl};
        k_binding b[] = {K_BIND(gdn_norm_quant, status, status, 8), K_BIND(gdn_norm_quant, p, &p, sizeof p),
                         K_BIND(gdn_norm_quant, in, in, sizeof(float) * (vd + 8)),
                         K_BIND(gdn_norm_quant, hp, hp, sizeof(float) * (2 * nv + d)),
                         K_BIND(gdn_norm_quant, o, o, sizeof(float) * vd), K_BIND(gdn_norm_quant, q8, q, 1),
                         K_BIND(gdn_norm_quant, qk, q, vd / 256 * 292 + 1)};
        const uint32_t grid[3] = {vd / 256 ? vd / 256 : 1, 1, 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_gdn_norm_quant, grid, tg, b, 7, &opt, err, sizeof err);
        check(rc == 0 && (status[0] & K_ERR_SHAPE), "gdn_norm_quant n_v=%u d=%u tg=%u flags=%u: refused with "
              "K_ERR_SHAPE", nv, d, tg, fl);
        free(in), free(hp), free(o), free(q);
    }
}

/* suite mma: the int8 tensor-core GEMMs (gpu/kernels/gemm_mma.h) */
#include "test_gpu_mma.h"

/* suite q4_64a: the Q4_64A matvec (gpu/kernels/quant_q4_64a.h) */
#include "test_gpu_q4_64a.h"

int main(int argc, char **argv) {
    ds4_kernels_init_scalar(&scalar);
    static const struct {
        const char *name;
        void (*fn)(void);
    } suites[] = {{"tables", suite_tables}, {"f16", suite_f16},   {"rmsnorm", suite_rmsnorm},
                  {"quantize", suite_quantize}, {"matvec", suite_matvec}, {"rope", suite_rope},
                  {"attn", suite_attn}, {"kquant", suite_kquant}, {"gdn", suite_gdn},
                  {"argmax", suite_argmax}, {"glue", suite_glue}, {"fused", suite_fused}, {"moe", suite_moe},
                  {"gdnseq", suite_gdnseq}, {"gdnnq", suite_gdnnq}, {"gemm", suite_gemm}, {"mma", suite_mma},
                  {"q4_64a", suite_q4_64a}};
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
