// bench_matvec.cu — microbenchmark of the shared matvec kernels on the GPU
// (make cuda-bench; gpu/tools/device_check.sh runs it on the H200).
//
//   bench_matvec [n_in n_out]        default 5120 17408 (a 27B-like FFN)
//
// Times k_matvec_kq* (Q4_K, Q6_K, Q5_K) and k_matvec_q8_0 at widths 1, 2, 4, 8, 16
// with CUDA events over many launches, and prints weight bytes read per
// launch / time as GB/s beside the H200's ~4300 GB/s. Several copies of the
// weights are cycled so the 50 MB L2 cannot serve them. Random bytes with
// finite fp16 scales: speed does not depend on the values.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/dialect/cuda.h"
#include "../gpu/host/bind.h"

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

// Random weight blocks of `type` (0: Q8_0) with finite scales.
static void fill_weights(uint8_t *w, size_t n_blocks, int type) {
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
}

static void fill_acts(uint8_t *x, size_t n_blocks, int kq) {
    const size_t bs = kq ? 292 : 34;
    for (size_t i = 0; i < n_blocks * bs; i++) x[i] = (uint8_t)rnd();
    for (size_t b = 0; b < n_blocks; b++) {
        if (kq) {
            const float d = 0.01f;
            memcpy(x + b * bs, &d, 4);
        } else {
            const uint16_t h = small_half();
            memcpy(x + b * bs, &h, 2);
        }
    }
}

static void bench(int type, uint32_t n_in, uint32_t n_out, uint32_t width) {
    const int kq = type != 0;
    const uint32_t qk = kq ? 256 : 32;
    const size_t bs = kq ? K_KQ_BLOCK_BYTES(type) : 34, nb = n_in / qk;
    const size_t wbytes = (size_t)n_out * nb * bs, xbytes = (size_t)width * nb * (kq ? 292 : 34);
    const int copies = 6; // 6 x ~50 MB: well past the L2
    uint8_t *hw = (uint8_t *)malloc(wbytes), *hx = (uint8_t *)malloc(xbytes);
    fill_acts(hx, (size_t)width * nb, kq);
    uint8_t *dw[copies], *dx;
    float *dy;
    uint32_t *dstatus;
    fill_weights(hw, (size_t)n_out * nb, type); // the same bytes at 6 addresses: what defeats the L2
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&dw[c], wbytes));
        CK(cudaMemcpy(dw[c], hw, wbytes, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&dx, xbytes));
    CK(cudaMemcpy(dx, hx, xbytes, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dy, sizeof(float) * width * n_out));
    CK(cudaMalloc(&dstatus, 8));
    CK(cudaMemset(dstatus, 0, 8));
    // SIMD-groups per threadgroup: BENCH_NSG (1..4), else 4 (measured best)
    const char *env = getenv("BENCH_NSG");
    const uint32_t nsg = env && atoi(env) >= 1 && atoi(env) <= 4 ? (uint32_t)atoi(env) : 4;
    const uint32_t tg = 32 * nsg, grid[3] = {K_MATVEC_GROUPS(n_out, nsg), 1, 1};
    const int kid = K_MATVEC_KQ_KERNEL(width); // the variant for this width
    k_matvec_kq_params pk = {K_TAG(kid), (uint32_t)type, n_in, n_out, width, n_out};
    k_matvec_q8_0_params p8 = {K_TAG_OF(matvec_q8_0), n_in, n_out, width, n_out};
    char err[400];
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    const int warm = 5, iters = 60;
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
    const char *name = type == K_TYPE_Q4_K ? "Q4_K" : type == K_TYPE_Q5_K ? "Q5_K" : type == K_TYPE_Q6_K ? "Q6_K" : "Q8_0";
    printf("BENCH matvec %s tg=%3u n_in=%u n_out=%u width=%2u: %8.1f us/launch, weights %.1f MB, %7.1f GB/s = %4.1f%% of "
           "4300 GB/s%s\n", name, tg, n_in, n_out, width, us, wbytes / 1e6, gbs, 100.0 * gbs / 4300.0,
           st[0] ? " (STATUS RAISED)" : "");
    for (int c = 0; c < copies; c++) cudaFree(dw[c]);
    cudaFree(dx), cudaFree(dy), cudaFree(dstatus);
    free(hw), free(hx);
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

int main(int argc, char **argv) {
    const uint32_t n_in = argc > 2 ? (uint32_t)atoi(argv[1]) : 5120, n_out = argc > 2 ? (uint32_t)atoi(argv[2]) : 17408;
    if (n_in % 256 || n_out == 0) {
        printf("FAIL n_in must be a multiple of 256\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    // Q4_K / Q6_K: a Q4_K_M file's FFN types; widths 1 (decode), 2..16
    // (verify; matvec_kq1 / kq4 / kq serve 1 / 2..4 / 5..16)
    const int types[] = {K_TYPE_Q4_K, K_TYPE_Q6_K, K_TYPE_Q5_K, 0};
    const uint32_t widths[] = {1, 2, 4, 8, 16};
    for (int t = 0; t < 4; t++)
        for (int w = 0; w < 5; w++) bench(types[t], n_in, n_out, widths[w]);
    bench_gdn_argmax();
    return 0;
}
