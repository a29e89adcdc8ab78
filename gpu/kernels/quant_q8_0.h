/*
 * quant_q8_0.h — Q8_0 activations and the Q8_0 matvec (decode and the
 * verify widths 2..16 in one weight read).
 *
 * A Q8_0 block is 34 bytes: fp16 scale d (little-endian), 32 int8 codes.
 * Buffers are bytes so the layout is the file's on every target.
 */

K_FN int k_i8(k_u32 byte) { return (int)byte - (byte >= 128u ? 256 : 0); }

K_FN float k_ld_f16_at(K_DEV_IN k_u8 *b, k_u32 off) {
    return k_h2f((k_u16)((k_u32)K_LD(b, off) | ((k_u32)K_LD(b, off + 1u) << 8)));
}

/* One SIMD-group per block: lane j holds x[j]. Bit for bit the CPU's
 * quantizer (csrc/quants/scalar.c quant_block_q8_avx2, llama.cpp's AVX2
 * quantize_row_q8_0): amax by max (order-free without NaN), d = amax/127,
 * id = 127/amax (0 when amax is 0), q = round-to-nearest-even(x*id)
 * saturated to int8 (a NaN code becomes -128 as x86's cvtps2dq + packs
 * make it), d stored as fp16 rounded to nearest even. */
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
    const float v = K_LD(x, row * p.x_stride + ib * 32u + K_LANE);
    const float amax = k_simd_max(k_fabs(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const float r = k_rint(v * id);
    const int qi = !(r == r) ? -128 : r >= 127.0f ? 127 : r <= -128.0f ? -128 : (int)r;
    const k_u32 o = blk * 34u;
    K_ST(q, o + 2u + K_LANE, (k_u8)(qi & 0xff));
    if (K_LANE == 0) {
        const k_u16 dh = k_f2h(d);
        K_ST(q, o, (k_u8)(dh & 0xffu));
        K_ST(q, o + 1u, (k_u8)(dh >> 8));
    }
}

/* One SIMD-group per output row o: lane l takes blocks l, l+32, ..., reads
 * each weight block once and dots it with all n_rows activation rows; per
 * block and row the CPU's term sumi * (d_w * d_x) (csrc/quants/scalar.c
 * dot_q8_0_q8_0, bit-identical per term), summed per lane in block order,
 * then across lanes by butterfly. So a row's result never depends on
 * n_rows (batch invariance), and differs from the CPU's serial block sum
 * only in the order of the same terms (tolerance: docs/gpu.md). */
K_KERNEL(matvec_q8_0) {
    K_CHECK_TAG(matvec_q8_0);
    if (p.n_in % 32u || p.n_rows == 0u || p.n_rows > K_MATVEC_MAX_ROWS) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n_in / 32u;
    const k_u32 o = K_GX * K_NSIMD + K_SIMD;
    if (o >= p.n_out) return; /* a whole SIMD-group */
#ifdef PLANT_OFF_BY_ONE_ROW
    /* planted fault (tests must turn red): the next row's weights, in bounds */
    const k_u32 wrow = o + 1u < p.n_out ? o + 1u : o;
#else
    const k_u32 wrow = o;
#endif
    /* row loops run to the constant K_MATVEC_MAX_ROWS with a guard so the
     * compiler unrolls them and keeps acc[] / sumi[] in registers */
    const k_u32 nr = p.n_rows;
    float acc[K_MATVEC_MAX_ROWS];
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) acc[r] = 0.0f;
    for (k_u32 ib = K_LANE; ib < nb; ib += 32u) {
        const k_u32 wo = (wrow * nb + ib) * 34u;
        const float dw = k_ld_f16_at(w, wo);
        int sumi[K_MATVEC_MAX_ROWS];
        K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) sumi[r] = 0;
        for (k_u32 j = 0; j < 32u; j++) {
            const int wj = k_i8(K_LD(w, wo + 2u + j));
            K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
                if (r >= nr) continue;
                sumi[r] += wj * k_i8(K_LD(xq, (r * nb + ib) * 34u + 2u + j));
            }
        }
        K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
            if (r >= nr) continue;
            const float dx = k_ld_f16_at(xq, (r * nb + ib) * 34u);
            acc[r] += (float)sumi[r] * (dw * dx);
        }
    }
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
        if (r >= nr) continue;
        const float s = k_simd_sum(acc[r]);
        if (K_LANE == 0) K_ST(y, r * p.y_stride + o, s);
    }
}
