/*
 * rmsnorm.h — y = x / sqrt(mean(x^2) + eps) * w, one threadgroup per row.
 *
 * Sum of squares: each thread sums its elements (stride K_TG_SIZE) in
 * float, the SIMD-groups reduce by butterfly, then every thread adds the
 * SIMD-group partials in ascending order (the same bits in all threads).
 * The CPU sums in double (csrc/forward/norm.c); Metal has no double, so
 * this is not bit-identical: the tolerance is derived in docs/gpu.md
 * ("RMSNorm") and tested. A row's result depends only on n and the
 * threadgroup size, never on how many rows are launched.
 */
K_KERNEL(rmsnorm) {
    K_CHECK_TAG(rmsnorm);
    K_TG_ARRAY(float, partial, 32);
    const k_u32 row = K_GX;
    if (row >= p.n_rows) return; /* a whole threadgroup: no barrier is left waiting */
    K_DEV_IN float *xr = x + row * p.stride;
    K_DEV float *yr = y + row * K_RMSNORM_YSTRIDE(p);
    float s = 0.0f;
    for (k_u32 i = K_TID; i < p.n; i += K_TG_SIZE) {
        const float v = K_LD(xr, i);
        s += v * v;
    }
    s = k_simd_sum(s);
    if (K_LANE == 0) K_ST(partial, K_SIMD, s);
#ifdef PLANT_BARRIER_DIVERGENCE
    if (K_TID == K_TG_SIZE - 1u) return; /* planted fault: one thread skips the barrier */
#endif
    K_BARRIER();
    float sum = 0.0f;
    for (k_u32 g = 0; g < K_NSIMD; g++) sum += K_LD(partial, g);
    const float mean = sum / (float)p.n;
    const float scale = 1.0f / k_sqrt(mean + p.eps);
    for (k_u32 i = K_TID; i < p.n; i += K_TG_SIZE) {
        const float v = K_LD(xr, i) * scale;
        K_ST(yr, i, p.has_w ? v * K_LD(w, i) : v);
    }
}
