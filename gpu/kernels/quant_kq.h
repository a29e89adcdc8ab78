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

/* Codes and bsums of values 32 sub .. 32 sub + 31 of one Q8_K block (lane
 * `lane` holding value 32 sub + lane) at q[o ...], given the block's
 * largest |x| (amax) and the signed value that has it (mx): bit for bit the
 * CPU's quant_q8_K (ggml quantize_row_q8_K_ref): iscale = -127/mx, q =
 * min(127, nearest_int(iscale*x)) with ggml's 1.5*2^23 magic add, bsums =
 * sums of 16, d = 1/iscale (stored by sub 0); amax 0: all zeros. All 32
 * lanes call it (uniform control flow): quantize_q8_K and the fused
 * kernels (fused.h) share it. */
K_FN void k_q8_K_chunk(float v, float amax, float mx, k_u32 lane, k_u32 sub, K_DEV k_u8 *q, k_u32 o) {
    if (amax == 0.0f) {
        K_ST(q, o + 4u + 32u * sub + lane, (k_u8)0);
        if ((lane & 15u) == 0u) {
            const k_u32 bo = o + 260u + 2u * (2u * sub + lane / 16u);
            K_ST(q, bo, (k_u8)0);
            K_ST(q, bo + 1u, (k_u8)0);
        }
        if (sub == 0u && lane == 0u)
            for (k_u32 b = 0; b < 4u; b++) K_ST(q, o + b, (k_u8)0);
        return;
    }
    const float iscale = -127.0f / mx;
    const float f = iscale * v + 12582912.0f; /* no contraction: two roundings, as the CPU */
    const int qi0 = (int)(k_f32_bits(f) & 0x007fffffu) - 0x00400000;
    const int qi = qi0 < 127 ? qi0 : 127;
    K_ST(q, o + 4u + 32u * sub + lane, (k_u8)(qi & 0xff));
    /* bsums[2 sub + lane/16]: the 16 codes of this half-SIMD-group, exact
     * (integers far below 2^24 in float) */
    float s = (float)qi;
    s = s + k_shfl_xor(s, 8u);
    s = s + k_shfl_xor(s, 4u);
    s = s + k_shfl_xor(s, 2u);
    s = s + k_shfl_xor(s, 1u);
    if ((lane & 15u) == 0u) {
        const k_u32 bs = (k_u32)(int)s & 0xffffu, bo = o + 260u + 2u * (2u * sub + lane / 16u);
        K_ST(q, bo, (k_u8)(bs & 0xffu));
        K_ST(q, bo + 1u, (k_u8)(bs >> 8));
    }
    if (sub == 0u && lane == 0u) {
        const k_u32 db = k_f32_bits(1.0f / iscale);
        for (k_u32 b = 0; b < 4u; b++) K_ST(q, o + b, (k_u8)((db >> (8u * b)) & 0xffu));
    }
}

/* The (|x|, index) rule of quant_q8_K's max: larger |x| wins, equal |x|
 * the lower index (the CPU's strict > scan; NaN never wins). A total
 * order on candidates, so any reduction order finds the same winner. */
K_FN int k_q8_K_beats(float oa, float oi, float amax, float idx) {
    return oa > amax || (oa == amax && oi < idx);
}

/* One Q8_K block's 256 values in a SIMD-group: lane l holds v[i] = value
 * l + 32 i. */
typedef struct {
    float v[8];
} k_q8_K_lanes;

/* The block's largest |x| (amax), the index of the FIRST value that has it
 * (idx, as float: exact below 2^24; 1e9 when amax is 0) and that signed
 * value (mx; 0 when amax is 0): quantize_q8_K's max (per lane ascending i
 * with strict >, so NaN never wins; then the butterfly under
 * k_q8_K_beats, a total order, so the winner does not depend on how the
 * lanes are combined). All 32 lanes call it and all get the winner: a
 * SIMD-group that serves one chunk of a block (swiglu_quant,
 * attn_gate_quant) computes the same winner as its block's other seven. */
typedef struct {
    float amax, idx, mx;
} k_q8_K_win;

K_FN k_q8_K_win k_q8_K_block_max(const k_q8_K_lanes X, k_u32 lane) {
    k_q8_K_win W;
    W.amax = 0.0f, W.idx = 1.0e9f, W.mx = 0.0f;
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) {
        const float ax = k_fabs(X.v[i]);
        if (ax > W.amax) W.amax = ax, W.idx = (float)(lane + 32u * i), W.mx = X.v[i];
    }
    for (k_u32 m = 16u; m >= 1u; m >>= 1) {
        const float oa = k_shfl_xor(W.amax, m), oi = k_shfl_xor(W.idx, m), om = k_shfl_xor(W.mx, m);
#ifdef PLANT_FUSED_GATE_LAST_TIE /* planted fault (tests must turn red): |max| ties to the higher index */
        if (oa > W.amax || (oa == W.amax && oi > W.idx)) W.amax = oa, W.idx = oi, W.mx = om;
#else
        if (k_q8_K_beats(oa, oi, W.amax, W.idx)) W.amax = oa, W.idx = oi, W.mx = om;
#endif
    }
    return W;
}

/* One SIMD-group per 256-value block; lane l holds x[l + 32 i], i < 8.
 * Bit for bit the CPU's quant_q8_K (ggml quantize_row_q8_K_ref): max = the
 * FIRST element of largest |x| (strict >, so NaN never wins), then
 * k_q8_K_chunk per 32 values; an all-zero block is all zeros. */
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
    k_q8_K_lanes X;
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) X.v[i] = K_LD(x, xo + K_LANE + 32u * i);
    const k_q8_K_win W = k_q8_K_block_max(X, K_LANE);
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) k_q8_K_chunk(X.v[i], W.amax, W.mx, K_LANE, i, q, blk * 292u);
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

/* The 8 Q8_K activation words lane t's codes of one super-block meet (x32:
 * the activation rows as words; xb: the block's first word; xlo: the lane's
 * offset): Q6_K's groups lie 8 words apart, the other K-quants' in two runs
 * of 4. One load each, in this order in every kernel that reads them. */
typedef struct {
    k_u32 w[8];
} k_kq_xw;

K_FN k_kq_xw k_kq_xwords(K_DEV_IN k_u32 *x32, k_u32 xb, k_u32 xlo, k_u32 q6) {
    k_kq_xw X;
    if (q6) {
        K_UNROLL for (k_u32 q = 0; q < 4u; q++) {
            X.w[2u * q] = K_LD(x32, xb + xlo + 8u * q);
            X.w[2u * q + 1u] = K_LD(x32, xb + xlo + 8u * q + 1u);
        }
    } else {
        K_UNROLL for (k_u32 i = 0; i < 4u; i++) {
            X.w[i] = K_LD(x32, xb + xlo + i);
            X.w[4u + i] = K_LD(x32, xb + xlo + 8u + i);
        }
    }
    return X;
}

/* A row's value from its lanes' accumulators of the four super-block
 * phases, PH of them per lane (1: every phase in its own octet, 2, or 4: all
 * in one lane): ((S0 + S1) + (S2 + S3)) whatever the spread (a + b == b +
 * a), so the bits do not depend on PH. Shared by the K-quant and Q4_64A
 * matvecs (acc[h] unused past PH). */
K_FN float k_kq_phase_sum(float a0, float a1, float a2, float a3, k_u32 PH) {
    float s;
    if (PH == 1u) {
        s = k_octet_sum(a0);
        s = s + k_shfl_xor(s, 8u);
        s = s + k_shfl_xor(s, 16u);
    } else if (PH == 2u) {
        s = k_octet_sum(a0) + k_octet_sum(a1);
        s = s + k_shfl_xor(s, 8u);
    } else {
        s = (k_octet_sum(a0) + k_octet_sum(a1)) + (k_octet_sum(a2) + k_octet_sum(a3));
    }
    return s;
}

/* The lane's exact integer share of a super-block (|part| <= 32 * 127 *
 * 128 * 32 < 2^24 for every type: exact as float): per group G its two
 * code words against their activation words, times the group's scale. */
K_FN int k_kq_part(const k_kq_lane L, const k_kq_xw X) {
    int part = 0;
    K_UNROLL for (k_u32 G = 0; G < 4u; G++)
        part += L.sc[G] * k_dot4(L.code[2u * G + 1u], X.w[2u * G + 1u], k_dot4(L.code[2u * G], X.w[2u * G], 0));
    return part;
}

/* K_KQ_STREAM 1 (CUDA only; a sweep knob): the weight fetches
 * of the width-1 shared-activation design (k_matvec_kq1_shared) load with
 * ld.global.cs (__ldcs, "streaming: evict first"): every weight byte is
 * read once per launch, and letting it allocate normally in L1 evicts the
 * few KB of Q8_K activations that every SIMD-group re-reads. A load's
 * caching never changes its value. */
#ifndef K_KQ_STREAM
#define K_KQ_STREAM 1 /* on with K_KQ1_RPO 2: measured on the H200 2026-11-30 (gpu/tools/device_matvec_sweep.sh) */
#endif
#if defined(__CUDACC__) && K_KQ_STREAM
#define K_LD_W(p, i) __ldcs(&(p)[i])
#else
#define K_LD_W(p, i) K_LD(p, i)
#endif

/* The raw words one lane needs of a super-block, fetched before any is
 * used (the width-1 shared-activation design below keeps these, 8-12
 * registers, rather than the decoded lane: decoding after all loads of a
 * step are issued keeps the loads in flight and the registers few).
 * Q4_K/Q5_K: a = header chunk, b = code chunk, c = qh chunk (Q5_K).
 * Q6_K: a = ql words (l0, l0+4 | 32+l0, 32+l0+4), b.x/.y = qh words,
 * b.z/.w = scale bytes 192+8h..+7, c.x = d. */
typedef struct {
    k_u32x4 a, b, c;
} k_kq_raw;

K_FN k_kq_raw k_kq45_fetch(K_DEV_IN k_u32x4 *w4, k_u32 chunk0, k_u32 type, k_u32 t, const k_u32 stream) {
    k_kq_raw R;
    const k_u32 cq = chunk0 + (type == K_TYPE_Q4_K ? 1u : 3u) + t, ch = chunk0 + 1u + (t & 1u);
    if (stream) { /* a constant after inlining: one of the two branches is left */
        R.a = K_LD_W(w4, chunk0), R.b = K_LD_W(w4, cq);
        R.c = R.a;
        if (type == K_TYPE_Q5_K) R.c = K_LD_W(w4, ch);
    } else {
        R.a = K_LD(w4, chunk0), R.b = K_LD(w4, cq);
        R.c = R.a;
        if (type == K_TYPE_Q5_K) R.c = K_LD(w4, ch);
    }
    return R;
}

K_FN k_kq_lane k_kq45_decode(const k_kq_raw R, k_u32 type, k_u32 t) {
    k_kq_lane L;
    const k_u32x4 hd = R.a, qs = R.b, qh = R.c;
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

/* Q4_K / Q5_K (144 / 176-byte blocks: 9 / 11 chunks of 16 bytes, so every
 * block is 16-aligned): lane t loads the header chunk (d, dmin, scales; the
 * same 16 bytes for the octet: one broadcast), codes qs[16t..16t+15] (byte
 * qs[32c + l], c = t/2, l = 16(t&1)..+15, holds weight 64c + l in its low
 * nibble and 64c + 32 + l in its high one) and, for Q5_K, the qh chunk of
 * the same l (bit 2c / 2c + 1 of qh[l] adds 16). */
K_FN k_kq_lane k_kq45_load(K_DEV_IN k_u32x4 *w4, k_u32 chunk0, k_u32 type, k_u32 t) {
    return k_kq45_decode(k_kq45_fetch(w4, chunk0, type, t, 0u), type, t);
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

/* k_funnel16: quant_q8_0.h */
/* Bytes off..off+7 (off even) as two little-endian words from 4-byte
 * loads: 2 loads when off is 4-aligned, 3 when it is not (the third only
 * then, so a block's last 8 bytes never read past its end). The same
 * words k_ld_w2 gives from four 16-bit loads. */
K_FN k_u32x2 k_ld_pair2(K_DEV_IN k_u32 *w32, k_u32 off) {
    const k_u32 bw = off >> 2, sh = (off & 2u) * 8u;
    const k_u32 w0 = K_LD_W(w32, bw), w1 = K_LD_W(w32, bw + 1u);
    k_u32 w2 = 0u;
    if (sh) w2 = K_LD_W(w32, bw + 2u);
    k_u32x2 r;
    r.x = k_funnel16(w0, w1, sh), r.y = k_funnel16(w1, w2, sh);
    return r;
}

/* Q6_K, raw (k_kq_raw) for the width-1 shared-activation design: the
 * same bytes as k_kq6_load, 9..13 word loads and one 16-bit load instead
 * of 17 16-bit loads (fewer load instructions per byte is what a
 * bandwidth-bound decode matvec is short of; Q6_K blocks are only
 * 2-aligned, so 16-byte loads are out). Lane t (h = t/4, l0 = 8(t&3)):
 * ql[64h + l0..+7], ql[64h + 32 + l0..+7], qh[32h + l0..+7], scales
 * 8h..8h+7, d. */
K_FN k_kq_raw k_kq6_fetch(K_DEV_IN k_u32 *w32, K_DEV_IN k_u16 *w16, k_u32 wo, k_u32 t) {
    k_kq_raw R;
    const k_u32 h = t >> 2, l0 = 8u * (t & 3u);
    const k_u32x2 a = k_ld_pair2(w32, wo + 64u * h + l0), b = k_ld_pair2(w32, wo + 64u * h + 32u + l0);
    const k_u32x2 qh = k_ld_pair2(w32, wo + 128u + 32u * h + l0), sc = k_ld_pair2(w32, wo + 192u + 8u * h);
    R.a.x = a.x, R.a.y = a.y, R.a.z = b.x, R.a.w = b.y;
    R.b.x = qh.x, R.b.y = qh.y, R.b.z = sc.x, R.b.w = sc.y;
    R.c.x = k_ld_u16_at(w16, wo + 208u), R.c.y = 0u, R.c.z = 0u, R.c.w = 0u;
    return R;
}

/* k_kq6_load's decode, operation for operation on the same words. */
K_FN k_kq_lane k_kq6_decode(const k_kq_raw R, k_u32 t) {
    k_kq_lane L;
    const k_u32 l0 = 8u * (t & 3u), av[2] = {R.a.x, R.a.y}, bv[2] = {R.a.z, R.a.w}, hv[2] = {R.b.x, R.b.y};
    K_UNROLL for (k_u32 i = 0; i < 2u; i++) {
        const k_u32 a = av[i], b = bv[i], qh = hv[i];
        L.code[i] = k_q6_signed((a & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4));
        L.code[2u + i] = k_q6_signed((b & 0x0f0f0f0fu) | (((qh >> 2) & 0x03030303u) << 4));
        L.code[4u + i] = k_q6_signed(((a >> 4) & 0x0f0f0f0fu) | (((qh >> 4) & 0x03030303u) << 4));
        L.code[6u + i] = k_q6_signed(((b >> 4) & 0x0f0f0f0fu) | (((qh >> 6) & 0x03030303u) << 4));
    }
    /* scales[8h + 2q + (l0 >> 4)]: byte 2q + s of the 8 fetched */
    const k_u32 s8 = 8u * (l0 >> 4);
    L.sc[0] = k_i8((R.b.z >> s8) & 0xffu), L.sc[1] = k_i8((R.b.z >> (16u + s8)) & 0xffu);
    L.sc[2] = k_i8((R.b.w >> s8) & 0xffu), L.sc[3] = k_i8((R.b.w >> (16u + s8)) & 0xffu);
    L.m_lo = 0, L.m_hi = 0;
    L.d = k_h2f((k_u16)R.c.x), L.dmin = 0.0f;
    return L;
}

/* The K-quants' summation order on the GPU, K_KQ_ORDER (docs/gpu.md
 * section 4, "The K-quant order"; every K-quant kernel follows the one
 * compiled in: the matvecs below, the dp4a GEMM (gemm.h), the MoE dots
 * (moe.h), the tensor-core GEMMs (gemm_mma.h)):
 *  2 (the default since session 37): one exact integer pair (S, M) per
 *    super-block -- S = the sum over its scale groups of scale * (codes .
 *    q8), M = mins . bsums of 32 (Q4_K/Q5_K; none for Q6_K) -- and two
 *    float terms, acc += (d_w d_x) S then acc -= (dmin_w d_x) M, into the
 *    chain of its phase (ib mod 4), ascending; the row's value is
 *    ((S0 + S1) + S2) + S3. The matvecs form S and M by an octet's integer
 *    butterfly; the tensor-core GEMM adds its MMAs' integers over a whole
 *    super-block and has 2 float terms per output and super-block where
 *    order 1 has 16: prefill on the 27B-like shape +35% (H100).
 *  1 (sessions 12-36): every lane's own share of a super-block (32
 *    values) is its own pair of float terms in its own chain, the octet's
 *    chains joined by the float butterfly: ((S0 + S1) + (S2 + S3)) of the
 *    octet sums. Kept for one A/B against 2; to be removed. */
#ifndef K_KQ_ORDER
#define K_KQ_ORDER 2
#endif

/* How far ahead (in super-blocks of the row) the L2 prefetch runs. */
#ifndef K_KQ_AHEAD
#define K_KQ_AHEAD 8u /* super-blocks of L2 prefetch ahead (CUDA) */
#endif

/* The K-quant matvec, the llama.cpp-mmvq recipe in the portable dialect:
 * no threadgroup memory, no barriers; weights streamed in 16-byte loads,
 * the Q8_K activations read straight from device memory as words (tiny,
 * L1/L2-resident; the layout is only 4-aligned).
 *
 * Summation order (K_KQ_ORDER above), the same for every variant, width
 * and threadgroup size: a row's super-blocks fall into 4 phases (ib mod
 * 4), each served by an octet; per super-block ib = P, P + 4, ... the
 * octet's integer butterfly gives every lane S and M (order 1: lane t
 * adds its own share's 2 terms), and the phase's chain takes the 2 float
 * terms in ascending order; the row's value is then ((S0 + S1) + S2) + S3
 * (order 1: ((S0 + S1) + (S2 + S3)) of the octet butterflies). How the phases are spread over
 * lanes is the variant's choice (RPS rows per SIMD-group, 1, 2 or 4):
 * RPS 1 gives each phase its own octet (the 4 octets of a SIMD-group
 * stream one row, one load instruction reading 4 consecutive super-blocks:
 * 576 contiguous bytes for Q4_K; S_P + S_P' by shuffles xor 8 and 16);
 * RPS 4 gives an octet all 4 phases of its row (4 accumulators per row,
 * every activation word read once for 4 weight rows); RPS 2 in between.
 * Every weight word is read once and dotted with all n_rows activation
 * rows.
 *
 * Per super-block and row, a lane forms its exact integer share sum_G
 * sc[G] * (codes . q8) (k_dot4) and, for Q4_K/Q5_K, mins . bsums of its
 * two 16-value runs; order 2 sums both over the octet (k_octet_isum) and
 * adds (d_w * d_x) * S and -(dmin_w * d_x) * M to the phase's chain. The CPU (dot_q*_K_q8_K)
 * splits the same exact value d * S - dmin * M into its 8 integer lanes
 * instead, so the results differ by rounding only (tolerance:
 * docs/gpu.md). Loops run to the constants R, RPS and STEP with guards so
 * acc[] stays in registers. */
K_FN void k_matvec_kq_rows(const k_matvec_kq_params p, K_DEV_IN k_u8 *w, K_DEV_IN k_u8 *xq, K_DEV float *y,
                             k_u32 simd, k_u32 lane, const k_u32 R, const k_u32 RPS, const k_u32 STEP) {
    const k_u32 nb = p.n_in / 256u, type = p.wtype, nr = p.n_rows, bs = K_KQ_BLOCK_BYTES(type);
    const k_u32 OPR = 4u / RPS, PH = RPS; /* octets per row, phases per octet */
    const k_u32 o0 = simd * RPS;
    if (o0 >= p.n_out) return; /* a whole SIMD-group: no barrier, no shuffle left waiting */
    /* octets of a row past the last one compute row n_out - 1 and store
     * nothing: their SIMD-group's other rows need them in the shuffles */
    const k_u32 o = o0 + (lane >> 3) / OPR, ph0 = ((lane >> 3) % OPR) * PH;
    const k_u32 orow = o < p.n_out ? o : p.n_out - 1u;
#ifdef PLANT_KQ_OFF_BY_ONE_ROW
    /* planted fault (tests must turn red): the next row's weights, in bounds */
    const k_u32 wrow = orow + 1u < p.n_out ? orow + 1u : orow;
#else
    const k_u32 wrow = orow;
#endif
    const k_u32 t = lane & 7u, q6 = type == K_TYPE_Q6_K;
    K_DEV_IN k_u32x4 *w4 = (K_DEV_IN k_u32x4 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    /* where lane t's codes meet the Q8_K codes (word 1 + i of the 73-word
     * block holds codes 4i..4i+3): Q4_K/Q5_K words xlo..+3 (lo) and
     * xlo + 8..+11 (hi); Q6_K words xlo + 8q, + 1 */
    const k_u32 xlo = 1u + (q6 ? 32u * (t >> 2) + 2u * (t & 3u) : 16u * (t >> 1) + 4u * (t & 1u));
    /* bsums of this lane's two 16-value runs (Q4_K/Q5_K): int16 4c + (t&1)
     * and 4c + 2 + (t&1): half t&1 of bsums words 65 + 2c, + 1 */
    const k_u32 bsw = 65u + 2u * (t >> 1), bsh = 16u * (t & 1u);
    float acc[4][K_MATVEC_MAX_ROWS]; /* all 4 phases set: k_kq_phase_sum reads them */
    K_UNROLL for (k_u32 h = 0; h < 4u; h++)
        K_UNROLL for (k_u32 r = 0; r < R; r++) acc[h][r] = 0.0f;
#if K_KQ_ORDER == 2
    /* The octet's sums of the R rows' integer pairs (S_r, M_r: 2R values,
     * M 0 for Q6_K) as one transposed butterfly: at xor 4, 2, 1 each lane
     * keeps half of its values and sends the other half, so after the
     * three levels lane t holds the full sums of values [vs, vs + vn)
     * (vn = max(2R / 8, 1)); where fewer than 2 values are left a level is
     * a plain butterfly (tmask: its lanes hold the same sums). R 16: 28
     * shuffles per super-block where a butterfly per value takes 96; R 4:
     * 8 instead of 24. Lane t then owns rows vs / 2 .. (QN of them) and
     * runs only their chains: acc[h][q] is row rb + q's. vn 1: lane t
     * holds S or M of row vs / 2 and fetches M from its partner (xor
     * pmask). Exact integers in any order: the same S and M, the same
     * float terms, so the same bits as the other variants. */
    const k_u32 NV = 2u * R, QN = R >= 8u ? R / 8u : 1u;
    k_u32 vs = 0u, vn = NV, pmask = 0u, tmask = 0u;
    K_UNROLL for (k_u32 lv = 4u; lv >= 1u; lv >>= 1) {
        if (vn >= 2u) {
            if (vn == 2u) pmask = lv;
            vn >>= 1;
            if (t & lv) vs += vn;
        } else
            tmask |= lv;
    }
    const k_u32 rb = vs >> 1, owner = (t & tmask) == 0u && (vn >= 2u || (vs & 1u) == 0u);
#endif
    for (k_u32 base = 0; base < nb; base += 4u * STEP) {
        /* L2 prefetch K_KQ_AHEAD super-blocks ahead: lane t touches the
         * 32-byte sector t of each (the loads then wait on L2, not HBM,
         * and need no registers to be in flight) */
        K_UNROLL for (k_u32 u = 0; u < STEP; u++)
            K_UNROLL for (k_u32 h = 0; h < PH; h++) {
                const k_u32 pb = base + K_KQ_AHEAD + 4u * u + ph0 + h;
                if (pb < nb && 32u * t < bs) K_PREFETCH(w, (wrow * nb + pb) * bs + 32u * t);
            }
        k_kq_lane L[8]; /* STEP * RPS <= 8 (checked where the variants are made) */
        K_UNROLL for (k_u32 u = 0; u < STEP; u++) /* all loads before any use */
            K_UNROLL for (k_u32 h = 0; h < PH; h++) {
                const k_u32 ib = base + 4u * u + ph0 + h, blk = wrow * nb + (ib < nb ? ib : 0u);
                L[u * PH + h] = q6 ? k_kq6_load(w16, blk * 210u, t) : k_kq45_load(w4, blk * (bs / 16u), type, t);
            }
        if (base == 0u) K_DEP_WAIT(); /* weights in flight; activations only now (early start, common.h) */
        K_UNROLL for (k_u32 u = 0; u < STEP; u++)
            K_UNROLL for (k_u32 h = 0; h < PH; h++) {
                const k_u32 ib = base + 4u * u + ph0 + h;
#if K_KQ_ORDER == 2
                /* the octet's butterfly needs every lane: a block past the
                 * row's end is computed on block 0 and not added */
                const int valid = ib < nb;
                const k_u32 ibc = valid ? ib : 0u;
#else
                if (ib >= nb) continue; /* past the row's end: adds nothing */
                const k_u32 ibc = ib;
#endif
#if K_KQ_ORDER == 2
                {
                    int v[2u * K_MATVEC_MAX_ROWS];
                    K_UNROLL for (k_u32 r = 0; r < R; r++) {
                        v[2u * r] = 0, v[2u * r + 1u] = 0;
                        if (r >= nr) continue;
                        const k_u32 xb = (r * nb + ibc) * 73u;
                        v[2u * r] = k_kq_part(L[u * PH + h], k_kq_xwords(x32, xb, xlo, q6));
                        if (!q6) {
                            const k_u32 b0 = (K_LD(x32, xb + bsw) >> bsh) & 0xffffu, b1 = (K_LD(x32, xb + bsw + 1u) >> bsh) & 0xffffu;
                            v[2u * r + 1u] = L[u * PH + h].m_lo * ((int)b0 - (b0 & 0x8000u ? 65536 : 0)) +
                                             L[u * PH + h].m_hi * ((int)b1 - (b1 & 0x8000u ? 65536 : 0));
                        }
                    }
                    /* the three levels, each with its half size a
                     * constant (NV >> 1, >> 2, >> 3; a plain level where
                     * it is 0) so v stays in registers */
                    K_UNROLL for (k_u32 lvl = 0; lvl < 3u; lvl++) {
                        const k_u32 lv = 4u >> lvl, hn = NV >> (lvl + 1u);
                        if (hn >= 1u) {
                            const k_u32 up = (t & lv) != 0u;
                            K_UNROLL for (k_u32 i = 0; i < K_MATVEC_MAX_ROWS; i++) {
                                if (i >= hn) break;
                                const int keep = up ? v[hn + i] : v[i], send = up ? v[i] : v[hn + i];
                                v[i] = keep + k_shfl_xor_i(send, lv);
                            }
                        } else
                            v[0] = v[0] + k_shfl_xor_i(v[0], lv);
                    }
                    if (vn == 1u) v[1] = k_shfl_xor_i(v[0], pmask); /* M beside S (where vs is even) */
                    K_UNROLL for (k_u32 q = 0; q < QN; q++) {
                        const k_u32 row = rb + q;
                        const float dx = row < nr ? k_bits_f32(K_LD(x32, (row * nb + ibc) * 73u)) : 0.0f;
                        if (valid && row < nr) {
                            acc[h][q] += (L[u * PH + h].d * dx) * (float)v[2u * q];
                            if (!q6) acc[h][q] -= (L[u * PH + h].dmin * dx) * (float)v[2u * q + 1u];
                        }
                    }
                }
                continue;
#endif
                K_UNROLL for (k_u32 r = 0; r < R; r++) {
                    if (r >= nr) continue;
                    const k_u32 xb = (r * nb + ibc) * 73u;
                    const k_kq_xw X = k_kq_xwords(x32, xb, xlo, q6);
                    /* the lane's exact integer share of the super-block
                     * becomes its own float term */
                    const int part = k_kq_part(L[u * PH + h], X);
                    const float dx = k_bits_f32(K_LD(x32, xb));
                    acc[h][r] += (L[u * PH + h].d * dx) * (float)part;
                    if (!q6) {
                        const k_u32 b0 = (K_LD(x32, xb + bsw) >> bsh) & 0xffffu, b1 = (K_LD(x32, xb + bsw + 1u) >> bsh) & 0xffffu;
                        const int mpart = L[u * PH + h].m_lo * ((int)b0 - (b0 & 0x8000u ? 65536 : 0)) +
                                          L[u * PH + h].m_hi * ((int)b1 - (b1 & 0x8000u ? 65536 : 0));
                        acc[h][r] -= (L[u * PH + h].dmin * dx) * (float)mpart;
                    }
                }
            }
    }
    K_DEP_WAIT(); /* (a no-op after the first: here for a row of no blocks) */
#if K_KQ_ORDER == 2
    /* lane t of each octet holds its rows' chains of the octet's phases:
     * ((S0 + S1) + S2) + S3 in the row group's first octet */
    K_UNROLL for (k_u32 q = 0; q < QN; q++) {
        float s;
        if (PH == 1u) {
            const float a1 = k_shfl_xor(acc[0][q], 8u), a2 = k_shfl_xor(acc[0][q], 16u), a3 = k_shfl_xor(acc[0][q], 24u);
            s = ((acc[0][q] + a1) + a2) + a3;
        } else if (PH == 2u) {
            const float a2 = k_shfl_xor(acc[0][q], 8u), a3 = k_shfl_xor(acc[1][q], 8u);
            s = ((acc[0][q] + acc[1][q]) + a2) + a3;
        } else {
            s = ((acc[0][q] + acc[1][q]) + acc[2][q]) + acc[3][q];
        }
        const k_u32 row = rb + q;
        if (owner && ((lane >> 3) % OPR) == 0u && row < nr && o < p.n_out) K_ST(y, row * p.y_stride + o, s);
    }
#endif
    K_UNROLL for (k_u32 r = 0; r < R; r++) {
        if (r >= nr || K_KQ_ORDER == 2) continue;
#if K_KQ_ORDER == 2
        float s = 0.0f;
#else
        const float s = k_kq_phase_sum(acc[0][r], acc[1][r], acc[2][r], acc[3][r], PH);
#endif
        if ((lane & (8u * OPR - 1u)) == 0u && o < p.n_out) K_ST(y, r * p.y_stride + o, s);
    }
}

/* Width 1, second design (knob K_KQ1_RPO > 1; the default since the
 * H200 sweep of 2026-11-30, K_KQ1_RPO 2): a SIMD-group serves M = K_KQ1_RPO weight rows and
 * each of its 4 octets streams phase j (super-blocks ib = j mod 4) of all
 * M rows. The same bits as k_matvec_kq_rows: for every weight row, lane t
 * of the octet serving phase j adds the same two float terms per
 * super-block, (d_w d_x) share and then -(dmin_w d_x) mins, to its own
 * accumulator in ascending ib, then the octet butterfly (1, 2, 4) and
 * xor 8, xor 16 = ((S0 + S1) + (S2 + S3)) as at RPS 1; only which lane
 * holds which accumulator and when the loads are issued change. Why this
 * should be faster on a bandwidth-bound GPU (H200 profile, docs/gpu.md §7:
 * the generic kernel reads Q4_K at ~43% of HBM, 48 registers):
 *  - the activation words (8 codes + d + 2 bsums words per lane and
 *    super-block, 4-byte loads scattered over 4 Q8_K blocks: ~10 cache
 *    lines per warp instruction) are loaded once and serve M weight rows,
 *    so L1 wavefronts and load instructions per weight byte fall ~M-fold;
 *  - every weight load of a step (M rows x K_KQ1_STEP super-blocks, two
 *    16-byte loads each for Q4_K) is issued before any decoding, and the
 *    raw words (k_kq_raw, 8-12 registers) are kept instead of the decoded
 *    lane (16), so M x 576 bytes per SIMD-group are in flight with fewer
 *    registers: the same bytes in flight need M-fold fewer resident warps;
 *  - the first K_KQ_AHEAD super-blocks are L2-prefetched before the loop
 *    (rows of 5120 inputs are only 20 super-blocks: without it the first
 *    two steps wait on HBM unhidden);
 *  - Q6_K fetches its 2-aligned bytes with 4-byte loads and a funnel
 *    shift (k_kq6_fetch: 9..13 loads instead of 17 16-bit ones).
 * The host launches K_MATVEC_KQ_GROUPS(1, ...) with K_KQ1_RPS = M rows per
 * SIMD-group (table.h; -DK_KQ1_RPS=M together with -DK_KQ1_RPO=M). */
#ifndef K_KQ1_RPO
/* 2 since measured on the H200 2026-11-30 (gpu/tools/device_matvec_sweep.sh): Q4_K width 1 at 47 / 43 / 34% of
 * 4300 GB/s on 5120x17408 / 17408x5120 / 5120x6144 (1: 43 / 36 / 28%), Q6_K
 * 46 / 43 / 35% (1: 48 / 44 / 35%); 4 lost on the 17408-input shapes */
#define K_KQ1_RPO 2
#endif
#ifndef K_KQ1_PRO
#define K_KQ1_PRO 1 /* 1: prefetch the first K_KQ_AHEAD super-blocks before the loop */
#endif
K_FN void k_matvec_kq1_shared(const k_matvec_kq_params p, K_DEV_IN k_u8 *w, K_DEV_IN k_u8 *xq, K_DEV float *y,
                              k_u32 simd, k_u32 lane, const k_u32 M, const k_u32 STEP) {
    const k_u32 nb = p.n_in / 256u, type = p.wtype, bs = K_KQ_BLOCK_BYTES(type);
    const k_u32 o0 = simd * M;
    if (o0 >= p.n_out) return; /* a whole SIMD-group: no shuffle left waiting */
    const k_u32 j = lane >> 3, t = lane & 7u, q6 = type == K_TYPE_Q6_K;
    k_u32 wrow[4]; /* M <= 4; rows past n_out compute row n_out - 1 and store nothing */
    K_UNROLL for (k_u32 m = 0; m < M; m++) {
        const k_u32 orow = o0 + m < p.n_out ? o0 + m : p.n_out - 1u;
#ifdef PLANT_KQ_OFF_BY_ONE_ROW
        wrow[m] = orow + 1u < p.n_out ? orow + 1u : orow; /* planted fault: the next row's weights */
#else
        wrow[m] = orow;
#endif
    }
    K_DEV_IN k_u32x4 *w4 = (K_DEV_IN k_u32x4 *)w;
    K_DEV_IN k_u32 *w32 = (K_DEV_IN k_u32 *)w;
    K_DEV_IN k_u16 *w16 = (K_DEV_IN k_u16 *)w;
    K_DEV_IN k_u32 *x32 = (K_DEV_IN k_u32 *)xq;
    const k_u32 xlo = 1u + (q6 ? 32u * (t >> 2) + 2u * (t & 3u) : 16u * (t >> 1) + 4u * (t & 1u));
    const k_u32 bsw = 65u + 2u * (t >> 1), bsh = 16u * (t & 1u);
    const k_u32 psec = 32u * t < bs; /* lane t prefetches sector t of a block */
    if (K_KQ1_PRO && psec) {
        for (k_u32 pb = 4u * STEP + j; pb < nb && pb < K_KQ_AHEAD; pb += 4u)
            K_UNROLL for (k_u32 m = 0; m < M; m++) K_PREFETCH(w, (wrow[m] * nb + pb) * bs + 32u * t);
    }
    float acc[4];
    K_UNROLL for (k_u32 m = 0; m < M; m++) acc[m] = 0.0f;
    for (k_u32 base = 0; base < nb; base += 4u * STEP) {
        if (psec)
            K_UNROLL for (k_u32 u = 0; u < STEP; u++) {
                const k_u32 pb = base + K_KQ_AHEAD + 4u * u + j;
                if (pb < nb) K_UNROLL for (k_u32 m = 0; m < M; m++) K_PREFETCH(w, (wrow[m] * nb + pb) * bs + 32u * t);
            }
        k_kq_raw Rw[8]; /* STEP * M <= 8 (checked where the variant is made) */
        K_UNROLL for (k_u32 u = 0; u < STEP; u++) /* every weight load of the step first */
            K_UNROLL for (k_u32 m = 0; m < M; m++) {
                const k_u32 ib = base + 4u * u + j, blk = wrow[m] * nb + (ib < nb ? ib : 0u);
                Rw[u * M + m] = q6 ? k_kq6_fetch(w32, w16, blk * 210u, t) : k_kq45_fetch(w4, blk * (bs / 16u), type, t, K_KQ_STREAM);
            }
        if (base == 0u) K_DEP_WAIT(); /* weights in flight; activations only now (early start, common.h) */
        K_UNROLL for (k_u32 u = 0; u < STEP; u++) {
            const k_u32 ib = base + 4u * u + j;
#if K_KQ_ORDER == 2
            const int valid = ib < nb; /* the octet butterfly needs every lane */
            const k_u32 xb = (valid ? ib : 0u) * 73u;
#else
            if (ib >= nb) continue; /* past the row's end: adds nothing */
            const k_u32 xb = ib * 73u;
#endif
            const k_kq_xw X = k_kq_xwords(x32, xb, xlo, q6);
            const float dx = k_bits_f32(K_LD(x32, xb));
            int bs0 = 0, bs1 = 0;
            if (!q6) {
                const k_u32 b0 = (K_LD(x32, xb + bsw) >> bsh) & 0xffffu, b1 = (K_LD(x32, xb + bsw + 1u) >> bsh) & 0xffffu;
                bs0 = (int)b0 - (b0 & 0x8000u ? 65536 : 0), bs1 = (int)b1 - (b1 & 0x8000u ? 65536 : 0);
            }
#if K_KQ_ORDER == 2
            if (M == 2u) {
                /* the octet's sums of both rows' integer pairs as one
                 * transposed butterfly: xor 4 leaves lane t row b2 = bit 2
                 * of t (half of each other lane's pair), xor 2 and 1 finish
                 * S in the lanes of bit 1 clear and M in the others, one
                 * more shuffle brings M beside S: 5 shuffles for the two
                 * rows (Q6_K: 3) instead of 12 (6). Exact integers in any
                 * order: the same S and M, so the same bits. */
                int pv[2], mv[2];
                float dv[2], mnv[2];
                K_UNROLL for (k_u32 r2 = 0; r2 < 2u; r2++) {
                    const k_kq_lane L = q6 ? k_kq6_decode(Rw[u * 2u + r2], t) : k_kq45_decode(Rw[u * 2u + r2], type, t);
                    pv[r2] = k_kq_part(L, X), mv[r2] = q6 ? 0 : L.m_lo * bs0 + L.m_hi * bs1;
                    dv[r2] = L.d, mnv[r2] = L.dmin;
                }
                const k_u32 b2 = (t >> 2) & 1u, b1 = (t >> 1) & 1u;
                int S = (b2 ? pv[1] : pv[0]) + k_shfl_xor_i(b2 ? pv[0] : pv[1], 4u), Mi = 0;
                if (!q6) {
                    const int Mh = (b2 ? mv[1] : mv[0]) + k_shfl_xor_i(b2 ? mv[0] : mv[1], 4u);
                    int v = (b1 ? Mh : S) + k_shfl_xor_i(b1 ? S : Mh, 2u);
                    v = v + k_shfl_xor_i(v, 1u);
                    S = v, Mi = k_shfl_xor_i(v, 2u); /* meaningful where bit 1 is clear */
                } else {
                    S = S + k_shfl_xor_i(S, 2u);
                    S = S + k_shfl_xor_i(S, 1u);
                }
                if (valid) {
                    acc[0] += ((b2 ? dv[1] : dv[0]) * dx) * (float)S;
                    if (!q6) acc[0] -= ((b2 ? mnv[1] : mnv[0]) * dx) * (float)Mi;
                }
                continue;
            }
#endif
            K_UNROLL for (k_u32 m = 0; m < M; m++) {
                const k_kq_lane L = q6 ? k_kq6_decode(Rw[u * M + m], t) : k_kq45_decode(Rw[u * M + m], type, t);
                const int part = k_kq_part(L, X);
#if K_KQ_ORDER == 2
                const int S = k_octet_isum(part), Mi = q6 ? 0 : k_octet_isum(L.m_lo * bs0 + L.m_hi * bs1);
                if (valid) {
                    acc[m] += (L.d * dx) * (float)S;
                    if (!q6) acc[m] -= (L.dmin * dx) * (float)Mi;
                }
#else
                acc[m] += (L.d * dx) * (float)part;
                if (!q6) acc[m] -= (L.dmin * dx) * (float)(L.m_lo * bs0 + L.m_hi * bs1);
#endif
            }
        }
    }
    K_DEP_WAIT(); /* (a no-op after the first: here for a row of no blocks) */
    K_UNROLL for (k_u32 m = 0; m < M; m++) {
#if K_KQ_ORDER == 2
        /* the octet's lanes hold the same chain (M 2: lanes 4m, 4m + 1 of
         * each octet hold row m's): ((S0 + S1) + S2) + S3 */
        const k_u32 mi = M == 2u ? 0u : m, at = M == 2u ? 4u * m : 0u;
        const float a1 = k_shfl_xor(acc[mi], 8u), a2 = k_shfl_xor(acc[mi], 16u), a3 = k_shfl_xor(acc[mi], 24u);
        const float s = ((acc[mi] + a1) + a2) + a3;
        if (lane == at && o0 + m < p.n_out) K_ST(y, o0 + m, s);
        continue;
#else
        float s = k_octet_sum(acc[m]);
        s = s + k_shfl_xor(s, 8u);
        s = s + k_shfl_xor(s, 16u);
#endif
        if (lane == 0u && o0 + m < p.n_out) K_ST(y, o0 + m, s);
    }
}

/* The three width classes: one body, the row count, rows per SIMD-group
 * and super-blocks per octet and step constants after inlining, so each
 * variant keeps only its accumulators and loads in registers (one kernel
 * for all would run decode at the occupancy of width 16). A row's
 * arithmetic is the same in all three (the order above), so any width is
 * bit-identical per row to width 1 (tested). B is CUDA's
 * resident-threadgroups target (registers per thread at most 65536 / (128
 * B)). The host picks by K_MATVEC_KQ_KERNEL(n_rows) and launches
 * K_MATVEC_KQ_GROUPS(n_rows, ...) threadgroups; a grid that leaves rows
 * out raises K_ERR_SHAPE (every thread takes the same branch). Each
 * default is a -D override; they are the best of the H200 sweep
 * (cuda/bench_matvec, 5 configurations, 2026-11-29): width 1 with STEP 1
 * and 10 resident threadgroups (48 registers, one wave at 5120 rows) read
 * Q4_K 5120x17408 at 42.5% of 4300 GB/s (STEP 2 / 9: 37.7%; STEP 4 / 5:
 * 29%); widths 2..4 one row per SIMD-group and 5..16 two rows with STEP
 * 2: width 16 at 3.9% instead of 3.1%. */
#ifndef K_KQ1_STEP
#define K_KQ1_STEP 1u /* 4 super-blocks of one row in flight per SIMD-group */
#endif
#ifndef K_KQ4_STEP
#define K_KQ4_STEP 1u
#endif
#ifndef K_KQ16_STEP
#define K_KQ16_STEP 2u
#endif
#ifndef K_KQ1_TGS
#define K_KQ1_TGS 10 /* 48 registers, no spills (nvcc 13.0, sm_90; 11 spills when first set) */
#endif
#ifndef K_KQ4_TGS
#define K_KQ4_TGS 9
#endif
#ifndef K_KQ16_TGS
#define K_KQ16_TGS 3
#endif
/* the shared-activation width-1 design serves K_KQ1_RPS = K_KQ1_RPO rows */
typedef char k_kq1_rpo_fits[K_KQ1_RPO == 1 || (K_KQ1_RPO == K_KQ1_RPS && K_KQ1_RPO <= 4) ? 1 : -1];
#define K_KQ_VARIANT(K, R, RPS, STEP, B)                                                   \
    typedef char k_##K##_step_fits[(STEP) * (RPS) <= 8u && ((RPS) == 1 || (RPS) == 2 || (RPS) == 4) ? 1 : -1];                         \
    K_KERNEL_BOUNDED(K, K_MATVEC_MAX_TG, B) {                                              \
        K_CHECK_TAG_EARLY(K); /* K_DEP_WAIT after the first weight loads */              \
        const k_u32 bs_ = K_KQ_BLOCK_BYTES(p.wtype);                                       \
        if (p.n_in % 256u || p.n_rows == 0u || p.n_rows > (R) || bs_ == 0u ||             \
            K_TG_SIZE > K_MATVEC_MAX_TG || K_NGX * K_NSIMD * (RPS) < p.n_out) {           \
            k_raise(status, K_ERR_SHAPE);                                                  \
            return;                                                                        \
        }                                                                                  \
        if ((R) == 1u && K_KQ1_RPO > 1)                                                    \
            k_matvec_kq1_shared(p, w, xq, y, K_GX * K_NSIMD + K_SIMD, K_LANE, (RPS), (STEP)); \
        else                                                                               \
            k_matvec_kq_rows(p, w, xq, y, K_GX * K_NSIMD + K_SIMD, K_LANE, (R), (RPS), (STEP)); \
    }

K_KQ_VARIANT(matvec_kq1, 1u, K_KQ1_RPS, K_KQ1_STEP, K_KQ1_TGS)
K_KQ_VARIANT(matvec_kq4, 4u, K_KQ4_RPS, K_KQ4_STEP, K_KQ4_TGS)
K_KQ_VARIANT(matvec_kq, K_MATVEC_MAX_ROWS, K_KQ16_RPS, K_KQ16_STEP, K_KQ16_TGS)
