/*
 * plugin.c — the exported face of a GPU backend plugin (plugin.h): a thin
 * wrapper of the runner (runner.h) that owns the pieces the runner only
 * borrows (the core's model, the k_device), turns ds4_error into text and
 * serialises every call.
 *
 * Built once per device kind by gpu/tools/build_plugin.py: with
 * -DDS4_GPU_PLUGIN_CUDA it opens cuda/device.cu's device, else the
 * emulator's (gpu/emul/device_emul.c). Everything else in the .so is
 * compiled with -fvisibility=hidden; only the DS4_GPU_API functions below
 * are exported, so the plugin's private copy of the core cannot clash with
 * the Python extension's.
 */
#include "plugin.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ds4.h"
#include "../../csrc/error.h"
#include "runner.h"

#define DS4_GPU_API __attribute__((visibility("default")))

#ifdef DS4_GPU_PLUGIN_CUDA
#define DEVICE_KIND "cuda"
#else
#define DEVICE_KIND "emul"
#endif

/* One lock for the process: the emulator keeps its running fiber in
 * globals (emul.h) and the CUDA device has one stream and one error
 * buffer; a step must never interleave with another's kernels. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

struct ds4_gpu_model {
    ds4_model *m;
    k_device *dev;
    k_gpu_model *gm;
    int64_t n_vocab;
    int64_t sessions;  /* live sessions and snapshots (a snapshot's memory is */
    int64_t snapshots; /* the device's): the model is freed after the last (unheld) */
    int closed;        /* ds4_gpu_model_close was called */
};

struct ds4_gpu_session {
    ds4_gpu_model *g;
    k_runner *r;
};

struct ds4_gpu_snapshot {
    ds4_gpu_model *g;
    k_snapshot *sn;
};

/* Under the lock: the model has no holder left and was closed. */
static int unheld(const ds4_gpu_model *g) { return g->closed && g->sessions == 0 && g->snapshots == 0; }

static int fail(char *err, size_t cap, int code, const char *fmt, const char *detail) {
    if (err && cap) snprintf(err, cap, fmt, detail);
    return code;
}

/* The reason of a failed core/runner call, as the caller's text. */
static int pass_error(const ds4_error *e, char *err, size_t cap) {
    if (err && cap) snprintf(err, cap, "%s", e->message);
    return e->code ? e->code : DS4_ERR_INTERNAL;
}

static k_device *open_device(char *err, size_t cap) {
#ifdef DS4_GPU_PLUGIN_CUDA
    return k_device_cuda_open(err, cap);
#else
    k_device *d = k_device_emul_open();
    if (!d) fail(err, cap, DS4_ERR_NOMEM, "%s", "out of host memory for the emulator device");
    return d;
#endif
}

static void free_model(ds4_gpu_model *g) {
    k_gpu_model_close(g->gm);
    if (g->dev) g->dev->close(g->dev);
    ds4_model_free(g->m);
    free(g);
}

DS4_GPU_API int ds4_gpu_abi_version(void) { return DS4_GPU_ABI_VERSION; }

DS4_GPU_API const char *ds4_gpu_device_kind(void) { return DEVICE_KIND; }

DS4_GPU_API int ds4_gpu_verify_max(void) { return K_RUNNER_VERIFY_MAX; }

DS4_GPU_API const char *ds4_gpu_launch_note(void) {
#ifdef DS4_GPU_PLUGIN_CUDA
    return k_cuda_launch_note();
#else
    return "no early launches (the emulator runs one kernel at a time)";
#endif
}

DS4_GPU_API int ds4_gpu_probe(char *err, size_t cap) {
    pthread_mutex_lock(&lock);
    k_device *d = open_device(err, cap);
    if (d) d->close(d);
    pthread_mutex_unlock(&lock);
    return d ? DS4_OK : DS4_ERR_UNSUPPORTED;
}

DS4_GPU_API int ds4_gpu_model_open(const char *path, const char *draft_head, ds4_gpu_model **out, char *err,
                                   size_t cap) {
    if (!out) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_model_open: out is NULL");
    *out = NULL;
    if (!path) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_model_open: path is NULL");
    ds4_gpu_model *g = calloc(1, sizeof *g);
    if (!g) return fail(err, cap, DS4_ERR_NOMEM, "%s", "out of host memory");
    ds4_error e;
    /* One host thread: the runner uses the core only to dequantize
     * embedding rows and fill RoPE tables; the math runs on the device.
     * n_ctx here only sizes CPU sessions, which this model never makes. */
    ds4_model_params mp = {DS4_PRECISION_FAST, 1, 0, draft_head};
    int rc = ds4_model_load(path, &mp, &g->m, &e);
    if (rc) {
        free(g);
        return pass_error(&e, err, cap);
    }
    ds4_model_config c;
    ds4_model_get_config(g->m, &c);
    g->n_vocab = c.n_vocab;
    pthread_mutex_lock(&lock);
    g->dev = open_device(err, cap);
    if (!g->dev)
        rc = DS4_ERR_UNSUPPORTED;
    else if ((rc = k_gpu_model_open(g->dev, g->m, &g->gm, &e)))
        pass_error(&e, err, cap);
    pthread_mutex_unlock(&lock);
    if (rc) {
        free_model(g);
        return rc;
    }
    *out = g;
    return DS4_OK;
}

DS4_GPU_API void ds4_gpu_model_close(ds4_gpu_model *g) {
    if (!g) return;
    pthread_mutex_lock(&lock);
    g->closed = 1;
    if (unheld(g)) free_model(g);
    pthread_mutex_unlock(&lock);
}

DS4_GPU_API int64_t ds4_gpu_model_n_vocab(const ds4_gpu_model *g) { return g ? g->n_vocab : 0; }

DS4_GPU_API const char *ds4_gpu_model_device(const ds4_gpu_model *g) {
    return g && g->dev ? g->dev->name : DEVICE_KIND;
}

DS4_GPU_API uint64_t ds4_gpu_model_device_bytes(const ds4_gpu_model *g) {
    return g && g->gm ? k_gpu_model_device_bytes(g->gm) : 0;
}

DS4_GPU_API int ds4_gpu_session_new(ds4_gpu_model *g, int64_t n_ctx, ds4_gpu_session **out, char *err,
                                    size_t cap) {
    if (!out) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_session_new: out is NULL");
    *out = NULL;
    if (!g || g->closed) return fail(err, cap, DS4_ERR_ARG, "%s", "the GPU model is closed");
    ds4_gpu_session *s = calloc(1, sizeof *s);
    if (!s) return fail(err, cap, DS4_ERR_NOMEM, "%s", "out of host memory");
    ds4_error e;
    pthread_mutex_lock(&lock);
    int rc = k_runner_open(g->gm, n_ctx, &s->r, &e);
    if (!rc) g->sessions++;
    pthread_mutex_unlock(&lock);
    if (rc) {
        free(s);
        return pass_error(&e, err, cap);
    }
    s->g = g;
    *out = s;
    return DS4_OK;
}

DS4_GPU_API void ds4_gpu_session_free(ds4_gpu_session *s) {
    if (!s) return;
    pthread_mutex_lock(&lock);
    k_runner_close(s->r);
    ds4_gpu_model *g = s->g;
    free(s);
    g->sessions--;
    if (unheld(g)) free_model(g);
    pthread_mutex_unlock(&lock);
}

DS4_GPU_API int ds4_gpu_eval(ds4_gpu_session *s, const int32_t *tokens, int64_t n, int all_rows, float *logits,
                             int32_t *argmax, char *err, size_t cap) {
    return ds4_gpu_eval_hidden(s, tokens, n, all_rows, logits, argmax, NULL, err, cap);
}

DS4_GPU_API int ds4_gpu_eval_hidden(ds4_gpu_session *s, const int32_t *tokens, int64_t n, int all_rows,
                                    float *logits, int32_t *argmax, float *hidden, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_eval: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_eval_hidden(s->r, tokens, n, all_rows, logits, argmax, hidden, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_eval_taps(ds4_gpu_session *s, const int32_t *tokens, int64_t n, int all_rows,
                                  float *logits, int32_t *argmax, float *hidden, const int64_t *layers,
                                  int64_t n_layers, float *taps, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_eval_taps: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_eval_taps(s->r, tokens, n, all_rows, logits, argmax, hidden, layers, n_layers, taps, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_verify_taps(ds4_gpu_session *s, const int32_t *tokens, int64_t n, float *logits,
                                    int32_t *argmax, float *hidden, const int64_t *layers, int64_t n_layers,
                                    float *taps, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_verify_taps: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_verify_taps(s->r, tokens, n, logits, argmax, hidden, layers, n_layers, taps, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_verify(ds4_gpu_session *s, const int32_t *tokens, int64_t n, float *logits,
                               int32_t *argmax, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_verify: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_verify(s->r, tokens, n, logits, argmax, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_accept(ds4_gpu_session *s, int64_t k, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_accept: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_accept(s->r, k, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int64_t ds4_gpu_n_past(const ds4_gpu_session *s) { return s ? k_runner_n_past(s->r) : 0; }

DS4_GPU_API int64_t ds4_gpu_launches(const ds4_gpu_session *s) { return s ? k_runner_launches(s->r) : 0; }

DS4_GPU_API uint64_t ds4_gpu_session_device_bytes(const ds4_gpu_session *s) {
    return s ? k_runner_device_bytes(s->r) : 0;
}

DS4_GPU_API int ds4_gpu_last_logits(ds4_gpu_session *s, float *out, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_last_logits: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_last_logits(s->r, out, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_last_hidden(ds4_gpu_session *s, float *out, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_last_hidden: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_last_hidden(s->r, out, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_session_snapshot(ds4_gpu_session *s, ds4_gpu_snapshot **out, char *err, size_t cap) {
    if (!out) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_session_snapshot: out is NULL");
    *out = NULL;
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_session_snapshot: session is NULL");
    ds4_gpu_snapshot *sn = calloc(1, sizeof *sn);
    if (!sn) return fail(err, cap, DS4_ERR_NOMEM, "%s", "out of host memory");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_snapshot(s->r, &sn->sn, &e);
    if (!rc) s->g->snapshots++;
    pthread_mutex_unlock(&lock);
    if (rc) {
        free(sn);
        return pass_error(&e, err, cap);
    }
    sn->g = s->g;
    *out = sn;
    return DS4_OK;
}

DS4_GPU_API int ds4_gpu_session_restore(ds4_gpu_session *s, const ds4_gpu_snapshot *sn, char *err, size_t cap) {
    if (!s || !sn) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_session_restore: session or snapshot is NULL");
    if (sn->g != s->g)
        return fail(err, cap, DS4_ERR_ARG, "%s",
                    "snapshot was taken from a session of another model; a snapshot restores only into "
                    "sessions of the model it came from");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_restore(s->r, sn->sn, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API void ds4_gpu_snapshot_free(ds4_gpu_snapshot *sn) {
    if (!sn) return;
    pthread_mutex_lock(&lock);
    k_snapshot_free(sn->sn);
    ds4_gpu_model *g = sn->g;
    free(sn);
    g->snapshots--;
    if (unheld(g)) free_model(g);
    pthread_mutex_unlock(&lock);
}

DS4_GPU_API int64_t ds4_gpu_snapshot_n_past(const ds4_gpu_snapshot *sn) { return sn ? k_snapshot_n_past(sn->sn) : 0; }

DS4_GPU_API uint64_t ds4_gpu_snapshot_device_bytes(const ds4_gpu_snapshot *sn) {
    return sn ? k_snapshot_device_bytes(sn->sn) : 0;
}

DS4_GPU_API int ds4_gpu_snapshot_has_logits(const ds4_gpu_snapshot *sn) {
    return sn ? k_snapshot_has_logits(sn->sn) : 0;
}

DS4_GPU_API int64_t ds4_gpu_model_snapshots(const ds4_gpu_model *g) {
    return g && g->gm ? k_gpu_model_snapshots(g->gm) : 0;
}

DS4_GPU_API uint64_t ds4_gpu_model_snapshot_bytes(const ds4_gpu_model *g) {
    return g && g->gm ? k_gpu_model_snapshot_bytes(g->gm) : 0;
}

/* ------------------------------------------------ the nextn head -- */

DS4_GPU_API int ds4_gpu_model_has_nextn(const ds4_gpu_model *g) { return g && g->gm && k_gpu_model_has_nextn(g->gm); }

DS4_GPU_API const char *ds4_gpu_model_nextn_refusal(const ds4_gpu_model *g) {
    return g && g->gm ? k_gpu_model_nextn_refusal(g->gm) : "";
}

DS4_GPU_API int ds4_gpu_set_nextn_prime(ds4_gpu_session *s, int on, char *err, size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_set_nextn_prime: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_set_nextn_prime(s->r, on, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_nextn_prime(const ds4_gpu_session *s) { return s && k_runner_nextn_prime(s->r); }

DS4_GPU_API int ds4_gpu_nextn_covered(const ds4_gpu_session *s) { return s && k_runner_nextn_covered(s->r); }

DS4_GPU_API int ds4_gpu_nextn_propose(ds4_gpu_session *s, int32_t last, int64_t k, int32_t *out, char *err,
                                      size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_nextn_propose: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_nextn_propose(s->r, last, k, out, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_nextn_step(ds4_gpu_session *s, int32_t tok, int64_t j, float *logits, char *err,
                                   size_t cap) {
    if (!s) return fail(err, cap, DS4_ERR_ARG, "%s", "ds4_gpu_nextn_step: session is NULL");
    ds4_error e;
    pthread_mutex_lock(&lock);
    const int rc = k_runner_nextn_step(s->r, tok, j, logits, &e);
    pthread_mutex_unlock(&lock);
    return rc ? pass_error(&e, err, cap) : DS4_OK;
}

DS4_GPU_API int ds4_gpu_snapshot_nextn_covered(const ds4_gpu_snapshot *sn) {
    return sn && k_snapshot_nextn_covered(sn->sn);
}
