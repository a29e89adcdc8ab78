/*
 * elementwise.h — the small glue kernels of the layer loop (gpu/host/runner.c):
 * the residual add, the FFN's SwiGLU, the attention output gate, and the
 * store of new K/V rows into the F16 shadow pages. One thread per element;
 * no barriers, no threadgroup memory. Each reproduces the CPU's expression
 * (csrc/forward/forward.c add_rows, ffn.c, attention.c) operation for
 * operation; only exp is the GPU's (docs/gpu.md, "Tolerances").
 */

/* y[i] += x[i] (forward.c add_rows). */
K_KERNEL(add_rows) {
    K_CHECK_TAG(add_rows);
    const k_u32 i = K_GX * K_TG_SIZE + K_TID;
    if (i >= p.n) return;
    K_ST(y, i, K_LD(y, i) + K_LD(x, i));
}

/* g[i] = SiLU(g[i]) * u[i], SiLU(x) = x / (1 + exp(-x)) (ffn.c, norm.c ds4_silu). */
K_KERNEL(swiglu) {
    K_CHECK_TAG(swiglu);
    const k_u32 i = K_GX * K_TG_SIZE + K_TID;
    if (i >= p.n) return;
    const float g = K_LD(gate, i);
    K_ST(gate, i, (g / (1.0f + k_exp(-g))) * K_LD(up, i));
}

/* a[t][h][d] *= sigmoid(qf[t][2h+1][d]): the gate half of each head's
 * attn_q output sits after the head's query (attention.c, "Output gate"). */
K_KERNEL(attn_gate) {
    K_CHECK_TAG(attn_gate);
    const k_u32 i = K_GX * K_TG_SIZE + K_TID;
    const k_u32 per_row = p.n_head * p.head_dim;
    if (i >= p.n_rows * per_row) return;
    const k_u32 t = i / per_row, h = i % per_row / p.head_dim, d = i % p.head_dim;
    const float g = K_LD(qf, t * p.qf_stride + (2u * h + 1u) * p.head_dim + d);
    K_ST(a, i, K_LD(a, i) * (1.0f / (1.0f + k_exp(-g))));
}

/* Rows t < n_rows of K and V (n_head_kv heads of head_dim floats, rows
 * src_stride apart) into the F16 pools at position pos0 + t: page
 * pages[pos / K_ATTN_BLOCK], laid out [n_head_kv][K_ATTN_BLOCK][head_dim]
 * as the CPU's KV pages (kv.c); fp16 by round-to-nearest-even like the
 * CPU's F16C store. One thread per (row, head, element) of K and of V. */
K_KERNEL(kv_store) {
    K_CHECK_TAG(kv_store);
    const k_u32 i = K_GX * K_TG_SIZE + K_TID;
    const k_u32 per_row = p.n_head_kv * p.head_dim;
    if (i >= p.n_rows * per_row) return;
    const k_u32 t = i / per_row, h = i % per_row / p.head_dim, d = i % p.head_dim;
    const k_u32 pos = p.pos0 + t, page = K_LD(pages, pos / K_ATTN_BLOCK);
    if (page >= p.n_pages) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 dst = ((page * p.n_head_kv + h) * K_ATTN_BLOCK + pos % K_ATTN_BLOCK) * p.head_dim + d;
    const k_u32 src = t * p.src_stride + h * p.head_dim + d;
    K_ST(kpool, dst, k_f2h(K_LD(k, src)));
    K_ST(vpool, dst, k_f2h(K_LD(v, src)));
}
