"""Mooncake Store as the KV pool (`--kv-pool mooncake`): a prefix one prefill worker
computed is loaded from the store by another, and the answer equals a cold run."""

from __future__ import annotations

import pytest

from shared.kvpool.mooncake_store import MISSING_HELP, available
from shared.sampling_params import SamplingParams
from tests.e2e.conftest import WORKER_ARGS, running_stack, worker_stats
from tests.e2e.test_kvstore_reuse import STORY, ask, wait_until_pooled

pytestmark = pytest.mark.skipif(
    not available(), reason=f"Mooncake Store is not installed here: {MISSING_HELP}"
)


def test_a_prefix_computed_on_one_worker_is_loaded_by_another(tmp_path, reference) -> None:
    from services.stack.mooncake_master import start_master

    master = start_master(tmp_path / "mooncake-master.log")
    pool = ("--kv-pool", "mooncake", "--mooncake-master", master.address)
    try:
        with running_stack(
            tmp_path,
            num_prefill=2,
            num_kvstore=0,
            worker_args=(*WORKER_ARGS, *pool, "--mooncake-segment-gib", "0.25"),
            conductor_args=("--policy", "round-robin"),
        ) as stack:
            first = ask(stack, STORY + " Question one: what did he count?")  # on prefill-0
            wait_until_pooled(stack, first)
            prompt = STORY + " Question two: what answered him?"
            second = ask(stack, prompt)  # on prefill-1
            stats = worker_stats(stack, "prefill", "prefill-1")
    finally:
        master.stop()
    assert stats.num_requests_done == 1 and stats.blocks_from_kvstore > 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == stats.blocks_from_kvstore * 16 and cached > 300
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    want = reference.generate(
        [reference.info.tokenizer.encode(prompt)], SamplingParams(max_tokens=16, temperature=0)
    )[0]
    assert second.choices[0].text == want.text
