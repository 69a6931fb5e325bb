"""The workloads every peer runs: one streamed request at a time (prefill rate from its TTFT,
decode rate from its token timestamps), and `loadgen run` at a request rate."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from bench.peers.server import ServerSpec
from loadgen.client import Target, send
from loadgen.datasets import Prompt, TokenSpace
from loadgen.records import RequestRecord
from shared.errors import KvstackError

TEXT = TokenSpace(as_text=True)  # words, about one token each: every server takes text


@dataclass(frozen=True)
class Workloads:
    prefill_len: int = 512
    decode_prompt_len: int = 64
    decode_tokens: int = 128
    rates: tuple[float, ...] = (0.5, 1.0, 2.0)
    serve_prompts: int = 16
    serve_input_len: int = 256
    serve_output_len: int = 64


def text_prompt(num_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    text = TEXT.render(TEXT.draw(rng, num_words))
    assert isinstance(text, str)
    return text


def stream_once(spec: ServerSpec, text: str, max_tokens: int) -> RequestRecord:
    record = asyncio.run(_stream(spec, text, max_tokens))
    if not record.success:
        raise KvstackError(f"{spec.name}: request failed: {record.error}")
    return record


async def _stream(spec: ServerSpec, text: str, max_tokens: int) -> RequestRecord:
    target = Target(
        spec.base_url,
        spec.model,
        api_key=spec.api_key or None,
        extra_body=spec.extra_body,
        request_ids=spec.request_ids,
    )
    prompt = Prompt(0, text, len(text.split()), max_tokens)
    async with aiohttp.ClientSession() as session:
        return await send(session, target, prompt, time.perf_counter())


def prefill_rate(record: RequestRecord) -> float:
    """Prompt tokens (the server's count) over the time to the first token."""
    assert record.ttft is not None
    return record.input_len / record.ttft


def decode_rate(record: RequestRecord) -> float:
    """Tokens after the first (the server's count) over the time from the first to the last:
    1 / TPOT. Not the stream's events: an event may carry several tokens (kvstack's
    --decode-burst streams each burst's together)."""
    assert record.ttft is not None
    if record.output_len <= 1 or record.latency <= record.ttft:
        raise KvstackError("a decode run needs more than one streamed token")
    return (record.output_len - 1) / (record.latency - record.ttft)


def serve(spec: ServerSpec, workloads: Workloads, rate: float, seed: int) -> dict:
    """`loadgen run` against `spec` at `rate` requests/s -> its result's numbers."""
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as scratch:
        result_path = Path(scratch) / "result.json"
        argv = loadgen_argv(spec, workloads, rate, seed, result_path)
        env = {**os.environ, "OPENAI_API_KEY": spec.api_key} if spec.api_key else None
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        if not result_path.is_file():
            raise KvstackError(f"{spec.name}: loadgen run failed:\n{done.stderr[-2000:]}")
        result = json.loads(result_path.read_text())
    return {
        "output_throughput": result["output_throughput"],
        "median_tpot_ms": result.get("median_tpot_ms"),
        "median_ttft_ms": result.get("median_ttft_ms"),
        "completed": result["completed"],
        "failed": result["failed"],
    }


def loadgen_argv(
    spec: ServerSpec, workloads: Workloads, rate: float, seed: int, result_path: Path
) -> list[str]:
    return [
        sys.executable, "-m", "loadgen.cli",
        "run",
        "--base-url", spec.base_url,
        "--model", spec.model,
        "--text-prompts",
        "--extra-body", json.dumps(spec.extra_body),
        "--num-prompts", str(workloads.serve_prompts),
        "--input-len", str(workloads.serve_input_len),
        "--output-len", str(workloads.serve_output_len),
        "--request-rate", str(rate),
        "--seed", str(seed),
        "--output-json", str(result_path),
        "--no-plots",
        "--request-ids" if spec.request_ids else "--no-request-ids",
    ]  # fmt: skip
