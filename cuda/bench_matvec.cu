// bench_matvec.cu — microbenchmark of the shared matvec kernels on the GPU
// (make cuda-bench; gpu/tools/device_check.sh runs it on the H200).
//
//   bench_matvec                 every shape of issue 19's matvec goal:
//                                5120x17408, 17408x5120, 5120x6144 (27B-like),
//                                1024x3584, 3584x1024 (0.8B-like), n_in x n_out
//   bench_matvec n_in n_out      that shape only
//   bench_matvec i1 o1 i2 o2 ... those shapes (at most 8)
//
// Filters (environment; gpu/tools/device_matvec_sweep.sh uses them):
//   BENCH_TYPES=Q4_K,Q6_K,Q8_0   only these weight types (default all four)
//   BENCH_WIDTHS=1,4             only these widths (of 1, 2, 4, 8, 16)
//   BENCH_MATVEC_ONLY=1          skip the GDN / argmax / PREFILL benchmarks
//   BENCH_GDN_ONLY=1             of the PREFILL lines, only the GDN kernels'
// Every timed (type, shape, width) also prints one "SWEEP" line
// (type, shape, width, us, % of 4300 GB/s) for scripts to pick up.
//
// Then PREFILL lines: the GEMM on BENCH_ROWS (64) rows vs the matvecs, and
// gdn_seq on 1 and BENCH_ROWS tokens and gdn_prep + gdn_rows + gdn_norm on
// BENCH_ROWS tokens (bench_prefill).
// Times k_matvec_kq* (Q4_K, Q5_K, Q6_K) and k_matvec_q8_0 at widths 1, 2,
// 4, 8, 16 with CUDA events over many back-to-back launches, and prints
// weight + activation bytes read per launch / time as GB/s beside the
// H200's ~4300 GB/s, then a summary table (% per width, width 16's time
// over width 1's). Enough copies of the weights (>= 150 MB) are cycled
// that the 50 MB L2 cannot serve them. Small shapes (2 MB of weights: ~0.5
// us at 4300 GB/s) include the gap between launches, so they read low.
// Random bytes with finite fp16 scales: speed does not depend on values.
// BENCH_NSG=1..4 picks the SIMD-groups per threadgroup (default 4).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/dialect/cuda.h"
#include "../gpu/host/bind.h"
#include "../gpu/host/q8_0_rows.h"

extern "C" int k_cuda_launch(int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb,
                             cudaStream_t stream, char *err, size_t cap);

#define CK(x)                                                                  \
    do {                                                                       \
        cudaError_t e_ = (x);                                                  \
        if (e_ != cudaSuccess) {                                               \
            printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_));              \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

// fp16 bits of a small positive scale (0x2000..0x23ff: ~0.008..0.016)
static uint16_t small_half(void) { return (uint16_t)(0x2000u | (rnd() & 0x3ffu)); }

// Random weight rows of nb blocks of `type` (0: Q8_0) with finite scales;
// Q8_0 in the device layout the kernels read (q8_0_rows.h).
static void fill_weights(uint8_t *w, size_t n_rows, size_t nb, int type) {
    const size_t n_blocks = n_rows * nb;
    const size_t bs = type == 0 ? 34 : K_KQ_BLOCK_BYTES(type);
    for (size_t i = 0; i < n_blocks * bs; i++) w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = w + b * bs;
        const size_t at = type == K_TYPE_Q6_K ? 208 : 0;
        uint16_t h = small_half();
        memcpy(blk + at, &h, 2);
        if (type == K_TYPE_Q4_K || type == K_TYPE_Q5_K) {
            h = small_half();
            memcpy(blk + 2, &h, 2);
        }
    }
    if (type == 0) {
        uint8_t *t = (uint8_t *)malloc(n_blocks * 34);
        memcpy(t, w, n_blocks * 34);
        k_q8_0_rows_to_device(w, t, n_rows, 32 * nb);
        free(t);
    }
}

static void fill_acts(uint8_t *x, size_t n_blocks, int kq) {
    const size_t bs = kq ? 292 : 34;
    for (size_t i = 0; i < n_blocks * bs; i++) x[i] = (uint8_t)rnd();
    for (size_t b = 0; b < n_blocks; b++) {
        if (kq) {
            const float d = 0.01f;
            memcpy(x + b * bs, &d, 4);
            // bsums = the sums of the codes, as every Q8_K quantizer writes
            // them (gemm_kq_mma's min term relies on it; table.h)
            for (int j = 0; j < 16; j++) {
                int16_t s = 0;
                for (int i = 0; i < 16; i++) s = (int16_t)(s + (int8_t)x[b * bs + 4 + 16 * j + i]);
                memcpy(x + b * bs + 260 + 2 * j, &s, 2);
            }
        } else {
            const uint16_t h = small_half();
            memcpy(x + b * bs, &h, 2);
        }
    }
}

static const char *type_name(int type) {
    return type == K_TYPE_Q4_K ? "Q4_K" : type == K_TYPE_Q5_K ? "Q5_K" : type == K_TYPE_Q6_K ? "Q6_K" : "Q8_0";
}

// One summary cell per (type, shape, width): % of 4300 GB/s.
#define N_WIDTHS 5
static const uint32_t widths[N_WIDTHS] = {1, 2, 4, 8, 16};

// Whether `item` is in the comma-separated list in environment variable
// `var` (an unset or empty variable lets everything through).
static int env_lists(const char *var, const char *item) {
    const char *v = getenv(var);
    if (!v || !*v) return 1;
    const size_t n = strlen(item);
    for (const char *q = v; *q;) {
        const char *e = strchr(q, ',');
        const size_t len = e ? (size_t)(e - q) : strlen(q);
        if (len == n && !strncmp(q, item, n)) return 1;
        if (!e) break;
        q = e + 1;
    }
    return 0;
}
static int width_wanted(uint32_t width) {
    char b[8];
    snprintf(b, sizeof b, "%u", width);
    return env_lists("BENCH_WIDTHS", b);
}

// Times one (type, shape) at every width: microseconds per launch into
// us[w]; weight + activation bytes read per launch / time as GB/s.
static void bench_shape(int type, uint32_t n_in, uint32_t n_out, double us_out[N_WIDTHS], double pct_out[N_WIDTHS]) {
    const int kq = type != 0;
    const uint32_t qk = kq ? 256 : 32;
    const size_t bs = kq ? K_KQ_BLOCK_BYTES(type) : 34, nb = n_in / qk, xbs = kq ? 292 : 34;
    const size_t wbytes = (size_t)n_out * nb * bs, xmax = (size_t)K_MATVEC_MAX_ROWS * nb * xbs;
    // enough copies of the weights to cycle through 3x the 50 MB L2, at
    // least 6: each launch then reads its weights from HBM
    int copies = (int)((150e6 + wbytes - 1) / wbytes);
    if (copies < 6) copies = 6;
    uint8_t *hw = (uint8_t *)malloc(wbytes), *hx = (uint8_t *)malloc(xmax);
    fill_acts(hx, (size_t)K_MATVEC_MAX_ROWS * nb, kq);
    fill_weights(hw, n_out, nb, type); // the same bytes at every copy: what defeats the L2
    uint8_t **dw = (uint8_t **)malloc(sizeof(uint8_t *) * copies), *dx;
    float *dy;
    uint32_t *dstatus;
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&dw[c], wbytes));
        CK(cudaMemcpy(dw[c], hw, wbytes, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&dx, xmax));
    CK(cudaMemcpy(dx, hx, xmax, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dy, sizeof(float) * K_MATVEC_MAX_ROWS * n_out));
    CK(cudaMalloc(&dstatus, 8));
    CK(cudaMemset(dstatus, 0, 8));
    // SIMD-groups per threadgroup: BENCH_NSG (1..4), else 4
    const char *env = getenv("BENCH_NSG");
    const uint32_t nsg = env && atoi(env) >= 1 && atoi(env) <= 4 ? (uint32_t)atoi(env) : 4;
    const uint32_t tg = 32 * nsg;
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    for (int wi = 0; wi < N_WIDTHS; wi++) {
        const uint32_t width = widths[wi];
        if (!width_wanted(width)) {
            us_out[wi] = -1, pct_out[wi] = -1;
            continue;
        }
        const size_t xbytes = (size_t)width * nb * xbs;
        const int kid = K_MATVEC_KQ_KERNEL(width); // the variant for this width
        const uint32_t grid[3] = {kq ? K_MATVEC_KQ_GROUPS(width, n_out, nsg) : K_MATVEC_GROUPS(n_out, nsg), 1, 1};
        k_matvec_kq_params pk = {K_TAG(kid), (uint32_t)type, n_in, n_out, width, n_out};
        k_matvec_q8_0_params p8 = {K_TAG_OF(matvec_q8_0), n_in, n_out, width, n_out};
        char err[400];
        // at least 60 launches and 2 passes over the copies
        const int warm = 5, iters = 2 * copies > 60 ? 2 * copies : 60;
        float ms = 0;
        for (int it = -warm; it < iters; it++) {
            if (it == 0) CK(cudaEventRecord(t0));
            uint8_t *w = dw[(it + warm) % copies];
            int rc;
            if (kq) {
                k_binding b[] = {K_BIND(matvec_kq, status, dstatus, 8), K_BIND(matvec_kq, p, &pk, sizeof pk),
                                 K_BIND(matvec_kq, w, w, wbytes), K_BIND(matvec_kq, xq, dx, xbytes),
                                 K_BIND(matvec_kq, y, dy, sizeof(float) * width * n_out)};
                rc = k_cuda_launch(kid, grid, tg, b, 5, 0, err, sizeof err);
            } else {
                k_binding b[] = {K_BIND(matvec_q8_0, status, dstatus, 8), K_BIND(matvec_q8_0, p, &p8, sizeof p8),
                                 K_BIND(matvec_q8_0, w, w, wbytes), K_BIND(matvec_q8_0, xq, dx, xbytes),
                                 K_BIND(matvec_q8_0, y, dy, sizeof(float) * width * n_out)};
                rc = k_cuda_launch(K_ID_matvec_q8_0, grid, tg, b, 5, 0, err, sizeof err);
            }
            if (rc) {
                printf("FAIL launch: %s\n", err);
                exit(1);
            }
        }
        CK(cudaEventRecord(t1));
        CK(cudaEventSynchronize(t1));
        CK(cudaEventElapsedTime(&ms, t0, t1));
        uint32_t st[2];
        CK(cudaMemcpy(st, dstatus, 8, cudaMemcpyDeviceToHost));
        const double us = 1000.0 * ms / iters, gbs = (double)(wbytes + xbytes) / (us * 1e3);
        us_out[wi] = us, pct_out[wi] = 100.0 * gbs / 4300.0;
        printf("BENCH matvec %s tg=%3u n_in=%5u n_out=%5u width=%2u: %8.1f us/launch, weights %6.1f MB x %2d copies, "
               "%7.1f GB/s = %5.1f%% of 4300 GB/s%s\n", type_name(type), tg, n_in, n_out, width, us, wbytes / 1e6, copies,
               gbs, pct_out[wi], st[0] ? " (STATUS RAISED)" : "");
        printf("SWEEP %s %ux%u w%u %.2f us %.1f%%\n", type_name(type), n_in, n_out, width, us, pct_out[wi]);
        if (st[0]) {
            printf("FAIL matvec %s raised status 0x%x\n", type_name(type), st[0]);
            exit(1);
        }
    }
    for (int c = 0; c < copies; c++) cudaFree(dw[c]);
    cudaFree(dx), cudaFree(dy), cudaFree(dstatus);
    cudaEventDestroy(t0), cudaEventDestroy(t1);
    free(dw), free(hw), free(hx);
}

// Time `iters` launches of one bound kernel; microseconds per launch.
static double time_launches(int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb, int iters) {
    char err[400];
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    for (int it = -3; it < iters; it++) {
        if (it == 0) CK(cudaEventRecord(t0));
        if (k_cuda_launch(id, grid, tg, b, nb, 0, err, sizeof err)) {
            printf("FAIL launch: %s\n", err);
            exit(1);
        }
    }
    CK(cudaEventRecord(t1));
    CK(cudaEventSynchronize(t1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    return 1000.0 * ms / iters;
}

// The GDN decode step of a 27B-like layer (16 k heads, 48 v heads, d 128,
// conv_dim 10240, 4 taps) and the LM head's argmax / top-8 over a 248320
// vocabulary: per-token latencies beside their state / logits bytes.
static void bench_gdn_argmax(void) {
    const uint32_t nk = 16, nv = 48, d = 128, cd = 2 * nk * d + nv * d, K = 4, vocab = 248320;
    const size_t ns = (size_t)nv * d * d;
    float *h = (float *)malloc(sizeof(float) * (ns > vocab ? ns : vocab));
    for (size_t i = 0; i < (ns > vocab ? ns : vocab); i++) h[i] = ((rnd() & 0xffff) / 65536.0f - 0.5f) * 0.2f;
    float *dx, *dcw, *dst, *dout, *dz, *dab, *dhp, *ds, *dlog;
    uint32_t *dstatus, *didx;
    CK(cudaMalloc(&dx, 4 * cd));
    CK(cudaMalloc(&dcw, 4 * cd * K));
    CK(cudaMalloc(&dst, 4 * cd * (K - 1)));
    CK(cudaMalloc(&dout, 4 * cd));
    CK(cudaMalloc(&dz, 4 * nv * d));
    CK(cudaMalloc(&dab, 4 * 2 * nv));
    CK(cudaMalloc(&dhp, 4 * (2 * nv + d)));
    CK(cudaMalloc(&ds, 4 * ns));
    CK(cudaMalloc(&dlog, 4 * vocab));
    CK(cudaMalloc(&didx, 4 * (1 + K_TOPK_MAX)));
    CK(cudaMalloc(&dstatus, 8));
    CK(cudaMemset(dstatus, 0, 8));
    CK(cudaMemcpy(dx, h, 4 * cd, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcw, h, 4 * cd * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dst, h, 4 * cd * (K - 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dz, h, 4 * nv * d, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dab, h, 4 * 2 * nv, cudaMemcpyHostToDevice));
    for (uint32_t i = 0; i < nv; i++) h[i] = -0.5f; // ssm_a < 0: decay < 1
    CK(cudaMemcpy(dhp, h, 4 * (2 * nv + d), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, h, 4 * ns, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlog, h, 4 * vocab, cudaMemcpyHostToDevice));

    k_gdn_conv_params pc = {K_TAG_OF(gdn_conv), cd, K};
    k_binding bc[] = {K_BIND(gdn_conv, status, dstatus, 8), K_BIND(gdn_conv, p, &pc, sizeof pc),
                      K_BIND(gdn_conv, x, dx, 4 * cd), K_BIND(gdn_conv, cw, dcw, 4 * cd * K),
                      K_BIND(gdn_conv, state, dst, 4 * cd * (K - 1)), K_BIND(gdn_conv, out, dout, 4 * cd)};
    const uint32_t gc[3] = {(cd + 127) / 128, 1, 1};
    const double us_conv = time_launches(K_ID_gdn_conv, gc, 128, bc, 6, 50);
    k_gdn_delta_params pd = {K_TAG_OF(gdn_delta), nk, nv, d, 1e-6f};
    k_binding bd[] = {K_BIND(gdn_delta, status, dstatus, 8), K_BIND(gdn_delta, p, &pd, sizeof pd),
                      K_BIND(gdn_delta, cv, dout, 4 * cd), K_BIND(gdn_delta, z, dz, 4 * nv * d),
                      K_BIND(gdn_delta, ab, dab, 4 * 2 * nv), K_BIND(gdn_delta, hp, dhp, 4 * (2 * nv + d)),
                      K_BIND(gdn_delta, s, ds, 4 * ns), K_BIND(gdn_delta, o, dz, 4 * nv * d)};
    // o aliases z here only to save a buffer: timing, not values
    const uint32_t gd[3] = {nv, 1, 1};
    const double us_delta = time_launches(K_ID_gdn_delta, gd, 128, bd, 8, 50);
    printf("BENCH gdn_conv channels=%u taps=%u: %.1f us; gdn_delta n_v=%u d=%u: %.1f us (state %.1f MB read + "
           "written: %.0f GB/s)\n", cd, K, us_conv, nv, d, us_delta, 4.0 * ns / 1e6, 8.0 * ns / (us_delta * 1e3));
    for (uint32_t k = 0; k <= K_TOPK_MAX; k += K_TOPK_MAX) {
        k_argmax_rows_params pa = {K_TAG_OF(argmax_rows), vocab, 1, vocab, k};
        k_binding ba[] = {K_BIND(argmax_rows, status, dstatus, 8), K_BIND(argmax_rows, p, &pa, sizeof pa),
                          K_BIND(argmax_rows, x, dlog, 4 * vocab), K_BIND(argmax_rows, idx, didx, 4 * (1 + K_TOPK_MAX))};
        const uint32_t ga[3] = {1, 1, 1};
        const double us = time_launches(K_ID_argmax_rows, ga, 1024, ba, 4, 50);
        printf("BENCH argmax_rows vocab=%u k=%u: %.1f us per row (one threadgroup)\n", vocab, k, us);
    }
    uint32_t st[2];
    CK(cudaMemcpy(st, dstatus, 8, cudaMemcpyDeviceToHost));
    if (st[0]) printf("FAIL a benchmark kernel raised status 0x%x\n", st[0]);
    cudaFree(dx), cudaFree(dcw), cudaFree(dst), cudaFree(dout), cudaFree(dz), cudaFree(dab), cudaFree(dhp);
    cudaFree(ds), cudaFree(dlog), cudaFree(didx), cudaFree(dstatus);
    free(h);
}

// Prefill (issue 19): the GEMM (gemm.h) on BENCH_ROWS (64) rows beside the
// same rows through the matvecs 16 at a time (what the runner did before),
// and gdn_seq (n tokens, one launch) beside n gdn_conv + gdn_delta pairs,
// on 27B-like shapes. Sweep the tile knobs with one build each, e.g.
//   make -s cuda-bench NVCC="nvcc -DK_GEMM_TOS=2" && ./build/cuda/bench_matvec 5120 17408 | grep PREFILL
static void bench_prefill(uint32_t a_in, uint32_t a_out) {
    const char *env = getenv("BENCH_ROWS");
    const uint32_t rows = env && atoi(env) > 0 ? (uint32_t)atoi(env) : 64;
    const uint32_t pshapes[][2] = {{5120, 17408}, {17408, 5120}, {1024, 3584}};
    const int ptypes[] = {K_TYPE_Q4_K, K_TYPE_Q6_K, 0};
    const char *gdn_only = getenv("BENCH_GDN_ONLY"); // set: the GDN kernels alone
    for (int t = 0; t < (gdn_only && *gdn_only ? 0 : 3); t++)
        for (int s = 0; s < (a_in ? 1 : 3); s++) {
            const int type = ptypes[t], kq = type != 0;
            const uint32_t n_in = a_in ? a_in : pshapes[s][0], n_out = a_in ? a_out : pshapes[s][1];
            const size_t bs = kq ? K_KQ_BLOCK_BYTES(type) : 34, nb = n_in / (kq ? 256 : 32), xbs = kq ? 292 : 34;
            const size_t wbytes = (size_t)n_out * nb * bs, xbytes = (size_t)rows * nb * xbs;
            uint8_t *hw = (uint8_t *)malloc(wbytes), *hx = (uint8_t *)malloc(xbytes), *dw, *dx;
            fill_weights(hw, n_out, nb, type);
            fill_acts(hx, (size_t)rows * nb, kq);
            float *dy;
            uint32_t *dstatus;
            CK(cudaMalloc(&dw, wbytes));
            CK(cudaMalloc(&dx, xbytes));
            CK(cudaMalloc(&dy, sizeof(float) * rows * n_out));
            CK(cudaMalloc(&dstatus, 8));
            CK(cudaMemset(dstatus, 0, 8));
            CK(cudaMemcpy(dw, hw, wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dx, hx, xbytes, cudaMemcpyHostToDevice));
            k_matvec_kq_params pk = {K_TAG_OF(gemm_kq), (uint32_t)type, n_in, n_out, rows, n_out};
            k_gemm_q8_0_params p8 = {K_TAG_OF(gemm_q8_0), n_in, n_out, rows, n_out};
            k_binding b[] = {K_BIND(gemm_kq, status, dstatus, 8),
                             kq ? K_BIND(gemm_kq, p, &pk, sizeof pk) : K_BIND(gemm_q8_0, p, &p8, sizeof p8),
                             K_BIND(gemm_kq, w, dw, wbytes), K_BIND(gemm_kq, xq, dx, xbytes),
                             K_BIND(gemm_kq, y, dy, sizeof(float) * rows * n_out)};
            const uint32_t gg[3] = {K_GEMM_GROUPS_X(rows), K_GEMM_GROUPS_Y(n_out), 1};
            const double us_g = time_launches(kq ? K_ID_gemm_kq : K_ID_gemm_q8_0, gg, K_GEMM_TG, b, 5, 20);
            // the int8 tensor-core GEMM (gemm_mma.h) on the same data: its
            // time, and its outputs against the dp4a GEMM's, bit for bit
            float *dy2;
            CK(cudaMalloc(&dy2, sizeof(float) * rows * n_out));
            k_matvec_kq_params pkm = {K_TAG_OF(gemm_kq_mma), (uint32_t)type, n_in, n_out, rows, n_out};
            k_gemm_q8_0_mma_params p8m = {K_TAG_OF(gemm_q8_0_mma), n_in, n_out, rows, n_out};
            k_binding bmm[] = {K_BIND(gemm_kq_mma, status, dstatus, 8),
                               kq ? K_BIND(gemm_kq_mma, p, &pkm, sizeof pkm) : K_BIND(gemm_q8_0_mma, p, &p8m, sizeof p8m),
                               K_BIND(gemm_kq_mma, w, dw, wbytes), K_BIND(gemm_kq_mma, xq, dx, xbytes),
                               K_BIND(gemm_kq_mma, y, dy2, sizeof(float) * rows * n_out)};
            const uint32_t gmm[3] = {kq ? K_MMA_KQ_GROUPS_X(rows) : K_MMA_GROUPS_X(rows),
                                     kq ? K_MMA_KQ_GROUPS_Y(n_out) : K_MMA_GROUPS_Y(n_out), 1};
            const double us_mma = time_launches(kq ? K_ID_gemm_kq_mma : K_ID_gemm_q8_0_mma, gmm,
                                                kq ? K_MMA_KQ_TG : K_MMA_TG, bmm, 5, 20);
            {
                float *y1 = (float *)malloc(sizeof(float) * rows * n_out), *y2 = (float *)malloc(sizeof(float) * rows * n_out);
                CK(cudaMemcpy(y1, dy, sizeof(float) * rows * n_out, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(y2, dy2, sizeof(float) * rows * n_out, cudaMemcpyDeviceToHost));
                size_t ndiff = 0;
                for (size_t i = 0; i < (size_t)rows * n_out; i++) ndiff += memcmp(&y1[i], &y2[i], 4) != 0;
                const double macs = (double)n_in * n_out * rows;
                printf("PREFILL mma %s n_in=%5u n_out=%5u rows=%u tile NSG=%d NT=%d: %8.1f us (%6.1f int8 TMAC/s, "
                       "%5.1f us/row); dp4a gemm %8.1f us: %.2fx; outputs %s (%zu of %zu differ)\n", type_name(type), n_in,
                       n_out, rows, kq ? (int)K_MMA_KQ_NSG : (int)K_MMA_NSG, kq ? (int)K_MMA_KQ_NT : (int)K_MMA_NT, us_mma, macs / (us_mma * 1e6), us_mma / rows, us_g,
                       us_g / us_mma, ndiff ? "DIFFER FROM THE DP4A GEMM" : "bit-identical to the dp4a gemm", ndiff,
                       (size_t)rows * n_out);
                free(y1), free(y2);
            }
            cudaFree(dy2);
            // the matvec path: ceil(rows / 16) launches of up to 16 rows
            double us_m = 0;
            for (uint32_t r0 = 0; r0 < rows; r0 += K_MATVEC_MAX_ROWS) {
                const uint32_t nr = rows - r0 < K_MATVEC_MAX_ROWS ? rows - r0 : K_MATVEC_MAX_ROWS;
                const int kid = kq ? K_MATVEC_KQ_KERNEL(nr) : K_ID_matvec_q8_0;
                k_matvec_kq_params mk = {K_TAG((k_u32)kid), (uint32_t)type, n_in, n_out, nr, n_out};
                k_matvec_q8_0_params m8 = {K_TAG_OF(matvec_q8_0), n_in, n_out, nr, n_out};
                k_binding bm[] = {K_BIND(matvec_kq, status, dstatus, 8),
                                  kq ? K_BIND(matvec_kq, p, &mk, sizeof mk) : K_BIND(matvec_q8_0, p, &m8, sizeof m8),
                                  K_BIND(matvec_kq, w, dw, wbytes), K_BIND(matvec_kq, xq, dx + r0 * nb * xbs, nr * nb * xbs),
                                  K_BIND(matvec_kq, y, dy + r0 * n_out, sizeof(float) * nr * n_out)};
                const uint32_t gm[3] = {kq ? K_MATVEC_KQ_GROUPS(nr, n_out, 4) : K_MATVEC_GROUPS(n_out, 4), 1, 1};
                us_m += time_launches(kid, gm, 128, bm, 5, 20);
            }
            uint32_t st[2];
            CK(cudaMemcpy(st, dstatus, 8, cudaMemcpyDeviceToHost));
            const double macs = (double)n_in * n_out * rows;
            printf("PREFILL gemm %s n_in=%5u n_out=%5u rows=%u tile TR=%d TOS=%d NSG=%d: %8.1f us (%6.1f int8 TMAC/s, "
                   "%5.1f us/row); matvecs x16: %8.1f us (%5.1f us/row): %.2fx%s\n", type_name(type), n_in, n_out, rows,
                   (int)K_GEMM_TR, (int)K_GEMM_TOS, (int)K_GEMM_NSG, us_g, macs / (us_g * 1e6), us_g / rows, us_m,
                   us_m / rows, us_m / us_g, st[0] ? " (STATUS RAISED)" : "");
            cudaFree(dw), cudaFree(dx), cudaFree(dy), cudaFree(dstatus);
            free(hw), free(hx);
        }
    // gdn_seq: n tokens of a 27B-like GDN layer in one launch vs n pairs
    // BENCH_GDN_NV / BENCH_GDN_NK: other head counts (0.8B: 16 / 16, MoE: 32 / 16)
    const char *env_nv = getenv("BENCH_GDN_NV"), *env_nk = getenv("BENCH_GDN_NK");
    const uint32_t nk = env_nk && atoi(env_nk) > 0 ? (uint32_t)atoi(env_nk) : 16;
    const uint32_t nv = env_nv && atoi(env_nv) > 0 ? (uint32_t)atoi(env_nv) : 48;
    const uint32_t d = 128, cd = 2 * nk * d + nv * d, K = 4, vd = nv * d, W = cd + vd + 2 * nv;
    const size_t ns = (size_t)nv * d * d;
    float *h = (float *)malloc(sizeof(float) * (ns > (size_t)rows * W ? ns : (size_t)rows * W));
    for (size_t i = 0; i < (ns > (size_t)rows * W ? ns : (size_t)rows * W); i++)
        h[i] = ((rnd() & 0xffff) / 65536.0f - 0.5f) * 0.2f;
    float *din, *dcw, *dconv, *dhp, *ds, *dout;
    uint32_t *dstatus;
    CK(cudaMalloc(&din, 4 * (size_t)rows * W));
    CK(cudaMalloc(&dcw, 4 * cd * K));
    CK(cudaMalloc(&dconv, 4 * 2 * cd * (K - 1)));
    CK(cudaMalloc(&dhp, 4 * (2 * nv + d)));
    CK(cudaMalloc(&ds, 4 * ns));
    CK(cudaMalloc(&dout, 4 * (size_t)rows * vd));
    CK(cudaMalloc(&dstatus, 8));
    CK(cudaMemset(dstatus, 0, 8));
    CK(cudaMemcpy(din, h, 4 * (size_t)rows * W, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcw, h, 4 * cd * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dconv, h, 4 * 2 * cd * (K - 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, h, 4 * ns, cudaMemcpyHostToDevice));
    for (uint32_t i = 0; i < nv; i++) h[i] = -0.5f; // ssm_a < 0: decay < 1
    CK(cudaMemcpy(dhp, h, 4 * (2 * nv + d), cudaMemcpyHostToDevice));
    for (uint32_t n = 1; n <= rows; n = n == 1 && rows > 1 ? rows : rows + 1) { /* 1 (decode), then rows */
        // cur = 0 every launch: a timing loop, not a recurrence (values do not matter)
        // split 1, then (runs of more than one token) splits 2, 4, 8: G
        // threadgroups a head, then gdn_norm over the raw rows (gdn.h)
        for (uint32_t G = 1; G <= (n > 1 ? 8u : 1u); G *= 2) {
            k_gdn_seq_params p = {K_TAG_OF(gdn_seq), nk, nv, d, K, n, W, cd, cd + vd, vd, 0, 1e-6f, G};
            k_binding b[] = {K_BIND(gdn_seq, status, dstatus, 8), K_BIND(gdn_seq, p, &p, sizeof p),
                             K_BIND(gdn_seq, in, din, 4 * (size_t)n * W), K_BIND(gdn_seq, cw, dcw, 4 * cd * K),
                             K_BIND(gdn_seq, conv, dconv, 4 * 2 * cd * (K - 1)), K_BIND(gdn_seq, hp, dhp, 4 * (2 * nv + d)),
                             K_BIND(gdn_seq, s, ds, 4 * ns), K_BIND(gdn_seq, o, dout, 4 * (size_t)n * vd)};
            const uint32_t g[3] = {nv * G, 1, 1};
            double us = time_launches(K_ID_gdn_seq, g, 256, b, 8, 20);
            double un = 0.0;
            if (G > 1) {
                k_gdn_norm_params pn = {K_TAG_OF(gdn_norm), nv, d, n, W, cd, vd, 1e-6f, 0u};
                k_binding bn[] = {K_BIND(gdn_norm, status, dstatus, 8), K_BIND(gdn_norm, p, &pn, sizeof pn),
                                  K_BIND(gdn_norm, in, din, 4 * (size_t)n * W), K_BIND(gdn_norm, hp, dhp, 4 * (2 * nv + d)),
                                  K_BIND(gdn_norm, o, dout, 4 * (size_t)n * vd)};
                const uint32_t gn[3] = {nv, n, 1};
                un = time_launches(K_ID_gdn_norm, gn, 256, bn, 5, 20);
            }
            printf("PREFILL gdn_seq n_v=%u d=%u tokens=%u split=%u: %8.1f us per launch (+ gdn_norm %.1f), %6.2f us per token\n",
                   nv, d, n, G, us + un, un, (us + un) / n);
        }
    }
    // the three-launch form the runner takes for runs of 2+ tokens (gdn_prep
    // over every token, gdn_rows at 1 / 2 / 4 rows a SIMD-group, gdn_norm)
    // on the same inputs
    for (uint32_t R = 1; R <= K_GDN_ROWS_MAX; R *= 2) {
        const uint32_t n = rows, qs = K_GDN_PQ_STRIDE(nk, nv, d), warps = K_GDN_ROWS_WARPS(nv, d, R);
        float *dpq;
        CK(cudaMalloc(&dpq, 4 * (size_t)n * qs));
        k_gdn_prep_params pp = {K_TAG_OF(gdn_prep), nk, nv, d, K, n, W, cd, cd + vd, vd, 0, 1e-6f, 0};
        k_binding bp[] = {K_BIND(gdn_prep, status, dstatus, 8), K_BIND(gdn_prep, p, &pp, sizeof pp),
                          K_BIND(gdn_prep, in, din, 4 * (size_t)n * W), K_BIND(gdn_prep, cw, dcw, 4 * cd * K),
                          K_BIND(gdn_prep, conv, dconv, 4 * 2 * cd * (K - 1)), K_BIND(gdn_prep, hp, dhp, 4 * (2 * nv + d)),
                          K_BIND(gdn_prep, pq, dpq, 4 * (size_t)n * qs)};
        const uint32_t gp[3] = {nk + nv, n, 1};
        const double up = time_launches(K_ID_gdn_prep, gp, 256, bp, 7, 20);
        k_gdn_rows_params pr = {K_TAG_OF(gdn_rows), nk, nv, d, n, vd, R};
        k_binding br[] = {K_BIND(gdn_rows, status, dstatus, 8), K_BIND(gdn_rows, p, &pr, sizeof pr),
                          K_BIND(gdn_rows, pq, dpq, 4 * (size_t)n * qs), K_BIND(gdn_rows, s, ds, 4 * ns),
                          K_BIND(gdn_rows, o, dout, 4 * (size_t)n * vd)};
        const uint32_t gr[3] = {(warps + 3) / 4, 1, 1};
        const double ur = time_launches(K_ID_gdn_rows, gr, 128, br, 5, 20);
        k_gdn_norm_params pn = {K_TAG_OF(gdn_norm), nv, d, n, W, cd, vd, 1e-6f, 0u};
        k_binding bn[] = {K_BIND(gdn_norm, status, dstatus, 8), K_BIND(gdn_norm, p, &pn, sizeof pn),
                          K_BIND(gdn_norm, in, din, 4 * (size_t)n * W), K_BIND(gdn_norm, hp, dhp, 4 * (2 * nv + d)),
                          K_BIND(gdn_norm, o, dout, 4 * (size_t)n * vd)};
        const uint32_t gn[3] = {nv, n, 1};
        const double un = time_launches(K_ID_gdn_norm, gn, 256, bn, 5, 20);
        printf("PREFILL gdn_prep+rows+norm n_v=%u d=%u tokens=%u rows/SIMD-group=%u: %8.1f us (prep %.1f, rows %.1f, "
               "norm %.1f), %6.2f us per token\n", nv, d, n, R, up + ur + un, up, ur, un, (up + ur + un) / n);
        cudaFree(dpq);
    }
    uint32_t st[2];
    CK(cudaMemcpy(st, dstatus, 8, cudaMemcpyDeviceToHost));
    if (st[0]) printf("FAIL a prefill benchmark kernel raised status 0x%x\n", st[0]);
    cudaFree(din), cudaFree(dcw), cudaFree(dconv), cudaFree(dhp), cudaFree(ds), cudaFree(dout), cudaFree(dstatus);
    free(h);
}

// The shapes (n_in x n_out) of issue 19's matvec goal: a 27B-like FFN up
// / down and attention-sized projection, and the 0.8B FFN up / down.
static const uint32_t shapes[][2] = {{5120, 17408}, {17408, 5120}, {5120, 6144}, {1024, 3584}, {3584, 1024}};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

int main(int argc, char **argv) {
    // no arguments: every shape; "n_in n_out ...": those shapes
    uint32_t arg_shapes[8][2];
    const int n_arg = argc > 2 ? (argc - 1) / 2 : 0;
    if (n_arg > 8 || (argc > 1 && (argc - 1) % 2)) {
        printf("FAIL arguments: pairs n_in n_out, at most 8\n");
        return 2;
    }
    for (int a = 0; a < n_arg; a++) {
        arg_shapes[a][0] = (uint32_t)atoi(argv[1 + 2 * a]), arg_shapes[a][1] = (uint32_t)atoi(argv[2 + 2 * a]);
        if (arg_shapes[a][0] % 256 || arg_shapes[a][0] == 0 || arg_shapes[a][1] == 0) {
            printf("FAIL n_in must be a positive multiple of 256, n_out positive\n");
            return 2;
        }
    }
    const int one = n_arg > 0;
    const uint32_t a_in = one ? arg_shapes[0][0] : 0, a_out = one ? arg_shapes[0][1] : 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB; matvec rows per SIMD-group %d\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, (int)K_MATVEC_ROWS_PER_SIMD);
    // widths 1 (decode), 2..16 (verify; matvec_kq1 / kq4 / kq serve 1 /
    // 2..4 / 5..16); Q4_K / Q6_K: a Q4_K_M file's types
    const int types[] = {K_TYPE_Q4_K, K_TYPE_Q5_K, K_TYPE_Q6_K, 0};
    const size_t ns = one ? (size_t)n_arg : N_SHAPES;
    static double us[4][N_SHAPES > 8 ? N_SHAPES : 8][N_WIDTHS], pct[4][N_SHAPES > 8 ? N_SHAPES : 8][N_WIDTHS];
    int type_on[4];
    for (int t = 0; t < 4; t++) {
        type_on[t] = env_lists("BENCH_TYPES", type_name(types[t]));
        for (size_t s = 0; s < ns && type_on[t]; s++)
            bench_shape(types[t], one ? arg_shapes[s][0] : shapes[s][0], one ? arg_shapes[s][1] : shapes[s][1], us[t][s],
                        pct[t][s]);
    }
    // the summary: % of 4300 GB/s per width, and the time of width 16
    // over width 1 (1.0 = extra rows free); "-" for a width filtered out
    printf("\nSUMMARY matvec, %% of 4300 GB/s (weights + activations read per launch / time):\n");
    printf("%-5s %-12s %6s %6s %6s %6s %6s  %9s %9s\n", "type", "n_in x n_out", "w1", "w2", "w4", "w8", "w16", "us w1",
           "t16/t1");
    for (int t = 0; t < 4; t++)
        for (size_t s = 0; s < ns && type_on[t]; s++) {
            char shape[32];
            snprintf(shape, sizeof shape, "%ux%u", one ? arg_shapes[s][0] : shapes[s][0], one ? arg_shapes[s][1] : shapes[s][1]);
            printf("%-5s %-12s", type_name(types[t]), shape);
            for (int w = 0; w < N_WIDTHS; w++) {
                if (pct[t][s][w] < 0) printf(" %6s", "-");
                else printf(" %5.1f%%", pct[t][s][w]);
            }
            if (us[t][s][0] > 0 && us[t][s][N_WIDTHS - 1] > 0)
                printf("  %9.1f %9.2f\n", us[t][s][0], us[t][s][N_WIDTHS - 1] / us[t][s][0]);
            else
                printf("  %9.1f %9s\n", us[t][s][0], "-");
        }
    const char *mo = getenv("BENCH_MATVEC_ONLY");
    if (mo && *mo && strcmp(mo, "0")) return 0;
    bench_gdn_argmax();
    bench_prefill(a_in, a_out);
    return 0;
}
