"""The disaggregated stack with its prefill and decode workers on a GPU: the prompt's KV
leaves the prefill worker's GPU through its host mirror, crosses the data plane and lands
on the decode worker's GPU; the answers equal one engine's on the same GPU. Offloaded
(Lamina's heterogeneous case), the KV goes to attention workers on the CPU instead, which
compute every layer's attention for the decode worker on the GPU. Skipped, saying why,
where torch sees no GPU (make test-gpu)."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request

import pytest

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.sampling_params import SamplingParams
from tests.conftest import make_served_model
from tests.e2e.conftest import API_KEY, GATEWAY_ARGS, WORKER_ARGS, running_stack
from tests.e2e.test_offload import OFFLOAD, attention_stats

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_served_model(tmp_path_factory.mktemp("gpu-stack-model"))


@pytest.fixture(scope="module", params=[0, 2], ids=["local", "offloaded"])
def stack(request, tmp_path_factory, model_dir):
    offload = dict(num_attention=request.param, **OFFLOAD) if request.param else {}
    with running_stack(
        tmp_path_factory.mktemp("gpu-stack"),
        model=str(model_dir),
        worker_args=WORKER_ARGS,
        worker_devices=("cuda:0",),  # what `kvstack up --gpus 0` gives them
        gateway_args=(*GATEWAY_ARGS, "--api-key", API_KEY),
        **offload,
    ) as s:
        yield s


def test_prefill_and_decode_on_the_gpu_answer_as_one_engine(stack, model_dir) -> None:
    reference = LLMEngine(EngineConfig(model=str(model_dir), device="cuda", dtype="float32"))
    prompts = [[5 + i, 40, 77 + i, 120, 9, 33 + 2 * i] * (3 + i) for i in range(4)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want = reference.generate(prompts, params)

    def complete(prompt) -> dict:
        body = dict(model=str(model_dir), prompt=prompt, max_tokens=12, temperature=0)
        request = urllib.request.Request(
            f"{stack.api_url}/v1/completions",
            data=json.dumps({**body, "ignore_eos": True}).encode(),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(complete, prompts))
    for result, completion in zip(results, want):
        assert result["usage"]["completion_tokens"] == 12
        assert result["choices"][0]["text"] == completion.text
    for i in range(stack.config.num_attention):  # the attention ran there, on the CPU
        stats = attention_stats(stack, f"attention-0-{i}")
        assert stats.kv_bytes_received > 0 and stats.num_attention_calls > 0
