/*
 * dispatch.c — one kernel set per ISA, built once on first use.
 */
#include "quants.h"
#include "../cpu.h"

#include <pthread.h>

static ds4_kernel_set g_sets[5];
static int g_have[5];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* A set starts as a copy of another; a multi-row kernel it inherited is
 * only valid while the one-row kernel it mirrors is the inherited one too
 * (dot_rows must be bit-identical to vec_dot), so drop it where the init
 * replaced vec_dot but not dot_rows. Likewise an inherited tile kernel is
 * only valid with the dot_rows (and rows layout) it was written for: the
 * AVX-512 set replaces Q8_0's dot_rows and packer (Q8X) but has no tile. */
static void drop_stale_rows(ds4_kernel_set *k, const ds4_kernel_set *parent) {
    if (k->vec_dot_f32[DS4_TYPE_F32] != parent->vec_dot_f32[DS4_TYPE_F32] &&
        k->gdn_rows == parent->gdn_rows)
        k->gdn_rows = NULL; /* it mirrors the parent's float dot */
    for (int t = 0; t < DS4_TYPE_COUNT; t++) {
        if (k->vec_dot[t] != parent->vec_dot[t] && k->dot_rows[t] == parent->dot_rows[t]) {
            k->dot_rows[t] = NULL;
            k->pack_rows[t] = NULL;
            k->dot_rows_name[t] = NULL;
        }
        if (k->dot_tile[t] == parent->dot_tile[t] &&
            (k->dot_rows[t] != parent->dot_rows[t] || k->pack_rows[t] != parent->pack_rows[t]))
            k->dot_tile[t] = NULL;
    }
}

static void build_sets_inner(void);

size_t ds4_rows_act_bytes(const ds4_kernel_set *k, int type, int64_t n) {
    if (!k->dot_rows[type]) return 0;
    if (k->pack_rows[type]) return ds4_q8x_row_bytes(n);
    const ds4_type_traits *p = &ds4_type_traits_table[ds4_type_traits_table[type].vec_dot_type];
    return (size_t)(n / p->block_size) * (size_t)p->type_size;
}

static void build_sets(void) {
    build_sets_inner();
    for (int isa = DS4_ISA_SCALAR; isa <= DS4_ISA_NEON; isa++) g_sets[isa].isa_name = ds4_isa_name(isa);
}

static void build_sets_inner(void) {
    int avail = ds4_cpu_isa_mask();
    ds4_kernels_init_scalar(&g_sets[DS4_ISA_SCALAR]);
    g_have[DS4_ISA_SCALAR] = 1;
    if (avail & (1 << DS4_ISA_AVX2)) {
        g_sets[DS4_ISA_AVX2] = g_sets[DS4_ISA_SCALAR];
        g_have[DS4_ISA_AVX2] = ds4_kernels_init_avx2(&g_sets[DS4_ISA_AVX2]);
        drop_stale_rows(&g_sets[DS4_ISA_AVX2], &g_sets[DS4_ISA_SCALAR]);
    }
    if (avail & (1 << DS4_ISA_AVX512)) {
        /* AVX-512 overrides what it speeds up on top of the AVX2 set. */
        g_sets[DS4_ISA_AVX512] = g_sets[DS4_ISA_AVX2];
        g_have[DS4_ISA_AVX512] = g_have[DS4_ISA_AVX2] &&
                                 ds4_kernels_init_avx512(&g_sets[DS4_ISA_AVX512]);
        drop_stale_rows(&g_sets[DS4_ISA_AVX512], &g_sets[DS4_ISA_AVX2]);
    }
    if (avail & (1 << DS4_ISA_NEON)) {
        g_sets[DS4_ISA_NEON] = g_sets[DS4_ISA_SCALAR];
        g_have[DS4_ISA_NEON] = ds4_kernels_init_neon(&g_sets[DS4_ISA_NEON]);
        drop_stale_rows(&g_sets[DS4_ISA_NEON], &g_sets[DS4_ISA_SCALAR]);
    }
}

/* The CPU grants it AND its kernels were compiled in (an old compiler may
 * have built a variant file as a stub). */
int ds4_isa_available(void) {
    pthread_once(&g_once, build_sets);
    int mask = 0;
    for (int isa = DS4_ISA_SCALAR; isa <= DS4_ISA_NEON; isa++)
        if (g_have[isa]) mask |= 1 << isa;
    return mask;
}

const ds4_kernel_set *ds4_kernels_for(int isa) {
    pthread_once(&g_once, build_sets);
    if (isa == DS4_ISA_AUTO) isa = ds4_isa_auto();
    if (isa < DS4_ISA_SCALAR || isa > DS4_ISA_NEON || !g_have[isa]) return NULL;
    return &g_sets[isa];
}
