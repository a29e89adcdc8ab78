/*
 * gemm_mma.h — the prefill GEMM on int8 tensor cores (table.h
 * gemm_q8_0_mma / gemm_kq_mma): the same output bits as gemm.h (and so as
 * the width-1 matvec), with the exact integer dot products of the blocks
 * computed by warp-wide MMA (k_mma_s8_k16 / k_mma_s8_k32: CUDA mma.sync
 * m16n8k16 / m16n8k32 .s32.s8.s8.s32; the emulator emulates the PTX
 * fragment layout, gpu/emul/emul.c). CUDA and the emulator only: Metal has
 * no int8 simdgroup matrix (all.h includes this file under K_HAS_MMA; the
 * Metal amalgamation leaves it out), and there the dp4a GEMM serves.
 *
 * Why the bits agree (gemm.h's header has the canonical order): the
 * matvec gives an output 32 float chains, one per lane L, and combines
 * them by the xor butterfly 1, 2, 4, 8, 16, i.e. the balanced binary tree
 * over L = 0..31 in order (IEEE addition is commutative, so every lane's
 * butterfly value is that tree). Chain L adds, in ascending block order:
 *   Q8_0:    (float) sumi * (d_w * d_x) for the blocks ib = 4 (L & 7) +
 *            (L >> 3) (mod 32), sumi = the block's 32-code dot;
 *   K-quant: for the super-blocks ib = L >> 3 (mod 4), share t = L & 7:
 *            (d_w * d_x) * (float) part, then (Q4_K/Q5_K) - (dmin_w * d_x)
 *            * (float) mpart, part = sum over the share's scale groups of
 *            scale * (codes . q8) and mpart = m_lo bsum_lo + m_hi bsum_hi.
 * Here a thread owns outputs (the MMA's C fragment: weight rows g, g + 8
 * of its SIMD-group's 16, activation rows 2c, 2c + 1 of each 8-row tile,
 * g = lane / 4, c = lane % 4) and runs the 32 chains of each of them two at
 * a time (L, L + 1 for L = 0, 2, .., 30: one pass over their blocks),
 * every chain's terms in the matvec's order; a finished pair joins the
 * tree at once (their sum is the tree's first level, then K_MMA_TREE: a
 * binary counter holding at most one pending subtree per level), so a
 * thread keeps 3 floats per output in registers (the two chains, the
 * pending 2-chain subtree) and 3 in its own threadgroup-memory slots, not
 * 32. For the K-quants the pair is shares t, t + 1 (t even) of the same
 * super-blocks: the same scale sub-blocks (Q4_K/Q5_K: 2c', 2c' + 1; Q6_K:
 * the same 4 scales), d, dmin and d_x, so the header decode, the scale
 * products d_w d_x and the activation addressing are done once for both.
 * The integer parts come from MMAs whose K slice is exactly the chain's
 * block (Q8_0: one m16n8k32) or share (Q4_K/Q5_K: the two 16-value runs
 * as two m16n8k16, scaled and summed in integers; the mins as one
 * m16n8k32 of the mins, repeated over their runs, with the Q8_K codes:
 * m_lo bsum_lo + m_hi bsum_hi exactly, given bsums that are the sums of
 * the codes, as every Q8_K quantizer here writes them; Q6_K: each 8-value
 * scale group as an m16n8k16 whose upper 8 k are zero). Integers are
 * exact however they are summed, so every float term is the matvec's,
 * added to the same chain in the same order.
 *
 * Where the time goes (counted in the SASS, not yet measured): the fixed
 * order costs ~9 instructions per output and K-quant share whoever
 * computes the integers (two integer scale products, two int -> float
 * conversions, two float products, two float adds, a share of the d_w
 * d_x products); the MMAs are 6 per 8 outputs x 2 shares. nvcc 13.0,
 * sm_90, Q4_K: one super-block step of a pair is ~600 instructions for 16
 * outputs x 2 shares, ~19 per output and share (that epilogue, the IMMAs,
 * the activation loads and addressing, ~5.5 of weight header decode
 * shared by the K_MMA_NT tiles); gemm.h's dp4a body is ~94 per 4 outputs
 * and share (~24 each: 8 IDP4A, 6 IMAD, 2 I2F, 4 FMUL, 2 FADD), plus its
 * staging. So the float epilogue, not the tensor cores, bounds this
 * kernel; more than the epilogue floor's ~2.4x over dp4a would need a
 * different (not batch-invariant with the matvecs) order. The one-chain-
 * per-pass first version was ~23 per output and share: hence the pairs.
 * Loads: each thread reads 4-byte words of its A fragment rows and B
 * fragment columns straight from device memory (L1/L2; threadgroup memory
 * holds only the tree's per-thread slots, no staging, no barriers).
 *
 * Every loop bound is uniform across a SIMD-group (MMA needs all 32
 * lanes): rows past n_out / n_rows are clamped for the loads and not
 * stored. The threadgroup array holds per-thread slots only: no barrier.
 */

/* A finished pair of chains (L, L + 1, L even; v = a_L + a_{L+1}, the
 * tree's first level) joins the butterfly's tree: the pending 2-chain
 * subtree in a register (a1: touched every 2nd pair), the 4-, 8- and
 * 16-chain ones in the thread's own slots i2, i3, i4 of threadgroup array
 * tp (touched every 4th pair or less: registers saved for occupancy; no
 * other thread reads them, so no barrier). After the last pair (L = 30),
 * v is the output value. The same additions, operand for operand, as the
 * xor butterfly 1, 2, 4, 8, 16 (x + y == y + x). */
#define K_MMA_TREE(L, v, a1, tp, i2, i3, i4)                                                       \
    do {                                                                                           \
        if ((L) & 2u) {                                                                            \
            v = (a1) + v;                                                                          \
            if ((L) & 4u) {                                                                        \
                v = K_LD(tp, i2) + v;                                                              \
                if ((L) & 8u) {                                                                    \
                    v = K_LD(tp, i3) + v;                                                          \
                    if ((L) & 16u)                                                                 \
                        v = K_LD(tp, i4) + v;                                                      \
                    else                                                                           \
                        K_ST(tp, i4, v);                                                           \
                } else                                                                             \
                    K_ST(tp, i3, v);                                                               \
            } else                                                                                 \
                K_ST(tp, i2, v);                                                                   \
        } else                                                                                     \
            (a1) = v;                                                                              \
    } while (0)

/* slot of level l (2..4) of output e of tile n of thread tid: consecutive
 * threads in consecutive words (no bank conflicts) */
#define K_MMA_SLOT(l, n, e, tid) ((((l) - 2u) * K_MMA_NT * 4u + (n) * 4u + (e)) * K_MMA_TG + (tid))

/* CUDA's resident-threadgroups targets (__launch_bounds__: registers per
 * thread at most 65536 / (K_MMA_TG TGS)); -D knobs. nvcc 13.0, sm_90, the
 * default tile (K_MMA_NSG 4, K_MMA_NT 4): 126 (Q8_0) / 127 (K-quants)
 * registers at these caps, no spills (uncapped 155 / 172); K_MMA_NT 8
 * needs TGS 2 (235 / 250 registers; at 3 the K-quant kernel spills). */
#ifndef K_MMA_Q8_TGS
#define K_MMA_Q8_TGS 4
#endif
#ifndef K_MMA_KQ_TGS
#define K_MMA_KQ_TGS 4
#endif

#define K_MMA_SHAPE_OK(p, blk)                                                                     \
    ((p).n_in % (blk) == 0u && (p).n_rows > 0u && (p).n_out > 0u && K_TG_SIZE == K_MMA_TG &&       \
     K_NGX * K_MMA_TR >= (p).n_rows && K_NGY * 16u * K_MMA_NSG >= (p).n_out)

K_FN k_u32 k_mma_min(k_u32 a, k_u32 b) { return a < b ? a : b; }

/* The pair's two chains joined (a + b: the butterfly's xor-1 level), then
 * the tree; after the last pair, the output is stored (row and column of
 * C fragment element e of tile n; rows past n_rows / n_out not). */
#define K_MMA_PAIR_DONE(L, accA, accB, t1, tp, y, p, r0, o0, g, c, nr)                              \
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {                                                \
        if ((r0) + 8u * n >= (nr)) continue;                                                       \
        K_UNROLL for (k_u32 e = 0; e < 4u; e++) {                                                  \
            float v = accA[n][e] + accB[n][e];                                                     \
            K_MMA_TREE(L, v, t1[n][e], tp, K_MMA_SLOT(2u, n, e, K_TID), K_MMA_SLOT(3u, n, e, K_TID), \
                       K_MMA_SLOT(4u, n, e, K_TID));                                               \
            if ((L) == 30u) {                                                                      \
                const k_u32 row_ = (r0) + 8u * n + 2u * (c) + (e & 1u), o_ = (o0) + (g) + 8u * (e >> 1); \
                if (row_ < (p).n_rows && o_ < (p).n_out) K_ST(y, row_ * (p).y_stride + o_, v);     \
            }                                                                                      \
        }                                                                                          \
    }

K_KERNEL_BOUNDED(gemm_q8_0_mma, K_MMA_TG, K_MMA_Q8_TGS) {
    K_CHECK_TAG(gemm_q8_0_mma);
    if (!K_MMA_SHAPE_OK(p, 32u) || K_MATVEC_OCTETS_PER_ROW != 4u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n_in / 32u, nr = p.n_rows, lane = K_LANE, g = lane >> 2, c = lane & 3u;
    const k_u32 o0 = (K_GY * K_MMA_NSG + K_SIMD) * 16u, r0 = K_GX * K_MMA_TR;
    if (o0 >= p.n_out) return; /* a whole SIMD-group; no barriers here */
    K_TG_ARRAY(float, tp, 3 * K_MMA_NT * 4 * K_MMA_TG);
    /* A fragment rows (clamped for the loads; stores are guarded), in
     * blocks; the activation rows each tile's B fragment (column g) and C
     * fragment (columns 2c, 2c + 1) read, clamped, in blocks */
    const k_u32 wa = k_mma_min(o0 + g, p.n_out - 1u) * nb, wb = k_mma_min(o0 + g + 8u, p.n_out - 1u) * nb;
    k_u32 xg[K_MMA_NT], x0[K_MMA_NT], x1[K_MMA_NT];
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
        xg[n] = k_mma_min(r0 + 8u * n + g, nr - 1u) * nb;
        x0[n] = k_mma_min(r0 + 8u * n + 2u * c, nr - 1u) * nb;
        x1[n] = k_mma_min(r0 + 8u * n + 2u * c + 1u, nr - 1u) * nb;
    }
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u16 *x16 = (K_DEV_IN k_u16 *)xq;
    float t1[K_MMA_NT][4];
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
        K_UNROLL for (k_u32 e = 0; e < 4u; e++) t1[n][e] = 0.0f;
    for (k_u32 L = 0; L < 32u; L += 2u) {
        float accA[K_MMA_NT][4], accB[K_MMA_NT][4];
        K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
            K_UNROLL for (k_u32 e = 0; e < 4u; e++) accA[n][e] = accB[n][e] = 0.0f;
        /* chain L + h (h = 0, 1): blocks ib = 4 ((L + h) & 7) + (L >> 3)
         * (mod 32), ascending; the pair's blocks are 4 apart, so one pass
         * over k takes ib and ib + 4 */
        for (k_u32 ib = 4u * (L & 7u) + (L >> 3); ib < nb; ib += 32u) {
            K_UNROLL for (k_u32 h = 0; h < 2u; h++) {
                const k_u32 jb = ib + 4u * h;
                if (jb >= nb) continue; /* uniform */
                const k_u32 oa = (wa + jb) * 34u, ob = (wb + jb) * 34u;
                const k_u32 a0 = k_ld_w2(w16, oa + 2u + 4u * c), a1 = k_ld_w2(w16, ob + 2u + 4u * c);
#ifdef PLANT_MMA_FRAGMENT_SWAP
                /* planted fault (tests must turn red): A registers of rows g, g + 8
                 * swapped (here for codes 16..31; the K-quants' low run of the
                 * first share, Q6_K's first scale group) */
                const k_u32 a3 = k_ld_w2(w16, oa + 18u + 4u * c), a2 = k_ld_w2(w16, ob + 18u + 4u * c);
#else
                const k_u32 a2 = k_ld_w2(w16, oa + 18u + 4u * c), a3 = k_ld_w2(w16, ob + 18u + 4u * c);
#endif
                const float da = k_h2f((k_u16)k_ld_u16_at(w16, oa)), db = k_h2f((k_u16)k_ld_u16_at(w16, ob));
                K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
                    if (r0 + 8u * n >= nr) continue; /* uniform: a whole tile past the rows */
                    const k_u32 xo = (xg[n] + jb) * 34u;
                    k_i32x4 s = {0, 0, 0, 0};
                    s = k_mma_s8_k32(s, a0, a1, a2, a3, k_ld_w2(x16, xo + 2u + 4u * c), k_ld_w2(x16, xo + 18u + 4u * c));
                    const float dx0 = k_h2f((k_u16)k_ld_u16_at(x16, (x0[n] + jb) * 34u));
                    const float dx1 = k_h2f((k_u16)k_ld_u16_at(x16, (x1[n] + jb) * 34u));
                    /* matvec_q8_0's term: (float) sumi * (d_w * d_x) */
                    if (h == 0u) {
                        accA[n][0] += (float)s.x * (da * dx0);
                        accA[n][1] += (float)s.y * (da * dx1);
                        accA[n][2] += (float)s.z * (db * dx0);
                        accA[n][3] += (float)s.w * (db * dx1);
                    } else {
                        accB[n][0] += (float)s.x * (da * dx0);
                        accB[n][1] += (float)s.y * (da * dx1);
                        accB[n][2] += (float)s.z * (db * dx0);
                        accB[n][3] += (float)s.w * (db * dx1);
                    }
                }
            }
        }
        K_MMA_PAIR_DONE(L, accA, accB, t1, tp, y, p, r0, o0, g, c, nr);
    }
}

/* One weight row's shares t, t + 1 (t even) of a Q4_K/Q5_K super-block as
 * thread c of an A fragment needs them: code bytes 4c..4c+3 of each share's
 * two 16-value runs (lo: low nibbles, weights 64 c' + 16 s + 4c.. for
 * share t + s, hi: high nibbles, the run 32 further; c' = t / 2; Q5_K adds
 * the qh bit), the runs' scales and mins (the same sub-blocks 2c', 2c' + 1
 * for both shares: ggml get_scale_min_k4, decoded by shifts as k_kq45_load
 * does), d and dmin. */
typedef struct {
    k_u32 lo[2], hi[2];
    int sc_lo, sc_hi, m_lo, m_hi;
    float d, dmin;
} k_mma_kq45;

K_FN k_mma_kq45 k_mma_kq45_load(K_DEV_IN k_u32x4 *w4, K_DEV_IN k_u32 *w32, k_u32 chunk0, k_u32 type, k_u32 t, k_u32 c) {
    k_mma_kq45 R;
    const k_u32x4 hd = K_LD(w4, chunk0);
    const k_u32 cp = t >> 1;
    K_UNROLL for (k_u32 s = 0; s < 2u; s++) {
        const k_u32 q = K_LD(w32, 4u * chunk0 + (type == K_TYPE_Q4_K ? 4u : 12u) + 4u * (t + s) + c);
        R.lo[s] = q & 0x0f0f0f0fu, R.hi[s] = (q >> 4) & 0x0f0f0f0fu;
        if (type == K_TYPE_Q5_K) {
            const k_u32 h = K_LD(w32, 4u * chunk0 + 4u + 4u * s + c);
            R.lo[s] |= ((h >> (2u * cp)) & 0x01010101u) << 4;
            R.hi[s] |= ((h >> (2u * cp + 1u)) & 0x01010101u) << 4;
        }
    }
    const k_u32 sh0 = 16u * (cp & 1u), a = hd.y >> sh0, b = hd.z >> sh0, e = hd.w >> sh0;
    R.sc_lo = (int)(cp < 2u ? a & 63u : (e & 15u) | ((a >> 2) & 0x30u));
    R.m_lo = (int)(cp < 2u ? b & 63u : ((e >> 4) & 15u) | ((b >> 2) & 0x30u));
    R.sc_hi = (int)(cp < 2u ? (a >> 8) & 63u : ((e >> 8) & 15u) | ((a >> 10) & 0x30u));
    R.m_hi = (int)(cp < 2u ? (b >> 8) & 63u : ((e >> 12) & 15u) | ((b >> 10) & 0x30u));
    R.d = k_h2f((k_u16)(hd.x & 0xffffu)), R.dmin = k_h2f((k_u16)(hd.x >> 16));
    return R;
}

/* One weight row's shares t, t + 1 (t even) of a Q6_K super-block for
 * thread c: the 4 scale groups' code bytes 4c..4c+3 (signed; h = t / 4, l
 * = 8 ((t + s) & 3) + 4c of quarters q = 0..3, as k_kq6_load) for c < 2,
 * zero for c >= 2 (the upper 8 k of each m16n8k16 hold nothing), the 4
 * int8 scales (scales[8h + 2q + (l >> 4)]: the same for both shares) and
 * d. */
typedef struct {
    k_u32 code[2][4];
    int sc[4];
    float d;
} k_mma_kq6;

K_FN k_mma_kq6 k_mma_kq6_load(K_DEV_IN k_u16 *w16, k_u32 wo, k_u32 t, k_u32 c) {
    k_mma_kq6 R;
    const k_u32 h = t >> 2, l0 = 8u * (t & 3u);
    K_UNROLL for (k_u32 s = 0; s < 2u; s++) {
        R.code[s][0] = R.code[s][1] = R.code[s][2] = R.code[s][3] = 0u;
        if (c < 2u) {
            const k_u32 l = l0 + 8u * s + 4u * c;
            const k_u32 a = k_ld_w2(w16, wo + 64u * h + l), b = k_ld_w2(w16, wo + 64u * h + 32u + l);
            const k_u32 qh = k_ld_w2(w16, wo + 128u + 32u * h + l);
            R.code[s][0] = k_q6_signed((a & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4));
            R.code[s][1] = k_q6_signed((b & 0x0f0f0f0fu) | (((qh >> 2) & 0x03030303u) << 4));
            R.code[s][2] = k_q6_signed(((a >> 4) & 0x0f0f0f0fu) | (((qh >> 4) & 0x03030303u) << 4));
            R.code[s][3] = k_q6_signed(((b >> 4) & 0x0f0f0f0fu) | (((qh >> 6) & 0x03030303u) << 4));
        }
    }
    K_UNROLL for (k_u32 q = 0; q < 4u; q++) /* scales[8h + 2q + (l0 >> 4)] */
        R.sc[q] = k_i8((k_ld_u16_at(w16, wo + 192u + 8u * h + 2u * q) >> (8u * (l0 >> 4))) & 0xffu);
    R.d = k_h2f((k_u16)k_ld_u16_at(w16, wo + 208u));
    return R;
}

K_KERNEL_BOUNDED(gemm_kq_mma, K_MMA_TG, K_MMA_KQ_TGS) {
    K_CHECK_TAG(gemm_kq_mma);
    const k_u32 type = p.wtype, bs = K_KQ_BLOCK_BYTES(type);
    if (!K_MMA_SHAPE_OK(p, 256u) || bs == 0u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n_in / 256u, nr = p.n_rows, lane = K_LANE, g = lane >> 2, c = lane & 3u;
    const k_u32 q6 = type == K_TYPE_Q6_K;
    const k_u32 o0 = (K_GY * K_MMA_NSG + K_SIMD) * 16u, r0 = K_GX * K_MMA_TR;
    if (o0 >= p.n_out) return; /* a whole SIMD-group; no barriers here */
    K_TG_ARRAY(float, tp, 3 * K_MMA_NT * 4 * K_MMA_TG);
    const k_u32 wa = k_mma_min(o0 + g, p.n_out - 1u) * nb, wb = k_mma_min(o0 + g + 8u, p.n_out - 1u) * nb;
    k_u32 xg[K_MMA_NT], x0[K_MMA_NT], x1[K_MMA_NT];
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
        xg[n] = k_mma_min(r0 + 8u * n + g, nr - 1u) * nb;
        x0[n] = k_mma_min(r0 + 8u * n + 2u * c, nr - 1u) * nb;
        x1[n] = k_mma_min(r0 + 8u * n + 2u * c + 1u, nr - 1u) * nb;
    }
    K_DEV_IN k_u32x4 *w4 = (K_DEV_IN k_u32x4 *)w;
    K_DEV_IN k_u32 *w32 = (K_DEV_IN k_u32 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    float t1[K_MMA_NT][4];
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
        K_UNROLL for (k_u32 e = 0; e < 4u; e++) t1[n][e] = 0.0f;
    for (k_u32 L = 0; L < 32u; L += 2u) {
        const k_u32 t = L & 7u; /* even: the pair is shares t, t + 1 */
        float accA[K_MMA_NT][4], accB[K_MMA_NT][4];
        K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
            K_UNROLL for (k_u32 e = 0; e < 4u; e++) accA[n][e] = accB[n][e] = 0.0f;
        /* chains L, L + 1: shares t, t + 1 of the super-blocks ib = L >> 3
         * (mod 4), ascending */
        for (k_u32 ib = L >> 3; ib < nb; ib += 4u) {
            if (q6) {
                const k_mma_kq6 A = k_mma_kq6_load(w16, (wa + ib) * 210u, t, c);
                const k_mma_kq6 B = k_mma_kq6_load(w16, (wb + ib) * 210u, t, c);
                /* activation word of group q of share t + s: 1 + 32 h + 8 q + 2 ((t + s) & 3) + c */
                const k_u32 xlo = 1u + 32u * (t >> 2) + 2u * (t & 3u) + c;
                K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
                    if (r0 + 8u * n >= nr) continue;
                    const k_u32 xb = (xg[n] + ib) * 73u;
                    const float dx0 = k_bits_f32(K_LD(x32, (x0[n] + ib) * 73u));
                    const float dx1 = k_bits_f32(K_LD(x32, (x1[n] + ib) * 73u));
                    const float f0 = A.d * dx0, f1 = A.d * dx1, f2 = B.d * dx0, f3 = B.d * dx1;
                    K_UNROLL for (k_u32 s2 = 0; s2 < 2u; s2++) {
                        k_i32x4 sq[4];
                        K_UNROLL for (k_u32 q = 0; q < 4u; q++) {
                            const k_i32x4 z = {0, 0, 0, 0};
                            const k_u32 xw = c < 2u ? K_LD(x32, xb + xlo + 2u * s2 + 8u * q) : 0u;
#ifdef PLANT_MMA_FRAGMENT_SWAP
                            sq[q] = k_mma_s8_k16(z, q + s2 ? A.code[s2][q] : B.code[s2][q], q + s2 ? B.code[s2][q] : A.code[s2][q], xw);
#else
                            sq[q] = k_mma_s8_k16(z, A.code[s2][q], B.code[s2][q], xw);
#endif
                        }
                        const int p0 = A.sc[0] * sq[0].x + A.sc[1] * sq[1].x + A.sc[2] * sq[2].x + A.sc[3] * sq[3].x;
                        const int p1 = A.sc[0] * sq[0].y + A.sc[1] * sq[1].y + A.sc[2] * sq[2].y + A.sc[3] * sq[3].y;
                        const int p2 = B.sc[0] * sq[0].z + B.sc[1] * sq[1].z + B.sc[2] * sq[2].z + B.sc[3] * sq[3].z;
                        const int p3 = B.sc[0] * sq[0].w + B.sc[1] * sq[1].w + B.sc[2] * sq[2].w + B.sc[3] * sq[3].w;
                        /* matvec_kq's term: (d_w * d_x) * (float) part */
                        if (s2 == 0u) {
                            accA[n][0] += f0 * (float)p0, accA[n][1] += f1 * (float)p1;
                            accA[n][2] += f2 * (float)p2, accA[n][3] += f3 * (float)p3;
                        } else {
                            accB[n][0] += f0 * (float)p0, accB[n][1] += f1 * (float)p1;
                            accB[n][2] += f2 * (float)p2, accB[n][3] += f3 * (float)p3;
                        }
                    }
                }
            } else {
                const k_mma_kq45 A = k_mma_kq45_load(w4, w32, (wa + ib) * (bs / 16u), type, t, c);
                const k_mma_kq45 B = k_mma_kq45_load(w4, w32, (wb + ib) * (bs / 16u), type, t, c);
                /* mins repeated over their runs: k 0..15 the lo run, 16..31 the hi run */
                const k_u32 m0 = (k_u32)A.m_lo * 0x01010101u, m1 = (k_u32)B.m_lo * 0x01010101u;
                const k_u32 m2 = (k_u32)A.m_hi * 0x01010101u, m3 = (k_u32)B.m_hi * 0x01010101u;
                /* activation words of share t + s's runs: lo 1 + 16 c' + 4 s + c, hi 8 further */
                const k_u32 xlo = 1u + 16u * (t >> 1) + c;
                K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
                    if (r0 + 8u * n >= nr) continue;
                    const k_u32 xb = (xg[n] + ib) * 73u;
                    const float dx0 = k_bits_f32(K_LD(x32, (x0[n] + ib) * 73u));
                    const float dx1 = k_bits_f32(K_LD(x32, (x1[n] + ib) * 73u));
                    const float f0 = A.d * dx0, f1 = A.d * dx1, f2 = B.d * dx0, f3 = B.d * dx1;
                    const float m0f = A.dmin * dx0, m1f = A.dmin * dx1, m2f = B.dmin * dx0, m3f = B.dmin * dx1;
                    K_UNROLL for (k_u32 s2 = 0; s2 < 2u; s2++) {
                        const k_u32 xl = K_LD(x32, xb + xlo + 4u * s2), xh = K_LD(x32, xb + xlo + 4u * s2 + 8u);
                        const k_i32x4 z = {0, 0, 0, 0};
#ifdef PLANT_MMA_FRAGMENT_SWAP
                        const k_i32x4 sl = k_mma_s8_k16(z, B.lo[s2], A.lo[s2], xl);
#else
                        const k_i32x4 sl = k_mma_s8_k16(z, A.lo[s2], B.lo[s2], xl);
#endif
                        const k_i32x4 sh = k_mma_s8_k16(z, A.hi[s2], B.hi[s2], xh);
                        const k_i32x4 sm = k_mma_s8_k32(z, m0, m1, m2, m3, xl, xh);
                        /* matvec_kq's terms: (d_w d_x) part, then - (dmin_w d_x) mpart */
                        const float v0 = f0 * (float)(A.sc_lo * sl.x + A.sc_hi * sh.x), u0 = m0f * (float)sm.x;
                        const float v1 = f1 * (float)(A.sc_lo * sl.y + A.sc_hi * sh.y), u1 = m1f * (float)sm.y;
                        const float v2 = f2 * (float)(B.sc_lo * sl.z + B.sc_hi * sh.z), u2 = m2f * (float)sm.z;
                        const float v3 = f3 * (float)(B.sc_lo * sl.w + B.sc_hi * sh.w), u3 = m3f * (float)sm.w;
                        if (s2 == 0u) {
                            accA[n][0] += v0, accA[n][0] -= u0, accA[n][1] += v1, accA[n][1] -= u1;
                            accA[n][2] += v2, accA[n][2] -= u2, accA[n][3] += v3, accA[n][3] -= u3;
                        } else {
                            accB[n][0] += v0, accB[n][0] -= u0, accB[n][1] += v1, accB[n][1] -= u1;
                            accB[n][2] += v2, accB[n][2] -= u2, accB[n][3] += v3, accB[n][3] -= u3;
                        }
                    }
                }
            }
        }
        K_MMA_PAIR_DONE(L, accA, accB, t1, tp, y, p, r0, o0, g, c, nr);
    }
}
