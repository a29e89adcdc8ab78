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
 * The K-quants' tile under K_KQ_ORDER 2 (the default: quant_kq.h) is the
 * whole-super-block tile further down (k_m2_stage, "K_KQ_ORDER 2"); what
 * follows here describes Q8_0's tile and the K-quants' first tile, which
 * serves K_KQ_ORDER 1.
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
 * as two m16n8k16, scaled and summed in integers; the min term m_lo
 * bsum_lo + m_hi bsum_hi from the Q8_K bsums, as the matvec computes it;
 * Q6_K: each 8-value scale group as an m16n8k16 whose upper 8 k are
 * zero). Integers are exact however they are summed, so every float term
 * is the matvec's, added to the same chain in the same order.
 *
 * gemm_q8_0_mma below is the first version: fragments loaded by each
 * thread from device memory. gemm_kq_mma (further down) stages each step
 * in threadgroup memory; docs/gpu.md section 4 ("Staged") has both
 * measured. The first version's analysis:
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

/* gemm_q8_0_mma, staged like gemm_kq_mma (below): per step, one chain
 * pair (L, L + 1: blocks jb = ib and ib + 4) of one round, the threadgroup
 * copies into threadgroup memory per weight row j and word c = 0..3
 * qw[4 j + c] = (codes word c of block ib, word c + 4 of it, the same of
 * block ib + 4): the A fragment words of thread c; qs[j] = (d_w of the two
 * blocks); per activation row a qx[4 a + c] likewise (the B fragment
 * words) and qd[a] = (d_x of the two blocks). Rows past n_out / n_rows and
 * a second block past nb are staged clamped and not used. */
K_FN void k_mma_q8_stage_rows(K_DEV_IN k_u16 *q16, k_u32 nb, k_u32 n, k_u32 first, k_u32 count, k_u32 ib,
                              k_u32 jb1, k_u32 weights, K_TGM k_u32x4 *qc, K_TGM k_u32x4 *qd, k_u32 tid) {
    for (k_u32 e = tid; e < 4u * count; e += K_MMA_TG) {
        const k_u32 j = e >> 2, c = e & 3u, row = k_mma_min(first + j, n - 1u) * nb;
        /* codes and scale of blocks ib, jb1: the weights' device layout
         * (quant_q8_0.h: 32 nb codes then nb scales per row) or the
         * activations' 34-byte blocks */
        const k_u32 c0 = weights ? 32u * (row + ib) + 2u * row : (row + ib) * 34u + 2u;
        const k_u32 c1 = weights ? 32u * (row + jb1) + 2u * row : (row + jb1) * 34u + 2u;
        const k_u32 s0 = weights ? 34u * row + 32u * nb + 2u * ib : (row + ib) * 34u;
        const k_u32 s1 = weights ? 34u * row + 32u * nb + 2u * jb1 : (row + jb1) * 34u;
        k_u32x4 v;
        if (weights && nb % 2u == 0u) { /* uniform: the layout's codes are then 4-aligned, one load a word */
            K_DEV_IN k_u32 *q32 = (K_DEV_IN k_u32 *)q16;
            v.x = K_LD(q32, c0 / 4u + c), v.y = K_LD(q32, c0 / 4u + 4u + c);
            v.z = K_LD(q32, c1 / 4u + c), v.w = K_LD(q32, c1 / 4u + 4u + c);
        } else {
            v.x = k_ld_w2(q16, c0 + 4u * c), v.y = k_ld_w2(q16, c0 + 16u + 4u * c);
            v.z = k_ld_w2(q16, c1 + 4u * c), v.w = k_ld_w2(q16, c1 + 16u + 4u * c);
        }
        K_ST(qc, e, v);
        if (c == 0u) {
            v.x = k_f32_bits(k_h2f((k_u16)k_ld_u16_at(q16, s0))), v.y = k_f32_bits(k_h2f((k_u16)k_ld_u16_at(q16, s1)));
            v.z = 0u, v.w = 0u;
            K_ST(qd, j, v);
        }
    }
}

K_FN void k_mma_q8_stage(K_DEV_IN k_u16 *w16, K_DEV_IN k_u16 *x16, k_u32 nb, k_u32 n_out, k_u32 nr, k_u32 wr0,
                         k_u32 r0, k_u32 ib, K_TGM k_u32x4 *qw, K_TGM k_u32x4 *qs, K_TGM k_u32x4 *qx,
                         K_TGM k_u32x4 *qd, k_u32 tid) {
    const k_u32 jb1 = ib + 4u < nb ? ib + 4u : nb - 1u;
    k_mma_q8_stage_rows(w16, nb, n_out, wr0, K_MMA_WR, ib, jb1, 1u, qw, qs, tid); /* weight rows */
    k_mma_q8_stage_rows(x16, nb, nr, r0, K_MMA_TR, ib, jb1, 0u, qx, qd, tid);     /* activation rows */
}

K_KERNEL_BOUNDED(gemm_q8_0_mma, K_MMA_TG, K_MMA_Q8_TGS) {
    K_CHECK_TAG(gemm_q8_0_mma);
    if (!K_MMA_SHAPE_OK(p, 32u)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n_in / 32u, nr = p.n_rows, lane = K_LANE, g = lane >> 2, c = lane & 3u, tid = K_TID;
    const k_u32 wr0 = K_GY * K_MMA_WR, o0 = wr0 + 16u * K_SIMD, r0 = K_GX * K_MMA_TR;
    if (wr0 >= p.n_out || r0 >= nr) return; /* a whole threadgroup (a grid wider than needed) */
    /* one declaration a line: the emulator tells arrays apart by their line */
    K_TG_ARRAY(float, tp, 3 * K_MMA_NT * 4 * K_MMA_TG);
    K_TG_ARRAY(k_u32x4, qw, 4 * K_MMA_WR);
    K_TG_ARRAY(k_u32x4, qs, K_MMA_WR);
    K_TG_ARRAY(k_u32x4, qx, 4 * K_MMA_TR);
    K_TG_ARRAY(k_u32x4, qd, K_MMA_TR);
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u16 *x16 = (K_DEV_IN k_u16 *)xq;
    const k_u32 j0 = 16u * K_SIMD + g, j1 = j0 + 8u; /* the A fragment's rows g, g + 8 */
    float t1[K_MMA_NT][4];
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
        K_UNROLL for (k_u32 e = 0; e < 4u; e++) t1[n][e] = 0.0f;
    const k_i32x4 z = {0, 0, 0, 0};
    for (k_u32 L = 0; L < 32u; L += 2u) {
        float accA[K_MMA_NT][4], accB[K_MMA_NT][4];
        K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
            K_UNROLL for (k_u32 e = 0; e < 4u; e++) accA[n][e] = accB[n][e] = 0.0f;
        /* chain L + h (h = 0, 1): blocks ib = 4 ((L + h) & 7) + (L >> 3)
         * (mod 32), ascending; the pair's blocks are 4 apart, so one step
         * takes ib and ib + 4; the bounds are the whole threadgroup's */
        for (k_u32 ib = 4u * (L & 7u) + (L >> 3); ib < nb; ib += 32u) {
            K_BARRIER(); /* the previous step's fragments are read */
            k_mma_q8_stage(w16, x16, nb, p.n_out, nr, wr0, r0, ib, qw, qs, qx, qd, tid);
            K_BARRIER();
            const k_u32x4 A = K_LD(qw, 4u * j0 + c), B = K_LD(qw, 4u * j1 + c);
            const k_u32x4 sa = K_LD(qs, j0), sb = K_LD(qs, j1);
            const int two = ib + 4u < nb; /* uniform */
            K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
                if (r0 + 8u * n >= nr) continue; /* uniform: a whole tile past the rows */
                const k_u32x4 X = K_LD(qx, 4u * (8u * n + g) + c);
                const k_u32x4 D0 = K_LD(qd, 8u * n + 2u * c), D1 = K_LD(qd, 8u * n + 2u * c + 1u);
                K_UNROLL for (k_u32 h = 0; h < 2u; h++) {
                    if (h == 1u && !two) continue;
#ifdef PLANT_MMA_FRAGMENT_SWAP
                    /* planted fault (tests must turn red): A registers of rows g, g + 8
                     * swapped for codes 16..31 */
                    const k_i32x4 s = h ? k_mma_s8_k32(z, A.z, B.z, B.w, A.w, X.z, X.w)
                                        : k_mma_s8_k32(z, A.x, B.x, B.y, A.y, X.x, X.y);
#else
                    const k_i32x4 s = h ? k_mma_s8_k32(z, A.z, B.z, A.w, B.w, X.z, X.w)
                                        : k_mma_s8_k32(z, A.x, B.x, A.y, B.y, X.x, X.y);
#endif
                    const float da = k_bits_f32(h ? sa.y : sa.x), db = k_bits_f32(h ? sb.y : sb.x);
                    const float dx0 = k_bits_f32(h ? D0.y : D0.x), dx1 = k_bits_f32(h ? D1.y : D1.x);
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

/* ------------------------------------------------------------ gemm_kq_mma --
 * Staged (session 20): per step, i.e. one chain pair (L, L + 1: shares t,
 * t + 1 of super-block ib, t = L & 7 even) and one of its super-blocks,
 * the threadgroup copies what every SIMD-group's fragments need into
 * threadgroup memory, decoded once, with neighbouring threads reading
 * neighbouring words; then each SIMD-group reads its fragments there with
 * 16-byte loads. (The first version had every thread load its own 4-byte
 * fragment words from device memory and decode both rows' headers itself:
 * its loads, not its tensor cores nor its float epilogue, bounded it.)
 * Per weight row j of the threadgroup's K_MMA_WR and word c = 0..3:
 *   kw[4 j + c]  Q4_K/Q5_K: (lo_t, lo_t+1, hi_t, hi_t+1), the code bytes
 *                4c..4c+3 of each share's low / high run (nibbles, Q5_K's
 *                fifth bit in): the A fragment words of thread c;
 *                Q6_K: kw[4 j + 2c + s] (c < 2) = share t + s's four
 *                scale groups' words c (k_mma_kq6: k 8..15 of each
 *                m16n8k16 are zero, threads c >= 2 hold nothing);
 *   ks[j]        Q4_K/Q5_K: (sc_lo | sc_hi << 8 | m_lo << 16 | m_hi << 24,
 *                d, dmin) of the pair's sub-blocks 2c', 2c' + 1 (c' = t/2,
 *                the same for both shares: ggml get_scale_min_k4 decoded by
 *                shifts); Q6_K: (the four int8 scales, d).
 * Per activation row a of the threadgroup's K_MMA_TR:
 *   kx[4 a + c]  Q4_K/Q5_K: (lo_t, lo_t+1, hi_t, hi_t+1) words c of the
 *                Q8_K codes each run meets (the B fragment words); Q6_K
 *                kx[4 a + 2c + s] (c < 2): the four groups' words c;
 *   kd[a]        d_x.
 * Rows past n_out / n_rows are staged clamped (their outputs are not
 * stored). The float terms, their chains and the tree are the first
 * version's, operand for operand (the header above). */
/* staging elements per thread: (weight row, c) and (activation row, c) */
#define K_MMA_WE ((4u * K_MMA_WR + K_MMA_TG - 1u) / K_MMA_TG)
#define K_MMA_XE ((4u * K_MMA_TR + K_MMA_TG - 1u) / K_MMA_TG)

/* the low 16 bits of w as a signed integer (a Q8_K bsum) */
K_FN int k_mma_i16(k_u32 w) { return (int)(w & 0xffffu) - ((w & 0x8000u) ? 65536 : 0); }

/* One step's raw words as a thread loads them from device memory (see
 * k_mma_kq_load): registers, so that the next step's loads are in flight
 * while this step computes (one step ahead; K_MMA_PREFETCH 0: none). */
typedef struct {
    k_u32 w[K_MMA_WE][8];
    k_u32 x[K_MMA_XE][8];
} k_mma_kq_raw;

#ifndef K_MMA_PREFETCH
#define K_MMA_PREFETCH 0
#endif

/* Load step (t, ib)'s words: weight element (j, c): Q4_K/Q5_K w[0..1] the
 * qs words c of shares t, t + 1, w[2..3] Q5_K's qh words, w[4..7] the
 * header (c == 0); Q6_K c < 2: w[0..5] (ql lo, ql hi, qh) of shares t, t + 1,
 * c == 2: w[0..3] the 16-bit words holding the 4 scales, w[4] d.
 * Activation element (a, c): Q4_K/Q5_K x[0..3] the code words, c == 0:
 * x[4] d_x, x[5..6] the bsum words of the pair's runs; Q6_K c < 2: x[0..7]
 * the groups' words of shares t, t + 1, c == 2: x[0] d_x. */
K_FN void k_mma_kq_load(K_DEV_IN k_u8 *w, k_u32 wbase, K_DEV_IN k_u8 *xq, K_DEV_IN k_u32 *order, k_gemm_map m,
                        k_u32 type, k_u32 nb, k_u32 n_out, k_u32 wr0, k_u32 t, k_u32 ib, k_mma_kq_raw *R, k_u32 tid) {
    const k_u32 bs = K_KQ_BLOCK_BYTES(type), q6 = type == K_TYPE_Q6_K, cp = t >> 1, h6 = t >> 2;
    K_DEV_IN k_u32 *w32 = (K_DEV_IN k_u32 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    K_UNROLL for (k_u32 i = 0; i < K_MMA_WE; i++) {
        const k_u32 e = tid + i * K_MMA_TG;
        if (e >= 4u * K_MMA_WR) break;
        const k_u32 j = e >> 2, c = e & 3u, blk = k_mma_min(wr0 + j, n_out - 1u) * nb + ib;
        if (q6) {
            const k_u32 wo = wbase + blk * 210u;
            if (c < 2u) {
                K_UNROLL for (k_u32 s = 0; s < 2u; s++) { /* k_mma_kq6: l = 8 ((t + s) & 3) + 4c */
                    const k_u32 l = 8u * (t & 3u) + 8u * s + 4u * c;
                    R->w[i][3u * s] = k_ld_w2(w16, wo + 64u * h6 + l);
                    R->w[i][3u * s + 1u] = k_ld_w2(w16, wo + 64u * h6 + 32u + l);
                    R->w[i][3u * s + 2u] = k_ld_w2(w16, wo + 128u + 32u * h6 + l);
                }
            } else if (c == 2u) {
                K_UNROLL for (k_u32 q = 0; q < 4u; q++) R->w[i][q] = k_ld_u16_at(w16, wo + 192u + 8u * h6 + 2u * q);
                R->w[i][4] = k_ld_u16_at(w16, wo + 208u);
            }
        } else {
            const k_u32 w0 = wbase / 4u + blk * (bs / 4u), qo = type == K_TYPE_Q4_K ? 4u : 12u;
            K_UNROLL for (k_u32 s = 0; s < 2u; s++) {
                R->w[i][s] = K_LD(w32, w0 + qo + 4u * (t + s) + c);
                if (type == K_TYPE_Q5_K) R->w[i][2u + s] = K_LD(w32, w0 + 4u + 4u * s + c);
            }
            if (c == 0u) K_UNROLL for (k_u32 q = 0; q < 4u; q++) R->w[i][4u + q] = K_LD(w32, w0 + q);
        }
    }
    K_UNROLL for (k_u32 i = 0; i < K_MMA_XE; i++) {
        const k_u32 e = tid + i * K_MMA_TG;
        if (e >= 4u * K_MMA_TR) break;
        const k_u32 a = e >> 2, c = e & 3u; /* tile row a, clamped to the tile's rows */
        const k_u32 xb = k_gemm_act(m, k_gemm_row(order, m, k_mma_min(a, m.n - 1u))) / 4u + ib * 73u;
        if (q6) {
            if (c < 2u) { /* group q of share t + s: word 1 + 32 h + 8 q + 2 ((t + s) & 3) + c */
                const k_u32 xo = xb + 1u + 32u * h6 + 2u * (t & 3u) + c;
                K_UNROLL for (k_u32 s = 0; s < 2u; s++)
                    K_UNROLL for (k_u32 q = 0; q < 4u; q++) R->x[i][4u * s + q] = K_LD(x32, xo + 2u * s + 8u * q);
            } else if (c == 2u)
                R->x[i][0] = K_LD(x32, xb);
        } else { /* share t + s's runs: lo word 1 + 16 c' + 4 s + c, hi 8 further */
            const k_u32 xo = xb + 1u + 16u * cp + c;
            K_UNROLL for (k_u32 q = 0; q < 4u; q++) R->x[i][q] = K_LD(x32, xo + 4u * q);
            if (c == 0u) { /* bsums 4c' + (0, 1) and 4c' + (2, 3): the runs' 16-value sums */
                R->x[i][4] = K_LD(x32, xb);
                R->x[i][5] = K_LD(x32, xb + 65u + 2u * cp), R->x[i][6] = K_LD(x32, xb + 66u + 2u * cp);
            }
        }
    }
}

/* Decode a loaded step into threadgroup memory (the layout above; kd[a]
 * = (d_x, bsums of the lo runs of shares t, t + 1, of the hi runs)). */
K_FN void k_mma_kq_store(k_u32 type, k_u32 t, k_mma_kq_raw *R, K_TGM k_u32x4 *kw, K_TGM k_u32x4 *ks,
                         K_TGM k_u32x4 *kx, K_TGM float *kd, K_TGM k_u32x4 *kb, k_u32 tid) {
    const k_u32 q6 = type == K_TYPE_Q6_K, cp = t >> 1;
    K_UNROLL for (k_u32 i = 0; i < K_MMA_WE; i++) {
        const k_u32 e = tid + i * K_MMA_TG;
        if (e >= 4u * K_MMA_WR) break;
        const k_u32 j = e >> 2, c = e & 3u;
        k_u32x4 v;
        if (q6) {
            if (c < 2u) {
                K_UNROLL for (k_u32 s = 0; s < 2u; s++) {
                    const k_u32 a = R->w[i][3u * s], b = R->w[i][3u * s + 1u], qh = R->w[i][3u * s + 2u];
                    v.x = k_q6_signed((a & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4));
                    v.y = k_q6_signed((b & 0x0f0f0f0fu) | (((qh >> 2) & 0x03030303u) << 4));
                    v.z = k_q6_signed(((a >> 4) & 0x0f0f0f0fu) | (((qh >> 4) & 0x03030303u) << 4));
                    v.w = k_q6_signed(((b >> 4) & 0x0f0f0f0fu) | (((qh >> 6) & 0x03030303u) << 4));
                    K_ST(kw, 4u * j + 2u * c + s, v);
                }
            } else if (c == 2u) {
                /* scales[8 h + 2q + (l0 >> 4)], l0 = 8 (t & 3), as ints */
                const k_u32 sh = 8u * ((t & 3u) >> 1);
                v.x = (k_u32)k_i8((R->w[i][0] >> sh) & 0xffu), v.y = (k_u32)k_i8((R->w[i][1] >> sh) & 0xffu);
                v.z = (k_u32)k_i8((R->w[i][2] >> sh) & 0xffu), v.w = (k_u32)k_i8((R->w[i][3] >> sh) & 0xffu);
                K_ST(ks, 2u * j, v);
                v.x = k_f32_bits(k_h2f((k_u16)R->w[i][4])), v.y = 0u, v.z = 0u, v.w = 0u;
                K_ST(ks, 2u * j + 1u, v);
            }
        } else {
            k_u32 lo[2], hi[2];
            K_UNROLL for (k_u32 s = 0; s < 2u; s++) {
                const k_u32 q = R->w[i][s];
                lo[s] = q & 0x0f0f0f0fu, hi[s] = (q >> 4) & 0x0f0f0f0fu;
                if (type == K_TYPE_Q5_K) {
                    const k_u32 hb = R->w[i][2u + s];
                    lo[s] |= ((hb >> (2u * cp)) & 0x01010101u) << 4;
                    hi[s] |= ((hb >> (2u * cp + 1u)) & 0x01010101u) << 4;
                }
            }
            v.x = lo[0], v.y = lo[1], v.z = hi[0], v.w = hi[1];
            K_ST(kw, 4u * j + c, v);
            if (c == 0u) {
                const k_u32 sh0 = 16u * (cp & 1u), a = R->w[i][5] >> sh0, b = R->w[i][6] >> sh0, f = R->w[i][7] >> sh0;
                const k_u32 sc_lo = cp < 2u ? a & 63u : (f & 15u) | ((a >> 2) & 0x30u);
                const k_u32 m_lo = cp < 2u ? b & 63u : ((f >> 4) & 15u) | ((b >> 2) & 0x30u);
                const k_u32 sc_hi = cp < 2u ? (a >> 8) & 63u : ((f >> 8) & 15u) | ((a >> 10) & 0x30u);
                const k_u32 m_hi = cp < 2u ? (b >> 8) & 63u : ((f >> 12) & 15u) | ((b >> 10) & 0x30u);
                k_u32x4 u;
                u.x = sc_lo, u.y = sc_hi, u.z = m_lo, u.w = m_hi;
                K_ST(ks, 2u * j, u);
                u.x = k_f32_bits(k_h2f((k_u16)(R->w[i][4] & 0xffffu))), u.y = k_f32_bits(k_h2f((k_u16)(R->w[i][4] >> 16)));
                u.z = 0u, u.w = 0u;
                K_ST(ks, 2u * j + 1u, u);
            }
        }
    }
    K_UNROLL for (k_u32 i = 0; i < K_MMA_XE; i++) {
        const k_u32 e = tid + i * K_MMA_TG;
        if (e >= 4u * K_MMA_TR) break;
        const k_u32 a = e >> 2, c = e & 3u;
        k_u32x4 v;
        if (q6) {
            if (c < 2u) {
                K_UNROLL for (k_u32 s = 0; s < 2u; s++) {
                    v.x = R->x[i][4u * s], v.y = R->x[i][4u * s + 1u], v.z = R->x[i][4u * s + 2u], v.w = R->x[i][4u * s + 3u];
                    K_ST(kx, 4u * a + 2u * c + s, v);
                }
            } else if (c == 2u)
                K_ST(kd, a, k_bits_f32(R->x[i][0]));
        } else {
            v.x = R->x[i][0], v.y = R->x[i][1], v.z = R->x[i][2], v.w = R->x[i][3];
            K_ST(kx, 4u * a + c, v);
            if (c == 0u) { /* the bsums as ints: lo runs of shares t, t + 1, hi runs */
                K_ST(kd, a, k_bits_f32(R->x[i][4]));
                v.x = (k_u32)k_mma_i16(R->x[i][5]), v.y = (k_u32)k_mma_i16(R->x[i][5] >> 16);
                v.z = (k_u32)k_mma_i16(R->x[i][6]), v.w = (k_u32)k_mma_i16(R->x[i][6] >> 16);
                K_ST(kb, a, v);
            }
        }
    }
}

/* The step after (L, ib) in the kernel's order (the next super-block of the
 * pair's chains, else the next pair with a super-block); L = 32: none. */
K_FN void k_mma_kq_next(k_u32 nb, k_u32 *L, k_u32 *ib) {
    if (*ib + 4u < nb) {
        *ib += 4u;
        return;
    }
    for (*L += 2u; *L < 32u; *L += 2u)
        if ((*L >> 3) < nb) break;
    *ib = *L >> 3;
}


/* The pair's two chains joined, then the tree; after the last pair the
 * output is stored (tile row 8n + 2c + (e & 1), weight row o0 + g + 8 (e
 * >> 1); rows past m.n / n_out not), through the row map. */
#define K_MMA_PAIR_DONE_MAP(L, accA, accB, t1, tp, y, order, m, n_out, o0, g, c, tid)                \
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {                                                \
        if (8u * n >= (m).n) continue;                                                             \
        K_UNROLL for (k_u32 e = 0; e < 4u; e++) {                                                  \
            float v = accA[n][e] + accB[n][e];                                                     \
            K_MMA_TREE(L, v, t1[n][e], tp, K_MMA_SLOT(2u, n, e, tid), K_MMA_SLOT(3u, n, e, tid),     \
                       K_MMA_SLOT(4u, n, e, tid));                                                 \
            if ((L) == 30u) {                                                                      \
                const k_u32 row_ = 8u * n + 2u * (c) + (e & 1u), o_ = (o0) + (g) + 8u * (e >> 1);     \
                if (row_ < (m).n && o_ < (n_out))                                                  \
                    K_ST(y, (m).ybase + k_gemm_row(order, m, row_) * (m).ystride + o_, v);          \
            }                                                                                      \
        }                                                                                          \
    }

/* One threadgroup's tile: weight rows [wr0, wr0 + K_MMA_WR) of the matrix
 * at byte wbase of w (n_out rows of n_in; wbase a multiple of 16) against
 * the map's m.n <= K_MMA_TR activation rows (Q8_K) of xq, written through
 * the map (gemm.h k_gemm_map: dense rows, or moe_gemm_mma's pairs of one
 * expert). Every thread of the threadgroup calls it (barriers); tid, lane,
 * sg: K_TID, K_LANE, K_SIMD. */
#if K_KQ_ORDER == 2
/* K_KQ_ORDER 2 (quant_kq.h): the whole-super-block tile. The order per
 * output: one exact integer pair (S, M) per super-block ib, then
 * acc += (d_w d_x) S and (Q4_K/Q5_K) acc -= (dmin_w d_x) M into the chain
 * of phase ib mod 4, ascending; the value is ((S0 + S1) + S2) + S3.
 * Integers are exact however they are formed, so here:
 *  - the threadgroup stages one whole super-block per barrier pair: for
 *    each of its K_MMA_KQ_WR weight rows the 256 codes unpacked to int8
 *    (kw), the scales (and mins) as ints (ksc), d and dmin (kdw); for each
 *    of its K_MMA_KQ_TR activation rows the 256 Q8_K codes (kx), the 8
 *    sums of 32 of the bsums (kbs) and d_x (kdx);
 *  - a SIMD-group owns 32 weight rows (2 MMA m-tiles) x 8 K_M2_WNT
 *    activation rows (K_M2_WNT = K_MMA_KQ_NT / 2 n-tiles): SIMD-group sg
 *    takes weight rows 32 (sg mod K_M2_WMW).. and activation rows
 *    8 K_M2_WNT (sg / K_M2_WMW).. (K_M2_WMW = K_MMA_KQ_NSG / 2), so the
 *    threadgroup's tile is K_MMA_KQ_WR x K_MMA_KQ_TR as table.h says;
 *  - S: per 32-value sub-block (Q6_K: 16-value scale group) one MMA with
 *    a zero accumulator, times the row's scale, added as integers; M: the
 *    8 mins times the 8 bsums of 32, as integers, once per super-block;
 *  - the float terms: 2 per output and super-block (the old tile: 16).
 * kw / kx rows hold, per sub-block pair sp (0..3) and thread column c
 * (0..3), one 16-byte word (word c, word c + 4 of sub-block 2 sp, the
 * same of sub-block 2 sp + 1): an MMA's A (rows g, g + 8) and B (row g)
 * fragment words for both sub-blocks in one 16-byte load. The word index
 * is XORed with 4 on odd rows, so the 8 threads of a quarter-warp (rows
 * g, g + 1) read disjoint banks. */
typedef char k_mma2_tile_fits[K_MMA_KQ_NSG % 2 == 0 && K_MMA_KQ_NT % 2 == 0 ? 1 : -1];
#define K_M2_WNT (K_MMA_KQ_NT / 2u)  /* n-tiles per SIMD-group */
#define K_M2_WMW (K_MMA_KQ_NSG / 2u) /* SIMD-groups along the weight rows (2 along the activation rows) */
#define K_M2_IX(row, sp, c) (16u * (row) + ((4u * (sp) + (c)) ^ (((row) & 1u) << 2)))

/* The tile's threadgroup memory, one struct so that both kernels declare
 * it in one line (the emulator tells threadgroup arrays apart by their
 * source line): kw, ksc, kdw per weight row; kx, kbs, kdx per activation
 * row (the layouts above and in k_m2_stage). */
typedef struct {
    k_u32x4 kw[16 * K_MMA_KQ_WR];
    k_u32x4 ksc[4 * K_MMA_KQ_WR];
    float kdw[2 * K_MMA_KQ_WR];
    k_u32x4 kx[16 * K_MMA_KQ_TR];
    k_u32x4 kbs[2 * K_MMA_KQ_TR];
    float kdx[K_MMA_KQ_TR];
} k_m2_smem;

/* Stage super-block ib of the tile (every thread; a barrier before and
 * after is the caller's). Weight element (row j, half h): codes of
 * sub-blocks 4h..4h+3 and their scales; activation element (row a, pair
 * sp): the codes of sub-blocks 2sp, 2sp + 1 (sp 0 also bsums and d_x).
 * Rows past n_out / m.n are staged clamped (never stored). */
K_FN void k_m2_stage(K_DEV_IN k_u8 *w, k_u32 wbase, k_u32 type, k_u32 nb, k_u32 n_out, k_u32 wr0,
                     K_DEV_IN k_u8 *xq, K_DEV_IN k_u32 *order, k_gemm_map m, k_u32 ib, K_TGM k_u32x4 *kw,
                     K_TGM k_u32x4 *ksc, K_TGM float *kdw, K_TGM k_u32x4 *kx, K_TGM k_u32x4 *kbs,
                     K_TGM float *kdx, k_u32 tid) {
    const k_u32 bs = K_KQ_BLOCK_BYTES(type);
    K_DEV_IN k_u32x4 *w4 = (K_DEV_IN k_u32x4 *)w;
    K_DEV_IN k_u32 *w32 = (K_DEV_IN k_u32 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    for (k_u32 e = tid; e < 2u * K_MMA_KQ_WR; e += K_MMA_KQ_TG) {
        const k_u32 j = e >> 1, h = e & 1u, blk = k_mma_min(wr0 + j, n_out - 1u) * nb + ib;
        k_u32x4 v;
        if (type == K_TYPE_Q6_K) {
            /* 210-byte blocks (2-aligned): ql[64h..+63], qh[32h..+31],
             * scales[8h..+7], d; sub-block 4h + q, word wd (values 4wd..+3):
             * ql word 8 (q & 1) + wd, nibble q >> 1; qh word wd, bits 2q */
            const k_u32 wo = wbase + blk * 210u;
            k_u32 ql[16], qh[8];
            K_UNROLL for (k_u32 i = 0; i < 8u; i++) {
                const k_u32x2 a = k_ld_pair2(w32, wo + 64u * h + 8u * i);
                ql[2u * i] = a.x, ql[2u * i + 1u] = a.y;
            }
            K_UNROLL for (k_u32 i = 0; i < 4u; i++) {
                const k_u32x2 a = k_ld_pair2(w32, wo + 128u + 32u * h + 8u * i);
                qh[2u * i] = a.x, qh[2u * i + 1u] = a.y;
            }
            K_UNROLL for (k_u32 u = 0; u < 2u; u++) { /* pair sp = 2h + u: q = 2u, 2u + 1 */
                k_u32 c0[8], c1[8];
                K_UNROLL for (k_u32 wd = 0; wd < 8u; wd++) {
                    c0[wd] = k_q6_signed(((ql[wd] >> (4u * u)) & 0x0f0f0f0fu) | (((qh[wd] >> (4u * u)) & 0x03030303u) << 4));
                    c1[wd] = k_q6_signed(((ql[8u + wd] >> (4u * u)) & 0x0f0f0f0fu) |
                                         (((qh[wd] >> (4u * u + 2u)) & 0x03030303u) << 4));
                }
                K_UNROLL for (k_u32 c = 0; c < 4u; c++) {
                    v.x = c0[c], v.y = c0[c + 4u], v.z = c1[c], v.w = c1[c + 4u];
                    K_ST(kw, K_M2_IX(j, 2u * h + u, c), v);
                }
            }
            const k_u32x2 sc = k_ld_pair2(w32, wo + 192u + 8u * h); /* scales 8h..8h+7: ints 8h.. of ksc row j */
            K_UNROLL for (k_u32 u = 0; u < 2u; u++) {
                const k_u32 s4 = u ? sc.y : sc.x;
                v.x = (k_u32)k_i8(s4 & 0xffu), v.y = (k_u32)k_i8((s4 >> 8) & 0xffu);
                v.z = (k_u32)k_i8((s4 >> 16) & 0xffu), v.w = (k_u32)k_i8(s4 >> 24);
                K_ST(ksc, 4u * j + 2u * h + u, v);
            }
            if (h == 0u) K_ST(kdw, 2u * j, k_h2f((k_u16)k_ld_u16_at(w16, wo + 208u))), K_ST(kdw, 2u * j + 1u, 0.0f);
        } else {
            /* Q4_K / Q5_K (16-aligned): header chunk, qs[64h..+63] (byte
             * 32 sp + l: value l of sub-block 2 sp low, of 2 sp + 1 high),
             * Q5_K qh[0..31] (bit s of byte l: the fifth bit of value l of
             * sub-block s) */
            const k_u32 c0 = wbase / 16u + blk * (bs / 16u), q5 = type == K_TYPE_Q5_K;
            const k_u32x4 hd = K_LD(w4, c0);
            k_u32 qs[16], qh[8];
            K_UNROLL for (k_u32 i = 0; i < 4u; i++) {
                const k_u32x4 a = K_LD(w4, c0 + (q5 ? 3u : 1u) + 4u * h + i);
                qs[4u * i] = a.x, qs[4u * i + 1u] = a.y, qs[4u * i + 2u] = a.z, qs[4u * i + 3u] = a.w;
            }
            K_UNROLL for (k_u32 i = 0; i < 8u; i++) qh[i] = 0u;
            if (q5) {
                const k_u32x4 a = K_LD(w4, c0 + 1u), b = K_LD(w4, c0 + 2u);
                qh[0] = a.x, qh[1] = a.y, qh[2] = a.z, qh[3] = a.w, qh[4] = b.x, qh[5] = b.y, qh[6] = b.z, qh[7] = b.w;
            }
            K_UNROLL for (k_u32 u = 0; u < 2u; u++) {
                const k_u32 sp = 2u * h + u;
                k_u32 lo[8], hi[8];
                K_UNROLL for (k_u32 wd = 0; wd < 8u; wd++) {
                    const k_u32 q = qs[8u * u + wd];
                    lo[wd] = (q & 0x0f0f0f0fu) | (((qh[wd] >> (2u * sp)) & 0x01010101u) << 4);
                    hi[wd] = ((q >> 4) & 0x0f0f0f0fu) | (((qh[wd] >> (2u * sp + 1u)) & 0x01010101u) << 4);
                }
                K_UNROLL for (k_u32 c = 0; c < 4u; c++) {
                    v.x = lo[c], v.y = lo[c + 4u], v.z = hi[c], v.w = hi[c + 4u];
                    K_ST(kw, K_M2_IX(j, sp, c), v);
                }
            }
            /* ggml get_scale_min_k4 of sub-blocks 4h..4h+3: with k = s & 3
             * and bytes A = scales[k], B = scales[k + 4], E = scales[k + 8]:
             * s < 4: sc A & 63, m B & 63; s >= 4: sc (E & 15) | (A >> 6) << 4,
             * m (E >> 4) | (B >> 6) << 4. ksc row j: ints 0..7 the scales,
             * 8..15 the mins. */
            int scv[4], mnv[4];
            K_UNROLL for (k_u32 k = 0; k < 4u; k++) {
                const k_u32 A = (hd.y >> (8u * k)) & 0xffu, B = (hd.z >> (8u * k)) & 0xffu, E = (hd.w >> (8u * k)) & 0xffu;
                scv[k] = (int)(h == 0u ? A & 63u : (E & 15u) | ((A >> 6) << 4));
                mnv[k] = (int)(h == 0u ? B & 63u : (E >> 4) | ((B >> 6) << 4));
            }
            v.x = (k_u32)scv[0], v.y = (k_u32)scv[1], v.z = (k_u32)scv[2], v.w = (k_u32)scv[3];
            K_ST(ksc, 4u * j + h, v);
            v.x = (k_u32)mnv[0], v.y = (k_u32)mnv[1], v.z = (k_u32)mnv[2], v.w = (k_u32)mnv[3];
            K_ST(ksc, 4u * j + 2u + h, v);
            if (h == 0u) {
                K_ST(kdw, 2u * j, k_h2f((k_u16)(hd.x & 0xffffu)));
                K_ST(kdw, 2u * j + 1u, k_h2f((k_u16)(hd.x >> 16)));
            }
        }
    }
    for (k_u32 e = tid; e < 4u * K_MMA_KQ_TR; e += K_MMA_KQ_TG) {
        const k_u32 a = e >> 2, sp = e & 3u;
        const k_u32 xb = k_gemm_act(m, k_gemm_row(order, m, k_mma_min(a, m.n - 1u))) / 4u + ib * 73u;
        k_u32 x[16];
        K_UNROLL for (k_u32 i = 0; i < 16u; i++) x[i] = K_LD(x32, xb + 1u + 16u * sp + i);
        K_UNROLL for (k_u32 c = 0; c < 4u; c++) {
            k_u32x4 v;
            v.x = x[c], v.y = x[c + 4u], v.z = x[8u + c], v.w = x[12u + c];
            K_ST(kx, K_M2_IX(a, sp, c), v);
        }
        if (sp == 0u) {
            /* bsums (int16 at word 65..72): the 8 sums of 32 (Q4_K/Q5_K's
             * min term; the bsums as stored, as the matvec reads them) */
            int b32[8];
            K_UNROLL for (k_u32 i = 0; i < 8u; i++) {
                const k_u32 bw = K_LD(x32, xb + 65u + i);
                b32[i] = k_mma_i16(bw) + k_mma_i16(bw >> 16);
            }
            k_u32x4 v;
            v.x = (k_u32)b32[0], v.y = (k_u32)b32[1], v.z = (k_u32)b32[2], v.w = (k_u32)b32[3];
            K_ST(kbs, 2u * a, v);
            v.x = (k_u32)b32[4], v.y = (k_u32)b32[5], v.z = (k_u32)b32[6], v.w = (k_u32)b32[7];
            K_ST(kbs, 2u * a + 1u, v);
            K_ST(kdx, a, k_bits_f32(K_LD(x32, xb)));
        }
    }
}

/* int i of a 16-byte word */
K_FN int k_m2_at(k_u32x4 v, k_u32 i) { return (int)(i == 0u ? v.x : i == 1u ? v.y : i == 2u ? v.z : v.w); }

K_FN void k_mma_kq_tile(K_DEV_IN k_u8 *w, k_u32 wbase, k_u32 type, k_u32 n_in, k_u32 n_out, k_u32 wr0,
                        K_DEV_IN k_u8 *xq, K_DEV_IN k_u32 *order, k_gemm_map m, K_DEV float *y, K_TGM k_u32x4 *kw,
                        K_TGM k_u32x4 *ksc, K_TGM float *kdw, K_TGM k_u32x4 *kx, K_TGM k_u32x4 *kbs,
                        K_TGM float *kdx, k_u32 tid, k_u32 lane, k_u32 sg) {
    const k_u32 nb = n_in / 256u, g = lane >> 2, c = lane & 3u, q6 = type == K_TYPE_Q6_K;
    const k_u32 wm = sg % K_M2_WMW, wn = sg / K_M2_WMW;
    k_u32 jr[2][2]; /* tile weight rows of m-tile i: g, g + 8 */
    K_UNROLL for (k_u32 i = 0; i < 2u; i++) jr[i][0] = 32u * wm + 16u * i + g, jr[i][1] = jr[i][0] + 8u;
    const k_u32 xr0 = 8u * K_M2_WNT * wn; /* the SIMD-group's first activation row */
    const k_i32x4 z = {0, 0, 0, 0};
    float acc[2][K_M2_WNT][4], sv[2][K_M2_WNT][4];
    for (k_u32 P = 0; P < 4u; P++) {
        K_UNROLL for (k_u32 i = 0; i < 2u; i++)
            K_UNROLL for (k_u32 n = 0; n < K_M2_WNT; n++)
                K_UNROLL for (k_u32 e = 0; e < 4u; e++) acc[i][n][e] = 0.0f;
        for (k_u32 ib = P; ib < nb; ib += 4u) {
            K_BARRIER(); /* the previous super-block's words are read */
            k_m2_stage(w, wbase, type, nb, n_out, wr0, xq, order, m, ib, kw, ksc, kdw, kx, kbs, kdx, tid);
            K_BARRIER();
            int S[2][K_M2_WNT][4];
            K_UNROLL for (k_u32 i = 0; i < 2u; i++)
                K_UNROLL for (k_u32 n = 0; n < K_M2_WNT; n++)
                    K_UNROLL for (k_u32 e = 0; e < 4u; e++) S[i][n][e] = 0;
            K_UNROLL for (k_u32 sp = 0; sp < 4u; sp++) {
                k_u32x4 ra[2], rb[2], bx[K_M2_WNT], sa[2], sb[2];
                K_UNROLL for (k_u32 i = 0; i < 2u; i++) {
                    ra[i] = K_LD(kw, K_M2_IX(jr[i][0], sp, c)), rb[i] = K_LD(kw, K_M2_IX(jr[i][1], sp, c));
                    /* Q4_K/Q5_K: scales 2sp, 2sp + 1 in ints (sp & 1) 2.. of
                     * word sp >> 1; Q6_K: groups 4sp..4sp+3 in word sp */
                    sa[i] = K_LD(ksc, 4u * jr[i][0] + (q6 ? sp : sp >> 1));
                    sb[i] = K_LD(ksc, 4u * jr[i][1] + (q6 ? sp : sp >> 1));
                }
                K_UNROLL for (k_u32 n = 0; n < K_M2_WNT; n++) bx[n] = K_LD(kx, K_M2_IX(xr0 + 8u * n + g, sp, c));
                K_UNROLL for (k_u32 s = 0; s < 2u; s++) {
                    K_UNROLL for (k_u32 n = 0; n < K_M2_WNT; n++) {
                        if (xr0 + 8u * n >= m.n) continue; /* uniform: a whole n-tile past the rows */
                        K_UNROLL for (k_u32 i = 0; i < 2u; i++) {
#ifdef PLANT_MMA_FRAGMENT_SWAP
                            /* planted fault (tests must turn red): A registers of rows g, g + 8
                             * swapped for the first 16 codes of the even sub-blocks */
                            const k_u32 a0 = rb[i].x, b0 = ra[i].x;
#else
                            const k_u32 a0 = ra[i].x, b0 = rb[i].x;
#endif
                            if (!q6) {
                                const k_i32x4 D = s ? k_mma_s8_k32(z, ra[i].z, rb[i].z, ra[i].w, rb[i].w, bx[n].z, bx[n].w)
                                                    : k_mma_s8_k32(z, a0, b0, ra[i].y, rb[i].y, bx[n].x, bx[n].y);
                                const int s0 = k_m2_at(sa[i], 2u * (sp & 1u) + s), s1 = k_m2_at(sb[i], 2u * (sp & 1u) + s);
                                S[i][n][0] += s0 * D.x, S[i][n][1] += s0 * D.y;
                                S[i][n][2] += s1 * D.z, S[i][n][3] += s1 * D.w;
                            } else { /* two 16-value scale groups per sub-block */
                                const k_i32x4 D0 = s ? k_mma_s8_k16(z, ra[i].z, rb[i].z, bx[n].z) : k_mma_s8_k16(z, a0, b0, bx[n].x);
                                const k_i32x4 D1 = s ? k_mma_s8_k16(z, ra[i].w, rb[i].w, bx[n].w) : k_mma_s8_k16(z, ra[i].y, rb[i].y, bx[n].y);
                                const int s00 = k_m2_at(sa[i], 2u * s), s01 = k_m2_at(sa[i], 2u * s + 1u);
                                const int s10 = k_m2_at(sb[i], 2u * s), s11 = k_m2_at(sb[i], 2u * s + 1u);
                                S[i][n][0] += s00 * D0.x + s01 * D1.x, S[i][n][1] += s00 * D0.y + s01 * D1.y;
                                S[i][n][2] += s10 * D0.z + s11 * D1.z, S[i][n][3] += s10 * D0.w + s11 * D1.w;
                            }
                        }
                    }
                }
            }
            /* the super-block's two float terms per output (quant_kq.h) */
            K_UNROLL for (k_u32 i = 0; i < 2u; i++) {
                const float dA = K_LD(kdw, 2u * jr[i][0]), dB = K_LD(kdw, 2u * jr[i][1]);
                const float mA = K_LD(kdw, 2u * jr[i][0] + 1u), mB = K_LD(kdw, 2u * jr[i][1] + 1u);
                k_u32x4 mn[2][2]; /* mins of rows g, g + 8 */
                if (!q6) {
                    mn[0][0] = K_LD(ksc, 4u * jr[i][0] + 2u), mn[0][1] = K_LD(ksc, 4u * jr[i][0] + 3u);
                    mn[1][0] = K_LD(ksc, 4u * jr[i][1] + 2u), mn[1][1] = K_LD(ksc, 4u * jr[i][1] + 3u);
                }
                K_UNROLL for (k_u32 n = 0; n < K_M2_WNT; n++) {
                    const k_u32 xa = xr0 + 8u * n + 2u * c; /* activation rows xa, xa + 1 */
                    if (xr0 + 8u * n >= m.n) continue;
                    const float dx0 = K_LD(kdx, xa), dx1 = K_LD(kdx, xa + 1u);
                    acc[i][n][0] += (dA * dx0) * (float)S[i][n][0], acc[i][n][1] += (dA * dx1) * (float)S[i][n][1];
                    acc[i][n][2] += (dB * dx0) * (float)S[i][n][2], acc[i][n][3] += (dB * dx1) * (float)S[i][n][3];
                    if (!q6) {
                        const k_u32x4 b00 = K_LD(kbs, 2u * xa), b01 = K_LD(kbs, 2u * xa + 1u);
                        const k_u32x4 b10 = K_LD(kbs, 2u * xa + 2u), b11 = K_LD(kbs, 2u * xa + 3u);
                        int M[4] = {0, 0, 0, 0};
                        K_UNROLL for (k_u32 s = 0; s < 8u; s++) {
                            const int bx0 = k_m2_at(s < 4u ? b00 : b01, s & 3u), bx1 = k_m2_at(s < 4u ? b10 : b11, s & 3u);
                            const int ma = k_m2_at(mn[0][s >> 2], s & 3u), mb = k_m2_at(mn[1][s >> 2], s & 3u);
                            M[0] += ma * bx0, M[1] += ma * bx1, M[2] += mb * bx0, M[3] += mb * bx1;
                        }
                        acc[i][n][0] -= (mA * dx0) * (float)M[0], acc[i][n][1] -= (mA * dx1) * (float)M[1];
                        acc[i][n][2] -= (mB * dx0) * (float)M[2], acc[i][n][3] -= (mB * dx1) * (float)M[3];
                    }
                }
            }
        }
        /* ((S0 + S1) + S2) + S3 */
        K_UNROLL for (k_u32 i = 0; i < 2u; i++)
            K_UNROLL for (k_u32 n = 0; n < K_M2_WNT; n++)
                K_UNROLL for (k_u32 e = 0; e < 4u; e++) sv[i][n][e] = P == 0u ? acc[i][n][e] : sv[i][n][e] + acc[i][n][e];
    }
    K_UNROLL for (k_u32 i = 0; i < 2u; i++)
        K_UNROLL for (k_u32 n = 0; n < K_M2_WNT; n++)
            K_UNROLL for (k_u32 e = 0; e < 4u; e++) {
                const k_u32 row = xr0 + 8u * n + 2u * c + (e & 1u), o = wr0 + jr[i][e >> 1];
                if (row < m.n && o < n_out) K_ST(y, m.ybase + k_gemm_row(order, m, row) * m.ystride + o, sv[i][n][e]);
            }
}
#else
/* the first tile serves gemm_kq_mma with Q8_0's threadgroup shape */
typedef char k_mma_kq_tile_is_q8s[K_MMA_KQ_NSG == K_MMA_NSG && K_MMA_KQ_NT == K_MMA_NT ? 1 : -1];
K_FN void k_mma_kq_tile(K_DEV_IN k_u8 *w, k_u32 wbase, k_u32 type, k_u32 n_in, k_u32 n_out, k_u32 wr0,
                        K_DEV_IN k_u8 *xq, K_DEV_IN k_u32 *order, k_gemm_map m, K_DEV float *y, K_TGM float *tp,
                        K_TGM k_u32x4 *kw, K_TGM k_u32x4 *ks, K_TGM k_u32x4 *kx, K_TGM float *kd, K_TGM k_u32x4 *kb,
                        k_u32 tid, k_u32 lane, k_u32 sg) {
    const k_u32 nb = n_in / 256u, g = lane >> 2, c = lane & 3u, q6 = type == K_TYPE_Q6_K;
    const k_u32 o0 = wr0 + 16u * sg;
    const k_u32 j0 = 16u * sg + g, j1 = j0 + 8u; /* the A fragment's rows g, g + 8 */
    float t1[K_MMA_NT][4];
    K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
        K_UNROLL for (k_u32 e = 0; e < 4u; e++) t1[n][e] = 0.0f;
    const k_i32x4 z = {0, 0, 0, 0};
    k_mma_kq_raw R;
#if K_MMA_PREFETCH
    k_mma_kq_load(w, wbase, xq, order, m, type, nb, n_out, wr0, 0u, 0u, &R, tid); /* step (0, 0) exists: nb >= 1 */
#endif
    for (k_u32 L = 0; L < 32u; L += 2u) {
        const k_u32 t = L & 7u; /* even: the pair is shares t, t + 1 */
        float accA[K_MMA_NT][4], accB[K_MMA_NT][4];
        K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++)
            K_UNROLL for (k_u32 e = 0; e < 4u; e++) accA[n][e] = accB[n][e] = 0.0f;
        /* chains L, L + 1: shares t, t + 1 of the super-blocks ib = L >> 3
         * (mod 4), ascending; the bounds are the whole threadgroup's */
        for (k_u32 ib = L >> 3; ib < nb; ib += 4u) {
            K_BARRIER(); /* the previous step's fragments are read */
#if !K_MMA_PREFETCH
            k_mma_kq_load(w, wbase, xq, order, m, type, nb, n_out, wr0, t, ib, &R, tid);
#endif
            k_mma_kq_store(type, t, &R, kw, ks, kx, kd, kb, tid);
            K_BARRIER();
#if K_MMA_PREFETCH
            { /* the next step's words: in flight while this one computes */
                k_u32 nL = L, nib = ib;
                k_mma_kq_next(nb, &nL, &nib);
                if (nL < 32u) k_mma_kq_load(w, wbase, xq, order, m, type, nb, n_out, wr0, nL & 7u, nib, &R, tid);
            }
#endif
            const k_u32x4 sa = K_LD(ks, 2u * j0), sb = K_LD(ks, 2u * j1); /* scales (and mins) */
            const k_u32x4 da = K_LD(ks, 2u * j0 + 1u), db = K_LD(ks, 2u * j1 + 1u); /* d, dmin */
            const float dA = k_bits_f32(da.x), dB = k_bits_f32(db.x);
            if (q6) {
                const k_u32x4 zz = {0u, 0u, 0u, 0u};
                const k_u32x4 A0 = c < 2u ? K_LD(kw, 4u * j0 + 2u * c) : zz, A1 = c < 2u ? K_LD(kw, 4u * j0 + 2u * c + 1u) : zz;
                const k_u32x4 B0 = c < 2u ? K_LD(kw, 4u * j1 + 2u * c) : zz, B1 = c < 2u ? K_LD(kw, 4u * j1 + 2u * c + 1u) : zz;
                const int scA[4] = {(int)sa.x, (int)sa.y, (int)sa.z, (int)sa.w};
                const int scB[4] = {(int)sb.x, (int)sb.y, (int)sb.z, (int)sb.w};
                K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
                    if (8u * n >= m.n) continue; /* uniform: a whole tile past the rows */
                    const k_u32 xa = 4u * (8u * n + g) + 2u * c;
                    const k_u32x4 X0 = c < 2u ? K_LD(kx, xa) : zz, X1 = c < 2u ? K_LD(kx, xa + 1u) : zz;
                    const float dx0 = K_LD(kd, 8u * n + 2u * c), dx1 = K_LD(kd, 8u * n + 2u * c + 1u);
                    const float f0 = dA * dx0, f1 = dA * dx1, f2 = dB * dx0, f3 = dB * dx1;
                    K_UNROLL for (k_u32 s2 = 0; s2 < 2u; s2++) {
                        const k_u32x4 a4 = s2 ? A1 : A0, b4 = s2 ? B1 : B0, x4 = s2 ? X1 : X0;
                        const k_u32 av[4] = {a4.x, a4.y, a4.z, a4.w}, bv[4] = {b4.x, b4.y, b4.z, b4.w};
                        const k_u32 xv[4] = {x4.x, x4.y, x4.z, x4.w};
                        k_i32x4 sq[4];
                        K_UNROLL for (k_u32 q = 0; q < 4u; q++) {
#ifdef PLANT_MMA_FRAGMENT_SWAP
                            sq[q] = k_mma_s8_k16(z, q + s2 ? av[q] : bv[q], q + s2 ? bv[q] : av[q], xv[q]);
#else
                            sq[q] = k_mma_s8_k16(z, av[q], bv[q], xv[q]);
#endif
                        }
                        const int p0 = scA[0] * sq[0].x + scA[1] * sq[1].x + scA[2] * sq[2].x + scA[3] * sq[3].x;
                        const int p1 = scA[0] * sq[0].y + scA[1] * sq[1].y + scA[2] * sq[2].y + scA[3] * sq[3].y;
                        const int p2 = scB[0] * sq[0].z + scB[1] * sq[1].z + scB[2] * sq[2].z + scB[3] * sq[3].z;
                        const int p3 = scB[0] * sq[0].w + scB[1] * sq[1].w + scB[2] * sq[2].w + scB[3] * sq[3].w;
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
                const k_u32x4 A = K_LD(kw, 4u * j0 + c), B = K_LD(kw, 4u * j1 + c);
                const k_u32 alo[2] = {A.x, A.y}, ahi[2] = {A.z, A.w}, blo[2] = {B.x, B.y}, bhi[2] = {B.z, B.w};
                const int Asl = (int)sa.x, Ash = (int)sa.y, Aml = (int)sa.z, Amh = (int)sa.w;
                const int Bsl = (int)sb.x, Bsh = (int)sb.y, Bml = (int)sb.z, Bmh = (int)sb.w;
                const float mA = k_bits_f32(da.y), mB = k_bits_f32(db.y);
                K_UNROLL for (k_u32 n = 0; n < K_MMA_NT; n++) {
                    if (8u * n >= m.n) continue;
                    const k_u32x4 X = K_LD(kx, 4u * (8u * n + g) + c);
                    const k_u32 xlo[2] = {X.x, X.y}, xhi[2] = {X.z, X.w};
                    /* activation rows 2c, 2c + 1 of the tile: d_x and the runs' bsums */
                    const k_u32x4 D0 = K_LD(kb, 8u * n + 2u * c), D1 = K_LD(kb, 8u * n + 2u * c + 1u);
                    const float dx0 = K_LD(kd, 8u * n + 2u * c), dx1 = K_LD(kd, 8u * n + 2u * c + 1u);
                    const float f0 = dA * dx0, f1 = dA * dx1, f2 = dB * dx0, f3 = dB * dx1;
                    const float m0f = mA * dx0, m1f = mA * dx1, m2f = mB * dx0, m3f = mB * dx1;
                    K_UNROLL for (k_u32 s2 = 0; s2 < 2u; s2++) {
                        const k_u32 xl = xlo[s2], xh = xhi[s2];
#ifdef PLANT_MMA_FRAGMENT_SWAP
                        const k_i32x4 sl = k_mma_s8_k16(z, blo[s2], alo[s2], xl);
#else
                        const k_i32x4 sl = k_mma_s8_k16(z, alo[s2], blo[s2], xl);
#endif
                        const k_i32x4 sh = k_mma_s8_k16(z, ahi[s2], bhi[s2], xh);
                        /* the share's run bsums (int16) of rows 2c, 2c + 1: gemm.h's b0, b1 */
                        const int b00 = (int)(s2 ? D0.y : D0.x), b01 = (int)(s2 ? D0.w : D0.z);
                        const int b10 = (int)(s2 ? D1.y : D1.x), b11 = (int)(s2 ? D1.w : D1.z);
                        /* matvec_kq's terms: (d_w d_x) part, then - (dmin_w d_x) mpart */
                        const float v0 = f0 * (float)(Asl * sl.x + Ash * sh.x), u0 = m0f * (float)(Aml * b00 + Amh * b01);
                        const float v1 = f1 * (float)(Asl * sl.y + Ash * sh.y), u1 = m1f * (float)(Aml * b10 + Amh * b11);
                        const float v2 = f2 * (float)(Bsl * sl.z + Bsh * sh.z), u2 = m2f * (float)(Bml * b00 + Bmh * b01);
                        const float v3 = f3 * (float)(Bsl * sl.w + Bsh * sh.w), u3 = m3f * (float)(Bml * b10 + Bmh * b11);
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
        K_MMA_PAIR_DONE_MAP(L, accA, accB, t1, tp, y, order, m, n_out, o0, g, c, tid);
    }
}

#endif

K_KERNEL_BOUNDED(gemm_kq_mma, K_MMA_KQ_TG, K_MMA_KQ_TGS) {
    K_CHECK_TAG(gemm_kq_mma);
    const k_u32 type = p.wtype, bs = K_KQ_BLOCK_BYTES(type);
    if (!(p.n_in % 256u == 0u && p.n_rows > 0u && p.n_out > 0u && K_TG_SIZE == K_MMA_KQ_TG &&
          K_NGX * K_MMA_KQ_TR >= p.n_rows && K_NGY * K_MMA_KQ_WR >= p.n_out) ||
        bs == 0u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 wr0 = K_GY * K_MMA_KQ_WR, r0 = K_GX * K_MMA_KQ_TR;
    if (wr0 >= p.n_out || r0 >= p.n_rows) return; /* a whole threadgroup (a grid wider than needed) */
    /* the threadgroup memory k_mma_kq_tile works in (one declaration a
     * line: the emulator tells arrays apart by their line) */
#if K_KQ_ORDER == 2
    K_TG_ARRAY(k_m2_smem, sm, 1);
#define K_MMA_KQ_ARRAYS sm->kw, sm->ksc, sm->kdw, sm->kx, sm->kbs, sm->kdx
#else
    K_TG_ARRAY(float, tp, 3 * K_MMA_NT * 4 * K_MMA_TG);
    K_TG_ARRAY(k_u32x4, kw, 4 * K_MMA_WR);
    K_TG_ARRAY(k_u32x4, ks, 2 * K_MMA_WR);
    K_TG_ARRAY(k_u32x4, kx, 4 * K_MMA_TR);
    K_TG_ARRAY(float, kd, K_MMA_TR);
    K_TG_ARRAY(k_u32x4, kb, K_MMA_TR);
#define K_MMA_KQ_ARRAYS tp, kw, ks, kx, kd, kb
#endif
    k_gemm_map m;
    m.start = r0, m.n = p.n_rows - r0 < K_MMA_KQ_TR ? p.n_rows - r0 : K_MMA_KQ_TR, m.grouped = 0u, m.split = 0xffffffffu;
    m.div = 1u, m.rb0 = p.n_in / 256u * 292u, m.base1 = 0u, m.rb1 = 0u, m.ystride = p.y_stride, m.ybase = 0u;
    k_mma_kq_tile(w, 0u, type, p.n_in, p.n_out, wr0, xq, (K_DEV_IN k_u32 *)y, m, y, K_MMA_KQ_ARRAYS, K_TID,
                  K_LANE, K_SIMD);
#undef K_MMA_KQ_ARRAYS
}

/* The grouped MoE's GEMM (moe_gemm.h) on the staged tensor-core tile: tile
 * K_GX of moe_group's table (tile_rows = K_MMA_KQ_TR), weight rows [K_GY
 * K_MMA_KQ_WR, + K_MMA_KQ_WR) of matrix K_GZ of the tile's expert. Every value
 * is gemm_kq_mma's and so the matvec's (the same tile body), as moe_gemm's
 * is: y is the per-pair kernels' bit for bit (suite moe). */
K_KERNEL_BOUNDED(moe_gemm_mma, K_MMA_KQ_TG, K_MMA_KQ_TGS) {
    K_CHECK_TAG(moe_gemm_mma);
    const k_u32 sh = p.n_out_sh != 0u, nz = K_NGZ;
    const k_u32 nmax = p.n_out > p.n_out_sh ? p.n_out : p.n_out_sh;
#define K_MOE_KQ(t) (K_KQ_BLOCK_BYTES(t) != 0u)
    const int types_ok = K_MOE_KQ(p.t0) && (nz < 2u || K_MOE_KQ(p.t1)) &&
                         (!sh || (K_MOE_KQ(p.ts0) && (nz < 2u || K_MOE_KQ(p.ts1))));
#undef K_MOE_KQ
    if (!types_ok || K_TG_SIZE != K_MMA_KQ_TG || p.k == 0u || nz > (p.down ? 1u : 2u) || K_NGX < p.n_tiles ||
        K_NGY * K_MMA_KQ_WR < nmax || p.y_stride < (nz - 1u) * p.y_zoff + nmax ||
        (p.base0 | p.estride0 | p.base1 | p.estride1 | p.sbase0 | p.sbase1) % 16u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_moe_tile T = k_moe_gemm_tile(p, tiles, K_GX, K_GZ, K_GY * K_MMA_KQ_WR, K_MMA_KQ_TR);
    if (T.what == 2u) k_raise(status, K_ERR_SHAPE);
    if (T.what != 0u) return; /* a whole threadgroup, before any barrier */
    /* the threadgroup memory k_mma_kq_tile works in (one declaration a line) */
#if K_KQ_ORDER == 2
    K_TG_ARRAY(k_m2_smem, sm, 1);
#define K_MMA_KQ_ARRAYS sm->kw, sm->ksc, sm->kdw, sm->kx, sm->kbs, sm->kdx
#else
    K_TG_ARRAY(float, tp, 3 * K_MMA_NT * 4 * K_MMA_TG);
    K_TG_ARRAY(k_u32x4, kw, 4 * K_MMA_WR);
    K_TG_ARRAY(k_u32x4, ks, 2 * K_MMA_WR);
    K_TG_ARRAY(k_u32x4, kx, 4 * K_MMA_TR);
    K_TG_ARRAY(float, kd, K_MMA_TR);
    K_TG_ARRAY(k_u32x4, kb, K_MMA_TR);
#define K_MMA_KQ_ARRAYS tp, kw, ks, kx, kd, kb
#endif
    k_mma_kq_tile(w, T.wbase, T.type, T.n_in, T.n_out, K_GY * K_MMA_KQ_WR, xqk, order, T.m, y, K_MMA_KQ_ARRAYS,
                  K_TID, K_LANE, K_SIMD);
#undef K_MMA_KQ_ARRAYS
}
