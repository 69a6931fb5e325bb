"""bench peers waits for the machine to go quiet between servers (bench/peers/quiet.py),
here against a real process that keeps a core busy."""

from __future__ import annotations

import subprocess
import sys

from bench.peers.quiet import busy_cores, wait_for_quiet

SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"


def spinner(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=seconds)])


def test_it_waits_until_a_busy_process_has_ended() -> None:
    busy = spinner(2.0)
    try:
        assert wait_for_quiet(most_busy=0.5, timeout=30.0, interval=0.25)
        assert busy.poll() is not None  # quiet only once the spinner stopped
    finally:
        busy.kill()
        busy.wait()


def test_a_machine_that_stays_busy_times_out() -> None:
    busy = spinner(10.0)
    try:
        seen = busy_cores(0.5)
        assert seen is not None and seen >= 0.5  # one core's worth, at least
        assert not wait_for_quiet(most_busy=0.5, timeout=0.6, interval=0.25)
    finally:
        busy.kill()
        busy.wait()
