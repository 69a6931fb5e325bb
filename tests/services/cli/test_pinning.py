"""How many torch threads a process takes on the cores it may use."""

from __future__ import annotations

import pytest

from services.cli import pinning
from shared.errors import KvstackError


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(pinning, "usable_cores", lambda: (0, 1, 2, 3))


def test_a_thread_per_core_but_the_spare_ones_and_never_none(four_cores) -> None:
    assert pinning.pin("", None) == 4
    assert pinning.pin("", None, spare=1) == 3  # kvstack serve: its front end keeps one
    assert pinning.pin("", None, spare=4) == 1
    assert pinning.pin("", 8, spare=1) == 8  # --threads is taken as given


def test_zero_threads_is_refused(four_cores) -> None:
    with pytest.raises(KvstackError, match="--threads must be at least 1"):
        pinning.pin("", 0)
