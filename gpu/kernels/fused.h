/*
 * fused.h — the layer loop's glue fused into the kernels around it, so a
 * decode step launches fewer kernels (issue 19: on the H200 a small kernel
 * costs 4-7 us of GPU time however little it does). Each fused kernel does
 * exactly the operations of the unfused sequence it replaces, in the same
 * order per value, so its outputs are the same bits (tested bit for bit
 * against that sequence under the emulator: gpu/tests/test_gpu_emul.c
 * suite "fused"):
 *
 *   norm_quant    h += y (add_rows); x = rmsnorm(h) * w (rmsnorm); xq =
 *                 quantize_q8_0(x) and/or quantize_q8_K(x)
 *   swiglu_quant  g = SiLU(g) * u (swiglu); gq = quantize_q8_0(g) and/or
 *                 quantize_q8_K(g)
 *   qk_norm_rope  attention's per-head q/k rmsnorm + rope_neox, in place
 *   attn_gate_quant  a *= sigmoid(gate) (attn_gate); aq = quantize(a)
 *
 * (The third fusion, one matvec launch for several matrices reading the
 * same activations, needs no kernel: the runner uploads such matrices as
 * one concatenated matrix, gpu/host/runner.c upload_group.)
 */

/* One threadgroup per row, of the threadgroup size rmsnorm would run this
 * n with (the host's row_tg): thread TID owns elements TID + k T (T =
 * K_TG_SIZE, a multiple of 32) in all three phases, so it only ever reads
 * back its own stores of h and no device memory passes between threads.
 *  1. h = h + y (add_rows' expression) and the sum of squares in rmsnorm's
 *     order: per thread ascending k, SIMD butterfly, partials in ascending
 *     SIMD order; scale = 1/sqrt(sum/n + eps); x = (h * scale) * w.
 *  2. Q8_0: lane j of SIMD-group s owns elements 32 (s + k T/32) + j, i.e.
 *     whole blocks with lane = position: k_q8_0_store, as quantize_q8_0.
 *  3. Q8_K: a 256-block is spread over 8 SIMD-groups' chunks of 32; each
 *     chunk's (|x|, index) winner (k_q8_K_beats, a total order, so the
 *     block's winner does not depend on how it is reduced) goes through
 *     threadgroup memory; after a barrier every chunk takes its block's
 *     winner and k_q8_K_chunk writes its codes and bsums, as quantize_q8_K.
 * x (the float row) is stored only with K_NQ_X: the layer loop's matvecs
 * read the quantized rows only. */
#define K_NQ_AHEAD 8u /* elements per thread loaded ahead (see below) */
K_KERNEL(norm_quant) {
    K_CHECK_TAG(norm_quant);
    K_TG_ARRAY(float, partial, 32);
    K_TG_ARRAY(float, cval, K_NQ_MAX_N / 32u); /* per chunk: the winner's signed value */
    K_TG_ARRAY(float, cidx, K_NQ_MAX_N / 32u); /* and its index in the block */
    const k_u32 fl = p.flags;
    if (p.n > K_NQ_MAX_N || ((fl & K_NQ_Q8_0) && p.n % 32u) || ((fl & K_NQ_Q8_K) && p.n % 256u)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 row = K_GX;
    if (row >= p.n_rows) return; /* a whole threadgroup: no barrier is left waiting */
    const k_u32 base = row * p.stride, T = K_TG_SIZE;
    /* Every phase loads K_NQ_AHEAD of the thread's elements before it uses
     * the first (a loop to the runtime n waited out one load latency per
     * element: ~13 us a launch at n 2048 on the H200, 18% of a MoE decode
     * step); the elements are then taken in the same ascending order, so
     * the sums and the bits are the original loop's. */
    float s = 0.0f;
    for (k_u32 i0 = K_TID; i0 < p.n; i0 += K_NQ_AHEAD * T) {
        float hv[K_NQ_AHEAD], yv[K_NQ_AHEAD];
        K_UNROLL for (k_u32 u = 0; u < K_NQ_AHEAD; u++) {
            const k_u32 i = i0 + u * T;
            hv[u] = i < p.n ? K_LD(h, base + i) : 0.0f;
            yv[u] = (fl & K_NQ_ADD) && i < p.n ? K_LD(y, base + i) : 0.0f;
        }
        K_UNROLL for (k_u32 u = 0; u < K_NQ_AHEAD; u++) {
            const k_u32 i = i0 + u * T;
            if (i >= p.n) break;
            float v = hv[u];
            if (fl & K_NQ_ADD) {
                v = v + yv[u];
                K_ST(h, base + i, v);
            }
            s += v * v;
        }
    }
    s = k_simd_sum(s);
    if (K_LANE == 0) K_ST(partial, K_SIMD, s);
    K_BARRIER();
    float sum = 0.0f;
    for (k_u32 g = 0; g < K_NSIMD; g++) sum += K_LD(partial, g);
    const float mean = sum / (float)p.n;
    const float scale = 1.0f / k_sqrt(mean + p.eps);
    const k_u32 nb0 = p.n / 32u, nbk = p.n / 256u;
    /* (with Q8 output n is a multiple of 32 and T of 32: `i >= n` below
     * holds for a whole SIMD-group at once, so its shuffles stay uniform) */
    for (k_u32 i0 = K_TID; i0 < p.n; i0 += K_NQ_AHEAD * T) {
        float hv[K_NQ_AHEAD], wv[K_NQ_AHEAD];
        K_UNROLL for (k_u32 u = 0; u < K_NQ_AHEAD; u++) {
            const k_u32 i = i0 + u * T;
            hv[u] = i < p.n ? K_LD(h, base + i) : 0.0f;
            wv[u] = i < p.n ? K_LD(w, i) : 0.0f;
        }
        K_UNROLL for (k_u32 u = 0; u < K_NQ_AHEAD; u++) {
            const k_u32 i = i0 + u * T;
            if (i >= p.n) break;
            const float v0 = hv[u] * scale;
            const float xv = v0 * wv[u];
            if (fl & K_NQ_X) K_ST(x, base + i, xv);
            if (fl & K_NQ_Q8_0) k_q8_0_store(xv, K_LANE, q8, (row * nb0 + i / 32u) * 34u);
            if (fl & K_NQ_Q8_K) { /* the chunk's winner, quantize_q8_K's butterfly */
                const float ax = k_fabs(xv);
                const k_u32 c = i / 32u;
                float amax = 0.0f, idx = 1.0e9f, mx = 0.0f;
                if (ax > amax) amax = ax, idx = (float)(32u * (c % 8u) + K_LANE), mx = xv;
                for (k_u32 m = 16u; m >= 1u; m >>= 1) {
                    const float oa = k_shfl_xor(amax, m), oi = k_shfl_xor(idx, m), om = k_shfl_xor(mx, m);
                    if (k_q8_K_beats(oa, oi, amax, idx)) amax = oa, idx = oi, mx = om;
                }
                if (K_LANE == 0) {
                    K_ST(cval, c, mx);
                    K_ST(cidx, c, idx);
                }
            }
        }
    }
    if (!(fl & K_NQ_Q8_K)) return; /* uniform: params */
#ifndef PLANT_FUSED_NO_BARRIER /* planted fault (tests must turn red): chunk winners read unsynchronised */
    K_BARRIER();
#endif
    for (k_u32 i0 = K_TID; i0 < p.n; i0 += K_NQ_AHEAD * T) {
        float hv[K_NQ_AHEAD], wv[K_NQ_AHEAD];
        K_UNROLL for (k_u32 u = 0; u < K_NQ_AHEAD; u++) {
            const k_u32 i = i0 + u * T;
            hv[u] = i < p.n ? K_LD(h, base + i) : 0.0f;
            wv[u] = i < p.n ? K_LD(w, i) : 0.0f;
        }
        K_UNROLL for (k_u32 u = 0; u < K_NQ_AHEAD; u++) {
            const k_u32 i = i0 + u * T;
            if (i >= p.n) break;
            const float v0 = hv[u] * scale;
            const float xv = v0 * wv[u];
            const k_u32 c = i / 32u, blk = c / 8u;
            float amax = 0.0f, idx = 1.0e9f, mx = 0.0f;
            for (k_u32 j = 0; j < 8u; j++) {
                const float cv = K_LD(cval, 8u * blk + j), ci = K_LD(cidx, 8u * blk + j), ca = k_fabs(cv);
                if (k_q8_K_beats(ca, ci, amax, idx)) amax = ca, idx = ci, mx = cv;
            }
            k_q8_K_chunk(xv, amax, mx, K_LANE, c % 8u, qk, (row * nbk + blk) * 292u);
        }
    }
}

/* One SIMD-group per unit of U values of a row (U = 256 with K_NQ_Q8_K,
 * else 32), lane l holding values l + 32 i (i < U/32): g = SiLU(g) * u as
 * swiglu computes it (g at gu[row stride + i], u at gu[row stride + up_off
 * + i]: the FFN's gate and up matvecs write one row [g | u], in one launch
 * when their weights are concatenated), then the Q8_0 blocks (k_q8_0_store
 * per 32) and/or the Q8_K block (quantize_q8_K's max and k_q8_K_chunk),
 * rows of n values. The float g is not stored: only the down projection
 * reads it, quantized. */
K_KERNEL(swiglu_quant) {
    K_CHECK_TAG(swiglu_quant);
    const k_u32 fl = p.flags, U = (fl & K_NQ_Q8_K) ? 256u : 32u;
    if (p.n % U || p.n == 0u || p.up_off < p.n || p.stride < p.up_off + p.n) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 per = p.n / U, unit = K_GX * K_NSIMD + K_SIMD;
    if (unit >= p.n_rows * per) return; /* a whole SIMD-group; no barriers here */
    const k_u32 row = unit / per, i0 = (unit % per) * U, xo = row * p.n + i0, go = row * p.stride + i0;
    float v[8];
    float amax = 0.0f, idx = 1.0e9f, mx = 0.0f;
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) {
        v[i] = 0.0f;
        if (32u * i >= U) continue;
        const k_u32 e = go + K_LANE + 32u * i;
        const float g = K_LD(gu, e);
#ifdef PLANT_FUSED_SWIGLU_ORDER /* planted fault (tests must turn red): SiLU(g) * u regrouped */
        v[i] = g * (K_LD(gu, e + p.up_off) / (1.0f + k_exp(-g)));
#else
        v[i] = (g / (1.0f + k_exp(-g))) * K_LD(gu, e + p.up_off);
#endif
        if (fl & K_NQ_Q8_0) k_q8_0_store(v[i], K_LANE, q8, (xo + 32u * i) / 32u * 34u);
        const float ax = k_fabs(v[i]);
        if (ax > amax) amax = ax, idx = (float)(K_LANE + 32u * i), mx = v[i];
    }
    if (!(fl & K_NQ_Q8_K)) return;
    for (k_u32 m = 16u; m >= 1u; m >>= 1) {
        const float oa = k_shfl_xor(amax, m), oi = k_shfl_xor(idx, m), om = k_shfl_xor(mx, m);
        if (k_q8_K_beats(oa, oi, amax, idx)) amax = oa, idx = oi, mx = om;
    }
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) k_q8_K_chunk(v[i], amax, mx, K_LANE, i, qk, xo / 256u * 292u);
}

/* Attention's per-head q and k RMSNorm followed by the partial NEOX RoPE,
 * in place, one threadgroup per (head, token) — q heads then k heads along
 * K_GX, tokens along K_GY — of rmsnorm's size for head_dim (the host's
 * row_tg): the sum of squares, the scale and y = (x * scale) * w in
 * rmsnorm's order (a row of the unfused launch over all heads is one
 * threadgroup there too, so the same bits), then, through threadgroup
 * memory after a barrier, the pairs (i, i + n_rot/2) rotated exactly as
 * rope_neox does (lo c + (-hi) s, hi c + lo s); dims past n_rot are stored
 * as normed. Every thread reads only its own elements of x, all before the
 * barrier; the rotated pairs are written after it. Replaces rmsnorm x2 +
 * rope_neox x2 (which wrote separate buffers: the layer loop reads the
 * normed rows only, and the gate halves of q's rows are untouched). */
K_KERNEL(qk_norm_rope) {
    K_CHECK_TAG(qk_norm_rope);
    K_TG_ARRAY(float, partial, 32);
    K_TG_ARRAY(float, yr, K_ATTN_MAX_DIM);
    if (p.n_rot % 2u || p.n_rot > p.head_dim || p.head_dim > K_ATTN_MAX_DIM) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 hh = K_GX, t = K_GY;
    if (hh >= p.n_head + p.n_head_kv || t >= p.n_rows) return; /* a whole threadgroup */
    const k_u32 isq = hh < p.n_head;
    const k_u32 base = isq ? t * p.q_stride + hh * p.q_head_stride : t * p.k_stride + (hh - p.n_head) * p.head_dim;
    K_DEV float *xr = isq ? q + base : k + base;
    const k_u32 wo = isq ? 0u : p.head_dim; /* w: q_norm then k_norm */
    float s = 0.0f;
    for (k_u32 i = K_TID; i < p.head_dim; i += K_TG_SIZE) {
        const float v = K_LD(xr, i);
        s += v * v;
    }
    s = k_simd_sum(s);
    if (K_LANE == 0) K_ST(partial, K_SIMD, s);
    K_BARRIER();
    float sum = 0.0f;
    for (k_u32 g = 0; g < K_NSIMD; g++) sum += K_LD(partial, g);
    const float mean = sum / (float)p.head_dim;
    const float scale = 1.0f / k_sqrt(mean + p.eps);
    for (k_u32 i = K_TID; i < p.head_dim; i += K_TG_SIZE) {
        const float v = K_LD(xr, i) * scale;
        const float y = v * K_LD(w, wo + i);
        if (i < p.n_rot) K_ST(yr, i, y);
        else K_ST(xr, i, y);
    }
#ifndef PLANT_FUSED_ROPE_NO_BARRIER /* planted fault (tests must turn red): pairs read unsynchronised */
    K_BARRIER();
#endif
    const k_u32 half = p.n_rot / 2u;
    for (k_u32 i = K_TID; i < half; i += K_TG_SIZE) {
        const float lo = K_LD(yr, i), hi = K_LD(yr, i + half);
        const float c = K_LD(cs, t * half + i), sn_ = K_LD(sn, t * half + i);
        K_ST(xr, i, lo * c + (-hi) * sn_);
        K_ST(xr, i + half, hi * c + lo * sn_);
    }
}

/* Attention's output gate and the o projection's activation quantizer:
 * a[t][h][d] * sigmoid(qf[t][2h+1][d]) exactly as attn_gate computes it,
 * then the row's (n_head * head_dim values) Q8_0 blocks (k_q8_0_store per
 * 32) and/or Q8_K block (quantize_q8_K's max and k_q8_K_chunk). One
 * SIMD-group per 256 values with K_NQ_Q8_K, else per 32; lane l holds
 * values l + 32 i. The gated floats are not stored (only the o projection
 * reads them, quantized). Replaces attn_gate + quantize. */
K_KERNEL(attn_gate_quant) {
    K_CHECK_TAG(attn_gate_quant);
    const k_u32 fl = p.flags, U = (fl & K_NQ_Q8_K) ? 256u : 32u, n = p.n_head * p.head_dim;
    if (n % U || n == 0u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 per = n / U, unit = K_GX * K_NSIMD + K_SIMD;
    if (unit >= p.n_rows * per) return; /* a whole SIMD-group; no barriers here */
    const k_u32 t = unit / per, xo = t * n + (unit % per) * U;
    float v[8];
    float amax = 0.0f, idx = 1.0e9f, mx = 0.0f;
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) {
        v[i] = 0.0f;
        if (32u * i >= U) continue;
        const k_u32 e = xo + K_LANE + 32u * i, j = e - t * n, h = j / p.head_dim, d = j % p.head_dim;
        const float g = K_LD(qf, t * p.qf_stride + (2u * h + 1u) * p.head_dim + d);
        v[i] = K_LD(a, e) * (1.0f / (1.0f + k_exp(-g)));
        if (fl & K_NQ_Q8_0) k_q8_0_store(v[i], K_LANE, q8, (xo + 32u * i) / 32u * 34u);
        const float ax = k_fabs(v[i]);
        if (ax > amax) amax = ax, idx = (float)(K_LANE + 32u * i), mx = v[i];
    }
    if (!(fl & K_NQ_Q8_K)) return;
    for (k_u32 m = 16u; m >= 1u; m >>= 1) {
        const float oa = k_shfl_xor(amax, m), oi = k_shfl_xor(idx, m), om = k_shfl_xor(mx, m);
#ifdef PLANT_FUSED_GATE_LAST_TIE /* planted fault (tests must turn red): |max| ties to the higher index */
        if (oa > amax || (oa == amax && oi > idx)) amax = oa, idx = oi, mx = om;
#else
        if (k_q8_K_beats(oa, oi, amax, idx)) amax = oa, idx = oi, mx = om;
#endif
    }
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) k_q8_K_chunk(v[i], amax, mx, K_LANE, i, qk, xo / 256u * 292u);
}
