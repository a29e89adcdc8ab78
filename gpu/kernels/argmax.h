/*
 * argmax.h — the LM head's greedy choice on the device, so decoding copies
 * back 4 bytes per row, not a vocabulary.
 */

/* (v, i) comes before (bv, bi): larger value, then lower index. NaN never
 * does (NaN rows are reported apart). */
#ifdef PLANT_ARGMAX_LAST_TIE
/* planted fault (tests must turn red): ties to the highest index */
K_FN int k_before(float v, float i, float bv, float bi) { return v > bv || (v == bv && (i > bi || bi >= 16777216.0f)); }
#else
K_FN int k_before(float v, float i, float bv, float bi) { return v > bv || (v == bv && i < bi); }
#endif

/* One threadgroup per row. Round 0 is the argmax (the CPU's strict-> scan,
 * csrc/spec_round.c argmax_row: the first index of the largest value, 0
 * for a row of -inf); round r < k finds the best element strictly after
 * round r-1's in (value desc, index asc) order: the top-k, k passes over
 * the row. A row holding a NaN gets K_ARGMAX_NAN in every slot (the CPU
 * refuses it: a greedy choice on a broken row would be silently wrong);
 * slots past the row's non-NaN count hold K_ARGMAX_NONE. Indices travel as
 * floats through the shuffles (exact: n < 2^24 is checked). */
#define K_ARGMAX_AHEAD 8u
K_KERNEL(argmax_rows) {
    K_CHECK_TAG(argmax_rows);
    if (p.k > K_TOPK_MAX || p.n == 0u || p.n >= (1u << 24)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    K_TG_ARRAY(float, pv, 32);
    K_TG_ARRAY(float, pi, 32);
    const k_u32 row = K_GX;
    if (row >= p.n_rows) return; /* a whole threadgroup */
    K_DEV_IN float *xr = x + row * p.stride;
    const k_u32 rounds = p.k > 1u ? p.k : 1u, out = row * (1u + K_TOPK_MAX);
    float prev_v = 0.0f, prev_i = -1.0f; /* round 0: no previous */
    float nan_seen = 0.0f;
    for (k_u32 r = 0; r < rounds; r++) {
        float bv = K_NEG_INF, bi = 16777216.0f; /* sentinel index: none */
        /* K_ARGMAX_AHEAD of the thread's values loaded before the first is
         * compared (one thread walks ~240 values of a 248k vocabulary: a
         * load latency each made this one-SM kernel ~0.1 ms a step). The
         * winner is the same whatever the visiting order: k_before is a
         * total order. */
        for (k_u32 i0 = K_TID; i0 < p.n; i0 += K_ARGMAX_AHEAD * K_TG_SIZE) {
            float v8[K_ARGMAX_AHEAD];
            K_UNROLL for (k_u32 u = 0; u < K_ARGMAX_AHEAD; u++) {
                const k_u32 i = i0 + u * K_TG_SIZE;
                v8[u] = i < p.n ? K_LD(xr, i) : 0.0f;
            }
            K_UNROLL for (k_u32 u = 0; u < K_ARGMAX_AHEAD; u++) {
                const k_u32 i = i0 + u * K_TG_SIZE;
                if (i >= p.n) break;
                const float v = v8[u], fi = (float)i;
                if (!(v == v)) {
                    nan_seen = 1.0f;
                    continue;
                }
                if (r > 0u && !k_before(prev_v, prev_i, v, fi)) continue; /* not after prev */
                if (k_before(v, fi, bv, bi)) bv = v, bi = fi;
            }
        }
        for (k_u32 m = 16u; m >= 1u; m >>= 1) {
            const float ov = k_shfl_xor(bv, m), oi = k_shfl_xor(bi, m), on = k_shfl_xor(nan_seen, m);
            if (k_before(ov, oi, bv, bi)) bv = ov, bi = oi;
            nan_seen = nan_seen > on ? nan_seen : on;
        }
        if (K_LANE == 0u) {
            K_ST(pv, K_SIMD, bv);
            K_ST(pi, K_SIMD, nan_seen > 0.0f ? -bi - 1.0f : bi); /* the NaN flag rides on the sign */
        }
        K_BARRIER();
        bv = K_NEG_INF, bi = 16777216.0f;
        for (k_u32 g = 0; g < K_NSIMD; g++) {
            float gi = K_LD(pi, g);
            if (gi < 0.0f) nan_seen = 1.0f, gi = -gi - 1.0f;
            if (k_before(K_LD(pv, g), gi, bv, bi)) bv = K_LD(pv, g), bi = gi;
        }
        K_BARRIER(); /* pv, pi are read by every thread before the next round writes them */
        if (K_TID == 0u) {
            const k_u32 res = nan_seen > 0.0f ? K_ARGMAX_NAN : bi >= 16777216.0f ? K_ARGMAX_NONE : (k_u32)bi;
            if (r == 0u) K_ST(idx, out, res);
            if (p.k > 0u) K_ST(idx, out + 1u + r, res);
        }
        prev_v = bv, prev_i = bi;
    }
}
