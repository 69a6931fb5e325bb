"""Owned background tasks: a failure is logged and ends what the task was doing."""

from __future__ import annotations

import asyncio
import logging

from shared.runtime.tasks import Tasks


async def test_a_failed_task_is_logged_and_its_owner_told(caplog) -> None:
    tasks, told = Tasks("owner-1"), []

    async def boom() -> None:
        raise ValueError("bad row")

    async def end_request(error: BaseException) -> None:
        told.append(str(error))

    with caplog.at_level(logging.ERROR, "kvstack.tasks"):
        tasks.spawn(boom(), "request r1", on_error=end_request)
        await asyncio.sleep(0.05)
    assert told == ["bad row"]
    assert "owner-1: request r1 failed: ValueError: bad row" in caplog.text
    assert len(tasks) == 0


async def test_a_task_that_ends_well_calls_nothing() -> None:
    tasks, told = Tasks("owner-2"), []

    async def fine() -> int:
        return 1

    await tasks.spawn(fine(), "fine", on_error=told.append)
    assert told == [] and len(tasks) == 0


async def test_a_failed_round_does_not_end_the_periodic_work(caplog) -> None:
    tasks, rounds = Tasks("owner-3"), []

    async def round_() -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("NATS hiccup")

    with caplog.at_level(logging.ERROR, "kvstack.tasks"):
        tasks.every(0.01, round_, "publishing events")
        await asyncio.sleep(0.2)
        tasks.cancel()
        await tasks.wait(1.0)
    assert len(rounds) >= 3 and "NATS hiccup" in caplog.text
    assert len(tasks) == 0
