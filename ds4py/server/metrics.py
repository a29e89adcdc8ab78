"""Prometheus metrics (prometheus-client), on a registry of the app's own so
that several apps in one process (tests) do not collide."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("ds4py_prompt_tokens", "Prompt tokens received", registry=r)
        self.cached_tokens = Counter("ds4py_prefix_cache_reused_tokens",
                                     "Prompt tokens restored from the prefix cache", registry=r)
        self.generated_tokens = Counter("ds4py_generated_tokens", "Tokens generated",
                                        registry=r)
        self.requests = Counter("ds4py_requests", "Generation requests finished", ["finish"],
                                registry=r)
        self.rejected = Counter("ds4py_requests_rejected", "Requests refused: queue full",
                                registry=r)
        self.running = Gauge("ds4py_requests_running", "Requests being generated", registry=r)
        self.queued = Gauge("ds4py_requests_queued", "Requests waiting for a slot", registry=r)
        self.tps = Gauge("ds4py_generation_tokens_per_second",
                         "Decode tok/s of the last finished request", registry=r)
        self.ttft = Histogram("ds4py_time_to_first_token_seconds", "Time to first token",
                              registry=r)

    def started(self, job) -> None:
        self.prompt_tokens.inc(len(job.spec.ids))

    def finished(self, job) -> None:
        done = job.final
        if done is None:
            return
        self.cached_tokens.inc(done.cached_tokens)
        self.generated_tokens.inc(len(done.tokens))
        self.requests.labels(done.finish_reason).inc()
        if done.ttft_s:
            self.ttft.observe(done.ttft_s)
        if len(done.tokens) > 1 and done.generation_s > 0:
            self.tps.set((len(done.tokens) - 1) / done.generation_s)

    def render(self, scheduler) -> bytes:
        if scheduler is not None:
            self.running.set(scheduler.n_running)
            self.queued.set(scheduler.n_waiting)
        return generate_latest(self.registry)
