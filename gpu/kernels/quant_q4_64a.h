/*
 * quant_q4_64a.h — the Q4_64A matvec (ds4's affine 4-bit type; decode and
 * the verify widths 2..16 in one weight read).
 *
 * A Q4_64A block (csrc/quants/quants.h block_q4_64a, ds4-notes §2) is 36
 * bytes for 64 weights: qs[32] codes (code j in byte j/2, even j in the
 * LOW nibble: consecutive pairs, not Q4_0's split halves), then the scale
 * and the bias as bf16 (little-endian); weight j = code_j * scale + bias.
 * 36 is a multiple of 4, so every weight load is one aligned word.
 *
 * The CPU pairs Q4_64A weights with Q8_0 activations (traits.c), the
 * activation row quantized exactly as for Q8_0 weights (quantize_q8_0 /
 * norm_quant here, bit for bit), two Q8_0 blocks per weight block (one per
 * 32-weight half h). Per half the value is exact integers SQA = sum code_j
 * a_j and SA = sum a_j times float scales: scale d_h SQA + bias d_h SA
 * (csrc/quants/scalar.c dot_q4_64a_q8_0; AVX2/AVX-512 group the same
 * products differently, with FMA). The GPU forms the same exact integers in
 * smaller pieces, so only the float rounding differs (tolerance:
 * docs/gpu.md §4 "Q4_64A matvec").
 *
 * Geometry: the third design of the Q8_0 and K-quant matvecs (no
 * threadgroup memory, no barriers). A row's blocks are dealt round robin
 * to 4 phases (ib mod 4); a phase is served by an octet (8 lanes), lane t
 * holding word t of the block's codes (codes 8t..8t+7, so half t/4). One
 * variant per width class (like matvec_kq1/kq4/kq) serves RPS = 1 or 2
 * rows per SIMD-group: the 4 phases of a row spread over 4/RPS octets (PH =
 * RPS phases per octet, one accumulator each), so at width 1 a whole
 * SIMD-group streams one row (16 consecutive blocks, 576 bytes, in flight
 * per step at STEP 4) and at the verify widths the octets of two rows read
 * the same activation words in one instruction. Every weight word is read
 * once for all n_rows activation rows.
 *
 * Per block and row, lane t forms its exact integer share sqa_t = sum of
 * its 8 codes times their activation codes and sa_t = the sum of those 8
 * activation codes (k_dot4; |sqa_t| <= 8 * 15 * 128, exact as float) and
 * adds its own term (scale d) sqa_t + (bias d) sa_t to its phase's
 * accumulator (no shuffle per block); then each phase's octet butterfly
 * (1, 2, 4) and ((S0 + S1) + (S2 + S3)). Lane t's blocks, its terms and
 * their order are the same in every variant (IEEE addition is commutative,
 * so S0 + S1 by a shuffle equals it in registers), so a row's bits never
 * depend on the width, the variant or the threadgroup size (tested).
 */

/* Word t (< 8) of a block's codes, bytes b0..b3 holding codes 8t..8t+7 (b_k:
 * code 8t+2k in the low nibble, 8t+2k+1 in the high one), as two words of
 * 4 unsigned byte codes in element order: codes 8t..8t+3 (which == 0) or
 * 8t+4..8t+7 (which == 1). Two bytes go to the two 16-bit halves, then
 * (x | x << 4) & 0x0F0F0F0F puts each byte's low nibble in the low byte
 * of its half and its high nibble in the high byte. */
K_FN k_u32 k_q4a_codes(k_u32 wq, k_u32 which) {
#ifdef PLANT_Q4_64A_NIBBLE_SWAP
    /* planted fault (tests must turn red): odd codes read from the low
     * nibble, even from the high one (swap the nibbles of every byte) */
    wq = ((wq >> 4) & 0x0F0F0F0Fu) | ((wq & 0x0F0F0F0Fu) << 4);
#endif
    const k_u32 x = which ? ((wq >> 16) & 0xFFu) | ((wq >> 8) & 0xFF0000u) : (wq & 0xFFu) | ((wq & 0xFF00u) << 8);
    return (x | (x << 4)) & 0x0F0F0F0Fu;
}

/* Blocks per phase per step (per octet and accumulator), resident
 * threadgroups (CUDA register cap) and L2 prefetch distance; each a -D
 * override. Not yet measured on a GPU: STEP 4 at width 1 keeps 576 bytes
 * of a row in flight per SIMD-group, as matvec_kq1's 4 Q4_K super-blocks
 * do; the caps follow matvec_kq1/kq4/kq. */
#ifndef K_Q4A1_STEP
#define K_Q4A1_STEP 4u
#endif
#ifndef K_Q4A4_STEP
#define K_Q4A4_STEP 2u
#endif
#ifndef K_Q4A16_STEP
#define K_Q4A16_STEP 2u
#endif
#ifndef K_Q4A1_TGS
#define K_Q4A1_TGS 10
#endif
#ifndef K_Q4A4_TGS
#define K_Q4A4_TGS 8
#endif
#ifndef K_Q4A16_TGS
#define K_Q4A16_TGS 3
#endif
#ifndef K_Q4A_AHEAD
#define K_Q4A_AHEAD 32u /* blocks of L2 prefetch ahead (CUDA), ~1.1 KB as matvec_q8_0's */
#endif

/* The body of every variant: R activation rows at most, RPS weight rows per
 * SIMD-group, STEP blocks per phase per step (constants after inlining, so
 * acc[] and the loaded words stay in registers). */
K_FN void k_matvec_q4_64a_rows(const k_matvec_q4_64a_params p, K_DEV_IN k_u8 *w, K_DEV_IN k_u8 *xq, K_DEV float *y,
                                k_u32 simd, k_u32 lane, const k_u32 R, const k_u32 RPS, const k_u32 STEP) {
    const k_u32 nb = p.n_in / 64u, nr = p.n_rows;
    const k_u32 OPR = 4u / RPS, PH = RPS; /* octets per row, phases per octet */
    const k_u32 o0 = simd * RPS;
    if (o0 >= p.n_out) return; /* a whole SIMD-group: no shuffle left waiting */
    /* octets of a row past the last one compute row n_out - 1 and store
     * nothing: their SIMD-group's other rows need them in the shuffles */
    const k_u32 o = o0 + (lane >> 3) / OPR, ph0 = ((lane >> 3) % OPR) * PH;
    const k_u32 orow = o < p.n_out ? o : p.n_out - 1u;
    const k_u32 t = lane & 7u;
    K_DEV_IN k_u32 *w32 = (K_DEV_IN k_u32 *)w;
    K_DEV_IN k_u16 *x16 = (K_DEV_IN k_u16 *)xq;
    /* lane t's 8 codes meet bytes 8(t & 3) .. + 7 of the codes of Q8_0
     * block 2 ib + t/4 (34-byte blocks: 2-aligned, so k_ld_w2) */
    const k_u32 xh = t >> 2, xc = 2u + 8u * (t & 3u);
    float acc[4][K_MATVEC_MAX_ROWS]; /* all 4 phases set: k_kq_phase_sum reads them */
    K_UNROLL for (k_u32 h = 0; h < 4u; h++)
        K_UNROLL for (k_u32 r = 0; r < R; r++) acc[h][r] = 0.0f;
    for (k_u32 base = 0; base < nb; base += 4u * STEP) {
        /* L2 prefetch K_Q4A_AHEAD blocks ahead: lanes 0..1 of the octet
         * touch the (at most 2) 32-byte sectors of each block */
        if (t < 2u) {
            K_UNROLL for (k_u32 u = 0; u < STEP; u++)
                K_UNROLL for (k_u32 h = 0; h < PH; h++) {
                    const k_u32 pb = base + K_Q4A_AHEAD + 4u * u + ph0 + h;
                    if (pb < nb) K_PREFETCH(w, (orow * nb + pb) * 36u + 32u * t);
                }
        }
        k_u32 wq[8], sb[8]; /* STEP * PH <= 8 (checked where the variants are made) */
        K_UNROLL for (k_u32 u = 0; u < STEP; u++) /* all loads before any use */
            K_UNROLL for (k_u32 h = 0; h < PH; h++) {
                const k_u32 ib = base + 4u * u + ph0 + h, blk = orow * nb + (ib < nb ? ib : 0u);
                wq[u * PH + h] = K_LD(w32, blk * 9u + t);
                sb[u * PH + h] = K_LD(w32, blk * 9u + 8u); /* scale | bias << 16: one broadcast per octet */
            }
        K_UNROLL for (k_u32 u = 0; u < STEP; u++)
            K_UNROLL for (k_u32 h = 0; h < PH; h++) {
                const k_u32 ib = base + 4u * u + ph0 + h;
                if (ib >= nb) continue; /* past the row's end: adds nothing */
                const k_u32 c0 = k_q4a_codes(wq[u * PH + h], 0u), c1 = k_q4a_codes(wq[u * PH + h], 1u);
                const float sc = k_bf2f((k_u16)(sb[u * PH + h] & 0xFFFFu));
                const float bi = k_bf2f((k_u16)(sb[u * PH + h] >> 16));
                K_UNROLL for (k_u32 r = 0; r < R; r++) {
                    if (r >= nr) continue;
                    const k_u32 xo = (r * 2u * nb + 2u * ib + xh) * 34u;
                    const k_u32 a0 = k_ld_w2(x16, xo + xc), a1 = k_ld_w2(x16, xo + xc + 4u);
                    const float dx = k_h2f((k_u16)k_ld_u16_at(x16, xo));
                    const int sqa = k_dot4(c1, a1, k_dot4(c0, a0, 0));
                    const int sa = k_dot4(0x01010101u, a1, k_dot4(0x01010101u, a0, 0));
                    /* no contraction: 2 roundings per product, 1 for the
                     * sum, 1 for the accumulation (the bound counts them) */
                    acc[h][r] += (sc * dx) * (float)sqa + (bi * dx) * (float)sa;
                }
            }
    }
    K_UNROLL for (k_u32 r = 0; r < R; r++) {
        if (r >= nr) continue;
        const float s = k_kq_phase_sum(acc[0][r], acc[1][r], acc[2][r], acc[3][r], PH);
        if ((lane & (8u * OPR - 1u)) == 0u && o < p.n_out) K_ST(y, r * p.y_stride + o, s);
    }
}

/* The three width classes, as matvec_kq1/kq4/kq: one body, so every
 * width is bit-identical per row to width 1 (tested); each variant keeps
 * only its own accumulators in registers. The host picks by
 * K_MATVEC_Q4_64A_KERNEL(n_rows) and launches K_MATVEC_Q4_64A_GROUPS(n_rows,
 * n_out, SIMD-groups per threadgroup) threadgroups of at most
 * K_MATVEC_MAX_TG threads; a grid that leaves rows out, n_in not a
 * multiple of 64 or too many rows for the variant raise K_ERR_SHAPE (every
 * thread takes the same branch). */
#define K_Q4A_VARIANT(K, R, RPS, STEP, B)                                                                    \
    typedef char k_##K##_step_fits[(STEP) * (RPS) <= 8u && ((RPS) == 1 || (RPS) == 2 || (RPS) == 4) ? 1 : -1]; \
    K_KERNEL_BOUNDED(K, K_MATVEC_MAX_TG, B) {                                                                \
        K_CHECK_TAG(K);                                                                                      \
        if (p.n_in % 64u || p.n_rows == 0u || p.n_rows > (R) || K_TG_SIZE > K_MATVEC_MAX_TG ||               \
            K_NGX * K_NSIMD * (RPS) < p.n_out) {                                                             \
            k_raise(status, K_ERR_SHAPE);                                                                    \
            return;                                                                                          \
        }                                                                                                    \
        k_matvec_q4_64a_rows(p, w, xq, y, K_GX * K_NSIMD + K_SIMD, K_LANE, (R), (RPS), (STEP));              \
    }

K_Q4A_VARIANT(matvec_q4_64a1, 1u, K_Q4A1_RPS, K_Q4A1_STEP, K_Q4A1_TGS)
K_Q4A_VARIANT(matvec_q4_64a4, 4u, K_Q4A4_RPS, K_Q4A4_STEP, K_Q4A4_TGS)
K_Q4A_VARIANT(matvec_q4_64a, K_MATVEC_MAX_ROWS, K_Q4A16_RPS, K_Q4A16_STEP, K_Q4A16_TGS)

/* The Q4_64A prefill GEMM (gemm.h's tiling and staging): every value bit
 * for bit the width-1 matvec's. Lane 8 P + t keeps one accumulator per
 * (weight row, activation row) of its tile and adds, for every block ib = P
 * (mod 4) in ascending order, the matvec's term for word t of that block:
 * (scale d) sqa_t + (bias d) sa_t with the same exact integers; then
 * k_kq_phase_sum's width-1 combine (octet butterfly, xor 8, xor 16). So
 * lane by lane the same accumulators as matvec_q4_64a1 (RPS 1: phase P's
 * octet is lanes 8P..8P+7 there too), and the same value. A round is 4
 * blocks (256 inputs); the stage holds, per (tile row, lane), the two
 * activation words the lane's codes meet and that Q8_0 block's d: one
 * 16-byte entry. */
K_FN void k_gemm_q4_64a_tile(K_DEV_IN k_u8 *w, k_u32 n_in, k_u32 n_out, k_u32 o0, K_DEV_IN k_u8 *xq,
                             K_DEV_IN k_u32 *order, k_gemm_map m, K_DEV float *y, K_TGM k_u32x4 *xt, k_u32 tid,
                             k_u32 lane) {
    const k_u32 nb = n_in / 64u, P = lane >> 3, t = lane & 7u;
    K_DEV_IN k_u32 *w32 = (K_DEV_IN k_u32 *)w;
    K_DEV_IN k_u16 *x16 = (K_DEV_IN k_u16 *)xq;
    float acc[K_GEMM_TOS][K_GEMM_TR];
    K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++)
        K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) acc[i][r] = 0.0f;
    for (k_u32 base = 0; base < nb; base += 4u) {
        /* stage: entry (r, L) = the activation words lane L's codes of block
         * base + L/8 meet (the matvec's a0, a1) and their Q8_0 block's d */
        for (k_u32 e = tid; e < K_GEMM_TR * 32u; e += K_GEMM_TG) {
            const k_u32 r = e / 32u, L = e % 32u, ib = base + (L >> 3), tl = L & 7u;
            if (r >= m.n || ib >= nb) continue; /* never read */
            const k_u32 xo = k_gemm_act(m, k_gemm_row(order, m, r)) + (2u * ib + (tl >> 2)) * 34u;
            const k_u32 xc = 2u + 8u * (tl & 3u);
            k_u32x4 a;
            a.x = k_ld_w2(x16, xo + xc), a.y = k_ld_w2(x16, xo + xc + 4u);
            a.z = k_f32_bits(k_h2f((k_u16)k_ld_u16_at(x16, xo))), a.w = 0u;
            K_ST(xt, e, a);
        }
        K_BARRIER();
        const k_u32 ib = base + P;
        if (ib < nb) {
            k_u32 c0[K_GEMM_TOS], c1[K_GEMM_TOS];
            float sc[K_GEMM_TOS], bi[K_GEMM_TOS];
            K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++) {
#ifdef PLANT_GEMM_OFF_BY_ONE_ROW
                const k_u32 o = o0 + i + 1u < n_out ? o0 + i + 1u : n_out - 1u;
#else
                const k_u32 o = o0 + i < n_out ? o0 + i : n_out - 1u;
#endif
                const k_u32 blk = o * nb + ib, wq = K_LD(w32, blk * 9u + t), sb = K_LD(w32, blk * 9u + 8u);
                c0[i] = k_q4a_codes(wq, 0u), c1[i] = k_q4a_codes(wq, 1u);
                sc[i] = k_bf2f((k_u16)(sb & 0xFFFFu)), bi[i] = k_bf2f((k_u16)(sb >> 16));
            }
            K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) {
                if (r >= m.n) continue;
                const k_u32x4 a = K_LD(xt, r * 32u + lane);
                const float dx = k_bits_f32(a.z);
                const int sa = k_dot4(0x01010101u, a.y, k_dot4(0x01010101u, a.x, 0));
                K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++) {
                    const int sqa = k_dot4(c1[i], a.y, k_dot4(c0[i], a.x, 0));
                    /* quant_q4_64a.h's term, verbatim (no contraction) */
                    acc[i][r] += (sc[i] * dx) * (float)sqa + (bi[i] * dx) * (float)sa;
                }
            }
        }
        K_BARRIER(); /* the tile is read before the next round overwrites it */
    }
    K_UNROLL for (k_u32 i = 0; i < K_GEMM_TOS; i++)
        K_UNROLL for (k_u32 r = 0; r < K_GEMM_TR; r++) {
            if (r >= m.n) continue; /* uniform: the same r for the whole SIMD-group */
            const float s = k_kq_phase_sum(acc[i][r], 0.0f, 0.0f, 0.0f, 1u);
            if (lane == 0u && o0 + i < n_out) K_ST(y, m.ybase + k_gemm_row(order, m, r) * m.ystride + o0 + i, s);
        }
}

K_KERNEL_BOUNDED(gemm_q4_64a, K_GEMM_TG, 1) {
    K_CHECK_TAG(gemm_q4_64a);
    if (!K_GEMM_SHAPE_OK(p, 64u)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    K_TG_ARRAY(k_u32x4, xt, K_GEMM_TR * 32);
    if (K_GX * K_GEMM_TR >= p.n_rows) return; /* a whole threadgroup (a grid wider than the rows) */
    const k_gemm_map m = k_gemm_dense_map(K_GX, p.n_rows, p.n_in / 32u * 34u, p.y_stride);
    k_gemm_q4_64a_tile(w, p.n_in, p.n_out, (K_GY * K_GEMM_NSG + K_SIMD) * K_GEMM_TOS, xq, (K_DEV_IN k_u32 *)y, m, y,
                       xt, K_TID, K_LANE);
}
