"""What a served request spends outside the engine before its first token: HTTP, placement,
dispatch and KV commit over the bus, the token's relay. Measured on a running stack: short
prompts timed at its gateway, minus what the cost model predicts for their prefill. Being
measured against the fit, it also takes in what the fit misses for short prompts served
by the stack (workers busier, or the machine slower, than while the engine was profiled)."""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from shared.costmodel.fitted import FittedCostModel
from shared.errors import KvstackError


def check_gateway(api_url: str) -> None:
    """Fail now, not after minutes of measuring, when the gateway does not answer."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=5):
            pass
    except (OSError, ValueError) as e:
        raise KvstackError(f"cannot reach the gateway at {api_url}: {e}") from None


def first_token_seconds(
    api_url: str, prompt_ids: Sequence[int], api_key: str = "", timeout: float = 120.0
) -> float:
    """Seconds from sending a streaming completion of `prompt_ids` to its first token."""
    request = _completion(api_url, prompt_ids, api_key)
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for line in response:
                if _has_token(line):
                    return time.perf_counter() - start
    except urllib.error.HTTPError as e:
        raise KvstackError(f"{api_url} answered {e.code}: {e.read()[:200]!r}") from None
    except OSError as e:
        raise KvstackError(f"cannot reach the gateway at {api_url}: {e}") from None
    raise KvstackError(f"{api_url} ended the stream without a token")


def _completion(api_url: str, prompt_ids: Sequence[int], api_key: str) -> urllib.request.Request:
    body = json.dumps(
        {"prompt": list(prompt_ids), "max_tokens": 1, "temperature": 0, "stream": True}
    ).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return urllib.request.Request(f"{api_url.rstrip('/')}/v1/completions", body, headers)


def _has_token(line: bytes) -> bool:
    """Whether an SSE line is an event carrying a choice (the first token's)."""
    if not line.startswith(b"data: {"):
        return False
    event = json.loads(line[len(b"data: ") :])
    if "error" in event:
        raise KvstackError(f"the gateway failed the request: {event['error']}")
    return bool(event.get("choices"))


def request_overhead(
    cost: FittedCostModel, api_url: str, prompts: Sequence[Sequence[int]], api_key: str = ""
) -> float:
    """Median over `prompts`, sent one at a time after a first one that warms the stack up,
    of measured TTFT minus predicted prefill (the prompts must not share a prefix)."""
    first_token_seconds(api_url, prompts[0], api_key)
    gaps = [
        first_token_seconds(api_url, p, api_key) - cost.prefill_time(len(p), 0) for p in prompts[1:]
    ]
    return max(0.0, statistics.median(gaps))
