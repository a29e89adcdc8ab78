"""The server's scheduler in process (no HTTP): a long prefill goes in one KV
block per round so other streams keep going, its result equals
ds4py.generate's, and a reader that falls behind pauses its job instead of
letting events pile up."""

from __future__ import annotations

import math
import random
import threading
import time

import pytest

import ds4py
from ds4py import PrefixCache
from ds4py.cache import BLOCK
from ds4py.sampling import SamplingParams
from ds4py.server.engine import MAX_BACKLOG, Delta, Done, Job, JobSpec, Prefilled
from ds4py.server.scheduler import Scheduler
from tests.server.proc import DENSE

GREEDY = SamplingParams(temperature=0)
# Waits below bound a hang, never a speed: generous for a loaded 2-core machine.
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def model():
    return ds4py.load(DENSE)


@pytest.fixture()
def scheduler(model):
    s = Scheduler(model, PrefixCache(model, budget_bytes=256 << 20), n_slots=2, max_queue=8)
    yield s
    s.shutdown()


class Recorder:
    """Every job's events, in the order the scheduler emitted them."""

    def __init__(self):
        self.log: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        self.done: dict[str, threading.Event] = {}
        self.first: dict[str, threading.Event] = {}

    def job(self, name: str, spec: JobSpec) -> Job:
        self.done[name], self.first[name] = threading.Event(), threading.Event()

        def emit(ev):
            with self.lock:
                self.log.append((name, ev))
            if isinstance(ev, Delta):
                self.first[name].set()
            if isinstance(ev, Done):
                self.done[name].set()
        return Job(spec, emit)

    def mark(self, label: str) -> None:
        with self.lock:
            self.log.append((label, None))


def _plain_ids(model, n: int, seed: int) -> list[int]:
    special = set(model.tokenizer.special_ids) | set(model.tokenizer.eog_ids)
    ok = [t for t in range(model.config.vocab_size) if t not in special]
    rng = random.Random(seed)
    return [rng.choice(ok) for _ in range(n)]


def test_long_prefill_interleaves_with_a_running_stream(model, scheduler):
    rec = Recorder()
    filler = _plain_ids(model, 1, 1)[0]
    # A: a short prompt and 120 forced tokens (it cannot end early on an EOS)
    a = rec.job("A", JobSpec(ids=_plain_ids(model, 8, 2), max_tokens=120, params=GREEDY,
                             forced_tokens=[filler] * 120))
    long_prompt = _plain_ids(model, 6 * BLOCK - 100, 3)
    b = rec.job("B", JobSpec(ids=long_prompt, max_tokens=6, params=GREEDY))
    scheduler.submit(a)
    assert rec.first["A"].wait(TIMEOUT_S)
    rec.mark("B submitted")
    scheduler.submit(b)
    assert rec.done["B"].wait(TIMEOUT_S) and rec.done["A"].wait(TIMEOUT_S)
    names = [n for n, _ in rec.log]
    start = names.index("B submitted")
    prefilled = next(i for i, (n, ev) in enumerate(rec.log) if n == "B"
                     and isinstance(ev, Prefilled))
    a_during = sum(1 for n, ev in rec.log[start:prefilled] if n == "A" and isinstance(ev, Delta))
    pieces = math.ceil(len(long_prompt) / BLOCK)
    # One piece of B per round, one token of A per round: A streams through B's
    # prefill. (In one call, A would get at most the token of the round under way.)
    assert a_during >= pieces - 1, (a_during, pieces)
    # ... and the pieces change nothing: B's greedy tokens are generate()'s
    want = ds4py.generate(model, long_prompt, max_tokens=6, temperature=0, draft=False)
    assert b.final.tokens == want.tokens
    assert a.final.tokens == [filler] * 120


def test_slow_reader_pauses_its_job_until_it_catches_up(model, scheduler):
    rec = Recorder()
    n = MAX_BACKLOG + 100
    filler = _plain_ids(model, 1, 4)[0]
    job = rec.job("A", JobSpec(ids=_plain_ids(model, 8, 5), max_tokens=n, params=GREEDY,
                               forced_tokens=[filler] * n))
    scheduler.submit(job)   # nobody calls job.taken(): a reader that never reads
    deadline = time.monotonic() + TIMEOUT_S
    while job.backlog() < MAX_BACKLOG and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.backlog() == MAX_BACKLOG
    r0 = scheduler.rounds
    while scheduler.rounds < r0 + 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    # rounds went by and the job made no progress: it is held, not finished
    assert scheduler.rounds >= r0 + 5
    assert job.backlog() == MAX_BACKLOG and not job.done
    for _ in range(MAX_BACKLOG):   # the reader catches up
        job.taken()
    assert rec.done["A"].wait(TIMEOUT_S)
    assert job.final.tokens == [filler] * n
