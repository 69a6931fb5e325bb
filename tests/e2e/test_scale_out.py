"""Two prefill and two decode workers: same answers, and the work is spread."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import assert_chats_equal_reference, running_stack, worker_stats


@pytest.fixture(scope="module")
def stack_2x2(tmp_path_factory, smollm2_dir):
    with running_stack(tmp_path_factory.mktemp("2x2"), num_prefill=2, num_decode=2) as stack:
        yield stack


def test_two_by_two_answers_equal_generate_and_use_every_worker(stack_2x2, reference) -> None:
    prompts = [f"Count from {n} to {n + 5}." for n in range(8)]
    assert_chats_equal_reference(stack_2x2, reference, prompts, max_tokens=16)
    done = {
        w: worker_stats(stack_2x2, w.split("-")[0], w).num_requests_done
        for w in ("prefill-0", "prefill-1", "decode-0", "decode-1")
    }
    assert all(count > 0 for count in done.values()), done
    assert done["prefill-0"] + done["prefill-1"] == len(prompts)
