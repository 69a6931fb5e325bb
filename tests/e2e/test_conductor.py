"""The KV-centric conductor in a real stack: cache-aware placement, restart and resync."""

from __future__ import annotations

import time

import openai
import pytest

from tests.e2e.conftest import indexed_blocks, running_stack, worker_stats

MANUAL = (
    "Step one of the maintenance manual: close the intake valve, wait for the gauge to "
    "settle, then log the pressure in the notebook by the door. "
) * 16


@pytest.fixture(scope="module")
def stack(tmp_path_factory, smollm2_dir):
    with running_stack(
        tmp_path_factory.mktemp("conductor"),
        num_prefill=2,
        conductor_args=("--policy", "kvcentric"),
    ) as s:
        yield s


def ask(stack, prompt: str, **extra) -> openai.types.Completion:
    client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)
    return client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=prompt,
        max_tokens=4,
        temperature=0,
        extra_body=extra or None,
    )


def requests_done(stack) -> dict[str, int]:
    return {
        w: worker_stats(stack, "prefill", w).num_requests_done for w in ("prefill-0", "prefill-1")
    }


def wait_for_index(stack, minimum: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while (n := indexed_blocks(stack)) < minimum:
        assert time.monotonic() < deadline, f"the index holds {n} blocks, wanted {minimum}"
        time.sleep(0.2)
    return n


def test_a_repeated_prefix_lands_on_the_worker_that_holds_it(stack) -> None:
    before = requests_done(stack)
    ask(stack, MANUAL + " Question: what is step one?")
    first = {w: n - before[w] for w, n in requests_done(stack).items()}
    holder = next(w for w, n in first.items() if n == 1)
    wait_for_index(stack, 25)
    for i in range(4):
        answer = ask(stack, MANUAL + f" Question {i}: where is the notebook?")
        assert answer.usage.prompt_tokens_details.cached_tokens >= 400
    after = {w: n - before[w] for w, n in requests_done(stack).items()}
    assert after[holder] == 5 and sum(after.values()) == 5


@pytest.fixture(scope="module")
def baseline_stack(tmp_path_factory, smollm2_dir):
    with running_stack(
        tmp_path_factory.mktemp("baseline"), conductor_args=("--admission", "baseline")
    ) as s:
        yield s


def test_a_ttft_slo_it_cannot_meet_is_refused_before_prefill(baseline_stack) -> None:
    done = requests_done_one(baseline_stack)
    with pytest.raises(openai.APIStatusError) as refused:
        ask(baseline_stack, MANUAL, slo_ttft=0.0001)
    assert refused.value.status_code == 503 and "TTFT" in str(refused.value)
    assert refused.value.response.headers.get("retry-after")
    assert requests_done_one(baseline_stack) == done  # no prefill was spent on it
    assert ask(baseline_stack, "Hello", slo_ttft=60).choices[0].text


def test_baseline_decode_refuses_after_prefill_when_its_tbt_is_over_the_slo(baseline_stack) -> None:
    client = openai.OpenAI(base_url=f"{baseline_stack.api_url}/v1", api_key="none", max_retries=0)
    busy = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="Count: 1, 2,",
        max_tokens=60,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(busy))  # decode is now stepping
    done = requests_done_one(baseline_stack)
    with pytest.raises(openai.APIStatusError) as refused:
        ask(baseline_stack, "Hello there", slo_tbt=1e-6)
    assert refused.value.status_code == 503 and "prefill wasted" in str(refused.value)
    assert requests_done_one(baseline_stack) == done + 1  # the prefill was spent
    stats = worker_stats(baseline_stack, "decode", "decode-0")
    assert stats.num_rejected_after_prefill == 1
    assert sum(1 for _ in busy) > 0  # the busy stream is unharmed


def requests_done_one(stack) -> int:
    return worker_stats(stack, "prefill", "prefill-0").num_requests_done


def test_a_restarted_conductor_rebuilds_its_index_from_the_workers(stack) -> None:
    ask(stack, MANUAL + " Question: which valve?")
    indexed = wait_for_index(stack, 25)
    conductor = next(p for p in stack.processes if p.name == "conductor-0")
    conductor.popen.terminate()
    conductor.popen.wait(30)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as down:
        ask(stack, "Hello")
    assert down.value.status_code == 503 and time.monotonic() - started < 15
    stack.processes.remove(conductor)
    stack.spawn(conductor.name, conductor.args)
    stack.wait_ready()
    assert wait_for_index(stack, indexed) >= indexed  # from the resync, no new requests
    before = requests_done(stack)
    ask(stack, MANUAL + " Question: which valve, again?")
    after = requests_done(stack)
    holder = max(before, key=lambda w: before[w])
    assert after[holder] == before[holder] + 1
