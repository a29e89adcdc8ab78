"""The command line: ``python -m ds4py generate | chat | inspect | info``.

    python -m ds4py generate -m model.gguf -p "Why is the sky blue?" --max-tokens 64
    python -m ds4py generate -m model.gguf -p "Once upon" --raw --temp 0 --json
    python -m ds4py chat -m model.gguf
    python -m ds4py inspect model.gguf
    python -m ds4py info [model.gguf]

Output: generated text goes to stdout as it is produced; the statistics line,
the loading progress bar (on a terminal only) and errors go to stderr.
``generate --json`` prints one JSON object on stdout and nothing else there.

Errors (a missing file, not a GGUF, an architecture or tensor type the engine
does not run, a prompt that does not fit): one line ``error: ...`` on stderr,
exit status 2, no traceback unless ``--verbose``. Interrupted: status 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections import Counter
from typing import TextIO

from .errors import DS4Error

__all__ = ["main", "build_parser", "default_model_path", "ChatRepl", "CliError"]

NO_MODEL = "no model given and the embedded demo model is missing from this install: pass -m FILE"


class CliError(Exception):
    """A usage problem the CLI reports as one line, exit status 2."""


def default_model_path() -> str | None:
    """The embedded demo model (ds4py/models/, see training/README.md), or
    None when this install lacks it."""
    from .demo_model import demo_model_path

    return demo_model_path()


# ------------------------------------------------------------------ parser --

def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show a traceback on errors")
    return p


def _model_opts() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", metavar="FILE", help="a qwen35/qwen35moe GGUF")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: one per CPU)")
    g.add_argument("--ctx", type=int, metavar="N",
                   help="context size in tokens (default: min(training context, 8192))")
    g.add_argument("--precision", choices=("fast", "exact"), default="fast",
                   help="fast: llama.cpp's CPU numerics; exact: float32 (default: fast)")
    return p


def _sampling_opts() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("sampling (defaults are llama.cpp's)")
    g.add_argument("--max-tokens", type=int, default=256, metavar="N",
                   help="most tokens to generate (default: 256)")
    g.add_argument("--temp", type=float, default=0.8, metavar="T",
                   help="temperature; 0 = greedy, deterministic (default: 0.8)")
    g.add_argument("--top-k", type=int, default=40, metavar="K", help="0 = off (default: 40)")
    g.add_argument("--top-p", type=float, default=0.95, metavar="P",
                   help="1 = off (default: 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, metavar="M",
                   help="0 = off (default: 0.05)")
    g.add_argument("--seed", type=int, metavar="S", help="random seed (default: random)")
    g.add_argument("--stop", action="append", default=[], metavar="S",
                   help="stop before this text (repeatable)")
    g.add_argument("--system", metavar="S", help="a system message (chat only)")
    g.add_argument("--draw", choices=("stream", "position"), default="stream",
                   help="seeded draws: stream = llama.cpp's mt19937 stream; position = keyed "
                        "by seed and token position (default: stream)")
    d = p.add_argument_group("speculative decoding (ds4py.spec; output never changes)")
    d.add_argument("--no-draft", action="store_true", help="turn drafting off")
    d.add_argument("--draft-depth", type=int, metavar="K",
                   help="draft exactly K tokens per round (measurement; default: adaptive)")
    d.add_argument("--draft-head", metavar="FILE",
                   help="a standalone nextn (MTP) head GGUF to draft with")
    d.add_argument("--dflash", metavar="FILE",
                   help="a DFlash drafter GGUF to draft with (instead of the nextn head)")
    d.add_argument("--force-draft", action="store_true",
                   help="draft with a pairing the table does not know (REFUSE_UNKNOWN)")
    d.add_argument("--spec-sampling", choices=("exact", "rejection"), default=None,
                   help="sampled drafting: exact = output identical to no drafting (default); "
                        "rejection = sampled drafts, standard speculative (rejection) sampling")
    g.add_argument("--no-think", action="store_true",
                   help="ask the chat template for no reasoning block")
    return p


def build_parser() -> argparse.ArgumentParser:
    common, model, sampling = _common(), _model_opts(), _sampling_opts()
    p = argparse.ArgumentParser(prog="python -m ds4py", parents=[common],
                                description="ds4py: GGUF inference runtime for Qwen3.5 models")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser(
        "generate", parents=[common, model, sampling], help="generate text from a prompt",
        description="Generate from a prompt: the text streams to stdout, a statistics line "
                    "(prompt and generated tokens with their tok/s, peak memory) goes to "
                    "stderr. Without --chat/--raw a model with a chat template gets the "
                    "prompt as a user message, any other the raw text.")
    g.add_argument("-p", "--prompt", required=True, metavar="TEXT",
                   help="the prompt ('-' reads it from stdin)")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true",
                      help="apply the chat template (thinking on unless --no-think)")
    mode.add_argument("--raw", action="store_true", help="feed the text without a template")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object (text, tokens, statistics) instead")
    g.add_argument("--dump-logits", metavar="FILE",
                   help="write the prompt's logits to FILE (.npz: logits [tokens, vocab] "
                        "float32, tokens)")
    g.add_argument("--backend", choices=("cpu", "cuda", "auto", "metal", "gpu-emul"),
                   default="cpu",
                   help="where the model runs (default: cpu). cuda: NVIDIA GPU, plugin "
                        "compiled with nvcc on first use; auto: cuda if it can run the model, "
                        "else cpu; gpu-emul: the GPU kernels under the emulator (tests, "
                        "slow); metal: not wired yet. GPU backends run dense and routed-MoE "
                        "models, fast precision, drafting included (ds4py.gpu_backend)")

    c = sub.add_parser(
        "chat", parents=[common, model, sampling], help="interactive multi-turn chat",
        description="Chat on stdin/stdout: one user message per line; /reset starts over "
                    "(and empties the prefix cache), /exit (or end of input) quits. Each "
                    "turn re-renders the conversation with the chat template and evaluates "
                    "only the tokens after the longest prefix in the prefix cache (snapshots "
                    "at every 256 tokens, at the end of each prompt and of each reply).")
    c.add_argument("--cache-mb", type=int, default=2048, metavar="N",
                   help="prefix cache budget in MiB (default: 2048; 0 keeps nothing)")

    i = sub.add_parser(
        "inspect", parents=[common], help="describe a model GGUF",
        description="Architecture, layers by kind, attention heads, gated-delta-net "
                    "dimensions, experts, nextn head, tensor types, tokenizer, chat "
                    "template and context length of a model the engine can load.")
    i.add_argument("path", metavar="FILE", help="a .gguf file")

    info = sub.add_parser(
        "info", parents=[common], help="summarize a GGUF file, or self-check without one",
        description="With PATH: print a GGUF file's header, metadata and tensor table. "
                    "Without: write a small GGUF of random weights in several quant types, "
                    "read it back and check every tensor. Exit 0 ok, 1 self-check "
                    "mismatch, 2 error.")
    info.add_argument("path", nargs="?", metavar="PATH", help="a .gguf file")

    sc = sub.add_parser(
        "spec-calibrate", parents=[common], help="measure a draft pairing, write a table entry",
        description="Greedy generation on a fixed prompt set (code, prose, math, chat), "
                    "serial vs drafting, min/median/max of --reps with the order reversed "
                    "on alternate repetitions; prints a pairs-table entry (JSON) and adds it "
                    "to --out.")
    sc.add_argument("target", metavar="TARGET", help="the target model GGUF")
    sc.add_argument("--draft-head", metavar="FILE",
                    help="a standalone nextn head (default: the target's bundled head)")
    sc.add_argument("--dflash", metavar="FILE", help="a DFlash drafter to measure instead")
    sc.add_argument("--max-tokens", type=int, default=64, metavar="N")
    sc.add_argument("--reps", type=int, default=3, metavar="N")
    sc.add_argument("--threads", type=int, metavar="N")
    sc.add_argument("--backend", choices=("cpu", "cuda", "gpu-emul"), default="cpu",
                    help="where to measure (default: cpu); the entry's verdict holds there")
    sc.add_argument("--out", metavar="FILE", help="add the entry to this pairs file")

    serve_help = dict(help="run the OpenAI-compatible HTTP server",
                      description="The same server as ds4py-server (see README, Server).")
    try:
        from .server.main import add_arguments as _serve_arguments  # ds4py-server's options
    except ImportError:
        # generate/chat must not need the server's dependencies (fastapi, ...):
        # a machine without them (the GPU box) still runs them; `serve` takes
        # any arguments ("+" prefix: none is an option) and names the
        # missing module when run
        sv = sub.add_parser("serve", prefix_chars="+", **serve_help)
        sv.add_argument("server_args", nargs="*")
        sv.set_defaults(verbose=False)
    else:
        sv = sub.add_parser("serve", parents=[common], **serve_help)
        _serve_arguments(sv)
    return p


# ----------------------------------------------------------------- helpers --

def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _phys_mem() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _warm(path: str, err: TextIO) -> None:
    """Read the file once with a progress bar (a terminal only): the weights
    are mmapped and would otherwise be paged in during the first tokens, so
    this moves that wait to where it can be shown. Skipped for a file that
    would not fit in half of RAM (it would only evict itself)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return  # the load reports it
    mem = _phys_mem()
    if size <= 0 or (mem and size > mem // 2):
        return
    name = os.path.basename(path)
    buf = bytearray(16 << 20)
    done, last = 0, -1.0
    try:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                done += n
                frac = min(done / size, 1.0)
                if frac - last >= 0.01 or done == size:
                    last = frac
                    bar = "#" * int(frac * 30)
                    err.write(f"\rloading {name} [{bar:<30}] {frac * 100:3.0f}% "
                              f"{_size(done)}/{_size(size)}")
                    err.flush()
    except OSError:
        pass  # the load reports it
    err.write("\r\033[K")
    err.flush()


def _model_path(args) -> str:
    path = args.model or default_model_path()
    if path is None:
        raise CliError(NO_MODEL)
    return path


def _load(args, err: TextIO):
    from .model import Model

    path = _model_path(args)
    tty = err.isatty()
    if tty:
        _warm(path, err)
    head = getattr(args, "draft_head", None)
    dflash = getattr(args, "dflash", None)
    if head is not None and dflash is not None:
        raise CliError("--draft-head and --dflash: draft with one")
    if head is not None and not getattr(args, "no_draft", False):
        head = _classify_head(path, head, args, err)
    elif head is not None:
        head = None  # --no-draft: the sidecar is not even loaded
    if dflash is not None and not getattr(args, "no_draft", False):
        dflash = _classify_head(path, dflash, args, err, flag="--dflash")
    else:
        dflash = None  # --no-draft: the drafter is not even loaded
    t0 = time.perf_counter()
    backend = getattr(args, "backend", "cpu")
    if backend != "cpu":  # ds4py.gpu_backend: refuses what a GPU cannot run, naming it
        from .gpu_backend import load as backend_load

        model = backend_load(path, n_threads=args.threads, n_ctx=args.ctx,
                             precision=args.precision, draft_head=head, dflash=dflash,
                             backend=backend)
        if model.backend_note:
            err.write(f"backend: {model.backend} ({model.backend_note})\n")
            err.flush()
        dflash = None  # attached by the load (the GPU's too: ds4py.gpu_backend._open_gpu)
    else:
        model = Model.load(path, n_threads=args.threads, n_ctx=args.ctx,
                           precision=args.precision, draft_head=head)
    if dflash is not None:
        from .dflash import attach_dflash

        try:
            attach_dflash(model, dflash)
        except DS4Error as e:
            raise CliError(f"--dflash: {e}") from None
    if tty:
        err.write(f"loaded {os.path.basename(path)} ({model.config.arch}, n_ctx {model.n_ctx}, "
                  f"{model.n_threads} threads, {model.precision}) in "
                  f"{time.perf_counter() - t0:.2f} s\n")
        err.flush()
    return model


def _classify_head(path: str, head: str, args, err: TextIO,
                   flag: str = "--draft-head") -> str | None:
    """The pairing verdict of --draft-head (or --dflash) printed on stderr;
    the file to load, or None when the verdict refuses it (then nothing
    drafts)."""
    from .spec.classifier import PairingError, classify

    # verdicts belong to the backend they were measured on (spec.classifier
    # "Backends"); "auto" is judged as the CPU before the load decides --
    # where it lands on a GPU, the generation's plan asks again
    backend = getattr(args, "backend", "cpu")
    backend = "cpu" if backend == "auto" else backend
    try:
        if flag == "--dflash":
            report = classify(path, force=args.force_draft, dflash=head, backend=backend)
        else:
            report = classify(path, head, force=args.force_draft, backend=backend)
    except PairingError as e:
        raise CliError(f"{flag}: {e}") from None
    for line in report.lines():
        err.write(line + "\n")
    err.flush()
    if not report.allowed:
        args.no_draft = True  # a refused sidecar means no drafting, not the bundled head
        return None
    return head


def _draft_kwargs(args) -> dict:
    if args.draft_depth is not None and args.draft_depth < 0:
        raise CliError(f"--draft-depth must be >= 0, got {args.draft_depth}")
    return dict(draft=False if args.no_draft else None, draft_depth=args.draft_depth,
                force_draft=args.force_draft, spec_sampling=args.spec_sampling)


def _sampling_kwargs(args) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k,
                top_p=args.top_p, min_p=args.min_p, seed=args.seed,
                stop=list(args.stop) or None, draw=args.draw, **_draft_kwargs(args))


def stats_line(g) -> str:
    """The statistics line generate prints on stderr."""
    return (f"prompt: {g.prompt_tokens} tokens, {g.prompt_tps:.1f} tok/s | "
            f"generated: {g.generated_tokens} tokens, {g.generation_tps:.1f} tok/s | "
            f"ttft {g.ttft_s:.3f} s | peak memory {_size(g.peak_memory_bytes)} | "
            f"finish: {g.finish_reason}")


# ---------------------------------------------------------------- commands --

def cmd_generate(args, out: TextIO, err: TextIO) -> int:
    import numpy as np

    from .generate import stream_generate

    if args.max_tokens < 0:
        raise CliError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = _load(args, err)
    if args.raw:
        chat = False
        if args.system is not None:
            raise CliError("--system needs a chat prompt (not --raw)")
    elif args.chat or args.system is not None:
        chat = True
    else:
        chat = model.tokenizer.chat_template is not None
    last = None
    for last in stream_generate(model, prompt, chat=chat, system=args.system,
                                enable_thinking=not args.no_think,
                                return_prompt_logits=args.dump_logits is not None,
                                **_sampling_kwargs(args)):
        if not args.json and last.text:
            out.write(last.text)
            out.flush()
    g = last.generation
    if args.dump_logits is not None:
        with open(args.dump_logits, "wb") as f:
            np.savez(f, logits=g.prompt_logits, tokens=np.asarray(g.prompt_ids, dtype=np.int32),
                     model=np.str_(os.path.abspath(model.path)),
                     precision=np.str_(model.precision))
    if args.json:
        d = g.to_dict()
        if getattr(model, "backend_note", ""):
            d["backend_note"] = model.backend_note  # why auto chose it
        out.write(json.dumps(d, ensure_ascii=False) + "\n")
    else:
        if g.text and not g.text.endswith("\n"):
            out.write("\n")
        out.flush()
        err.write(stats_line(g) + "\n")
    return 0


class ChatRepl:
    """A conversation: each turn re-renders the whole history with the chat
    template and evaluates only what follows the longest prefix of it in a
    :class:`ds4py.PrefixCache` (snapshots at every 256 tokens, at the end of
    each prompt and at the end of each reply). Where the template re-renders
    an earlier turn differently (Qwen3.5's drops earlier reasoning) or a reply
    does not re-tokenize to the sampled ids, reuse stops at the last snapshot
    before the first differing token. ``reset()`` starts over with an empty
    cache."""

    def __init__(self, model, system: str | None = None, enable_thinking: bool = True,
                 cache_bytes: int = 2048 << 20, **gen_kwargs):
        self.model = model
        self.tokenizer = model.tokenizer
        if self.tokenizer.chat_template is None:
            raise CliError(f"{model.path}: the model has no chat template "
                           "(tokenizer.chat_template); use generate --raw")
        from .cache import PrefixCache

        self.system = system
        self.enable_thinking = enable_thinking
        self.gen_kwargs = gen_kwargs
        self.cache = PrefixCache(model, budget_bytes=cache_bytes)
        self.session = model.new_session()
        self.reset()

    def reset(self) -> None:
        self.messages: list[dict] = (
            [{"role": "system", "content": self.system}] if self.system is not None else [])
        self.cache.clear()

    def turn(self, user: str, out: TextIO | None = None):
        """Answer ``user``; stream the reply to ``out``. Returns
        (Generation, tokens of the prompt reused from the prefix cache)."""
        from .generate import stream_generate

        tok = self.tokenizer
        messages = [*self.messages, {"role": "user", "content": user}]
        text = tok.apply_chat_template(messages, enable_thinking=self.enable_thinking,
                                       add_generation_prompt=True)
        ids = tok.encode(text, special=True)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id, *ids]
        last = None
        # The session is only the vessel: the cache restores it to the longest
        # cached prefix of ids, whatever it held.
        for last in stream_generate(self.model, ids, session=self.session, cache=self.cache,
                                    parse_output=True, **self.gen_kwargs):
            if out is not None and last.text:
                out.write(last.text)
                out.flush()
        g = last.generation
        k = g.cached_tokens
        reply = {"role": "assistant", "content": g.content if g.content is not None else g.text}
        if g.reasoning:
            reply["reasoning_content"] = g.reasoning
        self.messages = [*messages, reply]
        return g, k


def cmd_chat(args, out: TextIO, err: TextIO) -> int:
    if args.max_tokens < 0:
        raise CliError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    model = _load(args, err)
    if args.cache_mb < 0:
        raise CliError(f"--cache-mb must be >= 0, got {args.cache_mb}")
    repl = ChatRepl(model, system=args.system, enable_thinking=not args.no_think,
                    cache_bytes=args.cache_mb << 20, **_sampling_kwargs(args))
    interactive = sys.stdin.isatty()
    if interactive:
        err.write("chat: one message per line; /reset starts over, /exit quits\n")
    while True:
        if interactive:
            err.write("> ")
            err.flush()
        line = sys.stdin.readline()
        if not line:
            break
        line = line.rstrip("\r\n")
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            break
        if cmd == "/reset":
            repl.reset()
            err.write("(conversation cleared)\n")
            continue
        try:
            g, reused = repl.turn(line, out)
        except DS4Error as e:  # e.g. the conversation outgrew n_ctx: say so, keep going
            err.write(f"error: {e}\n")
            continue
        out.write("\n")
        out.flush()
        err.write(f"{stats_line(g)} | reused {reused} of {reused + g.prompt_tokens} prompt "
                  "tokens\n")
        err.flush()
    return 0


def cmd_spec_calibrate(args, out: TextIO, err: TextIO) -> int:
    from .spec.calibrate import add_entry, calibrate
    from .spec.classifier import PairingError

    if args.reps < 1 or args.max_tokens < 2:
        raise CliError("--reps must be >= 1 and --max-tokens >= 2")
    try:
        if args.draft_head is not None and args.dflash is not None:
            raise CliError("--draft-head and --dflash: measure one")
        entry = calibrate(args.target, args.draft_head, max_tokens=args.max_tokens,
                          reps=args.reps, n_threads=args.threads, dflash=args.dflash,
                          backend=args.backend,
                          log=lambda m: (err.write(m + "\n"), err.flush()))
    except PairingError as e:
        raise CliError(str(e)) from None
    out.write(json.dumps(entry, indent=2) + "\n")
    if args.out:
        add_entry(args.out, entry)
        err.write(f"added to {args.out}\n")
    return 0


def _kinds(kinds) -> str:
    c = Counter(kinds)
    return ", ".join(f"{c[k]} {k}" for k in ("gdn", "attn", "nextn") if c[k])


def cmd_inspect(args, out: TextIO, err: TextIO) -> int:
    from . import gguf
    from .model import Model
    from .quants import type_info
    from .tokenizer import Tokenizer

    model = Model.load(args.path, n_threads=1)
    c = model.config
    w = out.write
    with gguf.open(args.path) as f:
        meta = f.metadata
        w(f"{args.path}: GGUF v{f.version}, {_size(f.file_size)}\n")
        name = meta.get("general.name")
        kind = (f"MoE, {c.n_experts} experts" if c.is_moe else "dense")
        w(f"architecture: {c.arch} ({kind})" + (f", name {name!r}" if name else "") + "\n")
        w(f"context length: {c.context_length} (training); n_ctx {model.n_ctx} by default\n")
        w(f"hidden size: {c.hidden_size}; vocabulary: {c.vocab_size}; "
          f"tied embeddings: {'yes' if c.tied_embeddings else 'no'}\n")
        trunk = c.layer_kinds[:c.n_layers]
        w(f"layers: {c.n_blocks} blocks: {c.n_layers} trunk ({_kinds(trunk)})"
          + (f" + {c.n_nextn_layers} nextn" if c.n_nextn_layers else "") + "\n")
        w("  pattern: " + " ".join(trunk)
          + (" | " + " ".join(c.layer_kinds[c.n_layers:]) if c.n_nextn_layers else "") + "\n")
        w(f"attention: {c.n_heads} heads, {c.n_kv_heads} kv heads, head dim {c.head_dim}, "
          f"rope dims {c.rope_dims}, rope theta {c.rope_theta:g}, scale "
          f"{c.attention_scale:g}\n")
        w(f"gated delta net: conv kernel {c.conv_kernel}, state size {c.ssm_state_size}, "
          f"{c.ssm_n_key_heads} key heads, {c.ssm_n_value_heads} value heads, inner size "
          f"{c.ssm_inner_size}\n")
        if c.is_moe:
            w(f"experts: {c.n_experts}, {c.n_experts_used} used per token, expert ffn "
              f"{c.expert_ffn_size}, shared expert ffn {c.shared_expert_ffn_size}"
              f"{', gate/up fused' if c.fused_gate_up_exps else ''}\n")
        else:
            w(f"ffn: dense, width {c.ffn_size}\n")
        source = getattr(model, "nextn_source", None)
        if c.n_nextn_layers and source is None:
            source = "bundled"
        w(f"nextn head: {'yes (' + source + ')' if source else 'no'}\n")
        hist: dict[int, list[int]] = {}
        for t in f.tensors.values():
            h = hist.setdefault(t.type_id, [0, 0])
            h[0] += 1
            h[1] += t.nbytes
        w(f"tensor types ({len(f.tensors)} tensors):\n")
        for tid, (n, nb) in sorted(hist.items(), key=lambda kv: -kv[1][1]):
            ti = type_info(tid)
            label = f"{ti.name} (ds4-only)" if ti.ds4_only else ti.name
            w(f"  {label:<18} {n:5d} tensor{'s' if n != 1 else ' '}  {_size(nb):>10}\n")
        try:
            tok = Tokenizer.from_gguf_metadata(
                {k: v for k, v in meta.items() if k.startswith("tokenizer.")})
        except DS4Error as e:
            w(f"tokenizer: not usable ({e})\n")
            tok = None
        if tok is not None:
            def name_of(i):
                return "none" if i is None else f"{i} {tok.token_text(i)!r}"
            w(f"tokenizer: {tok.model_name}/{tok.pre}, {tok.n_vocab} tokens, eos "
              f"{name_of(tok.eos_id)}, bos {name_of(tok.bos_id)}, add_bos "
              f"{'yes' if tok.add_bos else 'no'}\n")
        tmpl = meta.get("tokenizer.chat_template")
        if isinstance(tmpl, str):
            think = "enable_thinking" in tmpl or "<think>" in tmpl
            w(f"chat template: yes ({len(tmpl)} characters; thinking "
              f"{'supported' if think else 'not mentioned'})\n")
        else:
            w("chat template: no\n")
    return 0


def cmd_info(args, out: TextIO, err: TextIO) -> int:
    from .demo import info

    return info(args.path, out, err)


def cmd_serve(args, out, err) -> int:
    try:
        from .server.main import config_from_args, serve
    except ImportError as e:
        raise CliError(f"serve needs the server's dependencies: {e}") from None

    return serve(config_from_args(args))


COMMANDS = {"generate": cmd_generate, "chat": cmd_chat, "inspect": cmd_inspect,
            "info": cmd_info, "spec-calibrate": cmd_spec_calibrate, "serve": cmd_serve}


def main(argv: list[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    for stream in (out, err):
        reconf = getattr(stream, "reconfigure", None)
        if reconf is not None:
            try:
                reconf(errors="replace")  # a non-UTF-8 terminal must not crash the stream
            except (ValueError, OSError):
                pass
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args, out, err)
    except KeyboardInterrupt:
        err.write("\n")
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; not an error
        return 0
    except (CliError, DS4Error, OSError, ValueError) as e:
        if args.verbose:
            traceback.print_exc(file=err)
        err.write(f"error: {e}\n")
        return 2
    except Exception as e:  # a bug, but still one line unless --verbose
        if args.verbose:
            traceback.print_exc(file=err)
        err.write(f"error: unexpected {type(e).__name__}: {e}\n")
        return 2
