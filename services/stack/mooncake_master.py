"""`mooncake_master`, the Mooncake Store's master, as a child process (`kvstack up
--kv-pool mooncake`, the tests, `python -m bench kvstore`).

The binary ships inside the `mooncake-transfer-engine` wheel. Its clients find one
another by P2P handshake, so no metadata service runs; eviction and leases are the
master's own options (`--mooncake-master-args`), replicas the clients' (`--mooncake-replicas`).
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from shared.errors import KvstackError
from shared.kvpool.mooncake_store import MISSING_HELP, available
from shared.runtime.child_process import signal_group, start_in_own_session

START_TIMEOUT = 20.0


def master_binary() -> Path:
    if not available():
        raise KvstackError(f"--kv-pool mooncake needs Mooncake Store: {MISSING_HELP}")
    import mooncake

    binary = Path(mooncake.__file__).parent / "mooncake_master"
    if not binary.is_file():
        raise KvstackError(f"the mooncake wheel has no mooncake_master ({binary})")
    return binary


@dataclass
class MooncakeMaster:
    process: subprocess.Popen
    address: str  # host:port of its RPC service

    def stop(self, timeout: float = 5.0) -> None:
        signal_group(self.process, 15)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            signal_group(self.process, 9)
            self.process.wait()


def start_master(log_path: Path, host: str = "127.0.0.1", extra_args: str = "") -> MooncakeMaster:
    """Start a master on free ports and wait until it accepts connections."""
    rpc_port, metrics_port = _free_port(host), _free_port(host)
    argv = [
        str(master_binary()),
        f"-rpc_address={host}",
        f"-rpc_port={rpc_port}",
        f"-metrics_port={metrics_port}",
        f"-metrics_host={host}",
        "-enable_http_metadata_server=false",
        *shlex.split(extra_args),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = start_in_own_session(argv, log)
    master = MooncakeMaster(process, f"{host}:{rpc_port}")
    try:
        _wait_listening(process, host, rpc_port, log_path)
    except KvstackError:
        master.stop()
        raise
    return master


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_listening(process: subprocess.Popen, host: str, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise KvstackError(f"mooncake_master exited ({process.returncode}); see {log_path}")
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise KvstackError(f"mooncake_master did not listen on {host}:{port}; see {log_path}")
