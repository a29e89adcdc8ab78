"""The demo model's llama.cpp fixture, recomputed live (opt-in: `make
test-reference`): llama.cpp's tokenization and greedy continuations of the 10
prompts today equal the committed tests/golden/demo/llama_reference.json, so
the CI test that reads the fixture is checking against what llama.cpp really
does with the shipped file."""

from __future__ import annotations

import json

import golden_llama as GL
import make_demo_fixtures as F
import pytest

from ds4py.demo_model import demo_model_path

pytestmark = pytest.mark.reference


def test_llamacpp_fixture_is_current():
    ref = json.loads((F.OUT / "llama_reference.json").read_text())
    GL.init_backend()
    with GL.opened(demo_model_path()) as m:
        for name, ids in ref["sample_ids"].items():
            text = json.loads((F.OUT / "heldout_sample.json").read_text())[name]
            assert F.llama_tokenize(m, text) == ids, name
        for p in ref["prompts"]:
            assert F.llama_tokenize(m, p["text"]) == p["ids"]
            toks, margins = F.greedy(m, p["ids"])
            assert toks == p["greedy"], p["prompt"]
