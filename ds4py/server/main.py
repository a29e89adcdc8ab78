"""``ds4py-server`` / ``python -m ds4py serve``: parse options, run uvicorn."""

from __future__ import annotations

import argparse
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
    p.add_argument("--enable-test-hooks", action="store_true", help=argparse.SUPPRESS)


def config_from_args(a) -> ServerConfig:
    for name in ("parallel", "max_body_bytes", "cache_bytes"):
        if getattr(a, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1")
    if a.max_queue < 0:
        raise SystemExit("error: --max-queue must be >= 0")
    from ..demo_model import demo_model_path

    return ServerConfig(model_path=a.model or demo_model_path(), host=a.host, port=a.port,
                        api_key=a.api_key, alias=a.alias, n_ctx=a.ctx, parallel=a.parallel,
                        threads=a.threads,
                        cache_bytes=a.cache_bytes, max_body_bytes=a.max_body_bytes,
                        max_queue=a.max_queue, cors=a.cors, test_hooks=a.enable_test_hooks)


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
