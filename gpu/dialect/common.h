/*
 * common.h — the part of the kernel dialect written once on top of a target
 * header (metal.h, cuda.h or emul.h, which the including file picks first).
 *
 * What a target header provides (and nothing else may be used by a kernel):
 *   K_KERNEL(name) { ... }   a kernel whose parameters are its table row
 *                            (table.h): every argument by its table name
 *   K_TID, K_TG_SIZE         thread index in its threadgroup (1-D), size
 *   K_GX, K_GY, K_GZ         threadgroup position in the grid
 *   K_NGX, K_NGY, K_NGZ      threadgroups in the grid
 *   K_BARRIER()              threadgroup barrier (threadgroup memory fence)
 *   K_UNROLL                 before a loop of constant trip count: unroll it
 *                            (arrays it indexes stay in registers)
 *   K_TG_ARRAY(T, name, N)   a threadgroup-shared array of N elements
 *   K_LD(p, i), K_ST(p, i, v)  element i of a device or threadgroup array
 *                            (bounds- and race-checked under the emulator)
 *   k_shfl_xor(v, m)         the value of lane (lane ^ m) of the SIMD-group
 *   k_shfl_xor_i(v, m)       the same for an int (bits exact)
 *   k_shfl_at_i(v, src)      an int's value in lane src (0..31) of the SIMD-group
 *   K_DEP_WAIT()             in a kernel the CUDA host may start while the
 *                            previous kernel drains (programmatic dependent
 *                            launch, cuda/host.cu pdl_mode; K_CHECK_TAG
 *                            calls it, K_CHECK_TAG_EARLY leaves it to the
 *                            kernel): before it, read only buffers no
 *                            kernel writes (weights) and write nothing but
 *                            the status word; a no-op elsewhere
 *   k_dot4(a, b, c)          c + dot product of the 4 signed bytes of a and b
 *                            (CUDA __dp4a; exact integers on every target)
 *   K_PREFETCH(p, i)         hint: fetch the line of byte i of device buffer
 *                            p into L2 (CUDA; nothing on Metal); in bounds
 *   k_u32x4, k_u32x2         4 words (.x .y .z .w) / 2 (.x .y): one 16- /
 *                            8-byte load, the address aligned to its size
 *                            (the emulator checks)
 *   k_h2f / k_f2h / k_bf2f   fp16 / bf16 bits <-> float, round to nearest even
 *   K_DEV, K_DEV_IN, K_TGM   address spaces of pointers kept in locals
 *   K_FN                     qualifiers of a helper function
 *   k_exp, k_log, k_sqrt, k_rint, k_fabs, k_bits_f32, k_f32_bits
 *   k_fma(a, b, c)           a * b + c with one rounding (IEEE fused multiply-add)
 *                            float math (no fast math), bit casts
 *   k_raise(status, bits)    OR bits into the status word
 *
 * Helper functions (K_FN) may not use K_TID, K_LANE, K_GX, ... : on Metal
 * those are the kernel's parameters; pass what a helper needs as arguments.
 * (The Metal amalgamation is type-checked by a C++ compiler against
 * gpu/tools/metal_mock.h in tests/test_gpu_emul.py, which catches this.)
 *
 * SIMD-groups are 32 lanes on every target (Apple GPUs and NVIDIA), lanes
 * numbered by K_TID % 32; a threadgroup size is always a multiple of 32.
 */
#ifndef K_COMMON_H
#define K_COMMON_H

#define K_SIMD_WIDTH 32
#define K_LANE (K_TID & 31u)
#define K_SIMD (K_TID >> 5)
#define K_NSIMD (K_TG_SIZE >> 5)

/* Reductions over a SIMD-group as an xor butterfly (offsets 16, 8, 4, 2,
 * 1), the one order used on every target, not the vendor's simd_sum /
 * __reduce_add (whose order is unspecified): every lane ends with the same
 * bits (a + b == b + a in IEEE arithmetic), and the result is the same on
 * Metal, CUDA and the emulator, so the emulator can promise the GPU's bits.
 * Must be called by all 32 lanes (uniform control flow). */
K_FN float k_simd_sum(float v) {
    v = v + k_shfl_xor(v, 16u);
    v = v + k_shfl_xor(v, 8u);
    v = v + k_shfl_xor(v, 4u);
    v = v + k_shfl_xor(v, 2u);
    v = v + k_shfl_xor(v, 1u);
    return v;
}

/* Two k_simd_sum in lockstep (each value its own butterfly, so its own
 * bits): two independent shuffle chains in flight instead of one. */
typedef struct {
    float a, b;
} k_f32x2;
K_FN k_f32x2 k_simd_sum2(float a, float b) {
    a = a + k_shfl_xor(a, 16u);
    b = b + k_shfl_xor(b, 16u);
    a = a + k_shfl_xor(a, 8u);
    b = b + k_shfl_xor(b, 8u);
    a = a + k_shfl_xor(a, 4u);
    b = b + k_shfl_xor(b, 4u);
    a = a + k_shfl_xor(a, 2u);
    b = b + k_shfl_xor(b, 2u);
    a = a + k_shfl_xor(a, 1u);
    b = b + k_shfl_xor(b, 1u);
    k_f32x2 r;
    r.a = a, r.b = b;
    return r;
}

/* Float sum over the 8 lanes of an octet by xor butterfly (1, 2, 4): the
 * one order on every target; every lane of the octet ends with it. */
K_FN float k_octet_sum(float v) {
    v = v + k_shfl_xor(v, 1u);
    v = v + k_shfl_xor(v, 2u);
    v = v + k_shfl_xor(v, 4u);
    return v;
}

/* Integer sum over the 8 lanes of an octet (lanes 8g..8g+7); every lane
 * of the octet ends with it. Integers: exact in any order. */
K_FN int k_octet_isum(int v) {
    v = v + k_shfl_xor_i(v, 1u);
    v = v + k_shfl_xor_i(v, 2u);
    v = v + k_shfl_xor_i(v, 4u);
    return v;
}

/* max with a > b ? a : b semantics (NaN-free inputs assumed, as scores and
 * magnitudes are; the order does not matter for max of non-NaN values). */
K_FN float k_max2(float a, float b) { return a > b ? a : b; }

K_FN float k_simd_max(float v) {
    v = k_max2(v, k_shfl_xor(v, 16u));
    v = k_max2(v, k_shfl_xor(v, 8u));
    v = k_max2(v, k_shfl_xor(v, 4u));
    v = k_max2(v, k_shfl_xor(v, 2u));
    v = k_max2(v, k_shfl_xor(v, 1u));
    return v;
}

/* The first statement of every kernel: params that are not this kernel's
 * (an argument bound at the wrong slot) raise K_ERR_TAG in the status word
 * instead of letting every thread return early in silence. All threads
 * take the same branch, so no barrier is left waiting.
 *
 * On CUDA (programmatic dependent launch, cuda/host.cu pdl_mode) it also
 * lets the next kernel be scheduled now (K_DEP_LAUNCH), and then waits
 * (K_DEP_WAIT) until the kernel before this one has completed and its
 * writes are visible: a kernel the host started early reads and writes
 * nothing before that, so its launch and ramp overlap its predecessor's
 * tail and nothing else changes. K_CHECK_TAG_EARLY leaves the wait to the
 * kernel: the matvecs issue their first weight loads (weights: no kernel
 * writes them) before their own K_DEP_WAIT. Both are no-ops off CUDA. */
#define K_CHECK_TAG_EARLY(K)                               \
    do {                                                   \
        K_DEP_LAUNCH(); /* an early-started successor may be scheduled */ \
        if (p.tag != K_TAG_OF(K)) {                        \
            k_raise(status, K_ERR_TAG);                    \
            return;                                        \
        }                                                  \
    } while (0)
#define K_CHECK_TAG(K)                                     \
    do {                                                   \
        K_CHECK_TAG_EARLY(K); /* reads only p, writes only the status word */ \
        K_DEP_WAIT(); /* the predecessor's writes are visible from here */ \
    } while (0)

#endif
