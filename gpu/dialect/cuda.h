/*
 * dialect/cuda.h — the kernel dialect as CUDA C++ (sm_70+: __shfl_xor_sync).
 * Compiled by nvcc through cuda/kernels.cu with --fmad=false (no
 * contraction) and IEEE division/sqrt (nvcc's defaults without
 * --use_fast_math).
 */
#ifndef K_DIALECT_CUDA_H
#define K_DIALECT_CUDA_H

#include <math.h>
#include <stdint.h>
#include <cuda_fp16.h>

#include "../kernels/table.h"

#define K_FN static __device__ __forceinline__
#define K_DEV
#define K_DEV_IN const
#define K_TGM

#define K_TID (threadIdx.x)
#define K_TG_SIZE (blockDim.x)
#define K_GX (blockIdx.x)
#define K_GY (blockIdx.y)
#define K_GZ (blockIdx.z)
#define K_NGX (gridDim.x)
#define K_NGY (gridDim.y)
#define K_NGZ (gridDim.z)

#define K_BARRIER() __syncthreads()
#define K_UNROLL _Pragma("unroll")
#define K_TG_ARRAY(T, name, N) __shared__ T name[N]
#define K_LD(p, i) ((p)[i])
#define K_ST(p, i, v) ((p)[i] = (v))

/* Programmatic dependent launch (sm_90; common.h K_CHECK_TAG, K_DEP_WAIT):
 * the host may start a kernel while its predecessor drains (cuda/host.cu
 * pdl_mode); every kernel lets its successor be scheduled at its start and
 * waits here for its predecessor's completion and memory before it reads
 * anything a kernel writes. Compiled for sm_90 and later unless
 * -DK_CUDA_NO_PDL (then the host never starts a kernel early either). */
#if !defined(K_CUDA_NO_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define K_DEP_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define K_DEP_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define K_DEP_WAIT() ((void)0)
#define K_DEP_LAUNCH() ((void)0)
#endif
#define k_shfl_xor(v, m) __shfl_xor_sync(0xffffffffu, (v), (int)(m))
#define k_shfl_xor_i(v, m) __shfl_xor_sync(0xffffffffu, (int)(v), (int)(m))
#define k_shfl_at_i(v, src) __shfl_sync(0xffffffffu, (int)(v), (int)(src))
/* c + the dot product of the four signed bytes of a and of b (IDP4A: one
 * instruction for four int8 multiply-adds; exact integer, like the others) */
K_FN int k_dot4(k_u32 a, k_u32 b, int c) { return __dp4a((int)a, (int)b, c); }
typedef uint4 k_u32x4; /* 16-byte loads (LDG.E.128) */
typedef uint2 k_u32x2; /* 8-byte loads */
/* Ask L2 for the line holding byte i of device buffer p (no register, no
 * fault on a valid address): streaming kernels run ahead of their loads. */
#define K_PREFETCH(p, i) asm volatile("prefetch.global.L2 [%0];" ::"l"((const void *)&(p)[i]))
#define k_exp(x) expf(x)
#define k_log(x) logf(x)
#define k_sqrt(x) sqrtf(x)
#define k_rint(x) rintf(x)
#define k_fabs(x) fabsf(x)
#define k_fma(a, b, c) __fmaf_rn((a), (b), (c)) /* one rounding, explicit: --fmad=false leaves it alone */
#define K_NEG_INF (-INFINITY)

K_FN float k_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
K_FN k_u32 k_f32_bits(float f) { return __float_as_uint(f); }
K_FN float k_bits_f32(k_u32 u) { return __uint_as_float(u); }
/* k_f2h: integer RNE, not __float2half_rn (f16.h says why) */
#include "f16.h"
K_FN float k_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
#define k_raise(status, bits) atomicOr((status), (bits))

/* Warp-wide int8 tensor-core products (sm_80+; gemm_mma.h): D = A B + C on
 * a 16 x 8 int32 tile, K = 16 or 32 int8 per row/column, all 32 lanes at
 * the same call (.aligned). Fragment layout: PTX ISA "Matrix Fragments for
 * mma.m16n8k16 / m16n8k32 with integer type" (spelled out in
 * gpu/emul/emul.c, whose emulation the CI tests run). Exact integers. */
#define K_HAS_MMA 1
typedef struct { int x, y, z, w; } k_i32x4;
K_FN k_i32x4 k_mma_s8_k16(k_i32x4 c, k_u32 a0, k_u32 a1, k_u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c.x), "+r"(c.y), "+r"(c.z), "+r"(c.w)
        : "r"(a0), "r"(a1), "r"(b0));
    return c;
}
K_FN k_i32x4 k_mma_s8_k32(k_i32x4 c, k_u32 a0, k_u32 a1, k_u32 a2, k_u32 a3, k_u32 b0, k_u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c.x), "+r"(c.y), "+r"(c.z), "+r"(c.w)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    return c;
}

#define K_CU_PARAM_K_STATUS(T, name) k_u32 *name,
#define K_CU_PARAM_K_PARAMS(T, name) const T name,
#define K_CU_PARAM_K_IN(T, name) const T *__restrict__ name,
#define K_CU_PARAM_K_OUT(T, name) T *name,
#define K_CU_PARAM_(K, slot, name, T, kind, n) K_CU_PARAM_##kind(T, name)
/* The last parameter is the argument count the host passed: the kernel
 * table's K_NARGS, checked by the host launcher (cuda/host.cu). */
#define K_KERNEL(K) extern "C" __global__ void k_##K(K_ARGS_##K(K_CU_PARAM_, K) int k__nargs)
/* A kernel launched with at most T threads per threadgroup that wants B
 * threadgroups resident per SM: ptxas then caps its registers (65536 / (T
 * B)) instead of hoisting loads until occupancy collapses. */
#define K_KERNEL_BOUNDED(K, T, B) \
    extern "C" __global__ __launch_bounds__(T, B) void k_##K(K_ARGS_##K(K_CU_PARAM_, K) int k__nargs)

#endif
