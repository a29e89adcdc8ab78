/*
 * quantize_weights.c — weight quantizers that write the bytes llama.cpp
 * writes (ds4_quantize_weights).
 *
 * Target: ggml_quantize_chunk(type, ..., imatrix = NULL) of llama.cpp's
 * ggml-base (ggml.c -> ggml-quants.c quantize_<type>), which for every type
 * here runs the per-block reference quantizer: quantize_row_q4_0_ref ...
 * quantize_row_q6_K_ref, and quantize_iq4_nl / quantize_iq4_xs with ntry = 7.
 * Byte identity needs the same float expressions in the same order, so:
 *  - every expression below keeps ggml's operand order and intermediate
 *    roundings (a*b*c is (a*b)*c; an int meets a float as a float), and the
 *    core is built with -ffp-contract=off. ggml-base itself is plain SSE2 on
 *    x86-64 (its CMake gives -mfma/-mavx2 to ggml-cpu only; libggml-base.so
 *    holds no FMA or AVX instruction), so neither side fuses anything;
 *  - rounding goes through the same 1.5*2^23 trick (nearest_int), and C's
 *    float -> small-int casts are pinned to what x86-64 GCC emitted there
 *    (truncate to int32, "integer indefinite" for NaN/out of range, keep the
 *    low byte), so even the inputs that are undefined behaviour in ggml's C
 *    (Inf, NaN, 1/d overflowing) come out the same;
 *  - fp16 fields use ggml-base's software conversion (no F16C there): round
 *    to nearest even like ds4_f32_to_fp16 for every non-NaN float (checked
 *    over all 2^32 inputs), NaN -> sign | 0x7e00; a scale that only the
 *    arithmetic can make NaN gets x86's NaN sign (fp16_made_scale), so the
 *    output is the same on arm64 (checked under qemu-aarch64).
 * Not matched: NaN inputs with a non-zero payload (x86 passes the payload of
 * the first NaN operand along, and ggml's build puts the two operands of one
 * addition in different orders for different elements of a block, so the
 * code such a NaN gets in Q4_K/Q5_K is an accident of register allocation).
 * Payload-free NaNs (either sign) and +-Inf are matched.
 * None of these types (without an importance matrix) looks past its block
 * (32 weights, or 256 for the K-quants and IQ4_XS), so rows are independent
 * and a matrix is just its rows one after the other.
 */
#include "quants.h"
#include "../error.h"

#include <float.h>
#include <math.h>

/* ggml-quants.c GROUP_MAX_EPS: below this |max| a group counts as all zero. */
#define GROUP_MAX_EPS 1e-15f

/* --------------------------------------------------------- helpers -- */

/* ggml-impl.h ggml_compute_fp32_to_fp16 as ggml-base compiles it. */
static uint16_t fp16_ggml(float f) {
    uint32_t u = ds4_bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u);
    return ds4_f32_to_fp16(f);
}

/* For a scale that can be NaN only when the arithmetic made it (Inf - Inf,
 * Inf/Inf), never by passing an input NaN along: x86 makes the "default
 * NaN" 0xffc00000, so llama.cpp's x86 build stores 0xfe00, while ARM's
 * default NaN is 0x7fc00000 (ggml there would store 0x7e00). Storing x86's
 * keeps the bytes the same on every machine. (Codes do not care:
 * nearest_int, best_index and f32_to_u8_x86 ignore a NaN's sign.) The caller
 * says why its scale cannot carry an input NaN. */
static uint16_t fp16_made_scale(float f) {
    return isnan(f) ? (uint16_t)0xfe00u : fp16_ggml(f);
}

#define FP16(h) ds4_fp16_to_f32(h)

/* ggml-quants.c nearest_int: add 1.5*2^23 and read the mantissa; round to
 * nearest even for |f| <= 2^22 (ggml only asserts that range in debug
 * builds, so larger inputs get the same bit-extraction result here). */
static inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* `(int8_t)f` / `(uint8_t)f` as GCC compiles them for x86-64 in
 * ggml-quants.c (cvttss2si / cvttps2dq, then the low byte): truncation
 * toward zero, 0x80000000 when f is NaN or outside int32, low 8 bits kept. */
static inline uint8_t f32_to_u8_x86(float f) {
    int32_t i = (f >= -2147483648.0f && f < 2147483648.0f) ? (int32_t)f : INT32_MIN;
    return (uint8_t)((uint32_t)i & 0xffu);
}

/* MIN(hi, (int8_t)f) stored into a uint8_t, ggml's legacy-type code
 * expression (the comparison is signed, the store keeps the byte). */
static inline uint8_t min_i8(int hi, float f) {
    int8_t v = (int8_t)f32_to_u8_x86(f);
    return (uint8_t)(hi < v ? hi : v);
}

/* `(uint8_t)int` / `(int8_t)int`: modulo 256, as C (and GCC) define them. */
static inline uint8_t low_byte(int v) { return (uint8_t)((unsigned)v & 0xffu); }

/* -------------------------------------------------- 32-weight types -- */

/* Sign-symmetric types (Q4_0, Q5_0): the element of largest |x| (the first
 * one on ties) maps to code 0, d = max / -(levels/2). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        const float v = x[j];
        if (amax < fabsf(v)) { amax = fabsf(v); max = v; }
    }
    return max;
}

/* ggml-quants.c quantize_row_q4_0_ref. */
static void q4_0_block(const float *x, block_q4_0 *y) {
    const float max = signed_absmax(x, QK4_0);
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = fp16_ggml(d);
    for (int j = 0; j < QK4_0 / 2; j++) {
        const float x0 = x[j] * id, x1 = x[QK4_0 / 2 + j] * id;
        const uint8_t q0 = min_i8(15, x0 + 8.5f), q1 = min_i8(15, x1 + 8.5f);
        y->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* ggml-quants.c quantize_row_q5_0_ref. */
static void q5_0_block(const float *x, block_q5_0 *y) {
    const float max = signed_absmax(x, QK5_0);
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = fp16_ggml(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; j++) {
        const float x0 = x[j] * id, x1 = x[QK5_0 / 2 + j] * id;
        const uint8_t q0 = min_i8(31, x0 + 16.5f), q1 = min_i8(31, x1 + 16.5f);
        y->qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)((q0 & 0x10u) >> 4) << j;
        qh |= (uint32_t)((q1 & 0x10u) >> 4) << (j + QK5_0 / 2);
    }
    memcpy(y->qh, &qh, 4);
}

/* Affine types (Q4_1, Q5_1): min and max of the block (NaN never wins a
 * comparison, so it is skipped), d = (max - min) / (levels - 1), m = min.
 * Never NaN: min starts at FLT_MAX and max at -FLT_MAX, so +Inf can only
 * become max and -Inf only min (an all-NaN block gives d = -Inf). */
static void block_min_max(const float *x, int n, float *mn, float *mx) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        const float v = x[j];
        if (v < min) min = v;
        if (v > max) max = v;
    }
    *mn = min;
    *mx = max;
}

/* ggml-quants.c quantize_row_q4_1_ref. */
static void q4_1_block(const float *x, block_q4_1 *y) {
    float min, max;
    block_min_max(x, QK4_1, &min, &max);
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = fp16_ggml(d);
    y->m = fp16_ggml(min);
    for (int j = 0; j < QK4_1 / 2; j++) {
        const float x0 = (x[j] - min) * id, x1 = (x[QK4_1 / 2 + j] - min) * id;
        const uint8_t q0 = min_i8(15, x0 + 0.5f), q1 = min_i8(15, x1 + 0.5f);
        y->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* ggml-quants.c quantize_row_q5_1_ref (no clamp there: a plain uint8 cast). */
static void q5_1_block(const float *x, block_q5_1 *y) {
    float min, max;
    block_min_max(x, QK5_1, &min, &max);
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = fp16_ggml(d);
    y->m = fp16_ggml(min);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; j++) {
        const float x0 = (x[j] - min) * id, x1 = (x[QK5_1 / 2 + j] - min) * id;
        const uint8_t q0 = f32_to_u8_x86(x0 + 0.5f), q1 = f32_to_u8_x86(x1 + 0.5f);
        y->qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)((q0 & 0x10u) >> 4) << j;
        qh |= (uint32_t)((q1 & 0x10u) >> 4) << (j + QK5_1 / 2);
    }
    memcpy(y->qh, &qh, 4);
}

/* ---------------------------------------------------------- K-quants -- */

/* ggml-quants.c make_qkx2_quants with use_mad = false: codes 0..nmax and an
 * affine fit x ~ scale*L - the_min for one 32-weight sub-block. Starts from
 * the min/max grid, then tries nstep+1 other grid spacings
 * (rmin + rdelta*is + nmax)/(max - min), refitting scale and min by weighted
 * least squares each time and keeping the lowest weighted squared error.
 * The min is clamped to <= 0 (so the_min >= 0, possibly -0.0). */
static float fit_affine_codes(int n, int nmax, const float *x, const float *w, uint8_t *L,
                              float *the_min, float rmin, float rdelta, int nstep) {
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * L[i] + min - x[i];
        diff = diff * diff;
        best_error += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = diff * diff;
                cur_error += w[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ggml-quants.c get_scale_min_k4: the 6-bit scale and min of sub-block j. */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The common part of quantize_row_q4_K_ref / q5_K_ref: fit each 32-weight
 * sub-block (weights av_x + |x|, av_x its RMS), quantize the 8 scales and 8
 * mins to 6 bits against their maxima, then recompute every code against
 * the stored (fp16, 6-bit) scale and min. A sub-block whose stored scale is
 * zero keeps the codes of its fit (ggml skips it). */
static void k_affine_superblock(const float *x, int nmax, float rmin, float rdelta, int nstep,
                                uint16_t *dh, uint16_t *dminh, uint8_t scales_out[K_SCALE_SIZE],
                                uint8_t L[QK_K]) {
    float scales[QK_K / 32], mins[QK_K / 32], weights[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        const float *xb = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xb[l] * xb[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xb[l]);
        scales[j] = fit_affine_codes(32, nmax, xb, weights, L + 32 * j, &mins[j], rmin, rdelta,
                                     nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t *s = scales_out;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = low_byte(nearest_int(inv_scale * scales[j]));
        uint8_t lm = low_byte(nearest_int(inv_min * mins[j]));
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *dh = fp16_ggml(max_scale / 63.f);
    *dminh = fp16_ggml(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        int sc, m;
        k4_scale_min(j, s, &sc, &m);
        const float d = FP16(*dh) * sc;
        if (!d) continue;
        const float dm = FP16(*dminh) * m;
        for (int ii = 0; ii < 32; ii++) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

/* ggml-quants.c quantize_row_q4_K_ref: make_qkx2_quants(nmax 15, rmin -1,
 * rdelta 0.1, nstep 20). Codes j and j+32 of each 64 share a byte. */
static void q4_K_block(const float *x, block_q4_K *y) {
    uint8_t L[QK_K];
    memset(y->scales, 0, sizeof y->scales);
    k_affine_superblock(x, 15, -1.f, 0.1f, 20, &y->d, &y->dmin, y->scales, L);
    uint8_t *q = y->qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

/* ggml-quants.c quantize_row_q5_K_ref: make_qkx2_quants(nmax 31, rmin -0.5,
 * rdelta 0.1, nstep 15); the fifth bit of code j + 64*k (+32) goes to bit
 * 2k (2k+1) of qh[j]. */
static void q5_K_block(const float *x, block_q5_K *y) {
    uint8_t L[QK_K];
    memset(y->scales, 0, sizeof y->scales);
    k_affine_superblock(x, 31, -0.5f, 0.1f, 15, &y->d, &y->dmin, y->scales, L);
    memset(y->qh, 0, sizeof y->qh);
    uint8_t *ql = y->qs;
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
        for (int j = 0; j < 32; j++) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) { l1 -= 16; y->qh[j] |= m1; }
            if (l2 > 15) { l2 -= 16; y->qh[j] |= m2; }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
    }
}

/* ggml-quants.c make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL):
 * signed codes -nmax..nmax-1 (stored + nmax) against the element of largest
 * |x|, weights x^2; tries 18 grid spacings -(nmax + 0.1*is)/max around the
 * plain one and keeps the best weighted least-squares scale. */
static float fit_symmetric_codes(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = nearest_int(iscale * x[i]);
                l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
                L[i] = (int8_t)(l + nmax);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* ggml-quants.c quantize_row_q6_K_ref: 16 sub-blocks of 16, each fitted
 * with make_qx_quants(nmax 32); the scales are stored as int8 against the
 * one of largest magnitude (-128/max_scale), codes recomputed against the
 * stored scale; a sub-block whose stored scale is zero keeps its fit. */
static void q6_K_block(const float *x, block_q6_K *y) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ib++) {
        const float scale = fit_symmetric_codes(16, 32, x + 16 * ib, L + 16 * ib);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, sizeof *y);
        y->d = fp16_ggml(0.f);
        return;
    }
    const float iscale = -128.f / max_scale;
    y->d = fp16_ggml(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ib++) {
        const int v = nearest_int(iscale * scales[ib]);
        y->scales[ib] = (int8_t)low_byte(v < 127 ? v : 127);
    }
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = FP16(y->d) * y->scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ii++) {
            int l = nearest_int(x[16 * j + ii] / d);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            L[16 * j + ii] = (int8_t)(l + 32);
        }
    }
    uint8_t *ql = y->ql, *qh = y->qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            const uint8_t c0 = (uint8_t)L[j + l], c1 = (uint8_t)L[j + l + 32];
            const uint8_t c2 = (uint8_t)L[j + l + 64], c3 = (uint8_t)L[j + l + 96];
            ql[l] = (uint8_t)((c0 & 0xf) | ((c2 & 0xf) << 4));
            ql[l + 32] = (uint8_t)((c1 & 0xf) | ((c3 & 0xf) << 4));
            qh[l] = (uint8_t)((c0 >> 4) | ((c1 >> 4) << 2) | ((c2 >> 4) << 4) | ((c3 >> 4) << 6));
        }
    }
}

/* ---------------------------------------------------- IQ4_NL / IQ4_XS -- */

/* ggml-quants.c best_index_int8 over kvalues_iq4nl: the nearest code value,
 * the lower one on a tie, binary search (a NaN ends at the top code). The
 * comparisons are written as ggml writes them so NaN goes the same way. */
static int iq4_best_index(float x) {
    const int8_t *v = ds4_kvalues_iq4nl;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid; else lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* One 32-weight block's scale search of quantize_row_iq4_nl_impl without
 * importance weights (weights x^2, ntry 7): start from d = -max/-127 (the
 * element of largest |x| on the code -127), then try the grid spacings
 * (itry - 127)/max for itry = -7..7 and keep the best weighted
 * least-squares scale. Returns 0 for an all-(near-)zero block. */
static float iq4_block_scale(const float *xb) {
    const int8_t *values = ds4_kvalues_iq4nl;
    const int ntry = 7;
    float weight[32];
    for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        const float ax = fabsf(xb[j]);
        if (ax > amax) { amax = ax; max = xb[j]; }
    }
    if (amax < GROUP_MAX_EPS) return 0;
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        const float q = values[iq4_best_index(id * xb[j])];
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; itry++) {
        id = (itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = values[iq4_best_index(id * xb[j])];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

static void iq4_pack(const uint8_t *L, int n, uint8_t *qs) {
    for (int i = 0; i < n / 32; i++)
        for (int j = 0; j < 16; j++)
            qs[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

/* quantize_iq4_nl (ggml_quantize_chunk's path, ntry 7): d = the block's
 * fitted scale in fp16; codes against the unrounded scale. The scale is
 * never an input NaN: a NaN input makes sumq2 NaN, and then `sumq2 > 0`
 * keeps d = 0; without one, sumq2 sums (x^2*q)*q >= 0 (no code is 0), so a
 * NaN scale comes from Inf/Inf or Inf - Inf in sumqx. */
static void iq4_nl_block(const float *x, block_iq4_nl *y) {
    uint8_t L[QK4_NL];
    const float scale = iq4_block_scale(x);
    y->d = fp16_made_scale(scale);
    const float id = scale ? 1 / scale : 0;
    for (int j = 0; j < QK4_NL; j++) L[j] = (uint8_t)iq4_best_index(id * x[j]);
    iq4_pack(L, QK4_NL, y->qs);
}

/* quantize_iq4_xs: the 8 block scales stored as 6-bit signed multiples
 * (-32..31) of d = -max_scale/32 (max_scale: the scale of largest
 * magnitude), codes against each stored d*l. */
static void iq4_xs_block(const float *x, block_iq4_xs *y) {
    uint8_t L[QK_K];
    float scales[QK_K / 32];
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        scales[ib] = iq4_block_scale(x + 32 * ib);
        const float abs_d = fabsf(scales[ib]);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = scales[ib];
        }
    }
    y->scales_h = 0;
    const float d = -max_scale / 32;
    y->d = fp16_ggml(d);
    const float id = d ? 1 / d : 0.f;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        int l = nearest_int(id * scales[ib]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        const float dl = d * l;
        const float idl = dl ? 1 / dl : 0.f;
        for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)iq4_best_index(idl * x[32 * ib + j]);
        l += 32;
        const uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
        if (ib % 2 == 0) y->scales_l[ib / 2] = l_l;
        else y->scales_l[ib / 2] |= (uint8_t)(l_l << 4);
        y->scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
    }
    iq4_pack(L, QK_K, y->qs);
}

/* ----------------------------------------------------------- driver -- */

/* A row of blocks: each block is quantized into a zeroed local struct and
 * copied out, so dst needs no alignment. */
#define ROW_FN(name, btype, bs, fn)                                        \
    static void name(const float *x, void *dst, int64_t n) {               \
        uint8_t *out = dst;                                                \
        btype b;                                                           \
        for (int64_t i = 0; i < n / (bs); i++, x += (bs), out += sizeof b) { \
            memset(&b, 0, sizeof b);                                       \
            fn(x, &b);                                                     \
            memcpy(out, &b, sizeof b);                                     \
        }                                                                  \
    }

ROW_FN(row_q4_0, block_q4_0, QK4_0, q4_0_block)
ROW_FN(row_q4_1, block_q4_1, QK4_1, q4_1_block)
ROW_FN(row_q5_0, block_q5_0, QK5_0, q5_0_block)
ROW_FN(row_q5_1, block_q5_1, QK5_1, q5_1_block)
ROW_FN(row_q4_K, block_q4_K, QK_K, q4_K_block)
ROW_FN(row_q5_K, block_q5_K, QK_K, q5_K_block)
ROW_FN(row_q6_K, block_q6_K, QK_K, q6_K_block)
ROW_FN(row_iq4_nl, block_iq4_nl, QK4_NL, iq4_nl_block)
ROW_FN(row_iq4_xs, block_iq4_xs, QK_K, iq4_xs_block)

/* ggml_quantize_chunk's F32/F16/BF16 rows: a copy, ggml_fp32_to_fp16_row
 * (software conversion, NaN -> sign|0x7e00) and ggml_fp32_to_bf16_row_ref
 * (RNE, NaN quieted: ds4_f32_to_bf16). */
static void row_f32(const float *x, void *dst, int64_t n) {
    memcpy(dst, x, (size_t)n * sizeof(float));
}

static void row_f16(const float *x, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = fp16_ggml(x[i]);
        memcpy(out + 2 * i, &h, 2);
    }
}

static void row_bf16(const float *x, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = ds4_f32_to_bf16(x[i]);
        memcpy(out + 2 * i, &h, 2);
    }
}

/* Q8_0 is scalar.c's copy of quantize_row_q8_0_ref
 * (ds4_quantize_row_q8_0_ref), which writes through block_q8_0 pointers: run
 * on an aligned local block. It stores d with the F16C-exact conversion,
 * which keeps a NaN's payload; ggml-base's software one does not, so a NaN d
 * (a NaN input with a payload was the block's last max) is rewritten to
 * sign | 0x7e00 as ggml_quantize_chunk stores it. */
static void row_q8_0(const float *x, void *dst, int64_t n) {
    uint8_t *out = dst;
    block_q8_0 b;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0, out += sizeof b) {
        ds4_quantize_row_q8_0_ref(x, &b, QK8_0, NULL);
        if ((b.d & 0x7c00u) == 0x7c00u && (b.d & 0x03ffu))
            b.d = (uint16_t)((b.d & 0x8000u) | 0x7e00u);
        memcpy(out, &b, sizeof b);
    }
}

typedef void (*row_fn)(const float *x, void *dst, int64_t n);

static row_fn weight_quantizer(int type) {
    switch (type) {
    case DS4_TYPE_F32: return row_f32;
    case DS4_TYPE_F16: return row_f16;
    case DS4_TYPE_BF16: return row_bf16;
    case DS4_TYPE_Q4_0: return row_q4_0;
    case DS4_TYPE_Q4_1: return row_q4_1;
    case DS4_TYPE_Q5_0: return row_q5_0;
    case DS4_TYPE_Q5_1: return row_q5_1;
    case DS4_TYPE_Q8_0: return row_q8_0;
    case DS4_TYPE_Q4_K: return row_q4_K;
    case DS4_TYPE_Q5_K: return row_q5_K;
    case DS4_TYPE_Q6_K: return row_q6_K;
    case DS4_TYPE_IQ4_NL: return row_iq4_nl;
    case DS4_TYPE_IQ4_XS: return row_iq4_xs;
    default: return NULL;
    }
}

int ds4_quantize_weights(int type, const float *src, void *dst, int64_t n_rows,
                         int64_t n_per_row, ds4_error *err) {
    if (type < 0 || type >= DS4_TYPE_COUNT || ds4_type_traits_table[type].block_size == 0)
        return ds4_fail(err, DS4_ERR_BAD_TENSOR_TYPE, "unknown ggml type id %d", type);
    const ds4_type_traits *t = &ds4_type_traits_table[type];
    const row_fn fn = weight_quantizer(type);
    if (!fn)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "quantizing weights to %s is not supported", t->name);
    if (n_rows < 0 || n_per_row < 0)
        return ds4_fail(err, DS4_ERR_ARG, "negative shape: %lld rows of %lld",
                        (long long)n_rows, (long long)n_per_row);
    if (n_per_row % t->block_size != 0)
        return ds4_fail(err, DS4_ERR_BAD_ROW,
                        "row length %lld is not a multiple of %s's block size %lld",
                        (long long)n_per_row, t->name, (long long)t->block_size);
    const int64_t row_bytes = n_per_row / t->block_size * t->type_size;
    if (n_rows && (n_per_row > INT64_MAX / n_rows || row_bytes > INT64_MAX / n_rows))
        return ds4_fail(err, DS4_ERR_ARG, "%lld rows of %lld weights overflow int64",
                        (long long)n_rows, (long long)n_per_row);
    if (n_rows * n_per_row == 0) return ds4_ok(err);
    if (!src || !dst)
        return ds4_fail(err, DS4_ERR_ARG, "NULL src or dst for %lld rows of %lld weights",
                        (long long)n_rows, (long long)n_per_row);
    const float *x = src;
    uint8_t *y = dst;
    for (int64_t r = 0; r < n_rows; r++, x += n_per_row, y += row_bytes) fn(x, y, n_per_row);
    return ds4_ok(err);
}
