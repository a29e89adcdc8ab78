/*
 * attn_simd.h — internal: SIMD kernels of forward/attention.c's F16 recipe.
 *
 * Each ISA file (attn_avx512.c, ...) is compiled with its own target flags
 * (build_core.py SIMD_VARIANTS) and compiles to a stub whose *_ok() returns 0
 * when the compiler lacked them. attention.c calls a kernel only while the
 * session runs that ISA's kernel set (so DS4_FORCE_SCALAR also turns these
 * off) and *_ok() says it was built.
 *
 * The V step of the F16 recipe (ds4_attn_f16_acc_*) over P <= 256 consecutive positions i
 * (one block) and G query heads g (positions ascending; per position every head):
 *     x = r[g*rs + i];
 *     if (x != 1.0f) a_g[d] = f32(f16(a_g[d] * x))            for all d < dh;
 *     a_g[d] = f32(f16(fmaf(f32(v_i[d]), w[g*rs + i], a_g[d])))   for all d < dh;
 * a_g = a + g*as (dh floats, every value F16-representable), v_i = v + i*dh
 * (F16), f16() rounds to nearest-even. Every step is one IEEE float multiply,
 * one fused multiply-add (one rounding, as llama.cpp's ggml_vec_mad_f16 does
 * with GGML_F16_VEC_FMA on every x86 SIMD build) or an exact conversion, so
 * every implementation gives the same bits as forward/attention.c's portable
 * loop over the kernel set's f16_acc_row / to_float / from_float. (Until
 * 2026-11-30 the add was a multiply, then an add: one more rounding than
 * llama.cpp, and one more uop on the V step's critical ports.)
 */
#ifndef DS4_ATTN_SIMD_H
#define DS4_ATTN_SIMD_H

#include <stdint.h>

/* The scores of the F16 recipe for P consecutive K rows (k + i*dh, F16)
 * and G queries (q + g*dh, F16-representable floats):
 *     s[g*ss + i] = dot(k_i, q_g) * scale
 * with dot summed in the order of the ISA's kernel set's vec_dot_f32[F16]
 * (and vec_dot_f32[F32]), which fixes the bits: valid only for sessions
 * running that set. v (may be NULL): the block's P V rows, requested into
 * cache meanwhile for the V step that follows (a hint; nothing is read). */
void ds4_attn_f16_scores_avx512(const uint16_t *k, int64_t P, const float *q, int64_t G,
                                int64_t dh, float scale, float *s, int64_t ss,
                                const uint16_t *v);

/* nk, nv (may be NULL): the next block's nP K and V rows, requested into
 * cache meanwhile (a hint; nothing is read). */
int ds4_attn_f16_acc_avx512_ok(void);
void ds4_attn_f16_acc_avx512(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                             const float *w, const float *r, int64_t rs, int64_t dh,
                             const uint16_t *nk, const uint16_t *nv, int64_t nP);

/* Pass 2 of the staged recipe (attention.c block_f16_staged) for G heads
 * over P <= 256 positions: head g's scores w[g*rs + i] are replaced by the
 * weights vs, r[g*rs + i] receives the rescale factors x, st[g*hs] the
 * block's max M and st[g*hs + 1] the sum S, all as the portable loop makes
 * them; expf is glibc's, 16 lanes at a time. Valid only where
 * ds4_attn_f16_softmax_avx512_ok() (expf16 checked against this process's
 * expf once) says 1. */
int ds4_attn_f16_softmax_avx512_ok(void);
void ds4_attn_f16_softmax_avx512(float *w, float *r, int64_t rs, int64_t G, int64_t P, float *st,
                                 int64_t hs);

/* The same two kernels for sessions running the AVX2 kernel set
 * (attn_avx2.c): scores in the order of that set's vec_dot_f32[F32]; nk,
 * nv, nP and v are accepted and ignored (no memory hints). */
int ds4_attn_f16_avx2_ok(void);
void ds4_attn_f16_scores_avx2(const uint16_t *k, int64_t P, const float *q, int64_t G,
                              int64_t dh, float scale, float *s, int64_t ss,
                              const uint16_t *v);
void ds4_attn_f16_acc_avx2(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                           const float *w, const float *r, int64_t rs, int64_t dh,
                           const uint16_t *nk, const uint16_t *nv, int64_t nP);

#endif
