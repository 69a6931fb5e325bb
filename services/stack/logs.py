"""The stack's log files: one per child, the previous run's kept beside it as `name.log.1`."""

from __future__ import annotations

from pathlib import Path


def rotate(path: Path) -> None:
    """Move last run's `name.log` to `name.log.1` (replacing the one before), if any."""
    if path.exists():
        path.replace(path.with_name(path.name + ".1"))


def append_marker(path: Path, text: str) -> None:
    """A line that separates what a restarted child writes from what it wrote before."""
    with open(path, "a") as log:
        log.write(f"--- {text} ---\n")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
