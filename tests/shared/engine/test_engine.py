"""The engine end to end on a small random Llama, checked against transformers' generate."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.errors import InvalidRequest
from shared.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (5, 19, 33, 2)]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()


def hf_greedy(reference, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = reference.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def engine(model_dir, **overrides) -> LLMEngine:
    config = dict(
        model=str(model_dir),
        dtype="float32",
        block_size=4,
        num_blocks=64,
        max_num_batched_tokens=16,
    )
    return LLMEngine(EngineConfig(**{**config, **overrides}))


def test_batched_greedy_equals_transformers(tiny_llama_dir, reference) -> None:
    results = engine(tiny_llama_dir).generate(prompts(), GREEDY)
    for prompt, result in zip(prompts(), results):
        assert result.token_ids == hf_greedy(reference, prompt, 12)
        assert result.finish_reason == "length"


def test_preemption_under_a_small_pool_changes_nothing(tiny_llama_dir) -> None:
    roomy = engine(tiny_llama_dir).generate(prompts(), GREEDY)
    small = engine(tiny_llama_dir, num_blocks=14)
    tight = small.generate(prompts(), GREEDY)
    assert [r.token_ids for r in tight] == [r.token_ids for r in roomy]
    assert small.stats().free_blocks == 14


def test_prefix_cache_hit_is_reported_and_output_unchanged(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir)
    prompt = prompts()[2]
    cold = eng.generate([prompt], GREEDY)[0]
    warm = eng.generate([prompt], GREEDY)[0]
    assert warm.token_ids == cold.token_ids
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 32


def test_bad_prompts_are_refused_and_leave_no_trace(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir, max_model_len=40)
    bad = {
        "outside the vocabulary": [1, 256],
        "the prompt is empty": [],
        "context limit is 40": list(range(40)),
    }
    for message, prompt in bad.items():
        with pytest.raises(InvalidRequest, match=message):
            eng.add_request("x", prompt, GREEDY)
    assert not eng.has_unfinished and eng.stats().free_blocks == 64


def test_abort_frees_the_blocks(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir)
    eng.add_request("a", prompts()[2], GREEDY)
    eng.step()
    assert eng.stats().free_blocks < 64
    assert eng.abort("a") and not eng.abort("a")
    assert eng.stats().free_blocks == 64 and not eng.has_unfinished


def test_stop_token_ids_and_length_limits(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir, max_model_len=24)
    free_run = eng.generate([prompts()[0]], GREEDY)[0]
    stop_at = free_run.token_ids[3]
    params = SamplingParams(
        max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=(stop_at,)
    )
    stopped = eng.generate([prompts()[0]], params)[0]
    first = free_run.token_ids.index(stop_at)
    assert stopped.token_ids == free_run.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"
    capped = eng.generate([prompts()[2][:20]], GREEDY)[0]  # 20 + 4 reaches max_model_len
    assert len(capped.token_ids) == 4 and capped.finish_reason == "length"


def test_seeded_sampling_repeats_and_logprobs_are_returned(tiny_llama_dir) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11, logprobs=3, ignore_eos=True)
    a = engine(tiny_llama_dir).generate([prompts()[1]], params)[0]
    b = engine(tiny_llama_dir).generate([prompts()[1]], params)[0]
    assert a.token_ids == b.token_ids
    assert [lp.token_id for lp in a.logprobs] == a.token_ids
    assert all(len(lp.top) == 3 and lp.logprob <= 0 for lp in a.logprobs)


def test_a_seeded_request_recomputed_from_its_tokens_continues_the_same(tiny_llama_dir) -> None:
    # What the gateway does when a worker dies: prompt + tokens so far as a new prompt.
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=11, ignore_eos=True)
    prompt = prompts()[1]
    whole = engine(tiny_llama_dir).generate([prompt], params)[0].token_ids
    for k in (1, 5, 11):
        rest = dataclasses.replace(params, max_tokens=12 - k)
        again = engine(tiny_llama_dir).generate([prompt + whole[:k]], rest)[0].token_ids
        assert whole[:k] + again == whole


def test_a_seeded_request_draws_the_same_beside_other_requests(tiny_llama_dir) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True)
    alone = engine(tiny_llama_dir).generate([prompts()[1]], params)[0]
    batched = engine(tiny_llama_dir).generate(prompts(), params)[1]
    assert batched.token_ids == alone.token_ids


def test_a_step_that_prefills_runs_on_the_prefill_threads(tiny_llama_dir) -> None:
    """kvstack serve --decode-threads: its count while a step only decodes, --threads while a
    prompt is computed (the counts are this thread's: the engine's step thread sets them)."""
    before = torch.get_num_threads()
    try:
        eng = engine(tiny_llama_dir, num_threads=1, prefill_threads=2)
        eng.add_request("a", prompts()[1], GREEDY)
        seen = []
        while eng.has_unfinished:
            eng.step()
            seen.append(torch.get_num_threads())
        assert seen[0] == 2  # 19 tokens in chunks of 16: two steps prefill
        assert seen[1] == 2
        assert set(seen[2:]) == {1}
    finally:
        torch.set_num_threads(before)


def test_thread_counts_below_one_are_refused() -> None:
    from shared.errors import KvstackError

    with pytest.raises(KvstackError, match="prefill_threads must be at least 1"):
        EngineConfig(prefill_threads=0)
