"""ds4py-server on the shipped demo model (its default without -m): greedy
tokens equal llama.cpp's (the committed fixture of tests/test_demo_model.py),
and the drafting options --no-draft, --dflash FILE --force-draft reach the
engine, with the draft statistics in both the OpenAI and the Anthropic usage."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import numpy as np
import pytest

import ds4py
from tests.server.proc import API_KEY, DEMO, DEMO_DFLASH, ServerProcess

ROOT = Path(__file__).resolve().parents[1]
REF = json.loads((ROOT / "tests" / "golden" / "demo" / "llama_reference.json").read_text())
# tests/test_demo_model.py's rule and reason: ds4py and llama.cpp differ by up
# to ~0.22 per logit (rounding), so identity is required only up to the first
# step whose reference top-2 margin is < 0.5.
GREEDY_MARGIN = 0.5
# Prompts whose first unclear step comes late (>= 11 tokens held to identity).
REF_PROMPTS = [1, 7, 8, 9]
TIMEOUT_S = 120  # bounds a hang, never a speed: generous for a loaded 2-core machine
CHAT = [{"role": "user", "content": "Write a Python function that reverses a string."}]
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def demo():
    return ds4py.load(DEMO, n_threads=2)


@pytest.fixture(scope="module")
def default_server():
    s = ServerProcess(model=None)  # no -m: the demo model, drafting with its bundled head
    s.wait_ready(TIMEOUT_S)
    yield s
    s.stop()


def _piece(model, t: int) -> str:
    return model.tokenizer.token_bytes(int(t), special=True).decode("utf-8", "replace")


@pytest.mark.parametrize("i", REF_PROMPTS)
def test_greedy_completion_equals_llamacpp(default_server, demo, i):
    p = REF["prompts"][i]
    want, margins = p["greedy"], np.array(p["margins"])
    low = np.flatnonzero(margins < GREEDY_MARGIN)
    upto = int(low[0]) if low.size else len(want)
    assert upto >= 11, f"prompt {i}: only {upto} steps held to identity"
    r = httpx.post(default_server.base + "/v1/completions", headers=default_server.headers(),
                   timeout=TIMEOUT_S,
                   json={"prompt": p["ids"], "max_tokens": len(want), "temperature": 0,
                         "logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(p["ids"])
    got = body["choices"][0]["logprobs"]["tokens"]
    # The response names tokens by their strings; each reference token's string
    # must belong to that token alone for a string match to be an id match.
    vocab = [_piece(demo, t) for t in range(demo.config.vocab_size)]
    expected = [vocab[t] for t in want[:upto]]
    for s in set(expected):
        assert vocab.count(s) == 1, f"token string {s!r} is ambiguous"
    assert got[:upto] == expected, f"prompt {i}: first {upto} greedy tokens differ"
    # the server drafted (the demo's bundled head) and stayed exact
    assert body["usage"]["draft"]["drafter"] == "nextn"


def _chat(server) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", headers=server.headers(),
                   timeout=TIMEOUT_S,
                   json={"messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def _message(server):
    client = anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0)
    return client.messages.create(model="demo-q8_0.gguf", max_tokens=MAX_TOKENS,
                                  extra_body={"temperature": 0}, messages=CHAT)


def _anthropic_draft(msg):
    usage = msg.usage.model_dump()
    return usage.get("draft")


def test_anthropic_usage_carries_draft_stats(default_server):
    msg = _message(default_server)
    d = _anthropic_draft(msg)
    assert d is not None, msg.usage
    assert d["drafter"] == "nextn" and d["drafting"] and d["drafted"] > 0
    assert d["verdict"] == "NOT_APPLICABLE" and "acceptance_per_depth" in d
    # the same keys as OpenAI's usage.draft for the same request
    o = _chat(default_server)["usage"]["draft"]
    assert set(d) == set(o)


def test_no_draft_server_reports_no_draft(demo):
    s = ServerProcess("--no-draft", model=None)
    try:
        s.wait_ready(TIMEOUT_S)
        body = _chat(s)
        assert "draft" not in body["usage"]
        g = ds4py.generate(demo, CHAT, max_tokens=MAX_TOKENS, temperature=0, draft=False)
        assert body["choices"][0]["message"]["content"] == g.content
        assert body["usage"]["completion_tokens"] == g.generated_tokens
        assert _anthropic_draft(_message(s)) is None
    finally:
        s.stop()


def test_forced_dflash_server_refuses_the_measured_bad_pair(demo):
    """The shipped DFlash pair is REFUSE_MEASURED_BAD (ds4py/spec/pairs.json):
    --force-draft cannot override it; no drafting at all (not the bundled
    head either: the CLI's rule), the text is serial's. (Drafting with a
    DFlash drafter in the server: test_server_spec.py.)"""
    s = ServerProcess("--dflash", DEMO_DFLASH, "--force-draft", model=None)
    try:
        s.wait_ready(TIMEOUT_S)
        body = _chat(s)
        d = body["usage"]["draft"]
        assert d["drafter"] is None and not d["drafting"]
        assert d["verdict"] == "REFUSE_MEASURED_BAD"
        g = ds4py.generate(demo, CHAT, max_tokens=MAX_TOKENS, temperature=0, draft=False)
        assert body["choices"][0]["message"]["content"] == g.content
        assert body["usage"]["completion_tokens"] == g.generated_tokens
        assert "REFUSE_MEASURED_BAD" in s.output()
        assert "ALLOW_FORCED_UNKNOWN" not in s.output()
    finally:
        s.stop()


def test_unforced_dflash_server_does_not_draft(demo):
    """The measured-bad pairing without --force-draft: no drafting at all
    (not the bundled head either: the CLI's rule), same text."""
    s = ServerProcess("--dflash", DEMO_DFLASH, model=None)
    try:
        s.wait_ready(TIMEOUT_S)
        body = _chat(s)
        d = body["usage"]["draft"]
        assert d["drafter"] is None and not d["drafting"]
        assert d["verdict"] == "REFUSE_MEASURED_BAD"
        g = ds4py.generate(demo, CHAT, max_tokens=MAX_TOKENS, temperature=0, draft=False)
        assert body["choices"][0]["message"]["content"] == g.content
    finally:
        s.stop()
