/*
 * attn_plan.h — how many splits the decode attention uses (host side, all
 * backends). The output does not depend on it (attn.h), only the speed:
 * enough threadgroups to fill the GPU at any context length, never a split
 * without a block.
 */
#ifndef K_ATTN_PLAN_H
#define K_ATTN_PLAN_H

#include <stdint.h>

/* Blocks per split for n_blocks blocks of history, n_head_kv heads and
 * n_rows query rows, aiming at target_groups threadgroups in flight (a few
 * per GPU core: 2 x cores is a fair start, see docs/gpu.md). */
static inline uint32_t k_attn_blocks_per_split(uint32_t n_blocks, uint32_t n_head_kv,
                                               uint32_t n_rows, uint32_t target_groups) {
    if (n_blocks == 0) return 1;
    const uint32_t base = n_head_kv * (n_rows ? n_rows : 1);
    uint32_t splits = base >= target_groups ? 1 : (target_groups + base - 1) / base;
    if (splits > n_blocks) splits = n_blocks;
    return (n_blocks + splits - 1) / splits;
}

static inline uint32_t k_attn_n_splits(uint32_t n_blocks, uint32_t blocks_per_split) {
    return (n_blocks + blocks_per_split - 1) / blocks_per_split;
}

/* Threadgroups per GQA group (attn_partials' head_split: each serves
 * G / head_split query heads), given `groups` = n_head_kv x splits x rows
 * threadgroups without it: the smallest divisor of G that brings them to
 * min_groups (else G). At short contexts the split-K splits are few (one
 * per 256-position block: 2 KV heads x 3 blocks = 6 threadgroups at ctx
 * 512, 6 of an H200's 132 cores busy) and each threadgroup ran the scores
 * and V sums of all G heads; at long contexts the splits fill the GPU and
 * head_split stays 1, so every K/V byte is read once. The bits do not
 * depend on it (attn.h). */
static inline uint32_t k_attn_head_split(uint32_t G, uint32_t groups, uint32_t min_groups) {
    for (uint32_t hs = 1; hs < G; hs++)
        if (G % hs == 0 && (uint64_t)groups * hs >= min_groups) return hs;
    return G ? G : 1;
}

/* Threads of an attn_merge threadgroup: one per head_dim element (whole
 * SIMD-groups, at most 256), so no thread merges more than one element's
 * chain of partials (with 32 threads, 8 chains one after another at head_dim
 * 256). The bits do not depend on it. */
static inline uint32_t k_attn_merge_threads(uint32_t head_dim) {
    const uint32_t t = (head_dim + 31u) / 32u * 32u;
    return t < 32u ? 32u : t > 256u ? 256u : t;
}

#endif
