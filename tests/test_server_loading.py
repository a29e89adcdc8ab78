"""ds4py-server while the model loads (503, Retry-After) and once it is ready
(200), and the checks on its drafting / test-hook options. The loading state
is held open by the test hook --test-load-gate (loading waits for a file the
test creates), so nothing here depends on how fast a model loads."""

from __future__ import annotations

import httpx
import pytest

from ds4py.server.main import build_parser, config_from_args
from tests.server.proc import DEMO, DEMO_DFLASH, ServerProcess

TIMEOUT_S = 120  # bounds a hang, never a speed: generous for a loaded 2-core machine


def test_health_is_503_while_loading_then_200(tmp_path):
    gate = tmp_path / "gate"
    s = ServerProcess("--test-load-gate", str(gate))
    try:
        r = s.wait_listening()
        # the socket is open and the model is held back by the gate: loading
        assert r.status_code == 503, r.text
        assert r.json() == {"status": "loading"}
        assert r.headers["retry-after"] == "1"
        for path, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
                           ("/v1/messages",
                            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})):
            c = httpx.post(s.base + path, json=body, headers=s.headers(), timeout=TIMEOUT_S)
            assert c.status_code == 503, (path, c.text)
            assert c.headers["retry-after"] == "1"
            err = c.json()["error"]
            assert err["code"] == "model_loading" and err["type"] == "service_unavailable"
            assert "loading" in err["message"]
        m = httpx.get(s.base + "/v1/models", headers=s.headers(), timeout=TIMEOUT_S)
        assert m.status_code == 503 and m.json()["error"]["code"] == "model_loading"
        # still loading after those requests (they did not start anything)
        assert httpx.get(s.base + "/health").status_code == 503
        gate.touch()
        s.wait_ready(TIMEOUT_S)
        r = httpx.get(s.base + "/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        c = httpx.post(s.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                       headers=s.headers(), timeout=TIMEOUT_S)
        assert c.status_code == 200, c.text
        assert c.json()["usage"]["completion_tokens"] >= 1
    finally:
        s.stop()


def _config(*argv):
    return config_from_args(build_parser().parse_args(list(argv)))


def test_draft_options_reach_the_config():
    c = _config("-m", DEMO, "--dflash", DEMO_DFLASH, "--force-draft")
    assert (c.dflash, c.draft_head, c.force_draft, c.no_draft) == (DEMO_DFLASH, None, True, False)
    c = _config("-m", DEMO, "--no-draft")
    assert c.no_draft and not c.force_draft and c.dflash is None


@pytest.mark.parametrize("argv, message", [
    (("--draft-head", DEMO_DFLASH, "--dflash", DEMO_DFLASH), "draft with one"),
    (("--dflash", "/nonexistent/drafter.gguf"), "--dflash: no such file"),
    (("--draft-head", "/nonexistent/head.gguf"), "--draft-head: no such file"),
    (("--test-load-gate", "/tmp/x"), "needs --enable-test-hooks"),
])
def test_bad_options_are_refused_by_name(argv, message):
    with pytest.raises(SystemExit, match=message):
        _config("-m", DEMO, *argv)
