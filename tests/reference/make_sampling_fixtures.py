"""llama.cpp's own sampler chain, through llama-cpp-python's low-level API,
as the reference for ds4py/sampling.py; and the recorder of
tests/golden/sampling/ (``python tests/reference/make_sampling_fixtures.py``).

What it calls (all in libllama, src/llama-sampler.cpp of the vendored
llama.cpp of llama-cpp-python 0.3.36): llama_sampler_init_logit_bias,
_penalties, _top_k, _top_p, _min_p, _temp_ext (what common_sampler_init
adds for the temperature entry), _dist, then llama_sampler_accept /
llama_sampler_apply on a ``llama_token_data_array`` that we build. The
stages are separate samplers applied one after another to the same array
(exactly what llama_sampler_chain_apply does), so the candidate set can be
read back after each stage. Nothing of ds4py is used here.

The fixture (tests/golden/sampling/llamacpp.npz + cases.json) holds, per
case: the input logits, the params, the penalty history, the candidate set
(ids, logits, sorted flag) after every stage (``load_stages`` reads them
back), and the tokens llama.cpp's dist sampler draws on 16 consecutive calls
with the case's seed. The cases use continuous random logits without exact
ties, where llama.cpp's unstable sort and ds4py's (logit, id) order agree.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp as L
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "sampling"

STAGES = ("bias", "penalties", "top_k", "top_p", "min_p", "temp")


class LlamaArray:
    """A llama_token_data_array over our own storage."""

    def __init__(self, logits: np.ndarray):
        n = int(logits.shape[0])
        self._buf = (L.llama_token_data * n)()
        self.view = np.ctypeslib.as_array(self._buf)
        self.view["id"] = np.arange(n, dtype=np.int32)
        self.view["logit"] = logits.astype(np.float32)
        self.view["p"] = 0.0
        self.cur = L.llama_token_data_array(data=self._buf, size=n, selected=-1, sorted=False)

    def apply(self, smpl) -> None:
        L.llama_sampler_apply(smpl, ctypes.byref(self.cur))

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, bool]:
        n = int(self.cur.size)
        return (self.view["id"][:n].copy(), self.view["logit"][:n].copy(), bool(self.cur.sorted))

    @property
    def selected_id(self) -> int:
        return int(self.view["id"][self.cur.selected])


def make_stage_samplers(params: dict, n_vocab: int) -> list:
    """The samplers of common_sampler_init's default chain, in its order,
    dist excluded. ``params`` uses ds4py's SamplingParams field names."""
    bias = params.get("logit_bias", {})
    arr = (L.llama_logit_bias * max(1, len(bias)))()
    for i, (tok, b) in enumerate(sorted(bias.items())):
        arr[i].token = int(tok)
        arr[i].bias = float(b)
    return [
        L.llama_sampler_init_logit_bias(n_vocab, len(bias), arr),
        L.llama_sampler_init_penalties(n_vocab, params.get("repeat_last_n", 64),
                                       params.get("repeat_penalty", 1.0),
                                       params.get("frequency_penalty", 0.0),
                                       params.get("presence_penalty", 0.0)),
        L.llama_sampler_init_top_k(params.get("top_k", 40)),
        L.llama_sampler_init_top_p(params.get("top_p", 0.95), params.get("min_keep", 0)),
        L.llama_sampler_init_min_p(params.get("min_p", 0.05), params.get("min_keep", 0)),
        L.llama_sampler_init_temp_ext(params.get("temperature", 0.8), 0.0, 1.0),
    ]


def llama_stages(logits: np.ndarray, params: dict, history: list[int]):
    """Candidate set after each stage: list of (ids, logits, sorted)."""
    smpls = make_stage_samplers(params, logits.shape[0])
    try:
        for t in history:
            L.llama_sampler_accept(smpls[1], int(t))
        a = LlamaArray(logits)
        snaps = []
        for s in smpls:
            a.apply(s)
            snaps.append(a.snapshot())
        return snaps
    finally:
        for s in smpls:
            L.llama_sampler_free(s)


def llama_draws(logits: np.ndarray, params: dict, history: list[int], seed: int,
                n_draws: int) -> list[int]:
    """Tokens llama.cpp's chain draws on n_draws consecutive calls with the
    same logits and history (the dist sampler's generator advances)."""
    smpls = make_stage_samplers(params, logits.shape[0])
    dist = L.llama_sampler_init_dist(seed)
    try:
        for t in history:
            L.llama_sampler_accept(smpls[1], int(t))
        out = []
        for _ in range(n_draws):
            a = LlamaArray(logits)
            for s in smpls:
                a.apply(s)
            a.apply(dist)
            out.append(a.selected_id)
        return out
    finally:
        for s in smpls + [dist]:
            L.llama_sampler_free(s)


# ----------------------------------------------------------------- fixture --
def _logits(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    if kind == "normal":
        x = rng.standard_normal(n) * 3.0
    elif kind == "peaked":  # LLM-like: a few large logits over a broad floor
        x = rng.standard_normal(n) * 2.0
        x[rng.choice(n, 5, replace=False)] += rng.uniform(6, 12, 5)
    elif kind == "flat":
        x = rng.standard_normal(n) * 0.3
    elif kind == "tail":
        # One token of weight 1 and many of weight ~2**-23.5 (between half an
        # ulp and an ulp of 1.0f): in llama.cpp's float32 running sums each
        # adds a whole ulp once the big one is in, so its top-p cut-off is
        # far from the exact one. Distinct values (float32 spacing near 16
        # is 2e-6): no ties.
        x = -16.29 - rng.permutation(n) * 1e-5
        x[rng.integers(n)] = 0.0
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def fixture_cases() -> list[dict]:
    """Small, continuous random logits (no exact ties, so llama.cpp's
    unstable sort order is the same as ds4py's), one case per configuration
    that exercises a different path of the stages."""
    return [
        dict(name="defaults", n=600, kind="peaked", params={}),
        dict(name="defaults_flat", n=600, kind="flat", params={}),
        dict(name="temp_only", n=600, kind="normal",
             params=dict(top_k=0, top_p=1.0, min_p=0.0, temperature=0.7)),
        dict(name="top_p_unsorted_small", n=800, kind="normal",
             params=dict(top_k=0, top_p=0.9, min_p=0.0, temperature=1.0)),
        dict(name="top_p_unsorted_large", n=1500, kind="flat",
             params=dict(top_k=0, top_p=0.5, min_p=0.0, temperature=1.2)),
        dict(name="top_p_float32_sum", n=1500, kind="tail",
             params=dict(top_k=0, top_p=0.9999, min_p=0.0, temperature=1.0)),
        dict(name="min_p_unsorted_min_keep", n=400, kind="peaked",
             params=dict(top_k=0, top_p=1.0, min_p=0.3, min_keep=12, temperature=1.0)),
        dict(name="min_p_unsorted", n=700, kind="peaked",
             params=dict(top_k=0, top_p=1.0, min_p=0.02, temperature=0.9)),
        dict(name="min_p_after_top_k", n=700, kind="normal",
             params=dict(top_k=100, top_p=1.0, min_p=0.1, temperature=1.5)),
        dict(name="min_keep", n=500, kind="peaked",
             params=dict(top_k=50, top_p=0.3, min_p=0.5, min_keep=7, temperature=1.0)),
        dict(name="penalties", n=500, kind="normal",
             params=dict(repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=0.4,
                         presence_penalty=0.25, top_k=60, temperature=1.0),
             history_len=40),
        dict(name="bias", n=500, kind="normal",
             params=dict(logit_bias={3: 5.0, 17: -float("inf"), 99: -2.5, 250: 9.0},
                         top_k=0, top_p=0.8, temperature=0.6)),
        dict(name="bias_and_penalties", n=500, kind="peaked",
             params=dict(logit_bias={1: 4.0, 2: -3.0}, repeat_penalty=1.5,
                         repeat_last_n=8, top_k=20, temperature=1.1),
             history_len=12),
        dict(name="greedy_temp0", n=500, kind="normal",
             params=dict(temperature=0.0)),
    ]


def record(cases: list[dict], n_draws: int = 16) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(20240531)
    arrays: dict[str, np.ndarray] = {}
    manifest = []
    for i, case in enumerate(cases):
        x = _logits(rng, case["n"], case["kind"])
        params = dict(case["params"])
        hist = [int(t) for t in rng.integers(0, min(case["n"], 30),
                                             case.get("history_len", 0))]
        # With bias, history tokens overlap biased ids on purpose.
        seed = int(rng.integers(0, 2**32))
        snaps = llama_stages(x, params, hist)
        draws = llama_draws(x, params, hist, seed, n_draws)
        key = f"c{i}"
        arrays[f"{key}_logits"] = x
        ids_parts, val_parts, meta = [], [], []
        for ids, lg, srt in snaps:
            if not srt and ids.shape[0] == x.shape[0]:
                # Still the whole vocabulary in id order: store only the
                # logits that changed (kind 0), to keep the file small.
                ch = np.flatnonzero(lg.view(np.uint32) != x.view(np.uint32))
                ids_parts.append(ch)
                val_parts.append(lg[ch])
                meta.append((0, ch.shape[0], int(srt)))
            else:  # the candidate set itself (kind 1)
                ids_parts.append(ids)
                val_parts.append(lg)
                meta.append((1, ids.shape[0], int(srt)))
        arrays[f"{key}_ids"] = np.concatenate(ids_parts).astype(np.int32)
        arrays[f"{key}_vals"] = np.concatenate(val_parts).astype(np.float32)
        arrays[f"{key}_meta"] = np.array(meta, dtype=np.int32)
        manifest.append({
            "key": key, "name": case["name"], "n_vocab": case["n"],
            "params": {k: ({str(t): (b if np.isfinite(b) else "-inf") for t, b in v.items()}
                           if k == "logit_bias" else v) for k, v in params.items()},
            "history": hist, "seed": seed, "draws": draws,
        })
    return arrays, manifest


def load_stages(arrays, key: str) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """(ids, logits, sorted) after each stage of a recorded case, expanded.
    tests/test_sampling.py has its own copy of this reader (CI has no
    llama_cpp to import this module with)."""
    x = arrays[f"{key}_logits"]
    ids_all, vals_all = arrays[f"{key}_ids"], arrays[f"{key}_vals"]
    out, off = [], 0
    for kind, n, srt in arrays[f"{key}_meta"]:
        ids, vals = ids_all[off:off + n], vals_all[off:off + n]
        off += n
        if kind == 0:
            full = x.copy()
            full[ids] = vals
            out.append((np.arange(x.shape[0], dtype=np.int32), full, bool(srt)))
        else:
            out.append((ids, vals, bool(srt)))
    return out


def load_params(entry: dict) -> dict:
    p = dict(entry["params"])
    if "logit_bias" in p:
        p["logit_bias"] = {int(t): float(b) for t, b in p["logit_bias"].items()}
    return p


def main() -> int:
    arrays, manifest = record(fixture_cases())
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "llamacpp.npz", **arrays)
    info = {
        "made_by": "tests/reference/make_sampling_fixtures.py",
        "llama_cpp_python": L.__version__,
        "stages": list(STAGES),
        "cases": manifest,
    }
    (OUT / "cases.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {OUT}/llamacpp.npz ({(OUT / 'llamacpp.npz').stat().st_size} bytes), "
          f"{len(manifest)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
