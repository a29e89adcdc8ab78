"""Model.tokenizer: built from the model file's own tokenizer metadata."""

from pathlib import Path

import pytest
import tokenizers

import ds4py
from ds4py.tokenizer import TokenizerError

GOLDEN = Path(__file__).resolve().parent / "golden" / "models"

TEXTS = ["Hello world", "  leading spaces and\ttabs\n\nnewlines", "digits 1234567890",
         "<|im_start|>user\nhi<|im_end|>", "ünïcödé and 中文 and emoji 🙂"]


@pytest.mark.parametrize("name", ["dense-q8_0.gguf", "moe-q8_0.gguf"])
def test_model_tokenizer_matches_hf_tokenizer_json(name):
    # tokenizer.json is the HF form of the vocabulary the converter wrote
    # into the GGUF (tests/golden/README.md): an independent reference.
    ref = tokenizers.Tokenizer.from_file(str(GOLDEN / "tokenizer.json"))
    model = ds4py.load(GOLDEN / name, precision="exact")
    tok = model.tokenizer
    assert tok is model.tokenizer  # built once
    for t in TEXTS:
        want = ref.encode(t, add_special_tokens=False).ids
        assert tok.encode(t, special=True) == want
        assert tok.decode(want) == t


def test_model_without_tokenizer_metadata_fails_on_access(tmp_path):
    from ds4py.gguf_writer import Value, write_gguf

    src = ds4py.gguf.open(GOLDEN / "dense-q8_0.gguf")
    meta = {k: v for k, v in src.metadata.items() if not k.startswith("tokenizer.")}
    types = src.metadata_types
    md = {k: Value(v, types[k][0], types[k][1] if len(types[k]) > 1 else None)
          for k, v in meta.items()}
    tensors = {n: (t.type_name, t.shape, src.raw(n).tobytes()) for n, t in src.tensors.items()}
    out = tmp_path / "no-tok.gguf"
    write_gguf(out, md, tensors)
    model = ds4py.load(out, precision="exact")
    with pytest.raises(TokenizerError, match="tokenizer"):
        _ = model.tokenizer
