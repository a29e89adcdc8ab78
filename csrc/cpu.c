/*
 * cpu.c — which kernel ISA this machine can run.
 *
 * CPUID alone is not enough: an instruction set is usable only when the OS
 * saves its register state on context switches (XCR0, read with xgetbv). Most
 * VMs this project is developed on advertise AMX in CPUID yet fault on it (one,
 * on 2026-12-06, granted it: arch_prctl(ARCH_REQ_XCOMP_PERM) and a tile
 * multiply both worked), and no kernel uses AMX; AVX-512 is used only when
 * XCR0 enables the opmask and both ZMM state components.
 */
#include "ds4.h"
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    /* xgetbv with ecx=0; encoded as bytes so no -mxsave flag is needed. */
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static int detect(void) {
    int avail = 1 << DS4_ISA_SCALAR;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return avail;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1,
        f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return avail;
    uint64_t xcr0 = read_xcr0();
    int os_ymm = (xcr0 & 0x6) == 0x6;          /* SSE + AVX state */
    int os_zmm = (xcr0 & 0xe6) == 0xe6;        /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (__get_cpuid_max(0, NULL) < 7) return avail;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1;
    int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1,
        avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    int avx512vnni = (c >> 11) & 1;
    if (os_ymm && avx2 && fma && f16c) avail |= 1 << DS4_ISA_AVX2;
    if ((avail & (1 << DS4_ISA_AVX2)) && os_zmm && avx512f && avx512dq &&
        avx512bw && avx512vl && avx512vnni)
        avail |= 1 << DS4_ISA_AVX512;
    return avail;
}

#elif defined(__aarch64__)
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
static int has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
#elif defined(__APPLE__)
#include <sys/sysctl.h>
static int has_dotprod(void) {
    int v = 0;
    size_t len = sizeof v;
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) != 0) return 0;
    return v != 0;
}
#else
static int has_dotprod(void) { return 0; }
#endif
/* Our NEON kernels use the dot-product extension (ARMv8.2 SDOT), present on
 * every Apple-silicon Mac and on current ARM servers. */
static int detect(void) {
    int avail = 1 << DS4_ISA_SCALAR;
    if (has_dotprod()) avail |= 1 << DS4_ISA_NEON;
    return avail;
}

#else
static int detect(void) { return 1 << DS4_ISA_SCALAR; }
#endif

static int g_cpu_mask = -1;

int ds4_cpu_isa_mask(void) {
    /* Benign race: every thread computes the same value. */
    if (g_cpu_mask < 0) g_cpu_mask = detect();
    return g_cpu_mask;
}

int ds4_force_scalar(void) {
    const char *v = getenv("DS4_FORCE_SCALAR");
    return v && *v && strcmp(v, "0") != 0;
}

/* DS4_FORCE_ISA=avx2 (or scalar): AUTO runs that set when this machine can,
 * so an AVX-512 machine can run and measure what an AVX2-only one runs
 * (tests/test_avx2_paths.py, bench/bench_isa_ab.py). Unset, or an ISA that is
 * not available here: no effect (DS4PY_PATHS names the set that ran). */
static int forced_isa(int avail) {
    const char *v = getenv("DS4_FORCE_ISA");
    if (!v || !*v) return -1;
    for (int isa = DS4_ISA_SCALAR; isa <= DS4_ISA_NEON; isa++)
        if (strcmp(v, ds4_isa_name(isa)) == 0 && (avail & (1 << isa))) return isa;
    return -1;
}

int ds4_isa_auto(void) {
    if (ds4_force_scalar()) return DS4_ISA_SCALAR;
    int a = ds4_isa_available();
    const int forced = forced_isa(a);
    if (forced >= 0) return forced;
    if (a & (1 << DS4_ISA_AVX512)) return DS4_ISA_AVX512;
    if (a & (1 << DS4_ISA_AVX2)) return DS4_ISA_AVX2;
    if (a & (1 << DS4_ISA_NEON)) return DS4_ISA_NEON;
    return DS4_ISA_SCALAR;
}

const char *ds4_isa_name(int isa) {
    switch (isa) {
    case DS4_ISA_AUTO: return "auto";
    case DS4_ISA_SCALAR: return "scalar";
    case DS4_ISA_AVX2: return "avx2";
    case DS4_ISA_AVX512: return "avx512";
    case DS4_ISA_NEON: return "neon";
    default: return "unknown";
    }
}
