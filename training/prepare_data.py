"""Step 1 of the demo-model recipe: corpus, tokenizer, token files.

    python training/prepare_data.py [--out training/data]

Corpus: the CPython standard library's own .py sources (PSF license) of the
interpreter running this script -- site-packages excluded, so nothing of
another license gets in. Files are split into train / held-out by a hash of
their path relative to the stdlib root (2% held out, whole files, so no
held-out line was ever seen in training).

Besides plain source files, the train set gets chat-formatted samples made
from the same train files: for every top-level function with a docstring,
the user asks for the function (its docstring's first paragraph) and the
assistant answers with a short thought and the code, rendered with the real
Qwen3.5 chat template (ds4py.chat). That is what makes `ds4py chat` on the
demo model answer in the expected shape instead of continuing the prompt.

Tokenizer: byte-level BPE with the Qwen3.5 pre-tokenizer split, trained with
`tokenizers` on the train split; specials as Qwen ships them (<|endoftext|>,
<|im_start|>, <|im_end|> are special; <think>, </think>, <tool_call>,
</tool_call>, <tool_response>, </tool_response> are added non-special tokens,
so they stay visible in decoded text).

Writes OUT/tokenizer.json, OUT/tokenizer_config.json, OUT/train.bin and
OUT/heldout.bin (uint16 token ids, documents separated by <|endoftext|>),
OUT/manifest.json (file lists, counts, sha256 of everything).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

VOCAB = 8192
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
HELDOUT_PER_MILLE = 20

# The Qwen3.5 pre-tokenizer split (tokenizer.json of the released models;
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35).
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TEMPLATE_PATH = HERE / "chat_template.jinja"


def stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return root, files


def is_heldout(rel: str) -> bool:
    h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:4], "little")
    return h % 1000 < HELDOUT_PER_MILLE


def read_source(p: Path) -> str | None:
    try:
        text = p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return text if text.strip() else None


def chat_samples(sources: list[str], rng: random.Random) -> list[list[dict]]:
    """(user asks for a documented function, assistant writes it) pairs."""
    out = []
    for text in sources:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or node.name.startswith("_"):
                continue
            first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
            if not (20 <= len(first) <= 300):
                continue
            start = node.lineno - 1 - len(node.decorator_list)
            code = "\n".join(lines[start : node.end_lineno])
            if len(code) > 2500:
                continue
            ask = rng.choice(
                [
                    "Write a Python function `{n}`: {d}",
                    "Implement `{n}` in Python. {d}",
                    "{d} Write this as a Python function named {n}.",
                    "Can you write `{n}`? It should do this: {d}",
                ]
            ).format(n=node.name, d=first)
            think = (
                f"The user wants a function named {node.name}. "
                f"It should: {first[0].lower()}{first[1:]}"
            )
            answer = f"Here is `{node.name}`:\n\n```python\n{code}\n```"
            out.append(
                [
                    {"role": "user", "content": ask},
                    {"role": "assistant", "content": answer, "reasoning_content": think},
                ]
            )
    return out


def train_tokenizer(texts: list[str]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers.processors import ByteLevel as ByteLevelProcessor

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = ByteLevelProcessor(trim_offsets=False)
    n_added = len(SPECIAL) + len(ADDED)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - n_added,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != VOCAB - n_added:
        raise RuntimeError(
            f"BPE trained to {tok.get_vocab_size()} tokens, wanted {VOCAB - n_added}"
        )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED])
    assert tok.get_vocab_size() == VOCAB
    return tok


def tokenizer_config(template: str) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_prefix_space": False,
        "chat_template": template,
    }


def encode_docs(tok, docs: list[str]) -> np.ndarray:
    eot = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.uint16)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "data"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)

    root, files = stdlib_files()
    train, held, train_names, held_names = [], [], [], []
    for p in files:
        rel = p.relative_to(root).as_posix()
        text = read_source(p)
        if text is None:
            continue
        (held if is_heldout(rel) else train).append(text)
        (held_names if is_heldout(rel) else train_names).append(rel)
    print(f"stdlib {root}: {len(train)} train files, {len(held)} held-out files")

    from ds4py.chat import render_chat_template

    template = TEMPLATE_PATH.read_text()
    convs = chat_samples(train, rng)
    chats = [render_chat_template(template, c, add_generation_prompt=False) for c in convs]
    print(f"{len(chats)} chat samples")

    tok = train_tokenizer(train + chats)
    docs = train + chats
    rng.shuffle(docs)
    train_ids = encode_docs(tok, docs)
    held_ids = encode_docs(tok, held)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(template), indent=2) + "\n"
    )
    train_ids.tofile(out / "train.bin")
    held_ids.tofile(out / "heldout.bin")
    manifest = {
        "python": sys.version.split()[0],
        "stdlib": str(root),
        "vocab": VOCAB,
        "train_files": len(train),
        "heldout_files": len(held),
        "chat_samples": len(chats),
        "train_tokens": int(train_ids.size),
        "heldout_tokens": int(held_ids.size),
        "train_bytes": sum(len(t.encode()) for t in docs),
        "heldout_names": held_names,
        "sha256": {
            n: sha256(out / n)
            for n in ("tokenizer.json", "tokenizer_config.json", "train.bin", "heldout.bin")
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps({k: v for k, v in manifest.items() if k != "heldout_names"}, indent=1))


if __name__ == "__main__":
    main()
