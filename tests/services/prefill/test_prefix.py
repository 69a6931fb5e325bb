"""A prefix load that fails must stop the request from computing on blocks that never came,
however the failure and the engine's layers interleave."""

from __future__ import annotations

import asyncio

from services.prefill.prefix import PrefixLoad, PrefixLoader
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.runner import SeqChunk
from shared.engine.sampling_params import SamplingParams
from shared.kv_inbox import KVInbox


async def test_a_load_that_failed_before_a_layer_computes_still_invalidates_it(
    tiny_llama_dir,
) -> None:
    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", block_size=4, num_blocks=16)
    )
    engine.add_request("r", list(range(3, 20)), SamplingParams(max_tokens=1))
    inbox = KVInbox(engine.kv_storage, asyncio.get_running_loop())
    loader = PrefixLoader(engine_loop=None, pool=None, peers=None, inbox=inbox, layer_timeout=5.0)
    expected = inbox.expect("r:prefix", [0, 1], num_layers=2, ttl=60)
    inbox.on_frame("r:prefix", 0, (), True, "")  # layer 0 landed, then the line died
    loader.loads["r"] = load = PrefixLoad("r", 0, [11, 12], "kvstore", [expected])
    settling = asyncio.ensure_future(loader._settle(load))
    inbox.on_lost(["r:prefix"], "connection reset")
    await settling  # settled before layer 1's gate runs
    chunk = SeqChunk("r", list(range(8, 20)), 8, [0, 1, 2, 3, 4])
    loader.gate(engine, 1, [chunk])
    loader.forget("r")
    (out,) = engine.step()
    assert out.finish_reason == "error" and "loading the prefix failed" in out.stop_reason
    assert not loader.loads


async def test_a_load_measures_its_bytes_and_time_once_every_layer_landed() -> None:
    import time

    from services.prefill.prefix import PrefixLoad

    class NoStorage:
        block_size = 16

    inbox = KVInbox(NoStorage(), asyncio.get_running_loop())  # type: ignore[arg-type]
    expected = inbox.expect("r:prefix", [0, 1], num_layers=2, ttl=60)
    load = PrefixLoad("r", 0, [11, 12], "kvstore", [expected], nbytes=4096, began=time.monotonic())
    inbox.on_frame("r:prefix", 0, (), True, "")
    assert load.measured() == (0, 0.0)  # layer 1 still to come
    inbox.on_frame("r:prefix", 1, (), True, "")
    nbytes, seconds = load.measured()
    assert nbytes == 4096 and 0.0 < seconds < 10.0
    load.failed = True
    assert load.measured() == (0, 0.0)
