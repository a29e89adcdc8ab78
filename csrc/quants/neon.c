/*
 * neon.c — arm64 kernels: Advanced SIMD plus the ARMv8.2 dot-product
 * extension (SDOT, vdotq_s32).
 *
 * build_core.py compiles this file with -march=armv8.2-a+dotprod+fp16 on
 * arm64 and with no target flags elsewhere; off arm64 (or on a compiler that
 * rejected the flags) the body below is skipped and the init reports "not
 * provided", so the dispatcher keeps NEON unavailable.
 *
 * Contracts, the same as the scalar reference (scalar.c) they are tested
 * against in tests/neon/test_kernels.c:
 *  - to_float is bit-exact: the same float operations in the same order as
 *    the reference (a separate multiply then add/subtract, never a fused one;
 *    the build uses -ffp-contract=off and we only call vmulq/vaddq/vsubq).
 *  - from_float (Q8_0, Q8_1, Q8_K) is byte-exact: x*(127/amax) (or x*iscale)
 *    in float32, rounded to nearest-even (FCVTNS / ggml's magic-number add)
 *    as the reference does; rows holding NaN/Inf match too, because the
 *    reference's x86 / ggml corner cases are reproduced (see each quantizer).
 *  - dots may differ from the reference by float reassociation only: integer
 *    partial sums are exact, and every reduction has a fixed order that
 *    depends on n alone (no thread count, no alignment), so results are
 *    deterministic.
 *  - no heap, no read or write past the row (tails are handled lane-exactly).
 *
 * fp16 values are converted with the hardware FCVT: exact for every input,
 * and a NaN comes out quiet with its payload kept, bit for bit what
 * ds4_fp16_to_f32 returns (with FPCR.DN clear, the Linux and macOS default).
 */
#include "quants.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>

/* ------------------------------------------------------------- helpers -- */

static inline float h2f(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

static inline float bf2f(uint16_t h) { return ds4_bf16_to_f32(h); }

static inline float hsum4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(a, b), vaddq_f32(c, d)));
}

/* 16 int8 codes -> 4 float vectors (exact: |q| < 2^24). */
static inline void s8x16_to_f32(int8x16_t q, float32x4_t f[4]) {
    int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

/* dst[0..15] = q*d : the reference's single rounding of float(q)*d. */
static inline void store_mul16(float *dst, int8x16_t q, float d) {
    float32x4_t f[4];
    s8x16_to_f32(q, f);
    for (int i = 0; i < 4; i++) vst1q_f32(dst + 4 * i, vmulq_n_f32(f[i], d));
}

/* dst = q*d + m, rounded after the multiply and after the add. */
static inline void store_affine16(float *dst, int8x16_t q, float d, float m) {
    float32x4_t f[4];
    const float32x4_t vm = vdupq_n_f32(m);
    s8x16_to_f32(q, f);
    for (int i = 0; i < 4; i++) vst1q_f32(dst + 4 * i, vaddq_f32(vmulq_n_f32(f[i], d), vm));
}

/* dst = d*q - m (K-quants), rounded after the multiply and after the subtract. */
static inline void store_kmin16(float *dst, int8x16_t q, float d, float m) {
    float32x4_t f[4];
    const float32x4_t vm = vdupq_n_f32(m);
    s8x16_to_f32(q, f);
    for (int i = 0; i < 4; i++) vst1q_f32(dst + 4 * i, vsubq_f32(vmulq_n_f32(f[i], d), vm));
}

/* acc[i] += float(q) * a for 16 codes against 16 float activations. */
static inline void fma16(float32x4_t acc[4], int8x16_t q, const float *a) {
    float32x4_t f[4];
    s8x16_to_f32(q, f);
    for (int i = 0; i < 4; i++) acc[i] = vfmaq_f32(acc[i], f[i], vld1q_f32(a + 4 * i));
}

/* Sum of 16 float activations into acc. */
static inline float32x4_t add16(float32x4_t acc, const float *a) {
    float32x4_t s = vaddq_f32(vaddq_f32(vld1q_f32(a), vld1q_f32(a + 4)),
                              vaddq_f32(vld1q_f32(a + 8), vld1q_f32(a + 12)));
    return vaddq_f32(acc, s);
}

static inline float32x4_t zero4(void) { return vdupq_n_f32(0.0f); }

static inline int8x16_t lo_nib(uint8x16_t b) { return vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))); }
static inline int8x16_t hi_nib(uint8x16_t b) { return vreinterpretq_s8_u8(vshrq_n_u8(b, 4)); }

/* Q5_0/Q5_1 high bits: bit j of the 16-bit word h -> 0x10 in byte j. */
static inline uint8x16_t q5_high16(uint32_t h) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t b = vcombine_u8(vdup_n_u8((uint8_t)(h & 0xFF)), vdup_n_u8((uint8_t)((h >> 8) & 0xFF)));
    return vandq_u8(vtstq_u8(b, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* ggml-quants.c get_scale_min_k4: eight 6-bit scales and mins from 12 bytes. */
static inline void k4_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        mn[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Σ_j mins[j] * (bsums[2j] + bsums[2j+1]) of a Q8_K block, exact. */
static inline int32_t k_min_sum(const int16_t *bsums, const uint8_t mn[8]) {
    int16x8_t bs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    int32x4_t p = vmull_s16(vget_low_s16(bs), vget_low_s16(m));
    p = vmlal_s16(p, vget_high_s16(bs), vget_high_s16(m));
    return vaddvq_s32(p);
}

/* IQ4_XS 6-bit sub-block scale ib (ggml-quants.c dequantize_row_iq4_xs). */
static inline int iq4xs_ls(const block_iq4_xs *x, int ib) {
    return ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((x->scales_h >> 2 * ib) & 3) << 4);
}

/* Q4_64A: 32 codes of one half from 16 bytes, in element order (even j is
 * the low nibble of byte j/2, so low and high nibbles interleave). */
static inline void q4a_codes(const uint8_t *qs, int8x16_t c[2]) {
    uint8x16_t b = vld1q_u8(qs);
    uint8x16_t lo = vandq_u8(b, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(b, 4);
    c[0] = vreinterpretq_s8_u8(vzip1q_u8(lo, hi));
    c[1] = vreinterpretq_s8_u8(vzip2q_u8(lo, hi));
}

/* Q2_64A: all 64 codes from 16 bytes, in element order (j at bits
 * 2*(j%4) of byte j/4: four planes interleaved by two rounds of zips). */
static inline void q2a_codes(const uint8_t *qs, int8x16_t c[4]) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    uint8x16_t b = vld1q_u8(qs);
    uint8x16_t p0 = vandq_u8(b, m3), p1 = vandq_u8(vshrq_n_u8(b, 2), m3);
    uint8x16_t p2 = vandq_u8(vshrq_n_u8(b, 4), m3), p3 = vshrq_n_u8(b, 6);
    uint8x16_t e02l = vzip1q_u8(p0, p2), e02h = vzip2q_u8(p0, p2);
    uint8x16_t e13l = vzip1q_u8(p1, p3), e13h = vzip2q_u8(p1, p3);
    c[0] = vreinterpretq_s8_u8(vzip1q_u8(e02l, e13l));
    c[1] = vreinterpretq_s8_u8(vzip2q_u8(e02l, e13l));
    c[2] = vreinterpretq_s8_u8(vzip1q_u8(e02h, e13h));
    c[3] = vreinterpretq_s8_u8(vzip2q_u8(e02h, e13h));
}

/* Q6_K: the 128 codes of one half (ql 64 bytes, qh 32 bytes), minus 32,
 * as 8 groups of 16 in element order; group g uses scale sc[g]. */
static inline void q6k_codes(const uint8_t *ql, const uint8_t *qh, int8x16_t q[8]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    uint8x16_t L0 = vld1q_u8(ql), L1 = vld1q_u8(ql + 16), L2 = vld1q_u8(ql + 32), L3 = vld1q_u8(ql + 48);
    uint8x16_t H0 = vld1q_u8(qh), H1 = vld1q_u8(qh + 16);
    uint8x16_t u[8];
    u[0] = vorrq_u8(vandq_u8(L0, m4), vshlq_n_u8(vandq_u8(H0, m3), 4));
    u[1] = vorrq_u8(vandq_u8(L1, m4), vshlq_n_u8(vandq_u8(H1, m3), 4));
    u[2] = vorrq_u8(vandq_u8(L2, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H0, 2), m3), 4));
    u[3] = vorrq_u8(vandq_u8(L3, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H1, 2), m3), 4));
    u[4] = vorrq_u8(vshrq_n_u8(L0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H0, 4), m3), 4));
    u[5] = vorrq_u8(vshrq_n_u8(L1, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H1, 4), m3), 4));
    u[6] = vorrq_u8(vshrq_n_u8(L2, 4), vshlq_n_u8(vshrq_n_u8(H0, 6), 4));
    u[7] = vorrq_u8(vshrq_n_u8(L3, 4), vshlq_n_u8(vshrq_n_u8(H1, 6), 4));
    for (int g = 0; g < 8; g++) q[g] = vsubq_s8(vreinterpretq_s8_u8(u[g]), off);
}

/* Q5_K: codes of chunk j (64 weights: 32 low nibbles then 32 high nibbles),
 * with bit 2j / 2j+1 of qh[l] as bit 4. */
static inline void q5k_codes(const uint8_t *ql, const uint8_t *qh, int j, int8x16_t q[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1);
    const int8x16_t sl = vdupq_n_s8((int8_t)(-2 * j)), sh = vdupq_n_s8((int8_t)(-2 * j - 1));
    uint8x16_t b0 = vld1q_u8(ql), b1 = vld1q_u8(ql + 16);
    uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
    /* vshlq by a negative count shifts right. */
    uint8x16_t hl0 = vshlq_n_u8(vandq_u8(vshlq_u8(h0, sl), one), 4);
    uint8x16_t hl1 = vshlq_n_u8(vandq_u8(vshlq_u8(h1, sl), one), 4);
    uint8x16_t hh0 = vshlq_n_u8(vandq_u8(vshlq_u8(h0, sh), one), 4);
    uint8x16_t hh1 = vshlq_n_u8(vandq_u8(vshlq_u8(h1, sh), one), 4);
    q[0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b0, m4), hl0));
    q[1] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b1, m4), hl1));
    q[2] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b0, 4), hh0));
    q[3] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b1, 4), hh1));
}

/* -------------------------------------------------------- F32/F16/BF16 -- */

static void to_float_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* FCVT is exact for every fp16 input; a signalling NaN comes out quiet with
 * its payload kept, which is what ds4_fp16_to_f32 (and F16C) produce too. */
static void to_float_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(x + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++) dst[i] = ds4_fp16_to_f32(x[i]);
}

static void to_float_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t h = vld1q_u16(x + i);
        vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
        vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
    }
    for (; i < n; i++) dst[i] = bf2f(x[i]);
}

/* Element loaders for the float dots: 4 values of each storage type. */
static inline float32x4_t ld_f32(const void *p, int64_t i) { return vld1q_f32((const float *)p + i); }
static inline float32x4_t ld_f16(const void *p, int64_t i) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
}
static inline float32x4_t ld_bf16(const void *p, int64_t i) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
}
static inline float el_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
static inline float el_f16(const void *p, int64_t i) { return h2f(((const uint16_t *)p)[i]); }
static inline float el_bf16(const void *p, int64_t i) { return bf2f(((const uint16_t *)p)[i]); }

/* Float dot over any n: four accumulators over 16-wide steps, then a 4-wide
 * loop into the first, then a scalar tail; the order depends on n only. */
#define FLOAT_DOT(NAME, LDX, ELX, LDY, ELY)                                         \
    static void NAME(int64_t n, float *s, const void *x, const void *y) {          \
        float32x4_t a0 = zero4(), a1 = zero4(), a2 = zero4(), a3 = zero4();         \
        int64_t i = 0;                                                             \
        for (; i + 16 <= n; i += 16) {                                             \
            a0 = vfmaq_f32(a0, LDX(x, i), LDY(y, i));                              \
            a1 = vfmaq_f32(a1, LDX(x, i + 4), LDY(y, i + 4));                      \
            a2 = vfmaq_f32(a2, LDX(x, i + 8), LDY(y, i + 8));                      \
            a3 = vfmaq_f32(a3, LDX(x, i + 12), LDY(y, i + 12));                    \
        }                                                                          \
        for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, LDX(x, i), LDY(y, i));        \
        float sum = hsum4(a0, a1, a2, a3);                                         \
        for (; i < n; i++) sum += ELX(x, i) * ELY(y, i);                           \
        *s = sum;                                                                  \
    }

FLOAT_DOT(dot_f32_f32, ld_f32, el_f32, ld_f32, el_f32)
FLOAT_DOT(dot_f16_f16, ld_f16, el_f16, ld_f16, el_f16)
FLOAT_DOT(dot_f16_f32, ld_f16, el_f16, ld_f32, el_f32)
FLOAT_DOT(dot_bf16_bf16, ld_bf16, el_bf16, ld_bf16, el_bf16)
FLOAT_DOT(dot_bf16_f32, ld_bf16, el_bf16, ld_f32, el_f32)

/* ---------------------------------------------------------------- Q8_0 -- */

static void to_float_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += 32) {
        const float d = h2f(x[i].d);
        store_mul16(dst, vld1q_s8(x[i].qs), d);
        store_mul16(dst + 16, vld1q_s8(x[i].qs + 16), d);
    }
}

static void dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx, *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int32x4_t p = vdotq_s32(vdupq_n_s32(0), vld1q_s8(x[i].qs), vld1q_s8(y[i].qs));
        p = vdotq_s32(p, vld1q_s8(x[i].qs + 16), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(x[i].d) * h2f(y[i].d));
    }
    *s = vaddvq_f32(acc);
}

static void dot_q8_0_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK8_0; i++, y += 32) {
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        fma16(b, vld1q_s8(x[i].qs), y);
        fma16(b, vld1q_s8(x[i].qs + 16), y + 16);
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), h2f(x[i].d));
    }
    *s = vaddvq_f32(acc);
}

/* maxps(a, b) as x86 computes it: b unless a > b (a NaN in either gives b). */
static inline float32x4_t maxps4(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
static inline float maxps1(float a, float b) { return a > b ? a : b; }

/* Q8_0 / Q8_1 activation quantizer, byte for byte the reference's emulation
 * of llama.cpp's x86 AVX2 quantize_row_q8_0/_q8_1 (scalar.c
 * quant_block_q8_avx2): d = amax/127, codes = rne(x * (127/amax)) in float32.
 * Finite inputs need nothing more than FCVTNS; the rest reproduces the x86
 * corner cases so that NaN/Inf rows also match: max|x| is folded with
 * maxps's NaN rule in AVX2's lane order (lanes l and 4+l of our two vectors
 * are AVX2's lane l and 4+l), and a NaN or out-of-int32 product converts to
 * INT32_MIN (cvtps2dq's "integer indefinite") before the saturating packs.
 * Returns the wrapping int32 sum of the unsaturated codes, Q8_1's s input. */
static inline int32_t quant_block_q8(const float *x, int8_t *qs, float *d_out) {
    float32x4_t v[8];
    for (int i = 0; i < 8; i++) v[i] = vld1q_f32(x + 4 * i);
    /* v[2k] holds AVX2 vector k's lanes 0..3, v[2k+1] its lanes 4..7. */
    float32x4_t lo = vabsq_f32(v[0]), hi = vabsq_f32(v[1]);
    for (int k = 1; k < 4; k++) {
        lo = maxps4(lo, vabsq_f32(v[2 * k]));
        hi = maxps4(hi, vabsq_f32(v[2 * k + 1]));
    }
    const float32x4_t m4 = maxps4(hi, lo);
    const float amax = maxps1(maxps1(vgetq_lane_f32(m4, 0), vgetq_lane_f32(m4, 2)),
                              maxps1(vgetq_lane_f32(m4, 1), vgetq_lane_f32(m4, 3)));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    const float32x4_t lim = vdupq_n_f32(2147483648.0f);
    const int32x4_t indefinite = vdupq_n_s32(INT32_MIN);
    int32x4_t q[8];
    int32x4_t sum = vdupq_n_s32(0);
    for (int i = 0; i < 8; i++) {
        const float32x4_t r = vmulq_n_f32(v[i], id);
        /* |r| < 2^31 is false for NaN too; -2^31 itself converts to INT32_MIN
         * either way. */
        q[i] = vbslq_s32(vcaltq_f32(r, lim), vcvtnq_s32_f32(r), indefinite);
        sum = vaddq_s32(sum, q[i]);
    }
    for (int h = 0; h < 2; h++) {
        int16x8_t a = vcombine_s16(vqmovn_s32(q[4 * h]), vqmovn_s32(q[4 * h + 1]));
        int16x8_t b = vcombine_s16(vqmovn_s32(q[4 * h + 2]), vqmovn_s32(q[4 * h + 3]));
        vst1q_s8(qs + 16 * h, vcombine_s8(vqmovn_s16(a), vqmovn_s16(b)));
    }
    *d_out = d;
    return vaddvq_s32(sum);
}

static void from_float_q8_0(const float *src, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d;
        (void)quant_block_q8(src + 32 * i, y[i].qs, &d);
        y[i].d = ds4_f32_to_fp16(d);
    }
}

static void from_float_q8_1(const float *src, void *dst, int64_t n) {
    block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        float d;
        const int32_t sum = quant_block_q8(src + 32 * i, y[i].qs, &d);
        y[i].d = ds4_f32_to_fp16(d);
        y[i].s = ds4_f32_to_fp16(d * (float)sum);
    }
}

/* ---------------------------------------------------------------- Q8_K -- */

/* ggml-quants.c quantize_row_q8_K_ref (what x86's quantize_row_q8_K calls),
 * byte for byte the reference: max = the first element of largest |x| (NaN
 * ignored, as by its `>` compare),
 * iscale = -127/max, code = min(127, nearest_int(iscale*x)) stored by
 * truncation to int8, d = 1/iscale, bsums = sums of 16 codes; an all-zero
 * block is all zeros, bsums included. nearest_int is done as ggml does it
 * (add 1.5*2^23, take the mantissa bits), which equals round-to-nearest-even
 * for every finite code and reproduces its result for NaN/Inf products. */
static void from_float_q8_K(const float *src, void *dst, int64_t n) {
    block_q8_K *y = dst;
    const float32x4_t magic = vdupq_n_f32(12582912.f);
    const int32x4_t mant = vdupq_n_s32(0x007fffff), bias = vdupq_n_s32(0x00400000);
    const int32x4_t cap = vdupq_n_s32(127);
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        /* Lane maxima by `|x| > m` like the reference (vmaxnm would let a
         * signalling NaN through); the lanes then hold no NaN. */
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) {
            const float32x4_t ax = vabsq_f32(vld1q_f32(src + j));
            m = vbslq_f32(vcgtq_f32(ax, m), ax, m);
        }
        const float amax = vmaxvq_f32(m);
        if (!(amax > 0.0f)) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            if (src[j] == amax || src[j] == -amax) { max = src[j]; break; }
        }
        const float iscale = -127.f / max;
        for (int g = 0; g < QK_K / 16; g++) {
            int32x4_t q[4];
            for (int k = 0; k < 4; k++) {
                float32x4_t f = vaddq_f32(vmulq_n_f32(vld1q_f32(src + 16 * g + 4 * k), iscale), magic);
                int32x4_t b = vsubq_s32(vandq_s32(vreinterpretq_s32_f32(f), mant), bias);
                q[k] = vminq_s32(b, cap);
            }
            /* Truncating narrows (XTN), like the reference's (int8_t) store. */
            int16x8_t a = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
            int16x8_t b = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
            int8x16_t c = vcombine_s8(vmovn_s16(a), vmovn_s16(b));
            vst1q_s8(y[i].qs + 16 * g, c);
            y[i].bsums[g] = (int16_t)vaddlvq_s8(c);
        }
        y[i].d = 1 / iscale;
    }
}

/* ---------------------------------------------------------- Q4_0 / Q4_1 -- */

static void to_float_q4_0(const void *src, float *dst, int64_t n) {
    const block_q4_0 *x = src;
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t i = 0; i < n / QK4_0; i++, dst += 32) {
        const float d = h2f(x[i].d);
        uint8x16_t b = vld1q_u8(x[i].qs);
        store_mul16(dst, vsubq_s8(lo_nib(b), eight), d);
        store_mul16(dst + 16, vsubq_s8(hi_nib(b), eight), d);
    }
}

static void dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK4_0; i++) {
        uint8x16_t b = vld1q_u8(x[i].qs);
        int32x4_t p = vdotq_s32(vdupq_n_s32(0), vsubq_s8(lo_nib(b), eight), vld1q_s8(y[i].qs));
        p = vdotq_s32(p, vsubq_s8(hi_nib(b), eight), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(x[i].d) * h2f(y[i].d));
    }
    *s = vaddvq_f32(acc);
}

static void dot_q4_0_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const float *y = vy;
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK4_0; i++, y += 32) {
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        uint8x16_t w = vld1q_u8(x[i].qs);
        fma16(b, vsubq_s8(lo_nib(w), eight), y);
        fma16(b, vsubq_s8(hi_nib(w), eight), y + 16);
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), h2f(x[i].d));
    }
    *s = vaddvq_f32(acc);
}

static void to_float_q4_1(const void *src, float *dst, int64_t n) {
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += 32) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        uint8x16_t b = vld1q_u8(x[i].qs);
        store_affine16(dst, lo_nib(b), d, m);
        store_affine16(dst + 16, hi_nib(b), d, m);
    }
}

/* d_x*d_y*Σq·a + m_x*s_y (ggml-cpu quants.c ggml_vec_dot_q4_1_q8_1). */
static void dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float32x4_t acc = zero4();
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        uint8x16_t b = vld1q_u8(x[i].qs);
        int32x4_t p = vdotq_s32(vdupq_n_s32(0), lo_nib(b), vld1q_s8(y[i].qs));
        p = vdotq_s32(p, hi_nib(b), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(x[i].d) * h2f(y[i].d));
        summ += h2f(x[i].m) * h2f(y[i].s);
    }
    *s = vaddvq_f32(acc) + summ;
}

static void dot_q4_1_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK4_1; i++, y += 32) {
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        uint8x16_t w = vld1q_u8(x[i].qs);
        fma16(b, lo_nib(w), y);
        fma16(b, hi_nib(w), y + 16);
        float32x4_t sa = add16(add16(zero4(), y), y + 16);
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), h2f(x[i].d));
        acc = vfmaq_n_f32(acc, sa, h2f(x[i].m));
    }
    *s = vaddvq_f32(acc);
}

/* ---------------------------------------------------------- Q5_0 / Q5_1 -- */

/* The 32 5-bit codes of a Q5 block: low nibbles then high nibbles, bit 4
 * from qh (bit j for element j). */
static inline void q5_codes(const uint8_t *qs, const uint8_t qh[4], int8x16_t c[2]) {
    uint32_t h;
    memcpy(&h, qh, 4);
    uint8x16_t b = vld1q_u8(qs);
    c[0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0F)), q5_high16(h & 0xFFFF)));
    c[1] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b, 4), q5_high16(h >> 16)));
}

static void to_float_q5_0(const void *src, float *dst, int64_t n) {
    const block_q5_0 *x = src;
    const int8x16_t sixteen = vdupq_n_s8(16);
    for (int64_t i = 0; i < n / QK5_0; i++, dst += 32) {
        int8x16_t c[2];
        q5_codes(x[i].qs, x[i].qh, c);
        const float d = h2f(x[i].d);
        store_mul16(dst, vsubq_s8(c[0], sixteen), d);
        store_mul16(dst + 16, vsubq_s8(c[1], sixteen), d);
    }
}

static void dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    const int8x16_t sixteen = vdupq_n_s8(16);
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK5_0; i++) {
        int8x16_t c[2];
        q5_codes(x[i].qs, x[i].qh, c);
        int32x4_t p = vdotq_s32(vdupq_n_s32(0), vsubq_s8(c[0], sixteen), vld1q_s8(y[i].qs));
        p = vdotq_s32(p, vsubq_s8(c[1], sixteen), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(x[i].d) * h2f(y[i].d));
    }
    *s = vaddvq_f32(acc);
}

static void dot_q5_0_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const float *y = vy;
    const int8x16_t sixteen = vdupq_n_s8(16);
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK5_0; i++, y += 32) {
        int8x16_t c[2];
        q5_codes(x[i].qs, x[i].qh, c);
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        fma16(b, vsubq_s8(c[0], sixteen), y);
        fma16(b, vsubq_s8(c[1], sixteen), y + 16);
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), h2f(x[i].d));
    }
    *s = vaddvq_f32(acc);
}

static void to_float_q5_1(const void *src, float *dst, int64_t n) {
    const block_q5_1 *x = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += 32) {
        int8x16_t c[2];
        q5_codes(x[i].qs, x[i].qh, c);
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        store_affine16(dst, c[0], d, m);
        store_affine16(dst + 16, c[1], d, m);
    }
}

static void dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float32x4_t acc = zero4();
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        int8x16_t c[2];
        q5_codes(x[i].qs, x[i].qh, c);
        int32x4_t p = vdotq_s32(vdupq_n_s32(0), c[0], vld1q_s8(y[i].qs));
        p = vdotq_s32(p, c[1], vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(x[i].d) * h2f(y[i].d));
        summ += h2f(x[i].m) * h2f(y[i].s);
    }
    *s = vaddvq_f32(acc) + summ;
}

static void dot_q5_1_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK5_1; i++, y += 32) {
        int8x16_t c[2];
        q5_codes(x[i].qs, x[i].qh, c);
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        fma16(b, c[0], y);
        fma16(b, c[1], y + 16);
        float32x4_t sa = add16(add16(zero4(), y), y + 16);
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), h2f(x[i].d));
        acc = vfmaq_n_f32(acc, sa, h2f(x[i].m));
    }
    *s = vaddvq_f32(acc);
}

/* -------------------------------------------------------------- IQ4_NL -- */

static void to_float_iq4_nl(const void *src, float *dst, int64_t n) {
    const block_iq4_nl *x = src;
    const int8x16_t kv = vld1q_s8(ds4_kvalues_iq4nl);
    for (int64_t i = 0; i < n / QK4_NL; i++, dst += 32) {
        const float d = h2f(x[i].d);
        uint8x16_t b = vld1q_u8(x[i].qs);
        store_mul16(dst, vqtbl1q_s8(kv, vandq_u8(b, vdupq_n_u8(0x0F))), d);
        store_mul16(dst + 16, vqtbl1q_s8(kv, vshrq_n_u8(b, 4)), d);
    }
}

static void dot_iq4_nl_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const int8x16_t kv = vld1q_s8(ds4_kvalues_iq4nl);
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        uint8x16_t b = vld1q_u8(x[i].qs);
        int32x4_t p = vdotq_s32(vdupq_n_s32(0), vqtbl1q_s8(kv, vandq_u8(b, vdupq_n_u8(0x0F))),
                                vld1q_s8(y[i].qs));
        p = vdotq_s32(p, vqtbl1q_s8(kv, vshrq_n_u8(b, 4)), vld1q_s8(y[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(x[i].d) * h2f(y[i].d));
    }
    *s = vaddvq_f32(acc);
}

static void dot_iq4_nl_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx;
    const float *y = vy;
    const int8x16_t kv = vld1q_s8(ds4_kvalues_iq4nl);
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK4_NL; i++, y += 32) {
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        uint8x16_t w = vld1q_u8(x[i].qs);
        fma16(b, vqtbl1q_s8(kv, vandq_u8(w, vdupq_n_u8(0x0F))), y);
        fma16(b, vqtbl1q_s8(kv, vshrq_n_u8(w, 4)), y + 16);
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), h2f(x[i].d));
    }
    *s = vaddvq_f32(acc);
}

/* ---------------------------------------------------------------- Q4_K -- */

static void to_float_q4_K(const void *src, float *dst, int64_t n) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(x[i].scales, sc, mn);
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int j = 0; j < 4; j++, dst += 64) {
            const float d1 = d * sc[2 * j], m1 = dmin * mn[2 * j];
            const float d2 = d * sc[2 * j + 1], m2 = dmin * mn[2 * j + 1];
            uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * j), b1 = vld1q_u8(x[i].qs + 32 * j + 16);
            store_kmin16(dst, lo_nib(b0), d1, m1);
            store_kmin16(dst + 16, lo_nib(b1), d1, m1);
            store_kmin16(dst + 32, hi_nib(b0), d2, m2);
            store_kmin16(dst + 48, hi_nib(b1), d2, m2);
        }
    }
}

static void dot_q4_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(x[i].scales, sc, mn);
        const int32_t summ = k_min_sum(y[i].bsums, mn);
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++) {
            const int8_t *a = y[i].qs + 64 * j;
            uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * j), b1 = vld1q_u8(x[i].qs + 32 * j + 16);
            int32x4_t pl = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo_nib(b0), vld1q_s8(a)), lo_nib(b1), vld1q_s8(a + 16));
            int32x4_t ph = vdotq_s32(vdotq_s32(vdupq_n_s32(0), hi_nib(b0), vld1q_s8(a + 32)), hi_nib(b1), vld1q_s8(a + 48));
            acc = vmlaq_n_s32(acc, pl, sc[2 * j]);
            acc = vmlaq_n_s32(acc, ph, sc[2 * j + 1]);
        }
        const float d = h2f(x[i].d) * y[i].d, dmin = h2f(x[i].dmin) * y[i].d;
        sumf += d * (float)vaddvq_s32(acc) - dmin * (float)summ;
    }
    *s = sumf;
}

static void dot_q4_K_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(x[i].scales, sc, mn);
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int j = 0; j < 4; j++, y += 64) {
            uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * j), b1 = vld1q_u8(x[i].qs + 32 * j + 16);
            float32x4_t l[4] = {zero4(), zero4(), zero4(), zero4()};
            float32x4_t h[4] = {zero4(), zero4(), zero4(), zero4()};
            fma16(l, lo_nib(b0), y);
            fma16(l, lo_nib(b1), y + 16);
            fma16(h, hi_nib(b0), y + 32);
            fma16(h, hi_nib(b1), y + 48);
            float32x4_t sl = add16(add16(zero4(), y), y + 16);
            float32x4_t sh = add16(add16(zero4(), y + 32), y + 48);
            acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(l[0], l[1]), vaddq_f32(l[2], l[3])), d * sc[2 * j]);
            acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(h[0], h[1]), vaddq_f32(h[2], h[3])), d * sc[2 * j + 1]);
            acc = vfmsq_f32(acc, sl, vdupq_n_f32(dmin * mn[2 * j]));
            acc = vfmsq_f32(acc, sh, vdupq_n_f32(dmin * mn[2 * j + 1]));
        }
    }
    *s = vaddvq_f32(acc);
}

/* ---------------------------------------------------------------- Q5_K -- */

static void to_float_q5_K(const void *src, float *dst, int64_t n) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(x[i].scales, sc, mn);
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int j = 0; j < 4; j++, dst += 64) {
            int8x16_t q[4];
            q5k_codes(x[i].qs + 32 * j, x[i].qh, j, q);
            const float d1 = d * sc[2 * j], m1 = dmin * mn[2 * j];
            const float d2 = d * sc[2 * j + 1], m2 = dmin * mn[2 * j + 1];
            store_kmin16(dst, q[0], d1, m1);
            store_kmin16(dst + 16, q[1], d1, m1);
            store_kmin16(dst + 32, q[2], d2, m2);
            store_kmin16(dst + 48, q[3], d2, m2);
        }
    }
}

static void dot_q5_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(x[i].scales, sc, mn);
        const int32_t summ = k_min_sum(y[i].bsums, mn);
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++) {
            const int8_t *a = y[i].qs + 64 * j;
            int8x16_t q[4];
            q5k_codes(x[i].qs + 32 * j, x[i].qh, j, q);
            int32x4_t pl = vdotq_s32(vdotq_s32(vdupq_n_s32(0), q[0], vld1q_s8(a)), q[1], vld1q_s8(a + 16));
            int32x4_t ph = vdotq_s32(vdotq_s32(vdupq_n_s32(0), q[2], vld1q_s8(a + 32)), q[3], vld1q_s8(a + 48));
            acc = vmlaq_n_s32(acc, pl, sc[2 * j]);
            acc = vmlaq_n_s32(acc, ph, sc[2 * j + 1]);
        }
        const float d = h2f(x[i].d) * y[i].d, dmin = h2f(x[i].dmin) * y[i].d;
        sumf += d * (float)vaddvq_s32(acc) - dmin * (float)summ;
    }
    *s = sumf;
}

static void dot_q5_K_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(x[i].scales, sc, mn);
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int j = 0; j < 4; j++, y += 64) {
            int8x16_t q[4];
            q5k_codes(x[i].qs + 32 * j, x[i].qh, j, q);
            float32x4_t l[4] = {zero4(), zero4(), zero4(), zero4()};
            float32x4_t h[4] = {zero4(), zero4(), zero4(), zero4()};
            fma16(l, q[0], y);
            fma16(l, q[1], y + 16);
            fma16(h, q[2], y + 32);
            fma16(h, q[3], y + 48);
            float32x4_t sl = add16(add16(zero4(), y), y + 16);
            float32x4_t sh = add16(add16(zero4(), y + 32), y + 48);
            acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(l[0], l[1]), vaddq_f32(l[2], l[3])), d * sc[2 * j]);
            acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(h[0], h[1]), vaddq_f32(h[2], h[3])), d * sc[2 * j + 1]);
            acc = vfmsq_f32(acc, sl, vdupq_n_f32(dmin * mn[2 * j]));
            acc = vfmsq_f32(acc, sh, vdupq_n_f32(dmin * mn[2 * j + 1]));
        }
    }
    *s = vaddvq_f32(acc);
}

/* ---------------------------------------------------------------- Q6_K -- */

static void to_float_q6_K(const void *src, float *dst, int64_t n) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        for (int h = 0; h < 2; h++, dst += 128) {
            int8x16_t q[8];
            q6k_codes(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            /* (d * sc) * q, the reference's association (ggml-quants.c
             * dequantize_row_q6_K: d * sc[is] * q). */
            for (int g = 0; g < 8; g++) store_mul16(dst + 16 * g, q[g], d * x[i].scales[8 * h + g]);
        }
    }
}

static void dot_q6_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const int8_t *a = y[i].qs + 128 * h;
            int8x16_t q[8];
            int32x4_t p[8];
            q6k_codes(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int g = 0; g < 8; g++) p[g] = vdotq_s32(vdupq_n_s32(0), q[g], vld1q_s8(a + 16 * g));
            /* Lane g of s0/s1 = the full sum of group g / g+4. */
            int32x4_t s0 = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
            int32x4_t s1 = vpaddq_s32(vpaddq_s32(p[4], p[5]), vpaddq_s32(p[6], p[7]));
            int16x8_t sc = vmovl_s8(vld1_s8(x[i].scales + 8 * h));
            acc = vmlaq_s32(acc, s0, vmovl_s16(vget_low_s16(sc)));
            acc = vmlaq_s32(acc, s1, vmovl_high_s16(sc));
        }
        sumf += (h2f(x[i].d) * y[i].d) * (float)vaddvq_s32(acc);
    }
    *s = sumf;
}

static void dot_q6_K_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            int8x16_t q[8];
            q6k_codes(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int g = 0; g < 8; g++) {
                float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
                fma16(b, q[g], y + 16 * g);
                acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])),
                                  d * x[i].scales[8 * h + g]);
            }
        }
    }
    *s = vaddvq_f32(acc);
}

/* -------------------------------------------------------------- IQ4_XS -- */

static void to_float_iq4_xs(const void *src, float *dst, int64_t n) {
    const block_iq4_xs *x = src;
    const int8x16_t kv = vld1q_s8(ds4_kvalues_iq4nl);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++, dst += 32) {
            const float dl = d * (float)(iq4xs_ls(&x[i], ib) - 32);
            uint8x16_t b = vld1q_u8(x[i].qs + 16 * ib);
            store_mul16(dst, vqtbl1q_s8(kv, vandq_u8(b, vdupq_n_u8(0x0F))), dl);
            store_mul16(dst + 16, vqtbl1q_s8(kv, vshrq_n_u8(b, 4)), dl);
        }
    }
}

static void dot_iq4_xs_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    const int8x16_t kv = vld1q_s8(ds4_kvalues_iq4nl);
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int8_t *a = y[i].qs + 32 * ib;
            uint8x16_t b = vld1q_u8(x[i].qs + 16 * ib);
            int32x4_t p = vdotq_s32(vdupq_n_s32(0), vqtbl1q_s8(kv, vandq_u8(b, vdupq_n_u8(0x0F))), vld1q_s8(a));
            p = vdotq_s32(p, vqtbl1q_s8(kv, vshrq_n_u8(b, 4)), vld1q_s8(a + 16));
            acc = vmlaq_n_s32(acc, p, iq4xs_ls(&x[i], ib) - 32);
        }
        sumf += (h2f(x[i].d) * y[i].d) * (float)vaddvq_s32(acc);
    }
    *s = sumf;
}

static void dot_iq4_xs_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const float *y = vy;
    const int8x16_t kv = vld1q_s8(ds4_kvalues_iq4nl);
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32) {
            float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
            uint8x16_t w = vld1q_u8(x[i].qs + 16 * ib);
            fma16(b, vqtbl1q_s8(kv, vandq_u8(w, vdupq_n_u8(0x0F))), y);
            fma16(b, vqtbl1q_s8(kv, vshrq_n_u8(w, 4)), y + 16);
            acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])),
                              d * (float)(iq4xs_ls(&x[i], ib) - 32));
        }
    }
    *s = vaddvq_f32(acc);
}

/* ------------------------------------------------------ Q4_64A / Q2_64A -- */
/* ds4-notes §2: x = q*scale + bias (bf16 scale/bias). With Q8_0 activations
 * (two blocks per 64 weights), each 32-half h contributes
 * scale*d_h*Σq·a + bias*d_h*Σa. */

static void to_float_q4_64a(const void *src, float *dst, int64_t n) {
    const block_q4_64a *x = src;
    for (int64_t i = 0; i < n / QK64A; i++, dst += 64) {
        const float sc = bf2f(x[i].scale), bi = bf2f(x[i].bias);
        for (int h = 0; h < 2; h++) {
            int8x16_t c[2];
            q4a_codes(x[i].qs + 16 * h, c);
            store_affine16(dst + 32 * h, c[0], sc, bi);
            store_affine16(dst + 32 * h + 16, c[1], sc, bi);
        }
    }
}

/* Lane sums stay in vectors (scaled part and bias part in two accumulators),
 * so there is no horizontal add per half; one at the end. */
static void dot_q4_64a_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_64a *x = vx;
    const block_q8_0 *y = vy;
    const int8x16_t one = vdupq_n_s8(1);
    float32x4_t accq = zero4(), accb = zero4();
    for (int64_t i = 0; i < n / QK64A; i++) {
        const float sc = bf2f(x[i].scale), bi = bf2f(x[i].bias);
        for (int h = 0; h < 2; h++) {
            const block_q8_0 *a = &y[2 * i + h];
            const int8x16_t a0 = vld1q_s8(a->qs), a1 = vld1q_s8(a->qs + 16);
            int8x16_t c[2];
            q4a_codes(x[i].qs + 16 * h, c);
            const int32x4_t p = vdotq_s32(vdotq_s32(vdupq_n_s32(0), c[0], a0), c[1], a1);
            const int32x4_t sa = vdotq_s32(vdotq_s32(vdupq_n_s32(0), one, a0), one, a1);
            const float da = h2f(a->d);
            accq = vfmaq_n_f32(accq, vcvtq_f32_s32(p), sc * da);
            accb = vfmaq_n_f32(accb, vcvtq_f32_s32(sa), bi * da);
        }
    }
    *s = vaddvq_f32(vaddq_f32(accq, accb));
}

static void dot_q4_64a_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_64a *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK64A; i++, y += 64) {
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        float32x4_t sa = zero4();
        for (int h = 0; h < 2; h++) {
            int8x16_t c[2];
            q4a_codes(x[i].qs + 16 * h, c);
            fma16(b, c[0], y + 32 * h);
            fma16(b, c[1], y + 32 * h + 16);
            sa = add16(add16(sa, y + 32 * h), y + 32 * h + 16);
        }
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), bf2f(x[i].scale));
        acc = vfmaq_n_f32(acc, sa, bf2f(x[i].bias));
    }
    *s = vaddvq_f32(acc);
}

static void to_float_q2_64a(const void *src, float *dst, int64_t n) {
    const block_q2_64a *x = src;
    for (int64_t i = 0; i < n / QK64A; i++, dst += 64) {
        const float sc = bf2f(x[i].scale), bi = bf2f(x[i].bias);
        int8x16_t c[4];
        q2a_codes(x[i].qs, c);
        for (int g = 0; g < 4; g++) store_affine16(dst + 16 * g, c[g], sc, bi);
    }
}

static void dot_q2_64a_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q2_64a *x = vx;
    const block_q8_0 *y = vy;
    const int8x16_t one = vdupq_n_s8(1);
    float32x4_t accq = zero4(), accb = zero4();
    for (int64_t i = 0; i < n / QK64A; i++) {
        const float sc = bf2f(x[i].scale), bi = bf2f(x[i].bias);
        int8x16_t c[4];
        q2a_codes(x[i].qs, c);
        for (int h = 0; h < 2; h++) {
            const block_q8_0 *a = &y[2 * i + h];
            const int8x16_t a0 = vld1q_s8(a->qs), a1 = vld1q_s8(a->qs + 16);
            const int32x4_t p = vdotq_s32(vdotq_s32(vdupq_n_s32(0), c[2 * h], a0), c[2 * h + 1], a1);
            const int32x4_t sa = vdotq_s32(vdotq_s32(vdupq_n_s32(0), one, a0), one, a1);
            const float da = h2f(a->d);
            accq = vfmaq_n_f32(accq, vcvtq_f32_s32(p), sc * da);
            accb = vfmaq_n_f32(accb, vcvtq_f32_s32(sa), bi * da);
        }
    }
    *s = vaddvq_f32(vaddq_f32(accq, accb));
}

static void dot_q2_64a_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q2_64a *x = vx;
    const float *y = vy;
    float32x4_t acc = zero4();
    for (int64_t i = 0; i < n / QK64A; i++, y += 64) {
        float32x4_t b[4] = {zero4(), zero4(), zero4(), zero4()};
        float32x4_t sa = zero4();
        int8x16_t c[4];
        q2a_codes(x[i].qs, c);
        for (int g = 0; g < 4; g++) {
            fma16(b, c[g], y + 16 * g);
            sa = add16(sa, y + 16 * g);
        }
        acc = vfmaq_n_f32(acc, vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])), bf2f(x[i].scale));
        acc = vfmaq_n_f32(acc, sa, bf2f(x[i].bias));
    }
    *s = vaddvq_f32(acc);
}

/* ---------------------------------------------------------------- init -- */

int ds4_kernels_init_neon(ds4_kernel_set *k) {
#define SET(T, TF, VD, VF) \
    do { k->to_float[T] = TF; k->vec_dot[T] = VD; k->vec_dot_f32[T] = VF; } while (0)
    SET(DS4_TYPE_F32, to_float_f32, dot_f32_f32, dot_f32_f32);
    SET(DS4_TYPE_F16, to_float_f16, dot_f16_f16, dot_f16_f32);
    SET(DS4_TYPE_BF16, to_float_bf16, dot_bf16_bf16, dot_bf16_f32);
    SET(DS4_TYPE_Q8_0, to_float_q8_0, dot_q8_0_q8_0, dot_q8_0_f32);
    SET(DS4_TYPE_Q4_0, to_float_q4_0, dot_q4_0_q8_0, dot_q4_0_f32);
    SET(DS4_TYPE_Q4_1, to_float_q4_1, dot_q4_1_q8_1, dot_q4_1_f32);
    SET(DS4_TYPE_Q5_0, to_float_q5_0, dot_q5_0_q8_0, dot_q5_0_f32);
    SET(DS4_TYPE_Q5_1, to_float_q5_1, dot_q5_1_q8_1, dot_q5_1_f32);
    SET(DS4_TYPE_Q4_K, to_float_q4_K, dot_q4_K_q8_K, dot_q4_K_f32);
    SET(DS4_TYPE_Q5_K, to_float_q5_K, dot_q5_K_q8_K, dot_q5_K_f32);
    SET(DS4_TYPE_Q6_K, to_float_q6_K, dot_q6_K_q8_K, dot_q6_K_f32);
    SET(DS4_TYPE_IQ4_NL, to_float_iq4_nl, dot_iq4_nl_q8_0, dot_iq4_nl_f32);
    SET(DS4_TYPE_IQ4_XS, to_float_iq4_xs, dot_iq4_xs_q8_K, dot_iq4_xs_f32);
    SET(DS4_TYPE_Q4_64A, to_float_q4_64a, dot_q4_64a_q8_0, dot_q4_64a_f32);
    SET(DS4_TYPE_Q2_64A, to_float_q2_64a, dot_q2_64a_q8_0, dot_q2_64a_f32);
#undef SET
    k->from_float[DS4_TYPE_Q8_0] = from_float_q8_0;
    k->from_float[DS4_TYPE_Q8_1] = from_float_q8_1;
    k->from_float[DS4_TYPE_Q8_K] = from_float_q8_K;
    return 1;
}

#else /* not arm64 with dotprod: the dispatcher keeps NEON unavailable */

int ds4_kernels_init_neon(ds4_kernel_set *k) {
    (void)k;
    return 0;
}

#endif
