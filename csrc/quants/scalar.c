/*
 * scalar.c — the reference kernels: portable C, one element at a time.
 *
 * Everything else is measured against this file, so it favours being exactly
 * specified over being fast:
 *  - Dequantization equals ggml's dequantize_row_* (ggml-quants.c) bit for
 *    bit. Each formula keeps ggml's operation order (e.g. Q4_K computes
 *    d*sc once per sub-block, then (d*sc)*q - dmin*m), and the core is built
 *    with -ffp-contract=off so no FMA can change a rounding.
 *  - Activation quantizers emulate llama.cpp's x86-64 AVX2 build float op for
 *    float (see quantize_q8_0 below), so a row quantized here is the row
 *    llama.cpp's CPU backend would have fed its dot products.
 *  - Paired dots follow ggml-cpu's generic (non-SIMD) vec_dot kernels
 *    (ggml-cpu/quants.c *_generic, vec.cpp scalar path): exact integer sums
 *    per block, then float accumulation in block order. They are not bit-equal
 *    to llama.cpp's AVX2 kernels (which reassociate), only close.
 *  - Every reduction has one fixed order that depends on nothing but n: no
 *    threads, no heap, at most one block of stack scratch.
 *
 * Pointers to blocks must be aligned like the block structs (2 bytes, 4 for
 * Q8_K), as GGUF tensor data and numpy buffers are.
 */
#include "quants.h"
#include "../error.h"

#include <math.h>
#include <stddef.h>

/* ggml-common.h, kvalues_iq4nl. */
const int8_t ds4_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1, 13, 25, 38, 53, 69, 89, 113};

/* ------------------------------------------------ scalar conversions -- */

/* fp16 -> f32 by bit manipulation, exact for every input. NaN: the payload
 * is kept and the quiet bit is forced, which is what F16C's vcvtph2ps (and so
 * llama.cpp's x86 build, which converts through it) does to a signaling NaN;
 * a SIMD kernel using vcvtph2ps then agrees with this bit for bit. numpy's
 * float16->float32 differs only there (it keeps signaling NaNs signaling). */
float ds4_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u);
    } else if (e != 0) {
        bits = sign | ((e + 112u) << 23) | (m << 13); /* rebias 15 -> 127 */
    } else if (m == 0) {
        bits = sign;
    } else {
        /* Subnormal m*2^-24: normalise so the leading 1 sits at bit 10. */
        uint32_t e32 = 113;  /* exponent field of 2^-14, the fp16 min normal */
        while (!(m & 0x400u)) { m <<= 1; e32--; }
        bits = sign | (e32 << 23) | ((m & 0x3ffu) << 13);
    }
    return ds4_f32_from_bits(bits);
}

void ds4_pack_q8_pairs(const void *src, void *dst, int64_t n, uint8_t bias) {
    const block_q8_0 *b = src;
    const int64_t nb = n / QK8_0;
    uint8_t *o = dst;
    for (int64_t i = 0; i < nb; i += 2, o += 128) {
        const int two = i + 1 < nb;
        float d[16];
        for (int l = 0; l < 8; l++) d[l] = ds4_fp16_to_f32(b[i].d);
        for (int l = 8; l < 16; l++) d[l] = two ? ds4_fp16_to_f32(b[i + 1].d) : 0.0f;
        for (int l = 0; l < 32; l++) o[l] = (uint8_t)(b[i].qs[l] + bias);
        for (int l = 0; l < 32; l++) o[32 + l] = two ? (uint8_t)(b[i + 1].qs[l] + bias) : bias;
        memcpy(o + 64, d, 64);
    }
}

/* f32 -> fp16, round to nearest even, by integer arithmetic (so independent
 * of the FPU rounding mode). Matches F16C vcvtps2ph with imm 0, which is what
 * ggml's x86 build uses (GGML_CPU_FP32_TO_FP16 -> _cvtss_sh(x, 0)): overflow
 * rounds to Inf, subnormals are exact RNE, NaN becomes a quiet NaN keeping the
 * top 9 payload bits and the sign. */
uint16_t ds4_f32_to_fp16(float f) {
    uint32_t u = ds4_bits_from_f32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)  /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 (halfway past 65504, odd mantissa) -> Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* >= 2^-14: normal result */
        a -= 0x38000000u;   /* rebias 127 -> 15 */
        a += 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | (a >> 13));
    }
    if (a <= 0x33000000u) /* <= 2^-25: rounds to zero (the tie goes to even 0) */
        return sign;
    /* Subnormal result: value = mant * 2^(e-150), in units of 2^-24 that is
     * mant >> (126 - e); 14 <= shift <= 24 here. */
    uint32_t e = a >> 23;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);  /* q == 0x400 is correctly the min normal */
}

/* ggml-impl.h ggml_compute_fp32_to_bf16: RNE; a NaN keeps its top bits and
 * gets bit 6 (the bf16 quiet bit) set. */
uint16_t ds4_f32_to_bf16(float f) {
    uint32_t u = ds4_bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

#define FP16(x) ds4_fp16_to_f32(x)
#define BF16(x) ds4_bf16_to_f32(x)

/* Round half to even without depending on the FPU rounding mode (floorf is
 * exact); |x| >= 2^23 is already an integer. NaN stays NaN. */
static float round_even(float x) {
    if (!(fabsf(x) < 8388608.0f)) return x;
    float r = floorf(x);
    float frac = x - r;  /* exact: both below 2^23 */
    if (frac > 0.5f || (frac == 0.5f && fmodf(r, 2.0f) != 0.0f)) r += 1.0f;
    return r;
}

/* x86 cvtps2dq / cvttss2si: a float that is NaN or outside int32 yields the
 * "integer indefinite" 0x80000000. x is already integral here. */
static int32_t cvt_i32_x86(float x) {
    if (!(x >= -2147483648.0f && x < 2147483648.0f)) return INT32_MIN;
    return (int32_t)x;
}

static int8_t sat_i8(int32_t v) {  /* packssdw + packsswb */
    return (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
}

/* ------------------------------------------------------ dequantization -- */

static void deq_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void deq_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = FP16(x[i]);
}

static void deq_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = BF16(x[i]);
}

static void deq_q4_0(const void *src, float *y, int64_t n) {
    const block_q4_0 *x = src;
    for (int64_t i = 0; i < n / QK4_0; i++, y += QK4_0) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const void *src, float *y, int64_t n) {
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < n / QK4_1; i++, y += QK4_1) {
        const float d = FP16(x[i].d), m = FP16(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* Q5: bit j of qh is the 5th bit of weight j (0..31). */
static void deq_q5_0(const void *src, float *y, int64_t n) {
    const block_q5_0 *x = src;
    for (int64_t i = 0; i < n / QK5_0; i++, y += QK5_0) {
        const float d = FP16(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_0 / 2; j++) {
            int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = (((x[i].qs[j] & 0x0F) | (h0 << 4)) - 16) * d;
            y[j + QK5_0 / 2] = (((x[i].qs[j] >> 4) | (h1 << 4)) - 16) * d;
        }
    }
}

static void deq_q5_1(const void *src, float *y, int64_t n) {
    const block_q5_1 *x = src;
    for (int64_t i = 0; i < n / QK5_1; i++, y += QK5_1) {
        const float d = FP16(x[i].d), m = FP16(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_1 / 2; j++) {
            int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = ((x[i].qs[j] & 0x0F) | (h0 << 4)) * d + m;
            y[j + QK5_1 / 2] = ((x[i].qs[j] >> 4) | (h1 << 4)) * d + m;
        }
    }
}

static void deq_q8_0(const void *src, float *y, int64_t n) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < n / QK8_0; i++, y += QK8_0) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = x[i].qs[j] * d;
    }
}

/* Q8_1 is an activation type (ggml has no dequantizer for it); d*q, the
 * stored s = d*sum(q) is redundant for values. */
static void deq_q8_1(const void *src, float *y, int64_t n) {
    const block_q8_1 *x = src;
    for (int64_t i = 0; i < n / QK8_1; i++, y += QK8_1) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = x[i].qs[j] * d;
    }
}

static void deq_q8_K(const void *src, float *y, int64_t n) {
    const block_q8_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = x[i].d * x[i].qs[j];
}

/* ggml-quants.c get_scale_min_k4: the 12 scale bytes hold eight 6-bit scales
 * and eight 6-bit mins; sub-blocks 4..7 keep their top 2 bits in the top bits
 * of bytes 0..7. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void deq_q4_K(const void *src, float *y, int64_t n) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = FP16(x[i].d), dmin = FP16(x[i].dmin);
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
            int sc, m;
            scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void deq_q5_K(const void *src, float *y, int64_t n) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = FP16(x[i].d), dmin = FP16(x[i].dmin);
        unsigned u1 = 1, u2 = 2;  /* qh bit of the low / high nibble half */
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            int sc, m;
            scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* Q6_K: 128-weight halves; weight l (+32, +64, +96) takes the low/high
 * nibble of ql[l] or ql[l+32] and a 2-bit field of qh[l]. */
static void q6_K_codes(const block_q6_K *b, int8_t *a) {
    const uint8_t *ql = b->ql, *qh = b->qh;
    for (int h = 0; h < QK_K; h += 128, a += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            a[l + 0] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            a[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            a[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            a[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

static void deq_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *x = src;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = FP16(x[i].d);
        q6_K_codes(&x[i], q);
        /* ggml: d * sc * q, i.e. (d*sc)*q; the scale of weight j is sc[j/16]. */
        for (int j = 0; j < QK_K; j++) y[j] = d * x[i].scales[j / 16] * q[j];
    }
}

static void deq_iq4_nl(const void *src, float *y, int64_t n) {
    const block_iq4_nl *x = src;
    for (int64_t i = 0; i < n / QK4_NL; i++, y += QK4_NL) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            y[j] = d * ds4_kvalues_iq4nl[x[i].qs[j] & 0xF];
            y[j + QK4_NL / 2] = d * ds4_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

/* IQ4_XS sub-block ib (0..7) scale: 4 low bits in scales_l, 2 high bits in
 * scales_h, biased by 32. */
static int iq4_xs_scale(const block_iq4_xs *b, int ib) {
    return (((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
            (((b->scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

static void deq_iq4_xs(const void *src, float *y, int64_t n) {
    const block_iq4_xs *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *qs = x[i].qs;
        const float d = FP16(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32, qs += 16) {
            const float dl = d * iq4_xs_scale(&x[i], ib);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * ds4_kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * ds4_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* ds4's affine types (ds4-notes §2): x = q*scale + bias, scale and bias bf16.
 * Q4_64A code j: byte j/2, even j in the LOW nibble (not Q4_0's split
 * halves). Q2_64A code j: byte j/4, bits 2*(j%4). */
static inline int q4_64a_code(const block_q4_64a *b, int j) {
    return (b->qs[j >> 1] >> ((j & 1) * 4)) & 0xF;
}
static inline int q2_64a_code(const block_q2_64a *b, int j) {
    return (b->qs[j >> 2] >> ((j & 3) * 2)) & 3;
}

static void deq_q4_64a(const void *src, float *y, int64_t n) {
    const block_q4_64a *x = src;
    for (int64_t i = 0; i < n / QK64A; i++, y += QK64A) {
        const float s = BF16(x[i].scale), b = BF16(x[i].bias);
        for (int j = 0; j < QK64A; j++) y[j] = q4_64a_code(&x[i], j) * s + b;
    }
}

static void deq_q2_64a(const void *src, float *y, int64_t n) {
    const block_q2_64a *x = src;
    for (int64_t i = 0; i < n / QK64A; i++, y += QK64A) {
        const float s = BF16(x[i].scale), b = BF16(x[i].bias);
        for (int j = 0; j < QK64A; j++) y[j] = q2_64a_code(&x[i], j) * s + b;
    }
}

/* ------------------------------------------------------- quantization -- */

static void quant_f32(const float *x, void *dst, int64_t n) {
    memcpy(dst, x, (size_t)n * sizeof(float));
}

static void quant_f16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = ds4_f32_to_fp16(x[i]);
}

static void quant_bf16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = ds4_f32_to_bf16(x[i]);
}

/* maxps(a, b) returns b unless a > b (so a NaN in either operand yields b). */
static inline float maxps(float a, float b) { return a > b ? a : b; }

/* max|x| of a 32-float block exactly as llama.cpp's AVX2 quantize_row_q8_0 /
 * _q8_1 reduce it (ggml-cpu/arch/x86/quants.c): 4 vectors of 8 lanes folded
 * lane-wise, then 8 -> 4 -> 2 -> 1. Only the NaN cases depend on the order. */
static float amax32_avx2(const float *x) {
    float v[8], m4[4];
    for (int l = 0; l < 8; l++) {
        v[l] = fabsf(x[l]);
        for (int k = 1; k < 4; k++) v[l] = maxps(v[l], fabsf(x[8 * k + l]));
    }
    for (int l = 0; l < 4; l++) m4[l] = maxps(v[4 + l], v[l]);   /* extract hi vs lo */
    float m0 = maxps(m4[0], m4[2]), m1 = maxps(m4[1], m4[3]);    /* movehl */
    return maxps(m0, m1);                                        /* movehdup, max_ss */
}

/* One Q8_0/Q8_1 block the way llama.cpp's x86 AVX2 build quantizes it:
 * d = amax/127 (stored fp16 by F16C, RNE), id = 127/amax (0 when amax == 0),
 * q = cvtps_epi32(round_ps(x*id, nearest-even)) saturated to int8 by the pack
 * instructions. Returns the int32 sum of the unsaturated q (what AVX2 feeds
 * into Q8_1's s), with two's-complement wrap as the hardware adds. */
static int32_t quant_block_q8_avx2(const float *x, uint16_t *dh, int8_t *qs, float *dout) {
    const float amax = amax32_avx2(x);
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    uint32_t sum = 0;
    for (int j = 0; j < 32; j++) {
        int32_t q = cvt_i32_x86(round_even(x[j] * id));
        sum += (uint32_t)q;
        qs[j] = sat_i8(q);
    }
    *dh = ds4_f32_to_fp16(d);
    *dout = d;
    return (int32_t)sum;
}

static void quant_q8_0(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float d;
        quant_block_q8_avx2(x, &y[i].d, y[i].qs, &d);
    }
}

/* Q8_1: as Q8_0, plus s = fp16(d * sum(q)) with the f32 d (not the fp16 one),
 * as the AVX2 quantize_row_q8_1 computes it. */
static void quant_q8_1(const float *x, void *dst, int64_t n) {
    block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float d;
        int32_t sum = quant_block_q8_avx2(x, &y[i].d, y[i].qs, &d);
        y[i].s = ds4_f32_to_fp16(d * (float)sum);
    }
}

/* ggml-quants.c nearest_int: the 1.5*2^23 magic add (round to nearest even
 * for |f| <= 2^22), including its bit-extraction result for larger inputs. */
static inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* ggml-quants.c quantize_row_q8_K_ref (x86's quantize_row_q8_K calls it):
 * max = the first element of largest |x|, iscale = -127/max, q =
 * min(127, nearest_int(iscale*x)), d = 1/iscale, bsums = sums of 16. An
 * all-zero block stores d = 0 and zero codes; ggml leaves its bsums
 * unwritten, we zero them. */
static void quant_q8_K(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[j * 16 + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ds4's Q4_64A/Q2_64A quantizer (ds4-notes §2 "How codes are chosen"):
 * min/max of the 64 values, scale = (max-min)/maxq (0 when max == min),
 * bias = min, both stored as bf16 by TRUNCATION; codes are then computed
 * against the truncated values the reader will see, q = clamp(roundf((x -
 * bias)/scale), 0, maxq) with C's roundf (ties away from zero); a stored
 * scale of zero gives all-zero codes. NaN codes become 0 (no UB). */
static void quant_64a_block(const float *g, int maxq, uint16_t *scale_out,
                            uint16_t *bias_out, uint8_t *codes) {
    float mn = g[0], mx = g[0];
    for (int j = 1; j < QK64A; j++) {
        if (g[j] < mn) mn = g[j];
        if (g[j] > mx) mx = g[j];
    }
    const float scale = (mx == mn) ? 0.0f : (mx - mn) / (float)maxq;
    *scale_out = ds4_f32_to_bf16_trunc(scale);
    *bias_out = ds4_f32_to_bf16_trunc(mn);
    const float s = BF16(*scale_out), b = BF16(*bias_out);
    for (int j = 0; j < QK64A; j++) {
        int q = 0;
        if (s != 0.0f) {
            float r = roundf((g[j] - b) / s);
            q = r > (float)maxq ? maxq : (r >= 0.0f ? (int)r : 0);
        }
        codes[j] = (uint8_t)q;
    }
}

static void quant_q4_64a(const float *x, void *dst, int64_t n) {
    block_q4_64a *y = dst;
    uint8_t c[QK64A];
    for (int64_t i = 0; i < n / QK64A; i++, x += QK64A) {
        quant_64a_block(x, 15, &y[i].scale, &y[i].bias, c);
        for (int j = 0; j < QK64A / 2; j++)
            y[i].qs[j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
    }
}

static void quant_q2_64a(const float *x, void *dst, int64_t n) {
    block_q2_64a *y = dst;
    uint8_t c[QK64A];
    for (int64_t i = 0; i < n / QK64A; i++, x += QK64A) {
        quant_64a_block(x, 3, &y[i].scale, &y[i].bias, c);
        for (int j = 0; j < QK64A / 4; j++)
            y[i].qs[j] = (uint8_t)(c[4 * j] | (c[4 * j + 1] << 2) | (c[4 * j + 2] << 4) |
                                   (c[4 * j + 3] << 6));
    }
}

/* ggml-quants.c quantize_row_q8_0_ref: d = amax/127, id = 1/d (0 if d == 0),
 * q = roundf(x*id) (ties away from zero). ggml's MAX macro lets a NaN through
 * only when it is the last compared; kept as is. The float -> int8 store is
 * what x86 compilers emit (cvttss2si, then the low byte): defined here for
 * the NaN/overflow inputs that are UB in ggml's C. */
static void quant_q8_0_ref(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            float v = fabsf(x[j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = ds4_f32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++)
            y[i].qs[j] = (int8_t)(uint8_t)(uint32_t)cvt_i32_x86(roundf(x[j] * id));
    }
}

int ds4_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n, ds4_error *err) {
    if (n < 0 || n % QK8_0 != 0)
        return ds4_fail(err, DS4_ERR_BAD_ROW,
                        "row length %lld is not a multiple of Q8_0's block size %d",
                        (long long)n, QK8_0);
    if (n && (!src || !dst))
        return ds4_fail(err, DS4_ERR_ARG, "NULL src or dst for a row of %lld floats",
                        (long long)n);
    quant_q8_0_ref(src, dst, n);
    return ds4_ok(err);
}

/* ---------------------------------------------------------- paired dots -- */
/* x: weight blocks, y: activation blocks of the paired type. Each follows
 * the matching ggml-cpu/quants.c *_generic kernel's structure and float
 * expression order (kept with -ffp-contract=off). */

/* F32/F16/BF16 with the same type: ggml's scalar path (vec.cpp,
 * ggml_vec_dot_f32/_f16/_bf16 without GGML_SIMD): each product rounded to
 * float (exact for f16*f16 and bf16*bf16 short of over/underflow), summed in
 * double in index order, the total rounded to float once. */
static void dot_f32_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

static void dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(FP16(x[i]) * FP16(y[i]));
    *s = (float)sum;
}

static void dot_bf16_bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(BF16(x[i]) * BF16(y[i]));
    *s = (float)sum;
}

static void dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            sumi0 += ((x[ib].qs[j] & 0x0F) - 8) * y[ib].qs[j];
            sumi1 += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK8_0 / 2];
        }
        int sumi = sumi0 + sumi1;
        sumf += sumi * FP16(x[ib].d) * FP16(y[ib].d);
    }
    *s = sumf;
}

static void dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK8_1; ib++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            sumi0 += (x[ib].qs[j] & 0x0F) * y[ib].qs[j];
            sumi1 += (x[ib].qs[j] >> 4) * y[ib].qs[j + QK8_1 / 2];
        }
        int sumi = sumi0 + sumi1;
        /* The min term uses the activation's stored s = fp16(d*sum(q)). */
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * sumi + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

static void dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, 4);
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            int x0 = ((x[ib].qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
            int x1 = ((x[ib].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            sumi0 += x0 * y[ib].qs[j];
            sumi1 += x1 * y[ib].qs[j + QK8_0 / 2];
        }
        int sumi = sumi0 + sumi1;
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * sumi;
    }
    *s = sumf;
}

static void dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK8_1; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, 4);
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            int x0 = (x[ib].qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
            int x1 = (x[ib].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            sumi0 += x0 * y[ib].qs[j];
            sumi1 += x1 * y[ib].qs[j + QK8_1 / 2];
        }
        int sumi = sumi0 + sumi1;
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * sumi + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

static void dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx, *y = vy;
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf += sumi * (FP16(x[ib].d) * FP16(y[ib].d));
    }
    *s = sumf;
}

static void dot_iq4_nl_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK4_NL; ib++) {
        const float d = FP16(y[ib].d) * FP16(x[ib].d);
        int sumi1 = 0, sumi2 = 0;
        for (int j = 0; j < QK4_NL / 2; j++) {
            sumi1 += y[ib].qs[j] * ds4_kvalues_iq4nl[x[ib].qs[j] & 0xF];
            sumi2 += y[ib].qs[j + QK4_NL / 2] * ds4_kvalues_iq4nl[x[ib].qs[j] >> 4];
        }
        sumf += d * (sumi1 + sumi2);
    }
    *s = sumf;
}

/* K-quants (ggml's *_q8_K_generic): integer products gathered into 8 lanes
 * (lane l takes weights j with j % 8 == l) scaled by the sub-block scale;
 * per super-block, lanes are added to 8 float sums as d*lane; the min term
 * -dmin*sum(bsums*min) goes straight into sumf; the 8 float sums are added to
 * sumf in lane order at the very end. */
static void dot_kquant_lanes(const int8_t *a, const int8_t *q8, const int *scale_of_16,
                             int32_t lanes[8]) {
    memset(lanes, 0, 8 * sizeof(int32_t));
    for (int j = 0; j < QK_K; j += 8) {
        const int sc = scale_of_16[j / 16];
        for (int l = 0; l < 8; l++) lanes[l] += sc * (int16_t)(q8[j + l] * a[j + l]);
    }
}

static void dot_q4_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sums[8] = {0}, sumf = 0;
    int8_t a[QK_K];
    int sc16[QK_K / 16], sc[8], mn[8];
    int32_t lanes[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                a[64 * j + l] = (int8_t)(x[i].qs[32 * j + l] & 0xF);
                a[64 * j + 32 + l] = (int8_t)(x[i].qs[32 * j + l] >> 4);
            }
        for (int j = 0; j < 8; j++) scale_min_k4(j, x[i].scales, &sc[j], &mn[j]);
        for (int j = 0; j < QK_K / 16; j++) sc16[j] = sc[j / 2];
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) sumi += y[i].bsums[j] * mn[j / 2];
        dot_kquant_lanes(a, y[i].qs, sc16, lanes);
        const float d = FP16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * lanes[l];
        const float dmin = FP16(x[i].dmin) * y[i].d;
        sumf -= dmin * sumi;
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

static void dot_q5_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sums[8] = {0}, sumf = 0;
    int8_t a[QK_K];
    int sc16[QK_K / 16], sc[8], mn[8];
    int32_t lanes[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *qh = x[i].qh;
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                a[64 * j + l] = (int8_t)((x[i].qs[32 * j + l] & 0xF) +
                                         (qh[l] & (1u << (2 * j)) ? 16 : 0));
                a[64 * j + 32 + l] = (int8_t)((x[i].qs[32 * j + l] >> 4) +
                                              (qh[l] & (2u << (2 * j)) ? 16 : 0));
            }
        for (int j = 0; j < 8; j++) scale_min_k4(j, x[i].scales, &sc[j], &mn[j]);
        for (int j = 0; j < QK_K / 16; j++) sc16[j] = sc[j / 2];
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) sumi += y[i].bsums[j] * mn[j / 2];
        dot_kquant_lanes(a, y[i].qs, sc16, lanes);
        const float d = FP16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * lanes[l];
        const float dmin = FP16(x[i].dmin) * y[i].d;
        sumf -= dmin * sumi;
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

static void dot_q6_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sums[8] = {0}, sumf = 0;
    int8_t a[QK_K];
    int sc16[QK_K / 16];
    int32_t lanes[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        q6_K_codes(&x[i], a);
        for (int j = 0; j < QK_K / 16; j++) sc16[j] = x[i].scales[j];
        dot_kquant_lanes(a, y[i].qs, sc16, lanes);
        const float d = FP16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * lanes[l];
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

static void dot_iq4_xs_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d4d8 = FP16(x[i].d) * y[i].d;
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 16, q8 += 32) {
            const float dl = d4d8 * iq4_xs_scale(&x[i], ib);
            int sumi1 = 0, sumi2 = 0;
            for (int j = 0; j < 16; j++) {
                sumi1 += q8[j] * ds4_kvalues_iq4nl[qs[j] & 0xF];
                sumi2 += q8[j + 16] * ds4_kvalues_iq4nl[qs[j] >> 4];
            }
            sumf += dl * (sumi1 + sumi2);
        }
    }
    *s = sumf;
}

/* Q4_64A/Q2_64A x Q8_0 (ds4's choice; ggml has no such kernel). Each 64-wide
 * weight block meets two Q8_0 blocks, one per 32-weight half h. With
 * integer sums SQA = sum_j q_j*a_j and SA = sum_j a_j over the half (exact)
 * and d = the Q8_0 block's fp16 scale, the half adds, in float:
 *     sumf += scale * (d * SQA) + bias * (d * SA)
 * evaluated left to right as written (= sum_j (q_j*scale + bias) * d*a_j in
 * exact arithmetic). Halves are accumulated in order into one float. */
static void dot_q4_64a_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_64a *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK64A; i++) {
        const float sc = BF16(x[i].scale), bi = BF16(x[i].bias);
        for (int h = 0; h < 2; h++) {
            const block_q8_0 *yb = &y[2 * i + h];
            int sqa = 0, sa = 0;
            for (int j = 0; j < 32; j++) {
                sqa += q4_64a_code(&x[i], 32 * h + j) * yb->qs[j];
                sa += yb->qs[j];
            }
            const float d = FP16(yb->d);
            sumf += sc * (d * (float)sqa) + bi * (d * (float)sa);
        }
    }
    *s = sumf;
}

static void dot_q2_64a_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q2_64a *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK64A; i++) {
        const float sc = BF16(x[i].scale), bi = BF16(x[i].bias);
        for (int h = 0; h < 2; h++) {
            const block_q8_0 *yb = &y[2 * i + h];
            int sqa = 0, sa = 0;
            for (int j = 0; j < 32; j++) {
                sqa += q2_64a_code(&x[i], 32 * h + j) * yb->qs[j];
                sa += yb->qs[j];
            }
            const float d = FP16(yb->d);
            sumf += sc * (d * (float)sqa) + bi * (d * (float)sa);
        }
    }
    *s = sumf;
}

/* --------------------------------------------------------- f32 dots -- */
/* Weight row x f32 activations, for every weight type. Order (fixed, so a
 * SIMD variant can stay close): the weights of one block are dequantized
 * exactly as to_float does into stack scratch; the block's partial is the
 * float sum of the float products w_j*a_j in index order; block partials
 * are added in block order into a double; the total is rounded to float.
 * Block-1 types (F16, BF16) use ggml's scalar rule instead: every float
 * product added straight into the double, as F32 x F32 does. */

static void dot_f16_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(FP16(x[i]) * y[i]);
    *s = (float)sum;
}

static void dot_bf16_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(BF16(x[i]) * y[i]);
    *s = (float)sum;
}

static inline void dot_blocks_f32(int64_t n, float *s, const void *vx, const float *y,
                                  ds4_to_float_fn deq, int bs, size_t ts) {
    float w[QK_K];
    const uint8_t *x = vx;
    double total = 0.0;
    for (int64_t i = 0; i < n / bs; i++, x += ts, y += bs) {
        deq(x, w, bs);
        float part = 0.0f;
        for (int j = 0; j < bs; j++) part += w[j] * y[j];
        total += (double)part;
    }
    *s = (float)total;
}

#define DOT_F32(name, deq, bs, blk)                                                    \
    static void name(int64_t n, float *s, const void *vx, const void *vy) {             \
        dot_blocks_f32(n, s, vx, vy, deq, bs, sizeof(blk));                             \
    }
DOT_F32(dot_q4_0_f32, deq_q4_0, QK4_0, block_q4_0)
DOT_F32(dot_q4_1_f32, deq_q4_1, QK4_1, block_q4_1)
DOT_F32(dot_q5_0_f32, deq_q5_0, QK5_0, block_q5_0)
DOT_F32(dot_q5_1_f32, deq_q5_1, QK5_1, block_q5_1)
DOT_F32(dot_q8_0_f32, deq_q8_0, QK8_0, block_q8_0)
DOT_F32(dot_q4_K_f32, deq_q4_K, QK_K, block_q4_K)
DOT_F32(dot_q5_K_f32, deq_q5_K, QK_K, block_q5_K)
DOT_F32(dot_q6_K_f32, deq_q6_K, QK_K, block_q6_K)
DOT_F32(dot_iq4_nl_f32, deq_iq4_nl, QK4_NL, block_iq4_nl)
DOT_F32(dot_iq4_xs_f32, deq_iq4_xs, QK_K, block_iq4_xs)
DOT_F32(dot_q4_64a_f32, deq_q4_64a, QK64A, block_q4_64a)
DOT_F32(dot_q2_64a_f32, deq_q2_64a, QK64A, block_q2_64a)

/* ------------------------------------------------------------- the set -- */

void ds4_kernels_init_scalar(ds4_kernel_set *k) {
    memset(k, 0, sizeof *k);
#define DEQ(t, f) k->to_float[DS4_TYPE_##t] = f
    DEQ(F32, deq_f32); DEQ(F16, deq_f16); DEQ(BF16, deq_bf16);
    DEQ(Q4_0, deq_q4_0); DEQ(Q4_1, deq_q4_1); DEQ(Q5_0, deq_q5_0); DEQ(Q5_1, deq_q5_1);
    DEQ(Q8_0, deq_q8_0); DEQ(Q8_1, deq_q8_1); DEQ(Q8_K, deq_q8_K);
    DEQ(Q4_K, deq_q4_K); DEQ(Q5_K, deq_q5_K); DEQ(Q6_K, deq_q6_K);
    DEQ(IQ4_NL, deq_iq4_nl); DEQ(IQ4_XS, deq_iq4_xs);
    DEQ(Q4_64A, deq_q4_64a); DEQ(Q2_64A, deq_q2_64a);
#undef DEQ
#define QUANT(t, f) k->from_float[DS4_TYPE_##t] = f
    QUANT(F32, quant_f32); QUANT(F16, quant_f16); QUANT(BF16, quant_bf16);
    QUANT(Q8_0, quant_q8_0); QUANT(Q8_1, quant_q8_1); QUANT(Q8_K, quant_q8_K);
    QUANT(Q4_64A, quant_q4_64a); QUANT(Q2_64A, quant_q2_64a);
#undef QUANT
#define DOT(t, paired, f32) \
    (k->vec_dot[DS4_TYPE_##t] = paired, k->vec_dot_f32[DS4_TYPE_##t] = f32)
    /* F32 pairs with itself; ds4_vec_dot sends F32 activations to
     * vec_dot_f32, so both slots hold the same kernel. */
    DOT(F32, dot_f32_f32, dot_f32_f32);
    DOT(F16, dot_f16_f16, dot_f16_f32);
    DOT(BF16, dot_bf16_bf16, dot_bf16_f32);
    DOT(Q4_0, dot_q4_0_q8_0, dot_q4_0_f32);
    DOT(Q4_1, dot_q4_1_q8_1, dot_q4_1_f32);
    DOT(Q5_0, dot_q5_0_q8_0, dot_q5_0_f32);
    DOT(Q5_1, dot_q5_1_q8_1, dot_q5_1_f32);
    DOT(Q8_0, dot_q8_0_q8_0, dot_q8_0_f32);
    DOT(Q4_K, dot_q4_K_q8_K, dot_q4_K_f32);
    DOT(Q5_K, dot_q5_K_q8_K, dot_q5_K_f32);
    DOT(Q6_K, dot_q6_K_q8_K, dot_q6_K_f32);
    DOT(IQ4_NL, dot_iq4_nl_q8_0, dot_iq4_nl_f32);
    DOT(IQ4_XS, dot_iq4_xs_q8_K, dot_iq4_xs_f32);
    DOT(Q4_64A, dot_q4_64a_q8_0, dot_q4_64a_f32);
    DOT(Q2_64A, dot_q2_64a_q8_0, dot_q2_64a_f32);
#undef DOT
}
