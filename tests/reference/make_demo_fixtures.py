"""llama.cpp's view of the shipped demo model, for tests/test_demo_model.py.

    python tests/reference/make_demo_fixtures.py

Needs llama-cpp-python 0.3.36 (tests/golden/quants/README.md says how it was
built) and `tokenizers`. Writes tests/golden/demo/:
- heldout_sample.json: four held-out stdlib files (PSF license), the texts the
  tokenizer and MTP checks run on (copied from this interpreter's stdlib; the
  names are in training/data/manifest.json's held-out list);
- llama_reference.json: for the 10 fixed prompts of training/evaluate.py,
  llama.cpp's tokenization of the prompt text and its greedy continuation
  (64 tokens: the prompt as one batch, then one token per decode call, every
  step's top-2 logit margin); and llama.cpp's and `tokenizers`' ids of the
  held-out sample.
Settings as golden_llama.py (CPU, no weight repacking, F16 KV, flash
attention on, 2 threads) -- the ones ds4py's `fast` precision matches.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "training"))
import golden_llama as GL  # noqa: E402
from evaluate import PROMPTS  # noqa: E402

from ds4py.chat import render_chat_template  # noqa: E402
from ds4py.demo_model import demo_model_path  # noqa: E402

OUT = ROOT / "tests" / "golden" / "demo"
SAMPLE_FILES = [
    "email/quoprimime.py",
    "lib2to3/pgen2/driver.py",
    "tkinter/colorchooser.py",
    "xml/sax/handler.py",
]
STEPS = 64


def prompt_text(kind: str, prompt: str) -> str:
    if kind == "raw":
        return prompt
    template = (ROOT / "training" / "chat_template.jinja").read_text()
    return render_chat_template(
        template, [{"role": "user", "content": prompt}], add_generation_prompt=True
    )


def llama_tokenize(model, text: str) -> list[int]:
    L = GL._L()
    vocab = L.llama_model_get_vocab(model.ptr)
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 16))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, True)
    if n < 0:
        raise RuntimeError("llama_tokenize buffer too small")
    return [int(buf[i]) for i in range(n)]


def greedy(model, ids: list[int]) -> tuple[list[int], list[float]]:
    ctx = model.context()
    try:
        logits = ctx.decode(ids, 0)[-1]
        toks, margins = [], []
        for step in range(STEPS):
            top = np.sort(logits)[-2:]
            margins.append(float(top[1] - top[0]))
            t = int(np.argmax(logits))
            toks.append(t)
            logits = ctx.decode([t], len(ids) + step)[-1]
        return toks, margins
    finally:
        ctx.close()


def main() -> None:
    from tokenizers import Tokenizer

    OUT.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sample = {name: (stdlib / name).read_text(encoding="utf-8") for name in SAMPLE_FILES}
    (OUT / "heldout_sample.json").write_text(json.dumps(sample, indent=0) + "\n")
    hf = Tokenizer.from_file(str(ROOT / "training" / "tokenizer.json"))
    path = demo_model_path()
    GL.init_backend()
    ref: dict = {
        "model_sha256": __import__("hashlib").sha256(Path(path).read_bytes()).hexdigest(),
        "llama_cpp_python": __import__("llama_cpp").__version__,
        "prompts": [],
        "sample_ids": {},
    }
    with GL.opened(path) as m:
        for name, text in sample.items():
            a = llama_tokenize(m, text)
            b = hf.encode(text, add_special_tokens=False).ids
            if a != b:
                raise SystemExit(f"llama.cpp and tokenizers disagree on {name}")
            ref["sample_ids"][name] = a
        for kind, prompt in PROMPTS:
            text = prompt_text(kind, prompt)
            ids = llama_tokenize(m, text)
            toks, margins = greedy(m, ids)
            ref["prompts"].append(
                {
                    "kind": kind,
                    "prompt": prompt,
                    "text": text,
                    "ids": ids,
                    "greedy": toks,
                    "margins": [round(x, 4) for x in margins],
                }
            )
            print(kind, repr(prompt[:30]), len(ids), "->", toks[:8], flush=True)
    (OUT / "llama_reference.json").write_text(json.dumps(ref) + "\n")


if __name__ == "__main__":
    main()
