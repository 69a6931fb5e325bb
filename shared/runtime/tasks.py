"""Background tasks with an owner.

A bare `asyncio.ensure_future` loses its exception until the task is garbage-collected, and
whatever the task was doing (usually one request) is never ended. Every task a service
starts goes through `Tasks.spawn`: its exception is logged at once and handed to
`on_error`, which ends the request with an error. Periodic work goes through
`Tasks.every`: one failed round is logged and the next round runs anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("kvstack.tasks")

OnError = Callable[[BaseException], Any]


class Tasks:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Awaitable, what: str, on_error: OnError | None = None) -> asyncio.Task:
        """Run `coro`; if it raises, log it as `what` and call `on_error(exception)` (which
        may return a coroutine: it runs as a task of its own)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, what, on_error))
        return task

    def every(self, seconds: float, round_: Callable[[], Awaitable], what: str) -> asyncio.Task:
        """Run `round_()` every `seconds` until cancelled; a failed round is logged."""

        async def forever() -> None:
            while True:
                await asyncio.sleep(seconds)
                try:
                    await round_()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: %s failed; trying again in %.1fs", self.owner, what, seconds)

        return self.spawn(forever(), what)

    async def wait(self, timeout: float) -> None:
        """Until every task ended, at most `timeout` seconds."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _done(self, task: asyncio.Task, what: str, on_error: OnError | None) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        log.error(
            "%s: %s failed: %s: %s", self.owner, what, type(error).__name__, error, exc_info=error
        )
        if on_error is None:
            return
        try:
            result = on_error(error)
        except Exception:
            log.exception("%s: ending %s after its failure failed too", self.owner, what)
            return
        if asyncio.iscoroutine(result):
            self.spawn(result, f"ending {what} after its failure")
