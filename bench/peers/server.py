"""One peer's OpenAI-compatible server as a child process: its port checked free first, ready
when it completes a one-token request, and always stopped with its whole process group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import KvstackError

READY_POLL_S = 1.0
STOP_GRACE_S = (30.0, 10.0)  # after SIGINT, then after SIGTERM; then SIGKILL


@dataclass(frozen=True)
class ServerSpec:
    name: str  # the table's column
    argv: tuple[str, ...]
    port: int
    model: str  # what requests name
    env: dict[str, str] = field(default_factory=dict)  # added to this process's
    extra_body: dict = field(default_factory=dict)  # request fields this server needs
    request_ids: bool = True  # takes loadgen's x-request-id
    ready_timeout_s: float = 900.0
    cwd: str | None = None
    api_key: str = ""  # its bearer key, if it wants one

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RunningServer:
    def __init__(self, spec: ServerSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        if not port_is_free(self.spec.port):
            raise KvstackError(f"{self.spec.name}: port {self.spec.port} is taken")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            # NOTE: its own session, so that Ctrl-C here reaches only us and we stop it
            # (and every process it started) ourselves.
            self.process = subprocess.Popen(
                self.spec.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.spec.env},
                cwd=self.spec.cwd,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while not self._answers():
            if self.process is None or self.process.poll() is not None:
                raise KvstackError(f"{self.spec.name} exited at start:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise KvstackError(f"{self.spec.name} not ready in {self.spec.ready_timeout_s} s")
            time.sleep(READY_POLL_S)

    def _answers(self) -> bool:
        """A one-token completion works. NOTE: not GET /v1/models: kvstack's gateway
        answers that while its workers are still loading."""
        body = {"model": self.spec.model, "prompt": "Hello", "max_tokens": 1}
        request = urllib.request.Request(
            f"{self.spec.base_url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self.spec.headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        for sig, grace in zip((signal.SIGINT, signal.SIGTERM), STOP_GRACE_S):
            _signal_group(process, sig)
            try:
                process.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
        _signal_group(process, signal.SIGKILL)  # what is left of its group
        process.wait()

    def log_tail(self, num_lines: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-num_lines:])


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        print(f"[bench peers] cannot signal {process.pid}: {e}", file=sys.stderr)
