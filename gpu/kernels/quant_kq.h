/*
 * quant_kq.h — Q8_K activations and the K-quant matvec (Q4_K, Q5_K, Q6_K
 * weights; decode and the verify widths 2..16 in one weight read).
 *
 * The CPU pairs K-quant weights with Q8_K activations (csrc/quants/scalar.c
 * dot_q*_K_q8_K, ggml's *_q8_K_generic), so the GPU does too: the integer
 * part of every term is exact and identical, and only the order in which
 * the float terms are added differs (tolerance: docs/gpu.md).
 *
 * Byte layouts (the file's, on every target):
 *   Q8_K  292 B: float d @0, int8 qs[256] @4, int16 bsums[16] @260
 *   Q4_K  144 B: f16 d @0, f16 dmin @2, scales[12] @4, qs[128] @16
 *   Q5_K  176 B: f16 d @0, f16 dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
 *   Q6_K  210 B: ql[128] @0, qh[64] @128, int8 scales[16] @192, f16 d @208
 */

K_FN float k_ld_f32_at(K_DEV_IN k_u8 *b, k_u32 off) {
    return k_bits_f32((k_u32)K_LD(b, off) | ((k_u32)K_LD(b, off + 1u) << 8) |
                      ((k_u32)K_LD(b, off + 2u) << 16) | ((k_u32)K_LD(b, off + 3u) << 24));
}

/* One SIMD-group per 256-value block; lane l holds x[l + 32 i], i < 8.
 * Bit for bit the CPU's quant_q8_K (ggml quantize_row_q8_K_ref): max = the
 * FIRST element of largest |x| (strict >, so NaN never wins), iscale =
 * -127/max, q = min(127, nearest_int(iscale*x)) with ggml's 1.5*2^23 magic
 * add, d = 1/iscale, bsums = sums of 16; an all-zero block is all zeros. */
K_KERNEL(quantize_q8_K) {
    K_CHECK_TAG(quantize_q8_K);
    if (p.n % 256u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n / 256u;
    const k_u32 blk = K_GX * K_NSIMD + K_SIMD;
    if (blk >= p.n_rows * nb) return; /* a whole SIMD-group */
    const k_u32 row = blk / nb, ib = blk % nb;
    const k_u32 xo = row * p.x_stride + ib * 256u;
    float v[8];
    float amax = 0.0f, idx = 1.0e9f; /* index as float: exact below 2^24 */
    for (k_u32 i = 0; i < 8u; i++) {
        v[i] = K_LD(x, xo + K_LANE + 32u * i);
        const float ax = k_fabs(v[i]);
        if (ax > amax) amax = ax, idx = (float)(K_LANE + 32u * i);
    }
    /* (amax, idx): larger |x| wins, equal |x| the lower index */
    for (k_u32 m = 16u; m >= 1u; m >>= 1) {
        const float oa = k_shfl_xor(amax, m), oi = k_shfl_xor(idx, m);
        if (oa > amax || (oa == amax && oi < idx)) amax = oa, idx = oi;
    }
    const k_u32 o = blk * 292u;
    if (amax == 0.0f) {
        for (k_u32 i = K_LANE; i < 292u; i += 32u) K_ST(q, o + i, (k_u8)0);
        return;
    }
    const float mx = K_LD(x, xo + (k_u32)idx);
    const float iscale = -127.0f / mx;
    for (k_u32 i = 0; i < 8u; i++) {
        const float f = iscale * v[i] + 12582912.0f; /* no contraction: two roundings, as the CPU */
        const int qi0 = (int)(k_f32_bits(f) & 0x007fffffu) - 0x00400000;
        const int qi = qi0 < 127 ? qi0 : 127;
        K_ST(q, o + 4u + K_LANE + 32u * i, (k_u8)(qi & 0xff));
        /* bsums[2i + lane/16]: the 16 codes of this half-SIMD-group, exact
         * (integers far below 2^24 in float) */
        float s = (float)qi;
        s = s + k_shfl_xor(s, 8u);
        s = s + k_shfl_xor(s, 4u);
        s = s + k_shfl_xor(s, 2u);
        s = s + k_shfl_xor(s, 1u);
        if ((K_LANE & 15u) == 0u) {
            const k_u32 bs = (k_u32)(int)s & 0xffffu, bo = o + 260u + 2u * (2u * i + K_LANE / 16u);
            K_ST(q, bo, (k_u8)(bs & 0xffu));
            K_ST(q, bo + 1u, (k_u8)(bs >> 8));
        }
    }
    if (K_LANE == 0u) {
        const k_u32 db = k_f32_bits(1.0f / iscale);
        for (k_u32 b = 0; b < 4u; b++) K_ST(q, o + b, (k_u8)((db >> (8u * b)) & 0xffu));
    }
}

/* Byte i (0..11) of the K-quant scale bytes held as three words. */
K_FN k_u32 k_kq_sbyte(k_u32 s0, k_u32 s1, k_u32 s2, k_u32 i) {
    const k_u32 wd = i < 4u ? s0 : i < 8u ? s1 : s2;
    return (wd >> (8u * (i & 3u))) & 0xffu;
}

/* ggml get_scale_min_k4 over the three scale words: 6-bit scale (want_min
 * 0) or min (1) of sub-block j (0..7). */
K_FN int k_kq_sm(k_u32 s0, k_u32 s1, k_u32 s2, k_u32 j, k_u32 want_min) {
    if (j < 4u) return (int)(k_kq_sbyte(s0, s1, s2, j + 4u * want_min) & 63u);
    const k_u32 hi = k_kq_sbyte(s0, s1, s2, j + 4u);
    if (!want_min) return (int)((hi & 0xfu) | ((k_kq_sbyte(s0, s1, s2, j - 4u) >> 6) << 4));
    return (int)((hi >> 4) | ((k_kq_sbyte(s0, s1, s2, j) >> 6) << 4));
}

K_FN int k_i8_of(k_u32 word, k_u32 e) { return k_i8((word >> (8u * e)) & 0xffu); }

/* One SIMD-group per output row o; its 32 lanes are 4 octets, octet g takes
 * super-blocks g, g+4, ...; every float term is the CPU's
 * (dot_q*_K_q8_K): d * lane_L (d = fp16(w.d) * x.d, lane_L = the exact
 * integer sum over weights j = L mod 8 of scale(j/16) * (int16)(q8_j *
 * code_j)) and, once per super-block, -dmin * sum(bsums * min). Each lane
 * adds its terms to its own accumulator; accumulators are summed by
 * butterfly (the order differs from the CPU's: docs/gpu.md).
 *
 * Q4_K / Q5_K (blocks of 144 / 176 bytes, 4-aligned): lane t of an octet
 * reads 32-bit words — bytes 4t..4t+3 of each 32-byte chunk of codes (and
 * of qh, and of the Q8_K codes) — so its integer partials belong to CPU
 * lanes 4(t&1) + e, e < 4; partials of lanes t, t^2, t^4, t^6 are added by
 * two integer-exact shuffles (|partial| < 2^24 travels exactly as float),
 * then lane t adds the term of CPU lane 4(t&1) + (t>>1): each of the 8
 * once. Q6_K (210-byte blocks, only 2-aligned) reads bytes: lane t takes
 * CPU lane t directly. Every weight byte is read by one lane once for all
 * n_rows rows; a row's result never depends on n_rows. Row loops run to
 * the constant K_MATVEC_MAX_ROWS with a guard so acc[] stays in registers. */
K_KERNEL(matvec_kq) {
    K_CHECK_TAG(matvec_kq);
    const k_u32 bs = K_KQ_BLOCK_BYTES(p.wtype);
    if (p.n_in % 256u || p.n_rows == 0u || p.n_rows > K_MATVEC_MAX_ROWS || bs == 0u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n_in / 256u, type = p.wtype, nr = p.n_rows;
    const k_u32 o = K_GX * K_NSIMD + K_SIMD;
    if (o >= p.n_out) return; /* a whole SIMD-group */
    const k_u32 t = K_LANE & 7u, g = K_LANE >> 3;
    K_DEV_IN k_u32 *w32 = (K_DEV_IN k_u32 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    float acc[K_MATVEC_MAX_ROWS];
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) acc[r] = 0.0f;
    /* the loop's trip count is the same for all 32 lanes (the Q4_K/Q5_K
     * path shuffles): an octet past the last super-block idles through */
    for (k_u32 base = 0; base < nb; base += 4u) {
        const k_u32 ib = base + g, live = ib < nb;
        const k_u32 wo = (o * nb + (live ? ib : 0u)) * bs;
        if (type == K_TYPE_Q6_K) {
            if (!live) continue;
            /* j = 128h + 32q + l: ql[64h + l] holds quarters 0 (low) and 2
             * (high nibble), ql[64h + l + 32] quarters 1 and 3, qh[32h + l]
             * the top 2 bits of all four; scale of j: int8 scales[j/16] */
            int lanes[K_MATVEC_MAX_ROWS];
            K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) lanes[r] = 0;
            for (k_u32 h = 0; h < 2u; h++)
                for (k_u32 l = t; l < 32u; l += 8u) {
                    const k_u32 ql0 = K_LD(w, wo + 64u * h + l), ql1 = K_LD(w, wo + 64u * h + l + 32u);
                    const k_u32 qh = K_LD(w, wo + 128u + 32u * h + l);
                    const int a0 = (int)((ql0 & 0xfu) | ((qh & 3u) << 4)) - 32;
                    const int a1 = (int)((ql1 & 0xfu) | (((qh >> 2) & 3u) << 4)) - 32;
                    const int a2 = (int)((ql0 >> 4) | (((qh >> 4) & 3u) << 4)) - 32;
                    const int a3 = (int)((ql1 >> 4) | (((qh >> 6) & 3u) << 4)) - 32;
                    const k_u32 so = wo + 192u + 8u * h + l / 16u;
                    const int s0 = k_i8(K_LD(w, so)), s1 = k_i8(K_LD(w, so + 2u));
                    const int s2 = k_i8(K_LD(w, so + 4u)), s3 = k_i8(K_LD(w, so + 6u));
                    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
                        if (r >= nr) continue;
                        const k_u32 xb = (r * nb + ib) * 292u + 4u + 128u * h + l;
                        lanes[r] += s0 * (k_i8(K_LD(xq, xb)) * a0) + s1 * (k_i8(K_LD(xq, xb + 32u)) * a1) +
                                    s2 * (k_i8(K_LD(xq, xb + 64u)) * a2) + s3 * (k_i8(K_LD(xq, xb + 96u)) * a3);
                    }
                }
            const float dw = k_ld_f16_at(w, wo + 208u);
            K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
                if (r >= nr) continue;
                acc[r] += (dw * k_ld_f32_at(xq, (r * nb + ib) * 292u)) * (float)lanes[r];
            }
            continue;
        }
        /* Q4_K / Q5_K: j = 64c + 32hi + l, byte qs[32c + l] holds the low
         * (hi 0) and high (hi 1) nibble, Q5_K adds 16 where bit 2c + hi of
         * qh[l] is set; the scale of j is sub-block 2c + hi's */
        const k_u32 w0 = wo / 4u;
        const k_u32 s0 = K_LD(w32, w0 + 1u), s1 = K_LD(w32, w0 + 2u), s2 = K_LD(w32, w0 + 3u);
        const k_u32 qhw = type == K_TYPE_Q5_K ? K_LD(w32, w0 + 4u + t) : 0u;
        /* an idle octet reads super-block 0 (in bounds) and adds nothing */
        const k_u32 qo = type == K_TYPE_Q4_K ? 4u : 12u; /* codes at byte 16 / 48 */
        k_u32 qw[4];
        K_UNROLL for (k_u32 c = 0; c < 4u; c++) qw[c] = K_LD(w32, w0 + qo + 8u * c + t);
        const float dw = k_ld_f16_at(w, wo), dmw = k_ld_f16_at(w, wo + 2u);
        /* rows in groups of 4: the weight words stay in registers for all
         * groups (one weight read), and few partials are live at a time */
        K_UNROLL for (k_u32 r0 = 0; r0 < K_MATVEC_MAX_ROWS; r0 += 4u) {
            if (r0 >= nr) continue;
            int part[4][4];
            K_UNROLL for (k_u32 rr = 0; rr < 4u; rr++)
                K_UNROLL for (k_u32 e = 0; e < 4u; e++) part[rr][e] = 0;
            K_UNROLL for (k_u32 c = 0; c < 4u; c++) {
                const int sl = k_kq_sm(s0, s1, s2, 2u * c, 0u), sh = k_kq_sm(s0, s1, s2, 2u * c + 1u, 0u);
                int a0[4], a1[4];
                K_UNROLL for (k_u32 e = 0; e < 4u; e++) {
                    const k_u32 b = (qw[c] >> (8u * e)) & 0xffu, h = (qhw >> (8u * e + 2u * c)) & 3u;
                    a0[e] = (int)(b & 0xfu) + (int)(h & 1u) * 16;
                    a1[e] = (int)(b >> 4) + (int)(h >> 1) * 16;
                }
                K_UNROLL for (k_u32 rr = 0; rr < 4u; rr++) {
                    const k_u32 r = r0 + rr;
                    if (r >= nr || !live) continue;
                    const k_u32 x0 = ((r * nb + ib) * 292u + 4u + 64u * c) / 4u + t;
                    const k_u32 xw0 = K_LD(x32, x0), xw1 = K_LD(x32, x0 + 8u);
                    K_UNROLL for (k_u32 e = 0; e < 4u; e++)
                        part[rr][e] += sl * (k_i8_of(xw0, e) * a0[e]) + sh * (k_i8_of(xw1, e) * a1[e]);
                }
            }
            K_UNROLL for (k_u32 rr = 0; rr < 4u; rr++) {
                const k_u32 r = r0 + rr;
                if (r >= nr) continue;
                /* CPU lane 4(t&1) + e: the partials of lanes t, t^2, t^4, t^6 */
                float lane = 0.0f;
                K_UNROLL for (k_u32 e = 0; e < 4u; e++) {
                    float v = (float)part[rr][e];
                    v = v + k_shfl_xor(v, 2u);
                    v = v + k_shfl_xor(v, 4u);
                    if (e == (t >> 1)) lane = v;
                }
                if (!live) continue;
                const k_u32 xo = (r * nb + ib) * 292u;
                const float dx = k_ld_f32_at(xq, xo);
                acc[r] += (dw * dx) * lane;
                if (t == 0u) {
                    int sumi = 0;
                    for (k_u32 s = 0; s < 8u; s++) { /* bsums 2s, 2s + 1 share a word and a min */
                        const k_u32 bw = K_LD(x32, xo / 4u + 65u + s);
                        const int b0 = (int)(bw & 0xffffu) - (bw & 0x8000u ? 65536 : 0);
                        const int b1 = (int)(bw >> 16) - (bw & 0x80000000u ? 65536 : 0);
                        sumi += (b0 + b1) * k_kq_sm(s0, s1, s2, s, 1u);
                    }
                    acc[r] -= (dmw * dx) * (float)sumi;
                }
            }
        }
    }
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
        if (r >= nr) continue;
        const float s = k_simd_sum(acc[r]);
        if (K_LANE == 0) K_ST(y, r * p.y_stride + o, s);
    }
}
