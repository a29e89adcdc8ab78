"""Run llama.cpp's own HF->GGUF converter (vendored in the llama-cpp-python
sdist) on a golden checkpoint. Run as a separate process (the converter keeps
class-level state), as:

    python golden_convert.py LLAMA_CPP_SRC HF_DIR OUTFILE OUTTYPE [CONVERTER ARGS...]

The one change to the converter's behaviour: it identifies a BPE
pre-tokenizer by hashing the token ids of a fixed text, and refuses a hash it
does not know, which every freshly trained test tokenizer has. The test
tokenizer uses the Qwen3.5 split pattern (golden_models.QWEN35_SPLIT), so the
name the converter would write for a real Qwen3.5 tokenizer, "qwen35"
(conversion/base.py get_vocab_base_pre), is set directly.
"""

import sys
from pathlib import Path


def main() -> None:
    src, hf_dir, outfile, outtype = sys.argv[1:5]
    extra = sys.argv[5:]  # passed through to the converter (e.g. --model-name)
    src = Path(src)
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))  # the converter's own gguf-py, as its script does
    import convert_hf_to_gguf as conv
    from conversion import base

    def pre_qwen35(self, tokenizer):
        return "qwen35"

    base.TextModel.get_vocab_base_pre = pre_qwen35
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", outfile, "--outtype", outtype,
                *extra]
    conv.main()


if __name__ == "__main__":
    main()
