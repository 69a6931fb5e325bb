"""What `kvstack profile` measures, on a small random model: real engine steps, a real
transfer over the TCP data plane."""

from __future__ import annotations

import pytest

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.errors import KvstackError
from shared.profiling import EngineProbe, Prompts, link_seconds


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_blocks=96))


def test_prompts_are_fresh_and_inside_the_vocabulary() -> None:
    prompts = Prompts(vocab_size=50)
    a, b = prompts.fresh(64), prompts.fresh(64)
    assert a != b and all(0 <= t < 50 for t in a + b)


def test_prefills_with_a_cached_prefix_really_hit_the_cache(engine) -> None:
    probe = EngineProbe(engine)
    assert probe.prefill(32, 0) > 0
    for _ in range(2):  # each run checks the count of cached tokens the engine reports
        assert probe.prefill(32, 128) > 0
    assert list(probe.prefixes) == [0, 128]


def test_an_evicted_prefix_is_computed_again(tiny_llama_dir) -> None:
    small = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_blocks=20))
    probe = EngineProbe(small)
    probe.prefill(16, 128)
    probe.decode_step(1, 16 * 18, steps=1)  # takes 19 of the 20 blocks: evicts the prefix
    assert probe.prefill(16, 128) > 0


def test_decode_steps_run_the_whole_batch_and_leave_the_engine_empty(engine) -> None:
    assert EngineProbe(engine).decode_step(4, 64, steps=3) > 0
    assert not engine.has_unfinished and engine.stats().free_blocks == engine.stats().total_blocks


def test_a_batch_larger_than_the_kv_cache_is_an_error(engine) -> None:
    with pytest.raises(KvstackError, match="cannot hold 8 x 400 tokens"):
        EngineProbe(engine).decode_step(8, 400)
    assert not engine.has_unfinished and engine.stats().free_blocks == engine.stats().total_blocks


def test_the_link_has_a_bandwidth_and_a_latency(engine) -> None:
    bandwidth, latency = link_seconds(engine.kv_storage, num_blocks=32, repeats=2)
    assert bandwidth > 1e6 and 0 <= latency < 1.0
