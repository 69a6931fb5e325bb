"""A stack's stop leaves no child behind: a stopped (SIGSTOP) child past its drain is
continued and killed, and whatever is left of a child's process group (a stopped
grandchild) is swept before the stack says it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.stack.process import Process, sweep, terminate
from shared.runtime.child_process import group_members, start_in_own_session

# A child that starts a grandchild in its own group, stops the grandchild and exits.
LEAVES_A_STOPPED_GRANDCHILD = """
import os, signal, subprocess, sys
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
os.kill(grandchild.pid, signal.SIGSTOP)
print(grandchild.pid, flush=True)
"""


def child(tmp_path: Path, code: str) -> Process:
    with open(tmp_path / "child.log", "ab") as log:
        popen = start_in_own_session([sys.executable, "-c", code], log)
    return Process("child-0", ["child"], popen, tmp_path / "child.log")


def wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline, f"{pid} never stopped"
        time.sleep(0.02)


def test_a_stopped_child_past_its_drain_is_continued_and_killed(tmp_path) -> None:
    process = child(tmp_path, "import time; time.sleep(120)")
    os.kill(process.popen.pid, signal.SIGSTOP)
    wait_stopped(process.popen.pid)
    began = time.monotonic()
    terminate([process], timeout=0.5)  # SIGTERM stays pending while it is stopped
    assert process.popen.returncode == -signal.SIGKILL
    assert time.monotonic() - began < 10
    assert group_members(process.popen.pid) == []


def test_a_stopped_grandchild_left_in_the_group_is_swept(tmp_path) -> None:
    popen = start_in_own_session(
        [sys.executable, "-c", LEAVES_A_STOPPED_GRANDCHILD], subprocess.PIPE
    )
    process = Process("child-0", ["child"], popen, tmp_path / "child.log")
    grandchild = int(popen.stdout.readline())
    popen.wait(timeout=30)
    wait_stopped(grandchild)
    assert group_members(popen.pid) == [grandchild]  # the leader is gone, its group is not
    try:
        assert sweep([process]) == []
        assert group_members(popen.pid) == []
    finally:
        if group_members(popen.pid):
            os.kill(grandchild, signal.SIGKILL)


def test_a_sweep_of_groups_already_gone_returns_at_once(tmp_path) -> None:
    process = child(tmp_path, "pass")
    process.popen.wait(timeout=30)
    began = time.monotonic()
    assert sweep([process]) == []
    assert time.monotonic() - began < 1
