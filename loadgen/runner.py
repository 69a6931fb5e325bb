"""Sends prompts on their schedule, at most `max_concurrency` at a time, and collects what
each request measured.

Ctrl-C (SIGINT) stops the run: nothing more is sent, requests in flight are cancelled (their
partial measurements are dropped: a cut stream says nothing about the server), and the
records of the finished ones are returned as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from loadgen.client import Target, send
from loadgen.datasets import Prompt
from loadgen.progress import Progress
from loadgen.records import RequestRecord

# As in `vllm bench serve`: a request may legitimately take a long time under load.
SESSION_TIMEOUT = aiohttp.ClientTimeout(total=6 * 3600)


@dataclass(frozen=True)
class RunOutcome:
    records: list[RequestRecord]  # the finished requests, in dataset order
    duration: float  # first send to the last finish (or the interruption)
    interrupted: bool = False
    num_cancelled: int = 0  # in flight when interrupted
    num_unsent: int = 0  # never sent because of the interruption


class Runner:
    def __init__(
        self, target: Target, max_concurrency: int | None = None, progress: Progress | None = None
    ) -> None:
        self.target = target
        self.max_concurrency = max_concurrency
        self.slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.progress = progress
        self.stop = asyncio.Event()
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.num_sent = 0
        self.start = 0.0

    async def run(self, prompts: Sequence[Prompt], arrivals: Sequence[float]) -> RunOutcome:
        """`arrivals[i]`: when prompts[i] is due, in seconds after the start."""
        connector = aiohttp.TCPConnector(limit=self.max_concurrency or 0)
        async with aiohttp.ClientSession(connector=connector, timeout=SESSION_TIMEOUT) as session:
            with stop_on_sigint(self.stop):
                self.start = time.perf_counter()
                await self._dispatch(session, prompts, arrivals)
                await self._drain()
                duration = time.perf_counter() - self.start
                cancelled = await self._cancel_in_flight()
        records = sorted(self.records, key=lambda r: r.index)
        return RunOutcome(
            records, duration, self.stop.is_set(), cancelled, len(prompts) - self.num_sent
        )

    async def _dispatch(
        self, session: aiohttp.ClientSession, prompts: Sequence[Prompt], arrivals: Sequence[float]
    ) -> None:
        for prompt, arrival in zip(prompts, arrivals):
            delay = self.start + arrival - time.perf_counter()
            if self.stop.is_set() or (delay > 0 and await self._stopped_within(delay)):
                return
            self.num_sent += 1
            task = asyncio.create_task(self._one(session, prompt))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _one(self, session: aiohttp.ClientSession, prompt: Prompt) -> None:
        queued = time.perf_counter()
        async with self.slots or contextlib.nullcontext():
            record = await send(
                session, self.target, prompt, self.start, time.perf_counter() - queued
            )
        self.records.append(record)
        if self.progress is not None:
            self.progress.update(record.success)

    async def _drain(self) -> None:
        """Until every request sent has finished, or Ctrl-C."""
        stopped = asyncio.create_task(self.stop.wait())
        while self.tasks and not self.stop.is_set():
            await asyncio.wait({*self.tasks, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()

    async def _cancel_in_flight(self) -> int:
        pending = list(self.tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        # A task may have finished (its record kept) before its done-callback left the set.
        return sum(task.cancelled() for task in pending)


@contextlib.contextmanager
def stop_on_sigint(stop: asyncio.Event):
    """SIGINT sets `stop` while inside; outside a main thread nothing is installed."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (ValueError, RuntimeError, NotImplementedError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
