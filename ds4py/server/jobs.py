"""Bridge between the asyncio side and the scheduler thread: submit a job,
read its events, cancel it when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .engine import Delta, Done, Job, JobSpec, Prefilled
from .errors import APIError
from .grammar import GrammarError
from .scheduler import QueueFull

DISCONNECT_POLL_S = 0.25


async def submit(state, spec: JobSpec) -> tuple[Job, asyncio.Queue]:
    # The server-wide drafting switches (--no-draft, --force-draft) apply to every job.
    if state.config.no_draft:
        spec.draft = False
    spec.force_draft = state.config.force_draft
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    job = Job(spec, lambda ev: loop.call_soon_threadsafe(q.put_nowait, ev))
    try:
        state.scheduler.submit(job)
    except QueueFull as e:
        state.metrics.rejected.inc()
        raise APIError(503, f"the server is busy ({e}); retry later", code="server_busy",
                       headers={"Retry-After": "1"}) from None
    return job, q


def job_error(done: Done) -> APIError:
    e = done.error
    if isinstance(e, (GrammarError, ValueError)):
        return APIError(400, f"generation failed: {e}")
    return APIError(500, f"generation failed: {type(e).__name__}: {e}")


async def run_to_end(state, spec: JobSpec, request) -> tuple[list[Delta], Done]:
    """A non-streamed request: every delta and the Done. Cancels the job if
    the client disconnects while it waits."""
    job, q = await submit(state, spec)
    deltas: list[Delta] = []
    try:
        while True:
            try:
                ev = await asyncio.wait_for(q.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    state.scheduler.cancel(job)
                    raise APIError(400, "client disconnected") from None
                continue
            job.taken()
            if isinstance(ev, Delta):
                deltas.append(ev)
            elif isinstance(ev, Done):
                if ev.error is not None:
                    raise job_error(ev)
                return deltas, ev
    finally:
        if not job.done:
            state.scheduler.cancel(job)


async def events(state, job: Job, q: asyncio.Queue, keepalive_s: float,
                 with_prefilled: bool = False) -> AsyncIterator[object]:
    """A streamed request's events (with the ``Prefilled`` one if asked);
    ``None`` when a keep-alive is due. The
    caller's generator is closed (and this job cancelled) when the client
    disconnects: Starlette cancels the streaming task."""
    try:
        while True:
            try:
                ev = await asyncio.wait_for(q.get(), keepalive_s)
            except asyncio.TimeoutError:
                yield None
                continue
            # Counted when taken from the queue: the backlog is what the scheduler
            # has produced and this reader has not consumed (engine.Job.paused).
            job.taken()
            if isinstance(ev, Prefilled) and not with_prefilled:
                continue
            yield ev
            if isinstance(ev, Done):
                return
    finally:
        if not job.done:
            state.scheduler.cancel(job)
