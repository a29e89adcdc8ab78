/*
 * f16.h — float -> binary16 (round to nearest even) in integer arithmetic,
 * one definition for every target (included by metal.h, cuda.h, emul.h
 * after each defines k_f32_bits, its float -> uint bit cast).
 *
 * Why not the vendor conversion (CUDA __float2half_rn, Metal half(f)):
 * nvcc 13.0 / ptxas for sm_90 miscompiled quantize_q8_0's store of the
 * scale's low byte. The PTX was right (cvt.rn.f16.f32 into a .b16
 * register, st.global.u8 of it), but ptxas turned "store the low 8 bits of
 * that register" into F2I.U8.F16.TRUNC — the half's VALUE converted to an
 * integer — so a scale of 1.0 (0x3c00) was stored as bytes 01 3c, and every
 * scale below 1 got a low byte of 0 (the H200 run of 2026-11-29: 4 of 55
 * checks red). Integer code leaves nothing for such a peephole to match,
 * and it is this very code that the emulator checks against the CPU's
 * converter on 2^20 inputs (suite f16), so every target converts alike.
 * Used where a kernel stores fp16 (scales, the KV shadow), not in hot loops.
 */
#ifndef K_DIALECT_F16_H
#define K_DIALECT_F16_H

K_FN k_u16 k_f2h(float f) {
    const k_u32 u = k_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    /* NaN: payload truncated, quiet bit set (as F16C, so as the CPU; payloads
     * are not promised on GPUs) */
    if (a > 0x7f800000u) return (k_u16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (k_u16)(sign | 0x7c00u); /* Inf, or rounds to >= 65520: Inf */
    if (a >= 0x38800000u) { /* normal half: add half an ulp (minus one when even), truncate */
        const k_u32 r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
        return (k_u16)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return (k_u16)sign; /* at most half the smallest subnormal: 0 */
    /* subnormal half: round mant * 2^(e-150) to a multiple of 2^-24 */
    const k_u32 e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
    k_u32 q = mant >> shift;
    const k_u32 rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (k_u16)(sign | q);
}

#endif
