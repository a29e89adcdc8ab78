"""Command line: `python -m ds4py info [PATH]` (the full CLI comes later)."""

from __future__ import annotations

import argparse
import sys

from .demo import info


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ds4py",
                                description="ds4py: GGUF inference runtime for Qwen3.5 models")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = sub.add_parser(
        "info", help="summarize a GGUF file, or self-check without one",
        description="With PATH: print a GGUF file's header, metadata and tensor table. "
                    "Without: write a small GGUF of random weights in several quant types, "
                    "read it back and check every tensor. Exit 0 ok, 1 self-check "
                    "mismatch, 2 error.")
    info.add_argument("path", nargs="?", metavar="PATH", help="a .gguf file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return info(args.path)
    return 2


if __name__ == "__main__":
    sys.exit(main())
