"""The mock runner: steps take (at least) the cost model's time, tokens are deterministic,
and the engine around it (scheduler, block pool, prefix cache) runs as with a model."""

from __future__ import annotations

import time

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.mock import MockSpec
from shared.engine.mock_runner import MockRunner, step_seconds
from shared.engine.runner import SeqChunk
from shared.errors import InvalidRequest
from shared.kvcache.storage import KVStorage
from shared.logprob import TokenLogprob
from shared.sampling_params import SamplingParams

SPEC = MockSpec("llama3-70b", "a800")
COST = SPEC.cost()
LONG = SamplingParams(max_tokens=24, temperature=0.7, ignore_eos=False)


def runner(avoid=()) -> MockRunner:
    storage = KVStorage(80, 8, 16, 1, 2)
    return MockRunner(storage, COST, vocab_size=1000, avoid=avoid)


def decode(request: str, context: int) -> SeqChunk:
    return SeqChunk(request, [7], context - 1, [0])


def prefill(request: str, num_new: int, num_cached: int = 0) -> SeqChunk:
    return SeqChunk(request, list(range(num_new)), num_cached, [0])


def mock_engine(model_dir, **overrides) -> LLMEngine:
    config = dict(model=str(model_dir), mock=SPEC, kv_cache_bytes=8 << 20, detokenize=False)
    return LLMEngine(EngineConfig(**{**config, **overrides}))


def test_a_step_costs_the_cost_models_prefill_and_decode_times() -> None:
    assert step_seconds(COST, [prefill("a", 512, 1024)]) == COST.prefill_time(512, 1024)
    batch = [decode("a", 100), decode("b", 300)]
    assert step_seconds(COST, batch) == COST.decode_step_time(2, 400)
    mixed = step_seconds(COST, [*batch, prefill("c", 512)])
    parts = COST.decode_step_time(2, 400) + COST.prefill_time(512)
    assert COST.prefill_time(512) < mixed < parts  # one pass reads the weights once
    assert step_seconds(COST, []) == 0.0


def test_a_step_sleeps_at_least_the_cost_models_time() -> None:
    chunks = [prefill("a", 1000), decode("b", 5000)]
    for hooks in ({}, dict(on_layer_done=lambda layer: None, before_layer=lambda layer: None)):
        start = time.perf_counter()
        runner().execute(chunks, **hooks)
        assert time.perf_counter() - start >= step_seconds(COST, chunks)


def test_layer_hooks_run_once_per_layer_in_order() -> None:
    calls = []
    runner().execute(
        [prefill("a", 64)],
        before_layer=lambda layer: calls.append(("in", layer)),
        on_layer_done=lambda layer: calls.append(("out", layer)),
    )
    assert calls == [(kind, layer) for layer in range(80) for kind in ("in", "out")]


def test_tokens_are_a_deterministic_function_of_the_last_token_and_position() -> None:
    one, other = runner(), runner()
    chunks = [prefill("a", 40), decode("b", 90), SeqChunk("c", [1, 2, 3], 0, [0], num_logits=0)]
    rows = one.execute(chunks)
    assert [row.tolist() for row in rows] == [row.tolist() for row in other.execute(chunks)]
    assert rows[0].tolist() == [one.next_token(39, 40)] and rows[2].numel() == 0
    assert rows[1].tolist() == [one.next_token(7, 90)]
    assert one.next_token(39, 40) != one.next_token(39, 41)


def test_avoided_tokens_are_never_answered() -> None:
    plain = runner().next_token(5, 17)
    assert runner(avoid={plain}).next_token(5, 17) == (plain + 1) % 1000


def test_the_mock_model_is_sure_of_its_tokens() -> None:
    rows = runner().execute([decode("a", 3), decode("b", 4)])
    token_ids, logprobs = runner().sample(
        torch.cat(rows),
        [SamplingParams(logprobs=2), SamplingParams()],
        [None, None],
        [None, None],
        (),
    )
    assert token_ids == [row.item() for row in rows]
    assert logprobs == [TokenLogprob(token_ids[0], 0.0, ((token_ids[0], 0.0),)), None]


def test_the_engine_keeps_the_mock_models_layers_at_scaled_bytes(smollm2_dir) -> None:
    engine = mock_engine(smollm2_dir)
    storage, info = engine.kv_storage, engine.info
    assert storage.kv.shape[0] == info.model.num_layers == 80
    assert storage.token_bytes * 2 * 80 == SPEC.kv_bytes_per_token == 320
    assert engine.stats().total_blocks == SPEC.num_blocks(16, 8 << 20) == storage.num_blocks
    assert info.namespace == SPEC.namespace
    assert info.max_model_len == min(131072, storage.num_blocks * 16)
    assert info.weight_bytes == 0


def test_answers_are_exactly_max_tokens_long_and_the_same_on_every_engine(smollm2_dir) -> None:
    prompt = list(range(100, 400))
    first = mock_engine(smollm2_dir).generate([prompt], LONG)[0]
    again = mock_engine(smollm2_dir).generate([prompt], LONG)[0]
    assert len(first.token_ids) == 24 and first.finish_reason == "length"
    assert first.token_ids == again.token_ids
    special = set(mock_engine(smollm2_dir).info.tokenizer.all_special_ids)
    assert special and not special & set(first.token_ids)


def test_the_prefix_cache_serves_a_shared_prefix(smollm2_dir) -> None:
    engine = mock_engine(smollm2_dir)
    prefix = list(range(1000, 1160))
    engine.generate([prefix + [5, 6]], LONG)
    warm = engine.generate([prefix + [7, 8, 9]], LONG)[0]
    assert warm.num_cached_tokens == 160


def test_a_long_prompt_past_the_tokenizer_models_context_runs(smollm2_dir) -> None:
    engine = mock_engine(smollm2_dir, kv_cache_bytes=64 << 20, max_num_batched_tokens=4096)
    done = engine.generate([[300] * 9000], SamplingParams(max_tokens=2, ignore_eos=True))[0]
    assert len(done.token_ids) == 2 and done.finish_reason == "length"


@pytest.mark.parametrize("bad", [-1, 49152])
def test_prompts_are_checked_against_the_tokenizers_vocabulary(smollm2_dir, bad) -> None:
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        mock_engine(smollm2_dir).add_request("x", [1, bad], LONG)
