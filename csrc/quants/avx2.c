/* avx2.c — placeholder until the SIMD kernels land: provides nothing, so the
 * dispatcher reports this ISA as unavailable. */
#include "quants.h"

int ds4_kernels_init_avx2(ds4_kernel_set *k) {
    (void)k;
    return 0;
}
