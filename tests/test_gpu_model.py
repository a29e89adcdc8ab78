"""A whole dense model on the GPU layer loop (gpu/host/runner.c), run under
the threadgroup emulator: every kernel launch of a real forward pass, with
the emulator's memory/barrier checks, against the CPU forward pass and
llama.cpp's golden logits.

The binary (gpu/tests/test_gpu_model.c) is built by `make gpu-model-bin`
from the same C core the Python extension compiles; the very same loop runs
on CUDA (`make cuda-model`, docs/gpu.md §7).

Tolerances (the GPU is not bit-identical to the CPU, by design, docs/gpu.md
§3): the GPU attention accumulates V in float, where the CPU's fast path
keeps llama.cpp's one-chunk F16 accumulator (csrc/forward/attention.c); the
CPU rebuilt with its F32 recipe (DS4_FAST_ATTN_F16 0) agrees with the GPU to
~5e-7 per hidden value layer by layer, and the remaining logit differences
come from Q8 activation rounding flips that 1-ulp differences trigger.
Measured on dense-q8_0 (s100, logits up to ~19): GPU vs CPU row max |d| 0.47,
mean KL 0.0027; GPU vs llama.cpp top-16 max |d| 0.34 (the CPU's own: 0.62).
The bounds below are about 2x those.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import ds4py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")
DENSE = os.path.join(GOLDEN, "models", "dense-q8_0.gguf")
DEMO = os.path.join(ROOT, "ds4py", "models", "demo-q8_0.gguf")
MOE = os.path.join(GOLDEN, "models", "moe-q8_0.gguf")

MAX_ABS_VS_LLAMA = 1.0   # top-16 logits vs llama.cpp: measured 0.34 (CPU: 0.62)
MAX_ABS_VS_CPU = 1.0     # every logit vs the CPU fast path: measured 0.47
MEAN_KL_VS_CPU = 0.01    # measured 0.0027
CLEAR_MARGIN = 0.5       # top-1 must agree where llama.cpp's top-2 gap exceeds this


def build(out, defs=""):
    r = subprocess.run(["make", "-s", "--no-print-directory", "gpu-model-bin",
                        f"GPU_MODEL_DIR={out}", f"GPU_MODEL_DEFS={defs}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    path = os.path.join(out, "test_gpu_model")
    assert os.access(path, os.X_OK), r.stdout
    return path


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    return build(str(tmp_path_factory.mktemp("gpu-model")))


def run_gpu(binary, tmp_path, model, tokens, n_greedy, prefill_chunk=None, env_extra=None):
    """prefill_chunk: the runner's prompt chunk (K_RUNNER_PREFILL_CHUNK; None:
    its default, 512), so a prompt can cross chunk boundaries here;
    env_extra: more K_RUNNER_* settings."""
    toks = os.path.join(tmp_path, "tokens.i32")
    np.asarray(tokens, dtype=np.int32).tofile(toks)
    prefix = os.path.join(tmp_path, "out")
    env = dict(os.environ)
    if prefill_chunk:
        env["K_RUNNER_PREFILL_CHUNK"] = str(prefill_chunk)
    env.update(env_extra or {})
    r = subprocess.run([binary, model, toks, prefix, str(n_greedy)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(tokens)
    pre = np.fromfile(prefix + ".prefill.f32", dtype=np.float32).reshape(n, -1)
    dec = np.fromfile(prefix + ".decode.f32", dtype=np.float32).reshape(n, -1)
    # the prompt eval (prefill chunks, only the last row wanted) gives the
    # all-rows eval's last row bit for bit: chunking never changes a value
    last = np.fromfile(prefix + ".last.f32", dtype=np.float32)
    assert last.tobytes() == pre[-1].tobytes(), np.abs(last - pre[-1]).max()
    greedy = np.fromfile(prefix + ".greedy.i32", dtype=np.int32) if n_greedy else None
    return pre, dec, greedy


def run_gpu_prefill(binary, tmp_path, model, tokens, env_extra):
    """Only the all-rows prefill (K_TEST_PREFILL_ONLY: no prompt eval, no
    decode), for checks of one more GEMM path against a run_gpu's rows."""
    os.makedirs(tmp_path, exist_ok=True)
    toks = os.path.join(tmp_path, "tokens.i32")
    np.asarray(tokens, dtype=np.int32).tofile(toks)
    prefix = os.path.join(tmp_path, "out")
    r = subprocess.run([binary, model, toks, prefix, "0"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "K_TEST_PREFILL_ONLY": "1", **env_extra})
    assert r.returncode == 0, r.stdout + r.stderr
    return np.fromfile(prefix + ".prefill.f32", dtype=np.float32).reshape(len(tokens), -1)


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def cpu_greedy(model, tokens, n):
    """The CPU's greedy continuation and the top-2 gap at each step."""
    out, gaps = [], []
    with model.new_session() as s:
        lg = np.array(s.eval(tokens)).reshape(-1)
        for _ in range(n):
            top = np.sort(lg)
            out.append(int(lg.argmax()))
            gaps.append(float(top[-1] - top[-2]))
            lg = np.array(s.eval([out[-1]])).reshape(-1)
    return out, gaps


def check_against_cpu(model, tokens, pre):
    with model.new_session() as s:
        cpu = np.array(s.eval(tokens, all_logits=True))
    assert np.abs(pre - cpu).max() <= MAX_ABS_VS_CPU, np.abs(pre - cpu).max(axis=1)
    p, q = log_softmax(cpu), log_softmax(pre)
    kl = (np.exp(p) * (p - q)).sum(axis=1)
    assert kl.mean() <= MEAN_KL_VS_CPU, kl


def check_greedy(model, tokens, greedy):
    """Greedy tokens equal the CPU's up to the first step whose top-2 gap is
    inside the tolerance (a near tie may legitimately go either way)."""
    want, gaps = cpu_greedy(model, tokens, len(greedy))
    compared = 0
    for got, w, gap in zip(greedy.tolist(), want, gaps, strict=True):
        assert got == w or gap < MAX_ABS_VS_CPU, (greedy.tolist(), want, gaps)
        if got != w:
            break
        compared += 1
    assert compared >= len(greedy) // 2, (greedy.tolist(), want, gaps)


def test_golden_dense_q8_0(binary, tmp_path):
    toks = np.load(os.path.join(GOLDEN, "logits", "sequences.npz"))["s100"]
    # the prompt eval in chunks of 40 rows (40 + 40 + 20: all through the
    # GEMM, the GDN layers' gdn_prep + gdn_rows + gdn_norm, attention for
    # the whole chunk in one launch pair)
    pre, dec, greedy = run_gpu(binary, str(tmp_path), DENSE, toks, 16, prefill_chunk=40)
    # Batch invariance on the GPU path: 100 rows in 16-row chunks == 100
    # one-row evals, bit for bit (matvec widths, split-K attention).
    np.testing.assert_array_equal(pre.view(np.uint32), dec.view(np.uint32))
    gold = np.load(os.path.join(GOLDEN, "logits", "dense-q8_0.npz"))
    ids, vals = gold["s100_one_topk_ids"], gold["s100_one_topk_vals"]
    assert np.abs(np.take_along_axis(pre, ids, axis=1) - vals).max() <= MAX_ABS_VS_LLAMA
    top = np.sort(vals, axis=1)
    clear = top[:, -1] - top[:, -2] > CLEAR_MARGIN
    assert clear.sum() >= 50
    np.testing.assert_array_equal(pre.argmax(axis=1)[clear], ids[clear, 0])
    model = ds4py.load(DENSE, n_threads=2)
    check_against_cpu(model, toks, pre)
    check_greedy(model, toks, greedy)
    # 24 rows in one chunk through the dp4a gemm_q8_0 (gemm.h: Metal's; the
    # default is gemm_q8_0_mma): the rows of the 40-row chunks' run
    pm = run_gpu_prefill(binary, os.path.join(str(tmp_path), "dp4a"), DENSE, toks[:24],
                         {"K_RUNNER_GEMM": "dp4a"})
    np.testing.assert_array_equal(pm.view(np.uint32), pre[:24].view(np.uint32))
    # the same 24 rows with the GDN recurrence in gdn_seq (not gdn_prep +
    # gdn_rows, the default for runs of 2+ tokens) and attention launched 5
    # query rows at a time, one query row per threadgroup (the default: the
    # whole chunk, K_ATTN_MAX_QV / G rows per threadgroup sharing each K/V
    # tile): the same bits
    ps = run_gpu_prefill(binary, os.path.join(str(tmp_path), "seq"), DENSE, toks[:24],
                         {"K_RUNNER_GDN_ROWS_MIN": "0", "K_RUNNER_ATTN_ROWS": "5",
                          "K_RUNNER_ATTN_RG": "1"})
    np.testing.assert_array_equal(ps.view(np.uint32), pre[:24].view(np.uint32))


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M"])
def test_demo_model(binary, tmp_path, quant):
    """The trained demo model; as shipped (Q8_0), and requantized by
    gguf_tools to llama.cpp's Q4_K_M mix (Q4_K + Q6_K matrices), so the
    K-quant matvecs run inside a real forward pass."""
    path = DEMO
    if quant != "Q8_0":
        path = os.path.join(str(tmp_path), "demo-q4_k_m.gguf")
        r = subprocess.run([sys.executable, "-m", "gguf_tools", "requantize", "--type", quant,
                            "--allow-requantize", DEMO, path],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    model = ds4py.load(path, n_threads=2)
    toks = model.tokenizer.encode("def is_prime(n):\n    if n < 2:")[:12]
    assert len(toks) >= 6
    pre, dec, greedy = run_gpu(binary, str(tmp_path), path, toks, 8)
    np.testing.assert_array_equal(pre.view(np.uint32), dec.view(np.uint32))
    check_against_cpu(model, toks, pre)
    check_greedy(model, toks, greedy)


def test_prefill_gemm_kquant(binary, tmp_path):
    """The prefill GEMM's K-quant path inside a real forward pass: 21 rows in
    one chunk (wider than the matvecs' 16, so every Q4_K/Q6_K matrix runs
    gemm_kq, its row tile 16 + a 5-row tail) must equal 21 one-row decode
    evals (the matvecs) bit for bit, and the CPU within the module's
    tolerances. (The Q8_0 GEMM: test_golden_dense_q8_0's 100 rows, chunks of
    64 + 36.)"""
    path = os.path.join(str(tmp_path), "demo-q4_k_m.gguf")
    r = subprocess.run([sys.executable, "-m", "gguf_tools", "requantize", "--type", "Q4_K_M",
                        "--allow-requantize", DEMO, path],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    model = ds4py.load(path, n_threads=2)
    toks = model.tokenizer.encode("def is_prime(n):\n    if n < 2:\n        return False\n"
                                  "    for i in range(2, n):\n        if n % i == 0:")[:21]
    assert len(toks) == 21
    pre, dec, _ = run_gpu(binary, str(tmp_path), path, toks, 0)
    np.testing.assert_array_equal(pre.view(np.uint32), dec.view(np.uint32))
    check_against_cpu(model, toks, pre)
    # the same rows through the dp4a GEMMs (gemm.h: Metal's; the default is
    # the int8 tensor-core GEMMs, gemm_mma.h): the same bits
    pm = run_gpu_prefill(binary, os.path.join(str(tmp_path), "dp4a"), path, toks,
                         {"K_RUNNER_GEMM": "dp4a"})
    np.testing.assert_array_equal(pm.view(np.uint32), pre.view(np.uint32))


@pytest.mark.parametrize("name, words", [
    ("dense-q4_k_m", ["Q5_0", "has no GPU kernel", "blk."]),
    ("moe-q4_k_m", ["Q5_0", "has no GPU kernel", "blk."]),
])
def test_refuses_what_it_cannot_run(binary, tmp_path, name, words):
    """Fail closed: a tensor type or architecture without GPU kernels is
    refused at open, named, never run wrong."""
    toks = os.path.join(str(tmp_path), "t.i32")
    np.array([1, 2], dtype=np.int32).tofile(toks)
    r = subprocess.run([binary, os.path.join(GOLDEN, "models", name + ".gguf"), toks,
                        os.path.join(str(tmp_path), "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    for w in words:
        assert w in r.stdout, r.stdout


def run_spec(binary, tmp_path, model, tokens, n_gen):
    toks = os.path.join(str(tmp_path), "spec.i32")
    np.asarray(tokens, dtype=np.int32).tofile(toks)
    return subprocess.run([binary, "--spec", model, toks, str(n_gen)], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("model", [DENSE, DEMO, MOE],
                         ids=["golden-dense-q8_0", "demo", "golden-moe-q8_0"])
def test_speculative_equals_serial(binary, tmp_path, model):
    """verify/accept on the GPU path: greedy speculative decoding (drafts
    right and wrong, depths 1..7, so accept rolls the GDN state back to
    every prefix length) keeps exactly the serial rows, logits bit for bit."""
    toks = np.load(os.path.join(GOLDEN, "logits", "sequences.npz"))["s16"]
    n_gen = 40 if model == DENSE else 20  # the demo and MoE models are slower under the emulator
    if model == DEMO:
        toks = np.asarray(toks)[:8] % 8192
    r = run_spec(binary, tmp_path, model, toks, n_gen)
    assert r.returncode == 0, r.stdout + r.stderr
    fields = dict(kv.split("=") for kv in r.stdout.split()[1:])
    assert fields["mismatches"] == "0"
    assert int(fields["rows_compared"]) >= n_gen and 0 < int(fields["accepted_drafts"]) < n_gen


def test_golden_moe_q8_0(binary, tmp_path):
    """The routed-MoE path (gpu/kernels/moe.h: router, top-k, fused expert
    gate/up + SwiGLU, weighted down, the gated shared expert) on the golden
    qwen35moe model (8 experts, 3 used per token, Q8_0), against the CPU and
    llama.cpp with the dense model's tolerances (same reasons, plus the
    router: F32 in float and a float softmax sum where the CPU sums in
    double; measured on s16: vs the CPU row max |d| 0.21, mean KL 0.0008;
    vs llama.cpp's top-16 0.16). 16 rows in one eval equal 16 one-row evals
    bit for bit (batch invariance through the MoE kernels), and the unfused
    loop (K_RUNNER_FUSE=0: rmsnorm + the quantize kernels instead of
    norm_quant) writes the same bits."""
    toks = np.load(os.path.join(GOLDEN, "logits", "sequences.npz"))["s16"]
    pre, dec, greedy = run_gpu(binary, str(tmp_path), MOE, toks, 8)
    np.testing.assert_array_equal(pre.view(np.uint32), dec.view(np.uint32))
    gold = np.load(os.path.join(GOLDEN, "logits", "moe-q8_0.npz"))
    ids, vals = gold["s16_one_topk_ids"], gold["s16_one_topk_vals"]
    assert np.abs(np.take_along_axis(pre, ids, axis=1) - vals).max() <= MAX_ABS_VS_LLAMA
    top = np.sort(vals, axis=1)
    clear = top[:, -1] - top[:, -2] > CLEAR_MARGIN
    assert clear.sum() >= 8
    np.testing.assert_array_equal(pre.argmax(axis=1)[clear], ids[clear, 0])
    model = ds4py.load(MOE, n_threads=2)
    check_against_cpu(model, toks, pre)
    check_greedy(model, toks, greedy)
    unfused = os.path.join(str(tmp_path), "unfused")
    os.makedirs(unfused)
    r = subprocess.run([binary, MOE, os.path.join(str(tmp_path), "tokens.i32"),
                        os.path.join(unfused, "out")], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "K_RUNNER_FUSE": "0"})
    assert r.returncode == 0, r.stdout + r.stderr
    ufp = np.fromfile(os.path.join(unfused, "out.prefill.f32"), dtype=np.float32)
    ufp = ufp.reshape(len(toks), -1)
    np.testing.assert_array_equal(ufp.view(np.uint32), pre.view(np.uint32))
    check_grouped_moe(binary, tmp_path, MOE, toks, pre)


def check_grouped_moe(binary, tmp_path, model, toks, pre):
    """The prompt's MoE layers grouped by expert (gpu/kernels/moe_gemm.h,
    which the runner takes for chunks of more than 16 rows; forced here from
    2 rows): the same bits as the per-pair kernels, at two chunk sizes, with
    the default GEMMs (moe_gemm_mma where a layer's matrices are all K-quants:
    the emulator has int8 MMA) and with K_RUNNER_GEMM=dp4a (moe_gemm)."""
    for chunk in (None, 5):
        d = os.path.join(str(tmp_path), f"grouped{chunk}")
        os.makedirs(d)
        g, _, _ = run_gpu(binary, d, model, toks, 0, prefill_chunk=chunk,
                          env_extra={"K_RUNNER_MOE_GROUP_MIN": "2"})
        np.testing.assert_array_equal(g.view(np.uint32), pre.view(np.uint32))
    g = run_gpu_prefill(binary, os.path.join(str(tmp_path), "grouped_dp4a"), model, toks,
                        {"K_RUNNER_MOE_GROUP_MIN": "2", "K_RUNNER_GEMM": "dp4a"})
    np.testing.assert_array_equal(g.view(np.uint32), pre.view(np.uint32))


def test_kquant_moe_model(binary, tmp_path):
    """K-quant experts inside a whole model (the golden MoE files have
    n_ff_exp 32, too narrow for 256-value K-quant blocks): a tiny random
    qwen35moe (E 256, 8 experts of 256, 2 used, a gated 256 shared expert)
    written by bench_models in llama.cpp's Q4_K_M plan (Q4_K experts, Q4_K /
    Q5_K / Q6_K / Q8_0 elsewhere). Same checks as the golden model
    (measured: row max |d| vs the CPU 0.02, mean KL 1e-6); 12 rows in one
    eval equal 12 one-row evals bit for bit."""
    sys.path.insert(0, ROOT)
    from bench import bench_models as BM

    shape = BM.Shape("qwen35moe", 4, 256, 4, 1, 64, 2, 4, 64, n_expert=8, n_expert_used=2,
                     n_ff_exp=256, n_ff_shexp=256, n_vocab=1024, tied=False)
    types = BM.plan_types(shape, "Q4_K_M")
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K"
    path = os.path.join(str(tmp_path), "tiny-moe-q4_k_m.gguf")
    BM.write_model(shape, "Q4_K_M", path, seed=5)  # fixed weights: tolerances hold for these
    toks = (np.arange(1, 13) * 37).astype(np.int32)
    pre, dec, greedy = run_gpu(binary, str(tmp_path), path, toks, 4)
    np.testing.assert_array_equal(pre.view(np.uint32), dec.view(np.uint32))
    model = ds4py.load(path, n_threads=2)
    check_against_cpu(model, toks, pre)
    check_greedy(model, toks, greedy)
    check_grouped_moe(binary, tmp_path, path, toks, pre)


def test_planted_rollback_fault_turns_red(tmp_path):
    """The spec check can fail: an accept that skips the GDN replay (keeps
    the state from before the verify) must be caught."""
    planted = build(str(tmp_path / "planted"), "-DPLANT_ACCEPT_NO_REPLAY")
    toks = np.load(os.path.join(GOLDEN, "logits", "sequences.npz"))["s16"]
    r = run_spec(planted, tmp_path, DENSE, toks, 40)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mismatches=0" not in r.stdout


# the GPU head's drafts vs the CPU head's: its logits inherit the trunk's
# GPU/CPU difference (MAX_ABS_VS_CPU, measured 0.47), so where the two pick
# different drafts the CPU's logit of its own pick may exceed its logit of
# the GPU's pick by at most that much (a near tie); measured on the demo
# model: 23 of 24 drafts equal, the other a CPU gap of 0.024
def test_nextn_head_drafts(binary, tmp_path):
    """The nextn head on the GPU layer loop (gpu/host/runner_head.c): greedy
    speculative decoding with the head's drafts (depths 1..4) gives the
    serial tokens; priming the head in evals of 1, 2, 3, ... rows drafts
    what priming in one eval drafts (the C driver checks both); and each
    round's drafts are the CPU head's (csrc/forward/nextn.c) at the same
    positions, up to near ties."""
    from ds4py.spec.drafter import DraftState, NextnDrafter

    tok_file = os.path.join(ROOT, "gpu", "bench", "demo_tokens.i32")
    toks = np.fromfile(tok_file, dtype=np.int32)
    n_gen = 8
    prefix = os.path.join(str(tmp_path), "head")
    r = subprocess.run([binary, "--head", DEMO, tok_file, str(n_gen), prefix],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    fields = dict(kv.split("=") for kv in r.stdout.split()[1:])
    assert fields["mismatches"] == "0" and fields["priming_variant"] == "0", r.stdout
    assert int(fields["accepted_drafts"]) > 0, r.stdout
    rounds = np.fromfile(prefix + ".drafts.i32", dtype=np.int32).reshape(-1, 6)
    model = ds4py.load(DEMO, n_threads=2)
    seq = toks.tolist()
    with model.new_session() as s:  # the serial continuation (the GPU's, checked above)
        lg = s.eval(seq)
        for _ in range(n_gen):
            seq.append(int(np.asarray(lg).argmax()))
            lg = s.eval([seq[-1]])
    drafter, compared = NextnDrafter(model), 0
    for pos, depth, *gpu in rounds.tolist():
        with model.new_session(nextn_prime=True) as s:
            s.eval(seq[:pos])
            hid = np.array(s.last_hidden())
            tok = seq[pos]
            cpu = drafter.propose(DraftState(s, pos, tok, None), depth)
            for j in range(depth):
                if cpu[j] != gpu[j]:  # a near tie on the CPU's head logits
                    lg, _ = model.nextn_eval(s, [tok], hid[None], [pos + j])
                    assert lg[0][cpu[j]] - lg[0][gpu[j]] <= MAX_ABS_VS_CPU, (pos, j, cpu, gpu)
                    break
                compared += 1
                lg, hd = model.nextn_eval(s, [tok], hid[None], [pos + j])
                tok, hid = cpu[j], np.array(hd[0])
    assert compared >= len(rounds), (compared, rounds.tolist())
