"""Penalties, logit_bias and min_tokens: against a plain reference, transformers, and
across a migration."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from shared.engine.logits_process import History, adjusted
from shared.errors import InvalidRequest
from shared.sampling_params import SamplingParams
from tests.shared.engine.test_engine import engine, hf_greedy, prompts
from tests.shared.engine.test_engine import reference as reference

VOCAB = 50


def reference_adjust(
    logits: list[float], params: SamplingParams, tokens: list[int], num_output: int
) -> list[float]:
    """vLLM's definitions, one token at a time."""
    out, output = list(logits), tokens[len(tokens) - num_output :]
    for token_id, bias in params.logit_bias:
        out[token_id] += bias
    for token_id in set(tokens):
        value = out[token_id]
        out[token_id] = (
            value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
        )
    for token_id in set(output):
        out[token_id] -= params.frequency_penalty * output.count(token_id)
        out[token_id] -= params.presence_penalty
    return out


@pytest.mark.parametrize("seed", range(8))
def test_adjusted_equals_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    params = SamplingParams(
        presence_penalty=rng.uniform(-2, 2),
        frequency_penalty=rng.uniform(-2, 2),
        repetition_penalty=rng.uniform(0.5, 2),
        logit_bias=tuple((t, rng.uniform(-100, 100)) for t in sorted(rng.sample(range(VOCAB), 4))),
    )
    tokens = [rng.randrange(VOCAB) for _ in range(30)]
    num_output = rng.randrange(0, 30)
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(seed))
    untouched = SamplingParams()
    got = adjusted(logits, [untouched, params], [None, History(tokens, num_output, 0)], ())
    want = reference_adjust(logits[1].tolist(), params, tokens, num_output)
    assert torch.allclose(got[1], torch.tensor(want), atol=1e-5)
    assert torch.equal(got[0], logits[0])  # rows that ask for nothing stay as they were
    assert not torch.equal(got[1], logits[1])  # and the input is not changed in place
    assert adjusted(logits, [untouched] * 2, [None, None], ()) is logits


def test_min_tokens_masks_eos_and_stop_tokens_until_reached() -> None:
    params = SamplingParams(min_tokens=3, stop_token_ids=(7,))
    logits = torch.zeros(1, VOCAB)
    early = adjusted(logits, [params], [History([1, 2, 3], 2, 2)], {0})[0]
    assert early[0] == float("-inf") and early[7] == float("-inf") and early[1] == 0
    reached = adjusted(logits, [params], [History([1, 2, 3], 3, 3)], {0})[0]
    assert torch.equal(reached, logits[0])
    ignoring = dataclasses.replace(params, ignore_eos=True)
    assert adjusted(logits, [ignoring], [History([1], 0, 0)], {0})[0][0] == 0


def test_bad_values_are_refused() -> None:
    for bad in (
        dict(presence_penalty=2.5),
        dict(frequency_penalty=-3),
        dict(repetition_penalty=0),
        dict(logit_bias=((1, 101.0),)),
        dict(min_tokens=-1),
    ):
        with pytest.raises(InvalidRequest):
            SamplingParams(**bad)


def test_repetition_penalty_equals_transformers(tiny_llama_dir, reference) -> None:
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, repetition_penalty=1.8)
    results = engine(tiny_llama_dir).generate(prompts(), params)
    for prompt, result in zip(prompts(), results):
        ids = torch.tensor([prompt])
        out = reference.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            min_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            repetition_penalty=1.8,
        )
        assert result.token_ids == out[0, len(prompt) :].tolist()
    plain = [hf_greedy(reference, p, 12) for p in prompts()]
    assert [r.token_ids for r in results] != plain  # the penalty did change the output


def penalty(params: SamplingParams, output: list[int], token_id: int) -> float:
    count = output.count(token_id)
    return params.frequency_penalty * count + params.presence_penalty * (count > 0)


def test_greedy_under_penalties_takes_the_penalized_argmax(tiny_llama_dir) -> None:
    """The engine's logprobs are the model's own: the sampled token must be the best of the
    top 20 once the reference penalties are applied to them."""
    params = SamplingParams(
        max_tokens=16, temperature=0, ignore_eos=True, logprobs=20,
        frequency_penalty=1.5, presence_penalty=0.5,
    )  # fmt: skip
    plain = dataclasses.replace(params, frequency_penalty=0, presence_penalty=0)
    llm = engine(tiny_llama_dir)
    for prompt in prompts():
        result = llm.generate([prompt], params)[0]
        for step, entry in enumerate(result.logprobs):
            output = result.token_ids[:step]
            candidates = (*entry.top, (entry.token_id, entry.logprob))
            scores = {t: lp - penalty(params, output, t) for t, lp in candidates}
            assert scores[entry.token_id] == pytest.approx(max(scores.values()), abs=1e-5)
        unpenalized = llm.generate([prompt], plain)[0].token_ids
        repeats = len(result.token_ids) - len(set(result.token_ids))
        assert repeats <= len(unpenalized) - len(set(unpenalized))


def test_penalties_survive_a_migration(tiny_llama_dir) -> None:
    """A request moved after 5 tokens continues from prompt + those tokens: with them
    counted as output (prior_output_tokens) it goes on exactly as it would have."""
    params = SamplingParams(
        max_tokens=12, temperature=0, ignore_eos=True, frequency_penalty=2.0, presence_penalty=1.0
    )
    llm = engine(tiny_llama_dir)
    prompt = prompts()[1]
    whole = llm.generate([prompt], params)[0].token_ids
    moved = dataclasses.replace(params, max_tokens=7, prior_output_tokens=5)
    rest = llm.generate([prompt + whole[:5]], moved)[0].token_ids
    assert whole[:5] + rest == whole
    forgot = dataclasses.replace(moved, prior_output_tokens=0)
    assert llm.generate([prompt + whole[:5]], forgot)[0].token_ids != rest


def test_logit_bias_bans_a_token_and_min_tokens_holds_eos_back(tiny_llama_dir) -> None:
    llm = engine(tiny_llama_dir)
    prompt = prompts()[0]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    plain = llm.generate([prompt], params)[0].token_ids
    banned = plain[0]
    biased = dataclasses.replace(params, logit_bias=((banned, -100.0),))
    assert banned not in llm.generate([prompt], biased)[0].token_ids
    # A token of the plain output as a stop token: without min_tokens the reply ends there.
    k = next(i for i in range(1, 12) if plain[i] not in plain[:i])
    stop = dataclasses.replace(params, ignore_eos=False, stop_token_ids=(plain[k],))
    assert llm.generate([prompt], stop)[0].token_ids == plain[: k + 1]
    held = dataclasses.replace(stop, min_tokens=8)
    out = llm.generate([prompt], held)[0].token_ids
    assert len(out) >= 8 and plain[k] not in out[:8]
