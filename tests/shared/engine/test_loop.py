"""The engine thread: a failed step ends its requests; three in a row mark the loop broken."""

from __future__ import annotations

import asyncio
import time

from shared.engine.loop import BROKEN_AFTER, EngineLoop, tokens_a_row
from shared.engine.output import RequestOutput


class ScriptedEngine:
    """Steps that fail (False) or succeed (True) in the scripted order, then no work."""

    def __init__(self, script: list[bool]) -> None:
        self.script = list(script)
        self.failed_all: list[str] = []

    @property
    def has_unfinished(self) -> bool:
        return bool(self.script)

    def step(self) -> list:
        if not self.script.pop(0):
            raise RuntimeError("kernel fault")
        return []

    def fail_all(self, message: str) -> list:
        self.failed_all.append(message)
        return []


def run_script(script: list[bool]) -> tuple[EngineLoop, list[str], ScriptedEngine]:
    async def main() -> tuple[EngineLoop, list[str], ScriptedEngine]:
        engine, reasons = ScriptedEngine(script), []
        loop = EngineLoop(
            engine, asyncio.get_running_loop(), lambda outputs: None, step=lambda e: e.step()
        )
        loop.on_broken = reasons.append
        loop.start()
        while engine.has_unfinished:
            await asyncio.sleep(0.01)
        loop.stop()  # joins the thread: the last step is done
        await asyncio.sleep(0.01)  # its callbacks run
        return loop, reasons, engine

    return asyncio.run(main())


def test_three_failed_steps_in_a_row_break_the_loop_once() -> None:
    loop, reasons, engine = run_script([False, False, True, False, False, False, False])
    assert loop.broken and loop.num_failed_steps == 4
    assert len(engine.failed_all) == 6
    assert reasons == [
        (
            f"{BROKEN_AFTER} engine steps failed in a row; the last: engine step "
            f"failed: RuntimeError: kernel fault"
        )
    ]


def test_a_good_step_resets_the_count() -> None:
    loop, reasons, _ = run_script([False, False, True])
    assert not loop.broken and loop.num_failed_steps == 0 and reasons == []


class TimedEngine:
    """Steps of 20 ms each, every one giving a request `tokens` tokens (a burst's)."""

    def __init__(self, steps: int, tokens: int) -> None:
        self.left, self.tokens = steps, tokens

    @property
    def has_unfinished(self) -> bool:
        return self.left > 0

    def step(self) -> list[RequestOutput]:
        time.sleep(0.02)
        self.left -= 1
        return [RequestOutput("r", (7,) * self.tokens, "", None, False, None, None, 3, 0, 1)]


def mean_step_seconds(tokens: int) -> float:
    async def main() -> float:
        engine = TimedEngine(6, tokens)
        loop = EngineLoop(engine, asyncio.get_running_loop(), lambda outputs: None)
        loop.start()
        while engine.has_unfinished:
            await asyncio.sleep(0.01)
        loop.stop()
        return loop.mean_step_seconds

    return asyncio.run(main())


def test_the_tbt_a_loop_reports_is_a_steps_time_a_token_of_a_row() -> None:
    """A decode worker refuses work past its TBT SLO by mean_step_seconds: a step that gave
    each request 4 tokens (EngineConfig.decode_burst) took a quarter of its time a token."""
    assert mean_step_seconds(4) < mean_step_seconds(1) / 2
    outputs = [
        RequestOutput(r, t, "", None, False, None, None, 3, 0, 1)
        for r, t in (("a", (1, 2, 3)), ("b", ()))
    ]
    assert tokens_a_row(outputs) == 3 and tokens_a_row([]) == 1


def test_a_call_ends_a_burst_in_progress() -> None:
    """A request added through the loop waits for the engine's current step, not the rest of
    a burst of decode steps (EngineConfig.decode_burst)."""

    class Engine(TimedEngine):
        ended = 0

        def end_burst(self) -> None:
            self.ended += 1

    async def main() -> int:
        engine = Engine(0, 1)
        loop = EngineLoop(engine, asyncio.get_running_loop(), lambda outputs: None)
        loop.start()
        assert await loop.call(lambda e: "called") == "called"
        loop.stop()
        return engine.ended

    assert asyncio.run(main()) == 1
