/*
 * kernel_hashes.c — prints which ISAs the core detects and a hash of every
 * kernel's output per ISA. tests/test_portability.py builds this with the
 * package's own per-file flags and runs it natively and under qemu-x86_64 on
 * older CPU models: the generic code must not contain instructions the CPU
 * lacks (no SIGILL), detection must not offer what the CPU lacks, and every
 * ISA that runs must give the same hashes as natively.
 *
 * Usage: kernel_hashes            -> one line per ISA available + hashes
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4.h"

static uint64_t lcg_state = 0x9E3779B97F4A7C15ull;
static uint32_t lcg(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(lcg_state >> 33);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define N 512 /* a multiple of every block size we compute with */

int main(void) {
    int avail = ds4_isa_available();
    printf("available");
    for (int isa = DS4_ISA_SCALAR; isa <= DS4_ISA_NEON; isa++)
        if (avail & (1 << isa)) printf(" %s", ds4_isa_name(isa));
    printf("\nauto %s\n", ds4_isa_name(ds4_isa_auto()));

    static unsigned char w[N * 4], aq[N * 4];
    static float x[N], a[N], out[N];
    for (int isa = DS4_ISA_SCALAR; isa <= DS4_ISA_NEON; isa++) {
        if (!(avail & (1 << isa))) continue;
        for (int t = 0; t < DS4_TYPE_COUNT; t++) {
            ds4_type_info ti;
            ds4_error err;
            if (ds4_type_get_info(t, &ti, &err) || !(ti.flags & DS4_TYPE_DOT)) continue;
            lcg_state = 1234 + t; /* same data for every ISA */
            for (int i = 0; i < N; i++) {
                x[i] = (float)((int)(lcg() % 2001) - 1000) / 997.0f;
                a[i] = (float)((int)(lcg() % 2001) - 1000) / 991.0f;
            }
            /* Weights: random bytes with every 16-bit word's exponent kept
             * finite so fp16/bf16 scales are numbers. */
            size_t wbytes = (size_t)(N / ti.block_size) * (size_t)ti.type_size;
            for (size_t i = 0; i < wbytes; i++) w[i] = (unsigned char)lcg();
            for (size_t i = 1; i < wbytes; i += 2) w[i] &= 0x3B;
            uint64_t h = 0xcbf29ce484222325ull;
            int rc = ds4_dequantize_row(isa, t, w, out, N, &err);
            if (rc) { printf("error %s %s: %s\n", ds4_isa_name(isa), ti.name, err.message); return 1; }
            h = fnv(h, out, sizeof out);
            printf("%s dequant %s %016llx\n", ds4_isa_name(isa), ti.name, (unsigned long long)h);
            if (ds4_quantize_row(isa, ti.vec_dot_type, a, aq, N, &err)) {
                printf("error %s quantize for %s: %s\n", ds4_isa_name(isa), ti.name, err.message);
                return 1;
            }
            h = fnv(0xcbf29ce484222325ull, aq, sizeof aq);
            printf("%s quant-act %s %016llx\n", ds4_isa_name(isa), ti.name, (unsigned long long)h);
            float s1 = 0, s2 = 0;
            if (ds4_vec_dot(isa, t, w, ti.vec_dot_type, aq, N, &s1, &err) ||
                ds4_vec_dot(isa, t, w, DS4_TYPE_F32, x, N, &s2, &err)) {
                printf("error %s dot %s: %s\n", ds4_isa_name(isa), ti.name, err.message);
                return 1;
            }
            printf("%s dot %s %.9g %.9g\n", ds4_isa_name(isa), ti.name, s1, s2);
        }
    }
    return 0;
}
