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
 * K_TG_SIZE, a multiple of 32) in the first two phases, so it only ever
 * reads back its own stores of h (no device memory passes between threads:
 * a Metal threadgroup barrier orders threadgroup memory only).
 *  1. h = h + y (add_rows' expression) and the sum of squares in rmsnorm's
 *     order: per thread ascending k, SIMD butterfly, partials in ascending
 *     SIMD order; scale = 1/sqrt(sum/n + eps); x = (h * scale) * w.
 *  2. Q8_0: lane j of SIMD-group s owns elements 32 (s + k T/32) + j, i.e.
 *     whole blocks with lane = position: k_q8_0_store, as quantize_q8_0.
 *     Q8_K: x goes to threadgroup memory (xs).
 *  3. Q8_K, after a barrier: SIMD-group s quantizes blocks s, s + T/32, ...
 *     from xs exactly as quantize_q8_K does (k_q8_K_block_max, then
 *     k_q8_K_chunk per 32). (Until 2026-12-06 each 32-chunk's winner went
 *     through threadgroup memory and every thread scanned its block's 8
 *     winners per element: 11 us a launch at n 5120 on the H100, issue-bound
 *     on its one SM, 11% of a 27B-like decode step.)
 * x (the float row) is stored only with K_NQ_X: the layer loop's matvecs
 * read the quantized rows only. */
#define K_NQ_AHEAD 8u /* elements per thread loaded ahead (see below) */
K_KERNEL(norm_quant) {
    K_CHECK_TAG(norm_quant);
    K_TG_ARRAY(float, partial, 32);
    K_TG_ARRAY(float, xs, K_NQ_MAX_N); /* the row's x, for the Q8_K blocks */
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
            /* (n a multiple of 32 here and T too: `i >= n` above holds for a
             * whole SIMD-group at once, so the store's shuffles stay uniform) */
            if (fl & K_NQ_Q8_0) k_q8_0_store(xv, K_LANE, q8, (row * nb0 + i / 32u) * 34u);
            if (fl & K_NQ_Q8_K) K_ST(xs, i, xv);
        }
    }
    if (!(fl & K_NQ_Q8_K)) return; /* uniform: params */
#ifndef PLANT_FUSED_NO_BARRIER /* planted fault (tests must turn red): xs read unsynchronised */
    K_BARRIER();
#endif
    for (k_u32 blk = K_SIMD; blk < nbk; blk += K_NSIMD) { /* uniform per SIMD-group */
        k_q8_K_lanes X;
        K_UNROLL for (k_u32 i = 0; i < 8u; i++) X.v[i] = K_LD(xs, 256u * blk + K_LANE + 32u * i);
        const k_q8_K_win W = k_q8_K_block_max(X, K_LANE);
        K_UNROLL for (k_u32 i = 0; i < 8u; i++)
            k_q8_K_chunk(X.v[i], W.amax, W.mx, K_LANE, i, qk, (row * nbk + blk) * 292u);
    }
}

/* The stores of swiglu_quant and attn_gate_quant for one SIMD-group: the
 * whole block X (`whole`: chunks 0..7 of it, Q8_0 blocks c8 .. c8 + 7)
 * or chunk `sub` of it (value vs, Q8_0 block c8), Q8_0 (k_q8_0_store)
 * and/or Q8_K (k_q8_K_block_max of the block, k_q8_K_chunk at qk[ko]). */
K_FN void k_fused_store(const k_q8_K_lanes X, float vs, k_u32 fl, k_u32 whole, k_u32 lane, k_u32 sub,
                        K_DEV k_u8 *q8, k_u32 c8, K_DEV k_u8 *qk, k_u32 ko) {
    if (fl & K_NQ_Q8_0) {
        if (whole)
            K_UNROLL for (k_u32 i = 0; i < 8u; i++) k_q8_0_store(X.v[i], lane, q8, (c8 + i) * 34u);
        else
            k_q8_0_store(vs, lane, q8, c8 * 34u);
    }
    if (!(fl & K_NQ_Q8_K)) return;
    const k_q8_K_win W = k_q8_K_block_max(X, lane);
    if (whole)
        K_UNROLL for (k_u32 i = 0; i < 8u; i++) k_q8_K_chunk(X.v[i], W.amax, W.mx, lane, i, qk, ko);
    else
        k_q8_K_chunk(vs, W.amax, W.mx, lane, sub, qk, ko);
}

/* g = SiLU(g) * u as swiglu computes it (g at gu[row stride + i], u at
 * gu[row stride + up_off + i]: the FFN's gate and up matvecs write one row
 * [g | u], in one launch when their weights are concatenated), then its
 * Q8_0 blocks (k_q8_0_store per 32) and/or Q8_K blocks (k_q8_K_block_max,
 * then k_q8_K_chunk per 32), as swiglu + quantize. One SIMD-group per 32
 * values: with K_NQ_Q8_K each of a block's 8 SIMD-groups computes all 256
 * values (lane l: l + 32 i) and the block's max (the same winner in all 8)
 * and writes its own chunk, so a decode step's chain is one chunk long
 * (one SIMD-group per block, until 2026-12-06: 8.5 us a launch at n 17408
 * on the H100, 17 threadgroups on 132 SMs); with K_NQ_BLOCKS too (the
 * host's choice for many rows) one SIMD-group per block writes all 8
 * chunks, without the recomputation. The float g is not stored: only the
 * down projection reads it, quantized. */
K_KERNEL(swiglu_quant) {
    K_CHECK_TAG(swiglu_quant);
    const k_u32 fl = p.flags, U = (fl & K_NQ_Q8_K) ? 256u : 32u, uv = K_FUSED_UNIT_VALUES(fl);
    if (p.n % U || p.n == 0u || p.up_off < p.n || p.stride < p.up_off + p.n) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 per = p.n / uv, unit = K_GX * K_NSIMD + K_SIMD;
    if (unit >= p.n_rows * per) return; /* a whole SIMD-group; no barriers here */
    /* chunk ch (of 32 values) and, with Q8_K, its place in its block */
    const k_u32 row = unit / per, ch = (unit % per) * (uv / 32u), sub = (fl & K_NQ_Q8_K) ? ch % 8u : 0u;
    const k_u32 go = row * p.stride + (ch - sub) * 32u; /* the first value this SIMD-group computes */
    const k_u32 nv = U / 32u;
    k_q8_K_lanes X;
    float vs = 0.0f; /* lane's value of chunk ch */
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) {
        X.v[i] = 0.0f;
        if (i >= nv) continue;
        const k_u32 e = go + K_LANE + 32u * i;
        const float g = K_LD(gu, e);
#ifdef PLANT_FUSED_SWIGLU_ORDER /* planted fault (tests must turn red): SiLU(g) * u regrouped */
        X.v[i] = g * (K_LD(gu, e + p.up_off) / (1.0f + k_exp(-g)));
#else
        X.v[i] = (g / (1.0f + k_exp(-g))) * K_LD(gu, e + p.up_off);
#endif
        if (i == sub) vs = X.v[i];
    }
    k_fused_store(X, vs, fl, uv == 256u, K_LANE, sub, q8, row * (p.n / 32u) + ch, qk, (row * (p.n / 256u) + ch / 8u) * 292u);
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
 * then the row's (n_head * head_dim values) Q8_0 and/or Q8_K blocks
 * (k_fused_store), SIMD-groups per 32 or 256 values as swiglu_quant. The
 * gated floats are not stored (only the o projection reads them,
 * quantized). Replaces attn_gate + quantize. */
K_KERNEL(attn_gate_quant) {
    K_CHECK_TAG(attn_gate_quant);
    const k_u32 fl = p.flags, U = (fl & K_NQ_Q8_K) ? 256u : 32u, n = p.n_head * p.head_dim, uv = K_FUSED_UNIT_VALUES(fl);
    if (n % U || n == 0u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 per = n / uv, unit = K_GX * K_NSIMD + K_SIMD;
    if (unit >= p.n_rows * per) return; /* a whole SIMD-group; no barriers here */
    const k_u32 t = unit / per, ch = (unit % per) * (uv / 32u), sub = (fl & K_NQ_Q8_K) ? ch % 8u : 0u;
    const k_u32 xo = t * n + (ch - sub) * 32u, nv = U / 32u;
    k_q8_K_lanes X;
    float vs = 0.0f; /* lane's value of chunk ch */
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) {
        X.v[i] = 0.0f;
        if (i >= nv) continue;
        const k_u32 e = xo + K_LANE + 32u * i, j = e - t * n, h = j / p.head_dim, d = j % p.head_dim;
        const float g = K_LD(qf, t * p.qf_stride + (2u * h + 1u) * p.head_dim + d);
        X.v[i] = K_LD(a, e) * (1.0f / (1.0f + k_exp(-g)));
        if (i == sub) vs = X.v[i];
    }
    k_fused_store(X, vs, fl, uv == 256u, K_LANE, sub, q8, t * (n / 32u) + ch, qk, (t * (n / 256u) + ch / 8u) * 292u);
}
