"""Bounded load test of ds4py-server on loopback (make bench-server).

Starts the server (--parallel N) on the shipped demo model (or -m MODEL), runs
one stream alone, then C concurrent clients x R streamed chat requests, and
prints requests/s, time to first token and inter-token latency p50/p99,
aggregate tok/s against the single stream, and the server's RSS before and
after. Stops by itself.

Soak mode (--soak-seconds S): the C clients keep sending requests for S
seconds; the server's RSS is sampled every --rss-every seconds and printed at
the start, the end, and its maximum, to show memory stays flat.

    python bench/bench_server.py [-m MODEL] [--clients 4] [--requests 4] [--max-tokens 64]
    python bench/bench_server.py --soak-seconds 600 --cache-bytes 67108864
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx  # noqa: E402

from tests.server.proc import DEMO, ServerProcess  # noqa: E402

QUESTIONS = ["Parse a URL.", "Return the sum of two numbers.", "Read a config file.",
             "Sort a list of records by date.", "Join two paths.", "Quote a shell argument.",
             "Format a timestamp.", "Count the words in a file."]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def one_stream(base: str, i: int, max_tokens: int) -> tuple[float, list[float], int]:
    """(time to first token, inter-token gaps, completion tokens) of one streamed chat."""
    body = {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps: list[float] = []
    n_tokens = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                n_tokens = ev["usage"]["completion_tokens"]
            delta = ev["choices"][0]["delta"] if ev.get("choices") else {}
            if delta.get("content") or delta.get("reasoning_content"):
                stamps.append(time.perf_counter())  # one chunk per released token
    ttft = stamps[0] - t0 if stamps else float("nan")
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return ttft, gaps, n_tokens


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def load(s: ServerProcess, a) -> None:
    t = time.perf_counter()
    _, _, n1 = one_stream(s.base, 0, a.max_tokens)
    single_tps = n1 / (time.perf_counter() - t)
    jobs = list(range(1, a.clients * a.requests + 1))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.clients) as pool:
        res = list(pool.map(lambda i: one_stream(s.base, i, a.max_tokens), jobs))
    wall = time.perf_counter() - t0
    ttfts = [r[0] for r in res]
    gaps = [x for r in res for x in r[1]]
    toks = sum(r[2] for r in res)
    print(f"requests/s {len(jobs) / wall:.2f}   aggregate {toks / wall:.0f} tok/s over "
          f"{a.clients} clients (single stream {single_tps:.0f} tok/s)   {toks} tokens "
          f"in {wall:.1f} s")
    print(f"TTFT p50 {pct(ttfts, 50) * 1e3:.1f} ms  p99 {pct(ttfts, 99) * 1e3:.1f} ms   "
          f"inter-token p50 {pct(gaps, 50) * 1e3:.2f} ms  p99 {pct(gaps, 99) * 1e3:.2f} ms")


def soak(s: ServerProcess, a) -> None:
    stop = threading.Event()
    done = [0, 0]  # requests, tokens
    lock = threading.Lock()

    def client(c: int) -> None:
        i = c
        while not stop.is_set():
            _, _, n = one_stream(s.base, i, a.max_tokens)
            with lock:
                done[0] += 1
                done[1] += n
            i += a.clients

    samples = [(0.0, rss_kib(s.proc.pid))]
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,), daemon=True)
               for c in range(a.clients)]
    for t in threads:
        t.start()
    while (el := time.monotonic() - t0) < a.soak_seconds:
        time.sleep(min(a.rss_every, a.soak_seconds - el))
        samples.append((time.monotonic() - t0, rss_kib(s.proc.pid)))
        print(f"  t={samples[-1][0]:6.0f} s  RSS {samples[-1][1] / 1024:7.1f} MiB  "
              f"requests {done[0]}  tokens {done[1]}", flush=True)
    stop.set()
    for t in threads:
        t.join()
    first_loaded = samples[1][1] if len(samples) > 1 else samples[0][1]
    print(f"soak {a.soak_seconds:.0f} s: {done[0]} requests, {done[1]} tokens; RSS before "
          f"load {samples[0][1] / 1024:.1f} MiB, after the first {samples[1][0]:.0f} s "
          f"{first_loaded / 1024:.1f} MiB, end {samples[-1][1] / 1024:.1f} MiB, max "
          f"{max(r for _, r in samples) / 1024:.1f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=DEMO)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4, help="per client (load mode)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, help="server core threads")
    ap.add_argument("--cache-bytes", type=int,
                    help="server prefix-cache budget (default the server's, 1 GiB); the "
                         "cache fills up to it, so RSS grows until then")
    ap.add_argument("--soak-seconds", type=float, default=0,
                    help="run the soak for this long instead of the load test")
    ap.add_argument("--rss-every", type=float, default=30.0)
    a = ap.parse_args()
    extra = ["--threads", str(a.threads)] if a.threads else []
    if a.cache_bytes:
        extra += ["--cache-bytes", str(a.cache_bytes)]
    s = ServerProcess("--parallel", str(a.parallel), *extra, model=a.model, api_key=None,
                      test_hooks=False)
    try:
        s.wait_ready()
        rss0 = rss_kib(s.proc.pid)
        print(f"model {os.path.basename(a.model)}  parallel {a.parallel}  clients {a.clients}"
              f"  max_tokens {a.max_tokens}  cpus {os.cpu_count()}")
        if a.soak_seconds > 0:
            soak(s, a)
        else:
            load(s, a)
        print(f"server RSS start {rss0 / 1024:.1f} MiB  end {rss_kib(s.proc.pid) / 1024:.1f} MiB")
        print("metrics: " + " ".join(
            ln for ln in httpx.get(s.base + "/metrics").text.splitlines()
            if ln.startswith(("ds4py_generated_tokens_total", "ds4py_requests_total"))))
    finally:
        s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
