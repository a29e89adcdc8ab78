/*
 * ffn.c — the dense SwiGLU FFN (qwen35-spec.md §5): down(silu(gate x) * up x).
 */
#include "forward.h"
#include "../paths.h"

int64_t ds4_ffn_dense_work_per_row(const ds4_model_config *c) { return 2 * c->n_ff; }

void ds4_ffn_dense(ds4_fwd *f, const ds4_layer *L, int64_t n) {
    const int64_t E = f->c.n_embd, F = f->c.n_ff;
    float *g = f->work, *u = f->work + DS4_CHUNK_ROWS * F;
    ds4_mm_job jobs[2] = {
        ds4_mm(&L->ffn_gate, 0, 0, F, f->x, E, g, F, n),
        ds4_mm(&L->ffn_up, 0, 0, F, f->x, E, u, F, n),
    };
    ds4_matmul(f, jobs, 2);
    /* the kernel set's vectorised SiLU where it has one: the same bits as
     * the loop below (quants.h silu_mul) */
    if (ds4_paths_on())
        ds4_path_note(f->path_layer, "silu",
                      f->k->silu_mul ? "vectorised libm-exact expf (FFN, GDN conv and gate)"
                                     : "scalar loop, libm expf");
    if (f->k->silu_mul)
        f->k->silu_mul(g, g, u, n * F);
    else
        for (int64_t i = 0; i < n * F; i++) g[i] = ds4_silu(g[i]) * u[i];
    ds4_mm_job down = ds4_mm(&L->ffn_down, 0, 0, E, g, F, f->y, E, n);
    ds4_matmul(f, &down, 1);
}
