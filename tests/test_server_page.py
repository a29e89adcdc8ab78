"""The chat page (GET /) in a real browser: Debian's headless Chromium driven by
Playwright (no browser download: ``executable_path`` points at the system one).

Served model: the shipped demo model (the server's default, started without -m),
so the screenshot shows readable text. The tests type into the page and read
what it shows; the expected reply comes from ``ds4py.generate`` on the same
model, not from the server. Under CI (``CI=true``) a missing Chromium or
Playwright fails; elsewhere those tests skip and say why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import httpx
import pytest

import ds4py
from tests.server.proc import DEMO, ROOT, ServerProcess

IN_CI = os.environ.get("CI") == "true"
CHROMIUM = os.environ.get("DS4PY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = os.path.join(ROOT, "tests", "artifacts")
# Generous waits for a 2-core CI machine shared with other work; nothing asserts on time.
WAIT_MS = 60_000


def _need_browser():
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[test]')")
    if not os.path.isfile(CHROMIUM):
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    if missing:
        msg = "browser test needs " + " and ".join(missing)
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--parallel", "1", model=None, api_key=None)
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium refuses its sandbox.
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture()
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1000, "height": 760})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server.base + "/")
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def _send(page, text: str, temperature: float, max_tokens: int) -> None:
    page.fill("#temp", str(temperature))
    page.fill("#maxtok", str(max_tokens))
    page.fill("#input", text)
    page.press("#input", "Enter")


def _running(server) -> float:
    for line in httpx.get(server.base + "/metrics").text.splitlines():
        if line.startswith("ds4py_requests_running "):
            return float(line.split()[1])
    raise AssertionError("ds4py_requests_running missing from /metrics")


def test_page_streams_greedy_reply_with_reasoning_and_rate(page, server):
    question = "Return the sum of two numbers."
    want = ds4py.generate(ds4py.load(DEMO), [{"role": "user", "content": question}],
                          max_tokens=120, temperature=0)
    assert want.reasoning, "the demo model is expected to think first (a fixture assumption)"
    # Count how many times the reply's text changed while streaming: one update
    # per content delta proves the page renders the stream, not one final body.
    page.evaluate("""() => { window.__updates = 0; new MutationObserver(() => window.__updates++)
        .observe(document.getElementById('log'), {subtree: true, characterData: true,
                                                   childList: true}); }""")
    _send(page, question, 0, 120)
    page.wait_for_selector("#stats:has-text('tok/s')", timeout=WAIT_MS)
    assert re.fullmatch(r"\d+(\.\d+)? tok/s", page.text_content("#stats").strip())
    assert page.text_content(".msg.user") == question
    assert page.text_content(".msg.assistant .content") == want.content
    assert page.evaluate("window.__updates") > 10
    # reasoning: a <details> block, closed until clicked
    details = page.locator(".msg.assistant details.reasoning")
    assert details.count() == 1
    assert details.evaluate("d => d.open") is False
    assert not page.locator(".msg.assistant details.reasoning > div").is_visible()
    page.click(".msg.assistant details.reasoning summary")
    assert details.evaluate("d => d.open") is True
    assert page.text_content(".msg.assistant details.reasoning > div") == want.reasoning
    assert page.is_enabled("#send") and page.is_disabled("#stop")
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "server-page.png")
    page.screenshot(path=shot)
    print(f"\nscreenshot of the chat page: {shot}")
    assert os.path.getsize(shot) > 5000


def test_stop_button_cancels_a_long_reply_and_frees_the_slot(page, server):
    # Make this reply "long" for as long as the test needs: the page's request gets
    # the server's test hook added in flight, so the job holds its slot after three
    # tokens until the client goes away (no sleeps, no race with the model's EOS).
    def add_pause(route):
        body = json.loads(route.request.post_data)
        body["ds4py_pause_after"] = 3
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", add_pause)
    _send(page, "Write a long story.", 0.7, 4000)
    content = page.locator(".msg.assistant .content")
    # text is on the page while the request is still open: the reply streams
    page.wait_for_function(
        "() => document.querySelector('.msg.assistant').textContent.length > 0",
        timeout=WAIT_MS)
    assert page.is_enabled("#stop") and page.is_disabled("#send")
    assert _running(server) == 1
    page.click("#stop")
    page.wait_for_selector("#send:enabled", timeout=WAIT_MS)
    assert content.text_content().endswith("[stopped]")
    assert page.is_disabled("#stop")
    # the server noticed the disconnect: its only slot (--parallel 1) is free again,
    # so a next reply completes
    page.unroute("**/v1/chat/completions")
    _send(page, "Hi", 0, 8)
    page.wait_for_function(
        "() => document.querySelectorAll('.msg.assistant').length == 2 && "
        "!document.getElementById('send').disabled", timeout=WAIT_MS)
    # the scheduler releases a slot just after it sends the Done: poll briefly
    deadline = time.monotonic() + 30
    while _running(server) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(server) == 0
