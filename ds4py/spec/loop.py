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
session (``Drafter.admit``; the nextn head needs rows for every position
the session already holds). The one decision governs prefill and decode:
an admitted session's prompt is evaluated in windows of ``prime_window``
rows whose hidden rows prime the head right away (batched), and one that is
not admitted is evaluated in one plain call and never drafts. It is
therefore impossible to draft from a head that missed part of the history
(and ``NextnDrafter.propose`` checks it again).

Costs reach the policy as wall times from ``clock`` (default
``time.perf_counter``): plain decode steps, verifies by width, draft steps,
and the accept + head catch-up of each drafting round. The prompt's priming
is not charged to any round.

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
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .._core import lib
from ..errors import ModelError
from ..session import VERIFY_MAX
from .drafter import Drafter, DraftError, DraftState, NextnDrafter
from .policy import AdaptivePolicy, Policy

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
                         prime_window: int = 256) -> tuple[list[int], dict]:
    """Greedy generation of up to ``max_tokens`` tokens after ``prompt_ids``
    (evaluated after ``session.n_past``; a fresh session when None), with
    speculative rounds chosen by ``policy`` (default :class:`AdaptivePolicy`)
    and drafted by ``drafter`` (default: the model's nextn head). Returns
    ``(tokens, stats)``; see the module doc."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) \
            or max_tokens < 0:
        raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
    if prime_window < 1:
        raise ValueError("prime_window must be >= 1")
    model._live()
    vocab = model.config.vocab_size
    ids = _ids(prompt_ids, vocab)
    eos = frozenset(int(t) for t in eos_ids)
    if policy is None:
        policy = AdaptivePolicy()
    if drafter is None and policy.enabled and model.nextn_source is not None:
        drafter = NextnDrafter(model, window=prime_window)
    own = session is None
    s = model.new_session() if own else session
    try:
        return _run(model, s, ids, int(max_tokens), eos, stop_check, policy, drafter, clock,
                    prime_window, vocab)
    finally:
        if own:
            s.close()


def _run(model, s, ids, max_tokens, eos, stop_check, policy, drafter, clock, window, vocab):
    p0 = s.n_past
    if p0 + len(ids) > model.n_ctx:
        raise ModelError(f"prompt of {len(ids)} tokens does not fit: n_past {p0} + "
                         f"{len(ids)} > n_ctx {model.n_ctx}", lib.DS4_ERR_ARG)
    # -- admission: one decision for prefill and decode --
    refused = None
    if not policy.enabled:
        refused = "the policy never drafts"
    elif drafter is None:
        refused = "no drafter (the model has no nextn head)"
    else:
        drafter.reset()
        refused = drafter.admit(s)
    admitted = refused is None
    track = admitted and drafter.needs_hidden

    # -- prefill --
    t_p0 = clock()
    h_prev = None
    if track:
        prev = np.array(s.last_hidden()) if p0 > 0 else None
        for i in range(0, len(ids), window):
            chunk = ids[i:i + window]
            lg, hid = s.eval(chunk, all_logits=True, return_hidden=True)
            pos = p0 + i
            # row q pairs token q with the hidden of q-1; position 0 has none
            if prev is None:
                drafter.extend(chunk[1:], hid[:-1], pos + 1)
            else:
                drafter.extend(chunk, np.concatenate([prev[None], hid[:-1]]), pos)
            drafter.sync(s)
            prev = np.array(hid[-1])
            first = int(lg[-1].argmax())
        h_prev = prev
    else:
        first = int(s.eval(ids).argmax())
    t_p1 = clock()

    budget = min(max_tokens, model.n_ctx - s.n_past)
    tokens: list[int] = []
    stats = {"drafter": None if drafter is None else drafter.name,
             "draft_admitted": admitted, "draft_refused": refused}
    depth_counts: Counter = Counter()
    accept_counts: Counter = Counter()
    rounds = probes = drafted = accepted = 0

    def commit(t: int) -> str | None:
        if t in eos:
            return "eos"
        tokens.append(t)
        if stop_check is not None and stop_check(tokens):
            return "stop"
        if len(tokens) >= budget:
            return "length"
        return None

    if budget <= 0:
        finish = "length"
    else:
        finish = commit(first)
    last = first
    verify_max = VERIFY_MAX - 1
    while finish is None:
        P = s.n_past
        cap = min(budget - len(tokens) - 1, verify_max) if admitted else 0
        k = min(policy.choose(cap), cap) if cap > 0 else 0
        rounds += 1
        depth_counts[k] += 1
        if k == 0:
            t0 = clock()
            if track:
                lg, h = s.eval([last], return_hidden=True)
                g = int(lg.argmax())
                drafter.extend([last], h_prev[None], P)
                h_prev = np.array(h)
            else:
                g = int(s.eval([last]).argmax())
            if admitted:
                policy.record_plain(clock() - t0)
            finish = commit(g)
            last = g
            continue
        # -- a speculative round --
        probes += bool(policy.last_was_probe)
        # rows queued by plain decode steps: written now, in one batched call
        # (windows of `window` rows), and not charged to the draft steps:
        # the history is kept whatever the depth
        drafter.sync(s)
        t0 = clock()
        drafts = [int(d) for d in drafter.propose(DraftState(s, P, last, h_prev, tokens), k)]
        if len(drafts) != k:
            raise DraftError(f"{drafter.name}: asked for {k} drafts, got {len(drafts)}")
        t1 = clock()
        if track:
            rows, hv = s.verify([last, *drafts], return_hidden=True)
        else:
            rows = s.verify([last, *drafts])
        g = rows.argmax(axis=1)  # first maximum: ties to the lowest id
        t2 = clock()
        m = 0
        while m < k and drafts[m] == int(g[m]):
            m += 1
        emitted = drafts[:m] + [int(g[m])]
        j = len(emitted) - 1
        for i, t in enumerate(emitted):
            finish = commit(t)
            if finish is not None:
                j = i
                break
        t3 = clock()
        a = j + 1  # rows kept: last and the committed tokens before the final one
        s.accept(a)
        if track:
            drafter.extend(drafts[:a - 1], hv[:a - 1], P + 1)
            drafter.sync(s)
            h_prev = np.array(hv[a - 1])
        t4 = clock()
        policy.record_draft(k, t1 - t0)
        policy.record_verify(k + 1, t2 - t1)
        policy.record_overhead(t4 - t3)
        stopped = finish is not None
        n_ok = min(m, j) if stopped else m
        policy.observe(k, n_ok, stopped)
        drafted += k
        accepted += n_ok
        accept_counts[n_ok] += 1
        last = emitted[j]
    if admitted:
        drafter.finish(s)
    t_end = clock()
    stats.update({
        "finish_reason": finish, "rounds": rounds,
        "draft_rounds": rounds - depth_counts.get(0, 0), "probes": probes,
        "drafted": drafted, "accepted": accepted,
        "acceptance": accepted / drafted if drafted else 0.0,
        "tokens_per_round": (len(tokens) - 1) / rounds if rounds else 0.0,
        "depth_counts": dict(sorted(depth_counts.items())),
        "accept_counts": dict(sorted(accept_counts.items())),
        "prompt_s": t_p1 - t_p0, "decode_s": t_end - t_p1, "n_past": s.n_past,
        "policy": policy.summary(),
    })
    return tokens, stats
