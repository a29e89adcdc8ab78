"""Ours ÷ llama.cpp from one model's device_side_by_side.sh lines.

    python3 gpu/tools/side_by_side_ratios.py LINES.txt

LINES.txt holds the lines the script prints for one model ("rep N ours:
BENCH ... ctx=C prefill_tok_s=P decode_tok_s=D ..." and "rep N llama.cpp:
| ... | pp512 | T ± s |" table rows). Each repetition's ours is divided by
the same repetition's llama.cpp: decode at ctx C by tg128 at depth C (depth
0 for our ctx 512, as the README's tables pair them; llama-bench's tg128
runs at depth 0..128), prefill at ctx C by ppC. One line per pair found:

    RATIO rep 1 decode ctx=512: 596.31 / 526.12 = 1.133
"""

from __future__ import annotations

import re
import sys

OURS = re.compile(r"^rep (\d+) ours: BENCH .*?ctx=(\d+) "
                  r"prefill_tok_s=([\d.]+) decode_tok_s=([\d.]+)")
LLAMA = re.compile(r"^rep (\d+) llama\.cpp: \|.*\|\s*(pp\d+|tg128(?: @ d\d+)?)\s*\|\s*([\d.]+)")


def parse(lines):
    """({(rep, ctx): (prefill, decode)}, {(rep, test): tok/s})."""
    ours, llama = {}, {}
    for ln in lines:
        m = OURS.match(ln)
        if m:
            ours[int(m[1]), int(m[2])] = (float(m[3]), float(m[4]))
            continue
        m = LLAMA.match(ln)
        if m:
            llama[int(m[1]), m[2]] = float(m[3])
    return ours, llama


def ratios(ours, llama):
    """[(rep, kind, ctx, ours, theirs)] for every pair both sides measured."""
    out = []
    for (rep, ctx), (pre, dec) in sorted(ours.items()):
        depth = "tg128" if ctx <= 512 else f"tg128 @ d{ctx}"
        for kind, mine, test in (("decode", dec, depth), ("prefill", pre, f"pp{ctx}")):
            theirs = llama.get((rep, test))
            if theirs:
                out.append((rep, kind, ctx, mine, theirs))
    return out


def main() -> None:
    with open(sys.argv[1]) as f:
        ours, llama = parse(f.read().splitlines())
    for rep, kind, ctx, mine, theirs in ratios(ours, llama):
        print(f"RATIO rep {rep} {kind} ctx={ctx}: {mine:.2f} / {theirs:.2f} = {mine / theirs:.3f}")


if __name__ == "__main__":
    main()
