"""A real `mooncake_master` for the Mooncake Store pool's tests."""

from __future__ import annotations

import pytest

from shared.kvpool.mooncake_store import MISSING_HELP, available


@pytest.fixture(scope="package")
def mooncake_master(tmp_path_factory):
    if not available():
        pytest.skip(f"Mooncake Store is not installed here: {MISSING_HELP}")
    from services.stack.mooncake_master import start_master

    master = start_master(tmp_path_factory.mktemp("mooncake") / "master.log")
    yield master.address
    master.stop()
