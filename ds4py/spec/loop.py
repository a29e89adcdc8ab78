"""Greedy speculative decoding, exact: the output is the serial greedy output.

    from ds4py.spec import speculative_generate, AdaptivePolicy, FixedPolicy
    tokens, stats = speculative_generate(model, prompt_ids, max_tokens=256,
                                         eos_ids={506})
    stats["finish_reason"], stats["accepted_per_round"]

``speculative_generate`` produces exactly the tokens a serial greedy decode
produces (one ``session.eval`` per token, the argmax with ties to the lowest
id), for every drafter, depth and acceptance pattern, because every
committed token is the target's own argmax at its position:

  a round at position P (the session holds positions < P; ``last`` is the
  last committed token) drafts k tokens, verifies ``[last, d1..dk]`` in one
  batched target pass (``session.verify``: k+1 rows, bit-identical to k+1
  one-token evals), takes the target's argmax g_i of every row, accepts the
  longest prefix with d_{i+1} == g_i (m drafts) and commits d1..dm and g_m
  (the target's own next token): up to k+1 tokens per round. Depth 0 is a
  plain one-token eval.

Committing stops at an EOS id (not included in the tokens), when
``stop_check(tokens)`` returns true (the token that made it true is
included) or at ``max_tokens`` -- wherever that falls inside a round. The
session then keeps only the rows a serial decode would have evaluated
(``accept`` rolls the GDN/conv state, the KV and the head's KV back
exactly): afterwards it holds the prompt and every generated token but the
last (as ``ds4py.generate`` leaves it), and the nextn head holds the rows of
all of them, so a later call on the same session can draft at once.

Admission: drafting happens only if the policy can draft
(``policy.enabled``), there is a drafter (default: the model's nextn head,
:class:`NextnDrafter`, when the file has one) and the drafter accepts the
session (``Drafter.attach``; the nextn head turns on the session's head
priming, refused when the session holds tokens the head never saw). The one
decision governs prefill and decode: an admitted session's prompt is
evaluated in one call in which the core primes the head chunk by chunk
(batched, KV-only), every later row reaches the head with the call that
commits it, and a run that is not admitted never drafts. It is therefore
impossible to draft from a head that missed part of the history (and the
core's ``ds4_spec_propose`` checks it again).

Costs reach the policy as wall times from ``clock`` (default
``time.perf_counter``; ds4py.spec.runner says what is timed): plain decode
steps, verifies by width, draft steps, and the rest of each drafting round
(argmaxes, accept with the head's catch-up, bookkeeping).

The result: ``(tokens, stats)``; stats keys: ``finish_reason`` ("eos",
"stop", "length"), ``drafter``, ``draft_admitted``, ``draft_refused``
(the reason, or None), ``rounds``, ``draft_rounds``, ``probes``,
``drafted``, ``accepted`` (drafts committed), ``acceptance`` (accepted /
drafted), ``tokens_per_round`` (generated tokens after the first, per
round), ``depth_counts`` ({depth: rounds}), ``accept_counts`` ({accepted
drafts: drafting rounds}), ``prompt_s``, ``decode_s``, ``n_past``,
``policy`` (the policy's own summary).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .._core import lib
from ..errors import ModelError
from .drafter import Drafter, NextnDrafter
from .policy import AdaptivePolicy, Policy
from .runner import SpecRunner, argmax_pick

__all__ = ["speculative_generate"]


def _ids(prompt_ids, vocab: int) -> list[int]:
    arr = np.asarray(prompt_ids)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("prompt_ids must be a non-empty 1-D sequence of token ids")
    ids = [int(t) for t in arr]
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ModelError(f"prompt token id {bad[0]} is outside the vocabulary "
                         f"(0..{vocab - 1})", lib.DS4_ERR_ARG)
    return ids


def speculative_generate(model, prompt_ids: Sequence[int], max_tokens: int,
                         eos_ids: Iterable[int] = (),
                         stop_check: Callable[[list[int]], bool] | None = None,
                         policy: Policy | None = None, drafter: Drafter | None = None,
                         session=None, *, clock: Callable[[], float] = time.perf_counter,
                         ) -> tuple[list[int], dict]:
    """Greedy generation of up to ``max_tokens`` tokens after ``prompt_ids``
    (evaluated after ``session.n_past``; a fresh session when None), with
    speculative rounds chosen by ``policy`` (default :class:`AdaptivePolicy`)
    and drafted by ``drafter`` (default: the model's nextn head). Returns
    ``(tokens, stats)``; see the module doc."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) \
            or max_tokens < 0:
        raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
    model._live()
    vocab = model.config.vocab_size
    ids = _ids(prompt_ids, vocab)
    eos = frozenset(int(t) for t in eos_ids)
    if policy is None:
        policy = AdaptivePolicy()
    if drafter is None and policy.enabled and model.nextn_source is not None:
        drafter = NextnDrafter(model)
    own = session is None
    s = model.new_session() if own else session
    try:
        return _run(model, s, ids, int(max_tokens), eos, stop_check, policy, drafter, clock)
    finally:
        if own:
            s.close()


def _run(model, s, ids, max_tokens, eos, stop_check, policy, drafter, clock):
    p0 = s.n_past
    if p0 + len(ids) > model.n_ctx:
        raise ModelError(f"prompt of {len(ids)} tokens does not fit: n_past {p0} + "
                         f"{len(ids)} > n_ctx {model.n_ctx}", lib.DS4_ERR_ARG)
    run = SpecRunner(model, s, policy, drafter, argmax_pick, clock=clock)
    run.admit()
    t_p0 = clock()
    logits, _ = run.prefill(ids)
    first = int(logits.argmax())
    t_p1 = clock()

    budget = min(max_tokens, model.n_ctx - s.n_past)
    tokens: list[int] = []

    def commit(t: int) -> str | None:
        if t in eos:
            return "eos"
        tokens.append(t)
        if stop_check is not None and stop_check(tokens):
            return "stop"
        if len(tokens) >= budget:
            return "length"
        return None

    finish = "length" if budget <= 0 else commit(first)
    last = first
    while finish is None:
        block = run.round(last, budget - len(tokens))
        j = len(block) - 1
        for i, (t, _row) in enumerate(block):
            finish = commit(t)
            if finish is not None:
                j = i
                break
        run.settle(j, finish is not None)
        last = block[j][0]
    run.finish()
    t_end = clock()
    stats = run.stats()
    stats.update({
        "finish_reason": finish,
        "tokens_per_round": (len(tokens) - 1) / run.rounds if run.rounds else 0.0,
        "prompt_s": t_p1 - t_p0, "decode_s": t_end - t_p1, "n_past": s.n_past,
    })
    return tokens, stats
