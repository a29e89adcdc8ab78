/*
 * attn.h — split-K decode / verify attention over the F16 KV shadow.
 *
 * The history a query row sees is cut into blocks of K_ATTN_BLOCK (= the
 * CPU's KV page) positions. attn_partials computes, per (query head, block),
 * the partial (m = max score, l = sum exp(s - m), acc = sum exp(s - m) v);
 * attn_merge folds a row's partials in ascending block order with the
 * online-softmax combine (the CPU's merge(), csrc/forward/attention.c).
 * A split is only which threadgroup computes which blocks: every partial is
 * the same float computation whatever the split count, and the merge order
 * is fixed, so the output is bit-identical for every split count and for
 * every verify width (tested), and the host may pick splits from the
 * context length freely (attn_plan.h).
 *
 * One threadgroup per (kv head, head split, split, query row) serves GS =
 * G / head_split query heads of its GQA group from one read of each K row
 * and each V row (head_split 1: all G heads, each K/V byte read once; at
 * short contexts the host splits the heads so that more than n_head_kv x
 * splits threadgroups exist: attn_plan.h):
 *  1. the GS queries into threadgroup memory;
 *  per block:
 *  2. scores: SIMD-group sg takes positions sg, sg + NSIMD, ...; its lanes
 *     split head_dim, each K element (fp16 -> float) is multiplied into GS
 *     partial dots, which the butterfly sums; times scale;
 *  3. per head (SIMD-group g % NSIMD): max, then e = exp(s - max) written
 *     back over the scores, and their sum (lane-strided, butterfly);
 *  4. thread (r, d), r = TID / head_dim below R = TG / head_dim (1 when
 *     head_dim exceeds the threadgroup: then d strides by K_TG_SIZE),
 *     accumulates e * v over the block's positions in ascending order for
 *     heads r, r + R, ... of its GS, and writes those partials.
 * Every (head, position) score, every head's max and sum and every (head,
 * element) chain of step 4 is the same float computation whichever
 * threadgroup and thread runs it, so the partials do not depend on
 * head_split or the threadgroup size either (tested).
 * The numerics differ from the CPU's F16 recipe (which keeps llama.cpp's F16
 * accumulator); docs/gpu.md derives the stated tolerance against an exact
 * reference.
 */

/* Speed knobs (-D; the bits never depend on them): positions per pass of
 * the score loop, V rows loaded ahead per thread. H200 sweep (2026-11-30,
 * gpu/tools/device_attn_sweep.sh, 0.8B Q8_0 decode at ctx 128 / 32k, with
 * the runner's K_ATTN_TG): KPOS 1 / VAHEAD 8 / 1024 threads 354 / 303 tok/s,
 * attn_partials 29 / 89 us a launch; KPOS 2 / 8 / 256 311 / 216 (89 / 316
 * us); KPOS 2 / 8 / 1024 341-348 / 282-285; KPOS 1 / 8 / 512 354 / 296;
 * KPOS 1 / 16 / 1024 348 / 291; KPOS 4 with 256 threads 316 / 225-230.
 * Re-run 2026-12-01 with the head split and L2 look-ahead (docs/gpu.md §7):
 * KPOS 1 / VAHEAD 8 kept; the runner's K_ATTN_TG went to 512. */
#ifndef K_ATTN_KPOS
#define K_ATTN_KPOS 1u
#endif
#ifndef K_ATTN_VAHEAD
#define K_ATTN_VAHEAD 8u
#endif
/* K_ATTN_L2AHEAD 1: at the start of each block the threadgroup asks L2 for
 * that block's K and V rows (when it is the split's first) and the next
 * block's, one 32-byte sector per request, so the score and V loops'
 * chains of dependent loads wait on L2 instead of HBM. A hint: no value
 * depends on it. */
#ifndef K_ATTN_L2AHEAD
/* 1 since measured on the H200 2026-12-01 (two interleaved repetitions,
 * 0.8B Q8_0 bench shape): decode 417-417 / 408-412 / 318-319 tok/s at ctx
 * 512 / 4k / 32k without it, 462-469 / 456-462 / 363-367 with it */
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
K_KERNEL(attn_partials) {
    K_CHECK_TAG(attn_partials);
    const k_u32 dh = p.head_dim, hs = p.head_split;
    if (p.n_head_kv == 0u || p.n_head % p.n_head_kv || p.n_head / p.n_head_kv > K_ATTN_MAX_GROUP ||
        dh == 0u || dh > K_ATTN_MAX_DIM || p.blocks_per_split == 0u || hs == 0u ||
        (p.n_head / p.n_head_kv) % hs) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 G = p.n_head / p.n_head_kv, GS = G / hs;
    const k_u32 kvh = K_GX / hs, t = K_GZ;
    const k_u32 h0 = kvh * G + (K_GX % hs) * GS; /* the first query head served here */
    const k_u32 n_vis = p.pos0 + t + 1u;
    const k_u32 nb_t = (n_vis + K_ATTN_BLOCK - 1u) / K_ATTN_BLOCK;
    const k_u32 b0 = K_GY * p.blocks_per_split;
    const k_u32 b1 = b0 + p.blocks_per_split < nb_t ? b0 + p.blocks_per_split : nb_t;
    K_TG_ARRAY(float, qs, K_ATTN_MAX_GROUP * K_ATTN_MAX_DIM);
    K_TG_ARRAY(float, S, K_ATTN_MAX_GROUP * K_ATTN_BLOCK);
    K_TG_ARRAY(float, ML, 2 * K_ATTN_MAX_GROUP);
    if (kvh >= p.n_head_kv || t >= p.n_rows || b0 >= b1) return; /* whole threadgroup */

    for (k_u32 e = K_TID; e < GS * dh; e += K_TG_SIZE) {
        const k_u32 g = e / dh, d = e % dh;
        K_ST(qs, g * dh + d, K_LD(q, t * p.q_stride + (h0 + g) * p.q_head_stride + d));
    }
    K_BARRIER();

    for (k_u32 b = b0; b < b1; b++) {
        const k_u32 p0 = b * K_ATTN_BLOCK;
        const k_u32 len = n_vis - p0 < K_ATTN_BLOCK ? n_vis - p0 : K_ATTN_BLOCK;
        const k_u32 page = K_LD(pages, b);
        const k_u32 kb = (page * p.n_head_kv + kvh) * K_ATTN_BLOCK * dh;
        if (K_ATTN_L2AHEAD) {
            if (b == b0) k_attn_prefetch_block(kpool, vpool, kb, len * dh, K_TID, K_TG_SIZE);
            if (b + 1u < b1) {
                const k_u32 nlen = n_vis - p0 - K_ATTN_BLOCK < K_ATTN_BLOCK ? n_vis - p0 - K_ATTN_BLOCK : K_ATTN_BLOCK;
                k_attn_prefetch_block(kpool, vpool, (K_LD(pages, b + 1u) * p.n_head_kv + kvh) * K_ATTN_BLOCK * dh,
                                      nlen * dh, K_TID, K_TG_SIZE);
            }
        }

        /* The per-head loops run to the constant K_ATTN_MAX_GROUP with a
         * g < G guard, so part[] and acc[] stay in registers (indexed by a
         * runtime bound they spilled to local memory on CUDA: 350 us per
         * block on the H200); the float operations are the same. */
        for (k_u32 pp = K_SIMD; pp < len; pp += K_ATTN_KPOS * K_NSIMD) { /* uniform per SIMD-group */
            /* K_ATTN_KPOS positions pp + j NSIMD per pass, and the lane's K
             * elements d = lane + 32 i of all their rows loaded before the
             * first use: a loop to the runtime dh waited out one load latency
             * per element (8 per position at head_dim 256: 64 us for one
             * block at ctx 128, the KV streamed at ~0.2 TB/s at 32k on the
             * H200). Each position's dot still adds in ascending d: the same
             * bits whatever K_ATTN_KPOS */
            float kv[K_ATTN_KPOS][K_ATTN_MAX_DIM / 32u];
            K_UNROLL for (k_u32 j = 0; j < K_ATTN_KPOS; j++) {
                const k_u32 pj = pp + j * K_NSIMD;
                K_UNROLL for (k_u32 i = 0; i < K_ATTN_MAX_DIM / 32u; i++) {
                    const k_u32 d = K_LANE + 32u * i;
                    kv[j][i] = pj < len && d < dh ? k_h2f(K_LD(kpool, kb + pj * dh + d)) : 0.0f;
                }
            }
            float part[K_ATTN_KPOS][K_ATTN_MAX_GROUP];
            K_UNROLL for (k_u32 j = 0; j < K_ATTN_KPOS; j++)
                K_UNROLL for (k_u32 g = 0; g < K_ATTN_MAX_GROUP; g++) part[j][g] = 0.0f;
            K_UNROLL for (k_u32 i = 0; i < K_ATTN_MAX_DIM / 32u; i++) {
                const k_u32 d = K_LANE + 32u * i;
                if (d < dh)
                    K_UNROLL for (k_u32 g = 0; g < K_ATTN_MAX_GROUP; g++)
                        if (g < GS) {
                            const float qv = K_LD(qs, g * dh + d);
                            K_UNROLL for (k_u32 j = 0; j < K_ATTN_KPOS; j++) part[j][g] += kv[j][i] * qv;
                        }
            }
            K_UNROLL for (k_u32 j = 0; j < K_ATTN_KPOS; j++) {
                const k_u32 pj = pp + j * K_NSIMD;
                if (pj >= len) break; /* uniform per SIMD-group: no lane skips the shuffles alone */
                K_UNROLL for (k_u32 g = 0; g < K_ATTN_MAX_GROUP; g++) {
                    if (g >= GS) break;
                    const float s = k_simd_sum(part[j][g]) * p.scale;
                    if (K_LANE == 0) K_ST(S, g * K_ATTN_BLOCK + pj, s);
                }
            }
        }
#ifndef PLANT_MISSING_BARRIER
        K_BARRIER();
#endif

        for (k_u32 g = K_SIMD; g < GS; g += K_NSIMD) {
            float m = K_NEG_INF;
            for (k_u32 pp = K_LANE; pp < len; pp += 32u) m = k_max2(m, K_LD(S, g * K_ATTN_BLOCK + pp));
            m = k_simd_max(m);
            float l = 0.0f;
            for (k_u32 pp = K_LANE; pp < len; pp += 32u) {
                const float e = k_exp(K_LD(S, g * K_ATTN_BLOCK + pp) - m);
                K_ST(S, g * K_ATTN_BLOCK + pp, e);
                l += e;
            }
            l = k_simd_sum(l);
            if (K_LANE == 0) {
                K_ST(ML, 2u * g, m);
                K_ST(ML, 2u * g + 1u, l);
            }
        }
        K_BARRIER();

        /* step 4: acc[k] is head r + k R's chain for element d (R rows of
         * threads share the heads when head_dim fits the threadgroup
         * several times: at GS 8, head_dim 256 and 1024 threads every
         * thread runs 2 chains, where one thread per element ran all 8) */
        const k_u32 R = K_TG_SIZE >= dh ? K_TG_SIZE / dh : 1u, r = K_TID / dh;
        if (r < R)
        for (k_u32 d = K_TID % dh; d < dh; d += K_TG_SIZE) {
            float acc[K_ATTN_MAX_GROUP];
            K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_GROUP; k++) acc[k] = 0.0f;
            /* K_ATTN_VAHEAD V loads in flight before their adds (latency:
             * one or two threadgroups per SM at short contexts); the adds
             * keep ascending pp order, so the sums are unchanged */
            k_u32 pp = 0;
            for (; pp + K_ATTN_VAHEAD <= len; pp += K_ATTN_VAHEAD) {
                float v8[K_ATTN_VAHEAD];
                K_UNROLL for (k_u32 u = 0; u < K_ATTN_VAHEAD; u++) v8[u] = k_h2f(K_LD(vpool, kb + (pp + u) * dh + d));
                K_UNROLL for (k_u32 u = 0; u < K_ATTN_VAHEAD; u++)
                    K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_GROUP; k++)
                        if (r + k * R < GS) acc[k] += K_LD(S, (r + k * R) * K_ATTN_BLOCK + pp + u) * v8[u];
            }
            for (; pp < len; pp++) {
                const float v = k_h2f(K_LD(vpool, kb + pp * dh + d));
                K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_GROUP; k++)
                    if (r + k * R < GS) acc[k] += K_LD(S, (r + k * R) * K_ATTN_BLOCK + pp) * v;
            }
            K_UNROLL for (k_u32 k = 0; k < K_ATTN_MAX_GROUP; k++) {
                if (r + k * R >= GS) break;
                const k_u32 o = ((t * p.n_head + h0 + r + k * R) * p.n_blocks + b) * (2u + dh);
                K_ST(part, o + 2u + d, acc[k]);
            }
        }
        if (K_TID < GS) {
            const k_u32 o = ((t * p.n_head + h0 + K_TID) * p.n_blocks + b) * (2u + dh);
            K_ST(part, o, K_LD(ML, 2u * K_TID));
            K_ST(part, o + 1u, K_LD(ML, 2u * K_TID + 1u));
        }
        K_BARRIER(); /* S and ML are rewritten by the next block */
    }
}

/* One threadgroup per (query head, row); thread d (stride K_TG_SIZE) merges
 * element d. Every thread recomputes (M, L) from the same partials, so all
 * hold the same bits. out = A * (1/L), as the CPU's fast precision. The
 * partials are read K_ATTN_MERGE_AHEAD blocks at a time, all loads before
 * the folds (the fold is a chain through M: one block per load latency made
 * the merge the bulk of attention at long contexts); the folds keep
 * ascending block order: the same bits. */
#define K_ATTN_MERGE_AHEAD 8u
K_KERNEL(attn_merge) {
    K_CHECK_TAG(attn_merge);
    const k_u32 h = K_GX, t = K_GY, dh = p.head_dim;
    if (h >= p.n_head || t >= p.n_rows) return;
    const k_u32 nb_t = (p.pos0 + t + 1u + K_ATTN_BLOCK - 1u) / K_ATTN_BLOCK;
    for (k_u32 d = K_TID; d < dh; d += K_TG_SIZE) {
        float M = 0.0f, L = 0.0f, A = 0.0f;
        for (k_u32 b0 = 0; b0 < nb_t; b0 += K_ATTN_MERGE_AHEAD) {
            float mb[K_ATTN_MERGE_AHEAD], lb[K_ATTN_MERGE_AHEAD], ab[K_ATTN_MERGE_AHEAD];
            K_UNROLL for (k_u32 u = 0; u < K_ATTN_MERGE_AHEAD; u++) {
                const k_u32 b = b0 + u < nb_t ? b0 + u : nb_t - 1u; /* in bounds; unused past nb_t */
                const k_u32 o = ((t * p.n_head + h) * p.n_blocks + b) * (2u + dh);
                mb[u] = K_LD(part, o), lb[u] = K_LD(part, o + 1u), ab[u] = K_LD(part, o + 2u + d);
            }
            K_UNROLL for (k_u32 u = 0; u < K_ATTN_MERGE_AHEAD; u++) {
                if (b0 + u >= nb_t) break;
                if (b0 + u == 0u) {
                    M = mb[u], L = lb[u], A = ab[u];
                    continue;
                }
                const float nm = k_max2(M, mb[u]);
                const float ea = k_exp(M - nm), eb = k_exp(mb[u] - nm);
                L = L * ea + lb[u] * eb;
                A = A * ea + ab[u] * eb;
                M = nm;
            }
        }
        K_ST(out, t * p.out_stride + h * dh + d, A * (1.0f / L));
    }
}
