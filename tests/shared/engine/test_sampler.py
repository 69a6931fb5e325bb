import math
import os
import subprocess
import sys

import pytest
import torch

from shared.engine.sampler import (
    SAMPLING_FAILED,
    logprobs,
    sample,
    sampling_failure,
    seeded_generator,
)
from shared.errors import InvalidRequest
from shared.model.kernels import cpu_ops, supported_isas
from shared.sampling_params import SamplingParams

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


@pytest.fixture(params=["numpy", *supported_isas()])
def greedy(request, monkeypatch):
    """The CPU's greedy choice by numpy, and by each native build this CPU runs."""
    from shared.engine import sampler

    module = None if request.param == "numpy" else cpu_ops(request.param)
    if request.param != "numpy" and module is None:
        pytest.skip(f"the {request.param} build is unavailable")
    monkeypatch.setattr(sampler, "loaded_cpu_ops", lambda: module)
    return sampler._greedy_and_usable


def test_greedy_on_the_cpu_agrees_with_torchs_row_max(greedy):
    """The CPU's greedy choice (numpy's argmax, or the kernels' greedy_rows) is torch's: the
    first maximum of each row, and a row usable exactly when its maximum is finite (a NaN or
    +inf anywhere, or every token masked, is not); a row split off a batch's logits (a view)
    reads the same."""
    from shared.engine.sampler import row_max

    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(3))
    logits[0, [5, 260]] = 9.0  # a tie: the first wins
    logits[1, 17] = float("nan")
    logits[2, [3, 200]] = float("inf")
    logits[3] = float("-inf")
    logits[4, :150] = float("-inf")
    logits[5, 299] = 50.0  # the last token
    logits[6, [40, 41]] = 9.0  # a tie inside one vector's lanes
    values, indices = row_max(logits)
    expected = (indices.tolist(), torch.isfinite(values).tolist())
    assert greedy(logits) == expected
    assert expected[0][0] == 5 and expected[0][5] == 299 and expected[0][6] == 40
    assert expected[1] == [True, False, False, False, True, True, True, True]
    rows = logits.split(1)
    for i, row in enumerate(rows):
        assert greedy(row) == ([expected[0][i]], [expected[1][i]])


def test_greedy_on_the_cpu_is_numpys_argmax_on_random_rows(greedy):
    """Against numpy's argmax on rows of every width around the vector's (tails), with ties,
    NaN, +inf and masked tokens mixed in."""
    from shared.engine.sampler import _greedy_and_usable_numpy

    gen = torch.Generator().manual_seed(5)
    for trial in range(200):
        logits = torch.randn(3, 1 + trial % 40, generator=gen).round()  # many ties
        odd = torch.rand(logits.shape, generator=gen)
        if trial % 3 == 0:
            logits[odd < 0.3] = float("-inf")
        if trial % 5 == 0:
            logits[odd > 0.95] = float("nan")
        if trial % 7 == 0:
            logits[odd < 0.05] = float("inf")
        assert greedy(logits) == _greedy_and_usable_numpy(logits), logits


def test_the_sampler_never_builds_the_kernels(tmp_path) -> None:
    """A mock engine samples too: where no model loaded the kernels, the sampler runs numpy
    rather than compiling them (half a minute) in the middle of a step."""
    script = (
        "import torch\n"
        "from shared.engine.sampler import sample\n"
        "from shared.sampling_params import SamplingParams\n"
        "from shared.model import kernels\n"
        "print(sample(torch.tensor([[0.0, 2.0, 1.0]]), [SamplingParams(temperature=0)], [None]))\n"
        "print(kernels.loaded_cpu_ops())\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}  # no build of the kernels there
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[1]", "None"]
    assert "compiling" not in done.stderr and not list(tmp_path.rglob("*.so"))
