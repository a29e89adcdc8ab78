"""gpu/tools/side_by_side_ratios.py: the ratios device_side_by_side.sh prints.

The lines are what the script printed on an H100 on 2026-12-06 (session 25,
0.8B Q8_0; the llama.cpp table rows cut to their model, backend, test and
t/s columns, ours to the fields the parser reads); the expected ratios were
divided by hand from those figures (596.31 / 526.12 = 1.1334...).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "gpu", "tools"))

import side_by_side_ratios as sbs  # noqa: E402

LINES = """\
rep 1 ours: BENCH device=cuda ctx=512 prefill_tok_s=20651.9 decode_tok_s=596.31
rep 1 ours: BENCH device=cuda ctx=4096 prefill_tok_s=18653.4 decode_tok_s=591.80
rep 1 llama.cpp: | model | backend | test | t/s |
rep 1 llama.cpp: | ---------- | ------- | -------------: | ---------------: |
rep 1 llama.cpp: | qwen35 0.8B Q8_0 | CUDA | pp512 | 15712.60 ± 0.00 |
rep 1 llama.cpp: | qwen35 0.8B Q8_0 | CUDA | pp4096 | 32301.01 ± 0.00 |
rep 1 llama.cpp: | qwen35 0.8B Q8_0 | CUDA | tg128 | 526.12 ± 0.00 |
rep 1 llama.cpp: | qwen35 0.8B Q8_0 | CUDA | tg128 @ d4096 | 535.75 ± 0.00 |
rep 1 llama.cpp: | qwen35 0.8B Q8_0 | CUDA | tg128 @ d32768 | 456.76 ± 0.00 |
rep 2 ours: BENCH device=cuda ctx=512 prefill_tok_s=21089.0 decode_tok_s=601.56
rep 2 llama.cpp: | qwen35 0.8B Q8_0 | CUDA | pp512 | 15892.53 ± 0.00 |
rep 2 llama.cpp: | qwen35 0.8B Q8_0 | CUDA | tg128 | 537.77 ± 0.00 |
""".splitlines()


def test_pairs_each_repetition_with_its_own_llama_run():
    got = {(rep, kind, ctx): round(mine / theirs, 4) for rep, kind, ctx, mine, theirs
           in sbs.ratios(*sbs.parse(LINES))}
    assert got == {
        (1, "decode", 512): 1.1334,    # 596.31 / 526.12 (tg128 at depth 0)
        (1, "prefill", 512): 1.3144,   # 20651.9 / 15712.60
        (1, "decode", 4096): 1.1046,   # 591.80 / 535.75 (tg128 @ d4096)
        (1, "prefill", 4096): 0.5775,  # 18653.4 / 32301.01
        (2, "decode", 512): 1.1186,    # 601.56 / 537.77
        (2, "prefill", 512): 1.3270,   # 21089.0 / 15892.53
    }


def test_header_rows_and_missing_partners_give_no_ratio():
    ours, llama = sbs.parse(LINES[:4])  # ours' two lines and the table header only
    assert len(ours) == 2 and llama == {}
    assert sbs.ratios(ours, llama) == []


def test_command_line_prints_ratio_lines(tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(LINES) + "\n")
    script = os.path.join(ROOT, "gpu", "tools", "side_by_side_ratios.py")
    out = subprocess.run([sys.executable, script, str(f)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert "RATIO rep 1 decode ctx=512: 596.31 / 526.12 = 1.133" in out
    assert len(out) == 6


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
