"""The shared GPU kernels under the threadgroup emulator (docs/gpu.md).

Builds gpu/tests/test_gpu_emul.c through the Makefile's gpu-emul-bin target
(one source list) and runs each suite; then builds variants with planted
faults and checks that each turns the suite red with the expected message.
Tolerances live in the C harness, each derived in docs/gpu.md.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "gpu", "tools"))
import amalgamate  # noqa: E402

# Minimum number of PASS lines per suite, so a suite that silently runs no
# checks (a loop over an empty shape list), or fewer than it did, fails
# instead of passing: each is the suite's count when it was last set
# (2026-12-07; several floors had fallen behind their suites, gdnseq's at
# 10 of 43). Raise it with the checks a change adds.
SUITES = {"tables": 7, "f16": 2, "rmsnorm": 18, "quantize": 5, "matvec": 16, "rope": 4,
          "attn": 20, "kquant": 23, "gdn": 8, "argmax": 4, "glue": 10, "fused": 39, "gdnseq": 43,
          "gdnnq": 9, "gemm": 50, "mma": 146, "moe": 182, "q4_64a": 23}


def build(tmp_dir, name, defs=""):
    binary = os.path.join(tmp_dir, name)
    r = subprocess.run(["make", "-s", "--no-print-directory", "gpu-emul-bin",
                        f"GPU_EMUL_BIN={binary}", f"GPU_EMUL_DEFS={defs}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return binary


def run(binary, *suites):
    r = subprocess.run([binary, *suites], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = r.stdout.splitlines()
    passed = [ln for ln in lines if ln.startswith("PASS")]
    return r.returncode, passed, [ln for ln in lines if ln.startswith("FAIL")]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return build(str(tmp_path_factory.mktemp("gpu-emul")), "test_gpu_emul")


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_suite_green(harness, suite):
    rc, passed, failed = run(harness, suite)
    assert failed == [] and rc == 0, "\n".join(failed)
    assert len(passed) >= SUITES[suite], passed


def test_attn_wide_at_metals_query_vectors(tmp_path):
    """attn_partials_wide at K_ATTN_WIDE_QV_METAL (16 query vectors a
    threadgroup: two SIMD-groups share each quad of queries in step 2,
    K_ATTN_WIDE_QPT halves) is the same code Metal compiles: the emulator
    runs suite attn with that bound, every wide check bit-identical."""
    src = open(os.path.join(ROOT, "gpu", "kernels", "table.h")).read()
    assert "#define K_ATTN_WIDE_QV_METAL 16u" in src
    binary = build(str(tmp_path), "attn_qv16", "-DK_ATTN_WIDE_QV=16u")
    rc, passed, failed = run(binary, "attn")
    assert failed == [] and rc == 0, "\n".join(failed)
    wide = [ln for ln in passed if "attn_partials_wide n_head" in ln]
    assert len(wide) == 7, passed
    assert any("(4 rows a group)" in ln and "G=4" in ln for ln in wide), wide


@pytest.mark.parametrize("defs", ["-DK_GDN_AHEAD=1 -DK_GDN_ROWS_PIPE=0", "-DK_GDN_AHEAD=3"])
def test_gdn_rows_token_loop_knobs(tmp_path, defs):
    """gdn_rows' look-ahead group size and paired butterflies change when
    work is issued, never a value: suite gdnseq (gdn_prep + gdn_rows +
    gdn_norm against n single-token launches, bit for bit) stays green with
    the previous token loop (one token ahead, k_gdn_row_step) and with
    groups of 3, which most of the 2..9-token shapes end partway through."""
    src = open(os.path.join(ROOT, "gpu", "kernels", "table.h")).read()
    assert "#define K_GDN_AHEAD 2" in src and "#define K_GDN_ROWS_PIPE 1" in src
    binary = build(str(tmp_path), "gdn_knobs", defs)
    rc, passed, failed = run(binary, "gdnseq")
    assert failed == [] and rc == 0, "\n".join(failed)
    assert len(passed) >= SUITES["gdnseq"], passed


def test_unknown_suite_is_an_error(harness):
    r = subprocess.run([harness, "nosuch"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown suite 'nosuch'" in r.stderr


# Each planted fault, the suite it must turn red, and what the failure says.
PLANTED = [
    # gdn_seq's conv window never advances past the stored state: caught bit
    # for bit against n single-token gdn_conv + gdn_delta launches
    ("PLANT_GDN_SEQ_STALE_CONV", "gdnseq",
     r"n_k=2 n_v=4 d=64 taps=4 tg=64 tokens=5 split=1: gdn_seq \(one launch\) "
     r"bit-identical .*outputs DIFFER"),
    # gdn_rows meets each token with the previous token's q, k, v and gates:
    # caught bit for bit against n single-token gdn_conv + gdn_delta launches
    ("PLANT_GDN_ROWS_LAG", "gdnseq",
     r"n_k=2 n_v=4 d=64 taps=4 tg=64 tokens=5: gdn_prep \+ gdn_rows \(1 rows a SIMD-group, "
     r"\d+ threads\) \+ gdn_norm bit-identical .*outputs DIFFER"),
    # the prefill GEMM reads the next weight row (in bounds): caught bit for
    # bit against the width-1 matvec
    ("PLANT_GEMM_OFF_BY_ONE_ROW", "gemm",
     r"(Q8_0|Q4_K|Q5_K|Q6_K) n_in=\d+ n_out=(5|17|23) rows=\d+: "
     r"every value bit-identical to the width-1 matvec"),
    # the tensor-core GEMMs swap the A fragment registers of rows g and g + 8
    # (one k slice): caught bit for bit against the dp4a GEMM and the matvec
    ("PLANT_MMA_FRAGMENT_SWAP", "mma",
     r"(Q8_0|Q4_K|Q5_K|Q6_K) n_in=\d+ n_out=(5|37|70) rows=(17|45|130): "
     r"every value bit-identical to the dp4a GEMM"),
    # matvec reads the next weight row (in bounds): caught by the CPU comparison
    ("PLANT_OFF_BY_ONE_ROW", "matvec", r"n_in=\d+ n_out=(5|17): within the reordering bound"),
    # the barrier after attention's K/V tile copy removed: caught by the race shadow
    ("PLANT_MISSING_BARRIER", "attn",
     r"since the last barrier \(missing barrier\?\)|never written"),
    # one thread of rmsnorm skips the barrier: caught as barrier divergence
    ("PLANT_BARRIER_DIVERGENCE", "rmsnorm", r"barrier divergence: \d+ threads wait at the barrier"),
    # params and activations bound at each other's slot: refused by the host check
    ("PLANT_WRONG_ARG", "matvec", r"slot 1 \(params\) holds \d+ bytes, the params struct is 20"),
    # the same launched without the host check: the kernel's tag check raises
    ("PLANT_WRONG_ARG_UNCHECKED", "matvec", r"raised status 0x1 \(K_ERR_TAG"),
    # GDN value heads read grouped instead of tiled k heads: caught by the bound
    ("PLANT_GDN_WRONG_KHEAD", "gdn", r"delta n_k=2 n_v=4 d=64 tg=64: state and output within"),
    # the K-quant matvec reads the next weight row (in bounds): caught by the CPU comparison
    ("PLANT_KQ_OFF_BY_ONE_ROW", "kquant",
     r"matvec Q\d_K n_in=\d+ n_out=7: within the reordering bound"),
    # argmax ties to the highest index: caught by the CPU's rule
    ("PLANT_ARGMAX_LAST_TIE", "argmax", r"n=1000 rows=6 k=5: argmax = the CPU's"),
    # norm_quant reads the Q8_K chunk winners without its barrier: the race shadow
    ("PLANT_FUSED_NO_BARRIER", "fused",
     r"norm_quant: .*since the last barrier \(missing barrier\?\)"),
    # swiglu_quant regroups SiLU(g) * u: caught bit for bit against swiglu + quantize
    ("PLANT_FUSED_SWIGLU_ORDER", "fused",
     r"swiglu_quant n=1280 rows=3 .* flags=0xc tg=128: .*bit-identical"),
    # gdn_norm_quant reads the 256 values for the Q8_K block without its barrier: the race shadow
    ("PLANT_GDN_NQ_NO_BARRIER", "gdnnq",
     r"gdn_norm_quant: .*(since the last barrier \(missing barrier\?\)|never written)"),
    # qk_norm_rope rotates the pairs without the barrier after the norm: the race shadow
    ("PLANT_FUSED_ROPE_NO_BARRIER", "fused",
     r"qk_norm_rope: .*(since the last barrier \(missing barrier\?\)|never written)"),
    # attn_gate_quant's Q8_K |max| ties to the higher index: caught against
    # attn_gate + quantize_q8_K
    ("PLANT_FUSED_GATE_LAST_TIE", "fused",
     r"attn_gate_quant n_head=4 head_dim=64 rows=3 flags=0x8 .*bit-identical"),
    # moe_gate_up reads the next expert's rows (in bounds): caught bit for bit
    # against the dense matvecs of the chosen experts
    ("PLANT_MOE_NEXT_EXPERT", "moe",
     r"ne=13 k=3 .* gate_up: h bit-identical to SwiGLU of the dense"),
    # the grouped MoE GEMM reads the next expert's rows (in bounds): caught
    # bit for bit against the per-pair kernels' rows and y
    ("PLANT_MOE_GEMM_NEXT_EXPERT", "moe",
     r"ne=13 k=3 .* grouped rows=40: gate/up GEMM \+ swiglu_quant = the per-pair"),
    # attn_partials_wide adds each score's per-lane products in descending
    # element order: caught bit for bit against attn_partials' partials
    ("PLANT_ATTN_WIDE_CHAIN_ORDER", "attn",
     r"attn_partials_wide n_head=8 kv=2 G=4 head_dim=256 pos0=0 rows=40 .*: "
     r"every partial bit-identical"),
    # moe_logits_wide adds a router row's S partials in descending order:
    # caught bit for bit against moe_logits at the bench router's shape
    ("PLANT_MOE_WIDE_PARTIAL_ORDER", "moe",
     r"moe_logits_wide n_in=2048 n_out=9 rows=70 split 16: bit-identical to moe_logits"),
    # the Q4_64A matvec reads each byte's two codes swapped (odd codes from
    # the low nibble): caught by the CPU's dot and the exact value
    ("PLANT_Q4_64A_NIBBLE_SWAP", "q4_64a",
     r"n_in=\d+ n_out=(1|5|17): within the bound of the CPU's dot"),
    # moe_route sends equal probabilities to the higher expert id: caught
    # against the exact softmax's top-k
    ("PLANT_MOE_LAST_TIE", "moe",
     r"ne=37 k=8 .* route: experts and slots = the exact softmax's top-8"),
]


@pytest.mark.parametrize("define,suite,pattern", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_fault_turns_red(tmp_path, define, suite, pattern):
    binary = build(str(tmp_path), "planted", f"-D{define}")
    rc, _, failed = run(binary, suite)
    assert rc == 1
    assert any(re.search(pattern, ln) for ln in failed), "\n".join(failed[:5])


def test_metal_source_is_current():
    """metal/kernels_source.h is what the amalgamator makes of gpu/ now."""
    want = amalgamate.as_c_string("ds4_metal_source", amalgamate.amalgamate("metal"))
    with open(os.path.join(ROOT, "metal", "kernels_source.h")) as f:
        assert f.read() == want, ("regenerate: python gpu/tools/amalgamate.py metal "
                                  "--c-string ds4_metal_source > metal/kernels_source.h")


@pytest.mark.parametrize("target", ["metal", "cuda"])
def test_amalgamation_expands_every_kernel_from_its_table(tmp_path, target):
    """The one-file source has no local include left, and after the
    preprocessor (metal_stdlib / cuda headers left out) every kernel's
    signature carries its table's arguments in slot order."""
    text = amalgamate.amalgamate(target)
    assert not re.search(r'#\s*include\s+"', text)
    src = tmp_path / "k.c"
    # cuda.h includes system headers; keep only what the preprocessor needs
    src.write_text(text.replace("#include <cuda_fp16.h>", "").replace("#include <math.h>", "")
                   .replace("#include <stdint.h>", ""))
    cpp = shutil.which("cpp") or shutil.which("gcc")
    args = [cpp] if cpp.endswith("cpp") else [cpp, "-E"]
    r = subprocess.run([*args, "-P", "-DK_PREPROCESS_ONLY", str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for name, slots in [("matvec_q8_0", ["status", "p", "w", "xq", "y"]),
                        ("attn_partials", ["status", "p", "q", "kpool", "vpool", "pages", "part"]),
                        ("matvec_kq", ["status", "p", "w", "xq", "y"]),
                        ("gdn_delta", ["status", "p", "cv", "z", "ab", "hp", "s", "o"]),
                        ("argmax_rows", ["status", "p", "x", "idx"]),
                        ("matvec_q4_64a1", ["status", "p", "w", "xq", "y"]),
                        ("matvec_q4_64a", ["status", "p", "w", "xq", "y"])]:
        m = re.search(r"void k_" + name + r"\((.*?)\)\s*\{", out, re.S)
        assert m, name
        params = [re.sub(r"\s*\[\[.*?\]\]", "", a).strip() for a in m.group(1).split(",")]
        names = [re.findall(r"\w+", a)[-1] for a in params]
        assert names[:len(slots)] == slots, params
        if target == "metal":
            for i, (a, s) in enumerate(zip(m.group(1).split(","), slots, strict=False)):
                assert f"[[buffer({i})]]" in a, (s, a)


def test_metal_source_type_checks_as_cpp(tmp_path):
    """The Metal amalgamation compiles as C++ against gpu/tools/metal_mock.h
    (Metal's names declared, address spaces and attributes dropped). Not a
    Metal compiler, but it catches what breaks only the Metal flavour: a
    helper using K_TID (a kernel parameter on Metal), a missing dialect name,
    a type error in code the emulator compiles as C."""
    src = tmp_path / "k.metal.cpp"
    src.write_text(amalgamate.amalgamate("metal"))
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    assert cxx, "a C++ compiler is needed (CI installs g++ with the C toolchain)"
    mock = os.path.join(ROOT, "gpu", "tools", "metal_mock.h")
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-Wno-attributes",
                        "-Wno-unknown-attributes", "-Wno-unknown-pragmas", "-Wno-unused-function",
                        "-Wno-unknown-warning-option", "-DK_PREPROCESS_ONLY",
                        "-include", mock, str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


def test_device_check_script_parses_and_its_targets_exist():
    """gpu/tools/device_check.sh is run on the GPU machine in one go, where a
    typo costs a whole device call: it must parse, and the make targets it
    builds must exist (make -n only prints their commands)."""
    script = os.path.join(ROOT, "gpu", "tools", "device_check.sh")
    r = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["make", "-n", "cuda", "cuda-test", "cuda-bench"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "bench_matvec" in r.stdout and "test_gpu_cuda" in r.stdout
