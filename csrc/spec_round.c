/* spec_round.c — the per-round steps of greedy speculative decoding with the
 * nextn head, in C so that a round costs the front O(1) calls instead of a
 * Python call, two numpy views and a vocabulary-wide argmax per draft step
 * (ds4py.spec.runner drives them; the policy stays in Python).
 *
 * Only the public session API is used (ds4_session_hidden, the nextn calls,
 * ds4_session_verify, ds4_session_logits): these functions add no state and
 * no rule of their own, so a round made of them is exactly the round the
 * Python front makes of the same calls (tests/test_spec.py compares them). */

#include <math.h>

#include "ds4.h"
#include "error.h"

/* Argmax of n floats, ties to the lowest id (strict >), as np.argmax and
 * ds4_greedy_loop; a NaN is refused (-1): a greedy choice on a broken row
 * would be silently wrong. */
static int64_t argmax_row(const float *x, int64_t n) {
    int64_t best = 0;
    float bv = x[0];
    if (isnan(bv)) return -1;
    for (int64_t v = 1; v < n; v++) {
        if (x[v] > bv) {
            bv = x[v];
            best = v;
        } else if (isnan(x[v])) {
            return -1;
        }
    }
    return best;
}

int ds4_spec_propose(const ds4_model *m, ds4_session *s, int32_t last, int64_t k, int32_t *out,
                     ds4_error *err) {
    if (!m || !s) return ds4_fail(err, DS4_ERR_ARG, "ds4_spec_propose: model or session is NULL");
    if (k < 1 || k >= DS4_VERIFY_MAX)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_spec_propose: k = %lld, must be in 1..%d",
                        (long long)k, DS4_VERIFY_MAX - 1);
    if (!out) return ds4_fail(err, DS4_ERR_ARG, "ds4_spec_propose: out is NULL");
    /* A draft from a head that missed part of the history would be a
     * guess from the wrong context: refuse rather than draft garbage. */
    if (!ds4_session_nextn_covered(s))
        return ds4_fail(err, DS4_ERR_ARG,
                        "ds4_spec_propose: the nextn head does not hold positions [1, %lld) "
                        "(no head, or tokens evaluated without head priming)",
                        (long long)ds4_session_n_past(s));
    int64_t rows = 0;
    const float *h = ds4_session_hidden(s, &rows);
    if (!h || rows < 1)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_spec_propose: the session has no last hidden row");
    /* Accept and a plain eval leave one row; an all-rows eval leaves the
     * last position's row at the end. */
    ds4_model_config cfg;
    ds4_model_get_config(m, &cfg);
    const int64_t n_embd = cfg.n_embd, vocab = cfg.n_vocab;
    h += (rows - 1) * n_embd;
    int64_t pos = ds4_session_n_past(s);
    int32_t tok = last;
    for (int64_t j = 0; j < k; j++) {
        /* Step 1 is (last, trunk hidden of pos-1) at pos; a head holding
         * rows past pos (drafts of an earlier round, a snapshot taken mid
         * round) is rewound there by the explicit position. Later steps
         * chain the head's own output hidden, which stays valid through
         * the next nextn call. */
        int rc = ds4_session_nextn_eval(s, &tok, h, &pos, 1, err);
        if (rc) return rc;
        int64_t nr = 0;
        const float *lg = ds4_session_nextn_logits(s, &nr);
        int64_t best = argmax_row(lg, vocab);
        if (best < 0)
            return ds4_fail(err, DS4_ERR_BAD_MODEL, "ds4_spec_propose: NaN in the head's logits");
        tok = (int32_t)best;
        out[j] = tok;
        h = ds4_session_nextn_hidden(s, &nr);
        pos++;
    }
    return ds4_ok(err);
}

int ds4_spec_verify_greedy(const ds4_model *m, ds4_session *s, const int32_t *tokens, int64_t n,
                           int32_t *argmax, ds4_error *err) {
    if (!m) return ds4_fail(err, DS4_ERR_ARG, "ds4_spec_verify_greedy: model is NULL");
    if (!argmax) return ds4_fail(err, DS4_ERR_ARG, "ds4_spec_verify_greedy: argmax is NULL");
    int rc = ds4_session_verify(s, tokens, n, NULL, 0, err);
    if (rc) return rc;
    int64_t rows = 0;
    const float *lg = ds4_session_logits(s, &rows);
    ds4_model_config cfg;
    ds4_model_get_config(m, &cfg);
    const int64_t vocab = cfg.n_vocab;
    for (int64_t r = 0; r < rows; r++) {
        int64_t best = argmax_row(lg + r * vocab, vocab);
        if (best < 0)
            return ds4_fail(err, DS4_ERR_BAD_MODEL,
                            "ds4_spec_verify_greedy: NaN logit in verify row %lld", (long long)r);
        argmax[r] = (int32_t)best;
    }
    return ds4_ok(err);
}
