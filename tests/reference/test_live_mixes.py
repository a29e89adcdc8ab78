"""Opt-in (DS4_REFERENCE=1, -m reference): gguf_tools requantize's four mixes
against llama.cpp's llama_model_quantize (llama-cpp-python, no imatrix,
default parameters; tests/reference/golden_llama.py quantize()) on both golden
F32 models: the same tensor order, shapes and types, the same bytes for every
tensor, the same metadata, and in the end the same file byte for byte.
Without llama_cpp installed this fails (the import), it does not skip."""

from __future__ import annotations

import filecmp
import io
import os

import golden_llama as GL
import numpy as np
import pytest

from ds4py import gguf
from gguf_tools import requantize as rq

pytestmark = pytest.mark.reference

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "golden", "models")


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S"])
@pytest.mark.parametrize("m", ["dense", "moe"])
def test_mix_matches_llama_model_quantize(m, mix, tmp_path):
    src = os.path.join(MODELS, f"{m}-f32.gguf")
    ref, ours = str(tmp_path / "ref.gguf"), str(tmp_path / "ours.gguf")
    GL.quiet()
    GL.quantize(src, ref, mix)
    rq.requantize(src, ours, mix, out=io.StringIO(), err=io.StringIO())
    with gguf.open(ref) as r, gguf.open(ours) as o:
        assert list(o.tensors) == list(r.tensors)
        for n, t in r.tensors.items():
            assert (o.tensors[n].type_name, o.tensors[n].shape) == (t.type_name, t.shape), n
            assert np.array_equal(np.asarray(o.raw(n)), np.asarray(r.raw(n))), n
        assert list(o.metadata) == list(r.metadata)
        assert o.metadata["general.file_type"] == r.metadata["general.file_type"]
    assert filecmp.cmp(ours, ref, shallow=False)
