/*
 * runner.h — a dense Qwen3.5 trunk (qwen35) evaluated on a k_device: the
 * layer loop of csrc/forward/forward.c, kernel by kernel, with the weights
 * uploaded once and the session's KV pages (F16 shadow) and GDN states on
 * the device. The same code runs on CUDA (the H200) and under the emulator
 * (CI), so the loop a GPU runs is the loop CI checks.
 *
 * This increment (docs/gpu.md §7): eval of any number of rows (prefill in
 * chunks of K_MATVEC_MAX_ROWS, the GDN recurrence token by token), logits
 * of the last or every row, on-device argmax. Not yet: verify/accept
 * rollback, snapshots, the nextn head, MoE (refused at open), the hookup
 * behind ds4py.load(backend=...).
 */
#ifndef K_RUNNER_H
#define K_RUNNER_H

#include <stdint.h>

#include "../../csrc/ds4.h"
#include "device.h"

typedef struct k_runner k_runner;

/* Upload m's trunk weights to d and allocate a session's state for n_ctx
 * positions. Refuses (DS4_ERR_UNSUPPORTED, naming the tensor or the
 * feature) what has no GPU kernel yet: MoE, exact precision, a weight type
 * other than Q8_0 / Q4_K / Q5_K / Q6_K. The runner does not own d or m;
 * both must outlive it. */
int k_runner_open(k_device *d, const ds4_model *m, int64_t n_ctx, k_runner **out, ds4_error *err);
void k_runner_close(k_runner *r);

/* Rows tokens[0..n) at positions n_past.. ; then logits (n_vocab floats per
 * row; all rows with all_rows, else the last row only) into `logits`
 * unless NULL, and each such row's argmax (ties to the lowest id, as the
 * CPU) into `argmax` unless NULL. */
int k_runner_eval(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits,
                  int32_t *argmax, ds4_error *err);
int64_t k_runner_n_past(const k_runner *r);
/* Bytes of device memory the runner holds (weights, state, scratch). */
uint64_t k_runner_device_bytes(const k_runner *r);
/* Kernel launches of the last eval (the path report's count). */
int64_t k_runner_launches(const k_runner *r);

#endif
