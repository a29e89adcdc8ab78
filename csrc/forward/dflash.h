/*
 * dflash.h — the contract of the classic DFlash drafter (issue 14, item 4).
 *
 * Implemented by csrc/dflash_load.c (loader, validation), forward/dflash.c
 * (context KV and the block pass) and ds4py/dflash.py (binding, drafter);
 * public API in ds4.h (ds4_dflash_*). The drafter is a separate object
 * bound to a target model, and its context KV lives in a ds4_dflash_ctx
 * next to (not inside) the target session: the Python drafter feeds it the
 * taps of every committed row. training/dflash_model.py is the PyTorch
 * reference of the forward below. This comment is the contract, written
 * down from the sources named in brackets.
 *
 * Sources: z-lab/dflash dflash/model.py (DFlashDraftModel, dflash_generate,
 * extract_context_feature, Qwen3DFlashAttention) and model/dflash.py (the
 * older spec_generate loop) [zlab]; llama.cpp src/models/dflash.cpp,
 * src/llama-arch.cpp (tensor and key names) [llama]; shared/reference/
 * ds4-notes.md §4 "DFlash drafter" [ds4].
 *
 * ---------------------------------------------------------------- file --
 * general.architecture = "dflash". Keys (prefix "dflash."):
 *   version                 u32, optional (absent = 0). 0 and 1: classic
 *                           DFlash. 2: DFlash2 (grouped dynamic conv +
 *                           candidate selector) -> refuse: "DFlash2 drafters
 *                           are not supported". > 2: refuse [ds4]. A file
 *                           carrying conv_kernel_size / conv_group_size /
 *                           selector_rank / selector_top_k or the tensors
 *                           blk.N.attn_conv_base / ffn_conv_base /
 *                           selector_hidden is DFlash2 whatever its version
 *                           says -> refuse [llama, ds4].
 *   block_count             draft layers L.
 *   embedding_length        must equal the target's n_embd [ds4].
 *   feed_forward_length     SwiGLU width.
 *   attention.head_count, attention.head_count_kv, attention.key_length
 *                           (head_dim: even, and classic requires
 *                           n_head * head_dim == n_embd [ds4]).
 *   attention.layer_norm_rms_epsilon   every RMSNorm of the drafter.
 *   rope.freq_base          theta of the drafter's own RoPE.
 *   block_size              B: the width of one draft block INCLUDING the
 *                           anchor row; B - 1 drafts per pass [zlab].
 *   target_layers           u32 array, the target layers tapped, in concat
 *                           order. Version 0 files (llama.cpp's converter)
 *                           store them +1: id L is "the residual entering
 *                           0-based target layer L" = the output of layer
 *                           L-1, so subtract 1 [ds4, llama]; version 1
 *                           stores 0-based layer ids. After the shift each
 *                           must be a trunk layer 0 <= l < n_main.
 *   attention.sliding_window / attention.sliding_window_pattern /
 *   attention.full_layer / attention.causal: optional; the classic files
 *                           ds4 binds are non-causal, full attention. Refuse
 *                           any value that asks for a window or causal mask
 *                           until implemented (fail closed).
 *   tokenizer.ggml.mask_token_id  the MASK token (standard key, not a
 *                           dflash.* one) [llama]; must be < target n_vocab.
 * Tensors (no token_embd / output: the drafter SHARES the target's
 * embedding and LM head [zlab, llama]; a file with its own `output`/`d2t`
 * is a reduced-vocab export -> refuse):
 *   fc.weight               {n_taps * n_embd, n_embd}
 *   enc.output_norm.weight  {n_embd}  (hidden_norm, applied after fc)
 *   output_norm.weight      {n_embd}  (final norm)
 *   blk.i.attn_norm, attn_q {n_embd, n_head*hd}, attn_k {n_embd, n_kv*hd},
 *   attn_v {n_embd, n_kv*hd}, attn_output {n_head*hd, n_embd},
 *   attn_q_norm {hd}, attn_k_norm {hd}, ffn_norm {n_embd},
 *   ffn_gate / ffn_up {n_embd, n_ff}, ffn_down {n_ff, n_embd}.
 * No biases in the classic layout (a file with attn_*.bias is another
 * model -> refuse). RMSNorm weights are used as stored (Qwen3RMSNorm, no
 * "+1" offset, unlike the Qwen3.5 trunk's converted norms).
 *
 * ------------------------------------------------------------- forward --
 * Taps: for each committed target position p, c_p = concat over the taps
 * of the residual stream AFTER target layer l (before any final norm):
 * transformers' hidden_states[l + 1] [zlab extract_context_feature] ==
 * ds4_session_eval_layers / ds4_session_verify with layers = the taps
 * (csrc/ds4.h; already in the core and tested).
 * Context rows: x_p = RMSNorm(fc · c_p) * enc.output_norm.
 * Block at position S (the session holds [0, S); t_S is the last committed
 * token, not yet evaluated by the target): tokens [t_S, MASK x (B-1)] at
 * positions S..S+B-1; h = target token_embd rows of those tokens (times an
 * optional input embedding scale, default 1).
 * Each layer, block rows r:
 *   a = RMSNorm(h_r) * attn_norm
 *   q_r = per-head RMSNorm(attn_q a_r) * attn_q_norm, then RoPE at S+r
 *   K/V entries: the context rows' k = per-head RMSNorm(attn_k x_p) *
 *     attn_k_norm, RoPE at p, v = attn_v x_p -- computed once per position
 *     and KEPT across rounds (the persistent per-layer draft KV); the
 *     block rows' k/v from a_r the same way at S+r, used this pass only
 *     (the cache is cropped back to S afterwards [zlab _crop_to]).
 *   NOTE: context rows enter every layer as the SAME x_p (no per-layer
 *     norm of x; the layer's attn_norm applies to block rows only) [zlab].
 *   o_r = softmax over ALL entries (context [0, S) and the whole block, no
 *     causal mask, GQA group n_head / n_kv, scale 1/sqrt(hd)) · V
 *   h_r += attn_output o_r
 *   h_r += ffn_down(silu(ffn_gate f) * ffn_up f),  f = RMSNorm(h_r) * ffn_norm
 * Output: y_r = RMSNorm(h_r) * output_norm for r = 1..B-1; logits = the
 * TARGET's LM head (output.weight, or token_embd when tied) · y_r; the B-1
 * drafts are their argmax (lowest id on ties), probabilities softmax(logits)
 * when sampling. RoPE: NEOX rotate-half over the whole head_dim with
 * rope.freq_base [llama: legacy DFlash backbones are NeoX].
 *
 * ------------------------------------------------------------- rounds --
 * Round at S: the drafter's KV must hold context rows for [0, S) (fed from
 * the taps of the prompt at prefill, batched, and of the accepted rows of
 * each verify -- a verify of [t_S, d_1..d_k] that accepts m drafts commits
 * positions S..S+m, whose taps are the verify's rows 0..m: one batched
 * context call). Rejected positions never enter the context KV, so the
 * drafter needs no rollback beyond "context KV = committed positions",
 * which snapshots must carry like the nextn head's KV (nextn.c).
 * Admission is the same single decision as the nextn head's priming
 * (session.c): taps on from the start, or no DFlash drafting.
 *
 * ------------------------------------------------------------- tests --
 * A test-made random dflash GGUF (ds4py.gguf_writer) on the golden trunks;
 * an independent numpy reference of the forward above (from this contract,
 * not from the C); draft logits within a stated tolerance, proposed tokens
 * equal where the top-2 margin is clear; refusal tests for version 2,
 * conv/selector metadata, a bad target layer, n_embd mismatch, head_dim
 * parity, missing tensors (named).
 */
#ifndef DS4_DFLASH_H
#define DS4_DFLASH_H

#include <stdint.h>

#include "../ds4.h"
#include "../pool.h"

/* Drafter weights, dequantized to F32 at load (a drafter is a few MB; F32
 * keeps its forward one plain code path whatever the file's type). A
 * matrix {ne0 = in, ne1 = out} is out rows of in floats. */
typedef struct {
    float *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    float *ffn_norm, *gate, *up, *down;
} ds4_dflash_layer;

struct ds4_dflash {
    ds4_dflash_config cfg;
    const ds4_model *target;
    int64_t n_vocab, n_ctx;
    float *fc, *enc_norm, *out_norm;
    ds4_dflash_layer *layers;
    float *weights;            /* one allocation all the float pointers above point into */
};

#endif /* DS4_DFLASH_H */
