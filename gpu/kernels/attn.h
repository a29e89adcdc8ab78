/*
 * attn.h — split-K decode / verify / prefill attention over the F16 KV shadow.
 *
 * The history a query row sees is cut into blocks of K_ATTN_BLOCK (= the
 * CPU's KV page) positions. attn_partials computes, per (query head, row,
 * block), the partial (m = max score, l = sum exp(s - m), acc = sum
 * exp(s - m) v); attn_merge folds a row's partials in ascending block order
 * with the online-softmax combine (the CPU's merge(), csrc/forward/attention.c).
 * A split is only which threadgroup computes which blocks: every partial is
 * the same float computation whatever the split count, and the merge order
 * is fixed, so the output is bit-identical for every split count and for
 * every verify width (tested), and the host may pick splits from the
 * context length freely (attn_plan.h).
 *
 * One threadgroup per (kv head x head split, split, group of query rows)
 * serves NQ = GS x rows query vectors (GS = G / head_split query heads of
 * its GQA group, group_rows query rows; NQ <= K_ATTN_MAX_QV) from one read
 * of each K and V row. Per block it streams the block's K rows, then its V
 * rows, through threadgroup memory in tiles of K_ATTN_TILE positions: every
 * thread copies 16-byte chunks (the next tile's are loaded into registers
 * while the current one is computed on), so the device loads are wide and
 * many are in flight, and the dependent chains below read threadgroup
 * memory, not L2.
 *  1. the NQ queries into threadgroup memory (once);
 *  per block:
 *  2. scores, per K tile: SIMD-group sg takes positions sg, sg + NSIMD, ...
 *     of the tile; lane l holds K elements d = l + 32 i (fp16 -> float) and
 *     adds their products with each query in ascending i into one partial
 *     dot per query; the butterfly sums the lanes; times scale;
 *  3. per query (SIMD-group v % NSIMD): max over the positions its row sees,
 *     then e = exp(s - max) written back over the scores, and their sum
 *     (lane-strided, butterfly);
 *  4. per V tile: thread (r, d), r = TID / head_dim below R = TG / head_dim
 *     (1 when head_dim exceeds the threadgroup: then d takes slices of
 *     K_TG_SIZE, each streaming the V tiles again), accumulates e * v over
 *     the positions its row sees in ascending order for queries r, r + R, ...
 *     and writes those partials after the last tile.
 * Every (query, position) score, every query's max and sum and every (query,
 * element) chain of step 4 is the same float computation whichever
 * threadgroup, thread, tile or row group runs it, so the partials do not
 * depend on head_split, group_rows, the threadgroup size or K_ATTN_TILE
 * either (tested); each chain step is k_attn_madd (one fused rounding).
 * The numerics differ from the CPU's F16 recipe (which keeps llama.cpp's F16
 * accumulator); docs/gpu.md derives the stated tolerance against an exact
 * reference.
 */

/* Positions per K/V tile (a divisor of K_ATTN_BLOCK, a multiple of 8):
 * TILE x K_ATTN_MAX_DIM halves of threadgroup memory. 32 on CUDA (16 KB
 * of the 48 KB a threadgroup may declare statically); 16 elsewhere, so that
 * queries, scores and tile stay within Apple GPUs' 32 KB. Only speed
 * depends on it. */
#ifndef K_ATTN_TILE
#ifdef __CUDACC__
#define K_ATTN_TILE 32u
#else
#define K_ATTN_TILE 16u
#endif
#endif
/* 16-byte chunks of the next tile a thread holds in registers while the
 * current tile is computed on (the rest, at small threadgroups, is copied
 * when stored): 2 covers a 32-position tile of head_dim 256 at 512 threads. */
#ifndef K_ATTN_STAGE_REGS
#define K_ATTN_STAGE_REGS 2u
#endif
/* K_ATTN_L2AHEAD 1: at the start of each block the threadgroup asks L2 for
 * that block's K and V rows (when it is the split's first) and the next
 * block's, one 32-byte sector per request, so the tile copies wait on L2
 * instead of HBM. A hint: no value depends on it. */
#ifndef K_ATTN_L2AHEAD
/* 1 since measured on the H200 2026-12-01 (two interleaved repetitions,
 * 0.8B Q8_0 bench shape, the untiled kernel): decode 417-417 / 408-412 /
 * 318-319 tok/s at ctx 512 / 4k / 32k without it, 462-469 / 456-462 /
 * 363-367 with it */
#define K_ATTN_L2AHEAD 1
#endif

/* L2 prefetch of the n halves of K and V rows at kb (16 halves = one
 * 32-byte sector a request), thread tid of tg. Thread ids are arguments:
 * Metal has them only as kernel parameters. */
K_FN void k_attn_prefetch_block(K_DEV_IN k_u16 *kpool, K_DEV_IN k_u16 *vpool, k_u32 kb, k_u32 n, k_u32 tid,
                                k_u32 tg) {
    for (k_u32 e = tid * 16u; e < n; e += tg * 16u) {
        K_PREFETCH(kpool, kb + e);
        K_PREFETCH(vpool, kb + e);
    }
}

/* Stage s of a block with nt tiles of `tile` positions (K_ATTN_TILE in
 * attn_partials, K_ATTN_WIDE_TILE in attn_partials_wide): K tile s for
 * s < nt, then V tile (s - nt) % nt (once per d slice). The tile's first 16-byte chunk in the
 * pool, its chunk count (rounded up: the last chunk may run into positions
 * past the block's length, inside the page, never used), and which pool. */
typedef struct {
    K_DEV_IN k_u32x4 *src;
    k_u32 n;
} k_attn_stage;
K_FN k_attn_stage k_attn_stage_tile(K_DEV_IN k_u16 *kpool, K_DEV_IN k_u16 *vpool, k_u32 kb, k_u32 len, k_u32 dh,
                                    k_u32 nt, k_u32 s, const k_u32 tile) {
    const k_u32 j = s < nt ? s : (s - nt) % nt, p0 = j * tile;
    const k_u32 tl = len - p0 < tile ? len - p0 : tile;
    k_attn_stage st;
    st.src = (K_DEV_IN k_u32x4 *)(s < nt ? kpool : vpool) + (kb + p0 * dh) / 8u;
    st.n = (tl * dh + 7u) / 8u;
    return st;
}
K_FN k_attn_stage k_attn_stage_of(K_DEV_IN k_u16 *kpool, K_DEV_IN k_u16 *vpool, k_u32 kb, k_u32 len, k_u32 dh,
                                  k_u32 nt, k_u32 s) {
    return k_attn_stage_tile(kpool, vpool, kb, len, dh, nt, s, K_ATTN_TILE);
}

/* The chunks tid, tid + tg, ... of stage st that a thread keeps in
 * registers (the first K_ATTN_STAGE_REGS of them). Arrays travel in
 * structs by value: a helper's pointer to thread memory would need
 * Metal's `thread` address space. */
typedef struct {
    k_u32x4 c[K_ATTN_STAGE_REGS];
} k_attn_regs;
K_FN k_attn_regs k_attn_stage_load(k_attn_stage st, k_u32 tid, k_u32 tg) {
    k_attn_regs reg;
    K_UNROLL for (k_u32 i = 0; i < K_ATTN_STAGE_REGS; i++) {
        const k_u32 c = tid + i * tg;
        if (c < st.n)
            reg.c[i] = K_LD(st.src, c);
        else
            reg.c[i].x = reg.c[i].y = reg.c[i].z = reg.c[i].w = 0u; /* never stored */
    }
    return reg;
}

/* The stage into the tile: the registers, then any chunks past them. */
K_FN void k_attn_stage_store(k_attn_stage st, k_attn_regs reg, K_TGM k_u32x4 *tile, k_u32 tid, k_u32 tg) {
    K_UNROLL for (k_u32 i = 0; i < K_ATTN_STAGE_REGS; i++) {
        const k_u32 c = tid + i * tg;
        if (c < st.n) K_ST(tile, c, reg.c[i]);
    }
    for (k_u32 c = tid + K_ATTN_STAGE_REGS * tg; c < st.n; c += tg) K_ST(tile, c, K_LD(st.src, c));
}

/* One step of a dot-product or V chain: a * b + acc with one rounding
 * (K_ATTN_FMA 1, the default since session 33: half the float
 * instructions of the two steps; H100, attn_partials_wide at 4096 tokens of
 * the 0.8B shape 984 -> 822 us a launch), or K_ATTN_FMA 0 the separate
 * product and add of every earlier build (other bits; the derived tolerance
 * covers both). Every attention kernel calls it, so decode, verify and
 * prefill keep one order. */
#ifndef K_ATTN_FMA
#define K_ATTN_FMA 1
#endif
K_FN float k_attn_madd(float acc, float a, float b) {
#if K_ATTN_FMA
    return k_fma(a, b, acc);
#else
    return acc + a * b;
#endif
}

/* Positions of block p0b that query row vis (it sees [0, vis)) sees. */
K_FN k_u32 k_attn_len(k_u32 vis, k_u32 p0b) {
    return vis <= p0b ? 0u : vis - p0b < K_ATTN_BLOCK ? vis - p0b : K_ATTN_BLOCK;
}

/* Step 2's reduction of 8 items: x[i] is lane `lane`'s partial dot of
 * item i (a position of the pair and a query of four). Returns, in every
 * lane, the full sum of item (lane >> 2) & 7: k_simd_sum's value (the
 * butterfly 16, 8, 4, 2, 1, every add joining the same two partial sums),
 * but the first three levels are transposed: at level m a lane keeps one
 * item of each pair (by bit m of its lane) and adds its partner's partial
 * of it, so 8 sums cost 7 + 2 shuffles instead of 8 x 5. */
typedef struct {
    float v[8];
} k_attn_items8;
K_FN float k_attn_sums8(k_attn_items8 x8, k_u32 lane) {
    const int b4 = (lane >> 4) & 1u, b3 = (lane >> 3) & 1u, b2 = (lane >> 2) & 1u;
    float y[4], z[2];
    K_UNROLL for (k_u32 i = 0; i < 4u; i++) {
        const float keep = b4 ? x8.v[i + 4u] : x8.v[i], send = b4 ? x8.v[i] : x8.v[i + 4u];
        y[i] = keep + k_shfl_xor(send, 16u);
    }
    K_UNROLL for (k_u32 i = 0; i < 2u; i++) {
        const float keep = b3 ? y[i + 2u] : y[i], send = b3 ? y[i] : y[i + 2u];
        z[i] = keep + k_shfl_xor(send, 8u);
    }
    const float keep = b2 ? z[1] : z[0], send = b2 ? z[0] : z[1];
    float u = keep + k_shfl_xor(send, 4u);
    u = u + k_shfl_xor(u, 2u);
    return u + k_shfl_xor(u, 1u);
}

/* Where a threadgroup is and what it serves (attn_partials' geometry). */
typedef struct {
    k_u32 G, GS, kvh, h0, t0, NQ, vis_last, b0, b1;
} k_attn_geom;

/* Positions of block p0b that query vector v (row v / GS of the group)
 * sees, and where its partial for block b starts in `part`. */
K_FN k_u32 k_attn_qlen(k_attn_partials_params p, k_attn_geom g, k_u32 v, k_u32 p0b) {
    return k_attn_len(p.pos0 + g.t0 + v / g.GS + 1u, p0b);
}
K_FN k_u32 k_attn_part_at(k_attn_partials_params p, k_attn_geom g, k_u32 v, k_u32 b, k_u32 dh) {
    return (((g.t0 + v / g.GS) * p.n_head + g.h0 + v % g.GS) * p.n_blocks + b) * (2u + dh);
}

/* Step 2's K elements of positions pl and pl + 1 (when two) of the tile
 * in threadgroup memory th: lane's d = lane + 32 i, as float (0 past dh). */
typedef struct {
    float k0[K_ATTN_MAX_DIM / 32u], k1[K_ATTN_MAX_DIM / 32u];
} k_attn_kpair;
K_FN k_attn_kpair k_attn_load_kpair(K_TGM k_u16 *th, k_u32 pl, int two, k_u32 dh, k_u32 lane) {
    k_attn_kpair kp;
    K_UNROLL for (k_u32 i = 0; i < K_ATTN_MAX_DIM / 32u; i++) {
        const k_u32 d = lane + 32u * i;
        kp.k0[i] = d < dh ? k_h2f(K_LD(th, pl * dh + d)) : 0.0f;
        kp.k1[i] = d < dh && two ? k_h2f(K_LD(th, (pl + 1u) * dh + d)) : 0.0f;
    }
    return kp;
}

/* The start of block b in the K/V pools (kv head g.kvh), and the L2
 * look-ahead (K_ATTN_L2AHEAD): the block itself when it is the split's
 * first, and the next block of the split. len: the positions of block b
 * the group's last row sees. */
K_FN k_u32 k_attn_block_start(k_attn_partials_params p, k_attn_geom g, K_DEV_IN k_u16 *kpool,
                              K_DEV_IN k_u16 *vpool, K_DEV_IN k_u32 *pages, k_u32 b, k_u32 len, k_u32 dh,
                              k_u32 tid, k_u32 tg) {
    const k_u32 kb = (K_LD(pages, b) * p.n_head_kv + g.kvh) * K_ATTN_BLOCK * dh;
    if (K_ATTN_L2AHEAD) {
        if (b == g.b0) k_attn_prefetch_block(kpool, vpool, kb, len * dh, tid, tg);
        if (b + 1u < g.b1)
            k_attn_prefetch_block(kpool, vpool, (K_LD(pages, b + 1u) * p.n_head_kv + g.kvh) * K_ATTN_BLOCK * dh,
                                  k_attn_len(g.vis_last, (b + 1u) * K_ATTN_BLOCK) * dh, tid, tg);
    }
    return kb;
}

/* Step 3 of the block at p0b: per query vector v (SIMD-group v % nsg) that
 * sees the block, the max m of its scores in S, then e = exp(s - m) written
 * back over them and their sum l (lane-strided, butterfly); (m, l) to ML. */
K_FN void k_attn_softmax_block(k_attn_partials_params p, k_attn_geom g, K_TGM float *S, K_TGM float *ML,
                               k_u32 p0b, k_u32 lane, k_u32 sg, k_u32 nsg) {
    for (k_u32 v = sg; v < g.NQ; v += nsg) {
        const k_u32 lv = k_attn_qlen(p, g, v, p0b);
        if (lv == 0u) continue; /* this row does not see the block */
        float m = K_NEG_INF;
        for (k_u32 pp = lane; pp < lv; pp += 32u) m = k_max2(m, K_LD(S, v * K_ATTN_BLOCK + pp));
        m = k_simd_max(m);
        float l = 0.0f;
        for (k_u32 pp = lane; pp < lv; pp += 32u) {
            const float e = k_exp(K_LD(S, v * K_ATTN_BLOCK + pp) - m);
            K_ST(S, v * K_ATTN_BLOCK + pp, e);
            l += e;
        }
        l = k_simd_sum(l);
        if (lane == 0u) {
            K_ST(ML, 2u * v, m);
            K_ST(ML, 2u * v + 1u, l);
        }
    }
}

/* Each query vector's (m, l) of block b into its partial (the acc part is
 * written by step 4). */
K_FN void k_attn_store_ml(k_attn_partials_params p, k_attn_geom g, K_DEV float *part, K_TGM float *ML, k_u32 b,
                          k_u32 p0b, k_u32 dh, k_u32 tid, k_u32 tg) {
    for (k_u32 v = tid; v < g.NQ; v += tg) {
        if (k_attn_qlen(p, g, v, p0b) == 0u) continue;
        const k_u32 o = k_attn_part_at(p, g, v, b, dh);
        K_ST(part, o, K_LD(ML, 2u * v));
        K_ST(part, o + 1u, K_LD(ML, 2u * v + 1u));
    }
}

/* One threadgroup's blocks b0..b1 (steps 1-4 of the header). head_dim dh
 * is an argument so that the kernel can call it with a constant 256 (the
 * real models' head_dim): inlined, its guards and index arithmetic fold
 * (ALU instructions were 43% of the issue slots with a runtime head_dim). */
K_FN void k_attn_partials_body(k_attn_partials_params p, K_DEV_IN float *q, K_DEV_IN k_u16 *kpool,
                               K_DEV_IN k_u16 *vpool, K_DEV_IN k_u32 *pages, K_DEV float *part, const k_u32 dh,
                               k_attn_geom g, K_TGM float *qs, K_TGM float *S, K_TGM float *ML,
                               K_TGM k_u32x4 *tile, k_u32 tid, k_u32 tg) {
    const k_u32 lane = tid & 31u, sg = tid >> 5, nsg = tg >> 5, GS = g.GS, NQ = g.NQ, t0 = g.t0;
    K_TGM k_u16 *th = (K_TGM k_u16 *)tile;

    /* query vector v = row v / GS, head v % GS */
    for (k_u32 e = tid; e < NQ * dh; e += tg) {
        const k_u32 v = e / dh, d = e % dh;
        K_ST(qs, v * dh + d, K_LD(q, (t0 + v / GS) * p.q_stride + (g.h0 + v % GS) * p.q_head_stride + d));
    }

    /* step 4's place: thread row r (queries r, r + R, ...), element d of each d slice */
    const k_u32 R = tg >= dh ? tg / dh : 1u;
    const k_u32 r = tg >= dh ? tid / dh : 0u, dt = tg >= dh ? tid % dh : tid;
    const k_u32 n_slice = tg >= dh ? 1u : (dh + tg - 1u) / tg;

    for (k_u32 b = g.b0; b < g.b1; b++) {
        const k_u32 p0b = b * K_ATTN_BLOCK;
        const k_u32 len = k_attn_len(g.vis_last, p0b); /* the group's longest: its last row's */
        const k_u32 kb = k_attn_block_start(p, g, kpool, vpool, pages, b, len, dh, tid, tg);
        const k_u32 nt = (len + K_ATTN_TILE - 1u) / K_ATTN_TILE, n_stage = nt * (1u + n_slice);
        k_attn_regs reg = k_attn_stage_load(k_attn_stage_of(kpool, vpool, kb, len, dh, nt, 0u), tid, tg);
        /* The per-query loops run to the constant K_ATTN_MAX_QV with a
         * v < NQ guard, so part and acc[] stay in registers (indexed by a
         * runtime bound they spilled to local memory on CUDA: 350 us per
         * block on the H200); the float operations are the same. */
        for (k_u32 s = 0; s < nt; s++) { /* the K tiles: step 2 */
            const k_u32 tp0 = s * K_ATTN_TILE, tl = len - tp0 < K_ATTN_TILE ? len - tp0 : K_ATTN_TILE;
            K_BARRIER(); /* the tile's readers of the previous stage are done */
            k_attn_stage_store(k_attn_stage_of(kpool, vpool, kb, len, dh, nt, s), reg, tile, tid, tg);
#ifndef PLANT_MISSING_BARRIER
            K_BARRIER();
#endif
            reg = k_attn_stage_load(k_attn_stage_of(kpool, vpool, kb, len, dh, nt, s + 1u), tid, tg);
            /* positions pl, pl + 1 per pass (uniform per SIMD-group); each
             * query's K element loads serve both */
            for (k_u32 pl = 2u * sg; pl < tl; pl += 2u * nsg) {
                const int two = pl + 1u < tl;
                const k_attn_kpair kp = k_attn_load_kpair(th, pl, two, dh, lane);
                for (k_u32 vh = 0; vh < NQ; vh += 4u) { /* queries vh .. vh + 3 */
                    k_attn_items8 x;
                    K_UNROLL for (k_u32 u = 0; u < 4u; u++) {
                        float a0 = 0.0f, a1 = 0.0f;
                        if (vh + u < NQ)
                            K_UNROLL for (k_u32 i = 0; i < K_ATTN_MAX_DIM / 32u; i++) {
                                const k_u32 d = lane + 32u * i;
                                if (d < dh) {
                                    const float qv = K_LD(qs, (vh + u) * dh + d);
                                    a0 = k_attn_madd(a0, kp.k0[i], qv);
                                    a1 = k_attn_madd(a1, kp.k1[i], qv);
                                }
                            }
                        x.v[u] = a0, x.v[4u + u] = a1;
                    }
                    const float sum = k_attn_sums8(x, lane);
                    const k_u32 item = (lane >> 2) & 7u, j = item >> 2, v = vh + (item & 3u);
                    if ((lane & 3u) == 0u && v < NQ && (j == 0u || two))
                        K_ST(S, v * K_ATTN_BLOCK + tp0 + pl + j, sum * p.scale);
                }
            }
        }
        K_BARRIER(); /* every score of the block written */
        k_attn_softmax_block(p, g, S, ML, p0b, lane, sg, nsg); /* step 3 */
        /* positions every row of the group sees: its first row's (row t0 + i
         * sees i more, so only the last block's last few positions differ) */
        const k_u32 lmin = k_attn_len(p.pos0 + t0 + 1u, p0b);
        for (k_u32 sl = 0; sl < n_slice; sl++) { /* the V tiles, per d slice: step 4 */
            const k_u32 d = sl * tg + dt;
            float acc[K_ATTN_MAX_QV];
            K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_QV; k++) acc[k] = 0.0f;
            for (k_u32 j = 0; j < nt; j++) {
                const k_u32 s = nt + sl * nt + j;
                const k_u32 tp0 = j * K_ATTN_TILE, tl = len - tp0 < K_ATTN_TILE ? len - tp0 : K_ATTN_TILE;
                K_BARRIER(); /* the tile's readers of the previous stage are done (and, first, S's writers) */
                k_attn_stage_store(k_attn_stage_of(kpool, vpool, kb, len, dh, nt, s), reg, tile, tid, tg);
                K_BARRIER();
                if (s + 1u < n_stage) reg = k_attn_stage_load(k_attn_stage_of(kpool, vpool, kb, len, dh, nt, s + 1u), tid, tg);
                if (r >= R || d >= dh) continue;
                if (tl == K_ATTN_TILE && tp0 + K_ATTN_TILE <= lmin) {
                    /* a whole tile every row sees: no per-query length, and
                     * runs of 8 positions unrolled (loads ahead of the adds) */
                    for (k_u32 pl0 = 0; pl0 < K_ATTN_TILE; pl0 += 8u)
                        K_UNROLL for (k_u32 u = 0; u < 8u; u++) {
                            const float vv = k_h2f(K_LD(th, (pl0 + u) * dh + d));
                            K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_QV; k++) {
                                if (r + k * R >= NQ) break;
                                acc[k] = k_attn_madd(acc[k], K_LD(S, (r + k * R) * K_ATTN_BLOCK + tp0 + pl0 + u), vv);
                            }
                        }
                    continue;
                }
                for (k_u32 pl = 0; pl < tl; pl++) {
                    const k_u32 pb = tp0 + pl;
                    const float vv = k_h2f(K_LD(th, pl * dh + d));
                    K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_QV; k++) {
                        const k_u32 v = r + k * R;
                        if (v >= NQ) break;
                        if (pb < lmin || pb < k_attn_qlen(p, g, v, p0b)) /* each query's own length */
                            acc[k] = k_attn_madd(acc[k], K_LD(S, v * K_ATTN_BLOCK + pb), vv);
                    }
                }
            }
            if (r < R && d < dh)
                K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_QV; k++) {
                    const k_u32 v = r + k * R;
                    if (v >= NQ) break;
                    if (k_attn_qlen(p, g, v, p0b) == 0u) continue;
                    const k_u32 o = k_attn_part_at(p, g, v, b, dh);
                    K_ST(part, o + 2u + d, acc[k]);
                }
        }
        k_attn_store_ml(p, g, part, ML, b, p0b, dh, tid, tg);
    }
}

/* Launch bound: at most K_ATTN_BOUND_TG threads, so ptxas caps registers
 * at 65536 / K_ATTN_BOUND_TG: 1024 keeps 64 (two threadgroups of 512 an
 * SM); 512 lets it take 109 (one). Only speed depends on it. */
#ifndef K_ATTN_BOUND_TG
#define K_ATTN_BOUND_TG 1024
#endif
K_KERNEL_BOUNDED(attn_partials, K_ATTN_BOUND_TG, 1) {
    K_CHECK_TAG(attn_partials);
    const k_u32 dh = p.head_dim, hs = p.head_split, rg = p.group_rows;
    if (p.n_head_kv == 0u || p.n_head % p.n_head_kv || p.n_head / p.n_head_kv > K_ATTN_MAX_GROUP ||
        dh == 0u || dh > K_ATTN_MAX_DIM || p.blocks_per_split == 0u || hs == 0u ||
        (p.n_head / p.n_head_kv) % hs || rg == 0u || (p.n_head / p.n_head_kv / hs) * rg > K_ATTN_MAX_QV) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    k_attn_geom g;
    g.G = p.n_head / p.n_head_kv, g.GS = g.G / hs;
    g.kvh = K_GX / hs, g.t0 = K_GZ * rg;
    g.h0 = g.kvh * g.G + (K_GX % hs) * g.GS; /* the first query head served here */
    const k_u32 nr = g.t0 < p.n_rows ? (p.n_rows - g.t0 < rg ? p.n_rows - g.t0 : rg) : 0u;
    g.NQ = g.GS * nr;
    g.vis_last = p.pos0 + g.t0 + nr; /* positions the group's last row sees */
    const k_u32 nb_t = (g.vis_last + K_ATTN_BLOCK - 1u) / K_ATTN_BLOCK;
    g.b0 = K_GY * p.blocks_per_split;
    g.b1 = g.b0 + p.blocks_per_split < nb_t ? g.b0 + p.blocks_per_split : nb_t;
    K_TG_ARRAY(float, qs, K_ATTN_MAX_QV * K_ATTN_MAX_DIM);
    K_TG_ARRAY(float, S, K_ATTN_MAX_QV * K_ATTN_BLOCK);
    K_TG_ARRAY(float, ML, 2 * K_ATTN_MAX_QV);
    K_TG_ARRAY(k_u32x4, tile, K_ATTN_TILE * K_ATTN_MAX_DIM / 8u);
    if (g.kvh >= p.n_head_kv || nr == 0u || g.b0 >= g.b1) return; /* whole threadgroup */
    if (dh == K_ATTN_MAX_DIM)
        k_attn_partials_body(p, q, kpool, vpool, pages, part, K_ATTN_MAX_DIM, g, qs, S, ML, tile, K_TID, K_TG_SIZE);
    else
        k_attn_partials_body(p, q, kpool, vpool, pages, part, dh, g, qs, S, ML, tile, K_TID, K_TG_SIZE);
}

/* ------------------------------------------------- attn_partials_wide --
 * attn_partials for chunks of query rows (prefill): the same partials, bit
 * for bit, from one threadgroup per (kv head, split, group of query rows)
 * serving up to K_ATTN_WIDE_QV query vectors (all G heads of group_rows
 * rows; attn_partials serves K_ATTN_MAX_QV = 8, so each K/V byte is now
 * read a quarter as often at G = 4), with the per-thread work blocked so
 * that the operands of the dependent chains sit in registers:
 *  - step 2: SIMD-group sg takes the 4 query vectors 4 qd .. 4 qd + 3
 *    (qd = sg / wpq) and, of each tile, the position pairs 2 sub, 2 sub +
 *    2 wpq, ...; lane l keeps its queries' elements d = l + 32 i in
 *    registers for the whole launch (attn_partials reads them from
 *    threadgroup memory at every product). The products, their ascending
 *    chains, k_attn_sums8's tree and the scale are attn_partials' own;
 *  - step 3: attn_partials' code;
 *  - step 4: thread (dq, qg) owns elements 4 dq .. 4 dq + 3 (one 8-byte
 *    load of each position's V) of query vectors qg, qg + QG, ...: one
 *    score load serves 4 products (attn_partials: one per product). Each
 *    (query, element) chain still adds e * v over the positions the query
 *    sees in ascending order, starting from 0.
 * So every score, max, sum and accumulator is the same float computation as
 * in attn_partials (the emulator compares the partials bit for bit). */
#define K_ATTN_WIDE_QPT (K_ATTN_WIDE_QV / (K_ATTN_WIDE_TG / 64u)) /* step 4's query vectors a thread, at most */
K_FN void k_attn_wide_body(k_attn_partials_params p, K_DEV_IN float *q, K_DEV_IN k_u16 *kpool, K_DEV_IN k_u16 *vpool,
                           K_DEV_IN k_u32 *pages, K_DEV float *part, const k_u32 dh, k_attn_geom g, K_TGM float *S,
                           K_TGM float *ML, K_TGM k_u32x4 *tile, k_u32 tid, k_u32 tg) {
    const k_u32 lane = tid & 31u, sg = tid >> 5, nsg = tg >> 5, GS = g.GS, NQ = g.NQ, t0 = g.t0;
    K_TGM k_u16 *th = (K_TGM k_u16 *)tile;
    K_TGM k_u32x2 *t2 = (K_TGM k_u32x2 *)tile;

    /* step 2's place: 4 query vectors per SIMD-group, wpq SIMD-groups per quad */
    const k_u32 nq4 = (NQ + 3u) / 4u, wpq = nsg / nq4, qd = sg / wpq, sub = sg % wpq;
    float qr[4][K_ATTN_MAX_DIM / 32u];
    K_UNROLL for (k_u32 u = 0; u < 4u; u++) {
        const k_u32 v = 4u * qd + u;
        K_UNROLL for (k_u32 i = 0; i < K_ATTN_MAX_DIM / 32u; i++) {
            const k_u32 d = lane + 32u * i;
            qr[u][i] = qd < nq4 && v < NQ && d < dh
                           ? K_LD(q, (t0 + v / GS) * p.q_stride + (g.h0 + v % GS) * p.q_head_stride + d)
                           : 0.0f;
        }
    }
    /* step 4's place: elements d0 .. d0 + 3 of query vectors qg, qg + QG, ... */
    const k_u32 C = dh / 4u, QG = tg / C, dq = tid % C, qg = tid / C, d0 = 4u * dq;
    const int owns = qg < QG;

    for (k_u32 b = g.b0; b < g.b1; b++) {
        const k_u32 p0b = b * K_ATTN_BLOCK;
        const k_u32 len = k_attn_len(g.vis_last, p0b); /* the group's longest: its last row's */
        const k_u32 kb = k_attn_block_start(p, g, kpool, vpool, pages, b, len, dh, tid, tg);
        const k_u32 nt = (len + K_ATTN_WIDE_TILE - 1u) / K_ATTN_WIDE_TILE;
        k_attn_regs reg =
            k_attn_stage_load(k_attn_stage_tile(kpool, vpool, kb, len, dh, nt, 0u, K_ATTN_WIDE_TILE), tid, tg);
        for (k_u32 s = 0; s < nt; s++) { /* the K tiles: step 2 */
            const k_u32 tp0 = s * K_ATTN_WIDE_TILE;
            const k_u32 tl = len - tp0 < K_ATTN_WIDE_TILE ? len - tp0 : K_ATTN_WIDE_TILE;
            K_BARRIER(); /* the tile's readers of the previous stage are done */
            k_attn_stage_store(k_attn_stage_tile(kpool, vpool, kb, len, dh, nt, s, K_ATTN_WIDE_TILE), reg, tile,
                               tid, tg);
            K_BARRIER();
            reg = k_attn_stage_load(k_attn_stage_tile(kpool, vpool, kb, len, dh, nt, s + 1u, K_ATTN_WIDE_TILE), tid,
                                    tg);
            if (qd >= nq4) continue; /* a SIMD-group without queries (uniform) */
            for (k_u32 pl = 2u * sub; pl < tl; pl += 2u * wpq) {
                const int two = pl + 1u < tl;
                const k_attn_kpair kp = k_attn_load_kpair(th, pl, two, dh, lane);
                k_attn_items8 x;
                K_UNROLL for (k_u32 u = 0; u < 4u; u++) {
                    float a0 = 0.0f, a1 = 0.0f;
                    if (4u * qd + u < NQ)
                        K_UNROLL for (k_u32 i = 0; i < K_ATTN_MAX_DIM / 32u; i++) {
                            const k_u32 d = lane + 32u * i;
                            if (d < dh) {
#ifdef PLANT_ATTN_WIDE_CHAIN_ORDER
                                const k_u32 ii = K_ATTN_MAX_DIM / 32u - 1u - i; /* planted: chains descending */
                                if (lane + 32u * ii < dh) a0 = k_attn_madd(a0, kp.k0[ii], qr[u][ii]), a1 = k_attn_madd(a1, kp.k1[ii], qr[u][ii]);
#else
                                a0 = k_attn_madd(a0, kp.k0[i], qr[u][i]);
                                a1 = k_attn_madd(a1, kp.k1[i], qr[u][i]);
#endif
                            }
                        }
                    x.v[u] = a0, x.v[4u + u] = a1;
                }
                const float sum = k_attn_sums8(x, lane);
                const k_u32 item = (lane >> 2) & 7u, j = item >> 2, v = 4u * qd + (item & 3u);
                if ((lane & 3u) == 0u && v < NQ && (j == 0u || two)) K_ST(S, v * K_ATTN_BLOCK + tp0 + pl + j, sum * p.scale);
            }
        }
        K_BARRIER(); /* every score of the block written */
        k_attn_softmax_block(p, g, S, ML, p0b, lane, sg, nsg); /* step 3 */
        /* positions every row of the group sees: its first row's */
        const k_u32 lmin = k_attn_len(p.pos0 + t0 + 1u, p0b);
        float acc[K_ATTN_WIDE_QPT][4];
        K_UNROLL for (k_u32 k = 0; k < K_ATTN_WIDE_QPT; k++) acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = 0.0f;
        for (k_u32 j = 0; j < nt; j++) { /* the V tiles: step 4 */
            const k_u32 s = nt + j;
            const k_u32 tp0 = j * K_ATTN_WIDE_TILE;
            const k_u32 tl = len - tp0 < K_ATTN_WIDE_TILE ? len - tp0 : K_ATTN_WIDE_TILE;
            K_BARRIER(); /* the tile's readers of the previous stage are done (and, first, S's writers) */
            k_attn_stage_store(k_attn_stage_tile(kpool, vpool, kb, len, dh, nt, s, K_ATTN_WIDE_TILE), reg, tile,
                               tid, tg);
            K_BARRIER();
            if (s + 1u < 2u * nt)
                reg = k_attn_stage_load(k_attn_stage_tile(kpool, vpool, kb, len, dh, nt, s + 1u, K_ATTN_WIDE_TILE),
                                        tid, tg);
            if (!owns) continue;
            const int whole = tl == K_ATTN_WIDE_TILE && tp0 + K_ATTN_WIDE_TILE <= lmin; /* every row sees it */
            for (k_u32 pl = 0; pl < tl; pl++) {
                const k_u32 pb = tp0 + pl;
                const k_u32x2 w = K_LD(t2, (pl * dh + d0) / 4u);
                const float v0 = k_h2f((k_u16)(w.x & 0xffffu)), v1 = k_h2f((k_u16)(w.x >> 16));
                const float v2 = k_h2f((k_u16)(w.y & 0xffffu)), v3 = k_h2f((k_u16)(w.y >> 16));
                K_UNROLL for (k_u32 k = 0; k < K_ATTN_WIDE_QPT; k++) {
                    const k_u32 v = qg + k * QG;
                    if (v >= NQ) break;
                    if (whole || pb < lmin || pb < k_attn_qlen(p, g, v, p0b)) { /* each query's own length */
                        const float e = K_LD(S, v * K_ATTN_BLOCK + pb);
                        acc[k][0] = k_attn_madd(acc[k][0], e, v0);
                        acc[k][1] = k_attn_madd(acc[k][1], e, v1);
                        acc[k][2] = k_attn_madd(acc[k][2], e, v2);
                        acc[k][3] = k_attn_madd(acc[k][3], e, v3);
                    }
                }
            }
        }
        if (owns)
            K_UNROLL for (k_u32 k = 0; k < K_ATTN_WIDE_QPT; k++) {
                const k_u32 v = qg + k * QG;
                if (v >= NQ) break;
                if (k_attn_qlen(p, g, v, p0b) == 0u) continue;
                const k_u32 o = k_attn_part_at(p, g, v, b, dh) + 2u + d0;
                K_ST(part, o, acc[k][0]);
                K_ST(part, o + 1u, acc[k][1]);
                K_ST(part, o + 2u, acc[k][2]);
                K_ST(part, o + 3u, acc[k][3]);
            }
        k_attn_store_ml(p, g, part, ML, b, p0b, dh, tid, tg);
    }
}

/* Launch bound: K_ATTN_WIDE_TG threads, K_ATTN_WIDE_MINB threadgroups an
 * SM (2: ptxas may take 128 registers). Only speed depends on it. */
#ifndef K_ATTN_WIDE_MINB
#define K_ATTN_WIDE_MINB 2
#endif
K_KERNEL_BOUNDED(attn_partials_wide, K_ATTN_WIDE_TG, K_ATTN_WIDE_MINB) {
    K_CHECK_TAG(attn_partials_wide);
    const k_u32 dh = p.head_dim, rg = p.group_rows;
    if (p.n_head_kv == 0u || p.n_head % p.n_head_kv || p.n_head / p.n_head_kv > K_ATTN_MAX_GROUP || dh == 0u ||
        dh > K_ATTN_MAX_DIM || dh % 4u || p.blocks_per_split == 0u || p.head_split != 1u || rg == 0u ||
        (p.n_head / p.n_head_kv) * rg > K_ATTN_WIDE_QV || K_TG_SIZE != K_ATTN_WIDE_TG) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    k_attn_geom g;
    g.G = p.n_head / p.n_head_kv, g.GS = g.G;
    g.kvh = K_GX, g.t0 = K_GZ * rg;
    g.h0 = g.kvh * g.G;
    const k_u32 nr = g.t0 < p.n_rows ? (p.n_rows - g.t0 < rg ? p.n_rows - g.t0 : rg) : 0u;
    g.NQ = g.GS * nr;
    g.vis_last = p.pos0 + g.t0 + nr;
    const k_u32 nb_t = (g.vis_last + K_ATTN_BLOCK - 1u) / K_ATTN_BLOCK;
    g.b0 = K_GY * p.blocks_per_split;
    g.b1 = g.b0 + p.blocks_per_split < nb_t ? g.b0 + p.blocks_per_split : nb_t;
    K_TG_ARRAY(float, S, K_ATTN_WIDE_QV * K_ATTN_BLOCK);
    K_TG_ARRAY(float, ML, 2 * K_ATTN_WIDE_QV);
    K_TG_ARRAY(k_u32x4, tile, K_ATTN_WIDE_TILE * K_ATTN_MAX_DIM / 8u);
    if (g.kvh >= p.n_head_kv || nr == 0u || g.b0 >= g.b1) return; /* whole threadgroup */
    if (dh == K_ATTN_MAX_DIM)
        k_attn_wide_body(p, q, kpool, vpool, pages, part, K_ATTN_MAX_DIM, g, S, ML, tile, K_TID, K_TG_SIZE);
    else
        k_attn_wide_body(p, q, kpool, vpool, pages, part, dh, g, S, ML, tile, K_TID, K_TG_SIZE);
}

/* One threadgroup per (query head, row); thread d (stride K_TG_SIZE) merges
 * element d. Every thread recomputes (M, L) from the same partials, so all
 * hold the same bits. out = A * (1/L), as the CPU's fast precision. The
 * partials are read K_ATTN_MERGE_AHEAD blocks at a time, all loads before
 * the folds (the fold is a chain through M: one block per load latency made
 * the merge the bulk of attention at long contexts), and the next batch's
 * loads are issued before the current batch is folded (at 32k, 129 blocks:
 * 20 us a launch with one batch in flight); the folds keep ascending block
 * order: the same bits. */
#define K_ATTN_MERGE_AHEAD 8u
typedef struct {
    float m[K_ATTN_MERGE_AHEAD], l[K_ATTN_MERGE_AHEAD], a[K_ATTN_MERGE_AHEAD];
} k_attn_merge_batch;
K_FN k_attn_merge_batch k_attn_merge_load(K_DEV_IN float *part, k_u32 row0, k_u32 b0, k_u32 nb_t, k_u32 dh,
                                          k_u32 d) {
    k_attn_merge_batch x;
    K_UNROLL for (k_u32 u = 0; u < K_ATTN_MERGE_AHEAD; u++) {
        const k_u32 b = b0 + u < nb_t ? b0 + u : nb_t - 1u; /* in bounds; unused past nb_t */
        const k_u32 o = (row0 + b) * (2u + dh);
        x.m[u] = K_LD(part, o), x.l[u] = K_LD(part, o + 1u), x.a[u] = K_LD(part, o + 2u + d);
    }
    return x;
}
K_KERNEL(attn_merge) {
    K_CHECK_TAG(attn_merge);
    const k_u32 h = K_GX, t = K_GY, dh = p.head_dim;
    if (h >= p.n_head || t >= p.n_rows) return;
    const k_u32 nb_t = (p.pos0 + t + 1u + K_ATTN_BLOCK - 1u) / K_ATTN_BLOCK;
    const k_u32 row0 = (t * p.n_head + h) * p.n_blocks; /* this (row, head)'s first partial */
    for (k_u32 d = K_TID; d < dh; d += K_TG_SIZE) {
        float M = 0.0f, L = 0.0f, A = 0.0f;
        k_attn_merge_batch cur = k_attn_merge_load(part, row0, 0u, nb_t, dh, d);
        for (k_u32 b0 = 0; b0 < nb_t; b0 += K_ATTN_MERGE_AHEAD) {
            const k_attn_merge_batch nxt =
                k_attn_merge_load(part, row0, b0 + K_ATTN_MERGE_AHEAD < nb_t ? b0 + K_ATTN_MERGE_AHEAD : b0, nb_t, dh, d);
            K_UNROLL for (k_u32 u = 0; u < K_ATTN_MERGE_AHEAD; u++) {
                if (b0 + u >= nb_t) break;
                if (b0 + u == 0u) {
                    M = cur.m[u], L = cur.l[u], A = cur.a[u];
                    continue;
                }
                const float nm = k_max2(M, cur.m[u]);
                const float ea = k_exp(M - nm), eb = k_exp(cur.m[u] - nm);
                L = L * ea + cur.l[u] * eb;
                A = A * ea + cur.a[u] * eb;
                M = nm;
            }
            cur = nxt;
        }
        K_ST(out, t * p.out_stride + h * dh + d, A * (1.0f / L));
    }
}
