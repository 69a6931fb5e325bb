"""A real stack of mock workers (llama3-70b on an 8xA800 node, KV scaled to 1e-3): the real
gateway, conductor, kvstore and data plane, with no model computing anything."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import urllib.request

import openai
import pytest

from shared import codec, subjects
from shared.engine.mock import MockSpec
from shared.messages import Heartbeat, StoreStats
from tests.e2e.conftest import (
    conductor_stats,
    indexed_blocks,
    running_stack,
    wait_until,
    worker_stats,
)

SPEC = MockSpec("llama3-70b", "a800", 1e-3)
MAX_TOKENS = 8
PREFIX_TOKENS = 650  # 40 full blocks and 10 tokens


@pytest.fixture(scope="module")
def mock_stack(tmp_path_factory, smollm2_dir):
    with running_stack(
        tmp_path_factory.mktemp("mock"),
        num_prefill=2,
        num_decode=2,
        num_kvstore=1,
        mock=SPEC,
        kvstore_args=("--dram-gib", "0.1"),
        worker_args=("--threads", "1", "--kv-cache-gib", "0.02"),
        gateway_args=(),
    ) as stack:
        yield stack


def complete(stack, prompt: list[int]) -> openai.types.Completion:
    client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)
    return client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0.8,
        extra_body={"ignore_eos": True},
    )


def token_prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49000) for _ in range(length)]


def http_addrs(stack, service: str, count: int) -> list[str]:
    """The HTTP (metrics) addresses of `count` workers of a service, from their heartbeats."""

    async def listen() -> list[str]:
        seen: dict[str, str] = {}
        bus = await stack.bus("test-heartbeats")

        async def on_beat(msg) -> None:
            beat = codec.decode(msg.data, Heartbeat)
            if beat.service == service:
                seen[beat.worker_id] = beat.http_addr

        sub = await bus.nc.subscribe(subjects.all_heartbeats(), cb=on_beat)
        while len(seen) < count:
            await asyncio.sleep(0.1)
        await sub.unsubscribe()
        await bus.drain()
        return list(seen.values())

    return asyncio.run(asyncio.wait_for(listen(), 10))


def kv_bytes_sent(stack) -> int:
    """KV payload bytes the prefill workers streamed to decode workers (a counter)."""
    total = 0
    for addr in http_addrs(stack, "prefill", 2):
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as response:
            text = response.read().decode()
        line = next(
            row
            for row in text.splitlines()
            if row.startswith("kvstack_prefill_kv_transfer_bytes_total ")
        )
        total += int(float(line.split()[1]))
    return total


def test_answers_are_complete_and_kv_crosses_at_the_scaled_size(mock_stack) -> None:
    # 9000 tokens: past SmolLM2's own 8192-token context, within the mock model's.
    prompts = [token_prompt(seed, n) for seed, n in ((1, 300), (2, 1000), (3, 9000))]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: complete(mock_stack, p), prompts))
    for prompt, answer in zip(prompts, answers):
        assert answer.choices[0].finish_reason == "length" and answer.choices[0].text
        assert answer.usage.completion_tokens == MAX_TOKENS
        assert answer.usage.prompt_tokens == len(prompt)
    # Each prompt's KV goes once from prefill to decode, all 80 layers at 320 B per token.
    want = sum(len(p) for p in prompts) * SPEC.kv_bytes_per_token
    wait_until(lambda: kv_bytes_sent(mock_stack) >= want, "the prefill workers sent the KV")
    assert kv_bytes_sent(mock_stack) == want == sum(len(p) for p in prompts) * 320


def test_a_shared_prefix_is_served_from_cache_and_answers_repeat(mock_stack) -> None:
    prefix = token_prompt(4, PREFIX_TOKENS)
    first = complete(mock_stack, prefix)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    wait_until(lambda: indexed_blocks(mock_stack) >= 40, "the conductor knows the prefix")
    longer = complete(mock_stack, prefix + token_prompt(5, 20))
    assert longer.usage.prompt_tokens_details.cached_tokens == 640
    again = complete(mock_stack, prefix)
    assert again.choices[0].text == first.choices[0].text  # deterministic tokens
    assert again.usage.prompt_tokens_details.cached_tokens == 640


def test_the_kvstore_holds_blocks_of_the_scaled_size(mock_stack) -> None:
    complete(mock_stack, token_prompt(6, 200))  # 12 full blocks written back after it
    stats = lambda: worker_stats(mock_stack, "kvstore", "kvstore-0", StoreStats)
    wait_until(lambda: stats().dram_blocks >= 12, "the kvstore holds the prompt")
    held = stats()
    assert held.dram_blocks >= 12
    assert held.dram_bytes == held.dram_blocks * 16 * SPEC.kv_bytes_per_token


def test_the_conductor_reports_how_far_its_ttft_and_tbt_estimates_fell(mock_stack) -> None:
    """Each finished request tells the conductor its TTFT, its measured queue and prefill
    and its TBT beside the placement's predictions; the conductor reports the error
    distribution (and exports it)."""
    for seed in (7, 8, 9):
        complete(mock_stack, token_prompt(seed, 2000))
    errors = lambda: {e.estimate: e for e in conductor_stats(mock_stack).estimates}
    wait_until(
        lambda: errors().get("ttft") is not None and errors()["ttft"].count >= 3,
        "three TTFT estimates are scored",
    )
    found = errors()
    assert found["ttft"].count >= 3 and found["tbt"].count >= 3
    # the measured parts of the TTFT: nothing was loaded into these prompts (distinct)
    wait_until(
        lambda: errors().get("prefill") is not None and errors()["prefill"].count >= 3,
        "three prefill estimates are scored",
    )
    assert errors()["queue"].count >= 3
    for error in found.values():
        assert 0 <= error.median_abs_rel_error <= error.p90_abs_rel_error
