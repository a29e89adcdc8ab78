/*
 * avx2_fwd.h — internal: the AVX2 kernel set's forward-pass kernels that
 * live outside avx2.c (avx2_fwd.c), installed by ds4_kernels_init_avx2.
 * Their contracts are the kernel-set fields of quants.h they fill.
 */
#ifndef DS4_AVX2_FWD_H
#define DS4_AVX2_FWD_H

#include <stdint.h>

/* quants.h gdn_rows, bit for bit the per-row loop over avx2.c's
 * dot_f32_f32 (its order is mirrored in avx2_fwd.c). */
void ds4_avx2_gdn_rows(float *S, int64_t nr, const float *k, const float *q, int64_t dk,
                       float decay, const float *v, float beta, float *out);
/* quants.h silu_mul; valid only where ds4_avx2_expf_matches() said 1. */
void ds4_avx2_silu_mul(float *y, const float *x, const float *m, int64_t n);
int ds4_avx2_expf_matches(void);
/* quants.h f16_acc_row. */
void ds4_avx2_f16_acc_row(float *a, const uint16_t *v, float vs, int64_t n);

#endif
