/* bench_loop.c — the core's own greedy decode loop, the baseline that
 * `make bench` (bench/bench_generate.py) holds ds4py.generate against.
 *
 * It uses only the public session API (ds4_session_eval, ds4_session_logits)
 * so that it costs exactly what a caller of the C API pays per token, with no
 * Python in between: the difference to ds4py.generate's greedy path is the
 * Python front's per-token overhead. */

#include <math.h>

#include "ds4.h"
#include "error.h"

int ds4_greedy_loop(const ds4_model *m, ds4_session *s, int32_t first, int64_t n, int32_t *out,
                    ds4_error *err) {
    if (!m || !s) return ds4_fail(err, DS4_ERR_ARG, "ds4_greedy_loop: model or session is NULL");
    if (n < 0) return ds4_fail(err, DS4_ERR_ARG, "ds4_greedy_loop: n = %lld < 0", (long long)n);
    if (n > 0 && !out) return ds4_fail(err, DS4_ERR_ARG, "ds4_greedy_loop: out is NULL");
    ds4_model_config cfg;
    ds4_model_get_config(m, &cfg);
    int32_t tok = first;
    for (int64_t i = 0; i < n; i++) {
        int rc = ds4_session_eval(s, &tok, 1, 0, err);
        if (rc != DS4_OK) return rc;
        int64_t rows = 0;
        const float *x = ds4_session_logits(s, &rows);
        if (!x || rows != 1)
            return ds4_fail(err, DS4_ERR_ARG, "ds4_greedy_loop: eval left %lld logit rows",
                            (long long)rows);
        /* Argmax, ties to the lowest id (strict >), as np.argmax and
         * llama.cpp's greedy sampler on unsorted logits. A NaN is refused,
         * not silently skipped: a greedy loop must not run on a broken row. */
        int64_t best = 0;
        float bv = x[0];
        if (isnan(bv)) return ds4_fail(err, DS4_ERR_BAD_MODEL, "ds4_greedy_loop: NaN logit (id 0)");
        for (int64_t v = 1; v < cfg.n_vocab; v++) {
            if (x[v] > bv) {
                bv = x[v];
                best = v;
            } else if (isnan(x[v])) {
                return ds4_fail(err, DS4_ERR_BAD_MODEL, "ds4_greedy_loop: NaN logit (id %lld)",
                                (long long)v);
            }
        }
        tok = (int32_t)best;
        out[i] = tok;
    }
    return ds4_ok(err);
}
