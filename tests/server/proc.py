"""Run ds4py-server as a real process on loopback for the server tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "tests", "golden", "models")
DENSE = os.path.join(MODELS, "dense-q8_0.gguf")
# The trained demo model shipped in the package: what ds4py-server serves without -m.
DEMO = os.path.join(ROOT, "ds4py", "models", "demo-q8_0.gguf")
# The DFlash drafter shipped next to it (its pairing is not in the table: REFUSE_UNKNOWN).
DEMO_DFLASH = os.path.join(ROOT, "ds4py", "models", "demo-dflash-q8_0.gguf")
API_KEY = "test-key"


def free_port(host: str = "127.0.0.1") -> int:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *args: str, model: str | None = DENSE, host: str = "127.0.0.1",
                 api_key: str | None = API_KEY, test_hooks: bool = True):
        """``model=None`` starts the server without -m (its default: the demo model)."""
        self.host, self.port = host, free_port(host)
        self.api_key = api_key
        cmd = [sys.executable, "-m", "ds4py.server", *(["-m", model] if model else []),
               "--host", host, "--port", str(self.port), *args]
        if test_hooks:
            cmd.append("--enable-test-hooks")
        if api_key:
            cmd += ["--api-key", api_key]
        # Output goes to a file, not a pipe: nobody drains a pipe while tests run,
        # and a server that logs more than the pipe holds would block on write.
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)

    def output(self) -> str:
        """Everything the server has printed so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    @property
    def base(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_listening(self, timeout: float = 60.0) -> httpx.Response:
        """The first answer to GET /health (whatever its status)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                return httpx.get(self.base + "/health", timeout=2)
            except httpx.TransportError:
                time.sleep(0.05)  # polling for start-up only; nothing asserts on time
        raise RuntimeError("server did not open its socket")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # polling for start-up only; nothing asserts on time
        raise RuntimeError("server did not become ready")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
