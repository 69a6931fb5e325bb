"""The stack's child processes: how one starts and restarts, and how they stop in order."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shared.runtime.child_process import (
    group_members,
    kill_group,
    signal_group,
    start_in_own_session,
)

# Stopped one tier after the other: first the gateway (it drains the requests in flight),
# then the workers (they finish what they hold and deregister), then the attention
# workers their decode workers used; kvstore, conductor and anything else last.
STOP_TIERS = (("gateway",), ("prefill", "decode"), ("attention-worker",))


@dataclass
class Process:
    """One `kvstack <args>` child in a session of its own; a restart replaces `popen`."""

    name: str
    args: list[str]  # after `kvstack`: the service first
    popen: subprocess.Popen
    log_path: Path
    env: dict[str, str] = field(default_factory=dict, repr=False)
    swept_pid: int = field(default=0, repr=False)  # whose group was killed after it ended

    @classmethod
    def launch(cls, name: str, args: list[str], env: dict[str, str], log_path: Path) -> Process:
        return cls(name, list(args), _popen(args, env, log_path), log_path, env)

    @property
    def service(self) -> str:
        return self.args[0]

    def poll(self) -> int | None:
        """None while it runs, else its exit code; the first time, whatever it started
        that outlived it is killed too."""
        popen = self.popen  # a restart (another thread) may replace it meanwhile
        code = popen.poll()
        if code is not None and self.swept_pid != popen.pid:
            # NOTE: right after reaping it: later, its pid (the group's id) may be reused.
            self.swept_pid = popen.pid
            signal_group(popen, signal.SIGKILL)
        return code

    def restart(self) -> None:
        self.poll()
        self.popen = _popen(self.args, self.env, self.log_path)

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            signal_group(self.popen, sig)


def _popen(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return start_in_own_session([sys.executable, "-m", "services.cli.main", *args], log, env)


def stop_tiers(processes: Sequence[Process]) -> list[list[Process]]:
    """`processes` in the groups they stop in, first group first (see STOP_TIERS)."""
    tiers: list[list[Process]] = [[] for _ in range(len(STOP_TIERS) + 1)]
    for process in processes:
        tiers[_tier(process.service)].append(process)
    return [tier for tier in tiers if tier]


def _tier(service: str) -> int:
    return next((i for i, tier in enumerate(STOP_TIERS) if service in tier), len(STOP_TIERS))


def terminate(processes: Sequence[Process], timeout: float) -> None:
    """SIGTERM each, wait up to `timeout` for all of them, kill what is left (stopped ones
    too: see `kill_group`)."""
    for process in processes:
        process.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(process.popen)
            process.popen.wait()
        process.poll()


def sweep(processes: Sequence[Process], timeout: float = 5.0) -> list[str]:
    """Kill whatever is left of each child's process group and wait up to `timeout` for
    it to go; returns what remains ("name (pids ...)"), empty when every group is gone."""
    left = [p for p in processes if group_members(p.popen.pid)]
    for process in left:
        kill_group(process.popen)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if group_members(p.popen.pid)]
    return [f"{p.name} (pids {', '.join(map(str, group_members(p.popen.pid)))})" for p in left]
