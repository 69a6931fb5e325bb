"""Keeps a stack's children running: one that exits is started again after a backoff.

A thread of its own looks at every child each `poll_interval`. An exit is reported
("decode-0 exited with code -9 (SIGKILL); restarting in 1s (restart 1)"), the child is
restarted with the same command line once its backoff has passed (`restarts.py` decides
how long, and when to give up), and the restart is counted in `UpMetrics`. The rest keep
serving. A child that keeps dying makes the supervisor give up: `failure` says which one
and shows the end of its log, and nothing is restarted any more.

Every pass runs under the stack's lock, and `hold()` (called under it) ends restarts, so
a stop never races a restart. The thread must outlive the children it restarted (they
get SIGTERM when the thread that started them ends): `close()` it after they stopped.
"""

from __future__ import annotations

import collections
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from services.stack.logs import append_marker, tail
from services.stack.metrics import UpMetrics
from services.stack.restarts import RestartHistory, RestartPolicy
from shared.errors import KvstackError


class Child(Protocol):
    name: str
    log_path: Path

    def poll(self) -> int | None:
        """None while it runs, else its exit code."""

    def restart(self) -> None:
        """Start it again as it was started (it has exited)."""


class Supervisor:
    def __init__(
        self,
        policy: RestartPolicy,
        children: Callable[[], list[Child]],
        lock: threading.RLock,
        metrics: UpMetrics,
        say: Callable[[str], None],
    ) -> None:
        self.policy = policy
        self.children = children
        self.lock = lock
        self.metrics = metrics
        self.say = say
        self.failure: KvstackError | None = None
        self.restarts: collections.Counter[str] = collections.Counter()
        self._histories: dict[str, RestartHistory] = {}
        self._due: dict[str, float] = {}  # child -> when its restart is due (monotonic)
        self._held = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvstack-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def hold(self) -> None:
        """No restart from now on (the stack is stopping); call with the lock held."""
        self._held = True

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._closed.wait(self.policy.poll_interval):
            with self.lock:
                try:
                    self._pass(time.monotonic())
                except Exception as e:
                    self._give_up(KvstackError(f"the supervisor failed: {e!r}"))

    def _pass(self, now: float) -> None:
        if self._held:
            return
        children = self.children()
        for child in children:
            self._watch(child, now)
            if self._held:
                return
        self.metrics.children_up.set(sum(child.poll() is None for child in children))

    def _watch(self, child: Child, now: float) -> None:
        history = self._histories.setdefault(child.name, RestartHistory(self.policy, now))
        if child.name in self._due:
            if now >= self._due[child.name]:
                self._restart(child, history, now)
            return
        code = child.poll()
        if code is None:
            return
        delay = history.exited(now)
        if delay is None:
            self._give_up(
                KvstackError(
                    f"{child.name} keeps dying ({self.policy.max_restarts} restarts within "
                    f"{self.policy.window:g}s, last exit {describe_exit(code)})\n"
                    f"its log ({child.log_path}) ends with:\n{tail(child.log_path)}"
                )
            )
            return
        self.say(
            f"{child.name} exited with {describe_exit(code)}; restarting in {delay:g}s "
            f"(restart {self.restarts[child.name] + 1})"
        )
        self._due[child.name] = now + delay

    def _restart(self, child: Child, history: RestartHistory, now: float) -> None:
        del self._due[child.name]
        number = self.restarts[child.name] + 1
        append_marker(
            child.log_path, f"restarted at {time.strftime('%Y-%m-%d %H:%M:%S')} (restart {number})"
        )
        history.started(now)
        try:
            child.restart()
        except (KvstackError, OSError) as e:  # seen as its next exit on the next pass
            self.say(f"{child.name} did not restart: {e}")
        # NOTE: counted once started, so a count that went up means it runs again.
        self.restarts[child.name] = number
        self.metrics.restarts.labels(child.name).inc()

    def _give_up(self, failure: KvstackError) -> None:
        self._held = True
        self.failure = failure
        self.say(f"giving up: {str(failure).splitlines()[0]}")


def describe_exit(code: int) -> str:
    """`code -9 (SIGKILL)` for a signal, `code 1` otherwise."""
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"
