"""The prefill -> decode KV stream over the Mooncake Transfer Engine (`--transport mooncake`):
the same answers as over TCP. Skipped where the engine is not installed (extra `rdma`)."""

from __future__ import annotations

import pytest

from shared.transfer import mooncake
from tests.e2e.conftest import WORKER_ARGS, assert_chats_equal_reference, running_stack

pytestmark = pytest.mark.skipif(
    not mooncake.available(),
    reason="Mooncake Transfer Engine not installed: apt-get install "
    "libibverbs1 librdmacm1; pip install -e '.[rdma]'",
)


def test_answers_over_mooncake_equal_generate(tmp_path, reference) -> None:
    prompts = [f"Describe {thing} in one sentence." for thing in ("rain", "a fox", "glass")]
    with running_stack(tmp_path, worker_args=(*WORKER_ARGS, "--transport", "mooncake")) as stack:
        assert_chats_equal_reference(stack, reference, prompts, max_tokens=24)
