"""Damaged KV on the wire is refused: the request retries or fails clearly, never with
different text."""

from __future__ import annotations

import openai
import pytest

from shared.sampling_params import SamplingParams
from tests.e2e.conftest import free_port, running_stack, worker_stats
from tests.e2e.proxy import CorruptingProxy

MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]


def stack_behind(proxy: CorruptingProxy, data_port: int, log_dir):
    return running_stack(
        log_dir,
        decode_args=(  # NOTE: KV crosses the proxy, as over a network: no shared memory
            "--no-shared-memory",
            "--data-port",
            str(data_port),
            "--advertise-data-addr",
            f"127.0.0.1:{proxy.port}",
        ),
    )


def ask(stack) -> str:
    client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)
    result = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=24, temperature=0
    )
    return result.choices[0].message.content


def test_one_damaged_transfer_is_refused_and_retried_with_the_same_text(tmp_path, reference):
    want = reference.generate(
        [reference.info.tokenizer.encode_chat(MESSAGES)],
        SamplingParams(max_tokens=24, temperature=0),
    )[0].text
    data_port = free_port()
    proxy = CorruptingProxy(data_port, offset=20_000)  # inside the first transfer's payload
    with stack_behind(proxy, data_port, tmp_path) as stack:
        assert ask(stack) == want
        stats = worker_stats(stack, "decode", "decode-0")
    proxy.close()
    assert proxy.num_flipped == 1
    assert stats.num_transfers_refused == 1 and stats.num_reserved == 0


def test_every_transfer_damaged_fails_with_a_clear_error(tmp_path) -> None:
    data_port = free_port()
    proxy = CorruptingProxy(data_port, offset=20_000, every=10_000, connections=100)
    with stack_behind(proxy, data_port, tmp_path) as stack:
        with pytest.raises(openai.APIStatusError) as failure:
            ask(stack)
        stats = worker_stats(stack, "decode", "decode-0")
    proxy.close()
    assert failure.value.status_code == 503
    assert "KV transfer failed" in failure.value.message
    assert stats.num_transfers_refused >= 1 and stats.num_running == 0
    assert stats.free_blocks == stats.total_blocks  # nothing leaked


def test_a_stream_whose_decode_worker_dies_with_no_other_left_ends_with_an_error_event(tmp_path):
    """Migration needs somewhere to go: with the only decode worker dead (and nothing
    restarting it) the stream ends with a clear error event after --placement-wait."""
    import http.client
    import json
    import signal
    import time

    gateway_args = ("--dtype", "float32", "--placement-wait", "2")
    with running_stack(tmp_path, gateway_args=gateway_args) as stack:
        host, port = stack.api_url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        body = {
            "model": "SmolLM2-135M-Instruct",
            "prompt": "Once upon a time",
            "stream": True,
            "max_tokens": 2000,
            "ignore_eos": True,
            "temperature": 0,
        }
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: {")
        decode = next(p for p in stack.processes if p.name == "decode-0")
        decode.popen.send_signal(signal.SIGKILL)
        started = time.monotonic()
        events = [line for line in response.read().split(b"\n") if line.startswith(b"data: ")]
        assert time.monotonic() - started < 15
        assert events[-1] == b"data: [DONE]"
        error = json.loads(events[-2].removeprefix(b"data: "))["error"]
        assert "no decode worker available" in error["message"]
        assert error["type"] == "service_unavailable_error"
        stack.processes.remove(decode)
