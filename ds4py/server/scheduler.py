"""The scheduler: one thread that advances every running job one token per round.

Why one thread stepping all slots in turn (and not a thread per slot): each
decode step is one call into the C core, which already spreads the step over
the model's thread pool (and releases the GIL while it runs). Steps from
several Python threads at once would compete for the same cores and the same
pool; stepping the slots round-robin from one thread keeps the pool busy with
one step at a time, makes every slot progress token by token, and keeps the
PrefixCache (not thread-safe) on a single thread. The HTTP side never touches
sessions: it submits jobs and reads their events.

Slots: ``n_slots`` sessions made once and reused (``PrefixCache.prefill``
restores or empties a session before each prompt). Queue: FIFO, bounded by
``max_queue``; ``submit`` raises :class:`QueueFull` beyond it (the HTTP side
answers 503 with Retry-After). Admission is first come first served; running
jobs are stepped in admission order, one step each per round, so a long
generation cannot starve a newer one. A cancelled job (client gone) is
dropped at the start of the next round and its session goes back to the pool.

Prefill: a job's prompt goes in one KV block (256 tokens) per round while
other jobs run (Job.prefill_step), so a long prompt delays each other stream
by one block's evaluation per token instead of stalling it for the whole
prompt; a job running alone prefills in one call.

Backpressure: a job whose client has not read MAX_BACKLOG (engine.py) events
is not stepped until it catches up, so a slow reader holds its slot but does
not make the server generate (and buffer) ahead of it.
"""

from __future__ import annotations

import threading
from collections import deque

from .engine import Job


class QueueFull(Exception):
    pass


class Scheduler:
    def __init__(self, model, cache, n_slots: int, max_queue: int, metrics=None):
        self.model = model
        self.cache = cache
        self.metrics = metrics
        self.max_queue = max_queue
        self._free = [model.new_session() for _ in range(n_slots)]
        self.n_slots = n_slots
        self._waiting: deque[Job] = deque()
        self._running: list[tuple[Job, object]] = []
        self._cv = threading.Condition()
        self._stop = False
        self.rounds = 0
        self._thread = threading.Thread(target=self._run, name="ds4py-scheduler", daemon=True)
        self._thread.start()

    # -- HTTP side ----------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._cv:
            if len(self._waiting) >= self.max_queue and not self._free:
                raise QueueFull(f"{len(self._running)} requests running and "
                                f"{len(self._waiting)} queued")
            self._waiting.append(job)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        job.cancelled = True
        with self._cv:
            self._cv.notify()

    @property
    def n_running(self) -> int:
        return len(self._running)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # -- scheduler thread -----------------------------------------------------------
    def _admit(self) -> list[tuple[Job, object]]:
        started = []
        with self._cv:
            while not self._stop and not self._waiting and not self._running:
                self._cv.wait()
            # drop queued jobs whose client left before they started
            for job in [j for j in self._waiting if j.cancelled]:
                self._waiting.remove(job)
                job.cancel_cleanup()
            while self._waiting and self._free:
                started.append((self._waiting.popleft(), self._free.pop()))
        return started

    def _release(self, job: Job, session) -> None:
        with self._cv:
            self._free.append(session)
        self._running.remove((job, session))

    def _run(self) -> None:
        while True:
            started = self._admit()
            if self._stop:
                break
            for job, session in started:
                self._running.append((job, session))
                try:
                    job.start(self.model, session, self.cache)
                except Exception as e:  # noqa: BLE001 — reported to the client, never fatal
                    job.fail(e)
                if self.metrics is not None and not job.done:
                    self.metrics.started(job)
                if job.done:
                    self._finished(job, session)
            progressed = False
            for job, session in list(self._running):
                if job.cancelled:
                    job.cancel_cleanup()
                elif job.paused:
                    pass
                elif not job.done:
                    progressed = True
                    try:
                        # alone: no other stream to keep going, so a prefill
                        # takes the rest of its prompt in one call
                        job.step(alone=len(self._running) == 1 and not self._waiting)
                    except Exception as e:  # noqa: BLE001
                        job.fail(e)
                if job.done:
                    self._finished(job, session)
            self.rounds += 1
            if not progressed and self._running:
                # only paused jobs (a slow reader, or the test hook): wait for a
                # cancel, a new job, or a reader to catch up (polled)
                with self._cv:
                    self._cv.wait(0.05)
        for session in self._free:
            session.close()

    def _finished(self, job: Job, session) -> None:
        if self.metrics is not None:
            self.metrics.finished(job)
        self._release(job, session)
