"""File-level GGUF tools: ``python -m gguf_tools inspect | requantize``.

    python -m gguf_tools inspect model.gguf [--json]
    python -m gguf_tools requantize src.gguf dst.gguf --type Q8_0

See gguf_tools/inspect_cmd.py and gguf_tools/requantize.py.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from .requantize import MIXES, TARGET_TYPES

    p = argparse.ArgumentParser(prog="python -m gguf_tools",
                                description="Inspect and requantize GGUF files.")
    sub = p.add_subparsers(dest="cmd", required=True)
    pi = sub.add_parser("inspect", help="header, metadata, tensor table of one GGUF file")
    pi.add_argument("file")
    pi.add_argument("--json", action="store_true", help="print one JSON object")
    pr = sub.add_parser("requantize", help="write SRC's tensors in another type to DST")
    pr.add_argument("src")
    pr.add_argument("dst")
    pr.add_argument("--type", required=True, metavar="TYPE",
                    help=f"target type: {', '.join(TARGET_TYPES + tuple(MIXES))}")
    pr.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                    help="per-tensor target (first matching regex wins; re.search)")
    pr.add_argument("--keep", action="append", default=[], metavar="REGEX",
                    help="copy matching tensors unchanged")
    pr.add_argument("--token-embedding-type", metavar="TYPE", default=None,
                    help="type of token_embd.weight (llama-quantize's option)")
    pr.add_argument("--output-tensor-type", metavar="TYPE", default=None,
                    help="type of output.weight, or of a tied token embedding")
    pr.add_argument("--allow-requantize", action="store_true",
                    help="allow converting already-quantized tensors")
    pr.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    pr.add_argument("--threads", type=int, default=None, help="quantizer threads")
    pe = sub.add_parser("extract-mtp", help="write SRC's nextn (MTP) head as a head file")
    pe.add_argument("src")
    pe.add_argument("dst")
    pe.add_argument("--head-only", action="store_true",
                    help="only the blk.N.* tensors (no token_embd/output_norm/output)")
    pa = sub.add_parser("attach-mtp", help="write TRUNK + HEAD's nextn block as one model file")
    pa.add_argument("trunk")
    pa.add_argument("head")
    pa.add_argument("dst")
    pa.add_argument("--replace", action="store_true", help="replace TRUNK's own head")
    pc = sub.add_parser("compare", help="KL, top-1 agreement, perplexity of B vs A on a text")
    pc.add_argument("a")
    pc.add_argument("b")
    pc.add_argument("--text", required=True, metavar="FILE", help="UTF-8 text to run")
    pc.add_argument("--ctx", type=int, default=512, help="tokens per window (default 512)")
    pc.add_argument("--threads", type=int, default=None, help="threads per model")
    pc.add_argument("--precision", choices=("fast", "exact"), default="fast")
    pc.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv=None, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = _parser().parse_args(argv)
    from ds4py.errors import DS4Error

    try:
        if args.cmd in ("extract-mtp", "attach-mtp"):
            from .mtp import cmd_attach_mtp, cmd_extract_mtp
            return (cmd_extract_mtp if args.cmd == "extract-mtp" else cmd_attach_mtp)(
                args, out, err)
        if args.cmd == "inspect":
            from .inspect_cmd import cmd_inspect
            return cmd_inspect(args, out, err)
        if args.cmd == "compare":
            from .compare import cmd_compare
            return cmd_compare(args, out, err)
        from .requantize import cmd_requantize
        return cmd_requantize(args, out, err)
    except (DS4Error, OSError, ValueError) as e:
        err.write(f"error: {e}\n")
        return 2  # as python -m ds4py: 2 = the input or the request is bad
