"""A prefix load that fails must stop the request from computing on blocks that never came,
however the failure and the engine's layers interleave."""

from __future__ import annotations

import asyncio

from services.prefill.prefix import PrefixLoad, PrefixLoader
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.runner import SeqChunk
from shared.sampling_params import SamplingParams
from shared.transfer.inbox import KVInbox


def engine_with_a_prompt(model_dir) -> tuple[LLMEngine, KVInbox]:
    """A tiny engine holding prompt "r" (17 tokens, blocks of 4), and its KV inbox."""
    engine = LLMEngine(
        EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_blocks=16)
    )
    engine.add_request("r", list(range(3, 20)), SamplingParams(max_tokens=1))
    return engine, KVInbox(engine.kv_storage, asyncio.get_running_loop())


async def test_a_load_that_failed_before_a_layer_computes_still_invalidates_it(
    tiny_llama_dir,
) -> None:
    engine, inbox = engine_with_a_prompt(tiny_llama_dir)
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
        mirrored = False  # no GPU to copy landed spans to

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


async def test_a_load_past_its_deadline_invalidates_the_request_as_stalled(
    tiny_llama_dir,
) -> None:
    import time

    engine, inbox = engine_with_a_prompt(tiny_llama_dir)
    loader = PrefixLoader(engine_loop=None, pool=None, peers=None, inbox=inbox, layer_timeout=30)
    expected = inbox.expect("r:prefix", [0, 1], num_layers=2, ttl=60)  # nothing will land
    load = PrefixLoad("r", 0, [11, 12], "kvstore", [expected], began=time.monotonic())
    load.deadline = load.began + 0.2
    loader.loads["r"] = load
    chunk = SeqChunk("r", list(range(8, 20)), 8, [0, 1, 2, 3, 4])
    started = time.monotonic()
    await asyncio.to_thread(loader.gate, engine, 0, [chunk])
    assert time.monotonic() - started < 10  # the deadline's 0.2 s, not the 30 s layer timeout
    assert load.failed and loader.stalled == 1
    loader.forget("r")
    (out,) = engine.step()
    assert out.finish_reason == "error" and "stalled past 0.200s" in out.stop_reason


def test_a_prefix_is_computed_where_the_measured_rates_say_computing_the_prompt_is_faster() -> None:
    from types import SimpleNamespace

    from shared.kvblocks import BlockLayout
    from shared.prefill.prefix import PrefixPlan
    from shared.prefill.worth import Rates

    layout = BlockLayout(num_layers=30, block_size=16, half_bytes=16 * 3 * 64 * 4)
    loader = PrefixLoader(None, SimpleNamespace(layout=layout), None, None)
    plan = PrefixPlan(0, 10, "kvstore")  # 160 tokens, 10 blocks of KV, of a 200-token prompt
    assert loader._worth_loading(plan, 200)  # nothing measured yet: load, and measure
    nbytes = 10 * layout.block_bytes
    # computing the whole prompt (it overlaps the load) takes 0.1 s
    loader.rates = Rates(load_bytes_per_s=nbytes / 0.15, prefill_tokens_per_s=200 / 0.1)
    assert not loader._worth_loading(plan, 200) and loader.declined == 1
    loader.rates = Rates(load_bytes_per_s=nbytes / 0.09, prefill_tokens_per_s=200 / 0.1)
    assert loader._worth_loading(plan, 200)  # slower than its 160 tokens, not than all 200
