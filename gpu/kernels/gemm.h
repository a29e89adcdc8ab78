/*
 * gemm.h — the prefill GEMM (table.h gemm_q8_0 / gemm_kq): chunks of more
 * than K_MATVEC_MAX_ROWS activation rows, every output value bit for bit
 * the width-1 matvec's (DESIGN.md invariant 1: a row's result never
 * depends on how many rows share its launch, nor on which kernel serves
 * it).
 *
 * Why the bits agree. The matvecs (quant_q8_0.h, quant_kq.h with
 * K_MATVEC_ROWS_PER_SIMD 1 / any K-quant variant) give each output value
 * 32 float accumulators, one per lane L = 8 j + t of a SIMD-group, then
 * the butterfly (octet 1, 2, 4, then 8, 16: k_matvec_row_sum):
 *   Q8_0: lane 8 j + t adds the term sumi * (d_w * d_x) of every block ib
 *         with ib mod 32 = 4 t + j, ascending (quant_q8_0.h THE ORDER);
 *   K-quants: lane 8 P + t adds, for every super-block ib = P mod 4
 *         ascending, its share's two terms (d_w d_x) part and
 *         -(dmin_w d_x) mpart (one for Q6_K).
 * The integer parts (sumi, part, mpart) are exact whoever sums them. Here
 * lane L keeps the same accumulator for every (weight row, activation
 * row) of its tile, computing its own block / share whole (no octet
 * shuffles), adds the same float terms in the same order, and ends with
 * the same butterfly: the same value. 1024 inputs (32 Q8_0 blocks or 4
 * super-blocks) make one round: one block or share per lane.
 *
 * Tiling. A threadgroup of K_GEMM_NSG SIMD-groups serves activation rows
 * [K_GX K_GEMM_TR, + K_GEMM_TR) (consecutive threadgroups share weight
 * rows, so the L2 keeps them) and weight rows [K_GY K_GEMM_NSG K_GEMM_TOS,
 * + K_GEMM_NSG K_GEMM_TOS), K_GEMM_TOS per SIMD-group. Per round the
 * threadgroup stages the activation tile in threadgroup memory, each lane's
 * entry repacked into three 16-byte words (8 code words; d_x and, for
 * K-quants, its two bsums sign-extended): 48-byte entries, so the 8 lanes
 * a 16-byte access serves at a time hit 8 disjoint groups of 4 banks; every
 * SIMD-group then reads it for all its weight rows. Weights go straight to registers, each word loaded once per
 * tile and dotted with K_GEMM_TR rows. Accumulators: K_GEMM_TOS x
 * K_GEMM_TR per lane (64 by default).
 */

#ifndef K_GEMM_TILE_MAX_BYTES
#define K_GEMM_TILE_MAX_BYTES 32768 /* Apple GPUs: 32 KB of threadgroup memory */
#endif
typedef char k_gemm_tile_fits[K_GEMM_TR * 32 * 12 * 4 <= K_GEMM_TILE_MAX_BYTES &&
                                      K_GEMM_NSG * 32 <= 1024 && K_GEMM_TOS >= 1 && K_GEMM_TR >= 1
                                  ? 1
                                  : -1];

/* Which rows a tile serves. Tile row r < n is row P = order[start + r]
 * (grouped: the routed MoE's pairs of one expert, moe.h) or start + r;
 * its activation row starts at byte (P < split ? (P / div) rb0 : base1 +
 * (P - split) rb1) of xq, and its outputs at float ybase + P ystride of
 * y. The dense GEMMs: start = the tile's first row, split past every row,
 * div 1, rb0 = one activation row's bytes. Plain 4-byte fields: Metal
 * passes it by value like any struct. */
typedef struct {
    k_u32 start, n, grouped, split, div, rb0, base1, rb1, ystride, ybase;
} k_gemm_map;
K_FN k_u32 k_gemm_row(K_DEV_IN k_u32 *order, k_gemm_map m, k_u32 r) {
    return m.grouped ? K_LD(order, m.start + r) : m.start + r;
}
K_FN k_u32 k_gemm_act(k_gemm_map m, k_u32 P) {
    return P < m.split ? (m.div == 1u ? P : P / m.div) * m.rb0 : m.base1 + (P - m.split) * m.rb1;
}

/* One threadgroup's tile of the Q8_0 GEMM: weight rows [o0, o0 +
 * K_GEMM_TOS) of this SIMD-group of the matrix at byte wbase of w (rows
 * of n_in / 32 blocks), against the tile's m.n activation rows. xt: the
 * threadgroup's staging array (K_GEMM_TR * 32 * 3 words); tid / lane:
 * K_TID / K_LANE (helpers may not read them, common.h). Every thread of
 * the threadgroup calls it (it has barriers). */
K_FN void k_gemm_q8_0_tile(K_DEV_IN k_u8 *w, k_u32 wbase, k_u32 n_in, k_u32 n_out, k_u32 o0, K_DEV_IN k_u8 *xq,
                           K_DEV_IN k_u32 *order, k_gemm_map m, K_DEV float *y, K_TGM k_u32x4 *xt, k_u32 tid,
                           k_u32 lane) {
    const k_u32 nb = n_in / 32u, a16 = wbase % 16u == 0u && (34u * nb) % 16u == 0u;
    /* lane 8 j + t owns the blocks ib = 4 t + j (mod 32) */
    const k_u32 slot = k_q8_0_adder(lane);
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u16 *x16 = (K_DEV_IN k_u16 *)xq;
    float acc[K_GEMM_TOS][K_GEMM_TR];
    K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++)
        K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) acc[i][r] = 0.0f;
    for (k_u32 base = 0; base < nb; base += 32u) {
        /* stage: entry (r, L) = tile row r's activation block base + slot(L) */
        for (k_u32 e = tid; e < K_GEMM_TR * 32u; e += K_GEMM_TG) {
            const k_u32 r = e / 32u, L = e % 32u, ib = base + 4u * (L & 7u) + (L >> 3);
            if (r >= m.n || ib >= nb) continue; /* never read */
            const k_u32 xo = k_gemm_act(m, k_gemm_row(order, m, r)) + ib * 34u;
            k_u32x4 a, b, c;
            a.x = k_ld_w2(x16, xo + 2u), a.y = k_ld_w2(x16, xo + 6u), a.z = k_ld_w2(x16, xo + 10u),
            a.w = k_ld_w2(x16, xo + 14u);
            b.x = k_ld_w2(x16, xo + 18u), b.y = k_ld_w2(x16, xo + 22u), b.z = k_ld_w2(x16, xo + 26u),
            b.w = k_ld_w2(x16, xo + 30u);
            c.x = k_f32_bits(k_h2f((k_u16)k_ld_u16_at(x16, xo))), c.y = 0u, c.z = 0u, c.w = 0u;
            K_ST(xt, 3u * e, a);
            K_ST(xt, 3u * e + 1u, b);
            K_ST(xt, 3u * e + 2u, c);
        }
        K_BARRIER();
        const k_u32 ib = base + slot;
        if (ib < nb) {
            k_u32 wq[K_GEMM_TOS][8];
            float dw[K_GEMM_TOS];
            K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++) {
#ifdef PLANT_GEMM_OFF_BY_ONE_ROW
                /* planted fault (tests must turn red): the next row's weights, in bounds */
                const k_u32 o = o0 + i + 1u < n_out ? o0 + i + 1u : n_out - 1u;
#else
                const k_u32 o = o0 + i < n_out ? o0 + i : n_out - 1u;
#endif
                const k_u32 wr = wbase + o * 34u * nb; /* the device layout (quant_q8_0.h) */
                const k_u32x4 c0 = k_q8w_ld16(w, k_q8w_code_at(wr, ib), a16);
                const k_u32x4 c1 = k_q8w_ld16(w, k_q8w_code_at(wr, ib) + 16u, a16);
                wq[i][0] = c0.x, wq[i][1] = c0.y, wq[i][2] = c0.z, wq[i][3] = c0.w;
                wq[i][4] = c1.x, wq[i][5] = c1.y, wq[i][6] = c1.z, wq[i][7] = c1.w;
                dw[i] = k_h2f((k_u16)k_ld_u16_at(w16, k_q8w_scale_at(wr, nb, ib)));
            }
            K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) {
                if (r >= m.n) continue;
                const k_u32 e = 3u * (r * 32u + lane);
                const k_u32x4 a = K_LD(xt, e), b = K_LD(xt, e + 1u), c = K_LD(xt, e + 2u);
                const k_u32 xw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                const float dx = k_bits_f32(c.x);
                K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++) {
                    int sumi = 0;
                    K_UNROLL for (k_u32 q = 0; q < 8u; q++) sumi = k_dot4(wq[i][q], xw[q], sumi);
                    acc[i][r] += (float)sumi * (dw[i] * dx);
                }
            }
        }
        K_BARRIER(); /* the tile is read before the next round overwrites it */
    }
    K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++)
        K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) {
            if (r >= m.n) continue; /* uniform: the same r for the whole SIMD-group */
            const float s = k_matvec_row_sum(acc[i][r]);
            if (lane == 0u && o0 + i < n_out) K_ST(y, m.ybase + k_gemm_row(order, m, r) * m.ystride + o0 + i, s);
        }
}

/* The same for the K-quants (Q4_K / Q5_K / Q6_K weights of `type`, Q8_K
 * activation rows); wbase a multiple of 16 for Q4_K / Q5_K. */
K_FN void k_gemm_kq_tile(K_DEV_IN k_u8 *w, k_u32 wbase, k_u32 type, k_u32 n_in, k_u32 n_out, k_u32 o0,
                         K_DEV_IN k_u8 *xq, K_DEV_IN k_u32 *order, k_gemm_map m, K_DEV float *y, K_TGM k_u32x4 *xt,
                         k_u32 tid, k_u32 lane) {
    const k_u32 bs = K_KQ_BLOCK_BYTES(type), nb = n_in / 256u, q6 = type == K_TYPE_Q6_K;
    /* lane 8 P + t: share t of the super-blocks ib = P (mod 4) */
    const k_u32 P = lane >> 3, t = lane & 7u;
    K_DEV_IN k_u32x4 *w4 = (K_DEV_IN k_u32x4 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    float acc[K_GEMM_TOS][K_GEMM_TR];
    K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++)
        K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) acc[i][r] = 0.0f;
    for (k_u32 base = 0; base < nb; base += 4u) {
        /* stage: entry (r, L) = the Q8_K words lane L's share of super-block
         * base + P meets (quant_kq.h's xw[], in its order), d_x, bsums */
        for (k_u32 e = tid; e < K_GEMM_TR * 32u; e += K_GEMM_TG) {
#if K_KQ_ORDER == 2
            /* a block past the row's end is staged as block 0 (its octet
             * computes it for the butterflies and adds nothing) */
            const k_u32 r = e / 32u, L = e % 32u, ib = base + (L >> 3) < nb ? base + (L >> 3) : 0u, tl = L & 7u;
            if (r >= m.n) continue; /* never read */
#else
            const k_u32 r = e / 32u, L = e % 32u, ib = base + (L >> 3), tl = L & 7u;
            if (r >= m.n || ib >= nb) continue; /* never read */
#endif
            const k_u32 xb = k_gemm_act(m, k_gemm_row(order, m, r)) / 4u + ib * 73u;
            const k_u32 xlo = 1u + (q6 ? 32u * (tl >> 2) + 2u * (tl & 3u) : 16u * (tl >> 1) + 4u * (tl & 1u));
            k_u32 v[8];
            if (q6) { /* two branches: register indices stay constants */
                K_UNROLL for (k_u32 q = 0; q < 4u; q++) {
                    v[2u * q] = K_LD(x32, xb + xlo + 8u * q);
                    v[2u * q + 1u] = K_LD(x32, xb + xlo + 8u * q + 1u);
                }
            } else {
                K_UNROLL for (k_u32 q = 0; q < 4u; q++) {
                    v[q] = K_LD(x32, xb + xlo + q);
                    v[4u + q] = K_LD(x32, xb + xlo + 8u + q);
                }
            }
            const k_u32 bsw = 65u + 2u * (tl >> 1), bsh = 16u * (tl & 1u);
            const k_u32 b0 = (K_LD(x32, xb + bsw) >> bsh) & 0xffffu, b1 = (K_LD(x32, xb + bsw + 1u) >> bsh) & 0xffffu;
            k_u32x4 a, b, c;
            a.x = v[0], a.y = v[1], a.z = v[2], a.w = v[3];
            b.x = v[4], b.y = v[5], b.z = v[6], b.w = v[7];
            c.x = K_LD(x32, xb), c.y = (k_u32)((int)b0 - (b0 & 0x8000u ? 65536 : 0));
            c.z = (k_u32)((int)b1 - (b1 & 0x8000u ? 65536 : 0)), c.w = 0u;
            K_ST(xt, 3u * e, a);
            K_ST(xt, 3u * e + 1u, b);
            K_ST(xt, 3u * e + 2u, c);
        }
        K_BARRIER();
#if K_KQ_ORDER == 2
        const k_u32 valid = base + P < nb, ib = valid ? base + P : 0u;
        { /* every octet: its integer butterflies need all 32 lanes */
#else
        const k_u32 ib = base + P;
        if (ib < nb) {
#endif
            k_kq_lane Lw[K_GEMM_TOS];
            K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++) {
#ifdef PLANT_GEMM_OFF_BY_ONE_ROW
                const k_u32 o = o0 + i + 1u < n_out ? o0 + i + 1u : n_out - 1u;
#else
                const k_u32 o = o0 + i < n_out ? o0 + i : n_out - 1u;
#endif
                const k_u32 blk = o * nb + ib;
                Lw[i] = q6 ? k_kq6_load(w16, wbase + blk * 210u, t)
                           : k_kq45_load(w4, wbase / 16u + blk * (bs / 16u), type, t);
            }
            K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) {
                if (r >= m.n) continue;
                const k_u32 e = 3u * (r * 32u + lane);
                const k_u32x4 a = K_LD(xt, e), b = K_LD(xt, e + 1u), c = K_LD(xt, e + 2u);
                const k_u32 xw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                const float dx = k_bits_f32(c.x);
                const int b0 = (int)c.y, b1 = (int)c.z;
                K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++) {
                    /* quant_kq.h's per-lane terms, verbatim */
                    int part = 0;
                    K_UNROLL for (k_u32 G = 0; G < 4u; G++)
                        part += Lw[i].sc[G] * k_dot4(Lw[i].code[2u * G + 1u], xw[2u * G + 1u],
                                                     k_dot4(Lw[i].code[2u * G], xw[2u * G], 0));
#if K_KQ_ORDER == 2
                    const int S = k_octet_isum(part), M = q6 ? 0 : k_octet_isum(Lw[i].m_lo * b0 + Lw[i].m_hi * b1);
                    if (valid) {
                        acc[i][r] += (Lw[i].d * dx) * (float)S;
                        if (!q6) acc[i][r] -= (Lw[i].dmin * dx) * (float)M;
                    }
#else
                    acc[i][r] += (Lw[i].d * dx) * (float)part;
                    if (!q6) acc[i][r] -= (Lw[i].dmin * dx) * (float)(Lw[i].m_lo * b0 + Lw[i].m_hi * b1);
#endif
                }
            }
        }
        K_BARRIER();
    }
    K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++)
        K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) {
            if (r >= m.n) continue;
            /* matvec_kq1's combine (whatever K_MATVEC_ROWS_PER_SIMD, which is
             * Q8_0's; quant_kq.h K_KQ_ORDER) */
#if K_KQ_ORDER == 2
            /* ((S0 + S1) + S2) + S3 in lane 0 (the octets' lanes hold the same chain) */
            const float a1 = k_shfl_xor(acc[i][r], 8u), a2 = k_shfl_xor(acc[i][r], 16u), a3 = k_shfl_xor(acc[i][r], 24u);
            const float s = ((acc[i][r] + a1) + a2) + a3;
#else
            float s = k_octet_sum(acc[i][r]);
            s = s + k_shfl_xor(s, 8u);
            s = s + k_shfl_xor(s, 16u);
#endif
            if (lane == 0u && o0 + i < n_out) K_ST(y, m.ybase + k_gemm_row(order, m, r) * m.ystride + o0 + i, s);
        }
}

/* The dense GEMMs' tile map: rows [K_GX K_GEMM_TR, + K_GEMM_TR) of n_rows. */
K_FN k_gemm_map k_gemm_dense_map(k_u32 gx, k_u32 n_rows, k_u32 row_bytes, k_u32 y_stride) {
    k_gemm_map m;
    const k_u32 r0 = gx * K_GEMM_TR;
    m.start = r0, m.n = n_rows - r0 < K_GEMM_TR ? n_rows - r0 : K_GEMM_TR, m.grouped = 0u, m.split = 0xffffffffu;
    m.div = 1u, m.rb0 = row_bytes, m.base1 = 0u, m.rb1 = 0u, m.ystride = y_stride, m.ybase = 0u;
    return m;
}

/* The common preconditions of both kernels; every thread takes the same
 * branch. The Q8_0 order above is the matvec's (one row per SIMD-group,
 * quant_q8_0.h). */
#define K_GEMM_SHAPE_OK(p, blk)                                                                    \
    ((p).n_in % (blk) == 0u && (p).n_rows > 0u && K_TG_SIZE == K_GEMM_TG &&                        \
     K_NGX * K_GEMM_TR >= (p).n_rows && K_NGY * K_GEMM_NSG * K_GEMM_TOS >= (p).n_out)

K_KERNEL_BOUNDED(gemm_q8_0, K_GEMM_TG, 1) {
    K_CHECK_TAG(gemm_q8_0);
    if (!K_GEMM_SHAPE_OK(p, 32u)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    K_TG_ARRAY(k_u32x4, xt, K_GEMM_TR * 32 * 3);
    if (K_GX * K_GEMM_TR >= p.n_rows) return; /* a whole threadgroup (a grid wider than the rows) */
    const k_gemm_map m = k_gemm_dense_map(K_GX, p.n_rows, p.n_in / 32u * 34u, p.y_stride);
    k_gemm_q8_0_tile(w, 0u, p.n_in, p.n_out, (K_GY * K_GEMM_NSG + K_SIMD) * K_GEMM_TOS, xq, (K_DEV_IN k_u32 *)y, m, y,
                     xt, K_TID, K_LANE);
}

K_KERNEL_BOUNDED(gemm_kq, K_GEMM_TG, 1) {
    K_CHECK_TAG(gemm_kq);
    if (!K_GEMM_SHAPE_OK(p, 256u) || K_KQ_BLOCK_BYTES(p.wtype) == 0u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    K_TG_ARRAY(k_u32x4, xt, K_GEMM_TR * 32 * 3);
    if (K_GX * K_GEMM_TR >= p.n_rows) return; /* a whole threadgroup */
    const k_gemm_map m = k_gemm_dense_map(K_GX, p.n_rows, p.n_in / 256u * 292u, p.y_stride);
    k_gemm_kq_tile(w, 0u, p.wtype, p.n_in, p.n_out, (K_GY * K_GEMM_NSG + K_SIMD) * K_GEMM_TOS, xq, (K_DEV_IN k_u32 *)y,
                   m, y, xt, K_TID, K_LANE);
}
