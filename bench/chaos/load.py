"""A steady load whose every answer is known: streaming greedy completions back to back
from a few clients, each checked against the reference text and tagged with the fault
phase it ended in. A request ends completed (its text compared), with a clear error (an
HTTP status or an error event in the stream), or hung (no end within the timeout)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import aiohttp
import orjson

from loadgen.client import SSEDecoder, error_message, response_error

ERROR_PAUSE_S = 0.5  # a client's pause after an error before its next request


@dataclass(frozen=True)
class Case:
    prompt: tuple[int, ...]  # token ids
    want: str  # the reference engine's text for it


@dataclass(frozen=True)
class Outcome:
    phase: str  # the phase it ended in
    case: int
    started: float  # time.monotonic()
    ended: float
    text: str = ""
    error: str = ""  # "": no error
    migrations: int = 0
    hung: bool = False
    first_token: float = 0.0  # time.monotonic() of its first text (0: none)
    tokens: int = 0  # completion tokens, from the usage

    @property
    def completed(self) -> bool:
        return not self.error and not self.hung

    @property
    def ttft(self) -> float | None:
        return self.first_token - self.started if self.first_token else None

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first."""
        if not self.first_token or self.tokens < 2:
            return None
        return (self.ended - self.first_token) / (self.tokens - 1)


@dataclass
class _Stream:
    text: str = ""
    error: str = ""
    migrations: int = 0
    done: bool = False
    first_token: float = 0.0
    tokens: int = 0

    def on_data(self, data: str) -> None:
        if data == "[DONE]":
            self.done = True
            return
        event = orjson.loads(data)
        if event.get("error"):
            self.error = f"error event: {error_message(event)}"
        if event.get("usage"):
            self.migrations = event["usage"].get("migrations", 0)
            self.tokens = event["usage"].get("completion_tokens", 0)
        for choice in event.get("choices") or ():
            if choice.get("text") and not self.first_token:
                self.first_token = time.monotonic()
            self.text += choice.get("text") or ""


class SteadyLoad:
    def __init__(
        self,
        base_url: str,
        model: str,
        cases: list[Case],
        max_tokens: int,
        concurrency: int,
        timeout: float,
        api_key: str = "",
    ) -> None:
        self.url = f"{base_url}/v1/completions"
        self.model, self.cases, self.max_tokens = model, cases, max_tokens
        self.concurrency, self.timeout = concurrency, timeout
        self.headers = {
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {api_key}"} if api_key else {}),
        }
        self.phase = "warmup"  # set by the caller as faults come and go
        self.outcomes: list[Outcome] = []
        self.open: dict[int, float] = {}  # requests in flight: their start, by a number
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="steady-load", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No new request; the ones in flight end (each within its timeout)."""
        self._stopping.set()
        self._thread.join(self.timeout + 30)

    async def _run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(self._client(session, i) for i in range(self.concurrency)))

    async def _client(self, session: aiohttp.ClientSession, index: int) -> None:
        n = index
        while not self._stopping.is_set():
            self.open[n] = time.monotonic()
            outcome = await self._one(session, n % len(self.cases))
            del self.open[n]
            self.outcomes.append(outcome)
            if outcome.error:  # e.g. the gateway is restarting: do not spin on refusals
                await asyncio.sleep(ERROR_PAUSE_S)
            n += self.concurrency

    def in_flight(self) -> int:
        """Requests sent and not ended yet."""
        return len(self.open)

    async def _one(self, session: aiohttp.ClientSession, case: int) -> Outcome:
        """One request; it counts in the phase it ended in (the last fault it lived
        through)."""
        started, stream = time.monotonic(), _Stream()
        try:
            await asyncio.wait_for(self._send(session, self.cases[case], stream), self.timeout)
        except TimeoutError:
            return Outcome(self.phase, case, started, time.monotonic(), stream.text, hung=True)
        except (aiohttp.ClientError, OSError) as e:
            stream.error = f"{type(e).__name__}: {e}"
        if not stream.error and not stream.done:
            stream.error = "the stream ended without [DONE]"
        return Outcome(
            self.phase,
            case,
            started,
            time.monotonic(),
            stream.text,
            stream.error,
            stream.migrations,
            first_token=stream.first_token,
            tokens=stream.tokens,
        )

    async def _send(self, session: aiohttp.ClientSession, case: Case, stream: _Stream) -> None:
        body = {
            "model": self.model,
            "prompt": list(case.prompt),
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with session.post(self.url, data=orjson.dumps(body), headers=self.headers) as r:
            if r.status != 200:
                stream.error = await response_error(r)
                return
            decoder = SSEDecoder()
            async for chunk in r.content.iter_any():
                for data in decoder.feed(chunk):
                    stream.on_data(data)
