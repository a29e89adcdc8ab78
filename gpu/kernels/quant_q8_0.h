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

/* Q8_0 WEIGHTS ON THE DEVICE. A row of nb = n_in / 32 blocks is stored as
 * its 32 nb codes, then its nb fp16 scales: the file's 34 nb bytes per row,
 * permuted inside the row (gpu/host/q8_0_rows.h, at upload). Rows keep
 * their size, so matrices concatenated by rows, expert strides and buffer
 * sizes are the file's. GGUF's 34-byte blocks leave codes 2-aligned (the
 * matvec issued 6 16-bit loads per lane and block); here a row's codes
 * start at its first byte, 16-aligned whenever rows are (nb % 8 == 0), so
 * a lane takes 16 codes in one load. Activations keep the file's blocks
 * (quantize_q8_0 and the fused kernels write them; the CPU reads them). */
K_FN k_u32 k_q8w_code_at(k_u32 row_off, k_u32 ib) { return row_off + 32u * ib; }
K_FN k_u32 k_q8w_scale_at(k_u32 row_off, k_u32 nb, k_u32 ib) { return row_off + 32u * nb + 2u * ib; }

/* Bits of the 64-bit value hi:lo shifted right by sh (0 or 16), low word:
 * (hi << 1) << (31 - sh) is hi << 32 = 0 for sh 0 without a 32-bit shift
 * (undefined in C). A few integer instructions (a PRMT / SHF on CUDA). */
K_FN k_u32 k_funnel16(k_u32 lo, k_u32 hi, k_u32 sh) { return (lo >> sh) | ((hi << 1) << (31u - sh)); }

/* Bytes off..off+15 (off even) as 4 little-endian words: 4 word loads,
 * and a 16-bit one for bytes off+14, off+15 when off is 2 mod 4 (the words
 * then start 2 bytes before off, inside the same buffer since off >= 2).
 * Nothing past off + 15 is read. */
K_FN k_u32x4 k_ld16_2a(K_DEV_IN k_u8 *b, k_u32 off) {
    K_DEV_IN k_u32 *b32 = (K_DEV_IN k_u32 *)b;
    K_DEV_IN k_u16 *b16 = (K_DEV_IN k_u16 *)b;
    const k_u32 sh = (off & 2u) * 8u, bw = off >> 2;
    const k_u32 w0 = K_LD(b32, bw), w1 = K_LD(b32, bw + 1u), w2 = K_LD(b32, bw + 2u), w3 = K_LD(b32, bw + 3u);
    k_u32 w4 = 0u;
    if (sh) w4 = (k_u32)K_LD(b16, off / 2u + 7u);
    k_u32x4 r;
    r.x = k_funnel16(w0, w1, sh), r.y = k_funnel16(w1, w2, sh), r.z = k_funnel16(w2, w3, sh), r.w = k_funnel16(w3, w4, sh);
    return r;
}

/* 16 weight codes at byte off of the device layout: one 16-byte load when
 * rows are 16-aligned (a16, uniform), else k_ld16_2a. */
K_FN k_u32x4 k_q8w_ld16(K_DEV_IN k_u8 *w, k_u32 off, k_u32 a16) {
    if (a16) return K_LD((K_DEV_IN k_u32x4 *)w, off / 16u);
    return k_ld16_2a(w, off);
}

/* The exact integer dot of 16 codes (4 words) with 16 others, plus c. */
K_FN int k_dot16(k_u32x4 a, k_u32x4 b, int c) {
    return k_dot4(a.w, b.w, k_dot4(a.z, b.z, k_dot4(a.y, b.y, k_dot4(a.x, b.x, c))));
}

/* The sum over the 32 lanes serving one output row: the octet butterfly
 * (1, 2, 4), then 8 and 16; one fixed order on every target (the Q8_0
 * matvec; the GEMMs reproduce it). All 32 lanes call it (uniform control flow). */
K_FN float k_matvec_row_sum(float v) {
    v = k_octet_sum(v);
    v = v + k_shfl_xor(v, 8u);
    v = v + k_shfl_xor(v, 16u);
    return v;
}

#if K_MATVEC_ROWS_PER_SIMD != 1
#error "matvec_q8_0 serves one weight row per SIMD-group (4 octets a row): the order the GEMMs share"
#endif

/* THE ORDER (every Q8_0 dot: matvec_q8_0, the GEMMs of gemm.h and
 * gemm_mma.h, the MoE kernels). A row's blocks fall into windows of 32;
 * lane L = 8 j + t of the SIMD-group adds, for every window w ascending,
 * the term sumi * (d_w * d_x) of block 32 w + k_q8_0_adder(L) = 4 t + j (when
 * that block exists), sumi being the block's exact integer dot (the CPU's
 * sumi, csrc/quants/scalar.c dot_q8_0_q8_0); then the row's butterfly
 * k_matvec_row_sum. So a row's value never depends on how many rows share
 * the launch or which kernel computes it (batch invariance), and differs
 * from the CPU's serial block sum only in the order of the same terms
 * (tolerance: docs/gpu.md). It is the order the matvec had when an octet j
 * streamed blocks j mod 4 and its lane (ib / 4) mod 8 added them. */
K_FN k_u32 k_q8_0_adder(k_u32 lane) { return 4u * (lane & 7u) + (lane >> 3); }

/* One window's weights for lane L: codes 16 (L & 1)..+15 of blocks
 * w0 + L/2 (a) and w0 + 16 + L/2 (b) of the row at byte wr (zeros past
 * nb): a SIMD-group's two loads read the window's 1024 codes in order. */
typedef struct {
    k_u32x4 a, b;
} k_q8w_window;

K_FN k_q8w_window k_q8w_window_load(K_DEV_IN k_u8 *w, k_u32 wr, k_u32 nb, k_u32 w0, k_u32 lane, k_u32 a16) {
    const k_u32 b0 = w0 + (lane >> 1), b1 = b0 + 16u, h = 16u * (lane & 1u);
    k_q8w_window W;
    W.a.x = W.a.y = W.a.z = W.a.w = 0u;
    W.b = W.a;
    if (b0 < nb) W.a = k_q8w_ld16(w, k_q8w_code_at(wr, b0) + h, a16);
    if (b1 < nb) W.b = k_q8w_ld16(w, k_q8w_code_at(wr, b1) + h, a16);
    return W;
}

/* The window's exact block integers against the activation row at byte xr
 * of xq (the file's 34-byte blocks): lane L dots its 2 x 16 codes, lane
 * pairs add theirs (xor 1), and lane L then takes block w0 + adder(L)'s
 * integer from the pair that holds it (lane 2 a of a pair's sums for a <
 * 16, lane 2 (a - 16) + 1 for a >= 16: each lane sends the sum its
 * receiver wants). All 32 lanes call it (uniform control flow); 0 for a
 * block past nb. */
K_FN int k_q8_0_window_sumi(k_q8w_window W, K_DEV_IN k_u8 *xq, k_u32 xr, k_u32 nb, k_u32 w0, k_u32 lane) {
    const k_u32 b0 = w0 + (lane >> 1), b1 = b0 + 16u, h = 16u * (lane & 1u), a = k_q8_0_adder(lane);
    int pa = 0, pb = 0;
    if (b0 < nb) pa = k_dot16(W.a, k_ld16_2a(xq, xr + 34u * b0 + 2u + h), 0);
    if (b1 < nb) pb = k_dot16(W.b, k_ld16_2a(xq, xr + 34u * b1 + 2u + h), 0);
    pa = pa + k_shfl_xor_i(pa, 1u);
    pb = pb + k_shfl_xor_i(pb, 1u);
    return k_shfl_at_i((lane & 1u) ? pb : pa, a < 16u ? 2u * a : 2u * (a - 16u) + 1u);
}

/* Windows whose weight loads are issued together (all loads before any
 * use: 2 x 16 bytes per lane and window). */
#ifndef K_Q8_0_WSTEP
#define K_Q8_0_WSTEP 1u
#endif

/* CUDA's resident-threadgroups target for the matvec (registers per thread
 * at most 65536 / (128 K_Q8_0_TGS)); a sweep knob, no effect on bits. */
#ifndef K_Q8_0_TGS
#define K_Q8_0_TGS 10
#endif

/* The Q8_0 matvec, no threadgroup memory, no barriers: one weight row per
 * SIMD-group, every weight word read once and dotted with all n_rows
 * activation rows (THE ORDER above). */
K_KERNEL_BOUNDED(matvec_q8_0, K_MATVEC_MAX_TG, K_Q8_0_TGS) {
    K_CHECK_TAG_EARLY(matvec_q8_0); /* its K_DEP_WAIT follows the first weight loads */
    if (p.n_in % 32u || p.n_rows == 0u || p.n_rows > K_MATVEC_MAX_ROWS ||
        K_NGX * K_NSIMD < p.n_out) { /* a grid that leaves rows out: loudly */
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 nb = p.n_in / 32u, rb = 34u * nb, nr = p.n_rows, lane = K_LANE, add = k_q8_0_adder(lane);
    const k_u32 o = K_GX * K_NSIMD + K_SIMD;
    if (o >= p.n_out) return; /* a whole SIMD-group; no barriers here */
#ifdef PLANT_OFF_BY_ONE_ROW
    /* planted fault (tests must turn red): the next row's weights, in bounds */
    const k_u32 wrow = o + 1u < p.n_out ? o + 1u : o;
#else
    const k_u32 wrow = o;
#endif
    const k_u32 wr = wrow * rb, a16 = rb % 16u == 0u;
    /* row loops run to the constant K_MATVEC_MAX_ROWS with a guard so the
     * compiler unrolls them and keeps acc[] in registers */
    float acc[K_MATVEC_MAX_ROWS];
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) acc[r] = 0.0f;
    for (k_u32 base = 0; base < nb; base += 32u * K_Q8_0_WSTEP) {
        k_q8w_window W[K_Q8_0_WSTEP];
        float dw[K_Q8_0_WSTEP];
        K_UNROLL for (k_u32 s = 0; s < K_Q8_0_WSTEP; s++) { /* all weight loads before any use */
            const k_u32 w0 = base + 32u * s, ib = w0 + add;
            W[s] = k_q8w_window_load(w, wr, nb, w0, lane, a16);
            dw[s] = ib < nb ? k_h2f((k_u16)k_ld_u16_at((K_DEV_IN k_u16 *)w, k_q8w_scale_at(wr, nb, ib))) : 0.0f;
        }
        if (base == 0u) K_DEP_WAIT(); /* weights in flight; activations only now (early start, common.h) */
        K_UNROLL for (k_u32 s = 0; s < K_Q8_0_WSTEP; s++) {
            const k_u32 w0 = base + 32u * s, ib = w0 + add;
            if (w0 >= nb) continue; /* uniform: a window past the row */
            K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
                if (r >= nr) continue;
                const int sumi = k_q8_0_window_sumi(W[s], xq, r * rb, nb, w0, lane);
                if (ib < nb)
                    acc[r] += (float)sumi * (dw[s] * k_h2f((k_u16)k_ld_u16_at((K_DEV_IN k_u16 *)xq, r * rb + 34u * ib)));
            }
        }
    }
    K_DEP_WAIT(); /* (a no-op after the first: here for a row of no blocks) */
    K_UNROLL for (k_u32 r = 0; r < K_MATVEC_MAX_ROWS; r++) {
        if (r >= nr) continue;
        const float s = k_matvec_row_sum(acc[r]);
        if (lane == 0u) K_ST(y, r * p.y_stride + o, s);
    }
}
