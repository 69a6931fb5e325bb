"""The engine thread: jobs in order on one thread, errors to the caller, and an engine built
there is stepped there (where libgomp keeps one team: shared/engine/engine_thread.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.engine_thread import EngineThread
from shared.engine.loop import EngineLoop
from shared.sampling_params import SamplingParams


def test_jobs_run_in_order_on_one_thread_and_errors_reach_the_caller() -> None:
    thread = EngineThread(name="test-engine")
    try:
        seen: list[tuple[int, int]] = []
        futures = [
            thread.submit(lambda i=i: seen.append((i, threading.get_ident()))) for i in range(5)
        ]
        for future in futures:
            future.result(timeout=10)
        assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
        idents = {ident for _, ident in seen}
        assert len(idents) == 1 and threading.get_ident() not in idents
        with pytest.raises(ZeroDivisionError):
            thread.submit(lambda: 1 / 0).result(timeout=10)
        assert thread.submit(lambda: "still serving").result(timeout=10) == "still serving"
    finally:
        thread.close(timeout=10)


def test_an_engine_loop_steps_on_the_thread_its_engine_was_built_on(tiny_llama_dir) -> None:
    async def main() -> tuple[int, set[int], list]:
        thread = EngineThread()
        config = EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_threads=1)
        built = await thread.run(lambda: (LLMEngine(config), threading.get_ident()))
        engine, built_on = built
        stepped_on: set[int] = set()
        outputs: list = []
        done = asyncio.Event()

        def step(e):
            stepped_on.add(threading.get_ident())
            return e.step()

        def on_outputs(outs) -> None:
            outputs.extend(outs)
            if any(out.finished for out in outs):
                done.set()

        loop = EngineLoop(engine, asyncio.get_running_loop(), on_outputs, step, thread)
        loop.start()
        params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        await loop.call(lambda e: e.add_request("r", [1, 2, 3, 4], params))
        await asyncio.wait_for(done.wait(), 60)
        loop.stop()
        return built_on, stepped_on, outputs

    built_on, stepped_on, outputs = asyncio.run(main())
    assert stepped_on == {built_on}
    assert sum(len(out.new_token_ids) for out in outputs) == 4


class BrokenEngine:
    """An engine whose own bookkeeping raises: the loop itself ends, not a step."""

    @property
    def has_unfinished(self) -> bool:
        raise RuntimeError("scheduler state corrupted")


def test_a_loop_that_ends_by_an_exception_is_logged(caplog) -> None:
    async def main() -> None:
        loop = EngineLoop(BrokenEngine(), asyncio.get_running_loop(), lambda outputs: None)
        loop.start()
        deadline = asyncio.get_running_loop().time() + 10
        while "engine thread's loop ended" not in caplog.text:
            assert asyncio.get_running_loop().time() < deadline, "the failure was not logged"
            await asyncio.sleep(0.01)
        loop.stop()

    with caplog.at_level("ERROR", logger="kvstack.engine"):
        asyncio.run(main())
    assert "scheduler state corrupted" in caplog.text
