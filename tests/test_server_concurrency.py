"""--parallel: slots progress together, results equal one-by-one runs, a full
queue answers 503 + Retry-After, a disconnect frees the slot."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.server.proc import API_KEY, ServerProcess

MODEL = "dense-q8_0.gguf"
NO_EOG = {"504": -100, "506": -100}  # ban <|endoftext|> and <|im_end|>: run to max_tokens


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--parallel", "4", "--max-queue", "32")
    s.wait_ready()
    yield s
    s.stop()


def _client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)


def _request(i: int) -> dict:
    sampled = i % 2 == 1
    return dict(model=MODEL, messages=[{"role": "user", "content": f"request number {i}"}],
                max_tokens=12 + i, temperature=0.8 if sampled else 0,
                seed=100 + i if sampled else None)


def _stream_text(client, kw) -> str:
    return "".join(c.choices[0].delta.content or "" for c in
                   client.chat.completions.create(**kw, stream=True) if c.choices)


def test_16_concurrent_streams_equal_sequential(server):
    c = _client(server)
    sequential = [_stream_text(c, _request(i)) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(lambda i: _stream_text(_client(server), _request(i)),
                                   range(16)))
    assert concurrent == sequential


def test_16_concurrent_drafted_streams_equal_sequential_and_undrafted():
    """The same on the demo model, whose bundled MTP head drafts by default:
    16 concurrent streams (greedy and seeded) == one by one == a --no-draft
    server's answers, and the drafted server really drafted."""
    def run(*extra):
        s = ServerProcess("--parallel", "4", "--max-queue", "32", *extra, model=None)
        s.wait_ready()
        try:
            c = _client(s)
            kws = [dict(_request(i), model="") for i in range(16)]
            seq = [_stream_text(c, kw) for kw in kws]
            with ThreadPoolExecutor(16) as pool:
                conc = list(pool.map(lambda kw: _stream_text(_client(s), kw), kws))
            usage = c.chat.completions.create(**kws[0]).usage.model_extra.get("draft")
            return seq, conc, usage
        finally:
            s.stop()

    seq, conc, usage = run()
    assert conc == seq
    assert usage is not None and usage["drafter"] == "nextn" and usage["rounds"] > 0
    seq_plain, conc_plain, usage_plain = run("--no-draft")
    assert usage_plain is None
    assert seq == seq_plain and conc_plain == seq_plain


def test_second_stream_starts_before_first_ends(server):
    """A is long; B is sent once A's first token arrived. Round-robin stepping means B's
    first token is emitted while A still has hundreds of tokens to go."""
    log: list[str] = []
    lock = threading.Lock()
    a_started = threading.Event()

    def run(name, max_tokens):
        c = _client(server)
        for ch in c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": name}], stream=True,
                max_tokens=max_tokens, temperature=0, logit_bias=NO_EOG):
            if ch.choices and ch.choices[0].delta.content:
                with lock:
                    log.append(name)
                a_started.set()

    ta = threading.Thread(target=run, args=("A", 4000))
    ta.start()
    assert a_started.wait(60)
    run("B", 3)
    ta.join()
    first_b = log.index("B")
    last_a = len(log) - 1 - log[::-1].index("A")
    assert first_b < last_a


def _running(server) -> float:
    text = httpx.get(server.base + "/metrics").text
    line = [ln for ln in text.splitlines() if ln.startswith("ds4py_requests_running ")][0]
    return float(line.split()[1])


def _cancelled(server) -> float:
    text = httpx.get(server.base + "/metrics").text
    lines = [ln for ln in text.splitlines()
             if ln.startswith('ds4py_requests_total{finish="cancelled"}')]
    return float(lines[0].split()[1]) if lines else 0.0


def _hello(server) -> list[int]:
    r = httpx.post(server.base + "/tokenize", json={"content": "hello world"},
                   headers=server.headers())
    return r.json()["tokens"]


def test_disconnect_frees_the_slot(server):
    before = _cancelled(server)
    # ds4py_pause_after (test hook): the job holds its slot after one token, so the
    # disconnect is what ends it, however fast the machine.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 4000, "temperature": 0, "logit_bias": NO_EOG, "ds4py_pause_after": 2,
            "ds4py_forced_tokens": _hello(server)}  # visible text before the pause
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body,
                      headers=server.headers(), timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                break  # one token seen: hang up
    # The scheduler notices at its next round; wait for it (bounded), then check.
    for _ in range(400):
        if _cancelled(server) > before and _running(server) == 0:
            break
        threading.Event().wait(0.025)
    assert _cancelled(server) == before + 1
    assert _running(server) == 0


def test_full_queue_is_503_with_retry_after():
    s = ServerProcess("--parallel", "1", "--max-queue", "0")
    try:
        s.wait_ready()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True,
                "max_tokens": 4000, "temperature": 0, "logit_bias": NO_EOG,
                "ds4py_pause_after": 2,  # test hook: holds the one slot until we hang up
                "ds4py_forced_tokens": _hello(s)}  # visible text before the pause
        with httpx.stream("POST", s.base + "/v1/chat/completions", json=body,
                          headers=s.headers(), timeout=60) as r:
            lines = r.iter_lines()  # not a for/break: closing the iterator hangs up
            while True:
                line = next(lines)
                if '"content":"' in line and '"content":""' not in line:
                    break  # the one slot is busy now
            r2 = httpx.post(s.base + "/v1/chat/completions", headers=s.headers(),
                            json={"messages": [{"role": "user", "content": "y"}],
                                  "max_tokens": 1})
            assert r2.status_code == 503, r2.text
            assert r2.headers["retry-after"] == "1"
            assert r2.json()["error"]["code"] == "server_busy"
    finally:
        s.stop()
