"""End-to-end fixtures: real nats-server, real service processes, real model."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.stack.stack import Stack, StackConfig
from shared import subjects
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.messages import ConductorStats, StatsRequest, WorkerStats
from shared.sampling_params import SamplingParams

API_KEY = "test-key"
# float32 everywhere, so outputs compare with `kvstack generate --dtype float32` exactly.
WORKER_ARGS = ("--dtype", "float32", "--threads", "1", "--kv-cache-gib", "0.25")
GATEWAY_ARGS = ("--dtype", "float32")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_stack(
    log_dir: Path, before_ready: Callable[[Stack], object] | None = None, **overrides
) -> Iterator[Stack]:
    """A stack started with these StackConfig overrides; `before_ready` may spawn more
    children before it waits for all of them."""
    config = dict(
        port=free_port(),
        worker_args=WORKER_ARGS,
        gateway_args=GATEWAY_ARGS,
        log_dir=log_dir,
        ready_timeout=240,
    )
    stack = Stack(StackConfig(**{**config, **overrides}))
    try:
        stack.start()
        if before_ready is not None:
            before_ready(stack)
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory, smollm2_dir) -> Iterator[Stack]:
    """One prefill and one decode worker behind a gateway that wants an API key."""
    gateway_args = (*GATEWAY_ARGS, "--api-key", API_KEY)
    with running_stack(tmp_path_factory.mktemp("stack-logs"), gateway_args=gateway_args) as s:
        yield s


@pytest.fixture(scope="session")
def reference(smollm2_dir) -> LLMEngine:
    """What `kvstack generate --dtype float32` runs, in this process."""
    return LLMEngine(EngineConfig(dtype="float32", kv_cache_bytes=256 << 20))


def worker_stats(stack: Stack, service: str, worker_id: str, expected: type = WorkerStats):
    async def ask():
        bus = await stack.bus("test-stats")
        try:
            return await bus.request(
                subjects.worker_stats(service, worker_id), StatsRequest(), 5.0, expected=expected
            )
        finally:
            await bus.drain()

    return asyncio.run(ask())


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Polls `condition` until it holds; fails naming `what` after `timeout` seconds (a
    fixed sleep instead races the system on a slow machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def conductor_stats(stack: Stack) -> ConductorStats:
    return asyncio.run(ask_conductor(stack))


def indexed_blocks(stack: Stack) -> int:
    """How many distinct blocks the conductor's prefix index knows a holder of."""
    return conductor_stats(stack).num_indexed_blocks


def pooled_blocks(stack: Stack) -> int:
    """How many distinct blocks the conductor knows a kvstore (or Mooncake Store) holds:
    what it can plan a prefix load from."""
    return conductor_stats(stack).num_pooled_blocks


async def ask_conductor(stack: Stack) -> ConductorStats:
    bus = await stack.bus("test-conductor-stats")
    try:
        return await bus.request(
            subjects.conductor_stats(), StatsRequest(), 5.0, expected=ConductorStats
        )
    finally:
        await bus.drain()


def assert_chats_equal_reference(
    stack: Stack, reference: LLMEngine, prompts: list[str], max_tokens: int
) -> None:
    """All `prompts` as concurrent greedy chat requests: each answer is what the reference
    engine generates for it alone."""
    import openai

    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    wants = [
        reference.generate(
            [reference.info.tokenizer.encode_chat([{"role": "user", "content": p}])], params
        )[0].text
        for p in prompts
    ]
    client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)

    def ask(prompt: str) -> str:
        result = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=0,
        )
        return result.choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(ask, prompts)) == wants
