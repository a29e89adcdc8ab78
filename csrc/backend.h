/*
 * backend.h — DESIGN HEADER (not compiled into the core yet): the seam where
 * a GPU backend plugs into sessions. docs/gpu.md explains it.
 *
 * The CPU forward pass (forward/) stays the reference; a backend is a table
 * of functions over opaque per-model and per-session state. session.c keeps
 * everything that is policy or bookkeeping (positions, snapshots' metadata,
 * nextn priming, verify/accept bookkeeping) and calls the backend for the
 * math and for the state that lives on the device. Every entry returns a
 * ds4_status and fills ds4_error; none prints or aborts.
 *
 * Invariants a backend must keep (DESIGN.md):
 *  - weights are uploaded (CUDA) or mapped (Metal: newBufferWithBytesNoCopy
 *    over the GGUF mmap, Apple unified memory) ONCE per model;
 *  - a session's KV lives on the device in pages of DS4_KV_PAGE positions
 *    (F16: the "shadow"), reference counted like the CPU's so snapshots
 *    share pages copy-on-write; its recurrent (GDN) state lives there too;
 *  - eval/verify/accept/snapshot/restore/hidden taps behave exactly as the
 *    CPU backend's (same API, same errors), results within the stated
 *    tolerances of the CPU's, and greedy speculative output equal to serial
 *    output ON THE SAME BACKEND (bit-exact batch invariance per backend);
 *  - no allocation per token on the decode path; greedy decoding copies back
 *    a token id (on-device argmax), not a vocabulary of logits, unless the
 *    caller asks for logits.
 */
#ifndef DS4_BACKEND_H
#define DS4_BACKEND_H

#include <stdint.h>

#include "ds4.h"
#include "model.h"

typedef enum {
    DS4_BACKEND_CPU = 0,
    DS4_BACKEND_METAL = 1,
    DS4_BACKEND_CUDA = 2,
} ds4_backend_kind;

typedef struct ds4_backend_model ds4_backend_model;     /* weights on the device */
typedef struct ds4_backend_session ds4_backend_session; /* KV pages + recurrent state */
typedef struct ds4_backend_snapshot ds4_backend_snapshot;

typedef struct {
    ds4_backend_kind kind;
    const char *name; /* "cpu", "metal", "cuda": DS4PY_PATHS reports say it per layer */

    /* 0 = usable here; else DS4_ERR_UNSUPPORTED and a reason ("no Metal
     * device", "CUDA driver too old"). load(backend="auto") takes the first
     * usable of metal, cuda, cpu. */
    int (*probe)(ds4_error *err);

    /* Upload/map every tensor once; refuse (fail closed) a tensor type or
     * shape with no GPU kernel, naming it, rather than run it wrong. */
    int (*model_load)(const ds4_model *m, ds4_backend_model **out, ds4_error *err);
    void (*model_free)(ds4_backend_model *bm);

    int (*session_new)(ds4_backend_model *bm, int64_t n_ctx, ds4_backend_session **out,
                       ds4_error *err);
    void (*session_free)(ds4_backend_session *s);

    /* Rows tokens[0..n) at positions pos0..: writes KV and recurrent state.
     * Outputs for rows >= out_row0: logits (or, with argmax_only, one token
     * id per row into argmax), the post-norm hidden, and the residual
     * stream after the layers in taps[0..n_taps) (hidden taps). Output
     * pointers are host memory the caller owns; a backend copies into them
     * at the end of the call (one copy, after the last kernel). */
    int (*eval)(ds4_backend_session *s, const int32_t *tokens, int64_t n, int64_t pos0,
                int64_t out_row0, float *logits, int32_t *argmax, int argmax_only,
                float *hidden, const int64_t *taps, int64_t n_taps, float *tap_out,
                ds4_error *err);

    /* Verify: eval of k+1 rows that keeps the recurrent state from before the
     * rows and records what accept needs; accept(k) keeps the first k rows
     * (KV positions past them are dropped, recurrent state replayed to row
     * k exactly as session.c does on the CPU). */
    int (*verify)(ds4_backend_session *s, const int32_t *tokens, int64_t n, int64_t pos0,
                  float *logits, int32_t *argmax, int argmax_only, ds4_error *err);
    int (*accept)(ds4_backend_session *s, int64_t k, ds4_error *err);

    /* Snapshots share KV pages (device refcounts) and copy recurrent state. */
    int (*snapshot)(ds4_backend_session *s, ds4_backend_snapshot **out, ds4_error *err);
    int (*restore)(ds4_backend_session *s, const ds4_backend_snapshot *snap, ds4_error *err);
    void (*snapshot_free)(ds4_backend_snapshot *snap);
    uint64_t (*snapshot_bytes)(const ds4_backend_snapshot *snap);
} ds4_backend;

/* The table of a kind, or NULL when this build has none (metal/metal_stub.c
 * builds: no Metal). Not implemented yet. */
const ds4_backend *ds4_backend_get(ds4_backend_kind kind);

#endif
