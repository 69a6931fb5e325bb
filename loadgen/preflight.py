"""Before a run: is the server there, does it take our key, which model does it serve.
Every answer that stops the run is a `KvstackError` that names the URL and what to do."""

from __future__ import annotations

import aiohttp
import orjson

from loadgen.client import Target, response_error
from loadgen.datasets import FIRST_SAFE_TOKEN_ID
from shared.errors import KvstackError

TIMEOUT = aiohttp.ClientTimeout(total=30)


def normalize_base_url(url: str) -> str:
    """`http://host:8000`, with or without a trailing `/` or `/v1`."""
    if not url.startswith(("http://", "https://")):
        raise KvstackError(f"--base-url must start with http:// or https://, got {url!r}")
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


async def served_models(
    session: aiohttp.ClientSession, base_url: str, api_key: str | None
) -> list[str]:
    """GET /v1/models: each model's id, then its root (what `vllm bench serve` reads)."""
    url = f"{base_url}/v1/models"
    try:
        async with session.get(
            url, headers=Target(base_url, "", api_key=api_key).headers(), timeout=TIMEOUT
        ) as response:
            if response.status != 200:
                refuse(url, response.status, await response_error(response))
            body = await response.read()
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        raise KvstackError(
            f"cannot reach the server at {base_url} ({type(e).__name__}: "
            f"{e}); is it running, and is --base-url right?"
        ) from None
    return model_names(body, url)


def refuse(url: str, status: int, error: str) -> None:
    if status in (401, 403):
        raise KvstackError(
            f"{url} refused the API key ({error}); pass the right key with "
            f"--api-key or OPENAI_API_KEY"
        )
    raise KvstackError(f"GET {url} failed ({error}); is this an OpenAI-compatible server?")


def model_names(body: bytes, url: str) -> list[str]:
    try:
        cards = orjson.loads(body)["data"]
        names = [card["id"] for card in cards] + [
            card["root"] for card in cards if card.get("root")
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise KvstackError(
            f"GET {url} did not answer an OpenAI model list ({body[:200]!r})"
        ) from None
    return list(dict.fromkeys(names))


async def resolve_model(session: aiohttp.ClientSession, target: Target, listed: list[str]) -> str:
    """The first listed model when none is given. A name the list lacks may be an alias:
    one 1-token request decides, and a 404 stops the run."""
    if not target.model:
        if not listed:
            raise KvstackError(f"{target.base_url} lists no models; pass --model")
        return listed[0]
    if target.model in listed:
        return target.model
    prompt = "hi" if target.endpoint == "chat" else [FIRST_SAFE_TOKEN_ID]
    async with session.post(
        target.url,
        data=orjson.dumps(target.body(prompt, 1, stream=False)),
        headers=target.headers(),
        timeout=TIMEOUT,
    ) as response:
        if response.status == 404:
            raise KvstackError(
                f"{target.base_url} does not serve model {target.model!r} "
                f"({await response_error(response)}); it lists: "
                f"{', '.join(listed) or 'nothing'}"
            )
    return target.model
