/* model.c — placeholder until the loader lands. */
#include "model.h"
#include "error.h"

int ds4_model_load(const char *path, const ds4_model_params *params, ds4_model **out,
                   ds4_error *err) {
    (void)path; (void)params; *out = 0;
    return ds4_fail(err, DS4_ERR_UNSUPPORTED, "model loading is not built yet");
}
void ds4_model_free(ds4_model *m) { (void)m; }
void ds4_model_get_config(const ds4_model *m, ds4_model_config *out) { *out = m->cfg; }
int ds4_model_layer_kind(const ds4_model *m, int64_t il) {
    return (il < 0 || il >= m->cfg.n_layer_all) ? -1 : m->layers[il].kind;
}
int64_t ds4_model_n_ctx(const ds4_model *m) { return m->params.n_ctx; }
int ds4_model_precision(const ds4_model *m) { return m->params.precision; }
