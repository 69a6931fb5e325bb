"""Child processes that run in a session of their own, die with their parent, and are
signalled as a whole process group (`kvstack up`'s services and its nats-server)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _load_prctl():
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # not Linux: no parent-death signal
        return None


# NOTE: resolved here, not in the child: between fork and exec the child must not load
# libraries (another thread of the parent may have held the loader's lock at the fork).
_PRCTL = _load_prctl()


def die_with_parent() -> None:
    """In the child (preexec_fn): SIGTERM when the parent dies, so no child outlives it.

    The kernel's "parent" is the thread that started the child: a child started by a
    helper thread gets the signal when that thread ends, so such threads must outlive it.
    """
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_in_own_session(
    argv: list[str], log, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start `argv` with stdout and stderr into `log`, out of reach of the terminal's Ctrl-C."""
    return subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


def signal_group(popen: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the child's process group (itself and whatever it started)."""
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def kill_group(popen: subprocess.Popen) -> None:
    """SIGKILL the child's group, and SIGCONT it: a stopped process (SIGSTOP, a debugger)
    dies of SIGKILL too, but one whose stop outlives us would hold its ports until then."""
    signal_group(popen, signal.SIGKILL)
    signal_group(popen, signal.SIGCONT)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, by their pids (Linux's
    /proc; elsewhere the group's leader alone, if a signal reaches it)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    return [pid for pid in _pids(proc) if _group_and_state(proc / str(pid)) == (pgid, True)]


def _pids(proc: Path) -> list[int]:
    return [int(entry.name) for entry in proc.iterdir() if entry.name.isdigit()]


def _group_and_state(entry: Path) -> tuple[int, bool] | None:
    """A process's group id and whether it is alive (not a zombie); None once it is gone."""
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    # NOTE: the command name (field 2) may hold spaces and parentheses: split after it.
    state, _ppid, pgrp = stat.rpartition(")")[2].split()[:3]
    return int(pgrp), state not in ("Z", "X")
