"""ds4py-server against its own OpenAPI schema with schemathesis: requests
generated from the schema (valid ones and, in negative mode, ones that break it)
are sent to a real server process on loopback. Whatever they hold, the answer is
never a 5xx and the server stays up.

Bounded: ``EXAMPLES_PER_OPERATION`` cases per operation (12 operations, a few
hundred requests); the server runs with a small context (``--ctx 256``) so a
generated ``max_tokens`` of two billion still ends within 256 tokens.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.server.proc import ServerProcess

EXAMPLES_PER_OPERATION = 25
# A generated request may generate up to 256 tokens with top-20 logprobs on a
# 2-core machine shared with other tests: seconds, far below this.
REQUEST_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server():
    # No test hooks: a generated ds4py_pause_after would hold a slot forever.
    s = ServerProcess("--parallel", "2", "--ctx", "256", test_hooks=False)
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def schema(server):
    r = httpx.get(server.base + "/openapi.json", headers=server.headers())
    assert r.status_code == 200, r.text
    return schemathesis.openapi.from_dict(r.json())


def _operations():
    # the labels, known without a running server (the schema is the app's, not the model's)
    from ds4py.server.app import ServerConfig, create_app

    spec = create_app(ServerConfig(model_path="unused")).openapi()
    return [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]


@pytest.mark.parametrize(("method", "path"), _operations(),
                         ids=[f"{m} {p}" for m, p in _operations()])
def test_schema_generated_requests_never_5xx(server, schema, method, path):
    op = schema[path][method]
    cases = st.tuples(st.one_of(op.as_strategy(GenerationMode.POSITIVE),
                                op.as_strategy(GenerationMode.NEGATIVE)), st.booleans())
    seen: list[int] = []

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(drawn=cases)
    def check(drawn):
        case, keep_model = drawn
        # The schema cannot know the served model's name: a generated one is a 404
        # before anything else runs, so half the cases go without it.
        if not keep_model and isinstance(case.body, dict):
            case.body.pop("model", None)
        r = case.call(base_url=server.base, headers=server.headers(),
                      timeout=REQUEST_TIMEOUT_S)
        seen.append(r.status_code)
        assert r.status_code < 500, (case.method, case.path, case.body, case.query,
                                     r.status_code, r.text[:500])
        assert server.alive(), server.output()

    check()
    print(f"{method} {path}: status counts {sorted(Counter(seen).items())}")
    assert seen, "schemathesis generated no request"
    assert server.alive(), server.output()
    assert httpx.get(server.base + "/health").status_code == 200
