/*
 * norm.c — RMSNorm, L2 norm and the scalar activations.
 *
 * All in float32 like both references, except the sums of squares, which
 * ggml's CPU backend accumulates in double (ops.cpp rms_norm_f32 /
 * l2_norm_f32: each square rounded to float, then added in double); we do
 * the same, which also makes them independent of vector width.
 */
#include "forward.h"

#include <math.h>

void ds4_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    /* Normalise, then the weight as a separate multiply: ggml's rms_norm op
     * followed by ggml_mul, and transformers' x*rsqrt(..) then * weight. */
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

/* transformers (modeling_qwen3_5.py l2norm, FLA-compatible) scales by
 * rsqrt(sum + eps). Exact mode follows transformers, the reference it is
 * tested against; fast mode uses ds4_l2norm_ggml below. */
void ds4_l2norm(float *x, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)sum + eps);
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
}

/* llama.cpp normalises the GDN q and k heads with an RMSNorm whose eps is
 * eps/n, then scales by 1/sqrt(n) (src/models/models.h build_gdn_l2_norm:
 * ggml_scale(ggml_rms_norm(x, eps/n), 1/sqrtf(n))): x / sqrt(sum + eps) in
 * exact arithmetic, with ggml's roundings (mean in float, two multiplies).
 * The spec's max(||x||, eps) floor belongs to ggml_l2_norm, which this
 * llama.cpp version no longer uses here. */
void ds4_l2norm_ggml(float *x, int64_t n, float eps) {
    const float nf = (float)n;
    ds4_rmsnorm(x, NULL, x, n, eps / nf);
    const float s = 1.0f / sqrtf(nf);
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* x * sigmoid(x) written as x / (1 + e^-x), which is what torch's CPU silu
 * computes; finite for every finite x (e^-x overflowing to inf gives -0). */
float ds4_silu(float x) { return x / (1.0f + expf(-x)); }

float ds4_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* torch.nn.functional.softplus (beta 1, threshold 20): x above the
 * threshold, else log1p(exp(x)). ggml's unary-ops.cpp op_softplus uses the
 * same threshold with logf(1 + expf(x)). */
float ds4_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

float ds4_softplus_ggml(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }
