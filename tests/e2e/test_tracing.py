"""A real stack of mock workers started with --otlp-endpoint, pointed at a stand-in OTLP
collector: one chat request is one trace, with a span from each of the gateway, the
conductor, the prefill and the decode worker, linked parent to child as the request
travelled."""

from __future__ import annotations

import openai
import pytest

from shared.engine.mock import MockSpec
from tests.e2e.conftest import running_stack
from tests.otlp_collector import Collector, ReceivedSpan

SPEC = MockSpec("llama3-70b", "a800", 1e-3)
MAX_TOKENS = 5
SERVICE_OF = {
    "gateway.request": "kvstack-gateway",
    "conductor.place": "kvstack-conductor",
    "prefill.request": "kvstack-prefill",
    "decode.request": "kvstack-decode",
}


@pytest.fixture(scope="module")
def collector():
    collector = Collector()
    yield collector
    collector.close()


@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory, smollm2_dir, collector):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
        with running_stack(
            tmp_path_factory.mktemp("traced"),
            mock=SPEC,
            worker_args=("--threads", "1", "--kv-cache-gib", "0.02"),
            gateway_args=(),
            otlp_endpoint=collector.url,
        ) as stack:
            yield stack


def one_trace_of_each(spans: list[ReceivedSpan]) -> bool:
    return {span.name for span in spans} >= set(SERVICE_OF)


def test_a_chat_request_is_one_trace_across_the_services(traced_stack, collector) -> None:
    client = openai.OpenAI(base_url=f"{traced_stack.api_url}/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=MAX_TOKENS,
        extra_body={"ignore_eos": True},
    )
    spans = collector.wait_for(one_trace_of_each)
    assert sorted(span.name for span in spans) == sorted(SERVICE_OF)  # nothing else traced
    got = {span.name: span for span in spans}
    assert {name: span.service for name, span in got.items()} == SERVICE_OF
    assert len({span.trace_id for span in got.values()}) == 1
    gateway, conductor = got["gateway.request"], got["conductor.place"]
    prefill, decode = got["prefill.request"], got["decode.request"]
    assert gateway.parent_id == ""
    assert conductor.parent_id == gateway.span_id
    assert prefill.parent_id == gateway.span_id
    assert decode.parent_id == prefill.span_id
    assert not any(span.failed for span in got.values())

    prompt_tokens = reply.usage.prompt_tokens
    assert gateway.attributes["gen_ai.usage.input_tokens"] == prompt_tokens
    assert gateway.attributes["gen_ai.request.choice.count"] == 1
    assert gateway.attributes["gen_ai.usage.output_tokens"] == MAX_TOKENS
    assert gateway.attributes["gen_ai.request.model"] == "SmolLM2-135M-Instruct"
    assert conductor.attributes["kvstack.prefill_id"] == "prefill-0"
    assert conductor.attributes["kvstack.decode_id"] == "decode-0"
    assert conductor.attributes["kvstack.predicted_ttft_s"] > 0
    cached = prefill.attributes["kvstack.cached_tokens"]
    assert cached + prefill.attributes["kvstack.computed_tokens"] == prompt_tokens
    # the attempt's id on the workers; the decode worker made every token but the first
    assert prefill.attributes["kvstack.request_id"] == decode.attributes["kvstack.request_id"]
    assert decode.attributes["gen_ai.usage.output_tokens"] == MAX_TOKENS
