"""Attention offloaded to attention workers (Lamina), through the whole stack: prefill sends
each shard its KV heads, the decode worker sends q, k, v per layer, outputs match local
decode, and a dead attention worker's requests are rebuilt and go on."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time

import pytest

from services.stack.restarts import RestartPolicy
from shared.errors import KvstackError
from shared.messages import AttentionStats
from shared.sampling_params import SamplingParams
from tests.e2e.conftest import assert_chats_equal_reference, running_stack, worker_stats

# Attention workers sized like the other workers (WORKER_ARGS): one thread, a small pool.
OFFLOAD = dict(num_kvstore=0, attention_args=("--threads", "1", "--kv-cache-gib", "0.25"))
PROMPTS = [
    "What is the capital of France?",
    "Count from one to five.",
    "Name a colour of the sky.",
    "Write one word about the sea.",
]


def attention_stats(stack, worker_id: str) -> AttentionStats:
    return worker_stats(stack, "attention-worker", worker_id, expected=AttentionStats)


def test_offloaded_outputs_equal_local_decode(tmp_path, reference):
    """One attention worker, supervised: outputs equal local decode, and the worker restarted
    while idle is attached again. (A group of 3: the dead-worker test below checks it first.)"""
    supervised = RestartPolicy(first_backoff=0.2)
    with running_stack(tmp_path, num_attention=1, **OFFLOAD, restart=supervised) as stack:
        assert_offloaded_chats_equal_reference(stack, reference, group_size=1)
        _restart_while_idle(stack, reference)


def assert_offloaded_chats_equal_reference(stack, reference, group_size: int) -> None:
    """Chats equal local decode; each of the group's workers held its share of KV heads and
    freed it when the requests finished."""
    assert_chats_equal_reference(stack, reference, PROMPTS, max_tokens=24)
    heads = []
    for i in range(group_size):
        stats = attention_stats(stack, f"attention-0-{i}")
        assert stats.decode_id == "decode-0"
        assert stats.kv_bytes_received > 0  # prefill sent this shard its heads
        assert stats.num_attention_calls > 0
        assert stats.num_requests == 0 and stats.used_blocks == 0  # freed on finish
        heads.append(stats.kv_heads)
    assert heads == [(i * 3 // group_size, (i + 1) * 3 // group_size) for i in range(group_size)]


def _restart_while_idle(stack, reference) -> None:
    """An attention worker restarted while its decode worker is idle comes back empty and
    unattached: its decode worker sees the new process beat and attaches it again."""
    os.killpg(stack.process("attention-0-0").popen.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (
        attention_stats_or_none(stack, "attention-0-0") is None
        or attention_stats(stack, "attention-0-0").decode_id != "decode-0"
    ):
        assert time.monotonic() < deadline, "the restarted attention worker was not attached"
        time.sleep(0.3)
    assert stack.restarts("attention-0-0") == 1
    assert_chats_equal_reference(stack, reference, PROMPTS[:2], max_tokens=24)


def attention_stats_or_none(stack, worker_id: str) -> AttentionStats | None:
    try:
        return attention_stats(stack, worker_id)
    except Exception:
        return None


def test_a_group_that_does_not_divide_the_kv_heads_is_refused_clearly(tmp_path):
    with (
        pytest.raises(KvstackError, match="cannot split 3 KV heads evenly"),
        running_stack(
            tmp_path,
            num_attention=2,
            **OFFLOAD,
            with_gateway=False,
            with_conductor=False,
            num_prefill=0,
        ),
    ):
        pass


def test_a_dead_attention_worker_is_rebuilt_and_the_stream_goes_on(tmp_path, reference):
    prompt, max_tokens = "Once upon a time", 96
    want = reference.generate(
        [reference.info.tokenizer.encode(prompt)],
        SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
    )[0].text
    with running_stack(tmp_path, num_attention=3, **OFFLOAD) as stack:
        # NOTE: the group of 3 whole first (its own stack took some 12 s of the suite)
        assert_offloaded_chats_equal_reference(stack, reference, group_size=3)
        response = _stream(stack, prompt, max_tokens)
        pieces = [_next_text(response) for _ in range(8)]
        victim = next(p for p in stack.processes if p.name == "attention-0-1")
        victim.popen.send_signal(signal.SIGKILL)
        stack.processes.remove(victim)
        while (piece := _next_text(response)) is not None:
            pieces.append(piece)
        assert "".join(pieces) == want  # no token lost or repeated across the rebuild
        survivor = attention_stats(stack, "attention-0-0")
        assert survivor.kv_heads == (0, 3)  # the group re-formed as one worker with all heads
        # 3 KV heads do not split over the 2 left: the one left out holds nothing any more
        left_out = attention_stats(stack, "attention-0-2")
        assert left_out.decode_id == "" and left_out.num_requests == 0


def _stream(stack, prompt: str, max_tokens: int):
    host, port = stack.api_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": prompt,
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    return response


def _next_text(response) -> str | None:
    """The text of the next SSE event; None at [DONE]."""
    while line := response.readline():
        if not line.startswith(b"data: "):
            continue
        data = line.removeprefix(b"data: ").strip()
        if data == b"[DONE]":
            return None
        event = json.loads(data)
        assert "error" not in event, event
        return event["choices"][0]["text"]
    return None
