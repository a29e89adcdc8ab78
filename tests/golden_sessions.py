"""Shared by the session-level tests (snapshot, verify, nextn priming, prefix
cache): the committed golden models loaded once per (file, precision), the
golden 700-token sequence, one fresh full-eval reference per model, and
bit-for-bit comparison of float32 arrays."""

from __future__ import annotations

import os

import numpy as np

import ds4py

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
TOKS = np.load(os.path.join(HERE, "golden", "logits", "sequences.npz"))["s700"]
PAGE = 256  # DS4_KV_PAGE (csrc/forward/forward.h)

_models: dict = {}
_refs: dict = {}


def model(name: str, precision: str = "fast") -> ds4py.Model:
    """The golden model `name` (tests/golden/models/NAME.gguf), 2 threads."""
    if (name, precision) not in _models:
        _models[name, precision] = ds4py.load(os.path.join(MODELS, name + ".gguf"),
                                              precision=precision, n_threads=2)
    return _models[name, precision]


def ref(name: str, precision: str, n: int = len(TOKS)):
    """(logits, hidden) of every row of TOKS[:n] from one fresh eval."""
    key = (name, precision, n)
    if key not in _refs:
        with model(name, precision).new_session() as s:
            lg, hd = s.eval(TOKS[:n], all_logits=True, return_hidden=True)
            _refs[key] = (np.array(lg), np.array(hd))
    return _refs[key]


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same(a, b) -> None:
    np.testing.assert_array_equal(bits(a), bits(b))
