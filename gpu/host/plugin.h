/*
 * plugin.h — the GPU backend as a plugin shared library: the layer loop
 * (runner.c) + one k_device (CUDA or the emulator) + the C core it needs,
 * linked into one .so that Python opens with cffi's ABI mode
 * (ds4py/gpu_backend.py). Built on first use by gpu/tools/build_plugin.py
 * into a user cache, so `pip install` needs no CUDA toolkit.
 *
 * Why a plugin and not a part of the extension: the extension must build
 * everywhere without nvcc; the CUDA objects exist only where a toolkit
 * does. The plugin carries its own copy of the core (built with hidden
 * visibility, so nothing clashes with the extension's copy); only the
 * functions below are exported.
 *
 * Contract: every call returns a ds4_status (0 = DS4_OK) and, on failure,
 * writes a NUL-terminated reason into err[0..cap) — never prints, exits or
 * aborts. Calls are serialised by one process-wide lock: the emulator runs
 * its fibers on global state and the CUDA device uses one stream, so two
 * threads never interleave kernels of one step.
 *
 * Lifetimes: a session or a snapshot holds its model (the model is freed
 * when it and its last session and snapshot are closed); logits / argmax
 * pointers are the caller's memory, written before the call returns.
 */
#ifndef DS4_GPU_PLUGIN_H
#define DS4_GPU_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

/* --- cffi reads from here on --- */

/* Bumped whenever a signature below changes: Python refuses a plugin of
 * another version (a stale cache entry) instead of calling it wrong. */
#define DS4_GPU_ABI_VERSION 6

typedef struct ds4_gpu_model ds4_gpu_model;
typedef struct ds4_gpu_session ds4_gpu_session;
typedef struct ds4_gpu_snapshot ds4_gpu_snapshot;

int ds4_gpu_abi_version(void);
/* The device kind this plugin was built for: "cuda" or "emul". */
const char *ds4_gpu_device_kind(void);
/* 0 when a device can be opened here; else the reason (no CUDA device,
 * driver too old for the runtime, ...). Opens and closes it. */
int ds4_gpu_probe(char *err, size_t cap);
/* How kernels are launched, in words (CUDA: which start early, K_CUDA_PDL;
 * DS4PY_PATHS prints it). Meaningful once a model is open. */
const char *ds4_gpu_launch_note(void);

/* Load the GGUF at path (fast precision), open the device and upload the
 * trunk's weights once. Refuses (DS4_ERR_UNSUPPORTED, naming the tensor
 * or the feature) what the GPU layer loop cannot run: exact precision, a
 * weight type other than Q8_0 / Q4_K / Q5_K / Q6_K / Q4_64A (Q4_64A not as
 * routed experts). A nextn head the GPU cannot run leaves the trunk
 * running (ds4_gpu_model_nextn_refusal says why). draft_head: NULL, or a
 * standalone nextn head GGUF that runs as the model's head (the core's
 * ds4_model_params.draft_head: its structural checks refuse a full model
 * or a mis-shaped head here, naming the reason). */
int ds4_gpu_model_open(const char *path, const char *draft_head, ds4_gpu_model **out, char *err,
                       size_t cap);
void ds4_gpu_model_close(ds4_gpu_model *g);
int64_t ds4_gpu_model_n_vocab(const ds4_gpu_model *g);
/* The device's own name ("cuda", "emul"), and the bytes of weights on it. */
const char *ds4_gpu_model_device(const ds4_gpu_model *g);
uint64_t ds4_gpu_model_device_bytes(const ds4_gpu_model *g);

/* A session (KV pages, GDN state, scratch) for n_ctx positions. */
int ds4_gpu_session_new(ds4_gpu_model *g, int64_t n_ctx, ds4_gpu_session **out, char *err,
                        size_t cap);
void ds4_gpu_session_free(ds4_gpu_session *s);

/* Rows tokens[0..n) after n_past; logits (n_vocab floats per row: every
 * row with all_rows, else the last) into logits unless NULL, each such
 * row's argmax (ties to the lowest id) into argmax unless NULL. */
int ds4_gpu_eval(ds4_gpu_session *s, const int32_t *tokens, int64_t n, int all_rows,
                 float *logits, int32_t *argmax, char *err, size_t cap);
/* ds4_gpu_eval, and the post-final-norm hidden state of the same rows
 * (n_embd floats per row) into hidden unless NULL. */
int ds4_gpu_eval_hidden(ds4_gpu_session *s, const int32_t *tokens, int64_t n, int all_rows,
                        float *logits, int32_t *argmax, float *hidden, char *err, size_t cap);
/* ds4_gpu_eval_hidden plus layer taps: the residual stream after trunk
 * layers layers[0..n_layers) of every row (rows x n_layers x n_embd floats
 * into taps; needs all_rows), what a DFlash drafter reads (runner.h
 * k_runner_eval_taps). */
int ds4_gpu_eval_taps(ds4_gpu_session *s, const int32_t *tokens, int64_t n, int all_rows,
                      float *logits, int32_t *argmax, float *hidden, const int64_t *layers,
                      int64_t n_layers, float *taps, char *err, size_t cap);
/* Speculative decoding: verify 1..ds4_gpu_verify_max() rows (logits of
 * every row), then accept(k) keeps the first k exactly as k serial evals
 * would (runner.h). */
int ds4_gpu_verify(ds4_gpu_session *s, const int32_t *tokens, int64_t n, float *logits,
                   int32_t *argmax, char *err, size_t cap);
/* ds4_gpu_verify plus, where not NULL, every row's post-final-norm hidden
 * state (n x n_embd) and the rows' layer taps (as ds4_gpu_eval_taps). */
int ds4_gpu_verify_taps(ds4_gpu_session *s, const int32_t *tokens, int64_t n, float *logits,
                        int32_t *argmax, float *hidden, const int64_t *layers, int64_t n_layers,
                        float *taps, char *err, size_t cap);
int ds4_gpu_accept(ds4_gpu_session *s, int64_t k, char *err, size_t cap);
int ds4_gpu_verify_max(void);
int64_t ds4_gpu_n_past(const ds4_gpu_session *s);
/* Kernel launches of the last eval/verify/accept (the path report). */
int64_t ds4_gpu_launches(const ds4_gpu_session *s);
uint64_t ds4_gpu_session_device_bytes(const ds4_gpu_session *s);
/* The logits of position n_past - 1 (n_vocab floats) into out, from the
 * device: after a restore, or a step that copied back only its argmax.
 * DS4_ERR_ARG when the session holds none. */
int ds4_gpu_last_logits(ds4_gpu_session *s, float *out, char *err, size_t cap);
/* The same row's post-final-norm hidden state (n_embd floats). */
int ds4_gpu_last_hidden(ds4_gpu_session *s, float *out, char *err, size_t cap);

/* Snapshots (runner.h): the whole session state copied on the device;
 * restore into any session of the same model, any number of times. */
int ds4_gpu_session_snapshot(ds4_gpu_session *s, ds4_gpu_snapshot **out, char *err, size_t cap);
int ds4_gpu_session_restore(ds4_gpu_session *s, const ds4_gpu_snapshot *sn, char *err, size_t cap);
void ds4_gpu_snapshot_free(ds4_gpu_snapshot *sn);
int64_t ds4_gpu_snapshot_n_past(const ds4_gpu_snapshot *sn);
uint64_t ds4_gpu_snapshot_device_bytes(const ds4_gpu_snapshot *sn);
int ds4_gpu_snapshot_has_logits(const ds4_gpu_snapshot *sn);
/* Live snapshots of the model's sessions and the device bytes they hold. */
int64_t ds4_gpu_model_snapshots(const ds4_gpu_model *g);
uint64_t ds4_gpu_model_snapshot_bytes(const ds4_gpu_model *g);

/* The nextn (MTP) head (runner.h): 1 when the model's head runs on the
 * GPU; else 0, with the reason when the file has a head the GPU cannot
 * run ("" otherwise). */
int ds4_gpu_model_has_nextn(const ds4_gpu_model *g);
const char *ds4_gpu_model_nextn_refusal(const ds4_gpu_model *g);
/* Head priming: while on, every committed row reaches the head's KV
 * (refused for a session holding rows the head never saw). */
int ds4_gpu_set_nextn_prime(ds4_gpu_session *s, int on, char *err, size_t cap);
int ds4_gpu_nextn_prime(const ds4_gpu_session *s);
/* 1 when a draft at n_past can run (priming on, the head holding [1, n_past)). */
int ds4_gpu_nextn_covered(const ds4_gpu_session *s);
/* k chained greedy drafts after `last` (the token at n_past) into out[0..k). */
int ds4_gpu_nextn_propose(ds4_gpu_session *s, int32_t last, int64_t k, int32_t *out, char *err, size_t cap);
/* One step of a draft chain whose tokens the caller picks (sampled drafts;
 * runner.h k_runner_nextn_step): step j's logits (n_vocab floats). */
int ds4_gpu_nextn_step(ds4_gpu_session *s, int32_t tok, int64_t j, float *logits, char *err, size_t cap);
/* 1 when the snapshot carries the head's history. */
int ds4_gpu_snapshot_nextn_covered(const ds4_gpu_snapshot *sn);

#endif
