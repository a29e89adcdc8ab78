/*
 * model.h — internal: a loaded model (config + tensors bound by name) and
 * the helpers the forward pass uses to read them.
 *
 * The loader (model.c) fills ds4_model; the forward pass (forward/, session.c)
 * only reads it. Tensors point into the GGUF mapping (never copied). Names and
 * shapes: qwen35-spec.md §2 (ggml order: ne[0] is the input/row length).
 */
#ifndef DS4_MODEL_H
#define DS4_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ds4.h"

/* One bound tensor. data == NULL means "absent" (optional tensors). A 2-D
 * weight {ne0 = in, ne1 = out} computes y = W x: row o is `row_bytes` bytes
 * at data + o*row_bytes. A 3-D expert tensor {in, out, n_expert} is n_expert
 * such matrices, expert e at data + e*expert_bytes. */
typedef struct {
    const char *name;      /* points into a static or model-owned string */
    int type;              /* ggml type id */
    int n_dims;
    int64_t ne[4];
    const uint8_t *data;
    size_t row_bytes;      /* bytes of one ne[0]-long row */
    size_t expert_bytes;   /* bytes of one ne[0] x ne[1] matrix */
} ds4_tensor;

typedef struct {
    int kind;              /* DS4_LAYER_* */
    ds4_tensor attn_norm, post_attention_norm;
    /* gated delta net (kind == GDN) */
    ds4_tensor attn_qkv, attn_gate, ssm_conv1d, ssm_dt_bias, ssm_a, ssm_beta, ssm_alpha,
        ssm_norm, ssm_out;
    /* gated attention (kind == ATTN or NEXTN) */
    ds4_tensor attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
    /* dense FFN (qwen35) */
    ds4_tensor ffn_gate, ffn_up, ffn_down;
    /* routed MoE (qwen35moe); gate/up either separate or fused gate_up */
    ds4_tensor ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_gate_up_exps, ffn_down_exps;
    ds4_tensor ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
    /* nextn head (kind == NEXTN). shared_head_norm is always filled: with
     * output_norm when the file has none (llama.cpp's fallback). */
    ds4_tensor nextn_eh_proj, nextn_enorm, nextn_hnorm, nextn_shared_head_norm;
    ds4_tensor nextn_embed_tokens, nextn_shared_head_head; /* optional */
} ds4_layer;

struct ds4_model {
    ds4_gguf *gguf;
    ds4_model_config cfg;
    ds4_model_params params;   /* resolved: precision, n_threads >= 1, n_ctx >= 1 */
    ds4_tensor token_embd, output_norm, output; /* output.data == NULL: tied */
    ds4_layer *layers;         /* n_layer_all entries */
    char *name_pool;           /* NUL-terminated tensor names that ds4_tensor.name points into */
    /* A draft_head file (model.c ds4_model_params.draft_head): its mapping
     * and names, which layers[n_main]'s slots point into. */
    ds4_gguf *head_gguf;
    char *head_name_pool;
    int nextn_source;          /* DS4_NEXTN_* bits (ds4.h ds4_model_nextn_source) */
};

/* The LM head matrix (output, or token_embd when tied). */
static inline const ds4_tensor *ds4_model_head(const ds4_model *m) {
    return m->output.data ? &m->output : &m->token_embd;
}

#endif
