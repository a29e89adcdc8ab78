/* session.c — placeholder until the forward pass lands. */
#include "model.h"
#include "error.h"

int ds4_session_new(ds4_model *m, ds4_session **out, ds4_error *err) {
    (void)m; *out = 0;
    return ds4_fail(err, DS4_ERR_UNSUPPORTED, "sessions are not built yet");
}
void ds4_session_free(ds4_session *s) { (void)s; }
int ds4_session_eval(ds4_session *s, const int32_t *tokens, int64_t n, int all_rows,
                     ds4_error *err) {
    (void)s; (void)tokens; (void)n; (void)all_rows;
    return ds4_fail(err, DS4_ERR_UNSUPPORTED, "sessions are not built yet");
}
const float *ds4_session_logits(const ds4_session *s, int64_t *n_rows) {
    (void)s; *n_rows = 0; return 0;
}
const float *ds4_session_hidden(const ds4_session *s, int64_t *n_rows) {
    (void)s; *n_rows = 0; return 0;
}
int64_t ds4_session_n_past(const ds4_session *s) { (void)s; return 0; }
