/*
 * runner.h — a dense Qwen3.5 trunk (qwen35) evaluated on a k_device: the
 * layer loop of csrc/forward/forward.c, kernel by kernel, with the weights
 * uploaded once and the session's KV pages (F16 shadow) and GDN states on
 * the device. The same code runs on CUDA (the H200) and under the emulator
 * (CI), so the loop a GPU runs is the loop CI checks.
 *
 * Now (docs/gpu.md §7): dense and routed-MoE trunks; eval of any number of
 * rows (prompts in chunks of K_RUNNER_PREFILL_CHUNK rows, all-rows evals in
 * chunks of K_RUNNER_CHUNK, through the GEMM; each GDN
 * layer's recurrence over a chunk in one gdn_seq launch), logits of the
 * last or every row, on-device argmax, verify/accept with exact rollback;
 * driven by gpu/tests/test_gpu_model.c and, through gpu/host/plugin.c, by
 * ds4py.load(backend=...); snapshot/restore (device copies of the whole
 * state); the post-norm hidden state; the nextn (MTP) head with its own KV,
 * primed from committed rows, and chained greedy drafts (runner_head.c).
 * Not yet: layer taps.
 */
#ifndef K_RUNNER_H
#define K_RUNNER_H

#include <stdint.h>

#include "../../csrc/ds4.h"
#include "device.h"

typedef struct k_gpu_model k_gpu_model;
typedef struct k_runner k_runner;
typedef struct k_snapshot k_snapshot;

/* Rows one verify may hold (the matvecs' widest shared weight read). */
#define K_RUNNER_VERIFY_MAX 16

/* Upload m's trunk weights to d, once for every session. Refuses
 * (DS4_ERR_UNSUPPORTED, naming the tensor or the feature) what has no GPU
 * kernel yet: exact precision, a weight type other than Q8_0 / Q4_K /
 * Q5_K / Q6_K. Does not own d or m; both must outlive it. */
int k_gpu_model_open(k_device *d, const ds4_model *m, k_gpu_model **out, ds4_error *err);
void k_gpu_model_close(k_gpu_model *g);
uint64_t k_gpu_model_device_bytes(const k_gpu_model *g);

/* A session on g: KV pages, GDN states and scratch for n_ctx positions. */
int k_runner_open(k_gpu_model *g, int64_t n_ctx, k_runner **out, ds4_error *err);
void k_runner_close(k_runner *r);

/* Rows tokens[0..n) at positions n_past.. ; then logits (n_vocab floats per
 * row; all rows with all_rows, else the last row only) into `logits`
 * unless NULL, and each such row's argmax (ties to the lowest id, as the
 * CPU) into `argmax` unless NULL. */
int k_runner_eval(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits,
                  int32_t *argmax, ds4_error *err);
/* k_runner_eval, and the post-final-norm hidden state of the same rows
 * (n_embd floats per row: what the LM head reads) into hidden unless NULL. */
int k_runner_eval_hidden(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits,
                         int32_t *argmax, float *hidden, ds4_error *err);
/* k_runner_eval_hidden plus layer taps: the residual stream after trunk
 * layers layers[0..n_layers) (each 0 <= l < n_main; repeats allowed) of
 * every row, rows x n_layers x n_embd floats into taps (csrc's
 * ds4_session_layer_hidden layout; what a DFlash drafter reads). Taps need
 * all_rows (DS4_ERR_ARG otherwise); n_layers == 0 is k_runner_eval_hidden. */
int k_runner_eval_taps(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits, int32_t *argmax,
                       float *hidden, const int64_t *layers, int64_t n_layers, float *taps, ds4_error *err);
/* Speculative decoding: verify evaluates n <= K_RUNNER_VERIFY_MAX rows
 * like an eval with all_rows (n_past advances by n) and remembers what
 * accept needs; accept(k), 1 <= k <= n, keeps the first k rows: n_past
 * becomes the verify's first position + k and the recurrent state is the
 * one k serial rows leave, bit for bit. Any eval in between ends the
 * verify. */
int k_runner_verify(k_runner *r, const int32_t *tokens, int64_t n, float *logits, int32_t *argmax,
                    ds4_error *err);
/* k_runner_verify plus, when not NULL, every row's post-final-norm hidden
 * state (n x n_embd, as k_runner_eval_hidden) and the rows' layer taps (as
 * k_runner_eval_taps). */
int k_runner_verify_taps(k_runner *r, const int32_t *tokens, int64_t n, float *logits, int32_t *argmax,
                         float *hidden, const int64_t *layers, int64_t n_layers, float *taps, ds4_error *err);
int k_runner_accept(k_runner *r, int64_t k, ds4_error *err);
int64_t k_runner_n_past(const k_runner *r);
/* Bytes of device memory the session and its model hold. */
uint64_t k_runner_device_bytes(const k_runner *r);
/* Kernel launches of the last eval (the path report's count). */
int64_t k_runner_launches(const k_runner *r);
/* The logits row of position n_past - 1 (n_vocab floats) into out: it
 * stays on the device after every eval, verify, accept and restore, even
 * when the call copied nothing back. DS4_ERR_ARG when there is none (no
 * row evaluated, or restored from a snapshot at position 0). */
int k_runner_last_logits(k_runner *r, float *out, ds4_error *err);
/* The same row's post-final-norm hidden state (n_embd floats). */
int k_runner_last_hidden(k_runner *r, float *out, ds4_error *err);

/* Snapshots: the session's whole state (n_past; per attention layer the
 * K/V pages holding positions [0, n_past); per GDN layer the conv and
 * recurrent state; the logits and post-norm hidden rows of position
 * n_past - 1) copied into one
 * device allocation (runner.c says why a device copy). Restore puts any
 * session of the same k_gpu_model back there, bit for bit: what follows is
 * what follows in a session that evaluated the same tokens. A snapshot is
 * never changed by restores (restore it any number of times) and must be
 * freed before its model is closed. Taken between a verify and its accept
 * it holds every verified row (as the eval of them: verify == serial) and
 * the session can still accept; a restore ends the target's pending
 * verify (accept then refuses). Restore refuses (DS4_ERR_ARG, nothing
 * changed) another model's snapshot or one longer than the session's
 * context; a device failure during it leaves the session part-written. */
int k_runner_snapshot(k_runner *r, k_snapshot **out, ds4_error *err);
int k_runner_restore(k_runner *r, const k_snapshot *sn, ds4_error *err);
void k_snapshot_free(k_snapshot *sn);
int64_t k_snapshot_n_past(const k_snapshot *sn);
/* Device bytes the snapshot holds. */
uint64_t k_snapshot_device_bytes(const k_snapshot *sn);
/* 1 when it keeps a logits and hidden row (n_past > 0). */
int k_snapshot_has_logits(const k_snapshot *sn);
/* Live snapshots of g's sessions, and the device bytes they hold. */
int64_t k_gpu_model_snapshots(const k_gpu_model *g);
uint64_t k_gpu_model_snapshot_bytes(const k_gpu_model *g);

/* The nextn (MTP) head (runner_head.c; the CPU's is csrc/forward/nextn.c,
 * the same rows and positions). 1 when g runs the model's head; 0 when the
 * model has none or the GPU cannot run it (the reason, else ""). */
int k_gpu_model_has_nextn(const k_gpu_model *g);
const char *k_gpu_model_nextn_refusal(const k_gpu_model *g);
/* Head priming (the CPU's ds4_session_set_nextn_prime): while on, every
 * row the trunk commits -- an eval's rows, a verify's accepted rows at
 * accept(k), or all of them at an eval right after the verify -- reaches
 * the head's KV in the same call, batched and KV-only (row p pairs token p
 * with the trunk's post-norm hidden of p - 1; position 0 has none).
 * Turning it on refuses (DS4_ERR_ARG) a session holding rows the head
 * never saw: it needs n_past == 0 or a restored snapshot that carries the
 * head's history (k_snapshot_nextn_covered). A priming session restores
 * only such snapshots. Off: nothing runs for the head. */
int k_runner_set_nextn_prime(k_runner *r, int on, ds4_error *err);
int k_runner_nextn_prime(const k_runner *r);
/* 1 when a draft at n_past can run: priming on, n_past >= 1, the head
 * holding [1, n_past) and no verify waiting for its accept. */
int k_runner_nextn_covered(const k_runner *r);
/* k (1 <= k < K_RUNNER_VERIFY_MAX) chained greedy drafts after `last`, the
 * token at n_past not yet evaluated (ds4_spec_propose's rows): step 1 is
 * (last, the trunk's hidden of n_past - 1) at n_past, step j > 1 (draft
 * j-1, the head's own output hidden of step j-1) at n_past + j - 1; each
 * draft is the argmax of the head's logits (ties: the lowest id). The
 * head's KV rows past n_past are replaced when the committed rows reach
 * it. DS4_ERR_ARG unless k_runner_nextn_covered. */
int k_runner_nextn_propose(k_runner *r, int32_t last, int64_t k, int32_t *out, ds4_error *err);
/* One step of a draft chain whose tokens the caller picks (sampled drafts):
 * step 0 is (tok, the trunk's hidden of n_past - 1) at n_past, step j > 0
 * (tok: the draft of step j - 1) chains the head's own output hidden at
 * n_past + j and is refused (DS4_ERR_ARG) unless it comes right after
 * step j - 1 (any eval, verify, accept, restore or snapshot in between
 * ends the chain). The step's logits (n_vocab floats) into logits. */
int k_runner_nextn_step(k_runner *r, int32_t tok, int64_t j, float *logits, ds4_error *err);
/* 1 when the snapshot carries the head's history of [1, n_past) (or holds
 * no position). */
int k_snapshot_nextn_covered(const k_snapshot *sn);

#endif
