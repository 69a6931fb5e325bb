"""LLMEngine offers exactly EngineInterface, and the interface's KV and stats methods do
what its docstrings say."""

from __future__ import annotations

import pytest

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.interface import EngineInterface
from shared.engine.mock import MockSpec
from shared.engine.namespace import kv_namespace
from shared.engine.runner import ModelRunner
from shared.errors import KvstackError
from shared.hashing import block_hashes
from shared.sampling_params import SamplingParams

FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
PROMPT = list(range(10, 23))  # 13 tokens: three full blocks of 4


def public(names) -> set[str]:
    return {name for name in names if not name.startswith("_")}


@pytest.fixture
def engine(tiny_llama_dir) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", block_size=4, num_blocks=32)
    )


def test_the_engines_public_names_are_the_interfaces(engine) -> None:
    assert public(dir(LLMEngine)) == public(vars(EngineInterface))
    assert public(vars(engine)) == set()  # its state is all private


def test_info_holds_the_facts_services_read(engine, tiny_llama_dir) -> None:
    info = engine.info
    assert info.block_size == 4 and info.config.num_blocks == 32
    assert info.namespace == kv_namespace(tiny_llama_dir, "float32")
    assert info.model.num_layers == engine.kv_storage.kv.shape[0]
    assert info.max_model_len == min(info.model.max_position_embeddings, 32 * 4)
    assert info.weight_bytes > 0 and info.model_dir == tiny_llama_dir


def test_stats_count_requests_tokens_and_blocks(engine) -> None:
    engine.add_request("a", PROMPT, FIRST_TOKEN)
    engine.add_request("b", PROMPT[:5], FIRST_TOKEN)
    before = engine.stats()
    assert (before.num_waiting, before.num_running, before.queued_tokens) == (2, 0, 18)
    assert before.free_blocks == before.total_blocks == 32 and before.usage == 0.0
    engine.add_request("c", PROMPT[:3], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()  # a and b finish at their first token; c runs on
    after = engine.stats()
    assert (after.num_waiting, after.num_running, after.context_tokens) == (0, 1, 4)
    assert after.free_blocks == 31 and after.usage == 1 / 32


def test_queued_tokens_leave_out_a_waiting_prompts_cached_prefix(engine) -> None:
    engine.add_request("a", PROMPT, FIRST_TOKEN)
    engine.step()  # its three full blocks enter the prefix cache
    engine.add_request("b", PROMPT, FIRST_TOKEN)
    engine.add_request("c", PROMPT[:2] + [99] * 11, FIRST_TOKEN)  # a different first block
    assert engine.stats().queued_tokens == 1 + 13  # b computes only its last token


def test_queued_tokens_count_what_a_prefill_in_progress_has_left(tiny_llama_dir) -> None:
    config = EngineConfig(
        model=str(tiny_llama_dir),
        dtype="float32",
        block_size=4,
        num_blocks=32,
        max_num_batched_tokens=8,
    )
    chunked = LLMEngine(config)
    chunked.add_request("a", PROMPT, FIRST_TOKEN)
    chunked.step()  # its first 8 of 13 tokens
    stats = chunked.stats()
    assert (stats.num_running, stats.num_waiting, stats.queued_tokens) == (1, 0, 5)


def test_the_prefix_cache_is_counted_pinned_and_reported_by_hash(engine) -> None:
    hashes = block_hashes(PROMPT, 4, engine.info.namespace)
    assert engine.cached_prefix_blocks(hashes, 3) == 0
    engine.generate([PROMPT], FIRST_TOKEN)
    assert engine.cached_prefix_blocks(hashes, 3) == 3
    assert engine.cached_prefix_blocks(hashes, 2) == 2
    assert engine.take_kv_events().stored == hashes[:3]
    assert not engine.take_kv_events()
    assert set(engine.cached_block_hashes()) == set(hashes[:3])

    assert engine.pin_cached_blocks([*hashes[:2], 12345]) is None
    assert engine.stats().free_blocks == 32  # a miss pins nothing
    pinned = engine.pin_cached_blocks(hashes[:3])
    assert pinned is not None and len(set(pinned)) == 3
    assert engine.stats().free_blocks == 29
    engine.unpin_blocks(pinned)
    assert engine.stats().free_blocks == 32
    assert engine.cached_prefix_blocks(hashes, 3) == 3  # unpinned, still cached


def test_reserve_prefix_gives_local_hits_and_new_blocks(engine) -> None:
    hashes = block_hashes(PROMPT, 4, engine.info.namespace)
    engine.generate([PROMPT[:9]], FIRST_TOKEN)  # caches the first two blocks
    reserved = engine.reserve_prefix("r", hashes, 3)
    assert reserved is not None
    num_local, new_ids = reserved
    assert num_local == 2 and len(new_ids) == 1
    engine.release("r")
    assert engine.stats().free_blocks == 32


def test_reserve_reusing_heads_the_table_with_the_cached_prefix(engine) -> None:
    """A decode worker that holds a prompt's first blocks (an earlier turn) reserves them
    in place: only the rest of the KV needs to arrive."""
    hashes = block_hashes(PROMPT, 4, engine.info.namespace)
    engine.generate([PROMPT[:9]], FIRST_TOKEN)  # caches the first two blocks
    cached = engine.pin_cached_blocks(hashes[:2])
    engine.unpin_blocks(cached)
    reserved = engine.reserve_reusing("r", len(PROMPT) + 1, 0, hashes[:3])
    assert reserved is not None
    num_held, block_ids = reserved
    assert num_held == 2 and block_ids[:2] == cached and len(block_ids) == 4  # 14 tokens
    assert engine.reserve_reusing("r", 4, 0, hashes) is None  # it holds blocks already
    missed = engine.reserve_reusing("s", 4, 0, [12345])  # a prefix it does not hold
    assert missed is not None and missed[0] == 0 and len(missed[1]) == 1
    engine.release("r")
    engine.release("s")
    assert engine.stats().free_blocks == 32


def test_use_runner_replaces_the_model_runner(engine) -> None:
    class Counting(ModelRunner):
        steps = 0

        def execute(self, chunks, *args, **kwargs):
            Counting.steps += 1
            return super().execute(chunks, *args, **kwargs)

    want = engine.generate([PROMPT], FIRST_TOKEN)[0].token_ids
    engine.use_runner(lambda runner: Counting(runner.model, runner.storage, runner.backend))
    assert engine.generate([PROMPT], FIRST_TOKEN)[0].token_ids == want
    assert Counting.steps == 1


def test_the_mock_engine_has_no_runner_to_replace(smollm2_dir) -> None:
    mock = LLMEngine(EngineConfig(model=str(smollm2_dir), mock=MockSpec(), kv_cache_bytes=8 << 20))
    with pytest.raises(KvstackError, match="no model runner"):
        mock.use_runner(lambda runner: runner)
