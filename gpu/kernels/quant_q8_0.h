/*
 * quant_q8_0.h — Q8_0 activations and the Q8_0 matvec (decode and the
 * verify widths 2..16 in one weight read).
 *
 * A Q8_0 block is 34 bytes: fp16 scale d (little-endian), 32 int8 codes.
 * Buffers are bytes so the layout is the file's on every target.
 */

K_FN int k_i8(k_u32 byte) { return (int)byte - (byte >= 128u ? 256 : 0); }

/* One Q8_0 block from one SIMD-group, lane `lane` holding x[lane]: bit
 * for bit the CPU's quantizer (csrc/quants/scalar.c quant_block_q8_avx2,
 * llama.cpp's AVX2 quantize_row_q8_0): amax by max (order-free without
 * NaN), d = amax/127, id = 127/amax (0 when amax is 0), q =
 * round-to-nearest-even(x*id) saturated to int8 (a NaN code becomes -128
 * as x86's cvtps2dq + packs make it), d stored as fp16 rounded to nearest
 * even, at q[o] (d) and q[o + 2 + lane]. All 32 lanes call it (uniform
 * control flow): quantize_q8_0 and the fused kernels (fused.h) share it. */
K_FN void k_q8_0_store(float v, k_u32 lane, K_DEV k_u8 *q, k_u32 o) {
    const float amax = k_simd_max(k_fabs(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const float r = k_rint(v * id);
    const int qi = !(r == r) ? -128 : r >= 127.0f ? 127 : r <= -128.0f ? -128 : (int)r;
    K_ST(q, o + 2u + lane, (k_u8)(qi & 0xff));
    if (lane == 0) {
        const k_u16 dh = k_f2h(d);
        K_ST(q, o, (k_u8)(dh & 0xffu));
        K_ST(q, o + 1u, (k_u8)(dh >> 8));
    }
}

/* One SIMD-group per block (k_q8_0_store). */
K_KERNEL(quantize_q8_0) {
    K_CHECK_TAG(quantize_q8_0);
    if (p.n % 32u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n / 32u;
    const k_u32 blk = K_GX * K_NSIMD + K_SIMD;
    if (blk >= p.n_rows * nb) return; /* a whole SIMD-group; no barriers here */
    const k_u32 row = blk / nb, ib = blk % nb;
    k_q8_0_store(K_LD(x, row * p.x_stride + ib * 32u + K_LANE), K_LANE, q, blk * 34u);
}

/* Two bytes at an even offset as a little-endian 16-bit value. */
K_FN k_u32 k_ld_u16_at(K_DEV_IN k_u16 *b16, k_u32 off) { return (k_u32)K_LD(b16, off / 2u); }

/* Bytes off..off+3 (off even) as one word, little-endian: Q8_0 blocks are
 * 34 bytes, so their codes are only 2-aligned. */
K_FN k_u32 k_ld_w2(K_DEV_IN k_u16 *b16, k_u32 off) {
    return (k_u32)K_LD(b16, off / 2u) | ((k_u32)K_LD(b16, off / 2u + 1u) << 16);
}

/* Blocks per octet per step of the Q8_0 matvec: 4 x 3 16-bit loads per
 * lane in flight before the first use. */
#ifndef K_Q8_0_STEP
#define K_Q8_0_STEP 4u
#endif
#ifndef K_Q8_0_AHEAD
#define K_Q8_0_AHEAD 32u /* blocks of L2 prefetch ahead (CUDA) */
#endif
/* K_Q8_0_W1 1 (a sweep knob, default 0): width 1 takes its own loop. The
 * general loop walks all K_MATVEC_MAX_ROWS rows with a branch each, so at
 * width 1 the compiler emits, per block, the activation loads, the dot
 * and the octet's 3-shuffle integer sum behind 15 branches and cannot
 * overlap one block's shuffle chain (~100 cycles of latency) with the
 * next's. The width-1 loop issues every weight and activation load of the
 * step first, then the K_Q8_0_STEP independent dot + octet sums, then the
 * adder lane's float terms in ascending block order: the same integers and
 * the same float operations in the same order per lane, so the same bits
 * (width 1 is checked bit for bit against widths 2..16 and the GEMM). */
#ifndef K_Q8_0_W1
/* 1 since measured on the H200 2026-11-30 (gpu/tools/device_matvec_sweep.sh): Q8_0 width 1 at 43 / 40 / 32% of
 * 4300 GB/s on 5120x17408 / 17408x5120 / 5120x6144 (0: 20 / 21 / 15%), width
 * 4 12.5 / 10.1 / 8.0% (0: 11.4 / 8.2 / 7.4%) */
#define K_Q8_0_W1 1
#endif

/* The sum over the lanes serving one output row: the octet butterfly (1, 2,
 * 4), then 8 and 16 as K_MATVEC_OCTETS_PER_ROW asks; one fixed order on
 * every target (the Q8_0 and K-quant matvecs). All 32 lanes call it (uniform control flow). */
K_FN float k_matvec_row_sum(float v) {
    v = k_octet_sum(v);
    if (K_MATVEC_OCTETS_PER_ROW >= 2u) v = v + k_shfl_xor(v, 8u);
    if (K_MATVEC_OCTETS_PER_ROW >= 4u) v = v + k_shfl_xor(v, 16u);
    return v;
}

/* The Q8_0 matvec, no threadgroup memory, no barriers. A SIMD-group serves
 * K_MATVEC_ROWS_PER_SIMD weight rows (1 by default: the whole SIMD-group
 * streams one row); the row's OPR = K_MATVEC_OCTETS_PER_ROW octets take its
 * blocks round robin: at step `base`, octet j loads blocks base + u * OPR +
 * j (u < K_Q8_0_STEP), so one load instruction of the SIMD-group reads OPR
 * consecutive blocks. Lane t holds codes 4t..4t+3 of a block as one word
 * (two 16-bit loads: blocks are 34 bytes, only 2-aligned). Every weight
 * word is read once and dotted with all n_rows activation rows (k_dot4,
 * one instruction on CUDA; activations straight from device memory: tiny,
 * L1/L2-resident); the octet's integer sum is the CPU's sumi
 * (csrc/quants/scalar.c dot_q8_0_q8_0) exactly, and the octet's k-th block
 * (ib = k OPR + j) has its term sumi * (d_w * d_x) added by lane k % 8:
 * lane t of octet j gets blocks ib = j + OPR (t + 8 m), m = 0, 1, ... in
 * ascending order (at most ceil(nb / (8 OPR))), then the row's
 * 3 + log2(OPR)-level butterfly (k_matvec_row_sum). So
 * a row's result never depends on n_rows or the threadgroup size (batch
 * invariance), and differs from the CPU's serial block sum only in the
 * order of the same terms (tolerance: docs/gpu.md). */
/* L2 prefetch K_Q8_0_AHEAD blocks ahead of the step at `base`: lanes 0..1
 * of octet j touch the sectors of that block of row wrow (34 bytes: at most
 * 2 sectors), never past the row's last byte. A hint: no value depends on it. */
K_FN void k_q8_0_prefetch(K_DEV_IN k_u8 *w, k_u32 wrow, k_u32 nb, k_u32 base, k_u32 j, k_u32 t, k_u32 OPR) {
    if (t >= 2u) return;
    K_UNROLL for (k_u32 u = 0; u < K_Q8_0_STEP; u++) {
        const k_u32 pb = base + K_Q8_0_AHEAD + u * OPR + j;
        if (pb < nb) K_PREFETCH(w, (wrow * nb + pb) * 34u + 32u * t);
    }
}

K_KERNEL(matvec_q8_0) {
    K_CHECK_TAG(matvec_q8_0);
    if (p.n_in % 32u || p.n_rows == 0u || p.n_rows > K_MATVEC_MAX_ROWS ||
        K_NGX * K_NSIMD * K_MATVEC_ROWS_PER_SIMD < p.n_out) { /* a grid that leaves rows out: loudly */
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 OPR = K_MATVEC_OCTETS_PER_ROW;
    const k_u32 nb = p.n_in / 32u, t = K_LANE & 7u, nr = p.n_rows;
    const k_u32 o0 = (K_GX * K_NSIMD + K_SIMD) * K_MATVEC_ROWS_PER_SIMD;
    if (o0 >= p.n_out) return; /* a whole SIMD-group; no barriers here */
    /* octets of a row past the last one compute row n_out - 1 without
     * storing: their SIMD-group's other rows need them in the shuffles */
    const k_u32 o = o0 + (K_LANE >> 3) / OPR, j = (K_LANE >> 3) % OPR;
    const k_u32 orow = o < p.n_out ? o : p.n_out - 1u;
#ifdef PLANT_OFF_BY_ONE_ROW
    /* planted fault (tests must turn red): the next row's weights, in bounds */
    const k_u32 wrow = orow + 1u < p.n_out ? orow + 1u : orow;
#else
    const k_u32 wrow = orow;
#endif
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u16 *x16 = (K_DEV_IN k_u16 *)xq;
    /* row loops run to the constant K_MATVEC_MAX_ROWS with a guard so the
     * compiler unrolls them and keeps acc[] in registers */
    float acc[K_MATVEC_MAX_ROWS];
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) acc[r] = 0.0f;
    /* the same trip count in all 32 lanes (the octet sums shuffle): a block
     * past the row's end reads block 0 (in bounds) and adds nothing */
    if (K_Q8_0_W1 && nr == 1u) { /* uniform: every lane of the launch takes it */
        float acc0 = 0.0f;
        for (k_u32 base = 0; base < nb; base += OPR * K_Q8_0_STEP) {
            k_q8_0_prefetch(w, wrow, nb, base, j, t, OPR);
            k_u32 wq[K_Q8_0_STEP], xw[K_Q8_0_STEP], dwh[K_Q8_0_STEP], dxh[K_Q8_0_STEP];
            K_UNROLL for (k_u32 u = 0; u < K_Q8_0_STEP; u++) { /* all loads before any use */
                const k_u32 ib = base + u * OPR + j, ibx = ib < nb ? ib : 0u;
                const k_u32 wo = (wrow * nb + ibx) * 34u, xo = ibx * 34u;
                wq[u] = k_ld_w2(w16, wo + 2u + 4u * t), dwh[u] = k_ld_u16_at(w16, wo);
                xw[u] = k_ld_w2(x16, xo + 2u + 4u * t), dxh[u] = k_ld_u16_at(x16, xo);
            }
            int sumi[K_Q8_0_STEP];
            K_UNROLL for (k_u32 u = 0; u < K_Q8_0_STEP; u++) sumi[u] = k_octet_isum(k_dot4(wq[u], xw[u], 0));
            K_UNROLL for (k_u32 u = 0; u < K_Q8_0_STEP; u++) {
                const k_u32 ib = base + u * OPR + j;
                if (ib < nb && t == ((ib / OPR) & 7u))
                    acc0 += (float)sumi[u] * (k_h2f((k_u16)dwh[u]) * k_h2f((k_u16)dxh[u]));
            }
        }
        acc[0] = acc0;
    } else
    for (k_u32 base = 0; base < nb; base += OPR * K_Q8_0_STEP) {
        k_q8_0_prefetch(w, wrow, nb, base, j, t, OPR);
        k_u32 wq[K_Q8_0_STEP];
        float dw[K_Q8_0_STEP];
        K_UNROLL for (k_u32 u = 0; u < K_Q8_0_STEP; u++) { /* all loads before any use */
            const k_u32 ib = base + u * OPR + j, wo = (wrow * nb + (ib < nb ? ib : 0u)) * 34u;
            wq[u] = k_ld_w2(w16, wo + 2u + 4u * t);
            dw[u] = k_h2f((k_u16)k_ld_u16_at(w16, wo));
        }
        K_UNROLL for (k_u32 u = 0; u < K_Q8_0_STEP; u++) {
            const k_u32 ib = base + u * OPR + j, live = ib < nb, ibx = live ? ib : 0u;
            const k_u32 adder = live && t == ((ib / OPR) & 7u);
            K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
                if (r >= nr) continue;
                const k_u32 xo = (r * nb + ibx) * 34u;
                const int sumi = k_octet_isum(k_dot4(wq[u], k_ld_w2(x16, xo + 2u + 4u * t), 0));
                if (adder) acc[r] += (float)sumi * (dw[u] * k_h2f((k_u16)k_ld_u16_at(x16, xo)));
            }
        }
    }
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
        if (r >= nr) continue;
        const float s = k_matvec_row_sum(acc[r]);
        if ((K_LANE & (8u * OPR - 1u)) == 0u && o < p.n_out) K_ST(y, r * p.y_stride + o, s);
    }
}
