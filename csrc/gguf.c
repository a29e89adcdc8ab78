/* gguf.c — GGUF reader (placeholder until the reader lands). */
#include "ds4.h"
#include "error.h"

int ds4_gguf_open(const char *path, ds4_gguf **out, ds4_error *err) {
    (void)path; *out = 0;
    return ds4_fail(err, DS4_ERR_UNSUPPORTED, "GGUF reader not built yet");
}
int ds4_gguf_open_memory(const void *data, uint64_t size, ds4_gguf **out, ds4_error *err) {
    (void)data; (void)size; *out = 0;
    return ds4_fail(err, DS4_ERR_UNSUPPORTED, "GGUF reader not built yet");
}
void ds4_gguf_close(ds4_gguf *g) { (void)g; }
uint32_t ds4_gguf_version(const ds4_gguf *g) { (void)g; return 0; }
uint64_t ds4_gguf_alignment(const ds4_gguf *g) { (void)g; return 0; }
uint64_t ds4_gguf_data_offset(const ds4_gguf *g) { (void)g; return 0; }
uint64_t ds4_gguf_file_size(const ds4_gguf *g) { (void)g; return 0; }
int64_t ds4_gguf_n_kv(const ds4_gguf *g) { (void)g; return 0; }
int64_t ds4_gguf_n_tensors(const ds4_gguf *g) { (void)g; return 0; }
int ds4_gguf_get_kv(const ds4_gguf *g, int64_t i, ds4_gguf_kv *out, ds4_error *err) {
    (void)g; (void)i; (void)out; return ds4_fail(err, DS4_ERR_UNSUPPORTED, "no reader");
}
int ds4_gguf_get_tensor(const ds4_gguf *g, int64_t i, ds4_gguf_tensor *out, ds4_error *err) {
    (void)g; (void)i; (void)out; return ds4_fail(err, DS4_ERR_UNSUPPORTED, "no reader");
}
int64_t ds4_gguf_find_kv(const ds4_gguf *g, const char *key) { (void)g; (void)key; return -1; }
int64_t ds4_gguf_find_tensor(const ds4_gguf *g, const char *name) { (void)g; (void)name; return -1; }
