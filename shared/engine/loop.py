"""Runs an engine in its own thread so that an asyncio service never blocks on the model.

The event loop sends work with `call(fn)` (run between steps, on the engine thread, its
result delivered as an awaitable); the thread steps the engine whenever it has work and
hands each step's outputs to `on_outputs` back on the event loop. The thread is the
`EngineThread` the engine was built on, when the service passes it (see engine_thread.py
for why), else one of its own.

A step that raises ends every request on the engine (a failure of one request alone ends
only that one, inside the engine's `step`). After BROKEN_AFTER such steps in a row the loop
is `broken`, and `on_broken` tells the service, which should stop taking work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from shared.engine.engine_thread import EngineThread
from shared.engine.interface import EngineInterface
from shared.engine.output import RequestOutput
from shared.engine.step_time import smoothed

log = logging.getLogger("kvstack.engine")

BROKEN_AFTER = 3  # engine-wide step failures in a row


class EngineLoop:
    def __init__(
        self,
        engine: EngineInterface,
        loop: asyncio.AbstractEventLoop,
        on_outputs: Callable[[list[RequestOutput]], None],
        step: Callable[[EngineInterface], list[RequestOutput]] | None = None,
        thread: EngineThread | None = None,
    ) -> None:
        self.engine = engine
        self.loop = loop
        self.on_outputs = on_outputs
        self._step = step or (lambda e: e.step())
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._running = False
        self._thread = thread or EngineThread()
        self.num_steps = 0
        self.step_seconds = 0.0
        # moving average of a step's seconds a token of a row (a burst of decode steps,
        # EngineConfig.decode_burst, gives several): the TBT this worker gives now
        self.mean_step_seconds = 0.0
        self.on_step: Callable[[float], None] | None = None  # e.g. a histogram's observe
        self.num_failed_steps = 0  # engine-wide step failures since the last good step
        # Called on the event loop, once each time the loop becomes broken, with the reason.
        self.on_broken: Callable[[str], None] | None = None

    @property
    def broken(self) -> bool:
        return self.num_failed_steps >= BROKEN_AFTER

    def start(self) -> None:
        self._running = True
        self._thread.submit(self._main).add_done_callback(_log_if_failed)

    def stop(self) -> None:
        self._running = False
        self._wake.set()
        self._thread.close(timeout=30)

    def call(self, fn: Callable[[EngineInterface], Any]) -> asyncio.Future:
        """Run fn(engine) on the engine thread before its next step."""
        future = self.loop.create_future()
        self._calls.put((fn, future))
        self._wake.set()
        self.engine.end_burst()  # NOTE: a burst would keep it waiting a few steps more
        return future

    def _main(self) -> None:
        while self._running:
            self._run_calls()
            if not self.engine.has_unfinished:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            started = time.perf_counter()
            outputs = self._run_step()
            self.num_steps += 1
            self.step_seconds = time.perf_counter() - started
            per_token = self.step_seconds / tokens_a_row(outputs)
            self.mean_step_seconds = smoothed(self.mean_step_seconds, per_token)
            if self.on_step is not None:
                self.on_step(self.step_seconds)
            log.debug("step %d: %.1f ms", self.num_steps, self.step_seconds * 1000)
            if outputs:
                self.loop.call_soon_threadsafe(self.on_outputs, outputs)

    def _run_step(self) -> list[RequestOutput]:
        try:
            outputs = self._step(self.engine)
        except Exception as e:  # fail the step's requests loudly instead of retrying forever
            log.exception("engine step failed")
            message = f"engine step failed: {type(e).__name__}: {e}"
            self._count_failure(message)
            return self.engine.fail_all(message)
        self.num_failed_steps = 0
        return outputs

    def _count_failure(self, message: str) -> None:
        self.num_failed_steps += 1
        if self.num_failed_steps == BROKEN_AFTER and self.on_broken is not None:
            reason = f"{BROKEN_AFTER} engine steps failed in a row; the last: {message}"
            self.loop.call_soon_threadsafe(self.on_broken, reason)

    def _run_calls(self) -> None:
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                result, error = fn(self.engine), None
            except Exception as e:  # delivered to the awaiting side, not swallowed
                result, error = None, e
            self.loop.call_soon_threadsafe(_settle, future, result, error)


def tokens_a_row(outputs: list[RequestOutput]) -> int:
    """The most tokens a step gave one request (a burst's steps; at least 1)."""
    return max((len(out.new_token_ids) for out in outputs), default=1) or 1


def _log_if_failed(done: concurrent.futures.Future) -> None:
    error = done.exception()
    if error is not None:  # the loop itself broke, not a step: nothing steps the engine now
        log.error("the engine thread's loop ended", exc_info=error)


def _settle(future: asyncio.Future, result: Any, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
