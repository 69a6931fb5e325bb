"""The kvstore pool lets any prefill worker reuse a prefix another one computed."""
from __future__ import annotations

import time

import openai
import pytest

from shared.engine.sampling_params import SamplingParams
from tests.e2e.conftest import running_stack, worker_stats

STORY = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps "
         "as his father had taught him, and each night the sea below answered with a "
         "different voice. ") * 12


@pytest.fixture(scope="module")
def stack_with_pool(tmp_path_factory, smollm2_dir):
    with running_stack(tmp_path_factory.mktemp("pool"), num_prefill=2, num_kvstore=1,
                       conductor_args=("--policy", "round-robin")) as stack:
        yield stack


def ask(stack, prompt: str) -> openai.types.Completion:
    client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)
    return client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt,
                                     max_tokens=16, temperature=0)


def test_a_prefix_computed_on_one_worker_is_loaded_by_another(stack_with_pool, reference):
    first = ask(stack_with_pool, STORY + " Question one: what did he count?")
    assert worker_stats(stack_with_pool, "prefill", "prefill-0").num_requests_done == 1
    time.sleep(1.0)   # the write-back to the pool runs after the first token
    prompt = STORY + " Question two: what answered him?"
    second = ask(stack_with_pool, prompt)
    stats = worker_stats(stack_with_pool, "prefill", "prefill-1")
    assert stats.num_requests_done == 1 and stats.blocks_from_kvstore > 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == stats.blocks_from_kvstore * 16 and cached > 300
    want = reference.generate([reference.tokenizer.encode(prompt)],
                              SamplingParams(max_tokens=16, temperature=0))[0]
    assert second.choices[0].text == want.text
    assert first.usage.prompt_tokens_details.cached_tokens == 0
