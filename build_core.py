"""cffi build script (out-of-line API mode) for ds4py._ds4core.

The cdef is csrc/ds4.h itself, from its "cffi reads from here on" marker, so
the C API is declared in exactly one place. Sources compiled with the baseline
flags are listed here; the SIMD variants get their own flags in setup.py.
"""

import os
import platform
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc")

# Generic (portable) C sources. SIMD kernel files are NOT here: setup.py
# compiles each with its own -m flags and links the objects in.
GENERIC_SOURCES = [
    "csrc/error.c",
    "csrc/cpu.c",
    "csrc/gguf.c",
    "csrc/quants/traits.c",
    "csrc/quants/scalar.c",
    "csrc/quants/dispatch.c",
    "csrc/quants/kernels_api.c",
    "csrc/quants/quantize_weights.c",
    "csrc/model.c",
    "csrc/model_config.c",
    "csrc/session.c",
    "csrc/pool.c",
    "csrc/forward/forward.c",
    "csrc/forward/kv.c",
    "csrc/forward/matmul.c",
    "csrc/forward/norm.c",
    "csrc/forward/gdn.c",
    "csrc/forward/attention.c",
    "csrc/forward/ffn.c",
    "csrc/forward/moe.c",
    "csrc/forward/nextn.c",
    "csrc/forward/dflash.c",
    "csrc/dflash_load.c",
    "csrc/bench_loop.c",
    "csrc/membw.c",
    "csrc/paths.c",
    "csrc/spec_round.c",
]

# Per-variant sources and their target flags (x86-64 and arm64). A variant
# whose flags the compiler rejects is built without them; its file then
# compiles to a stub (it checks the target macros) and the ISA is reported
# unavailable.
SIMD_VARIANTS = {
    "x86_64": [
        ("csrc/quants/avx2.c", ["-mavx2", "-mfma", "-mf16c"]),
        ("csrc/quants/avx2_fwd.c", ["-mavx2", "-mfma", "-mf16c"]),
        ("csrc/quants/attn_avx2.c", ["-mavx2", "-mfma", "-mf16c"]),
        ("csrc/quants/avx512.c", ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw",
                                  "-mavx512dq", "-mavx512vl", "-mavx512vnni"]),
        ("csrc/quants/attn_avx512.c", ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw",
                                       "-mavx512dq", "-mavx512vl"]),
        ("csrc/quants/neon.c", []),
    ],
    "arm64": [
        ("csrc/quants/avx2.c", []),
        ("csrc/quants/avx2_fwd.c", []),
        ("csrc/quants/attn_avx2.c", []),
        ("csrc/quants/avx512.c", []),
        ("csrc/quants/attn_avx512.c", []),
        ("csrc/quants/neon.c", ["-march=armv8.2-a+dotprod+fp16"]),
    ],
}

# -ffp-contract=off: the core promises bit-exact dequantization, quantizers
# and reference dots; letting the compiler fuse a*b+c into an FMA would change
# rounding between builds and machines. SIMD files use explicit FMA intrinsics
# where they want them. -fno-strict-aliasing is not needed: we memcpy.
BASE_CFLAGS = ["-std=c11", "-O2", "-ffp-contract=off", "-fvisibility=hidden",
               "-Wall", "-Wextra", "-Wno-unused-parameter", "-D_GNU_SOURCE"]


def machine():
    m = platform.machine().lower()
    if m in ("x86_64", "amd64"):
        return "x86_64"
    if m in ("arm64", "aarch64"):
        return "arm64"
    return m


def platform_sources():
    srcs = list(GENERIC_SOURCES)
    # Metal: the Objective-C backend lives in metal/*.m on macOS. Until it
    # exists, every platform builds the stub that reports it unavailable.
    # The Objective-C host (metal/host.m) has never been compiled (no Mac
    # yet, docs/gpu.md): it is built only on request, DS4PY_BUILD_METAL=1.
    metal_objc = [os.path.join("metal", f) for f in sorted(os.listdir(os.path.join(HERE, "metal")))
                  if f.endswith(".m")] if build_metal() else []
    srcs += metal_objc + ["gpu/host/bind.c"] if metal_objc else ["metal/metal_stub.c"]
    return srcs


def build_metal():
    return sys.platform == "darwin" and os.environ.get("DS4PY_BUILD_METAL") == "1"


def read_cdef():
    with open(os.path.join(HERE, "csrc", "ds4.h")) as f:
        text = f.read()
    marker = "/* --- cffi reads from here on --- */"
    body = text.split(marker, 1)[1]
    lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("#")]
    return "\n".join(lines)


ffibuilder = FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "ds4py._ds4core",
    '#include "ds4.h"\n',
    sources=platform_sources(),
    include_dirs=["csrc"],
    extra_compile_args=BASE_CFLAGS,
    libraries=["pthread", "m"] if sys.platform != "win32" else [],
    extra_link_args=["-framework", "Metal", "-framework", "Foundation"] if build_metal() else [],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
