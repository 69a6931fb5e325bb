"""The kvstore pool lets any prefill worker reuse a prefix another one computed."""

from __future__ import annotations

import re
import time

import openai
import pytest

from shared.sampling_params import SamplingParams
from tests.e2e.conftest import (
    indexed_blocks,
    pooled_blocks,
    running_stack,
    wait_until,
    worker_stats,
)

STORY = (
    "The lighthouse keeper climbed the spiral stairs every evening, counting the steps "
    "as his father had taught him, and each night the sea below answered with a "
    "different voice. "
) * 12


@pytest.fixture(scope="module")
def stack_with_pool(tmp_path_factory, smollm2_dir):
    with running_stack(
        tmp_path_factory.mktemp("pool"),
        num_prefill=2,
        num_kvstore=1,
        conductor_args=("--policy", "round-robin"),
    ) as stack:
        yield stack


def ask(stack, prompt: str) -> openai.types.Completion:
    client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)
    return client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=16, temperature=0
    )


def full_blocks(num_tokens: int) -> int:
    return num_tokens // 16


def wait_until_pooled(stack, answer: openai.types.Completion) -> None:
    """Until the conductor knows the pool holds the answered prompt's full blocks (each
    prefill writes them back after its first token)."""
    prompt_blocks = full_blocks(answer.usage.prompt_tokens)
    wait_until(
        lambda: pooled_blocks(stack) >= prompt_blocks,
        "the conductor knows the pool holds the prompt",
    )


def assert_prefix_load(answer: openai.types.Completion, num_blocks: int) -> None:
    """usage.timing says how many bytes the prefix fetch moved (SmolLM2's blocks: 30 layers
    of 16 tokens of 3 KV heads of 64, K and V, in bfloat16 or float32) and how fast."""
    load = answer.usage.model_extra["timing"]["prefix_load"]
    assert load["bytes"] in {num_blocks * 30 * 2 * 16 * 3 * 64 * size for size in (2, 4)}
    assert load["seconds"] > 0 and load["gb_s"] > 0


def test_a_prefix_computed_on_one_worker_is_loaded_by_another(stack_with_pool, reference):
    first = ask(stack_with_pool, STORY + " Question one: what did he count?")
    assert worker_stats(stack_with_pool, "prefill", "prefill-0").num_requests_done == 1
    wait_until_pooled(stack_with_pool, first)
    prompt = STORY + " Question two: what answered him?"
    second = ask(stack_with_pool, prompt)
    stats = worker_stats(stack_with_pool, "prefill", "prefill-1")
    assert stats.num_requests_done == 1 and stats.blocks_from_kvstore > 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == stats.blocks_from_kvstore * 16 and cached > 300
    assert_prefix_load(second, stats.blocks_from_kvstore)
    assert first.usage.model_extra["timing"]["prefix_load"]["bytes"] == 0
    assert second.choices[0].text == reference_text(reference, prompt)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # the one decode worker decoded the first: it holds the story's blocks, so the second's
    # hand-off sends only the rest of its KV (and its answer is still the reference's)
    sent = [a.usage.model_extra["timing"]["kv_handoff"] for a in (first, second)]
    assert sent[0]["held_by_decode"] == 0 and sent[1]["held_by_decode"] > 300
    token_bytes = sent[0]["bytes"] // first.usage.prompt_tokens
    assert sent[1]["bytes"] == token_bytes * (
        second.usage.prompt_tokens - sent[1]["held_by_decode"]
    )


def kvstore_behind(proxy, data_port: int) -> tuple[str, ...]:
    """A kvstore's flags: its data port reached through `proxy` (what it answers a get with
    crosses the proxy, as over a network: no shared-memory ring on this host)."""
    return (
        "--no-shared-memory",
        "--data-port",
        str(data_port),
        "--advertise-data-addr",
        f"127.0.0.1:{proxy.port}",
    )


UNCACHED = ("--no-prefix-cache",)  # the second ask's prefix comes from the pool, or computes


def test_a_kvstore_killed_mid_transfer_means_recompute_not_failure(tmp_path, reference):
    prompt, second, _ = ask_twice_killing_the_kvstore_mid_get(tmp_path, prefill_args=UNCACHED)
    assert second.choices[0].text == reference_text(reference, prompt)
    assert second.usage.prompt_tokens_details.cached_tokens == 0  # recomputed


def ask_twice_killing_the_kvstore_mid_get(tmp_path, **stack_args):
    """A stack whose kvstore answers gets through a proxy that SIGKILLs it once 200 KB of an
    answer crossed: one question on the story (its prefix then goes to the pool), then
    another on the same story, whose prefix's get is cut half way. Returns the second
    prompt, its answer and the decode worker's stats."""
    import signal

    from tests.e2e.conftest import free_port
    from tests.e2e.proxy import CuttingProxy

    data_port = free_port()
    stack_ref = {}
    kill = lambda: next(
        p for p in stack_ref["s"].processes if p.name == "kvstore-0"
    ).popen.send_signal(signal.SIGKILL)
    proxy = CuttingProxy(data_port, cut_after=200_000, on_cut=kill, answers=True)
    kvstore_args = kvstore_behind(proxy, data_port)
    with running_stack(tmp_path, num_kvstore=1, kvstore_args=kvstore_args, **stack_args) as stack:
        stack_ref["s"] = stack
        first = ask(stack, STORY + " Question one: what did he count?")
        wait_until_pooled(stack, first)
        prompt = STORY + " Question two: what answered him?"
        second = ask(stack, prompt)
        assert proxy.cut and proxy.error is None, proxy.error  # cut half way, sender killed
        decode = worker_stats(stack, "decode", "decode-0")
        stack.processes[:] = [p for p in stack.processes if p.name != "kvstore-0"]
    proxy.close()
    return prompt, second, decode


def reference_text(reference, prompt: str) -> str:
    tokens = reference.info.tokenizer.encode(prompt)
    return reference.generate([tokens], SamplingParams(max_tokens=16, temperature=0))[0].text


def test_the_next_turn_of_a_conversation_hits_the_blocks_of_the_last(stack_with_pool):
    client = openai.OpenAI(base_url=f"{stack_with_pool.api_url}/v1", api_key="none", max_retries=0)
    history = [{"role": "user", "content": STORY + " Tell me more about the keeper."}]
    before = pooled_blocks(stack_with_pool)  # the chat template's blocks are new
    first = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=history, max_tokens=64, temperature=0
    )
    # decode writes prompt + answer back when the turn ends (the last token has no KV yet)
    turn_blocks = full_blocks(first.usage.total_tokens - 1)
    wait_until(
        lambda: pooled_blocks(stack_with_pool) >= before + turn_blocks,
        "the conductor knows the pool holds the turn",
    )
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And the sea?"},
    ]
    second = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=history, max_tokens=8, temperature=0
    )
    # More than the first turn's prompt is cached: its answer's blocks came back too.
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens + 16


def test_a_peer_prefill_worker_serves_its_cache_when_no_pool_has_it(tmp_path, reference):
    with running_stack(
        tmp_path, num_prefill=2, num_kvstore=0, conductor_args=("--policy", "round-robin")
    ) as stack:
        first = ask(stack, STORY + " Question one: what did he count?")  # on prefill-0
        prompt_blocks = full_blocks(first.usage.prompt_tokens)
        wait_until(lambda: indexed_blocks(stack) >= prompt_blocks, "the index holds the prompt")
        prompt = STORY + " Question two: what answered him?"
        second = ask(stack, prompt)  # on prefill-1
        taker = worker_stats(stack, "prefill", "prefill-1")
        giver = worker_stats(stack, "prefill", "prefill-0")
    assert taker.blocks_from_peers > 0 and giver.blocks_served == taker.blocks_from_peers
    assert second.usage.prompt_tokens_details.cached_tokens == taker.blocks_from_peers * 16
    assert_prefix_load(second, taker.blocks_from_peers)
    assert second.choices[0].text == reference_text(reference, prompt)


def test_a_queued_prompt_uses_the_prefix_that_reached_the_pool_while_it_waited(tmp_path, reference):
    """Round-robin over two prefill workers: a long prompt keeps one busy for many steps
    (of 256 tokens here); D, a document, goes to the other; B, the same document and a
    question, queues behind the long one. D's blocks reach the pool while B waits: B
    binds its prefix when it leaves the queue, so it loads them instead of computing the
    document again."""
    from concurrent.futures import ThreadPoolExecutor

    tokens = lambda text: len(reference.info.tokenizer.encode(text))
    filler = " ".join(f"ledger line {i} balanced." for i in range(500))
    document = " ".join(f"Harbor note {i}: the tide turned at dusk." for i in range(40))
    from shared.prefill.admission import LEAD_STEPS

    # B waits until the long prompt has less than LEAD_STEPS steps of 256 tokens left
    assert tokens(filler) > (LEAD_STEPS + 4) * 256 and tokens(document) > 256
    with (
        running_stack(
            tmp_path,
            num_prefill=2,
            num_kvstore=1,
            conductor_args=("--policy", "round-robin"),
            prefill_args=("--max-num-batched-tokens", "256"),
        ) as stack,
        ThreadPoolExecutor(2) as pool,
    ):
        long_one = pool.submit(ask, stack, filler)
        time.sleep(0.3)  # placed first: B queues behind it for four steps or more
        d = pool.submit(timed_ask, stack, document + " Summarize.")
        time.sleep(0.05)
        b_sent = time.monotonic()
        b = ask(stack, document + " What turned at dusk?")
        d_answer, d_done = d.result()
        long_one.result()
    assert d_done > b_sent, "D's blocks were in the pool before B arrived: nothing to show"
    timing = b.usage.model_extra["timing"]
    assert timing["prefill_queue"] > 0
    assert timing["cached_tokens"]["kvstore"] >= full_blocks(tokens(document)) * 16 - 16
    assert d_answer.usage.prompt_tokens_details.cached_tokens == 0


def timed_ask(stack, prompt: str) -> tuple[openai.types.Completion, float]:
    answer = ask(stack, prompt)
    return answer, time.monotonic()


def test_a_pool_fetch_that_stalls_is_given_up_and_the_prefix_computed(tmp_path, reference):
    """The link from the kvstore goes silent mid-fetch (kept open): the prefill worker
    waits no longer than the prompt's own prefill would take (its measured rate), gives
    the fetch up and computes the prefix itself, at once (no retry through the gateway)."""
    from tests.e2e.conftest import free_port
    from tests.e2e.proxy import CuttingProxy

    data_port = free_port()
    proxy = CuttingProxy(data_port, cut_after=200_000, on_cut=lambda: None, hold=True, answers=True)
    kvstore_args = kvstore_behind(proxy, data_port)
    try:
        with running_stack(
            tmp_path, num_kvstore=1, prefill_args=UNCACHED, kvstore_args=kvstore_args
        ) as stack:
            first = ask(stack, STORY + " Question one: what did he count?")  # measures
            wait_until_pooled(stack, first)
            prompt = STORY + " Question two: what answered him?"
            second = ask(stack, prompt)
            assert proxy.cut and proxy.error is None, proxy.error  # it stalled mid-fetch
    finally:
        proxy.close()
    log = (tmp_path / "prefill-0.log").read_text()
    stalled = re.search(r"loading the prefix failed: stalled past ([\d.]+)s", log)
    assert stalled and float(stalled[1]) < 10.0  # its own prefill's time, not the ceiling
    assert second.choices[0].text == reference_text(reference, prompt)
    assert second.usage.prompt_tokens_details.cached_tokens == 0  # computed, not loaded
    assert "its prefix did not load; computing it here" in log
    assert "retrying" not in (tmp_path / "gateway-0.log").read_text()


def test_a_decode_worker_takes_the_prefix_the_pool_holds_and_prefill_sends_the_rest(
    tmp_path, reference
):
    """The decode worker keeps no prefix cache: at reservation it gets the prompt's blocks
    that the pool holds itself, and the prefill worker sends it only the rest."""
    with running_stack(tmp_path, num_kvstore=1, decode_args=UNCACHED) as stack:
        first = ask(stack, STORY + " Question one: what did he count?")
        wait_until_pooled(stack, first)
        prompt = STORY + " Question two: what answered him?"
        second = ask(stack, prompt)
        decode = worker_stats(stack, "decode", "decode-0")
    sent = [a.usage.model_extra["timing"]["kv_handoff"] for a in (first, second)]
    assert sent[0]["held_by_decode"] == 0 and sent[1]["held_by_decode"] > 300
    assert decode.blocks_from_kvstore * 16 == sent[1]["held_by_decode"]
    token_bytes = sent[0]["bytes"] // first.usage.prompt_tokens
    held = sent[1]["held_by_decode"]
    assert sent[1]["bytes"] == token_bytes * (second.usage.prompt_tokens - held)
    # the pool's blocks are the prompt's KV
    assert second.choices[0].text == reference_text(reference, prompt)


def test_a_kvstore_killed_while_decode_gets_a_prefix_means_a_retry_not_a_failure(
    tmp_path, reference
):
    """The kvstore dies half way through the decode worker's get of a prefix (asked at
    reservation, before the prefill worker's own): the decode worker refuses that KV at
    commit, the gateway places the request again, and the retry's KV all comes from
    prefill (the decode worker takes nothing from the pool for a while)."""
    prompt, second, decode = ask_twice_killing_the_kvstore_mid_get(
        tmp_path, decode_args=UNCACHED, prefill_args=UNCACHED
    )
    # the cut get was the decode worker's, in flight: it refused that KV at commit
    assert decode.num_transfers_refused == 1 and decode.blocks_from_kvstore > 0
    assert second.choices[0].text == reference_text(reference, prompt)
    assert second.usage.model_extra["timing"]["kv_handoff"]["held_by_decode"] == 0
    assert "retrying" in (tmp_path / "gateway-0.log").read_text()
