"""Step 3 of the demo-model recipe: HF checkpoint -> the shipped GGUF.

    python training/export.py HF_DIR [--llama-cpp SRC] [--out ds4py/models/demo-q8_0.gguf]

1. Tensor names and transforms (+1 on the zero-centred norms, ssm_a =
   -exp(A_log), the tiled V-head reorder, nextn naming, tokenizer arrays) are
   exactly llama.cpp's: its own converter, convert_hf_to_gguf.py from the
   llama.cpp sources vendored in the llama-cpp-python 0.3.36 sdist, writes a
   BF16 GGUF. Decision: rather than re-implement the converter's transforms
   (and risk a silent mismatch), we run it; the one thing it cannot do for a
   freshly trained tokenizer is name its pre-tokenizer (it refuses unknown
   tokenizer hashes), so tests/reference/golden_convert.py sets the name it
   writes for a real Qwen3.5 tokenizer, "qwen35" -- our tokenizer uses the same
   split regex. SRC defaults to the unpacked sdist (get it with
   `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`).
2. ds4py's own gguf_tools requantizes it to Q8_0 (norms and other 1-D
   tensors stay F32), written atomically to --out.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_SRC = "/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp"
MODEL_NAME = "ds4py-demo"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--llama-cpp", default=DEFAULT_SRC)
    ap.add_argument("--out", default=str(ROOT / "ds4py" / "models" / "demo-q8_0.gguf"))
    ap.add_argument("--keep-bf16", help="also keep the BF16 GGUF here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        shutil.copytree(args.hf_dir, hf)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            src = HERE / name if (HERE / name).exists() else HERE / "data" / name
            shutil.copy(src, hf / name)
        bf16 = Path(tmp) / "demo-bf16.gguf"
        conv = [
            sys.executable,
            str(ROOT / "tests" / "reference" / "golden_convert.py"),
            args.llama_cpp,
            str(hf),
            str(bf16),
            "bf16",
            "--model-name",
            MODEL_NAME,
        ]
        subprocess.run(conv, check=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gguf_tools",
                "requantize",
                str(bf16),
                args.out,
                "--type",
                "Q8_0",
            ],
            check=True,
            cwd=ROOT,
        )
        if args.keep_bf16:
            shutil.copy(bf16, args.keep_bf16)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
