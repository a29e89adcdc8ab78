/*
 * moe_gemm.h — prefill's routed MoE with the rows grouped by expert
 * (table.h "grouped MoE"). moe_gate_up / moe_down (moe.h) give every
 * (token row, slot) pair its own dots, so a prefill chunk of n rows reads
 * each chosen expert's weights once per pair that chose it: about n k /
 * n_expert times per expert (8 for a 256-row chunk of a 256-expert, top-8
 * model), every read decoded for one activation row. Here:
 *
 *   moe_group    sorts the pairs by expert (ascending expert, each expert's
 *                pairs ascending) and cuts them into tiles of at most
 *                K_GEMM_TR pairs of one expert; the shared expert's pairs
 *                are one more "expert" (id n_expert);
 *   moe_gemm     the prefill GEMM's tile body (gemm.h k_gemm_*_tile) on a
 *                tile: the expert's weight rows read once for all its
 *                pairs, activation rows gathered through the order;
 *                gate and up (grid z = 2) into [g | u] rows, or down;
 *   moe_combine  moe_down's weighted sum of the k down rows and the gated
 *                shared row, in moe_down's order.
 *
 * Between them the host runs swiglu_quant (fused.h) over the [g | u] rows:
 * SiLU(g) * u in swiglu's expression (moe_gate_up's), quantized for the
 * down type as moe_down reads it.
 *
 * Numerics: the GEMM tile's value is the width-1 matvec's bit for bit
 * (gemm.h), and so is k_moe_dot's (moe.h), so every g, u and down value is
 * the per-pair kernels'; the SwiGLU and the combine are the same
 * expressions in the same order (no contraction on any target), so y is
 * moe_down's bit for bit whatever the grouping (tested: suite moe, a
 * grouped run against the per-pair run of the same rows). No value
 * crosses pairs: a row's result does not depend on the other rows of its
 * chunk, only the work does.
 */

K_KERNEL(moe_group) {
    K_CHECK_TAG(moe_group);
    K_TG_ARRAY(k_u16, ssel, K_MOE_GROUP_MAX_PAIRS); /* expert ids < K_MOE_MAX_EXPERTS */
    K_TG_ARRAY(k_u32, cnt, K_MOE_MAX_EXPERTS + 1);
    K_TG_ARRAY(k_u32, off, K_MOE_MAX_EXPERTS + 1);
    K_TG_ARRAY(k_u32, toff, K_MOE_MAX_EXPERTS + 2);
    const k_u32 ne = p.n_expert, nk = p.n_rows * p.k, TG = K_TG_SIZE, tid = K_TID;
    const k_u32 TR = p.tile_rows;
    if (ne == 0u || ne > K_MOE_MAX_EXPERTS || p.k == 0u || nk > K_MOE_GROUP_MAX_PAIRS || K_NGX != 1u || TR == 0u ||
        TR > K_MOE_TILE_MAX_ROWS || p.n_tiles < K_MOE_GROUP_TILES(p.n_rows, p.k, ne, p.shared, TR)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    for (k_u32 i = tid; i < nk; i += TG) {
        k_u32 e = K_LD(sel, i);
        if (e >= ne) {
            k_raise(status, K_ERR_SHAPE); /* the pair is dropped; the host fails the eval */
            e = 0xffffu;             /* no expert's id */
        }
        K_ST(ssel, i, (k_u16)e);
    }
    K_BARRIER();
    /* counts: thread e scans every pair (broadcast reads) */
    for (k_u32 e = tid; e <= ne; e += TG) {
        k_u32 c = 0u;
        if (e < ne) {
            for (k_u32 i = 0; i < nk; i++) c += (k_u32)K_LD(ssel, i) == e ? 1u : 0u;
        } else {
            c = p.shared ? p.n_rows : 0u;
        }
        K_ST(cnt, e, c);
    }
    K_BARRIER();
    if (tid == 0u) { /* exclusive prefix sums of pairs and tiles, expert order */
        k_u32 o = 0u, to = 0u;
        for (k_u32 e = 0; e <= ne; e++) {
            const k_u32 c = K_LD(cnt, e);
            K_ST(off, e, o);
            K_ST(toff, e, to);
            o += c;
            to += (c + TR - 1u) / TR;
        }
        K_ST(toff, ne + 1u, to);
    }
    K_BARRIER();
    for (k_u32 e = tid; e <= ne; e += TG) {
        const k_u32 c = K_LD(cnt, e), o = K_LD(off, e), to = K_LD(toff, e);
        if (e < ne) {
            k_u32 j = 0u;
            for (k_u32 i = 0; i < nk; i++)
                if ((k_u32)K_LD(ssel, i) == e) {
                    K_ST(order, o + j, i);
                    j++;
                }
        } else {
            for (k_u32 j = 0; j < c; j++) K_ST(order, o + j, nk + j);
        }
        for (k_u32 q = 0; q * TR < c; q++) {
            const k_u32 n = c - q * TR < TR ? c - q * TR : TR;
            K_ST(tiles, 2u * (to + q), e);
            K_ST(tiles, 2u * (to + q) + 1u, (o + q * TR) | (n << 16));
        }
    }
    for (k_u32 i = K_LD(toff, ne + 1u) + tid; i < p.n_tiles; i += TG) {
        K_ST(tiles, 2u * i, K_MOE_TILE_EMPTY);
        K_ST(tiles, 2u * i + 1u, 0u);
    }
}

/* What tile `tile` of matrix z asks of the threadgroup whose weight rows
 * start at wr0 (moe_gemm and moe_gemm_mma): what = 0 run it (the expert's
 * matrix at byte wbase of w, its type and shape, the row map of its pairs),
 * 1 nothing (past the tiles, an empty tile, or past the matrix's rows), 2 a
 * malformed tile (K_ERR_SHAPE: an expert id past n_expert, a shared tile
 * with no shared expert, a count of 0 or past tr). */
typedef struct {
    k_u32 what, type, n_in, n_out, wbase;
    k_gemm_map m;
} k_moe_tile;

K_FN k_moe_tile k_moe_gemm_tile(k_moe_gemm_params p, K_DEV_IN k_u32 *tiles, k_u32 tile, k_u32 z, k_u32 wr0, k_u32 tr) {
    k_moe_tile T;
    T.what = 1u, T.type = 0u, T.n_in = 0u, T.n_out = 0u, T.wbase = 0u;
    T.m.start = 0u, T.m.n = 0u, T.m.grouped = 1u, T.m.split = 0u, T.m.div = 1u, T.m.rb0 = 0u, T.m.base1 = 0u;
    T.m.rb1 = 0u, T.m.ystride = 0u, T.m.ybase = 0u;
    if (tile >= p.n_tiles) return T;
    const k_u32 e = K_LD(tiles, 2u * tile), word = K_LD(tiles, 2u * tile + 1u);
    if (e == K_MOE_TILE_EMPTY) return T;
    const k_u32 shared = e == p.n_expert, cnt = word >> 16, nk = p.n_rows * p.k;
    if (e > p.n_expert || (shared && p.n_out_sh == 0u) || cnt == 0u || cnt > tr) {
        T.what = 2u;
        return T;
    }
    const k_u32 type = shared ? (z ? p.ts1 : p.ts0) : (z ? p.t1 : p.t0);
    T.type = type, T.n_in = shared ? p.n_in_sh : p.n_in, T.n_out = shared ? p.n_out_sh : p.n_out;
    if (wr0 >= T.n_out) return T; /* past this matrix's rows */
    const k_u32 wbase = shared ? (z ? p.sbase1 : p.sbase0) : (z ? p.base1 + e * p.estride1 : p.base0 + e * p.estride0);
#ifdef PLANT_MOE_GEMM_NEXT_EXPERT /* planted fault (tests must turn red): the next expert's rows, in bounds */
    T.wbase = !shared && e + 1u < p.n_expert ? wbase + (z ? p.estride1 : p.estride0) : wbase;
#else
    T.wbase = wbase;
#endif
    T.m.start = word & 0xffffu, T.m.n = cnt, T.m.grouped = 1u, T.m.split = nk;
    if (p.down) { /* the pair's own row; the shared rows after the routed ones */
        T.m.div = 1u, T.m.rb0 = K_MOE_ACT_BYTES(type, p.n_in);
        T.m.base1 = nk * K_MOE_ACT_BYTES(type, p.n_in), T.m.rb1 = K_MOE_ACT_BYTES(type, p.n_in_sh);
    } else { /* token row t = P / k; the shared pair n_rows k + t reads row t */
        T.m.div = p.k, T.m.rb0 = K_MOE_ACT_BYTES(type, T.n_in), T.m.base1 = 0u, T.m.rb1 = T.m.rb0;
    }
    T.m.ystride = p.y_stride, T.m.ybase = z * p.y_zoff;
    T.what = 0u;
    return T;
}

K_KERNEL_BOUNDED(moe_gemm, K_GEMM_TG, 1) {
    K_CHECK_TAG(moe_gemm);
    K_TG_ARRAY(k_u32x4, xt, K_GEMM_TR * 32 * 3);
    const k_u32 sh = p.n_out_sh != 0u, nz = K_NGZ;
    const k_u32 nmax = p.n_out > p.n_out_sh ? p.n_out : p.n_out_sh;
    /* the types this launch reads: matrices z < nz, routed and shared */
    const int types_ok = K_MOE_TYPE_OK(p.t0) && (nz < 2u || K_MOE_TYPE_OK(p.t1)) &&
                         (!sh || (K_MOE_TYPE_OK(p.ts0) && (nz < 2u || K_MOE_TYPE_OK(p.ts1))));
    if (!types_ok || K_TG_SIZE != K_GEMM_TG || p.k == 0u || nz > (p.down ? 1u : 2u) ||
        K_NGX < p.n_tiles || K_NGY * K_GEMM_NSG * K_GEMM_TOS < nmax || p.y_stride < (nz - 1u) * p.y_zoff + nmax ||
        (p.base0 | p.estride0 | p.base1 | p.estride1 | p.sbase0 | p.sbase1) % 16u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_moe_tile T = k_moe_gemm_tile(p, tiles, K_GX, K_GZ, K_GY * K_GEMM_NSG * K_GEMM_TOS, K_GEMM_TR);
    if (T.what == 2u) k_raise(status, K_ERR_SHAPE);
    if (T.what != 0u) return; /* a whole threadgroup, before any barrier */
    const k_u32 type = T.type, n_in = T.n_in, n_out = T.n_out, wb = T.wbase;
    const k_gemm_map m = T.m;
    const k_u32 o0 = (K_GY * K_GEMM_NSG + K_SIMD) * K_GEMM_TOS;
    if (type == K_TYPE_Q8_0)
        k_gemm_q8_0_tile(w, wb, n_in, n_out, o0, xq8, order, m, y, xt, K_TID, K_LANE);
    else
        k_gemm_kq_tile(w, wb, type, n_in, n_out, o0, xqk, order, m, y, xt, K_TID, K_LANE);
}

K_KERNEL(moe_combine) {
    K_CHECK_TAG(moe_combine);
    if (p.k == 0u || p.d_stride < p.n_out || K_NGX * K_TG_SIZE < p.n_out || K_NGY < p.n_rows) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 o = K_GX * K_TG_SIZE + K_TID, t = K_GY;
    if (o >= p.n_out || t >= p.n_rows) return;
    float y = 0.0f;
    for (k_u32 s = 0; s < p.k; s++) { /* moe_down's order and expressions */
        const float d = K_LD(dn, (t * p.k + s) * p.d_stride + o);
        const float wv = K_LD(wt, t * (p.k + 1u) + s);
        y = s == 0u ? d * wv : y + d * wv;
    }
    if (p.shared) y = y + K_LD(wt, t * (p.k + 1u) + p.k) * K_LD(dn, (p.n_rows * p.k + t) * p.d_stride + o);
    K_ST(out, t * p.y_stride + o, y);
}
