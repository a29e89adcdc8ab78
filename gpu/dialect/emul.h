/*
 * dialect/emul.h — the kernel dialect as plain C11 (+ __typeof__) for the
 * threadgroup emulator (gpu/emul/). A kernel becomes a C function called
 * once per thread on that thread's fiber; thread positions come from the
 * emulator, every K_LD/K_ST is checked (emul.h lists the checks).
 */
#ifndef K_DIALECT_EMUL_H
#define K_DIALECT_EMUL_H

#include <math.h>
#include <stdint.h>

#include "../emul/emul.h"
#include "../kernels/table.h"

#define K_FN static inline
#define K_DEV
#define K_DEV_IN const
#define K_TGM

#define K_TID (emul_pos.tid)
#define K_TG_SIZE (emul_pos.tg_size)
#define K_GX (emul_pos.gid[0])
#define K_GY (emul_pos.gid[1])
#define K_GZ (emul_pos.gid[2])
#define K_NGX (emul_pos.ngroups[0])
#define K_NGY (emul_pos.ngroups[1])
#define K_NGZ (emul_pos.ngroups[2])

#define K_BARRIER() emul_barrier(__LINE__)
#define K_UNROLL
#define K_TG_ARRAY(T, name, N) T *name = (T *)emul_tg_array(__LINE__, sizeof(T), (N))
#define K_LD(p, i) (*(__typeof__(&(p)[i]))emul_chk((p), &(p)[i], sizeof((p)[i]), 0, __LINE__))
#define K_ST(p, i, v) (*(__typeof__(&(p)[i]))emul_chk((p), &(p)[i], sizeof((p)[i]), 1, __LINE__) = (v))

#define K_DEP_WAIT() ((void)0)   /* CUDA only (cuda.h) */
#define K_DEP_LAUNCH() ((void)0)
#define k_shfl_xor(v, m) emul_shfl_xor((v), (m), __LINE__)
#define k_shfl_xor_i(v, m) emul_shfl_xor_i((v), (m), __LINE__)
#define k_shfl_at_i(v, src) emul_shfl_at_i((v), (src), __LINE__)
typedef struct { uint32_t x, y, z, w; } k_u32x4; /* 16-byte loads; the emulator checks their alignment */
typedef struct { uint32_t x, y; } k_u32x2;       /* 8-byte loads */
/* a hint on the GPU; here its address is bounds-checked like a load */
#define K_PREFETCH(p, i) ((void)emul_chk((p), &(p)[i], 1, 0, __LINE__))
#define k_raise(status, bits) emul_raise((status), (bits))
#define k_exp expf
#define k_log logf
#define k_sqrt sqrtf
#define k_rint rintf /* round to nearest even in the default rounding mode */
#define k_fabs fabsf
#define k_fma fmaf /* C99: a * b + c with one rounding */
#define K_NEG_INF (-INFINITY)

K_FN float k_bits_f32(uint32_t u) { union { uint32_t u; float f; } c; c.u = u; return c.f; }
K_FN uint32_t k_f32_bits(float f) { union { uint32_t u; float f; } c; c.f = f; return c.u; }

/* IEEE binary16 -> float, exact (subnormals, Inf, NaN). */
K_FN float k_h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return k_bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e) return k_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    /* subnormal: m * 2^-24, exact in float */
    const float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

/* k_f2h, shared by every target */
#include "f16.h"

/* c + the dot product of the four signed bytes of a and b (CUDA __dp4a) */
K_FN int k_dot4(uint32_t a, uint32_t b, int c) {
    for (int e = 0; e < 4; e++) c += (int)(int8_t)(a >> (8 * e)) * (int)(int8_t)(b >> (8 * e));
    return c;
}

K_FN float k_bf2f(uint16_t h) { return k_bits_f32((uint32_t)h << 16); }

/* Warp-wide int8 tensor-core products (gemm_mma.h; CUDA: mma.sync), all 32
 * lanes at the same call: emul.c computes each lane's outputs from the
 * whole SIMD-group's fragments in the PTX layout (documented there). */
#define K_HAS_MMA 1
typedef struct { int32_t x, y, z, w; } k_i32x4;
K_FN k_i32x4 k_emul_mma(uint32_t k, k_i32x4 c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                        uint32_t b0, uint32_t b1, int line) {
    const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    int32_t v[4] = {c.x, c.y, c.z, c.w};
    emul_mma_s8(k, a, b, v, line);
    c.x = v[0], c.y = v[1], c.z = v[2], c.w = v[3];
    return c;
}
#define k_mma_s8_k16(c, a0, a1, b0) k_emul_mma(16u, (c), (a0), (a1), 0u, 0u, (b0), 0u, __LINE__)
#define k_mma_s8_k32(c, a0, a1, a2, a3, b0, b1) k_emul_mma(32u, (c), (a0), (a1), (a2), (a3), (b0), (b1), __LINE__)

/* A kernel is k_<name>_impl(table args, int) plus the entry the emulator
 * calls with the bound slots, k_emul_<name>(slots). */
#define K_EMUL_PARAM_K_STATUS(T, name) k_u32 *name,
#define K_EMUL_PARAM_K_PARAMS(T, name) const T name,
#define K_EMUL_PARAM_K_IN(T, name) const T *name,
#define K_EMUL_PARAM_K_OUT(T, name) T *name,
#define K_EMUL_PARAM_(K, slot, name, T, kind, n) K_EMUL_PARAM_##kind(T, name)
#define K_EMUL_ARGV_K_STATUS(T, s) (k_u32 *)k__s[s],
#define K_EMUL_ARGV_K_PARAMS(T, s) *(const T *)k__s[s],
#define K_EMUL_ARGV_K_IN(T, s) (const T *)k__s[s],
#define K_EMUL_ARGV_K_OUT(T, s) (T *)k__s[s],
#define K_EMUL_ARGV_(K, slot, name, T, kind, n) K_EMUL_ARGV_##kind(T, slot)
#define K_KERNEL(K)                                                             \
    static void k_##K##_impl(K_ARGS_##K(K_EMUL_PARAM_, K) int k__end);          \
    void k_emul_##K(void *const *k__s);                                         \
    void k_emul_##K(void *const *k__s) { k_##K##_impl(K_ARGS_##K(K_EMUL_ARGV_, K) 0); } \
    static void k_##K##_impl(K_ARGS_##K(K_EMUL_PARAM_, K) int k__end)
/* CUDA's register-cap hint (cuda.h); nothing to do here */
#define K_KERNEL_BOUNDED(K, T, B) K_KERNEL(K)

#endif
