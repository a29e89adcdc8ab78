"""Text generation: ``generate`` (one result) and ``stream_generate`` (pieces as they come).

    model = ds4py.load("model.gguf")
    g = ds4py.generate(model, [{"role": "user", "content": "Hi"}], max_tokens=64,
                       temperature=0)
    g.text, g.finish_reason, g.generation_tps      # see Generation
    for chunk in ds4py.stream_generate(model, "Once upon a time", max_tokens=32):
        print(chunk.text, end="", flush=True)       # chunk.generation on the last one

The prompt
  - a list of message dicts (``{"role": ..., "content": ...}``): rendered with
    the model's chat template (``Tokenizer.apply_chat_template``, with
    ``enable_thinking`` and ``tools``), generation prompt added;
  - a ``str``: fed as it is ("raw"), unless ``chat=True``, which wraps it as
    one user message (``system=`` adds a system message before it and implies
    ``chat=True``);
  - a sequence of token ids: fed as they are (no BOS added, no template).

  Text is encoded with special tokens recognised (``parse_special=True``, the
  default): a rendered template is made of them (``<|im_start|>`` ...), and
  llama.cpp's CLI/server and transformers' ``encode`` read a raw prompt the
  same way. Pass ``parse_special=False`` for text that is data (an
  untrusted document): "<|im_end|>" in it then stays plain text. A BOS is
  prepended when the tokenizer says ``add_bos`` and the session is at
  position 0 (Qwen3.5 GGUFs say it is not).

Stopping (``finish_reason``)
  - ``"eos"``: the model produced an end-of-generation token
    (``tokenizer.eog_ids``). That token is in neither ``tokens`` nor ``text``.
  - ``"stop"``: the text reached one of ``stop`` (matched across token
    boundaries, ``ds4py.stop.StopMatcher``); ``text`` ends just before it,
    ``tokens`` includes the token that completed it.
  - ``"length"``: ``max_tokens`` tokens, or the context is full: prompt plus
    generated tokens never exceed ``model.n_ctx`` (so every token the result
    names could be evaluated into the session). A prompt that alone does not
    fit raises :class:`ds4py.ModelError` before anything is evaluated.

Text
  Tokens are detokenized incrementally (``Tokenizer.stream``): a piece never
  ends inside a UTF-8 character, and the pieces join to ``tokenizer.decode``
  of the tokens (with the stop string cut). Special tokens the model
  generates inside its reply (``<think>``, ``<tool_call>``) render as their
  text: the output parser needs them. For a chat prompt (and when
  ``parse_output=True``) the reply is also split into ``reasoning``,
  ``content`` and ``tool_calls`` (``ds4py.output_parser``); the parser starts
  inside the reasoning block when the rendered prompt ends in an open
  ``<think>``.

Sampling
  ``sampling=SamplingParams(...)`` or the individual keywords (which override
  fields of ``sampling``); defaults are llama.cpp's (temperature 0.8, top-k 40,
  top-p 0.95, min-p 0.05). ``temperature <= 0`` is greedy: the argmax, ties to
  the lowest id, deterministic. With penalties on, the prompt's last
  ``repeat_last_n`` tokens enter the penalty window (as llama.cpp's server
  does). ``seed=None`` picks a random seed; ``Generation.seed`` reports it.

Sessions
  Without ``session`` a fresh session is made and freed at the end. With
  ``session=s`` the prompt is appended after ``s.n_past`` (continue a
  conversation without re-evaluating it). Afterwards the session holds the
  prompt and the first ``Generation.evaluated_tokens`` generated tokens: the
  last sampled token is not evaluated (that would cost a forward step whose
  logits nobody reads), so a continuation starts by feeding it.

Prefix cache
  ``cache=PrefixCache(model)`` (ds4py.cache): the prompt is then the whole
  sequence from position 0 (a BOS is added as for a fresh session). The
  longest cached prefix of its ids is restored (into ``session`` when given,
  whatever it held, else into a fresh one) and only the rest is evaluated, in
  pieces that end at each multiple of 256 tokens and at the end of the
  prompt, each of which is snapshotted into the cache; so is the end of
  generation (prompt + the evaluated generated tokens). A hit on the whole
  prompt samples from the cached last logits without evaluating anything.
  Results are bit-identical to an uncached run (snapshot/restore are exact).
  ``Generation.cached_tokens`` is the number of prompt tokens reused;
  ``prompt_tokens`` counts only those evaluated. With
  ``return_prompt_logits`` every prompt row is needed, so nothing is reused
  (the snapshots are still taken).

Speculative decoding (ds4py.spec)
  When the model has a nextn (MTP) head that the pairing classifier allows
  (its bundled head always), generation drafts with it by default, greedy
  and sampled: ``draft=False`` turns it off, ``draft_depth=K`` fixes the
  depth, ``draft_policy`` / ``drafter`` replace the adaptive policy / the
  head, ``force_draft`` overrides an unmeasured pairing. The tokens, text,
  finish and the session's final state are exactly those of ``draft=False``
  (ds4py.spec.runner says why). A drafting request turns on the session's
  head priming before its prompt is evaluated, so the core keeps the head's
  KV in step with every committed row (prefill included); with ``cache=``
  it restores only snapshots that carry the head's history. A model loaded
  with a DFlash drafter (``ds4py.load(..., dflash=FILE)``) drafts with it
  instead (its verdict from the classifier); the run goes through the
  drafter's TapSession, and a prefix-cache hit rebuilds the drafter's
  context from the taps recorded with the snapshot (or, for a snapshot
  without them, from one re-evaluation of the prefix). Rounds that do
  not draft are the plain loop's step. ``Generation.draft`` holds the
  statistics (drafter, verdict, rounds, drafted, accepted, acceptance per
  depth, mean accepted length, verify ms per width, decode tok/s, the
  policy's measured costs).

Statistics (per result; each stream chunk carries the running values)
  ``ttft_s``: from the call to the first sampled token (template,
  tokenization, prefill and one sampling step). ``prompt_tps``: prompt tokens
  per second of the prefill eval alone. ``generation_tps``: decode steps
  (one-token eval + sampling + detokenization) per second after the first
  token; 0.0 when there were none (max_tokens 1). ``peak_memory_bytes``: the
  process's peak resident set size (``getrusage`` ru_maxrss: KiB on Linux,
  bytes on macOS; reported in bytes).

Overhead
  The decode loop makes O(1) calls per token: one ``ds4_session_eval`` of one
  token through a reused buffer, and, when greedy without bias or penalties,
  one ``np.argmax`` over the core's logits view (no copy). Other sampling goes
  through :class:`ds4py.Sampler`. ``make bench`` (bench/bench_generate.py)
  holds this loop against the core's own C loop.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._core import lib
from .cache import PrefixCache
from .dflash import DFlashDrafter
from .errors import ModelError
from .gpu_backend import GpuSession, backend_of, gpu_draft_plan, on_gpu
from .output_parser import OutputParser, ToolCall, prompt_ends_in_thinking
from .sampling import Sampler, SamplingParams, TokenLogprobs
from .sampling import logprobs as _token_logprobs
from .spec.drafter import NextnDrafter
from .spec.plan import draft_plan
from .spec.runner import SpecRunner
from .spec.stepper import Stepper as _Stepper
from .stop import StopMatcher

__all__ = ["Generation", "GenerationChunk", "generate", "stream_generate", "peak_memory_bytes",
           "FINISH_EOS", "FINISH_STOP", "FINISH_LENGTH"]

FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"

_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                  "presence_penalty", "frequency_penalty", "logit_bias", "seed", "min_keep",
                  "draw")


def peak_memory_bytes() -> int:
    """The process's peak resident set size in bytes (0 where unknown)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux (and the BSDs) report KiB; macOS reports bytes (getrusage(2)).
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024


@dataclass
class Generation:
    """The result of :func:`generate` (see the module docstring for the meaning
    of each statistic)."""

    text: str                       # the reply (stop string excluded)
    tokens: list[int]               # generated ids (an eos token excluded)
    prompt_tokens: int              # prompt tokens evaluated (BOS included; not cached ones)
    generated_tokens: int           # len(tokens)
    prompt_tps: float
    generation_tps: float
    ttft_s: float
    peak_memory_bytes: int
    finish_reason: str              # "eos", "stop" or "length"
    # -- details --
    prompt_s: float = 0.0           # the prefill eval
    generation_s: float = 0.0       # from the first token to the end
    total_s: float = 0.0            # the whole call
    evaluated_tokens: int = 0       # generated tokens evaluated into the session
    n_past: int = 0                 # the session's position afterwards
    stop_string: str | None = None  # the stop string that ended it
    seed: int | None = None         # the sampler's seed (None when greedy)
    reasoning: str | None = None    # parsed reply (chat / parse_output), else None
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    prompt: str | None = None       # the text fed (rendered template), None for ids
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    prompt_logits: np.ndarray | None = field(default=None, repr=False)
    cached_tokens: int = 0          # prompt tokens restored from the prefix cache
    draft: dict | None = None       # speculative decoding statistics (module doc)
    backend: str = "cpu"            # the model's backend (ds4py.gpu_backend)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what ``python -m ds4py generate --json`` prints)."""
        d: dict[str, Any] = {
            "text": self.text, "tokens": list(self.tokens),
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "prompt_tps": self.prompt_tps, "generation_tps": self.generation_tps,
            "ttft_s": self.ttft_s, "peak_memory_bytes": self.peak_memory_bytes,
            "finish_reason": self.finish_reason,
            "prompt_s": self.prompt_s, "generation_s": self.generation_s,
            "total_s": self.total_s, "stop_string": self.stop_string, "seed": self.seed,
            "cached_tokens": self.cached_tokens, "backend": self.backend,
        }
        if self.draft is not None:
            d["draft"] = self.draft
        if self.reasoning is not None:
            d["reasoning"] = self.reasoning
            d["content"] = self.content
            d["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.logprobs is not None:
            d["logprobs"] = [{"token": lp.token, "logprob": lp.logprob,
                              "top": [{"token": t, "logprob": v} for t, v in
                                      zip(lp.top_ids, lp.top_logprobs, strict=True)]}
                             for lp in self.logprobs]
        return d


@dataclass(slots=True)
class GenerationChunk:
    """One step of :func:`stream_generate`: the text it released and the running
    statistics. The last chunk has ``finish_reason`` and ``generation`` set."""

    text: str                       # text released by this step (may be "")
    token: int | None               # the token sampled (None on a final chunk without one)
    generated_tokens: int           # tokens so far, this one included
    step_s: float                   # wall time since the previous chunk (or the call)
    ttft_s: float
    prompt_tokens: int
    prompt_tps: float
    generation_tps: float           # running
    reasoning: str = ""             # parsed deltas (chat / parse_output)
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: TokenLogprobs | None = None
    finish_reason: str | None = None
    generation: Generation | None = None


# ------------------------------------------------------------------ helpers --

def _sampling_params(sampling: SamplingParams | None, overrides: dict[str, Any]) -> SamplingParams:
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    base = sampling if sampling is not None else SamplingParams()
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(base, **changes) if changes else base


def _is_messages(prompt) -> bool:
    return (isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes))
            and len(prompt) > 0 and isinstance(prompt[0], Mapping))


def _as_ids(prompt) -> list[int] | None:
    """The prompt as token ids when it is a sequence of ints, else None."""
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise TypeError(f"a token-id prompt must be a 1-D integer array, got "
                            f"{prompt.dtype} {prompt.shape}")
        return [int(t) for t in prompt]
    if isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)):
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in prompt):
            return None
        return [int(t) for t in prompt]
    return None


def _prepare_prompt(model, prompt, chat, system, enable_thinking, tools, parse_special,
                    at_start: bool) -> tuple[list[int], str | None, bool]:
    """(ids, text fed or None, is_chat)."""
    ids = None if _is_messages(prompt) else _as_ids(prompt)
    if ids is not None:
        if chat or system is not None:
            raise ValueError("a token-id prompt cannot take chat=True or system=")
        if not ids:
            raise ValueError("the prompt is empty")
        return ids, None, False
    tok = model.tokenizer
    if _is_messages(prompt):
        if chat is False:
            raise ValueError("chat=False with a list of messages: pass a str for a raw prompt")
        messages = list(prompt)
        is_chat = True
    elif isinstance(prompt, str):
        is_chat = bool(chat) or (chat is None and system is not None)
        if system is not None and not is_chat:
            raise ValueError("system= needs a chat prompt (chat=False was given)")
        messages = [{"role": "user", "content": prompt}] if is_chat else None
    else:
        raise TypeError("prompt must be a str, a list of message dicts or a list of token ids, "
                        f"not {type(prompt).__name__}")
    if is_chat:
        if system is not None:
            if messages and messages[0].get("role") == "system":
                raise ValueError("system= given but the messages already start with a system "
                                 "message")
            messages = [{"role": "system", "content": system}, *messages]
        text = tok.apply_chat_template(messages, tools=tools, enable_thinking=enable_thinking,
                                       add_generation_prompt=True)
    else:
        text = prompt
    ids = tok.encode(text, special=parse_special)
    if at_start and tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
        ids = [tok.bos_id, *ids]
    if not ids:
        raise ValueError("the prompt is empty")
    return ids, text, is_chat


def _rate(n: int, seconds: float) -> float:
    return n / seconds if n > 0 and seconds > 0 else 0.0


# --------------------------------------------------------------------- API --

def stream_generate(model, prompt, *, max_tokens: int = 256,
                    sampling: SamplingParams | None = None,
                    temperature: float | None = None, top_k: int | None = None,
                    top_p: float | None = None, min_p: float | None = None,
                    repeat_penalty: float | None = None, repeat_last_n: int | None = None,
                    presence_penalty: float | None = None,
                    frequency_penalty: float | None = None,
                    logit_bias: Mapping[int, float] | None = None, seed: int | None = None,
                    stop: str | Sequence[str] | None = None, chat: bool | None = None,
                    system: str | None = None, enable_thinking: bool = True,
                    tools: Sequence[Mapping] | None = None, session=None,
                    logprobs: int | None = None, parse_special: bool = True,
                    parse_output: bool | None = None,
                    return_prompt_logits: bool = False,
                    cache=None, draw: str | None = None, draft: bool | None = None,
                    draft_depth: int | None = None, force_draft: bool = False,
                    draft_policy=None, drafter=None,
                    spec_sampling: str | None = None) -> Iterator[GenerationChunk]:
    """Generate from ``prompt``, yielding a :class:`GenerationChunk` per sampled
    token (and one final chunk for an end-of-generation token). The last chunk
    carries ``finish_reason`` and the whole :class:`Generation`. Arguments as
    :func:`generate`. Leaving the loop early frees a session made for the
    call."""
    kw = locals()
    return _run(model, prompt, max_tokens, sampling, kw, stop, chat, system,
                enable_thinking, tools, session, logprobs, parse_special, parse_output,
                return_prompt_logits, cache, emit=True)


def generate(model, prompt, *, max_tokens: int = 256, sampling: SamplingParams | None = None,
             temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, min_p: float | None = None,
             repeat_penalty: float | None = None, repeat_last_n: int | None = None,
             presence_penalty: float | None = None, frequency_penalty: float | None = None,
             logit_bias: Mapping[int, float] | None = None, seed: int | None = None,
             stop: str | Sequence[str] | None = None, chat: bool | None = None,
             system: str | None = None, enable_thinking: bool = True,
             tools: Sequence[Mapping] | None = None, session=None, logprobs: int | None = None,
             parse_special: bool = True, parse_output: bool | None = None,
             return_prompt_logits: bool = False, cache=None, draw: str | None = None,
             draft: bool | None = None, draft_depth: int | None = None,
             force_draft: bool = False, draft_policy=None, drafter=None,
             spec_sampling: str | None = None) -> Generation:
    """Generate a reply to ``prompt`` (messages, text or token ids; see the module
    docstring) and return a :class:`Generation`.

    ``max_tokens``: at most this many generated tokens (and never past
    ``model.n_ctx``). Sampling: ``sampling`` and/or the individual keywords.
    ``stop``: a string or strings that end the reply (excluded from the text).
    ``chat``: None = auto (messages are chat, a str is raw), True = wrap a str
    as a user message. ``system``: a system message (implies chat).
    ``enable_thinking`` and ``tools`` go to the chat template (and ``tools`` to
    the output parser). ``session``: continue that session instead of a fresh
    one. ``logprobs``: None, or n >= 0: each token's log-probability under the
    raw logits and the n most likely alternatives. ``parse_special``: recognise
    special-token text in the prompt. ``parse_output``: split the reply into
    reasoning / content / tool calls (default: for chat prompts).
    ``return_prompt_logits``: keep every prompt row's logits
    (``Generation.prompt_logits``, float32 [prompt_tokens, vocab]).
    ``cache``: a :class:`ds4py.PrefixCache` of this model: reuse (and add
    to) cached prefixes of the prompt (module doc, Prefix cache).
    ``draw``: "stream" (llama.cpp's seeded draws) or "position" (keyed by
    seed and position). Speculative decoding (module doc): ``draft``
    None = auto, False = off; ``draft_depth`` fixes the depth;
    ``force_draft`` overrides an unknown pairing; ``draft_policy`` /
    ``drafter`` replace the adaptive policy / the nextn head;
    ``spec_sampling``: how sampled rounds decide, "exact" (default: output
    identical to undrafted) or "rejection" (stochastic drafting with
    standard speculative sampling; ds4py.spec.runner).
    """
    kw = locals()
    gen = _run(model, prompt, max_tokens, sampling, kw, stop, chat, system,
               enable_thinking, tools, session, logprobs, parse_special, parse_output,
               return_prompt_logits, cache, emit=False)
    last = None
    for last in gen:  # noqa: B007  (emit=False yields the final chunk only)
        pass
    assert last is not None and last.generation is not None
    return last.generation


def _run(model, prompt, max_tokens, sampling, kw, stop, chat, system, enable_thinking, tools,
         session, n_logprobs, parse_special, parse_output, return_prompt_logits, cache, emit):
    # Validate everything before the generator starts, so that a bad argument
    # raises at the call, not at the first next().
    t_call = time.perf_counter()
    model._live()  # a closed model fails here, not at the first next()
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) \
            or max_tokens < 0:
        raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
    if n_logprobs is not None and (isinstance(n_logprobs, bool) or
                                   not isinstance(n_logprobs, (int, np.integer)) or
                                   n_logprobs < 0):
        raise ValueError(f"logprobs must be None or an int >= 0, got {n_logprobs!r}")
    params = _sampling_params(sampling, {k: kw[k] for k in _SAMPLING_KEYS if k in kw})
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    matcher = StopMatcher(stops) if stops else None
    vocab = model.config.vocab_size
    # Greedy without bias or penalties needs no Sampler: np.argmax is the
    # Sampler's greedy result (first maximum) without its extra passes.
    fast_greedy = params.greedy and not params.logit_bias and not params.penalties_on
    sampler = None if fast_greedy else Sampler(params, vocab)
    if cache is not None:
        if not isinstance(cache, PrefixCache):
            raise TypeError(f"cache must be a PrefixCache, got {type(cache).__name__}")
        if cache.model is not model:
            raise ValueError("the prefix cache belongs to another model")
    own = session is None
    if not own:
        session._live()
    # With a cache the prompt is the whole sequence: the session is restored.
    n_past0 = 0 if own or cache is not None else session.n_past
    ids, text, is_chat = _prepare_prompt(model, prompt, chat, system, enable_thinking, tools,
                                         parse_special, at_start=n_past0 == 0)
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ModelError(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})",
                         lib.DS4_ERR_ARG)
    n_ctx = model.n_ctx
    if n_past0 + len(ids) > n_ctx:
        where = f"after the session's {n_past0} tokens " if n_past0 else ""
        raise ModelError(f"prompt of {len(ids)} tokens does not fit {where}in the context of "
                         f"{n_ctx} tokens (load the model with a larger n_ctx)",
                         lib.DS4_ERR_ARG)
    tok = model.tokenizer
    eog = tok.eog_ids
    parse = is_chat if parse_output is None else bool(parse_output)
    parser = None
    if parse:
        shown = text if text is not None else tok.decode(ids)
        parser = OutputParser(starts_in_thinking=prompt_ends_in_thinking(shown), tools=tools)
    if sampler is not None and params.penalties_on:
        sampler.accept_many(ids[-params.repeat_last_n:])
    if on_gpu(model):  # what a GPU session can draft with (ds4py.gpu_backend says)
        plan = gpu_draft_plan(model, kw, cache)
    else:
        plan = draft_plan(model, kw.get("draft"), kw.get("draft_depth"),
                          bool(kw.get("force_draft")), kw.get("draft_policy"),
                          kw.get("drafter"), sampling=kw.get("spec_sampling"))
    if plan.active:
        return _spec_loop(model, ids, text, session, own, max_tokens, params, sampler, matcher,
                          tok, eog, parser, n_logprobs, return_prompt_logits, cache, emit,
                          t_call, n_ctx, plan)
    return _loop(model, ids, text, session, own, max_tokens, params, sampler, matcher, tok, eog,
                 parser, n_logprobs, return_prompt_logits, cache, emit, t_call, n_ctx, vocab,
                 plan)


def _take_token(t: int, lp, eog, tokens: list[int], lps, budget: int, finish):
    """The plain and speculative loops' token step: an end-of-generation id
    ends the generation (and is not kept), any other id is kept (with its
    logprobs) and may exhaust the budget. -> (finish, kept token or None)."""
    if t in eog:
        return FINISH_EOS, None
    tokens.append(t)
    if lps is not None:
        lps.append(lp)
    if len(tokens) >= budget:
        finish = FINISH_LENGTH
    return finish, t


def _commit_text(dec, matcher, parser, pieces: list[str], token: int | None, finish):
    """The text side of committing one token (both decode loops): its piece
    (plus the decoder's tail when the reply ends), cut at a stop string
    (which ends the reply), appended to ``pieces`` and fed to the output
    parser. ``token`` None: an end-of-generation id, which shows no text.
    Returns (piece, parser events, finish)."""
    piece = dec.feed(token) if token is not None else ""
    if finish is not None:
        piece += dec.finish()
    if matcher is not None:
        piece, stopped = matcher.feed(piece)
        if stopped:
            finish = FINISH_STOP
        elif finish is not None:
            piece += matcher.flush()
    if piece:
        pieces.append(piece)
    events = parser.feed(piece) if parser is not None and piece else ()
    return piece, events, finish


def _loop(model, ids, text, session, own, max_tokens, params, sampler, matcher, tok, eog, parser,
          n_logprobs, return_prompt_logits, cache, emit, t_call, n_ctx, vocab, plan=None):
    s = model.new_session() if own else session
    try:
        t_p0 = time.perf_counter()
        n_cached, track = 0, None
        if cache is not None:
            n_cached, logits, prompt_logits, track = cache.prefill(
                s, ids, reuse=not return_prompt_logits, all_logits=return_prompt_logits)
        elif return_prompt_logits:
            rows = s.eval(ids, all_logits=True)
            prompt_logits = np.array(rows)
            logits = rows[-1]
        else:
            prompt_logits = None
            logits = s.eval(ids)
        t_p1 = time.perf_counter()
        prompt_s = t_p1 - t_p0
        n_prompt = len(ids) - n_cached
        prompt_tps = _rate(n_prompt, prompt_s)
        budget = min(int(max_tokens), n_ctx - s.n_past)
        # a GPU session steps itself (ds4py.gpu_backend.GpuSession.step)
        stepper = s if isinstance(s, GpuSession) else _Stepper(s, vocab)
        # Text is made incrementally only when something reads it during the
        # loop (a stream, stop strings, the output parser); otherwise it is
        # decoded once at the end (the same text: IncrementalDecoder's pieces
        # join to decode()), which keeps ~0.4 µs per token out of the loop.
        lazy = not emit and matcher is None and parser is None
        dec = None if lazy else tok.stream(special=True)
        tokens: list[int] = []
        pieces: list[str] = []
        lps: list[TokenLogprobs] | None = [] if n_logprobs is not None else None
        ttft = 0.0
        t_first = t_prev = t_p1
        decode_steps = 0
        finish = None
        greedy = sampler is None
        accept = sampler is not None and params.penalties_on
        positional = sampler is not None and params.draw == "position"
        pos0 = s.n_past  # the first sampled token goes here
        # greedy on a GPU without logprobs: the device's argmax chooses each
        # next token (ties to the lowest id, NaN rows refused: the CPU's
        # rule), so a step copies back 4 bytes instead of the vocabulary's
        # logits (1 MB for a 248k vocabulary)
        on_device = greedy and lps is None and isinstance(stepper, GpuSession)
        chosen = None
        piece, events, token, lp = "", (), None, None
        if budget <= 0:
            finish = FINISH_LENGTH
        while finish is None:
            # -- sample --
            if chosen is not None:
                t = chosen
            elif greedy:
                t = int(logits.argmax())  # the method: np.argmax adds ~1 µs of dispatch
                if logits[t] != logits[t]:  # argmax lands on the first NaN, if any
                    raise ModelError("the model produced NaN logits", lib.DS4_ERR_BAD_MODEL)
            else:
                if positional:
                    t = sampler.sample_at(logits, pos0 + decode_steps)
                else:
                    t = sampler.sample(logits)
                if accept:
                    sampler.accept(t)
            if lps is not None:
                lp = _token_logprobs(logits, t, n_logprobs)
            if decode_steps == 0:
                t_first = time.perf_counter()
                ttft = t_first - t_call
            # -- stop on an end-of-generation id, or at the budget --
            finish, token = _take_token(t, lp, eog, tokens, lps, budget, finish)
            # -- text --
            if not lazy:
                piece, events, finish = _commit_text(dec, matcher, parser, pieces, token, finish)
            if finish is None:
                # -- evaluate the token for the next step --
                if on_device:
                    chosen = stepper.step_argmax(t)
                else:
                    logits = stepper.step(t)
                decode_steps += 1
                if emit:
                    now = time.perf_counter()
                    yield _chunk(piece, token, tokens, now - t_prev, ttft, n_prompt,
                                 prompt_tps, _rate(decode_steps, now - t_first), events,
                                 lp, None, None)
                    t_prev = time.perf_counter()
                continue
            # -- finished --
            now = time.perf_counter()
            if cache is not None:  # the end of this turn: prompt + evaluated tokens
                cache._extend(track, tokens[:decode_steps])
            if parser is not None:
                events = [*events, *parser.finish()]
            gen = Generation(
                text=tok.decode(tokens) if lazy else "".join(pieces), tokens=tokens,
                prompt_tokens=n_prompt, generated_tokens=len(tokens), prompt_tps=prompt_tps,
                generation_tps=_rate(decode_steps, now - t_first), ttft_s=ttft,
                peak_memory_bytes=peak_memory_bytes(), finish_reason=finish,
                prompt_s=prompt_s, generation_s=now - t_first, total_s=0.0,
                evaluated_tokens=decode_steps, n_past=s.n_past,
                stop_string=matcher.matched if finish == FINISH_STOP else None,
                seed=None if sampler is None else sampler.seed,
                reasoning=parser.reasoning if parser is not None else None,
                content=parser.content if parser is not None else None,
                tool_calls=parser.tool_calls if parser is not None else [],
                logprobs=lps, prompt=text, prompt_ids=list(ids), prompt_logits=prompt_logits,
                cached_tokens=n_cached, draft=_serial_draft_stats(plan),
                backend=backend_of(model))
            gen.total_s = time.perf_counter() - t_call
            yield _chunk(piece, token, tokens, now - t_prev, ttft, n_prompt, prompt_tps,
                         gen.generation_tps, events, lp if token is not None else None,
                         finish, gen)
            return
        # budget 0: nothing sampled
        t_end = time.perf_counter()
        gen = Generation(
            text="", tokens=[], prompt_tokens=n_prompt, generated_tokens=0,
            prompt_tps=prompt_tps, generation_tps=0.0, ttft_s=0.0,
            peak_memory_bytes=peak_memory_bytes(), finish_reason=FINISH_LENGTH,
            prompt_s=prompt_s, total_s=t_end - t_call, n_past=s.n_past,
            seed=None if sampler is None else sampler.seed,
            reasoning="" if parser is not None else None,
            content="" if parser is not None else None, logprobs=lps, prompt=text,
            prompt_ids=list(ids), prompt_logits=prompt_logits, cached_tokens=n_cached,
            draft=_serial_draft_stats(plan), backend=backend_of(model))
        yield _chunk("", None, [], t_end - t_p1, 0.0, n_prompt, prompt_tps, 0.0, (), None,
                     FINISH_LENGTH, gen)
    finally:
        if own:
            s.close()


def _chunk(piece, token, tokens, step_s, ttft, n_prompt, prompt_tps, gen_tps, events, lp,
           finish, gen) -> GenerationChunk:
    reasoning = content = ""
    calls: tuple[ToolCall, ...] = ()
    if events:
        reasoning = "".join(e.text for e in events if e.kind == "reasoning")
        content = "".join(e.text for e in events if e.kind == "content")
        calls = tuple(e.tool_call for e in events if e.kind == "tool_call")
    return GenerationChunk(text=piece, token=token, generated_tokens=len(tokens), step_s=step_s,
                           ttft_s=ttft, prompt_tokens=n_prompt, prompt_tps=prompt_tps,
                           generation_tps=gen_tps, reasoning=reasoning, content=content,
                           tool_calls=calls, logprobs=lp, finish_reason=finish,
                           generation=gen)


def _serial_draft_stats(plan) -> dict | None:
    """Generation.draft of a generation that did not draft: why not."""
    if plan is None:
        return None
    rep = plan.report
    return {"drafter": None, "drafting": False, "refused": plan.reason,
            "verdict": None if rep is None else rep.verdict,
            "pairing": None if rep is None else rep.to_dict()}


def _spec_loop(model, ids, text, session, own, max_tokens, params, sampler, matcher, tok, eog,
               parser, n_logprobs, return_prompt_logits, cache, emit, t_call, n_ctx, plan):
    """The decode loop with speculative rounds (ds4py.spec.runner). Every
    committed token is the one the serial loop (_loop) picks from the same
    logits row, so tokens, text, stop handling and the session's final
    state are the serial loop's; only the chunks' timing differs (a round's
    tokens arrive together)."""
    base = model.new_session() if own else session
    try:
        greedy = sampler is None
        if greedy:
            def pick(row, position):
                return int(row.argmax())
        else:
            pick = sampler.pick
        # a DFlash drafter reads the target's tapped layers of every committed
        # row: the run goes through its TapSession (ds4py.dflash)
        dflash = isinstance(plan.drafter, DFlashDrafter)
        s = plan.drafter.session(base) if dflash else base
        run = SpecRunner(model, s, plan.policy, plan.drafter, pick,
                         greedy=sampler is None, sampler=sampler, sampling=plan.sampling)

        def prepare():
            # a restored snapshot that carries no taps (taken by a request
            # that did not draft with DFlash): rebuild the drafter's context
            # from the prefix's ids before admission (exact either way)
            if dflash and not s.valid and s.n_past:
                s.rebuild(ids[:s.n_past])
            run.admit()

        t_p0 = time.perf_counter()
        n_cached, track = 0, None
        if cache is not None:
            # admission right after the restore, before the rest is evaluated:
            # the head's history comes with the snapshot (only snapshots that
            # carry it are restored for the nextn head; a DFlash TapSession
            # rebuilds its context from the taps recorded with the snapshot)
            # and the core primes the rest during the cache's evals
            n_cached, logits, prompt_logits, track = cache.prefill(
                s, ids, reuse=not return_prompt_logits, all_logits=return_prompt_logits,
                head=isinstance(plan.drafter, NextnDrafter), prepare=prepare)
        else:
            run.admit()
            logits, prompt_logits = run.prefill(ids, all_logits=return_prompt_logits)
        t_p1 = time.perf_counter()
        prompt_s = t_p1 - t_p0
        n_prompt = len(ids) - n_cached
        prompt_tps = _rate(n_prompt, prompt_s)
        budget = min(int(max_tokens), n_ctx - s.n_past)
        p_start = s.n_past
        # text made once at the end when nothing reads it meanwhile (as _loop)
        lazy = not emit and matcher is None and parser is None
        dec = None if lazy else tok.stream(special=True)
        tokens: list[int] = []
        pieces: list[str] = []
        lps: list[TokenLogprobs] | None = [] if n_logprobs is not None else None
        ttft = 0.0
        t_first = t_prev = t_p1
        finish = None
        # The committed tokens come one at a time: from the last round's block
        # (a drafting round's accepted drafts and the target's own token, or a
        # plain round's one token), or -- through a plain stretch the policy
        # promised (ds4py.spec.runner "Quiet stretches") -- from the serial
        # step run right here, so such a stretch costs per token what the
        # serial loop (_loop) costs: going through run.round/settle and a
        # fresh block per token measured 2.5% slower than serial on the demo
        # model (prose, where the policy drafts 7 rounds in 128 tokens).
        block: list = []
        pos = quiet = 0
        hist = run.generated     # the drafter's view of the committed tokens
        plain_times = run.quiet_times
        step = run.stepper.step
        # greedy on a GPU without logprobs: a promised plain stretch takes the
        # device's argmax, as the plain loop does (4 bytes back, not the row)
        step_argmax = (s.step_argmax if greedy and lps is None and isinstance(s, GpuSession)
                       else None)
        # ... and so do the runner's plain rounds (a probe's shadow step too)
        run.plain_argmax = step_argmax
        clock = time.perf_counter
        t = None
        if budget <= 0:
            finish = FINISH_LENGTH
        else:
            block = [(pick(logits, s.n_past), logits)]
        piece, events, token, lp = "", (), None, None
        while finish is None:
            from_round = pos < len(block)
            if from_round:
                t, row = block[pos]
                pos += 1
            elif quiet:
                quiet -= 1
                hist.append(t)
                t0 = clock()
                if step_argmax is not None:
                    t, row = step_argmax(t), None  # a NaN row raises there
                else:
                    row = step(t)
                    t = int(row.argmax()) if greedy else pick(row, s.n_past)
                plain_times.append(clock() - t0)
            else:
                block = run.round(t, budget - len(tokens))
                pos = 0
                quiet = run.take_quiet()
                continue
            if greedy and row is not None and row[t] != row[t]:
                raise ModelError("the model produced NaN logits", lib.DS4_ERR_BAD_MODEL)
            lp = _token_logprobs(row, t, n_logprobs) if lps is not None else None
            if not tokens and ttft == 0.0:
                t_first = time.perf_counter()
                ttft = t_first - t_call
            finish, token = _take_token(t, lp, eog, tokens, lps, budget, finish)
            if not lazy:
                piece, events, finish = _commit_text(dec, matcher, parser, pieces, token, finish)
            if from_round and (finish is not None or pos == len(block)):
                # the round's block is committed (up to the stopping token)
                run.settle(pos - 1, finish is not None)
            if finish is None and emit:
                now = time.perf_counter()
                yield _chunk(piece, token, tokens, now - t_prev, ttft, n_prompt,
                             prompt_tps, _rate(len(tokens) - 1, now - t_first), events,
                             lp, None, None)
                t_prev = time.perf_counter()
        run.finish()
        now = time.perf_counter()
        evaluated = s.n_past - p_start  # serial: every committed token but the last
        if cache is not None:
            cache._extend(track, tokens[:evaluated])
        if parser is not None:
            events = [*events, *parser.finish()]
        steps = evaluated  # decode steps, counted as the serial loop counts them
        gen_s = now - t_first
        stats = run.stats()
        rep = plan.report
        stats.update({"drafting": run.admitted, "refused": run.refused,
                      "verdict": None if rep is None else rep.verdict,
                      "pairing": None if rep is None else rep.to_dict(),
                      "decode_tps": _rate(steps, gen_s)})
        gen = Generation(
            text=tok.decode(tokens) if lazy else "".join(pieces), tokens=tokens,
            prompt_tokens=n_prompt,
            generated_tokens=len(tokens), prompt_tps=prompt_tps,
            generation_tps=_rate(steps, gen_s) if tokens or finish == FINISH_EOS else 0.0,
            ttft_s=ttft, peak_memory_bytes=peak_memory_bytes(), finish_reason=finish,
            prompt_s=prompt_s, generation_s=gen_s if (tokens or finish == FINISH_EOS) else 0.0,
            total_s=0.0, evaluated_tokens=evaluated, n_past=s.n_past,
            stop_string=matcher.matched if finish == FINISH_STOP else None,
            seed=None if sampler is None else sampler.seed,
            reasoning=parser.reasoning if parser is not None else None,
            content=parser.content if parser is not None else None,
            tool_calls=parser.tool_calls if parser is not None else [],
            logprobs=lps, prompt=text, prompt_ids=list(ids), prompt_logits=prompt_logits,
            cached_tokens=n_cached, draft=stats, backend=backend_of(model))
        gen.total_s = time.perf_counter() - t_call
        yield _chunk(piece, token, tokens, now - t_prev, ttft, n_prompt, prompt_tps,
                     gen.generation_tps, events, lp if token is not None else None,
                     finish or FINISH_LENGTH, gen)
    finally:
        if own:
            base.close()
