"""SchedulingConfig validation."""

from __future__ import annotations

import pytest

from shared.conductor.config import ADMISSION_MODES, POLICY_NAMES, SchedulingConfig
from shared.conductor.policies import POLICIES
from shared.errors import KvstackError


def test_every_policy_name_has_a_policy() -> None:
    assert set(POLICY_NAMES) == set(POLICIES)


@pytest.mark.parametrize("mode", ADMISSION_MODES)
def test_every_admission_mode_is_accepted(mode: str) -> None:
    assert SchedulingConfig(admission=mode).admission == mode


def test_an_unknown_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(KvstackError, match="kvcentric"):
        SchedulingConfig(policy="fastest")


def test_an_unknown_admission_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(KvstackError, match="predictive-request"):
        SchedulingConfig(admission="strict")


@pytest.mark.parametrize("name", ["slo_ttft", "slo_tbt", "balancing_threshold", "decode_time"])
def test_non_positive_numbers_are_refused(name: str) -> None:
    with pytest.raises(KvstackError, match=name):
        SchedulingConfig(**{name: 0.0})
