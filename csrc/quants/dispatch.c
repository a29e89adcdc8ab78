/*
 * dispatch.c — one kernel set per ISA, built once on first use.
 */
#include "quants.h"
#include "../cpu.h"

#include <pthread.h>

static ds4_kernel_set g_sets[5];
static int g_have[5];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_sets(void) {
    int avail = ds4_cpu_isa_mask();
    ds4_kernels_init_scalar(&g_sets[DS4_ISA_SCALAR]);
    g_have[DS4_ISA_SCALAR] = 1;
    if (avail & (1 << DS4_ISA_AVX2)) {
        g_sets[DS4_ISA_AVX2] = g_sets[DS4_ISA_SCALAR];
        g_have[DS4_ISA_AVX2] = ds4_kernels_init_avx2(&g_sets[DS4_ISA_AVX2]);
    }
    if (avail & (1 << DS4_ISA_AVX512)) {
        /* AVX-512 overrides what it speeds up on top of the AVX2 set. */
        g_sets[DS4_ISA_AVX512] = g_sets[DS4_ISA_AVX2];
        g_have[DS4_ISA_AVX512] = g_have[DS4_ISA_AVX2] &&
                                 ds4_kernels_init_avx512(&g_sets[DS4_ISA_AVX512]);
    }
    if (avail & (1 << DS4_ISA_NEON)) {
        g_sets[DS4_ISA_NEON] = g_sets[DS4_ISA_SCALAR];
        g_have[DS4_ISA_NEON] = ds4_kernels_init_neon(&g_sets[DS4_ISA_NEON]);
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
