"""The prefill -> decode KV stream over the Mooncake Transfer Engine (`--transport mooncake`):
the same answers as over TCP. Skipped where the engine is not installed (extra `rdma`)."""
from __future__ import annotations

import concurrent.futures

import openai
import pytest

from shared.engine.sampling_params import SamplingParams
from shared.transfer import mooncake
from tests.e2e.conftest import WORKER_ARGS, running_stack

pytestmark = pytest.mark.skipif(
    not mooncake.available(), reason="Mooncake Transfer Engine not installed: apt-get install "
    "libibverbs1 librdmacm1; pip install -e '.[rdma]'")


def test_answers_over_mooncake_equal_generate(tmp_path, reference) -> None:
    prompts = [f"Describe {thing} in one sentence." for thing in ("rain", "a fox", "glass")]
    params = SamplingParams(max_tokens=24, temperature=0)
    wants = [reference.generate([reference.tokenizer.encode_chat(
        [{"role": "user", "content": p}])], params)[0].text for p in prompts]
    with running_stack(tmp_path, worker_args=(*WORKER_ARGS, "--transport", "mooncake")) as stack:
        client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)

        def ask(prompt: str) -> str:
            result = client.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": prompt}],
                max_tokens=24, temperature=0)
            return result.choices[0].message.content

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            assert list(pool.map(ask, prompts)) == wants
