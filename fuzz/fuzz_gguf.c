/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader.
 *
 * Opens the input with ds4_gguf_open_memory and, when it is accepted, walks
 * every kv and tensor the way a consumer would, checking the promises ds4.h
 * makes about an opened file: value/value_nbytes and tensor data lie inside
 * the buffer, array payloads parse to exactly value_nbytes, lookups by name
 * find the entry. A broken promise traps, which libFuzzer reports as a crash.
 * libFuzzer hands us a heap copy of exactly `size` bytes, so ASan flags any
 * read past the end.
 *
 * Build and run: `make fuzz` (see the Makefile).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds4.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

static volatile uint8_t sink;

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* Walk `count` elements of type t in [p, end); return the end of them. */
static const uint8_t *walk(const uint8_t *p, const uint8_t *end, int t, uint64_t count,
                           int depth) {
    static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    CHECK(depth <= DS4_GGUF_MAX_DEPTH);
    CHECK(t >= 0 && t <= DS4_GGUF_FLOAT64);
    for (uint64_t i = 0; i < count; i++) {
        if (t == DS4_GGUF_STRING) {
            CHECK(end - p >= 8);
            uint64_t n = rd64(p);
            p += 8;
            CHECK((uint64_t)(end - p) >= n);
            for (uint64_t k = 0; k < n; k++) sink ^= p[k];
            p += n;
        } else if (t == DS4_GGUF_ARRAY) {
            CHECK(end - p >= 12);
            int et = (int)rd32(p);
            uint64_t n = rd64(p + 4);
            p = walk(p + 12, end, et, n, depth + 1);
        } else {
            CHECK((uint64_t)(end - p) >= sz[t]);
            for (int k = 0; k < sz[t]; k++) sink ^= p[k];
            p += sz[t];
        }
    }
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds4_gguf *g = NULL;
    ds4_error err;
    int rc = ds4_gguf_open_memory(data, size, &g, &err);
    if (rc != DS4_OK) {
        CHECK(g == NULL);
        CHECK(err.code == rc && memchr(err.message, 0, sizeof err.message));
        CHECK(err.message[0] != 0);
        return 0;
    }
    const uint8_t *end = data + size;
    uint32_t v = ds4_gguf_version(g);
    CHECK(v == 2 || v == 3);
    uint64_t al = ds4_gguf_alignment(g);
    CHECK(al && (al & (al - 1)) == 0);
    uint64_t doff = ds4_gguf_data_offset(g);
    CHECK(doff % al == 0);
    CHECK(ds4_gguf_file_size(g) == size);

    int64_t n_kv = ds4_gguf_n_kv(g);
    for (int64_t i = 0; i < n_kv; i++) {
        ds4_gguf_kv kv;
        CHECK(ds4_gguf_get_kv(g, i, &kv, &err) == DS4_OK);
        const uint8_t *k = (const uint8_t *)kv.key;
        CHECK(k >= data && k <= end && kv.key_len <= (uint64_t)(end - k));
        CHECK(kv.value >= data && kv.value <= end && kv.value_nbytes <= (uint64_t)(end - kv.value));
        const uint8_t *vend = kv.value + kv.value_nbytes;
        if (kv.type == DS4_GGUF_ARRAY) {
            CHECK(walk(kv.value, vend, kv.array_type, kv.array_count, 1) == vend);
        } else if (kv.type == DS4_GGUF_STRING) {
            for (uint64_t j = 0; j < kv.value_nbytes; j++) sink ^= kv.value[j];
        } else {
            CHECK(kv.array_type == -1);
            CHECK(walk(kv.value, vend, kv.type, 1, 0) == vend);
        }
        /* lookup by name finds this entry (keys are unique), unless the key
         * holds a NUL and so cannot be named by a C string */
        if (!memchr(kv.key, 0, kv.key_len)) {
            char *name = malloc(kv.key_len + 1);
            CHECK(name);
            memcpy(name, kv.key, kv.key_len);
            name[kv.key_len] = 0;
            CHECK(ds4_gguf_find_kv(g, name) == i);
            free(name);
        }
    }
    CHECK(ds4_gguf_get_kv(g, n_kv, &(ds4_gguf_kv){0}, &err) == DS4_ERR_ARG);

    int64_t n_t = ds4_gguf_n_tensors(g);
    for (int64_t i = 0; i < n_t; i++) {
        ds4_gguf_tensor t;
        CHECK(ds4_gguf_get_tensor(g, i, &t, &err) == DS4_OK);
        CHECK(t.n_dims >= 1 && t.n_dims <= 4 && t.nbytes > 0);
        CHECK(t.offset % al == 0);
        CHECK(t.data == data + doff + t.offset);
        CHECK(t.data >= data && t.nbytes <= (uint64_t)(end - t.data));
        sink ^= t.data[0];
        sink ^= t.data[t.nbytes - 1];
        if (!memchr(t.name, 0, t.name_len)) {
            char *name = malloc(t.name_len + 1);
            CHECK(name);
            memcpy(name, t.name, t.name_len);
            name[t.name_len] = 0;
            CHECK(ds4_gguf_find_tensor(g, name) == i);
            free(name);
        }
    }
    CHECK(ds4_gguf_find_tensor(g, "\xff not a name") == -1);
    ds4_gguf_close(g);
    return 0;
}
