/*
 * nextn.h — internal: the nextn head's two-step call (forward/nextn.c), for
 * callers that must check and allocate before they change any state
 * (session.c primes the head inside an eval, a verify's accept or a
 * snapshot, none of which may fail half-way).
 */
#ifndef DS4_NEXTN_H
#define DS4_NEXTN_H

#include "forward.h"

/* What a head call computes for its rows (ds4.h DS4_NEXTN_OUT_*):
 *  KV:  the head's KV entries only. A row's K/V depend only on its input
 *       (eh_proj of [enorm(emb); hnorm(h)], attn_norm, attn_k/attn_v, the
 *       k norm and RoPE), not on the attention, FFN or LM head that follow,
 *       so priming rows whose results nobody reads skip all of those. The
 *       entries are bit for bit the ones a full call writes (the same
 *       functions on the same rows; -ffp-contract=off everywhere).
 *  ALL: logits and output hidden of every row as well (a draft step). */

/* Check rows at positions p0 .. p0+n-1 against the head (it exists, the
 * rows fit n_ctx, p0 continues or rewinds into the head's KV) and allocate
 * what running them needs: KV pages (copy-on-write of shared ones) and, for
 * DS4_NEXTN_OUT_ALL, result room. Changes no state a caller can observe. */
int ds4_nextn_prepare(ds4_fwd *f, int64_t p0, int64_t n, int out, ds4_error *err);
/* Run prepared rows (tokens checked by the caller); cannot fail. KV mode
 * leaves no results (ds4_session_nextn_logits/hidden show 0 rows) but does
 * not touch the last call's hidden buffer. */
/* ds4_nextn_eval (forward.h) with an output mode: checks every argument,
 * then prepare + run. */
int ds4_nextn_eval_out(ds4_fwd *f, const int32_t *tokens, const float *hiddens,
                       const int64_t *positions, int64_t n, int out, ds4_error *err);
void ds4_nextn_run(ds4_fwd *f, const int32_t *tokens, const float *hiddens, int64_t p0,
                   int64_t n, int out);

#endif /* DS4_NEXTN_H */
