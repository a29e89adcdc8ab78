/*
 * dialect/metal.h — the kernel dialect as Metal Shading Language (2.3+).
 * UNTESTED: nothing here has been compiled by a Metal compiler yet
 * (docs/gpu.md, "Untested on Metal"). Included first by the Metal source
 * that tools/amalgamate.py writes (metal/ compiles it at load time).
 */
#ifndef K_DIALECT_METAL_H
#define K_DIALECT_METAL_H

#define K_DEVICE_METAL 1
#ifndef K_PREPROCESS_ONLY
#include <metal_stdlib>
using namespace metal;
/* Exact kernels promise the CPU's bits (rope, quantize) and the emulator's
 * (all): no a*b+c contraction, IEEE division and sqrt. The host also
 * compiles with fast math off (MTLCompileOptions mathMode = safe). */
#pragma METAL fp math_mode(safe)
#pragma METAL fp contract(off)
#endif

#include "../kernels/table.h"

#define K_FN static inline
#define K_DEV device
#define K_DEV_IN const device
#define K_TGM threadgroup

#define K_TID (k__tid)
#define K_TG_SIZE (k__tgsize.x)
#define K_GX (k__gid.x)
#define K_GY (k__gid.y)
#define K_GZ (k__gid.z)
#define K_NGX (k__ngroups.x)
#define K_NGY (k__ngroups.y)
#define K_NGZ (k__ngroups.z)

#define K_BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define K_UNROLL _Pragma("unroll")
#define K_TG_ARRAY(T, name, N) threadgroup T name[N]
#define K_LD(p, i) ((p)[i])
#define K_ST(p, i, v) ((p)[i] = (v))

#define K_DEP_WAIT() ((void)0)   /* CUDA only (cuda.h) */
#define K_DEP_LAUNCH() ((void)0)
#define k_shfl_xor(v, m) simd_shuffle_xor((v), (ushort)(m))
#define k_shfl_xor_i(v, m) simd_shuffle_xor((int)(v), (ushort)(m))
#define k_shfl_at_i(v, src) simd_shuffle((int)(v), (ushort)(src))
typedef uint4 k_u32x4; /* 16-byte loads */
typedef uint2 k_u32x2; /* 8-byte loads */
#define K_PREFETCH(p, i) ((void)(p), (void)(i)) /* no MSL equivalent; a hint only */
#define k_exp(x) precise::exp(x)
#define k_log(x) precise::log(x)
#define k_sqrt(x) precise::sqrt(x)
#define k_rint(x) rint(x)
#define k_fabs(x) fabs(x)
#define k_fma(a, b, c) fma((a), (b), (c)) /* Metal: a * b + c with one rounding */
#define K_NEG_INF (-INFINITY)

K_FN float k_h2f(ushort h) { return float(as_type<half>(h)); }
K_FN k_u32 k_f32_bits(float f) { return as_type<uint>(f); }
K_FN float k_bits_f32(k_u32 u) { return as_type<float>(u); }
/* k_f2h: integer RNE, as on every target (f16.h says why) */
#include "f16.h"
/* c + the dot product of the four signed bytes of a and b (MSL has no
 * 4-way int8 dot; exact integer arithmetic, the same value as CUDA's __dp4a) */
K_FN int k_dot4(uint a, uint b, int c) {
    const char4 x = as_type<char4>(a), y = as_type<char4>(b);
    return c + int(x.x) * int(y.x) + int(x.y) * int(y.y) + int(x.z) * int(y.z) + int(x.w) * int(y.w);
}
K_FN float k_bf2f(ushort h) { return as_type<float>((uint)h << 16); }

K_FN void k_raise_(device atomic_uint *status, uint bits) {
    atomic_fetch_or_explicit(status, bits, memory_order_relaxed);
}
#define k_raise(status, bits) k_raise_((status), (bits))

#define K_MTL_PARAM_K_STATUS(T, name, slot) device atomic_uint *name [[buffer(slot)]],
#define K_MTL_PARAM_K_PARAMS(T, name, slot) constant T &name [[buffer(slot)]],
#define K_MTL_PARAM_K_IN(T, name, slot) const device T *name [[buffer(slot)]],
#define K_MTL_PARAM_K_OUT(T, name, slot) device T *name [[buffer(slot)]],
#define K_MTL_PARAM_(K, slot, name, T, kind, n) K_MTL_PARAM_##kind(T, name, slot)
#define K_KERNEL(K)                                                   \
    kernel void k_##K(K_ARGS_##K(K_MTL_PARAM_, K)                     \
                      uint k__tid [[thread_index_in_threadgroup]],    \
                      uint3 k__tgsize [[threads_per_threadgroup]],    \
                      uint3 k__gid [[threadgroup_position_in_grid]],  \
                      uint3 k__ngroups [[threadgroups_per_grid]])
/* CUDA's register-cap hint (cuda.h); the host launches at most T threads */
#define K_KERNEL_BOUNDED(K, T, B) K_KERNEL(K)

#endif
