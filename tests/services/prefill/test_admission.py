"""The prefill worker's queue lets prompts into the engine in order, one at a time, each
when the engine can take it, and never loses its place to a prompt that left."""

from __future__ import annotations

import asyncio

import pytest

from services.prefill.admission import Admission
from shared.engine.stats import EngineStats
from shared.prefill.admission import LEAD_STEPS, engine_can_take


def test_the_engine_takes_a_prompt_while_what_it_has_left_fits_a_few_steps() -> None:
    lead = LEAD_STEPS * 2048
    assert engine_can_take(EngineStats(queued_tokens=0), 2048)
    assert engine_can_take(EngineStats(queued_tokens=lead - 1), 2048)
    assert not engine_can_take(EngineStats(queued_tokens=lead), 2048)


class Engine:
    """What the queue reads: tokens the engine has left to prefill."""

    def __init__(self, queued: int = 0) -> None:
        self.queued = queued

    def can_take(self) -> bool:
        return engine_can_take(EngineStats(queued_tokens=self.queued), 100 // LEAD_STEPS)


async def enter(admission: Admission, engine: Engine, rid: str, tokens: int, log: list) -> None:
    async with admission.turn(rid) as admitted:
        log.append((rid, admitted))
        if admitted:
            await asyncio.sleep(0.01)  # binding the prefix, adding to the engine
            engine.queued += tokens


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.005)


async def test_prompts_enter_in_order_each_when_the_engine_can_take_it() -> None:
    engine, log = Engine(), []
    admission = Admission(engine.can_take)
    tasks = [asyncio.create_task(enter(admission, engine, f"r{i}", 150, log)) for i in range(3)]
    await settle()
    assert log == [("r0", True)] and len(admission) == 2  # r0 filled the engine's step
    engine.queued = 50  # a step ran
    admission.wake()
    await settle()
    assert log == [("r0", True), ("r1", True)] and engine.queued == 200
    engine.queued = 0
    admission.wake()
    await asyncio.gather(*tasks)
    assert log[-1] == ("r2", True) and len(admission) == 0


async def test_one_prompt_enters_at_a_time_even_when_the_engine_looks_empty() -> None:
    """The engine's load counts a prompt only once it is added: the next waits for that."""
    engine, log = Engine(), []
    admission = Admission(engine.can_take)
    tasks = [asyncio.create_task(enter(admission, engine, f"r{i}", 10, log)) for i in range(3)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert log == [("r0", True)]  # r1 waits while r0 is being added, though 0 < 100
    await asyncio.gather(*tasks)
    assert [rid for rid, _ in log] == ["r0", "r1", "r2"] and engine.queued == 30


async def test_a_prompt_that_leaves_the_queue_is_told_and_the_next_moves_up() -> None:
    engine, log = Engine(queued=500), []
    admission = Admission(engine.can_take)
    tasks = [asyncio.create_task(enter(admission, engine, f"r{i}", 10, log)) for i in range(2)]
    await settle()
    assert admission.must_wait() and len(admission) == 2
    admission.leave("r0")
    await settle()
    assert log == [("r0", False)]
    engine.queued = 0
    admission.wake()
    await asyncio.gather(*tasks)
    assert log == [("r0", False), ("r1", True)] and len(admission) == 0


async def test_a_prompt_cancelled_as_it_was_let_in_does_not_hold_the_door() -> None:
    engine, log = Engine(queued=500), []
    admission = Admission(engine.can_take)
    first = asyncio.create_task(enter(admission, engine, "r0", 10, log))
    second = asyncio.create_task(enter(admission, engine, "r1", 10, log))
    await settle()
    engine.queued = 0
    admission.wake()  # r0 is let in; its task is cancelled before it runs again
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1.0)
    assert log == [("r1", True)]
