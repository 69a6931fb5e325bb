import math

import pytest
import torch

from shared.engine.sampler import (
    SAMPLING_FAILED,
    logprobs,
    sample,
    sampling_failure,
    seeded_generator,
)
from shared.engine.sampling_params import SamplingParams
from shared.errors import InvalidRequest

LOGITS = torch.tensor([[1.0, 3.0, 2.0, 0.5], [0.0, 0.0, 5.0, 0.0]])


def draws(params: SamplingParams, n: int = 400, seed: int = 0) -> set[int]:
    gen = torch.Generator().manual_seed(seed)
    return {sample(LOGITS[:1], [params], [gen])[0] for _ in range(n)}


def test_greedy_takes_the_argmax_per_row() -> None:
    assert sample(LOGITS, [SamplingParams(temperature=0)] * 2, [None, None]) == [1, 2]


def test_temperatures_below_vllms_epsilon_are_greedy() -> None:
    for temperature in (1e-320, 1e-6):
        params = SamplingParams(temperature=temperature)
        assert params.greedy and sample(LOGITS, [params] * 2, [None, None]) == [1, 2]
    assert not SamplingParams(temperature=1e-5).greedy


def test_top_k_and_top_p_restrict_the_candidates() -> None:
    assert draws(SamplingParams(temperature=1.0, top_k=2)) == {1, 2}
    # probabilities of [1, 3, 2, .5] are about [.09, .64, .24, .05]: .64 < .8 <= .88
    assert draws(SamplingParams(temperature=1.0, top_p=0.8)) == {1, 2}
    assert len(draws(SamplingParams(temperature=1.0))) == 4
    # below float32's range top_p reads as 0 there: still the likeliest token, never none
    assert draws(SamplingParams(temperature=1.0, top_p=5e-324)) == {1}


def test_min_p_drops_tokens_far_below_the_likeliest() -> None:
    # probabilities about [.09, .64, .24, .05]: min_p .3 keeps those above .19
    assert draws(SamplingParams(temperature=1.0, min_p=0.3)) == {1, 2}
    assert draws(SamplingParams(temperature=1.0, min_p=0.5)) == {1}
    # after temperature: at 3 the probabilities flatten and all four pass .3 x the top
    assert len(draws(SamplingParams(temperature=3.0, min_p=0.3))) == 4


def test_an_unusable_row_fails_alone_and_the_others_are_sampled() -> None:
    nan = torch.tensor([[float("nan"), 1.0, 0.0, 0.0]])
    huge = torch.tensor([[1e36, 0.0, 0.0, 0.0]])  # / temperature 1e-4 overflows to inf
    logits = torch.cat([nan, LOGITS[1:], huge, LOGITS[1:]])
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1e-4, top_p=0.9),
        SamplingParams(temperature=0.5),
    ]
    gens = [torch.Generator().manual_seed(0) for _ in params]
    assert sample(logits, params, gens) == [SAMPLING_FAILED, 2, SAMPLING_FAILED, 2]
    assert logprobs(logits, [SAMPLING_FAILED, 2], [1, 1])[0] is None
    assert sampling_failure(params[2]).startswith(
        "sampling failed: the next-token distribution is broken"
    )
    assert "temperature=0.0001, top_p=0.9" in sampling_failure(params[2])


def test_masked_tokens_are_not_a_failure_unless_all_are() -> None:
    inf = float("-inf")
    logits = torch.tensor([[inf, 1.0, inf, 0.0], [inf] * 4, [1.0, inf, 3.0, inf]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0), SamplingParams()]
    gens = [None, None, torch.Generator().manual_seed(0)]
    assert sample(logits, params, gens)[:2] == [1, SAMPLING_FAILED]
    assert {sample(logits, params, gens)[2] for _ in range(50)} == {0, 2}


def seeded_draw(seed: int, position: int) -> int:
    params = SamplingParams(temperature=1.5)
    return sample(LOGITS[:1], [params], [seeded_generator(seed, position)])[0]


def test_a_seeded_draw_depends_on_seed_and_position_only() -> None:
    assert all(seeded_draw(7, 40) == seeded_draw(7, 40) for _ in range(5))
    assert len({seeded_draw(7, position) for position in range(20)}) > 1
    assert len({seeded_draw(seed, 40) for seed in range(20)}) > 1


def test_same_seed_same_tokens() -> None:
    params = SamplingParams(temperature=1.5, seed=3)
    runs = [
        [sample(LOGITS[:1], [params], [torch.Generator().manual_seed(7)])[0] for _ in range(1)]
        for _ in range(3)
    ]
    assert runs[0] == runs[1] == runs[2]


def test_logprobs_of_chosen_and_top_tokens() -> None:
    (lp, none) = logprobs(LOGITS, [2, 2], [2, None])
    expected = LOGITS[0] - torch.logsumexp(LOGITS[0], 0)
    assert none is None
    assert math.isclose(lp.logprob, expected[2].item(), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [1, 2]


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_tokens=0),
        dict(temperature=-1),
        dict(top_p=0),
        dict(top_k=-2),
        dict(min_p=-0.1),
        dict(min_p=1.5),
        dict(stop=("",)),
        dict(logprobs=99),
    ],
)
def test_bad_parameters_are_refused_clearly(bad) -> None:
    with pytest.raises(InvalidRequest, match=f"^{next(iter(bad))}"):
        SamplingParams(**bad)


def test_row_max_over_slices_is_the_first_max_of_the_row():
    from shared.engine.sampler import row_max

    logits = torch.randn(4, 96)
    logits[0, [5, 60]] = 9.0  # a tie across slices: the first wins
    logits[1, [40, 41]] = 9.0  # a tie inside one slice
    logits[2, 17] = float("nan")
    values, indices = row_max(logits, slices=8)
    assert indices[:2].tolist() == [5, 40]
    assert indices[3] == logits[3].argmax() and values[3] == logits[3].max()
    assert values[2].isnan()


def test_greedy_on_the_cpu_agrees_with_torchs_row_max():
    """The CPU's greedy choice (numpy's argmax) is torch's: the first maximum of each row,
    and a row usable exactly when its maximum is finite (a NaN or +inf anywhere, or every
    token masked, is not); a row split off a batch's logits (a view) reads the same."""
    from shared.engine.sampler import _greedy_and_usable, row_max

    logits = torch.randn(7, 300, generator=torch.Generator().manual_seed(3))
    logits[0, [5, 260]] = 9.0  # a tie: the first wins
    logits[1, 17] = float("nan")
    logits[2, [3, 200]] = float("inf")
    logits[3] = float("-inf")
    logits[4, :150] = float("-inf")
    logits[5, 299] = 50.0  # the last token
    values, indices = row_max(logits)
    expected = (indices.tolist(), torch.isfinite(values).tolist())
    assert _greedy_and_usable(logits) == expected
    assert expected[0][0] == 5 and expected[0][5] == 299
    assert expected[1] == [True, False, False, False, True, True, True]
    rows = logits.split(1)
    for i, row in enumerate(rows):
        assert _greedy_and_usable(row) == ([expected[0][i]], [expected[1][i]])
