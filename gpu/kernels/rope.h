/*
 * rope.h — partial NEOX RoPE in place: for i < n_rot/2 the pair
 * (x[i], x[i + n_rot/2]) of every head of every row is rotated by the
 * row's (cos, sin) table entry i, as the CPU does it
 * (csrc/forward/attention.c rope: lo*c + (-hi)*s and hi*c + lo*s, no FMA),
 * so the result is bit-identical. One thread per pair. The tables come
 * from the host (csrc/forward/forward.c ds4_rope_tables): device sin/cos
 * are not libm's.
 */
K_KERNEL(rope_neox) {
    K_CHECK_TAG(rope_neox);
    if (p.n_rot % 2u || p.n_rot > p.head_dim) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 half = p.n_rot / 2u;
    const k_u32 idx = K_GX * K_TG_SIZE + K_TID;
    if (idx >= p.n_rows * p.n_heads * half) return; /* no barriers here */
    const k_u32 i = idx % half, h = idx / half % p.n_heads, row = idx / half / p.n_heads;
    const k_u32 base = row * p.stride + h * p.head_stride;
    const float lo = K_LD(x, base + i), hi = K_LD(x, base + i + half);
    const float c = K_LD(cs, row * half + i), s = K_LD(sn, row * half + i);
    K_ST(x, base + i, lo * c + (-hi) * s);
    K_ST(x, base + i + half, hi * c + lo * s);
}
