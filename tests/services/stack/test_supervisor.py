"""The supervisor's thread with children that are not processes: what it restarts, counts,
says, and when it gives up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from services.stack.metrics import UpMetrics
from services.stack.restarts import RestartPolicy
from services.stack.supervisor import Supervisor

FAST = RestartPolicy(
    first_backoff=0.01, max_backoff=0.02, max_restarts=3, window=60, poll_interval=0.01
)


class FakeChild:
    def __init__(self, name: str, log_path: Path, exits_after_restart: bool) -> None:
        self.name, self.log_path = name, log_path
        self.exit_code: int | None = None
        self.exits_after_restart = exits_after_restart
        self.starts = 1

    def poll(self) -> int | None:
        return self.exit_code

    def restart(self) -> None:
        self.starts += 1
        self.exit_code = 1 if self.exits_after_restart else None


def supervise(children: list[FakeChild], said: list[str]) -> Supervisor:
    supervisor = Supervisor(FAST, lambda: children, threading.RLock(), UpMetrics(), said.append)
    supervisor.start()
    return supervisor


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_child_that_exits_is_restarted_counted_and_marked_in_its_log(tmp_path) -> None:
    child = FakeChild("decode-0", tmp_path / "decode-0.log", exits_after_restart=False)
    said: list[str] = []
    supervisor = supervise([child], said)
    child.exit_code = -9
    wait_for(lambda: child.starts == 2)
    supervisor.close()
    assert supervisor.restarts["decode-0"] == 1 and supervisor.failure is None
    assert said == ["decode-0 exited with code -9 (SIGKILL); restarting in 0.01s (restart 1)"]
    assert "(restart 1) ---" in child.log_path.read_text()
    metrics = supervisor.metrics
    assert metrics.restarts.labels("decode-0")._value.get() == 1
    assert metrics.children_up._value.get() == 1


def test_a_child_that_keeps_dying_is_given_up_with_its_log_tail(tmp_path) -> None:
    child = FakeChild("kvstore-0", tmp_path / "kvstore-0.log", exits_after_restart=True)
    child.log_path.write_text("error: argument --dram-gib: invalid float value: 'lots'\n")
    healthy = FakeChild("conductor-0", tmp_path / "conductor-0.log", exits_after_restart=False)
    said: list[str] = []
    supervisor = supervise([child, healthy], said)
    child.exit_code = 2
    wait_for(lambda: supervisor.failure is not None)
    supervisor.close()
    assert child.starts == 1 + FAST.max_restarts and healthy.starts == 1
    message = str(supervisor.failure)
    assert message.startswith("kvstore-0 keeps dying (3 restarts within 60s, last exit code 1)")
    assert "invalid float value: 'lots'" in message
    assert said[-1].startswith("giving up: kvstore-0 keeps dying")


def test_a_held_supervisor_restarts_nothing(tmp_path) -> None:
    child = FakeChild("gateway-0", tmp_path / "gateway-0.log", exits_after_restart=False)
    supervisor = supervise([child], [])
    with supervisor.lock:
        supervisor.hold()
    child.exit_code = 0
    time.sleep(0.1)
    supervisor.close()
    assert child.starts == 1 and supervisor.restarts["gateway-0"] == 0
