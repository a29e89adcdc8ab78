/*
 * test_gpu_model.c — a dense model's layer loop (gpu/host/runner.c) on the
 * emulator (built by `make gpu-model-bin`) or on CUDA (`make cuda-model`,
 * -DK_TEST_CUDA), driven by tests/test_gpu_model.py, which compares what it
 * writes with the CPU forward pass and with llama.cpp's golden logits.
 *
 *   test_gpu_model MODEL TOKENS.i32 OUT_PREFIX [N_GREEDY]
 *     OUT_PREFIX.prefill.f32  logits of every row, all tokens in one eval
 *     OUT_PREFIX.last.f32     the last row's logits from a prompt eval (only
 *                             that row wanted: the prefill chunks)
 *     OUT_PREFIX.decode.f32   logits of every row, one eval per token
 *     OUT_PREFIX.greedy.i32   N_GREEDY tokens decoded greedily after the
 *                             prompt with the on-device argmax (no logits
 *                             copied back)
 *     stdout: one JSON line (device bytes, launches per decode step)
 *   test_gpu_model --spec MODEL TOKENS.i32 N
 *     greedy speculative decoding (verify/accept, drafts right and wrong)
 *     against serial decoding on the same device, N tokens: one "SPEC"
 *     line; exit 1 unless every kept row's logits are the serial ones,
 *     bit for bit
 *   test_gpu_model --head MODEL TOKENS.i32 N OUT_PREFIX
 *     the nextn head (runner_head.c): greedy speculative decoding with the
 *     head's drafts (depths cycling 1..4) against serial decoding, N
 *     tokens; OUT_PREFIX.drafts.i32 holds one row per round (position,
 *     depth, 4 drafts, unused ones -1); the head primed in evals of
 *     1, 2, 3, ... rows drafts what it drafts primed in one eval; one
 *     "HEAD" line, exit 1
 *     unless the tokens are the serial ones and the drafts agree
 *   test_gpu_model --head-bench MODEL TOKENS.i32 N
 *     tok/s of serial greedy decoding (also with the head primed) and of
 *     speculative rounds at fixed depths 1..4 with the head's drafts, N
 *     tokens each after the prompt; one "HEADBENCH" line each
 *   test_gpu_model --bench MODEL CTX[,CTX...] STEPS
 *     per context: prefill CTX tokens, then STEPS greedy decode steps
 *     timed (argmax on device); one "BENCH" line per context.
 *   A model the GPU cannot run prints "REFUSED: <message>" and exits 3.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../csrc/ds4.h"
#include "../host/runner.h"

static k_device *open_device(void) {
#ifdef K_TEST_CUDA
    char err[512];
    k_device *d = k_device_cuda_open(err, sizeof err);
    if (!d) fprintf(stderr, "%s\n", err);
    return d;
#else
    return k_device_emul_open();
#endif
}

static int32_t *read_tokens(const char *path, int64_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    int32_t *t = malloc((size_t)bytes + 4);
    *n = bytes / 4;
    if (!t || fread(t, 4, (size_t)*n, f) != (size_t)*n) *n = -1;
    fclose(f);
    return t;
}

static int write_file(const char *prefix, const char *suffix, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, suffix);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const int ok = fwrite(p, 1, bytes, f) == bytes;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static k_gpu_model *gm; /* the weights on the device, shared by the sessions below */

static int load(const char *path, int64_t n_ctx, ds4_model **m, k_device **d, k_runner **r) {
    ds4_error err;
    ds4_model_params mp = {DS4_PRECISION_FAST, 1, n_ctx, NULL};
    if (ds4_model_load(path, &mp, m, &err)) {
        fprintf(stderr, "load: %s\n", err.message);
        return 2;
    }
    if (!(*d = open_device())) return 2;
    if (k_gpu_model_open(*d, *m, &gm, &err)) {
        printf("REFUSED: %s\n", err.message);
        return 3;
    }
    if (k_runner_open(gm, n_ctx, r, &err)) {
        fprintf(stderr, "session: %s\n", err.message);
        return 2;
    }
    return 0;
}

static int bench(const char *path, const char *ctx_list, int steps) {
    int64_t max_ctx = 0;
    for (const char *s = ctx_list; *s;) {
        const long v = strtol(s, (char **)&s, 10);
        if (v > max_ctx) max_ctx = v;
        if (*s == ',') s++;
    }
    ds4_model *m;
    k_device *d;
    k_runner *r;
    /* room for the prefill, the warm-up steps and the timed steps */
    const int64_t n_ctx = max_ctx + steps + 8;
    int rc = load(path, n_ctx, &m, &d, &r);
    if (rc) return rc;
    ds4_model_config c;
    ds4_model_get_config(m, &c);
    ds4_error err;
    for (const char *s = ctx_list; *s;) {
        const long ctx = strtol(s, (char **)&s, 10);
        if (*s == ',') s++;
        k_runner_close(r); /* a fresh session per context */
        if (k_runner_open(gm, n_ctx, &r, &err)) break;
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)(ctx > 0 ? ctx : 1));
        uint64_t x = 88172645463325252ull;
        for (long i = 0; i < ctx; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            toks[i] = (int32_t)(x % (uint64_t)c.n_vocab);
        }
        int32_t tok = 0;
        const double t0 = now_s();
        if (ctx > 0 && k_runner_eval(r, toks, ctx, 0, NULL, &tok, &err)) {
            fprintf(stderr, "prefill: %s\n", err.message);
            return 1;
        }
        const double t1 = now_s();
        for (int i = 0; i < 3; i++) /* warm-up */
            if (k_runner_eval(r, &tok, 1, 0, NULL, &tok, &err)) return 1;
#ifdef K_TEST_CUDA
        {
            char label[64]; /* prefill: the first PROF_MAX launches of each eval (cuda/device.cu) */
            snprintf(label, sizeof label, "ctx=%ld prefill+warmup", ctx);
            k_cuda_profile_print(label);
        }
#endif
#ifdef K_TEST_CUDA
        k_cuda_profiler_range(1);
#endif
        const double t2 = now_s();
        for (int i = 0; i < steps; i++)
            if (k_runner_eval(r, &tok, 1, 0, NULL, &tok, &err)) {
                fprintf(stderr, "decode: %s\n", err.message);
                return 1;
            }
        const double t3 = now_s();
#ifdef K_TEST_CUDA
        k_cuda_profiler_range(0);
#endif
        printf("BENCH device=%s ctx=%ld prefill_tok_s=%.1f decode_tok_s=%.2f launches_per_step=%lld "
               "device_mb=%.1f\n",
               d->name, ctx, ctx > 0 ? ctx / (t1 - t0) : 0.0, steps / (t3 - t2), (long long)k_runner_launches(r),
               k_runner_device_bytes(r) / 1e6);
#ifdef K_TEST_CUDA
        char label[64];
        snprintf(label, sizeof label, "ctx=%ld decode", ctx);
        k_cuda_profile_print(label);
        k_cuda_graph_stats(label);
#endif
        fflush(stdout);
        free(toks);
    }
    k_runner_close(r);
    k_gpu_model_close(gm);
    d->close(d);
    ds4_model_free(m);
    return 0;
}

/* Greedy speculative decoding against serial decoding on the same device:
 * the drafts are the serial continuation with every third one replaced
 * (so accepts of every length happen), depths cycling 1..7; every kept
 * row's logits must equal the serial row's bit for bit, and the tokens
 * must be the serial tokens. */
/* The prompt tokens of tok_path, and a session of the model at path with
 * room for them, n_gen tokens more and one verify (--spec, --head). */
static int load_run(const char *path, const char *tok_path, int n_gen, int32_t **toks, int64_t *n,
                    int64_t *n_ctx, ds4_model **m, k_device **d, k_runner **r) {
    *toks = read_tokens(tok_path, n);
    if (!*toks || *n <= 0 || n_gen < 1) return 2;
    *n_ctx = *n + n_gen + K_RUNNER_VERIFY_MAX + 1;
    return load(path, *n_ctx, m, d, r);
}

static int spec(const char *path, const char *tok_path, int n_gen) {
    int64_t n, n_ctx;
    int32_t *toks;
    ds4_model *m;
    k_device *d;
    k_runner *r;
    int rc = load_run(path, tok_path, n_gen, &toks, &n, &n_ctx, &m, &d, &r);
    if (rc) return rc;
    ds4_model_config c;
    ds4_model_get_config(m, &c);
    ds4_error err;
    const int64_t V = c.n_vocab;
    float *ref = malloc(sizeof(float) * (size_t)((n_gen + 1) * V));
    float *lg = malloc(sizeof(float) * (size_t)(K_RUNNER_VERIFY_MAX * V));
    int32_t *want = malloc(sizeof(int32_t) * (size_t)(n_gen + 1));
    int32_t am[K_RUNNER_VERIFY_MAX];
    /* serial: ref[i] = logits after the prompt and i generated tokens */
    if (k_runner_eval(r, toks, n, 0, ref, want, &err)) goto fail;
    for (int i = 0; i < n_gen; i++)
        if (k_runner_eval(r, &want[i], 1, 0, ref + (size_t)(i + 1) * V, &want[i + 1], &err)) goto fail;
    k_runner_close(r);
    if (k_runner_open(gm, n_ctx, &r, &err) || k_runner_eval(r, toks, n, 0, NULL, am, &err)) goto fail;
    /* have: generated tokens fed so far; last = want[have], fed next */
    int have = 0, rounds = 0, rows = 0, mismatches = 0, accepted_drafts = 0;
    int32_t last = am[0];
    if (last != want[0]) mismatches++;
    while (have < n_gen) {
        const int depth = 1 + rounds % 7;
        int32_t block[K_RUNNER_VERIFY_MAX];
        block[0] = last;
        for (int j = 1; j <= depth; j++) {
            const int idx = have + j < n_gen ? have + j : n_gen;
            block[j] = (rounds + j) % 3 == 0 ? (want[idx] + 1) % (int32_t)V : want[idx];
        }
        if (k_runner_verify(r, block, depth + 1, lg, am, &err)) goto fail;
        int keep = 1; /* row j's argmax is the token after block[j] */
        while (keep <= depth && am[keep - 1] == block[keep]) keep++;
        /* row j has seen block[0..j]: the serial state after have + j + 1 tokens */
        for (int j = 0; j < keep && have + j + 1 <= n_gen; j++) {
            rows++;
            if (memcmp(lg + (size_t)j * V, ref + (size_t)(have + j + 1) * V, sizeof(float) * (size_t)V))
                mismatches++;
            if (am[j] != want[have + j + 1]) mismatches++;
        }
        accepted_drafts += keep - 1;
        if (k_runner_accept(r, keep, &err)) goto fail;
        last = am[keep - 1];
        have += keep;
        rounds++;
        if (have < n_gen && last != want[have]) mismatches++;
    }
    printf("SPEC device=%s rounds=%d rows_compared=%d accepted_drafts=%d mismatches=%d\n", d->name, rounds, rows,
           accepted_drafts, mismatches);
    k_runner_close(r);
    k_gpu_model_close(gm);
    d->close(d);
    ds4_model_free(m);
    free(ref);
    free(lg);
    free(want);
    free(toks);
    return mismatches ? 1 : 0;
fail:
    fprintf(stderr, "spec: %s\n", err.message);
    return 1;
}

/* Greedy speculative decoding with the head's drafts from the prompt
 * toks[0..n) for n_gen tokens at `depth` (0: cycling 1..4) into got[];
 * drafts (6 int32 per round) into rec unless NULL. Returns rounds, or -1. */
static int head_decode(k_runner *r, const int32_t *toks, int64_t n, int n_gen, int depth, int32_t *got,
                       int32_t *rec, int *accepted, ds4_error *err) {
    int32_t am[K_RUNNER_VERIFY_MAX], block[K_RUNNER_VERIFY_MAX];
    if (k_runner_set_nextn_prime(r, 1, err) || k_runner_eval(r, toks, n, 0, NULL, am, err)) return -1;
    int have = 0, rounds = 0;
    *accepted = 0;
    got[0] = am[0];
    while (have < n_gen) {
        int d = depth ? depth : 1 + rounds % 4;
        if (d > n_gen - have) d = n_gen - have;
        block[0] = got[have];
        if (k_runner_nextn_propose(r, block[0], d, block + 1, err) || k_runner_verify(r, block, d + 1, NULL, am, err))
            return -1;
        if (rec) {
            int32_t *row = rec + 6 * rounds;
            row[0] = (int32_t)k_runner_n_past(r) - (d + 1);
            row[1] = d;
            for (int j = 0; j < 4; j++) row[2 + j] = j < d ? block[1 + j] : -1;
        }
        int keep = 1;
        while (keep <= d && am[keep - 1] == block[keep]) keep++;
        if (k_runner_accept(r, keep, err)) return -1;
        for (int j = 0; j < keep && have + 1 + j <= n_gen; j++) got[have + 1 + j] = am[j];
        *accepted += keep - 1;
        have += keep;
        rounds++;
    }
    return rounds;
}

static int head(const char *path, const char *tok_path, int n_gen, const char *prefix, int bench_mode) {
    int64_t n, n_ctx;
    int32_t *toks;
    ds4_model *m;
    k_device *d;
    k_runner *r;
    int rc = load_run(path, tok_path, n_gen, &toks, &n, &n_ctx, &m, &d, &r);
    if (rc) return rc;
    ds4_error err;
    if (!k_gpu_model_has_nextn(gm)) {
        printf("REFUSED: no nextn head on the GPU: %s\n", k_gpu_model_nextn_refusal(gm));
        return 3;
    }
    int32_t *want = malloc(sizeof(int32_t) * (size_t)(n + n_gen + 1));
    int32_t *got = malloc(sizeof(int32_t) * (size_t)(n_gen + 1));
    int32_t *rec = calloc((size_t)(6 * (n_gen + 1)), sizeof(int32_t));
    int accepted = 0, rounds = 0, mismatches = 0, variant = 0;
    /* serial greedy: want[0..n_gen] after the prompt */
    double t0 = now_s();
    if (k_runner_eval(r, toks, n, 0, NULL, want, &err)) goto fail;
    const double t1 = now_s();
    for (int i = 0; i < n_gen; i++)
        if (k_runner_eval(r, &want[i], 1, 0, NULL, &want[i + 1], &err)) goto fail;
    const double serial_s = now_s() - t1;
    if (bench_mode) {
        printf("HEADBENCH device=%s depth=0 tok_s=%.1f prefill_s=%.4f\n", d->name, n_gen / serial_s, t1 - t0);
        /* the same serial decoding with the head primed (what a drafting
         * session's plain steps pay for the head) */
        k_runner_close(r);
        if (k_runner_open(gm, n_ctx, &r, &err) || k_runner_set_nextn_prime(r, 1, &err) ||
            k_runner_eval(r, toks, n, 0, NULL, got, &err))
            goto fail;
        const double t2 = now_s();
        for (int i = 0; i < n_gen; i++)
            if (k_runner_eval(r, &got[i], 1, 0, NULL, &got[i + 1], &err)) goto fail;
        const double primed_s = now_s() - t2;
        for (int i = 0; i <= n_gen; i++) mismatches += got[i] != want[i];
        printf("HEADBENCH device=%s depth=0 primed tok_s=%.1f (%.1f us a step for the head's rows)\n", d->name,
               n_gen / primed_s, 1e6 * (primed_s - serial_s) / n_gen);
        for (int depth = 1; depth <= 4; depth++) {
            k_runner_close(r);
            if (k_runner_open(gm, n_ctx, &r, &err)) goto fail;
            t0 = now_s();
            rounds = head_decode(r, toks, n, n_gen, depth, got, NULL, &accepted, &err);
            if (rounds < 0) goto fail;
            const double s = now_s() - t0;
            for (int i = 0; i <= n_gen; i++) mismatches += got[i] != want[i];
            printf("HEADBENCH device=%s depth=%d tok_s=%.1f (incl. prefill) rounds=%d accepted=%d "
                   "acceptance=%.3f mismatches=%d\n", d->name, depth, n_gen / s, rounds, accepted,
                   accepted / (double)(rounds * depth), mismatches);
            fflush(stdout);
        }
    } else {
        k_runner_close(r);
        if (k_runner_open(gm, n_ctx, &r, &err)) goto fail;
        rounds = head_decode(r, toks, n, n_gen, 0, got, rec, &accepted, &err);
        if (rounds < 0) goto fail;
        for (int i = 0; i <= n_gen; i++) mismatches += got[i] != want[i];
        if (write_file(prefix, "drafts.i32", rec, sizeof(int32_t) * (size_t)(6 * rounds))) goto fail;
        /* priming batch invariance: the whole history in one eval, and token
         * by token, then the same drafts */
        int32_t dr[2][4];
        for (int pass = 0; pass < 2; pass++) {
            k_runner_close(r);
            if (k_runner_open(gm, n_ctx, &r, &err) || k_runner_set_nextn_prime(r, 1, &err)) goto fail;
            int32_t *all = malloc(sizeof(int32_t) * (size_t)(n + n_gen));
            memcpy(all, toks, sizeof(int32_t) * (size_t)n);
            memcpy(all + n, want, sizeof(int32_t) * (size_t)(n_gen));
            /* pass 0: one eval; pass 1: evals of 1, 2, 3, ... rows (one-row
             * matvecs and multi-row GEMMs, chunks starting anywhere) */
            for (int64_t i = 0, w = pass ? 1 : n + n_gen; i < n + n_gen; i += w, w++)
                if (k_runner_eval(r, all + i, i + w <= n + n_gen ? w : n + n_gen - i, 0, NULL, NULL, &err)) goto fail;
            free(all);
            if (k_runner_nextn_propose(r, want[n_gen], 4, dr[pass], &err)) goto fail;
        }
        variant = memcmp(dr[0], dr[1], sizeof dr[0]) != 0;
        printf("HEAD device=%s rounds=%d accepted_drafts=%d mismatches=%d priming_variant=%d\n", d->name, rounds,
               accepted, mismatches, variant);
    }
    k_runner_close(r);
    k_gpu_model_close(gm);
    d->close(d);
    ds4_model_free(m);
    free(want);
    free(got);
    free(rec);
    free(toks);
    return mismatches || variant ? 1 : 0;
fail:
    fprintf(stderr, "head: %s\n", err.message);
    return 1;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "--bench")) return bench(argv[2], argv[3], atoi(argv[4]));
    if (argc >= 5 && !strcmp(argv[1], "--spec")) return spec(argv[2], argv[3], atoi(argv[4]));
    if (argc >= 6 && !strcmp(argv[1], "--head")) return head(argv[2], argv[3], atoi(argv[4]), argv[5], 0);
    if (argc >= 5 && !strcmp(argv[1], "--head-bench")) return head(argv[2], argv[3], atoi(argv[4]), NULL, 1);
    if (argc < 4) {
        fprintf(stderr, "usage: test_gpu_model MODEL TOKENS.i32 OUT_PREFIX [N_GREEDY] | --bench MODEL CTXS STEPS\n");
        return 2;
    }
    int64_t n;
    int32_t *toks = read_tokens(argv[2], &n);
    if (!toks || n <= 0) {
        fprintf(stderr, "cannot read tokens from %s\n", argv[2]);
        return 2;
    }
    const int n_greedy = argc > 4 ? atoi(argv[4]) : 0;
    ds4_model *m;
    k_device *d;
    k_runner *r;
    int rc = load(argv[1], n + n_greedy + 1, &m, &d, &r);
    if (rc) return rc;
    ds4_model_config c;
    ds4_model_get_config(m, &c);
    ds4_error err;
    float *lg = malloc(sizeof(float) * (size_t)(n * c.n_vocab));
    int32_t *am = malloc(sizeof(int32_t) * (size_t)(n + n_greedy + 1));
    if (k_runner_eval(r, toks, n, 1, lg, am, &err) ||
        write_file(argv[3], "prefill.f32", lg, sizeof(float) * (size_t)(n * c.n_vocab))) {
        fprintf(stderr, "prefill: %s\n", err.message);
        return 1;
    }
    const int64_t prefill_launches = k_runner_launches(r);
    k_runner_close(r);
    if (getenv("K_TEST_PREFILL_ONLY")) { /* tests that compare one more GEMM path's prefill: nothing else */
        k_gpu_model_close(gm), d->close(d), ds4_model_free(m), free(lg), free(am), free(toks);
        return 0;
    }
    /* the same tokens as a prompt (only the last row's logits wanted): the
     * runner's prefill chunks (K_RUNNER_PREFILL_CHUNK rows, not the
     * all-rows eval's K_RUNNER_CHUNK), which must not change the bits */
    if (k_runner_open(gm, n + n_greedy + 1, &r, &err) || k_runner_eval(r, toks, n, 0, NULL, NULL, &err) ||
        k_runner_last_logits(r, lg, &err) || write_file(argv[3], "last.f32", lg, sizeof(float) * (size_t)c.n_vocab)) {
        fprintf(stderr, "prompt eval: %s\n", err.message);
        return 1;
    }
    k_runner_close(r);
    if (k_runner_open(gm, n + n_greedy + 1, &r, &err)) return 1;
    for (int64_t t = 0; t < n; t++)
        if (k_runner_eval(r, toks + t, 1, 0, lg + t * c.n_vocab, am + t, &err)) {
            fprintf(stderr, "decode row %lld: %s\n", (long long)t, err.message);
            return 1;
        }
    const int64_t step_launches = k_runner_launches(r);
    if (write_file(argv[3], "decode.f32", lg, sizeof(float) * (size_t)(n * c.n_vocab))) return 1;
    int32_t tok = am[n - 1];
    for (int i = 0; i < n_greedy; i++) {
        am[i] = tok;
        if (k_runner_eval(r, &tok, 1, 0, NULL, &tok, &err)) {
            fprintf(stderr, "greedy step %d: %s\n", i, err.message);
            return 1;
        }
    }
    if (n_greedy && write_file(argv[3], "greedy.i32", am, sizeof(int32_t) * (size_t)n_greedy)) return 1;
    printf("{\"device\": \"%s\", \"rows\": %lld, \"device_bytes\": %llu, \"prefill_launches\": %lld, "
           "\"launches_per_decode_step\": %lld}\n",
           d->name, (long long)n, (unsigned long long)k_runner_device_bytes(r), (long long)prefill_launches,
           (long long)step_launches);
    k_runner_close(r);
    k_gpu_model_close(gm);
    d->close(d);
    ds4_model_free(m);
    free(lg);
    free(am);
    free(toks);
    return 0;
}
