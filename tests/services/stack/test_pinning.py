"""How many torch threads a process takes on the cores it may use."""

from __future__ import annotations

import pytest

from services.stack import pinning
from shared.errors import KvstackError


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(pinning, "usable_cores", lambda: (0, 1, 2, 3))


def test_a_thread_per_core_unless_threads_are_given(four_cores) -> None:
    assert pinning.pin("", None) == 4
    assert pinning.pin("", 8) == 8  # --threads is taken as given


def test_zero_threads_is_refused(four_cores) -> None:
    with pytest.raises(KvstackError, match="--threads must be at least 1"):
        pinning.pin("", 0)
