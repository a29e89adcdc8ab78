/* scalar.c — reference kernels (placeholder: filled in by the scalar work). */
#include "quants.h"

const int8_t ds4_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1, 13, 25, 38, 53, 69, 89, 113};

float ds4_fp16_to_f32(uint16_t h) { (void)h; return 0.0f; }
uint16_t ds4_f32_to_fp16(float f) { (void)f; return 0; }
uint16_t ds4_f32_to_bf16(float f) { (void)f; return 0; }

void ds4_kernels_init_scalar(ds4_kernel_set *k) { memset(k, 0, sizeof *k); }

int ds4_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n, ds4_error *err) {
    (void)src; (void)dst; (void)n;
    if (err) { err->code = DS4_ERR_UNSUPPORTED; err->message[0] = 0; }
    return DS4_ERR_UNSUPPORTED;
}
