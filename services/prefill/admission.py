"""The prefill worker's queue of accepted prompts in front of its engine.

Prompts enter the engine in the order they queued, one at a time, each once the engine
can take it (shared/prefill/admission.py: engine_can_take): the one let in binds its
prefix and enters the engine before the next is considered, so the engine's load the
decision reads is never stale by a prompt. The engine's steps wake the queue
(`wake`, from any thread through the event loop).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class Admission:
    def __init__(self, can_take: Callable[[], bool]) -> None:
        self._can_take = can_take
        self._waiting: OrderedDict[str, asyncio.Future[bool]] = OrderedDict()
        self._entering: str | None = None  # the prompt let in, not in the engine yet

    def __len__(self) -> int:
        return len(self._waiting)

    def must_wait(self) -> bool:
        """Whether a prompt queued now would wait (others are ahead, or the engine is full)."""
        return bool(self._waiting) or self._entering is not None or not self._can_take()

    @asynccontextmanager
    async def turn(self, request_id: str) -> AsyncIterator[bool]:
        """Wait for `request_id`'s turn; yields False when it left the queue instead
        (`leave`: aborted, failed). The block binds the prefix and adds the prompt to
        the engine; the next prompt is considered once it ends."""
        turn = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = turn
        self.wake()
        try:
            admitted = await turn
        except asyncio.CancelledError:
            self._waiting.pop(request_id, None)
            self._done(request_id)  # it may have been let in just before
            raise
        try:
            yield admitted
        finally:
            self._done(request_id)

    def leave(self, request_id: str) -> None:
        """`request_id` no longer waits (aborted or failed while queued)."""
        turn = self._waiting.pop(request_id, None)
        if turn is not None and not turn.done():
            turn.set_result(False)

    def wake(self) -> None:
        """Let the head in if the engine can take it (event loop only)."""
        while self._entering is None and self._waiting and self._can_take():
            request_id, turn = self._waiting.popitem(last=False)
            if not turn.done():  # else its waiter was cancelled
                self._entering = request_id
                turn.set_result(True)

    def _done(self, request_id: str) -> None:
        if self._entering == request_id:
            self._entering = None
            self.wake()
