"""The one thread an engine is built on and then steps on.

NOTE: why one thread for both: libgomp (torch's OpenMP) lets a team's threads spin between
parallel loops only while the process's teams hold no more threads than it has CPUs; past
that each loop waits for its threads to wake from a futex. A team lives as long as the thread
that started it, so a model loaded on one thread (weight conversion runs torch's parallel
loops there) and stepped on another kept two teams: prefill on 2 cores at ~60% of its speed
(`python -m bench engine-thread`; docs/notes/2026-11-26-amx-xeon.md, "Built where it steps").
Built and stepped on this thread, the process has one team, as on the main thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class EngineThread:
    """A daemon thread that runs jobs in the order they come (a stuck job never holds up
    the interpreter's exit, unlike an executor's thread)."""

    def __init__(self, name: str = "engine") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on this thread, awaited from the event loop."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def close(self, timeout: float) -> None:
        """End after the jobs already submitted; wait up to `timeout` seconds for them."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # delivered to whoever waits on the future
                future.set_exception(e)
