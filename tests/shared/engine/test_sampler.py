import math

import pytest
import torch

from shared.engine.sampler import logprobs, sample
from shared.engine.sampling_params import SamplingParams
from shared.errors import InvalidRequest

LOGITS = torch.tensor([[1.0, 3.0, 2.0, 0.5], [0.0, 0.0, 5.0, 0.0]])


def draws(params: SamplingParams, n: int = 400, seed: int = 0) -> set[int]:
    gen = torch.Generator().manual_seed(seed)
    return {sample(LOGITS[:1], [params], [gen])[0] for _ in range(n)}


def test_greedy_takes_the_argmax_per_row() -> None:
    assert sample(LOGITS, [SamplingParams(temperature=0)] * 2, [None, None]) == [1, 2]


def test_top_k_and_top_p_restrict_the_candidates() -> None:
    assert draws(SamplingParams(temperature=1.0, top_k=2)) == {1, 2}
    # probabilities of [1, 3, 2, .5] are about [.09, .64, .24, .05]: .64 < .8 <= .88
    assert draws(SamplingParams(temperature=1.0, top_p=0.8)) == {1, 2}
    assert len(draws(SamplingParams(temperature=1.0))) == 4


def test_same_seed_same_tokens() -> None:
    params = SamplingParams(temperature=1.5, seed=3)
    runs = [[sample(LOGITS[:1], [params], [torch.Generator().manual_seed(7)])[0]
             for _ in range(1)] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_logprobs_of_chosen_and_top_tokens() -> None:
    (lp, none) = logprobs(LOGITS, [2, 2], [2, None])
    expected = LOGITS[0] - torch.logsumexp(LOGITS[0], 0)
    assert none is None
    assert math.isclose(lp.logprob, expected[2].item(), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [1, 2]


@pytest.mark.parametrize("bad", [
    dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-2),
    dict(stop=("",)), dict(logprobs=99)])
def test_bad_parameters_are_refused_clearly(bad) -> None:
    with pytest.raises(InvalidRequest):
        SamplingParams(**bad)
