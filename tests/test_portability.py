"""The generic (scalar) build must run on any x86-64 CPU, and the run-time
dispatcher must never offer an ISA the CPU lacks.

We compile tests/portable/kernel_hashes.c against the core's sources with the
package's own per-file flags (build_core.py), run it natively, then under
qemu-x86_64 emulating older CPUs: Nehalem (SSE4.2, no AVX) must detect only
the scalar path and compute identical results; Haswell (AVX2/FMA/F16C, no
AVX-512) must detect avx2 but not avx512 and agree bit for bit with the native
run. A SIGILL in the generic objects (e.g. the compiler vectorising the
scalar fallback with AVX because of a global -march flag) fails here.
"""

import os
import shutil
import subprocess
import sys

import pytest

import build_core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IN_CI = os.environ.get("CI") == "true"

pytestmark = pytest.mark.skipif(
    build_core.machine() != "x86_64" or not sys.platform.startswith("linux"),
    reason="x86-64 Linux portability check (static binary under qemu-user)",
)


def _build(tmp_path):
    objs = []
    cc = os.environ.get("CC", "gcc")
    base = build_core.BASE_CFLAGS + ["-Icsrc"]
    srcs = [(s, []) for s in build_core.platform_sources()]
    srcs += build_core.SIMD_VARIANTS["x86_64"]
    srcs.append(("tests/portable/kernel_hashes.c", []))
    for i, (src, flags) in enumerate(srcs):
        obj = str(tmp_path / f"{i}.o")
        subprocess.run([cc, *base, *flags, "-c", src, "-o", obj], cwd=ROOT, check=True)
        objs.append(obj)
    exe = str(tmp_path / "kernel_hashes")
    subprocess.run([cc, *objs, "-o", exe, "-lpthread", "-lm", "-static"], cwd=ROOT, check=True)
    return exe


def _run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}): {p.stdout[-2000:]} {p.stderr[-999:]}"
    lines = p.stdout.splitlines()
    avail = lines[0].split()[1:]
    results = {}
    for ln in lines[2:]:
        isa, rest = ln.split(" ", 1)
        results.setdefault(isa, []).append(rest)
    return avail, lines[1].split()[1], results


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("portable"))


def _qemu():
    q = shutil.which("qemu-x86_64")
    if q is None:
        if IN_CI:
            pytest.fail("qemu-x86_64 is missing under CI (.ci/run installs qemu-user)")
        pytest.skip("qemu-x86_64 not installed (apt-get install qemu-user)")
    return q


def test_native_run_covers_every_dot_type(exe):
    avail, auto, results = _run([exe])
    assert "scalar" in avail
    assert auto in avail
    # 15 weight types x (dequant, quant-act, dot) lines for the scalar ISA.
    assert len(results["scalar"]) == 15 * 3, results["scalar"]


@pytest.mark.parametrize("cpu,expect_avail", [
    ("Nehalem-v1", ["scalar"]),
    ("Haswell-noTSX", ["scalar", "avx2"]),
])
def test_older_cpu_runs_and_agrees(exe, cpu, expect_avail):
    qemu = _qemu()
    _, _, native = _run([exe])
    avail, auto, results = _run([qemu, "-cpu", cpu, exe])
    assert avail == expect_avail
    assert auto == expect_avail[-1]
    for isa in avail:
        assert results[isa] == native[isa], f"{isa} results differ under {cpu}"
