"""The FastAPI app: state, middleware (body limit, API key, CORS), error
handlers, and the small endpoints (/health, /v1/models, /tokenize,
/detokenize, /apply-template, /metrics, the chat page).

Start-up order: uvicorn opens the socket, then the lifespan hook starts
loading the model on a thread, so ``/health`` answers 503 ("loading") at once
and 200 once the model and the scheduler are up. Generation endpoints answer
503 with Retry-After while loading.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import APIError, error_response
from .metrics import Metrics
from .schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest


@dataclass
class ServerConfig:
    model_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    alias: str | None = None
    n_ctx: int | None = None
    parallel: int = 1
    threads: int | None = None
    cache_bytes: int = 1 << 30
    max_body_bytes: int = 4 << 20
    max_queue: int = 64
    cors: list[str] = field(default_factory=list)
    keepalive_s: float = 5.0
    test_hooks: bool = False     # honour ds4py_forced_tokens (tests only)
    draft_head: str | None = None  # a standalone nextn head GGUF (ds4py.load draft_head=)
    dflash: str | None = None      # a DFlash drafter GGUF (ds4py.load dflash=)
    no_draft: bool = False         # every job: JobSpec.draft = False
    force_draft: bool = False      # draft_plan(force_draft=): overrides REFUSE_UNKNOWN only
    test_load_gate: str | None = None  # test hook: loading waits until this file exists


class ServerState:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = Metrics()
        self.model = None
        self.scheduler = None
        self.compiler = None
        self.cache = None
        self.load_error: str | None = None
        self.ready = threading.Event()

    @property
    def model_name(self) -> str:
        c = self.config
        return c.alias or os.path.basename(c.model_path or "ds4py")

    def load(self) -> None:
        """Runs on a thread at start-up."""
        from .. import PrefixCache, load
        from .grammar import GrammarCompiler, GrammarError
        from .scheduler import Scheduler

        c = self.config
        try:
            if c.model_path is None:
                raise ValueError("no model given: pass -m MODEL.gguf")
            self._wait_for_gate()
            # --no-draft: the draft files are not even loaded (the CLI's rule)
            model = load(c.model_path, n_threads=c.threads, n_ctx=c.n_ctx,
                         draft_head=None if c.no_draft else c.draft_head,
                         dflash=None if c.no_draft else c.dflash)
            self._report_pairing(model)
            self.cache = PrefixCache(model, budget_bytes=c.cache_bytes)
            try:
                self.compiler = GrammarCompiler(model.tokenizer, model.config.vocab_size)
            except GrammarError:
                self.compiler = None
            self.scheduler = Scheduler(model, self.cache, c.parallel, c.max_queue, self.metrics)
            self.model = model
            self.ready.set()
        except Exception as e:  # noqa: BLE001 — reported on /health and stderr
            self.load_error = f"{type(e).__name__}: {e}"
            import sys
            print(f"ds4py-server: error: could not load the model: {self.load_error}",
                  file=sys.stderr, flush=True)
            if self.on_load_error is not None:
                self.on_load_error()

    on_load_error = None

    def _wait_for_gate(self) -> None:
        gate = self.config.test_load_gate
        while gate is not None and not os.path.exists(gate):
            time.sleep(0.05)

    def _report_pairing(self, model) -> None:
        """The pairing verdict of --draft-head / --dflash on stderr, as the
        CLI prints it (a refused verdict means the server does not draft)."""
        c = self.config
        if c.no_draft or (c.draft_head is None and c.dflash is None):
            return
        from ..spec.plan import pairing_report

        report = pairing_report(model, c.force_draft)
        if report is not None:
            import sys
            print("\n".join(report.lines()), file=sys.stderr, flush=True)

    def require_ready(self) -> None:
        if not self.ready.is_set():
            msg = (f"the model failed to load: {self.load_error}" if self.load_error
                   else "the model is loading")
            raise APIError(503, msg, code="model_loading", headers={"Retry-After": "1"})

    def check_model(self, name: str | None) -> None:
        if name is None or name == "" or name == self.model_name \
                or name == os.path.basename(self.config.model_path or ""):
            return
        raise APIError(404, f"the model {name!r} does not exist; this server runs "
                            f"{self.model_name!r}", "model", "model_not_found")


class BodyLimit:
    """ASGI middleware: 413 for a body over the limit (declared or streamed)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = -1
                if n < 0 or n > self.limit:
                    return await _send_error(send, 413 if n > self.limit else 400,
                                             f"request body of {v.decode('latin-1')} bytes "
                                             f"exceeds the limit of {self.limit}"
                                             if n > self.limit else "bad Content-Length")
        if scope["method"] == "POST":
            # Every POST body here is JSON; read it as JSON whatever Content-Type says
            # (curl -d sends application/x-www-form-urlencoded).
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
        seen = 0
        too_big = False

        async def limited():
            nonlocal seen, too_big
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    too_big = True
                    raise _TooBig()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooBig:
            await _send_error(send, 413, f"request body exceeds the limit of {self.limit} bytes")


class _TooBig(Exception):
    pass


async def _send_error(send, status, message):
    r = error_response(status, message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(r.body)).encode())]})
    await send({"type": "http.response.body", "body": r.body})


_OPEN_PATHS = {"/health", "/", "/static/chat.js", "/static/chat.css", "/metrics"}


def create_app(config: ServerConfig, state: ServerState | None = None) -> FastAPI:
    state = state or ServerState(config)

    @asynccontextmanager
    async def lifespan(app):
        if state.model is None and not state.ready.is_set():
            threading.Thread(target=state.load, name="ds4py-load", daemon=True).start()
        yield
        if state.scheduler is not None:
            state.scheduler.shutdown()

    app = FastAPI(title="ds4py-server", lifespan=lifespan)
    app.state.ds4 = state

    @app.middleware("http")
    async def auth(request: Request, call_next):
        key = config.api_key
        if key and request.url.path not in _OPEN_PATHS and request.method != "OPTIONS":
            given = request.headers.get("authorization", "")
            given = given[7:] if given.lower().startswith("bearer ") else \
                request.headers.get("x-api-key", "")
            import hmac
            if not hmac.compare_digest(given.encode(), key.encode()):
                return error_response(401, "invalid or missing API key", code="invalid_api_key")
        return await call_next(request)

    if config.cors:
        app.add_middleware(CORSMiddleware, allow_origins=config.cors, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return error_response(e.status, e.message, e.param, e.code, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg, loc = "the request body is not valid JSON", None
        elif first.get("type") == "model_attributes_type":
            msg, loc = "the request body must be a JSON object", None
        return error_response(400, f"{loc}: {msg}" if loc else msg, loc or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e: StarletteHTTPException):
        return error_response(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request, e: Exception):
        return error_response(500, f"internal error: {type(e).__name__}: {e}")

    from .anthropic_api import router as anthropic_router
    from .openai_api import router as openai_router
    app.include_router(openai_router)
    app.include_router(anthropic_router)

    @app.get("/health")
    async def health():
        if state.ready.is_set():
            return {"status": "ok"}
        if state.load_error:
            return JSONResponse({"status": "error", "error": state.load_error}, 503)
        return JSONResponse({"status": "loading"}, 503, headers={"Retry-After": "1"})

    @app.get("/v1/models")
    async def models():
        state.require_ready()
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": 0, "owned_by": "ds4py",
            "meta": {"n_ctx": state.model.n_ctx, "n_vocab": state.model.config.vocab_size,
                     "parallel": config.parallel}}]}

    @app.get("/v1/models/{name}")
    async def model_one(name: str):
        state.require_ready()
        state.check_model(name)
        return {"id": state.model_name, "object": "model", "created": 0, "owned_by": "ds4py"}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        state.require_ready()
        tok = state.model.tokenizer
        if (body.content is None) == (body.messages is None):
            raise APIError(400, "give exactly one of content or messages", "content")
        if body.messages is not None:
            from . import convert
            ids, _ = convert.chat_prompt(state.model, convert.openai_messages(body.messages),
                                         None, True)
        else:
            ids = tok.encode(body.content, special=body.add_special)
        if body.with_pieces:
            return {"tokens": [{"id": t, "piece": tok.token_bytes(t).decode("utf-8", "replace")}
                               for t in ids]}
        return {"tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        state.require_ready()
        vocab = state.model.config.vocab_size
        badt = [t for t in body.tokens if not 0 <= t < vocab]
        if badt:
            raise APIError(400, f"token id {badt[0]} is outside the vocabulary "
                                f"(0..{vocab - 1})", "tokens")
        return {"content": state.model.tokenizer.decode(body.tokens)}

    @app.post("/apply-template")
    async def apply_template(body: ApplyTemplateRequest):
        state.require_ready()
        from . import convert
        kw = body.chat_template_kwargs or {}
        think = kw.get("enable_thinking", True)
        if not isinstance(think, bool):
            raise APIError(400, "chat_template_kwargs.enable_thinking must be a boolean")
        _, text = convert.chat_prompt(state.model, convert.openai_messages(body.messages),
                                      convert.check_tools(body.tools), think)
        return {"prompt": text}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(state.scheduler),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(_static("chat.html"))

    @app.get("/static/{name}")
    async def static(name: str):
        types = {"chat.js": "text/javascript", "chat.css": "text/css"}
        if name not in types:
            raise APIError(404, f"no static file {name!r}")
        return Response(_static(name), media_type=types[name])

    return app


def _static(name: str) -> str:
    try:
        return resources.files("ds4py").joinpath("static", name).read_text("utf-8")
    except FileNotFoundError:
        return f"<!doctype html><p>{name} is not installed</p>"
