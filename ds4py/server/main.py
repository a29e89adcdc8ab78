"""``ds4py-server`` / ``python -m ds4py serve``: parse options, run uvicorn."""

from __future__ import annotations

import argparse
import os
import sys

from .app import ServerConfig, ServerState, create_app


def build_parser(prog: str = "ds4py-server") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="OpenAI-compatible HTTP server")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model",
                   help="the GGUF model file (default: the demo model shipped in the package)")
    p.add_argument("--host", default="127.0.0.1", help="address (default loopback; ::1 for IPv6)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (or x-api-key)")
    p.add_argument("--alias", help="the model name clients see (default: the file name)")
    p.add_argument("--ctx", type=int, help="context size in tokens")
    p.add_argument("--parallel", type=int, default=1, help="sessions generating together")
    p.add_argument("--threads", type=int, help="core threads (default: one per CPU)")
    p.add_argument("--cache-bytes", type=int, default=1 << 30, help="prefix cache budget")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting for a slot before 503")
    p.add_argument("--cors", nargs="*", default=[], metavar="ORIGIN")
    d = p.add_argument_group("speculative decoding (output never changes, only speed)")
    d.add_argument("--draft-head", metavar="FILE",
                   help="a standalone nextn (MTP) head GGUF to draft with")
    d.add_argument("--dflash", metavar="FILE",
                   help="a DFlash drafter GGUF to draft with (instead of the nextn head)")
    d.add_argument("--no-draft", action="store_true", help="turn drafting off")
    d.add_argument("--force-draft", action="store_true",
                   help="draft with a pairing the table does not know (REFUSE_UNKNOWN)")
    p.add_argument("--enable-test-hooks", action="store_true", help=argparse.SUPPRESS)
    # Test hook: loading waits until this file exists, so a test sees the
    # loading state (/health 503) for as long as it needs, with no sleeps.
    p.add_argument("--test-load-gate", metavar="FILE", help=argparse.SUPPRESS)


def config_from_args(a) -> ServerConfig:
    for name in ("parallel", "max_body_bytes", "cache_bytes"):
        if getattr(a, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1")
    if a.max_queue < 0:
        raise SystemExit("error: --max-queue must be >= 0")
    if a.draft_head is not None and a.dflash is not None:
        raise SystemExit("error: --draft-head and --dflash: draft with one")
    for flag, path in (("--draft-head", a.draft_head), ("--dflash", a.dflash)):
        if path is not None and not os.path.isfile(path):
            raise SystemExit(f"error: {flag}: no such file {path!r}")
    if a.test_load_gate is not None and not a.enable_test_hooks:
        raise SystemExit("error: --test-load-gate is a test hook (needs --enable-test-hooks)")
    from ..demo_model import demo_model_path

    return ServerConfig(model_path=a.model or demo_model_path(), host=a.host, port=a.port,
                        api_key=a.api_key, alias=a.alias, n_ctx=a.ctx, parallel=a.parallel,
                        threads=a.threads,
                        cache_bytes=a.cache_bytes, max_body_bytes=a.max_body_bytes,
                        max_queue=a.max_queue, cors=a.cors, test_hooks=a.enable_test_hooks,
                        draft_head=a.draft_head, dflash=a.dflash, no_draft=a.no_draft,
                        force_draft=a.force_draft, test_load_gate=a.test_load_gate)


def serve(config: ServerConfig) -> int:
    import uvicorn

    if config.model_path is None:
        print("ds4py-server: error: no model given; pass -m MODEL.gguf", file=sys.stderr)
        return 2
    state = ServerState(config)
    app = create_app(config, state)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port,
                                           log_level="warning", timeout_graceful_shutdown=2))
    failed = []

    def on_load_error():
        failed.append(True)
        server.should_exit = True

    state.on_load_error = on_load_error
    print(f"ds4py-server: listening on http://{_hostport(config.host, config.port)} "
          f"(loading {config.model_path})", file=sys.stderr, flush=True)
    server.run()
    return 2 if failed else 0


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return serve(config_from_args(a))


if __name__ == "__main__":
    sys.exit(main())
