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


/* Signed 6-bit codes (0..63 per byte) minus 32, per byte, as int8 bytes:
 * flip bit 5, and where it is then set (code < 32) set bits 6 and 7 too.
 * No carry crosses a byte. */
K_FN k_u32 k_q6_signed(k_u32 c) {
    const k_u32 f = c ^ 0x20202020u, s = f & 0x20202020u;
    return f | (s << 1) | (s << 2);
}

/* What lane t of an octet holds of one weight super-block: 8 words of 4
 * codes (signed bytes), in 4 groups of 2 words; group G's codes share the
 * scale sc[G] and meet the activation bytes at xb + xg[G] (+4 for the
 * second word) of the Q8_K block; Q4_K/Q5_K add their min term. */
typedef struct {
    k_u32 code[8];
    int sc[4];
    int m_lo, m_hi; /* Q4_K/Q5_K mins of sub-blocks 2c, 2c + 1 */
    float d, dmin;
} k_kq_lane;

/* Q4_K / Q5_K (144 / 176-byte blocks: 9 / 11 chunks of 16 bytes, so every
 * block is 16-aligned): lane t loads the header chunk (d, dmin, scales; the
 * same 16 bytes for the octet: one broadcast), codes qs[16t..16t+15] (byte
 * qs[32c + l], c = t/2, l = 16(t&1)..+15, holds weight 64c + l in its low
 * nibble and 64c + 32 + l in its high one) and, for Q5_K, the qh chunk of
 * the same l (bit 2c / 2c + 1 of qh[l] adds 16). */
K_FN k_kq_lane k_kq45_load(K_DEV_IN k_u32x4 *w4, k_u32 chunk0, k_u32 type, k_u32 t) {
    k_kq_lane L;
    const k_u32x4 hd = K_LD(w4, chunk0);
    const k_u32x4 qs = K_LD(w4, chunk0 + (type == K_TYPE_Q4_K ? 1u : 3u) + t);
    k_u32x4 qh = hd;
    if (type == K_TYPE_Q5_K) qh = K_LD(w4, chunk0 + 1u + (t & 1u));
    const k_u32 c = t >> 1, q[4] = {qs.x, qs.y, qs.z, qs.w}, h[4] = {qh.x, qh.y, qh.z, qh.w};
    K_UNROLL for (k_u32 i = 0; i < 4u; i++) {
        k_u32 lo = q[i] & 0x0f0f0f0fu, hi = (q[i] >> 4) & 0x0f0f0f0fu;
        if (type == K_TYPE_Q5_K) {
            lo |= ((h[i] >> (2u * c)) & 0x01010101u) << 4;
            hi |= ((h[i] >> (2u * c + 1u)) & 0x01010101u) << 4;
        }
        L.code[i] = lo, L.code[4u + i] = hi;
    }
    /* ggml get_scale_min_k4 for sub-blocks j = 2c, 2c + 1 at once, by shifts
     * of the scale words (a generic byte select by a lane-varying index cost
     * ~4x the instructions). With k = j & 3, a/b/e = bytes k of scale
     * words 0/1/2: j < 4: scale a & 63, min b & 63; j >= 4: scale (e & 15) |
     * (a >> 6) << 4, min (e >> 4) | (b >> 6) << 4. */
    const k_u32 sh0 = 16u * (c & 1u), a = hd.y >> sh0, b = hd.z >> sh0, e = hd.w >> sh0;
    int scj[2], mj[2];
    K_UNROLL for (k_u32 h = 0; h < 2u; h++) {
        const k_u32 ah = a >> (8u * h), bh = b >> (8u * h), eh = e >> (8u * h);
        scj[h] = (int)(c < 2u ? ah & 63u : (eh & 15u) | ((ah >> 2) & 0x30u));
        mj[h] = (int)(c < 2u ? bh & 63u : ((eh >> 4) & 15u) | ((bh >> 2) & 0x30u));
    }
    L.sc[0] = scj[0], L.sc[1] = scj[0], L.sc[2] = scj[1], L.sc[3] = scj[1];
    L.m_lo = mj[0], L.m_hi = mj[1];
    L.d = k_h2f((k_u16)(hd.x & 0xffffu)), L.dmin = k_h2f((k_u16)(hd.x >> 16));
    return L;
}

/* Q6_K (210-byte blocks, only 2-aligned: 16-bit loads): weight j = 128h +
 * 32q + l is ql[64h + l] (q 0: low nibble, q 2: high) or ql[64h + 32 + l]
 * (q 1, 3) with bits 2q..2q+1 of qh[32h + l] on top, minus 32, scale
 * int8 scales[j/16]. Lane t takes h = t/4, l = 8(t&3)..+7 of all four q. */
K_FN k_kq_lane k_kq6_load(K_DEV_IN k_u16 *w16, k_u32 wo, k_u32 t) {
    k_kq_lane L;
    const k_u32 h = t >> 2, l0 = 8u * (t & 3u);
    K_UNROLL for (k_u32 i = 0; i < 2u; i++) {
        const k_u32 a = k_ld_w2(w16, wo + 64u * h + l0 + 4u * i), b = k_ld_w2(w16, wo + 64u * h + 32u + l0 + 4u * i);
        const k_u32 qh = k_ld_w2(w16, wo + 128u + 32u * h + l0 + 4u * i);
        L.code[i] = k_q6_signed((a & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4));
        L.code[2u + i] = k_q6_signed((b & 0x0f0f0f0fu) | (((qh >> 2) & 0x03030303u) << 4));
        L.code[4u + i] = k_q6_signed(((a >> 4) & 0x0f0f0f0fu) | (((qh >> 4) & 0x03030303u) << 4));
        L.code[6u + i] = k_q6_signed(((b >> 4) & 0x0f0f0f0fu) | (((qh >> 6) & 0x03030303u) << 4));
    }
    K_UNROLL for (k_u32 q = 0; q < 4u; q++) /* scales[8h + 2q + (l0 >> 4)] */
        L.sc[q] = k_i8((k_ld_u16_at(w16, wo + 192u + 8u * h + 2u * q) >> (8u * (l0 >> 4))) & 0xffu);
    L.m_lo = 0, L.m_hi = 0;
    L.d = k_h2f((k_u16)k_ld_u16_at(w16, wo + 208u)), L.dmin = 0.0f;
    return L;
}

/* Super-blocks per octet per step of the K-quant matvec (weight loads
 * first), and the activation tile staged per step. */
#ifndef K_KQ_AHEAD
#define K_KQ_AHEAD 4u /* super-blocks of L2 prefetch ahead (CUDA) */
#endif
#ifndef K_KQ_STEP
#define K_KQ_STEP 2u
#endif
/* The staged Q8_K tile, per (step block u, row r): the 64 code words with
 * 8 pad words after each 32 (so the 16-byte reads of an octet's 8 lanes
 * hit 8 different bank quads), then d, then the 8 bsums words. */
#define K_KQ_XW 80u
#define K_KQ_TILE_WORDS (K_KQ_STEP * K_MATVEC_MAX_ROWS * (K_KQ_XW + 1u + 8u))
#define K_KQ_PAD(w) ((w) + 8u * ((w) >> 5))

/* One octet (8 lanes) per output row: SIMD-group s serves rows 4s..4s+3,
 * octet g row 4s + g. An octet takes K_KQ_STEP consecutive super-blocks
 * per step and loads their weights first (k_kq45_load / k_kq6_load say
 * which codes lane t holds; for Q4_K/Q5_K an octet's step is 288/352
 * contiguous bytes in 16-byte loads). Meanwhile the threadgroup copies the
 * step's activation super-blocks of all n_rows rows into threadgroup
 * memory (coalesced words; the Q8_K layout is only 4-aligned, the staged
 * one 16-aligned and padded against bank conflicts), so every weight row
 * of the threadgroup and every verify row reads them from there. Every
 * weight word is read once for all n_rows rows. Per super-block and row,
 * each lane forms its exact integer share sum_G sc[G] * (codes . q8)
 * (k_dot4) and, for Q4_K/Q5_K, mins . bsums of its two 16-value runs, and
 * adds the float terms (d_w * d_x) * share and -(dmin_w * d_x) * mins to
 * its own accumulator (no shuffle per block: per-block octet sums cost
 * more instructions than the dot products at width 16); a 3-level
 * butterfly over the octet ends it. The CPU (dot_q*_K_q8_K) splits the
 * same exact value d * S - dmin * M into its 8 integer lanes instead, so
 * the results differ by rounding only (tolerance and its derivation:
 * docs/gpu.md). A row's result never depends on n_rows. Row loops run to the constant
 * K_MATVEC_MAX_ROWS with a guard so acc[] stays in registers. */
K_FN void k_matvec_kq_rows(const k_matvec_kq_params p, K_DEV_IN k_u8 *w, K_DEV_IN k_u8 *xq, K_DEV float *y,
                             K_TGM k_u32x4 *xs4, k_u32 tid, k_u32 tg_size, k_u32 simd, k_u32 lane, const k_u32 R) {
    K_TGM k_u32 *xs = (K_TGM k_u32 *)xs4;
    K_TGM k_u32x2 *xs2 = (K_TGM k_u32x2 *)xs4;
    const k_u32 nb = p.n_in / 256u, type = p.wtype, nr = p.n_rows, bs = K_KQ_BLOCK_BYTES(type);
    /* no SIMD-group may leave: all take part in the tile copies and
     * barriers. Octets past the last row compute row n_out - 1 and store
     * nothing. */
    const k_u32 o = simd * K_MATVEC_ROWS_PER_SIMD + (lane >> 3);
    const k_u32 orow = o < p.n_out ? o : p.n_out - 1u;
    const k_u32 t = lane & 7u, q6 = type == K_TYPE_Q6_K;
    K_DEV_IN k_u32x4 *w4 = (K_DEV_IN k_u32x4 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    /* where lane t's codes meet the Q8_K codes (words of the staged
     * block, before padding): Q4_K/Q5_K words 16c + 4(t&1) (lo) and + 8
     * (hi), four each; Q6_K words 32h + 2(t&3) + 8q, two each */
    const k_u32 xlo = q6 ? 32u * (t >> 2) + 2u * (t & 3u) : 16u * (t >> 1) + 4u * (t & 1u);
    /* bsums of this lane's two 16-value runs (Q4_K/Q5_K): int16 4c + (t&1)
     * and 4c + 2 + (t&1): half t&1 of bsums words 2c, 2c + 1 */
    const k_u32 bsw = 2u * (t >> 1), bsh = 16u * (t & 1u);
    float acc[K_MATVEC_MAX_ROWS];
    K_UNROLL for (k_u32 r = 0; r < R; r++) acc[r] = 0.0f;
    /* the same trip count in all threads (barriers, octet shuffles): a
     * step past the last super-block uses block 0 (in bounds) and adds
     * nothing */
    for (k_u32 base = 0; base < nb; base += K_KQ_STEP) {
        /* L2 prefetch K_KQ_AHEAD super-blocks ahead: lane t touches the
         * 32-byte sector t of each (the loads below then wait on L2, not
         * HBM, and need no registers to be in flight) */
        K_UNROLL for (k_u32 u = 0; u < K_KQ_STEP; u++)
            if (base + K_KQ_AHEAD + u < nb && 32u * t < bs)
                K_PREFETCH(w, (orow * nb + base + K_KQ_AHEAD + u) * bs + 32u * t);
        k_kq_lane L[K_KQ_STEP];
        K_UNROLL for (k_u32 u = 0; u < K_KQ_STEP; u++) {
            const k_u32 blk = orow * nb + (base + u < nb ? base + u : 0u);
            L[u] = q6 ? k_kq6_load(w16, blk * 210u, t) : k_kq45_load(w4, blk * (bs / 16u), type, t);
        }
        /* stage the step's activation blocks: word wi of block (u, r) */
        for (k_u32 f = tid; f < nr * K_KQ_STEP * 73u; f += tg_size) {
            const k_u32 r = f / (K_KQ_STEP * 73u), u = (f / 73u) % K_KQ_STEP, wi = f % 73u;
            const k_u32 ib = base + u < nb ? base + u : 0u, ur = u * K_MATVEC_MAX_ROWS + r;
            const k_u32 v = K_LD(x32, (r * nb + ib) * 73u + wi);
            if (wi == 0u) K_ST(xs, K_KQ_STEP * K_MATVEC_MAX_ROWS * K_KQ_XW + ur, v);
            else if (wi <= 64u) K_ST(xs, ur * K_KQ_XW + K_KQ_PAD(wi - 1u), v);
            else K_ST(xs, K_KQ_STEP * K_MATVEC_MAX_ROWS * (K_KQ_XW + 1u) + ur * 8u + (wi - 65u), v);
        }
        K_BARRIER();
        K_UNROLL for (k_u32 u = 0; u < K_KQ_STEP; u++) {
            if (base + u >= nb) continue; /* uniform: the whole threadgroup */
            K_UNROLL for (k_u32 r = 0; r < R; r++) {
                if (r >= nr) continue;
                const k_u32 ur = u * K_MATVEC_MAX_ROWS + r, cw = ur * K_KQ_XW;
                k_u32 xw[8];
                if (q6) {
                    K_UNROLL for (k_u32 q = 0; q < 4u; q++) {
                        const k_u32x2 v = K_LD(xs2, (cw + K_KQ_PAD(xlo + 8u * q)) / 2u);
                        xw[2u * q] = v.x, xw[2u * q + 1u] = v.y;
                    }
                } else {
                    const k_u32x4 lo = K_LD(xs4, (cw + K_KQ_PAD(xlo)) / 4u), hi = K_LD(xs4, (cw + K_KQ_PAD(xlo + 8u)) / 4u);
                    xw[0] = lo.x, xw[1] = lo.y, xw[2] = lo.z, xw[3] = lo.w;
                    xw[4] = hi.x, xw[5] = hi.y, xw[6] = hi.z, xw[7] = hi.w;
                }
                /* the lane's exact integer share of the super-block (|part|
                 * <= 32 * 127 * 128 * 32 < 2^24 for every type: exact as
                 * float) becomes its own float term: no shuffles per block */
                int part = 0;
                K_UNROLL for (k_u32 G = 0; G < 4u; G++)
                    part += L[u].sc[G] * k_dot4(L[u].code[2u * G + 1u], xw[2u * G + 1u], k_dot4(L[u].code[2u * G], xw[2u * G], 0));
                const float dx = k_bits_f32(K_LD(xs, K_KQ_STEP * K_MATVEC_MAX_ROWS * K_KQ_XW + ur));
                acc[r] += (L[u].d * dx) * (float)part;
                if (!q6) {
                    const k_u32 bo = K_KQ_STEP * K_MATVEC_MAX_ROWS * (K_KQ_XW + 1u) + ur * 8u + bsw;
                    const k_u32 b0 = (K_LD(xs, bo) >> bsh) & 0xffffu, b1 = (K_LD(xs, bo + 1u) >> bsh) & 0xffffu;
                    const int mpart = L[u].m_lo * ((int)b0 - (b0 & 0x8000u ? 65536 : 0)) +
                                      L[u].m_hi * ((int)b1 - (b1 & 0x8000u ? 65536 : 0));
                    acc[r] -= (L[u].dmin * dx) * (float)mpart;
                }
            }
        }
        K_BARRIER(); /* the next step's copy overwrites the tile */
    }
    K_UNROLL for (k_u32 r = 0; r < R; r++) {
        if (r >= nr) continue;
        const float s = k_octet_sum(acc[r]);
        if (t == 0u && o < p.n_out) K_ST(y, r * p.y_stride + o, s);
    }
}

/* The three width classes: one body, the row count a constant after
 * inlining, so each variant keeps only its accumulators and loads in
 * registers (one kernel for all would run decode at the occupancy of
 * width 16). The last argument is CUDA's resident-threadgroups target,
 * measured on the H200 at 5120 x 17408: width 1 in 56 registers (9
 * threadgroups per SM: the 1088 threadgroups in one wave; at 61 registers
 * it took 1.03 waves and 45 us instead of 37), 2..4 in 80, 5..16 in 170
 * (a 104-byte spill, still 25% faster than 199 registers unspilled). A
 * row's arithmetic is the same in all three, so any width is bit-identical
 * per row to width 1 (tested). The host picks by K_MATVEC_KQ_KERNEL(n_rows). */
#define K_KQ_VARIANT(K, R, B)                                                              \
    K_KERNEL_BOUNDED(K, K_MATVEC_MAX_TG, B) {                                              \
        K_CHECK_TAG(K);                                                                    \
        const k_u32 bs_ = K_KQ_BLOCK_BYTES(p.wtype);                                       \
        if (p.n_in % 256u || p.n_rows == 0u || p.n_rows > (R) || bs_ == 0u ||             \
            K_TG_SIZE > K_MATVEC_MAX_TG) {                                                 \
            k_raise(status, K_ERR_SHAPE);                                                  \
            return;                                                                        \
        }                                                                                  \
        K_TG_ARRAY(k_u32x4, xs4, K_KQ_TILE_WORDS / 4u);                                    \
        k_matvec_kq_rows(p, w, xq, y, xs4, K_TID, K_TG_SIZE, K_GX * K_NSIMD + K_SIMD, K_LANE, (R)); \
    }

K_KQ_VARIANT(matvec_kq1, 1u, 9)
K_KQ_VARIANT(matvec_kq4, 4u, 6)
K_KQ_VARIANT(matvec_kq, K_MATVEC_MAX_ROWS, 3)
