"""Speculative decoding in the server's engine (ds4py/server/engine.py): a
job drafts where ``ds4py.generate`` drafts, through the same runner, so its
tokens are generate's (greedy and seeded sampling), several drafting jobs
interleave and cancel as serial ones do, a DFlash drafter with a prefix
cache hit keeps drafting, and the API's usage carries the statistics."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import pytest
from dflash_files import DENSE_F32, config, random_arrays, write

import ds4py
from ds4py import PrefixCache
from ds4py.sampling import SamplingParams
from ds4py.server.engine import Delta, Done, Job, JobSpec
from ds4py.server.scheduler import Scheduler
from ds4py.spec.classifier import identity
from tests.server.proc import DEMO, ServerProcess

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.9, top_k=40, seed=4321)
PENALISED = SamplingParams(temperature=0.8, seed=99, repeat_penalty=1.2, repeat_last_n=32)
TIMEOUT_S = 120  # bounds a hang, never a speed: generous for a loaded 2-core machine
PROMPTS = ["def fibonacci(n):\n", "The old lighthouse keeper climbed the stairs and",
           "Solve for x: 3x + 7 = 22."]


@pytest.fixture(scope="module")
def demo():
    return ds4py.load(DEMO, n_threads=2)


class Runner:
    """A scheduler and the events of its jobs."""

    def __init__(self, model, cache=None, n_slots=2):
        self.sched = Scheduler(model, cache or PrefixCache(model, budget_bytes=256 << 20),
                               n_slots=n_slots, max_queue=8)
        self.events: dict[int, list] = {}
        self.done: dict[int, threading.Event] = {}

    def submit(self, spec: JobSpec) -> Job:
        i = len(self.events)
        self.events[i], self.done[i] = [], threading.Event()

        def emit(ev, i=i):
            self.events[i].append(ev)
            if isinstance(ev, Done):
                self.done[i].set()
        job = Job(spec, emit)
        job.index = i
        self.sched.submit(job)
        return job

    def wait(self, job) -> Done:
        assert self.done[job.index].wait(TIMEOUT_S)
        assert job.final.error is None, job.final.error
        return job.final


def _ids(model, text):
    return model.tokenizer.encode(text)


@pytest.mark.parametrize("params", [GREEDY, SEEDED, PENALISED],
                         ids=["greedy", "seeded", "penalised"])
def test_drafting_jobs_equal_generate(demo, params):
    """Three jobs at once on two slots: each equals ds4py.generate (which
    drafts with the demo's bundled head), and each drafted."""
    r = Runner(demo)
    try:
        jobs = [r.submit(JobSpec(ids=_ids(demo, p), max_tokens=40, params=params))
                for p in PROMPTS]
        for job, p in zip(jobs, PROMPTS, strict=True):
            done = r.wait(job)
            kw = dict(temperature=params.temperature, top_k=params.top_k, seed=params.seed,
                      repeat_penalty=params.repeat_penalty, repeat_last_n=params.repeat_last_n)
            g = ds4py.generate(demo, _ids(demo, p), max_tokens=40, **kw)
            plain = ds4py.generate(demo, _ids(demo, p), max_tokens=40, draft=False, **kw)
            assert done.tokens == g.tokens == plain.tokens
            assert done.text == g.text and done.finish_reason == g.finish_reason
            # one Delta per committed token, in order (a round's tokens arrive together)
            deltas = [e for e in r.events[job.index] if isinstance(e, Delta)]
            assert [d.token for d in deltas if d.token is not None] == done.tokens
            d = done.draft
            assert d["drafter"] == "nextn" and d["drafting"] and d["verdict"] == "NOT_APPLICABLE"
            assert d["drafted"] > 0 and d["rounds"] > 0
    finally:
        r.sched.shutdown()


def test_draft_false_is_not_considered(demo):
    r = Runner(demo)
    try:
        job = r.submit(JobSpec(ids=_ids(demo, PROMPTS[0]), max_tokens=20, params=GREEDY,
                               draft=False))
        done = r.wait(job)
        assert done.draft is None  # not considered at all
        g = ds4py.generate(demo, _ids(demo, PROMPTS[0]), max_tokens=20, temperature=0)
        assert done.tokens == g.tokens
    finally:
        r.sched.shutdown()


def test_cancel_while_drafting_frees_the_slot(demo):
    """A drafting job cancelled mid-generation leaves its slot (with a
    verify possibly not settled) to the next job, whose output is exact."""
    r = Runner(demo, n_slots=1)
    try:
        got = threading.Event()

        long = r.submit(JobSpec(ids=_ids(demo, PROMPTS[1]), max_tokens=400, params=GREEDY,
                                stop=()))
        orig = r.events[long.index]

        class Watch(list):
            def append(self, ev):
                super().append(ev)
                if isinstance(ev, Delta) and sum(isinstance(e, Delta) for e in self) >= 5:
                    got.set()
        r.events[long.index] = Watch(orig)
        assert got.wait(TIMEOUT_S)
        r.sched.cancel(long)
        assert r.done[long.index].wait(TIMEOUT_S)
        assert long.final.finish_reason in ("cancelled", "eos", "length")
        nxt = r.submit(JobSpec(ids=_ids(demo, PROMPTS[2]), max_tokens=30, params=GREEDY))
        done = r.wait(nxt)
        g = ds4py.generate(demo, _ids(demo, PROMPTS[2]), max_tokens=30, temperature=0,
                           draft=False)
        assert done.tokens == g.tokens and done.draft["drafted"] > 0
    finally:
        r.sched.shutdown()


def test_dflash_in_the_server_with_a_cache_hit(tmp_path, monkeypatch):
    """A model loaded with a DFlash drafter, its pairing measured good in a
    user table: the engine drafts with it; the second request hits the
    prefix cache and keeps drafting; both equal serial generate."""
    serial_model = ds4py.load(DENSE_F32, precision="exact", n_threads=2)
    prompt = [(7 * i + 3) % 480 for i in range(40)]
    serial = ds4py.generate(serial_model, prompt, max_tokens=30, temperature=0, draft=False)
    cfg = config(mask_token_id=int(np.bincount(serial.tokens).argmax()))
    arrays = random_arrays(cfg, seed=5)
    for i in range(cfg.n_layer):  # drafts = the mask token (test_dflash._agreeing_drafter)
        arrays[f"blk.{i}.attn_output.weight"][:] = 0
        arrays[f"blk.{i}.ffn_down.weight"][:] = 0
    path = write(tmp_path / "agree.gguf", cfg, arrays)
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps({"pairs": [{
        "target": identity(DENSE_F32).id, "draft": identity(path, role="dflash").id,
        "verdict": "ALLOW_MEASURED_GOOD"}]}))
    monkeypatch.setenv("DS4PY_PAIRS", str(pairs))
    m = ds4py.load(DENSE_F32, precision="exact", n_threads=2, dflash=path)
    cache = PrefixCache(m, budget_bytes=256 << 20)
    r = Runner(m, cache=cache, n_slots=1)
    try:
        for n in range(2):
            done = r.wait(r.submit(JobSpec(ids=prompt, max_tokens=30, params=GREEDY)))
            assert done.tokens == serial.tokens
            d = done.draft
            assert d["drafter"] == "dflash" and d["verdict"] == "ALLOW_MEASURED_GOOD"
            assert d["drafting"] and d["drafted"] > 0, d["refused"]
            assert done.cached_tokens == (len(prompt) if n else 0)
    finally:
        r.sched.shutdown()


def test_http_usage_carries_draft_stats():
    s = ServerProcess("--parallel", "2", model=None)
    try:
        s.wait_ready()
        body = {"model": "demo-q8_0.gguf", "messages": [{"role": "user",
                                                         "content": "Parse a URL."}],
                "max_tokens": 32, "temperature": 0}
        r = httpx.post(s.base + "/v1/chat/completions", json=body, headers=s.headers(),
                       timeout=TIMEOUT_S)
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        d = u["draft"]
        assert d["drafter"] == "nextn" and d["drafting"] and d["drafted"] > 0
        assert d["verdict"] == "NOT_APPLICABLE" and "acceptance_per_depth" in d
        model = ds4py.load(DEMO, n_threads=2)
        g = ds4py.generate(model, body["messages"], max_tokens=32, temperature=0)
        assert u["completion_tokens"] == g.generated_tokens
        assert r.json()["choices"][0]["message"]["content"] == g.content
    finally:
        s.stop()
