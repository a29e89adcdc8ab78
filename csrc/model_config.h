/*
 * model_config.h — internal: reading and checking the metadata of a
 * qwen35 / qwen35moe GGUF (qwen35-spec.md §1). model.c binds the tensors.
 */
#ifndef DS4_MODEL_CONFIG_H
#define DS4_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "ds4.h"

/* Longest architecture prefix plus key suffix we build ("qwen35moe." + ...). */
#define DS4_MODEL_KEY_MAX 128

/* Read every qwen35* key of g into cfg and check that the values describe a
 * model this engine runs. Fills every field except n_vocab, tied_head and
 * fused_gate_up_exps, which come from the tensors (model.c). On success
 * *kinds is a malloc'ed array of cfg->n_layer_all DS4_LAYER_* values (the
 * caller frees it); on failure it is NULL and err names the key at fault. */
int ds4_model_config_read(const ds4_gguf *g, ds4_model_config *cfg, int **kinds,
                          ds4_error *err);

/* The architecture's key prefix ("qwen35" / "qwen35moe"). */
const char *ds4_model_arch_name(int arch);

/* Copy up to len bytes of s into out (cap bytes) as a quoted, printable
 * string for an error message: printable ASCII as is, other bytes as \xNN. */
void ds4_model_quote(char *out, size_t cap, const char *s, size_t len);

#endif
