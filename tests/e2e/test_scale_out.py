"""Two prefill and two decode workers: same answers, and the work is spread."""
from __future__ import annotations

import concurrent.futures

import openai
import pytest

from shared.engine.sampling_params import SamplingParams
from tests.e2e.conftest import running_stack, worker_stats


@pytest.fixture(scope="module")
def stack_2x2(tmp_path_factory, smollm2_dir):
    with running_stack(tmp_path_factory.mktemp("2x2"), num_prefill=2, num_decode=2) as stack:
        yield stack


def test_two_by_two_answers_equal_generate_and_use_every_worker(stack_2x2, reference) -> None:
    client = openai.OpenAI(base_url=f"{stack_2x2.api_url}/v1", api_key="none", max_retries=0)
    prompts = [f"Count from {n} to {n + 5}." for n in range(8)]
    params = SamplingParams(max_tokens=16, temperature=0)
    wants = [reference.generate([reference.tokenizer.encode_chat(
        [{"role": "user", "content": p}])], params)[0].text for p in prompts]

    def ask(prompt: str) -> str:
        result = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": prompt}],
            max_tokens=16, temperature=0)
        return result.choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(ask, prompts)) == wants
    done = {w: worker_stats(stack_2x2, w.split("-")[0], w).num_requests_done
            for w in ("prefill-0", "prefill-1", "decode-0", "decode-1")}
    assert all(count > 0 for count in done.values()), done
    assert done["prefill-0"] + done["prefill-1"] == len(prompts)
