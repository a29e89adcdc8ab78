/*
 * moe.h — the routed mixture-of-experts FFN of qwen35moe (csrc/forward/moe.c,
 * qwen35-spec.md §5) on the device, in four kernels:
 *
 *   moe_logits   the F32 router (and the shared expert's F32 gate as one
 *                more row): a float matvec, one threadgroup per output row,
 *                its SIMD-groups splitting the row (a fixed order per split)
 *   moe_route    per token row: softmax over all experts, top-k (ties to
 *                the lower expert id), renormalisation with the
 *                6.103515625e-5 clamp, sigmoid of the shared gate
 *   moe_gate_up  per (token row, slot) pair and output row: the selected
 *                expert's gate and up dots, read INDIRECTLY through the
 *                expert id on the device (only routed experts' rows are
 *                read), then SwiGLU; the shared expert is one more pair
 *   moe_down     per (token row, output row): the selected experts' down
 *                dots, each times its route weight, summed in slot order
 *                0..k-1, then + sigmoid(gate) * the shared expert's down
 *
 * Between gate_up and down the host quantizes the SwiGLU rows with the
 * existing quantize_q8_0 / quantize_q8_K kernels (the down projection's
 * activation type), as the CPU's ds4_matmul does.
 *
 * Numerics. Every expert dot is the dense matvec's dot of the same type
 * bit for bit (k_moe_dot_kq / k_moe_dot_q8_0 below run the row summation
 * order of matvec_kq* / matvec_q8_0: docs/gpu.md §4), so the tolerance
 * against the CPU is the matvec's. The router is F32 x F32 in float (the
 * CPU's AVX dot has its own order), the softmax sums in float where the
 * CPU's fast path sums in double (Metal has no double), exp is the
 * target's: the route weights are within a stated relative bound of the
 * exact ones (gpu/tests/test_gpu_moe.h; the CPU's are too), and the chosen
 * experts are the CPU's whenever the k-th and (k+1)-th probabilities are
 * not within it. A row's
 * result never depends on how many rows share the launch (no value
 * crosses rows; per-row orders are fixed).
 */

/* One weight row against one activation row, Q8_0 x Q8_0: matvec_q8_0's
 * order and window helpers (quant_q8_0.h THE ORDER). wo: the matrix's
 * byte offset in w (the device layout: rows of 32 nb codes then nb fp16
 * scales); xo: the activation row's in xq (the file's 34-byte blocks).
 * All 32 lanes call it with the same trip count (the window sums
 * shuffle); every lane returns the row's value. */
K_FN float k_moe_dot_q8_0(K_DEV_IN k_u8 *w, k_u32 wo, k_u32 row, k_u32 n_in, K_DEV_IN k_u8 *xq, k_u32 xo,
                          k_u32 lane) {
    const k_u32 nb = n_in / 32u, rb = 34u * nb, wr = wo + row * rb, add = k_q8_0_adder(lane);
    const k_u32 a16 = wo % 16u == 0u && rb % 16u == 0u;
    float acc = 0.0f;
    for (k_u32 w0 = 0; w0 < nb; w0 += 32u) {
        const k_q8w_window W = k_q8w_window_load(w, wr, nb, w0, lane, a16);
        const k_u32 ib = w0 + add;
        const int sumi = k_q8_0_window_sumi(W, xq, xo, nb, w0, lane);
        if (ib < nb)
            acc += (float)sumi * (k_h2f((k_u16)k_ld_u16_at((K_DEV_IN k_u16 *)w, k_q8w_scale_at(wr, nb, ib))) *
                                  k_h2f((k_u16)k_ld_u16_at((K_DEV_IN k_u16 *)xq, xo + 34u * ib)));
    }
    return k_matvec_row_sum(acc);
}

/* One weight row against one Q8_K activation row, Q4_K / Q5_K / Q6_K:
 * matvec_kq*'s order (quant_kq.h) as its one-row-per-SIMD-group variant
 * runs it (quant_kq.h K_KQ_ORDER): octet P serves super-blocks ib = P,
 * P + 4, ... ascending, the octet's integer pair per block and its two
 * float terms, then ((S0 + S1) + S2) + S3. The same weight loaders
 * (k_kq45_load / k_kq6_load) and integer dot; wo / xo are byte offsets of
 * the matrix (16-aligned for Q4_K/Q5_K: whole matrices of 144/176-byte
 * blocks) and of the activation row (292-byte blocks: 4-aligned). All 32
 * lanes run the first octet's trip count (order 2 shuffles inside the
 * loop), and every lane returns the row's value. */
K_FN float k_moe_dot_kq(K_DEV_IN k_u8 *w, k_u32 wo, k_u32 row, k_u32 type, k_u32 n_in, K_DEV_IN k_u8 *xq,
                        k_u32 xo, k_u32 lane) {
    const k_u32 nb = n_in / 256u, bs = K_KQ_BLOCK_BYTES(type), t = lane & 7u, q6 = type == K_TYPE_Q6_K;
    K_DEV_IN k_u32x4 *w4 = (K_DEV_IN k_u32x4 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    const k_u32 xlo = 1u + (q6 ? 32u * (t >> 2) + 2u * (t & 3u) : 16u * (t >> 1) + 4u * (t & 1u));
    const k_u32 bsw = 65u + 2u * (t >> 1), bsh = 16u * (t & 1u);
    float acc = 0.0f;
#if K_KQ_ORDER == 2
    /* the octet's integer butterflies need all 32 lanes at every trip: the
     * trip count is the first octet's, a block past the row's end is
     * computed on block 0 and not added */
    for (k_u32 ib0 = 0; ib0 < nb; ib0 += 4u) {
        const k_u32 ib = ib0 + (lane >> 3), valid = ib < nb, ibc = valid ? ib : 0u;
#else
    for (k_u32 ib = lane >> 3; ib < nb; ib += 4u) {
        const k_u32 ibc = ib;
#endif
        const k_u32 blk = row * nb + ibc;
        const k_kq_lane L = q6 ? k_kq6_load(w16, wo + blk * 210u, t) : k_kq45_load(w4, wo / 16u + blk * (bs / 16u), type, t);
        const k_u32 xb = xo / 4u + ibc * 73u;
        const k_kq_xw X = k_kq_xwords(x32, xb, xlo, q6);
        const int part = k_kq_part(L, X);
        const float dx = k_bits_f32(K_LD(x32, xb));
        int mpart = 0;
        if (!q6) {
            const k_u32 b0 = (K_LD(x32, xb + bsw) >> bsh) & 0xffffu, b1 = (K_LD(x32, xb + bsw + 1u) >> bsh) & 0xffffu;
            mpart = L.m_lo * ((int)b0 - (b0 & 0x8000u ? 65536 : 0)) + L.m_hi * ((int)b1 - (b1 & 0x8000u ? 65536 : 0));
        }
#if K_KQ_ORDER == 2
        const int S = k_octet_isum(part), M = k_octet_isum(mpart);
        if (valid) {
            acc += (L.d * dx) * (float)S;
            if (!q6) acc -= (L.dmin * dx) * (float)M;
        }
#else
        acc += (L.d * dx) * (float)part;
        if (!q6) acc -= (L.dmin * dx) * (float)mpart;
#endif
    }
#if K_KQ_ORDER == 2
    /* ((S0 + S1) + S2) + S3: the octets' chains, in every lane */
    const k_u32 base = lane & 7u;
    const float a0 = k_bits_f32((k_u32)k_shfl_at_i(k_f32_bits(acc), base));
    const float a1 = k_bits_f32((k_u32)k_shfl_at_i(k_f32_bits(acc), base + 8u));
    const float a2 = k_bits_f32((k_u32)k_shfl_at_i(k_f32_bits(acc), base + 16u));
    const float a3 = k_bits_f32((k_u32)k_shfl_at_i(k_f32_bits(acc), base + 24u));
    return ((a0 + a1) + a2) + a3;
#else
    float s = k_octet_sum(acc);
    s = s + k_shfl_xor(s, 8u);
    s = s + k_shfl_xor(s, 16u);
    return s;
#endif
}

/* Row `row` of the matrix at byte wo of w (a ggml type the GPU has a
 * matvec for) against the activation row at byte xo of xq (Q8_0 for Q8_0
 * weights, Q8_K for the K-quants). `type` is uniform over the SIMD-group. */
K_FN float k_moe_dot(K_DEV_IN k_u8 *w, k_u32 wo, k_u32 row, k_u32 type, k_u32 n_in, K_DEV_IN k_u8 *xq, k_u32 xo,
                     k_u32 lane) {
    if (type == K_TYPE_Q8_0) return k_moe_dot_q8_0(w, wo, row, n_in, xq, xo, lane);
    return k_moe_dot_kq(w, wo, row, type, n_in, xq, xo, lane);
}

/* y[r][o] = W_o . x_r in float, W F32 rows of n_in, one threadgroup per
 * output row, its S = K_NSIMD SIMD-groups splitting n_in: SIMD-group s
 * takes the chunk [s c, (s + 1) c), c = 32 ceil(n_in / (32 S)); lane l adds
 * w[i] * x[i] for i = s c + l, s c + l + 32, ... in ascending order, then
 * k_simd_sum; the S partials are added in ascending s. A fixed order for a
 * given S (the host launches one S for every width: a row's value never
 * depends on n_rows). Token rows go in blocks of K_MATVEC_MAX_ROWS sharing
 * each weight load.
 *
 * Why the split: with one SIMD-group per router row, the 35B-A3B-like
 * router (2048 x 257 floats, 2 MB) ran as 257 SIMD-groups with ~130 KB in
 * flight on the whole H200, at ~135 GB/s: 15.5 us, 10.8% of the MoE decode
 * step (docs/gpu.md). S SIMD-groups per row put S times more loads in
 * flight. S = 1 is the old order. */
#ifndef K_MOE_LOGITS_AHEAD
/* A lane's weight loads in flight per trip. 16 measured worse on the H200
 * (2026-11-30, the 35B-A3B-like MoE: 17.8 us a decode launch against 15.5 at
 * 4, and prefill 935 -> 751 tok/s: with 16 activation rows a SIMD-group
 * holds 16 x 16 x values). */
#define K_MOE_LOGITS_AHEAD 4u
#endif
/* the most SIMD-groups a router row may be split over (the partials' array) */
#define K_MOE_LOGITS_MAX_SPLIT 32u
K_KERNEL(moe_logits) {
    K_CHECK_TAG(moe_logits);
    K_TG_ARRAY(float, part, K_MOE_LOGITS_MAX_SPLIT * K_MATVEC_MAX_ROWS);
    if (p.n_in == 0u || p.n_rows == 0u || K_NGX < p.n_out || K_NSIMD > K_MOE_LOGITS_MAX_SPLIT) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 o = K_GX, S = K_NSIMD, sg = K_SIMD;
    if (o >= p.n_out) return; /* a whole threadgroup: no barrier is left waiting */
    const k_u32 c = 32u * ((p.n_in + 32u * S - 1u) / (32u * S));
    const k_u32 i0 = sg * c, i1 = i0 + c < p.n_in ? i0 + c : p.n_in;
    for (k_u32 r0 = 0; r0 < p.n_rows; r0 += K_MATVEC_MAX_ROWS) {
        float acc[K_MATVEC_MAX_ROWS];
        K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) acc[r] = 0.0f;
        /* K_MOE_LOGITS_AHEAD of the lane's inputs per trip, their loads
         * issued before the sums: a loop of one load-then-add per trip waits
         * a memory latency each time (48 us for the 35B-A3B-like router's 64
         * trips on the H200, a quarter of the MoE decode step). Each acc[r]
         * still adds i, i + 32, i + 64, ... in ascending order: the same
         * bits for any K_MOE_LOGITS_AHEAD. */
        k_u32 i = i0 + K_LANE;
        for (; i + 32u * (K_MOE_LOGITS_AHEAD - 1u) < i1; i += 32u * K_MOE_LOGITS_AHEAD) {
            const k_u32 wi = o * p.n_in + i;
            float wv[K_MOE_LOGITS_AHEAD];
            K_UNROLL for (k_u32 u = 0; u < K_MOE_LOGITS_AHEAD; u++) wv[u] = K_LD(w, wi + 32u * u);
            K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
                if (r0 + r >= p.n_rows) continue;
                const k_u32 xi = (r0 + r) * p.x_stride + i;
                float xv[K_MOE_LOGITS_AHEAD];
                K_UNROLL for (k_u32 u = 0; u < K_MOE_LOGITS_AHEAD; u++) xv[u] = K_LD(x, xi + 32u * u);
                K_UNROLL for (k_u32 u = 0; u < K_MOE_LOGITS_AHEAD; u++) acc[r] += wv[u] * xv[u];
            }
        }
        for (; i < i1; i += 32u) {
            const float wv = K_LD(w, o * p.n_in + i);
            K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++)
                if (r0 + r < p.n_rows) acc[r] += wv * K_LD(x, (r0 + r) * p.x_stride + i);
        }
        K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
            if (r0 + r >= p.n_rows) continue; /* uniform over the threadgroup */
            const float sr = k_simd_sum(acc[r]);
            if (K_LANE == 0u) K_ST(part, sg * K_MATVEC_MAX_ROWS + r, sr);
        }
        K_BARRIER();
        if (K_TID < K_MATVEC_MAX_ROWS && r0 + K_TID < p.n_rows) {
            float y0 = 0.0f;
            for (k_u32 g = 0; g < S; g++) y0 += K_LD(part, g * K_MATVEC_MAX_ROWS + K_TID);
            K_ST(y, (r0 + K_TID) * p.y_stride + o, y0);
        }
        K_BARRIER(); /* part is rewritten by the next block of rows */
    }
}

/* moe_logits for a chunk of token rows (prefill), the same bits: a
 * threadgroup of S SIMD-groups (the split moe_logits runs at) takes
 * K_MOE_LOGITS_WIDE_O router rows (o = O K_GX + j) and the token rows
 * [R K_GY, R K_GY + R), R = K_MOE_LOGITS_WIDE_ROWS. Each (o, token row)
 * value is moe_logits' to the bit: lane l of SIMD-group s adds w[i] x[i] for
 * its i in ascending order, k_simd_sum, then the S partials in ascending s.
 * Why: in a 256-row chunk each of moe_logits' 257 threadgroups read all
 * 256 x rows (2 MB) from L2 for its one router row: 514 MB of L2 reads a
 * launch, 93 us (10% of the 35B-A3B-like MoE's prefill, H100, session 31).
 * Here a row of x serves O router rows, and row blocks keep the grid wide.
 * At most K_MOE_LOGITS_WIDE_MAX_SPLIT SIMD-groups (table.h). */
K_KERNEL(moe_logits_wide) {
    K_CHECK_TAG(moe_logits_wide);
    K_TG_ARRAY(float, part, K_MOE_LOGITS_WIDE_MAX_SPLIT * K_MOE_LOGITS_WIDE_O * K_MATVEC_MAX_ROWS);
    const k_u32 O = K_MOE_LOGITS_WIDE_O, R = K_MOE_LOGITS_WIDE_ROWS, MR = K_MATVEC_MAX_ROWS;
    if (p.n_in == 0u || p.n_rows == 0u || K_NGX < (p.n_out + O - 1u) / O || K_NGY < (p.n_rows + R - 1u) / R ||
        K_NSIMD > K_MOE_LOGITS_WIDE_MAX_SPLIT) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 o0 = K_GX * O, rb0 = K_GY * R, S = K_NSIMD, sg = K_SIMD;
    if (o0 >= p.n_out || rb0 >= p.n_rows) return; /* whole threadgroups: no barrier is left waiting */
    const k_u32 rb1 = rb0 + R < p.n_rows ? rb0 + R : p.n_rows;
    const k_u32 c = 32u * ((p.n_in + 32u * S - 1u) / (32u * S));
    const k_u32 i0 = sg * c, i1 = i0 + c < p.n_in ? i0 + c : p.n_in;
    for (k_u32 r0 = rb0; r0 < rb1; r0 += MR) {
        float acc[K_MOE_LOGITS_WIDE_O][K_MATVEC_MAX_ROWS];
        K_UNROLL for (k_u32 j = 0; j < O; j++)
            K_UNROLL for (k_u32 r = 0; r < MR; r++) acc[j][r] = 0.0f;
        k_u32 i = i0 + K_LANE;
        for (; i + 32u * (K_MOE_LOGITS_AHEAD - 1u) < i1; i += 32u * K_MOE_LOGITS_AHEAD) {
            float wv[K_MOE_LOGITS_WIDE_O][K_MOE_LOGITS_AHEAD];
            K_UNROLL for (k_u32 j = 0; j < O; j++)
                K_UNROLL for (k_u32 u = 0; u < K_MOE_LOGITS_AHEAD; u++)
                    wv[j][u] = o0 + j < p.n_out ? K_LD(w, (o0 + j) * p.n_in + i + 32u * u) : 0.0f;
            K_UNROLL for (k_u32 r = 0; r < MR; r++) {
                if (r0 + r >= rb1) continue;
                const k_u32 xi = (r0 + r) * p.x_stride + i;
                float xv[K_MOE_LOGITS_AHEAD];
                K_UNROLL for (k_u32 u = 0; u < K_MOE_LOGITS_AHEAD; u++) xv[u] = K_LD(x, xi + 32u * u);
                K_UNROLL for (k_u32 j = 0; j < O; j++)
                    K_UNROLL for (k_u32 u = 0; u < K_MOE_LOGITS_AHEAD; u++) acc[j][r] += wv[j][u] * xv[u];
            }
        }
        for (; i < i1; i += 32u) {
            float wv[K_MOE_LOGITS_WIDE_O];
            K_UNROLL for (k_u32 j = 0; j < O; j++) wv[j] = o0 + j < p.n_out ? K_LD(w, (o0 + j) * p.n_in + i) : 0.0f;
            K_UNROLL for (k_u32 r = 0; r < MR; r++) {
                if (r0 + r >= rb1) continue;
                const float xv = K_LD(x, (r0 + r) * p.x_stride + i);
                K_UNROLL for (k_u32 j = 0; j < O; j++) acc[j][r] += wv[j] * xv;
            }
        }
        K_UNROLL for (k_u32 r = 0; r < MR; r++) {
            if (r0 + r >= rb1) continue; /* uniform over the threadgroup */
            K_UNROLL for (k_u32 j = 0; j < O; j++) {
                const float sr = k_simd_sum(acc[j][r]);
                if (K_LANE == 0u) K_ST(part, (sg * O + j) * MR + r, sr);
            }
        }
        K_BARRIER();
        for (k_u32 t = K_TID; t < O * MR; t += K_TG_SIZE) { /* 32 S threads, O MR values */
            const k_u32 j = t / MR, r = t % MR;
            if (r0 + r < rb1 && o0 + j < p.n_out) {
                float y0 = 0.0f;
#ifndef PLANT_MOE_WIDE_PARTIAL_ORDER
                for (k_u32 g = 0; g < S; g++) y0 += K_LD(part, (g * O + j) * MR + r);
#else /* planted fault (tests must turn red): the partials in descending order */
                for (k_u32 g = S; g-- > 0u;) y0 += K_LD(part, (g * O + j) * MR + r);
#endif
                K_ST(y, (r0 + r) * p.y_stride + o0 + j, y0);
            }
        }
        K_BARRIER(); /* part is rewritten by the next block of rows */
    }
}

/* (p, id) beats (bp, bid): the larger probability, equal ones the lower
 * expert id (the CPU's upward scan with a strict '>'). Probabilities are
 * finite and >= 0 here, so this is a total order and the butterfly's
 * winner does not depend on the reduction order. */
K_FN int k_moe_beats(float pv, k_u32 id, float bp, k_u32 bid) { return pv > bp || (pv == bp && id < bid); }

/* One SIMD-group per token row, lane l holding experts l + 32 j. The CPU's
 * fast-path operations (moe.c route) in its order where a GPU can: mx =
 * the largest logit, e = exp(l - mx), sum = the e's (in float, per lane
 * ascending then the butterfly; the CPU sums in double), p = e * (1 /
 * sum), k rounds of the (p desc, id asc) winner among the untaken, ws =
 * the k chosen p's in slot order (float; the CPU: double) clamped below at
 * 6.103515625e-5 (llama-graph.cpp build_moe_ffn), w_s = p_s / ws; slot k
 * of wt holds sigmoid(the shared gate logit) = 1 / (1 + exp(-g)) (norm.c
 * ds4_sigmoid) with K_MOE_SHGATE, else 1. A row whose logits are not all
 * finite raises K_ERR_MOE_LOGIT (the CPU would route it arbitrarily). */
K_KERNEL(moe_route) {
    K_CHECK_TAG(moe_route);
    if (p.n_expert == 0u || p.n_expert > K_MOE_MAX_EXPERTS || p.k == 0u || p.k > K_MOE_MAX_K ||
        p.k > p.n_expert) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 row = K_GX * K_NSIMD + K_SIMD, lane = K_LANE, ne = p.n_expert;
    if (row >= p.n_rows) return; /* a whole SIMD-group */
    const k_u32 base = row * p.stride;
    float ev[K_MOE_MAX_EXPERTS / 32];
    float mx = K_LD(logits, base), bad = 0.0f;
    K_UNROLL for (k_u32 j = 0; j < K_MOE_MAX_EXPERTS / 32u; j++) {
        const k_u32 e = lane + 32u * j;
        ev[j] = e < ne ? K_LD(logits, base + e) : 0.0f;
        if (e < ne) {
            if (!(ev[j] - ev[j] == 0.0f)) bad = 1.0f; /* NaN or Inf */
            mx = k_max2(mx, ev[j]);
        }
    }
    mx = k_simd_max(mx);
    if (k_simd_max(bad) != 0.0f) {
        if (lane == 0u) k_raise(status, K_ERR_MOE_LOGIT);
        return;
    }
    float sum = 0.0f;
    K_UNROLL for (k_u32 j = 0; j < K_MOE_MAX_EXPERTS / 32u; j++)
        if (lane + 32u * j < ne) {
            ev[j] = k_exp(ev[j] - mx);
            sum += ev[j];
        }
    sum = k_simd_sum(sum);
    const float inv = 1.0f / sum;
    K_UNROLL for (k_u32 j = 0; j < K_MOE_MAX_EXPERTS / 32u; j++) ev[j] = ev[j] * inv;
    k_u32 taken = 0u; /* bit j: expert lane + 32 j is chosen */
    float wt_s[K_MOE_MAX_K];
    k_u32 sel_s[K_MOE_MAX_K];
    K_UNROLL for (k_u32 s = 0; s < K_MOE_MAX_K; s++) {
        wt_s[s] = 0.0f, sel_s[s] = 0u;
        if (s >= p.k) continue; /* uniform */
        float bp = -1.0f; /* below every probability: the first untaken expert wins the lane */
        k_u32 bid = 0xffffffffu;
        K_UNROLL for (k_u32 j = 0; j < K_MOE_MAX_EXPERTS / 32u; j++) {
            const k_u32 e = lane + 32u * j;
            if (e < ne && !((taken >> j) & 1u) && k_moe_beats(ev[j], e, bp, bid)) bp = ev[j], bid = e;
        }
        for (k_u32 m = 16u; m >= 1u; m >>= 1) {
            const float op = k_shfl_xor(bp, m);
            const k_u32 oid = (k_u32)k_shfl_xor_i((int)bid, m);
#ifdef PLANT_MOE_LAST_TIE /* planted fault (tests must turn red): equal probabilities go to the higher id */
            if (op > bp || (op == bp && oid > bid && oid != 0xffffffffu)) bp = op, bid = oid;
#else
            if (k_moe_beats(op, oid, bp, bid)) bp = op, bid = oid;
#endif
        }
        if (bid % 32u == lane) taken |= 1u << (bid / 32u);
        wt_s[s] = bp, sel_s[s] = bid;
    }
    float ws = 0.0f;
    K_UNROLL for (k_u32 s = 0; s < K_MOE_MAX_K; s++)
        if (s < p.k) ws += wt_s[s];
    if (ws < 6.103515625e-5f) ws = 6.103515625e-5f;
    if (lane != 0u) return;
    K_UNROLL for (k_u32 s = 0; s < K_MOE_MAX_K; s++) {
        if (s >= p.k) continue;
        K_ST(sel, row * p.k + s, sel_s[s]);
        K_ST(wt, row * (p.k + 1u) + s, wt_s[s] / ws);
    }
    float gm = 1.0f;
    if (p.flags & K_MOE_SHGATE) gm = 1.0f / (1.0f + k_exp(-K_LD(logits, base + ne)));
    K_ST(wt, row * (p.k + 1u) + p.k, gm);
}

/* Pair P = t k + s (token row t, slot s; P >= n_rows k: the shared expert
 * of token row P - n_rows k) and output row j = K_GX K_NSIMD + K_SIMD, one
 * SIMD-group each: g = the gate row j of the pair's expert (id sel[P], read
 * on the device) . x_t, u = the up row j . x_t (k_moe_dot: the dense
 * matvec's bits), h[P][j] = (g / (1 + exp(-g))) * u (swiglu's expression).
 * Only the selected experts' rows are read. */
K_KERNEL(moe_gate_up) {
    K_CHECK_TAG(moe_gate_up);
    const k_u32 nf = p.n_ff > p.n_ff_sh ? p.n_ff : p.n_ff_sh;
    if (!K_MOE_TYPE_OK(p.t_gate) || !K_MOE_TYPE_OK(p.t_up) || p.k == 0u || p.n_in % K_MOE_IN_ALIGN(p) ||
        (p.n_ff_sh && (!K_MOE_TYPE_OK(p.t_sgate) || !K_MOE_TYPE_OK(p.t_sup))) || p.h_stride < nf ||
        (p.g_estride | p.u_base | p.u_estride | p.sg_base | p.su_base) % 16u || K_NGX * K_NSIMD < nf ||
        K_NGY < K_MOE_PAIRS(p)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 P = K_GY, j = K_GX * K_NSIMD + K_SIMD, routed = P < p.n_rows * p.k;
    if (P >= K_MOE_PAIRS(p)) return; /* a whole threadgroup */
    const k_u32 t = routed ? P / p.k : P - p.n_rows * p.k;
    if (j >= (routed ? p.n_ff : p.n_ff_sh)) return; /* a whole SIMD-group; no barriers here */
    k_u32 e = 0u;
    if (routed) {
        e = K_LD(sel, P);
        if (e >= p.n_expert) { /* uniform over the SIMD-group */
            if (K_LANE == 0u) k_raise(status, K_ERR_SHAPE);
            return;
        }
#ifdef PLANT_MOE_NEXT_EXPERT /* planted fault (tests must turn red): the next expert's rows, in bounds */
        if (e + 1u < p.n_expert) e = e + 1u;
#endif
    }
    const k_u32 tg = routed ? p.t_gate : p.t_sgate, tu = routed ? p.t_up : p.t_sup;
    const k_u32 gb = routed ? e * p.g_estride : p.sg_base, ub = routed ? p.u_base + e * p.u_estride : p.su_base;
    const k_u32 ur = routed ? p.u_row0 + j : j;
    const k_u32 ax8 = t * K_MOE_ACT_BYTES(K_TYPE_Q8_0, p.n_in), axk = t * K_MOE_ACT_BYTES(K_TYPE_Q4_K, p.n_in);
    /* both rows into L2 before the first dot (a hint, CUDA only: the up
     * row's fetch overlaps the gate dot; no effect on any value) */
    const k_u32 rbg = K_MOE_ROW_BYTES(tg, p.n_in), rbu = K_MOE_ROW_BYTES(tu, p.n_in);
    for (k_u32 b = 32u * K_LANE; b < rbg; b += 1024u) K_PREFETCH(w, gb + j * rbg + b);
    for (k_u32 b = 32u * K_LANE; b < rbu; b += 1024u) K_PREFETCH(w, ub + ur * rbu + b);
    const float g = k_moe_dot(w, gb, j, tg, p.n_in, tg == K_TYPE_Q8_0 ? xq8 : xqk, tg == K_TYPE_Q8_0 ? ax8 : axk, K_LANE);
    const float u = k_moe_dot(w, ub, ur, tu, p.n_in, tu == K_TYPE_Q8_0 ? xq8 : xqk, tu == K_TYPE_Q8_0 ? ax8 : axk, K_LANE);
    if (K_LANE == 0u) K_ST(h, P * p.h_stride + j, (g / (1.0f + k_exp(-g))) * u);
}

/* Token row t = K_GY, output row o = K_GX K_NSIMD + K_SIMD, one SIMD-group:
 * y = d_0 w_0, then y = y + d_s w_s for s = 1..k-1, then y = y + w_k sd
 * (moe.c's combine in its order; w_k = sigmoid(shared gate), wt's slot k),
 * where d_s = row o of expert sel[t k + s]'s down matrix . the pair's
 * quantized SwiGLU row and sd the shared expert's (k_moe_dot: the dense
 * matvec's bits). The quantized rows: pair P's at P * act_bytes(n_ff) in
 * the buffer of the down type's activation type (hq8: Q8_0, hqk: Q8_K),
 * the shared expert's of token t after all n_rows k of them. */
K_KERNEL(moe_down) {
    K_CHECK_TAG(moe_down);
    if (!K_MOE_TYPE_OK(p.t_down) || (p.n_ff_sh && !K_MOE_TYPE_OK(p.t_sdown)) || p.k == 0u ||
        p.n_ff % (p.t_down == K_TYPE_Q8_0 ? 32u : 256u) || p.sd_base % 16u ||
        (p.n_ff_sh && p.n_ff_sh % (p.t_sdown == K_TYPE_Q8_0 ? 32u : 256u)) || K_NGX * K_NSIMD < p.n_out ||
        K_NGY < p.n_rows) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 t = K_GY, o = K_GX * K_NSIMD + K_SIMD;
    if (t >= p.n_rows || o >= p.n_out) return; /* a whole SIMD-group; no barriers here */
    const k_u32 td = p.t_down, eb = p.n_out * K_MOE_ROW_BYTES(td, p.n_ff), ab = K_MOE_ACT_BYTES(td, p.n_ff);
    K_DEV_IN k_u8 *hq = td == K_TYPE_Q8_0 ? hq8 : hqk;
    /* every slot's row (and the shared one) into L2 first (a hint, CUDA
     * only: the k + 1 fetches overlap instead of one per dot; no effect on
     * any value) */
    const k_u32 rbd = K_MOE_ROW_BYTES(td, p.n_ff);
    for (k_u32 s = 0; s < p.k; s++) {
        const k_u32 e = K_LD(sel, t * p.k + s);
        if (e < p.n_expert)
            for (k_u32 b = 32u * K_LANE; b < rbd; b += 1024u) K_PREFETCH(w, e * eb + o * rbd + b);
    }
    if (p.n_ff_sh) {
        const k_u32 rbs = K_MOE_ROW_BYTES(p.t_sdown, p.n_ff_sh);
        for (k_u32 b = 32u * K_LANE; b < rbs; b += 1024u) K_PREFETCH(w, p.sd_base + o * rbs + b);
    }
    float y = 0.0f;
    for (k_u32 s = 0; s < p.k; s++) {
        const k_u32 P = t * p.k + s, e = K_LD(sel, P);
        if (e >= p.n_expert) { /* uniform over the SIMD-group */
            if (K_LANE == 0u) k_raise(status, K_ERR_SHAPE);
            return;
        }
        const float d = k_moe_dot(w, e * eb, o, td, p.n_ff, hq, P * ab, K_LANE);
        const float wv = K_LD(wt, t * (p.k + 1u) + s);
        y = s == 0u ? d * wv : y + d * wv;
    }
    if (p.n_ff_sh) {
        const k_u32 ts = p.t_sdown, abs_ = K_MOE_ACT_BYTES(ts, p.n_ff_sh);
        const k_u32 at = p.n_rows * p.k * K_MOE_ACT_BYTES(ts, p.n_ff) + t * abs_;
        const float sd = k_moe_dot(w, p.sd_base, o, ts, p.n_ff_sh, ts == K_TYPE_Q8_0 ? hq8 : hqk, at, K_LANE);
        y = y + K_LD(wt, t * (p.k + 1u) + p.k) * sd;
    }
    if (K_LANE == 0u) K_ST(out, t * p.y_stride + o, y);
}
