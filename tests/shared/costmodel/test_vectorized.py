"""decode_step_times (what the conductor calls for every decode worker at once) equals the
per-worker decode_step_time, for both kinds of cost model."""

from __future__ import annotations

import numpy as np
import pytest

from shared.costmodel import roofline
from shared.costmodel.fitted import FittedCostModel

BATCH = np.array([1.0, 4.0, 64.0, 512.0])
CONTEXT = np.array([0.0, 8_000.0, 500_000.0, 4_000_000.0])  # memory- and compute-bound


@pytest.mark.parametrize(
    "cost",
    [
        roofline("llama3-70b", "a800"),
        roofline("smollm2-135m", "cpu"),
        FittedCostModel("m", (0.01, 1e-3, 1e-7, 1e-8, 1e-6), (-0.5, 1e-3, 1e-6), 1e9, 1e-3, 100),
    ],
    ids=["a800", "cpu", "fitted"],
)
def test_vectorized_decode_times_equal_the_scalar_ones(cost) -> None:
    scalar = [cost.decode_step_time(int(b), int(c)) for b, c in zip(BATCH, CONTEXT)]
    assert cost.decode_step_times(BATCH, CONTEXT).tolist() == pytest.approx(scalar, rel=1e-12)
