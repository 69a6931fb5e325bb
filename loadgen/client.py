"""One streamed request to an OpenAI-compatible endpoint -> its `RequestRecord`.

Measured as `vllm bench serve` measures:
- a token event is an SSE event whose `choices` carry text (completions `text`, chat
  `delta.content`); role-only or empty chunks are not tokens;
- TTFT: the first token event - send time; ITL: gaps between successive token events;
  E2EL: the last token event - send time (the usage chunk does not extend it);
- token counts from the final usage chunk (`stream_options.include_usage`), else the
  number of token events;
- a request failed when the status is not 200, the stream carried an error event, or no
  token came; one whose connection closed before any response byte is sent once more on a
  fresh connection first (see `send`).
"""

from __future__ import annotations

import codecs
import re
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from loadgen.datasets import Prompt
from loadgen.records import RequestRecord

_EVENT_END = re.compile(r"\r?\n\r?\n")
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # token-id prompts are int32 arrays


@dataclass(frozen=True)
class Target:
    """Where and how requests go."""

    base_url: str  # e.g. http://127.0.0.1:8000 (no /v1)
    model: str
    endpoint: str = "completions"  # or "chat"
    api_key: str | None = None
    ignore_eos: bool = True
    # NOTE: fields a server needs beyond the OpenAI API's, merged into every body last
    # (e.g. llama-cpp-python ignores `ignore_eos` but takes `min_tokens`).
    extra_body: dict = field(default_factory=dict)
    # NOTE: llama-cpp-python answers 400 to an x-request-id that is not a UUID.
    request_ids: bool = True  # send x-request-id: loadgen-<index>

    @property
    def url(self) -> str:
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        return f"{self.base_url}/v1/{path}"

    def headers(self, index: int | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if index is not None and self.request_ids:
            headers["x-request-id"] = f"loadgen-{index}"
        return headers

    def body(self, prompt, max_tokens: int, stream: bool = True) -> dict:
        """`prompt`: token ids (a list or an int array) or text."""
        body = {
            "model": self.model,
            "temperature": 0.0,
            "stream": stream,
            "ignore_eos": self.ignore_eos,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.endpoint == "chat":
            body.update(
                messages=[{"role": "user", "content": prompt}], max_completion_tokens=max_tokens
            )
        else:
            body.update(prompt=prompt, max_tokens=max_tokens)
        body.update(self.extra_body)
        return body


class SSEDecoder:
    """Bytes in, the `data:` payloads of the complete events out (comment lines skipped).
    UTF-8 sequences and events split across network chunks are put back together."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._pending = ""

    def feed(self, chunk: bytes) -> list[str]:
        self._pending += self._utf8.decode(chunk)
        *events, self._pending = _EVENT_END.split(self._pending)
        return [data for event in events if (data := event_data(event)) is not None]


def event_data(event: str) -> str | None:
    """The event's data lines joined by newlines (the SSE rule), None if it has none."""
    lines = [line[5:].removeprefix(" ") for line in event.splitlines() if line.startswith("data:")]
    return "\n".join(lines) if lines else None


@dataclass
class StreamClock:
    """What one stream has shown so far; times are `time.perf_counter()` readings."""

    sent: float
    first: float | None = None
    last: float | None = None
    itl: list[float] = field(default_factory=list)
    num_token_events: int = 0
    usage: dict | None = None
    error: str = ""
    done: bool = False

    def on_data(self, data: str, now: float) -> None:
        if data == "[DONE]":
            self.done = True
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.error = f"not a JSON event: {data[:200]!r}"
            return
        if isinstance(event, dict):
            self.on_event(event, now)

    def on_event(self, event: dict, now: float) -> None:
        if event.get("error"):
            self.error = f"error event in the stream: {error_message(event)}"
        if event.get("usage"):
            self.usage = event["usage"]
        if carries_text(event.get("choices")):
            self._token(now)

    def _token(self, now: float) -> None:
        last = self.last  # set with `first`, by the first token
        if last is None:
            self.first = now
        else:
            self.itl.append(now - last)
        self.last = now
        self.num_token_events += 1

    def record(
        self, prompt: Prompt, start_time: float, queue_time: float, status: int, ended: float
    ) -> RequestRecord:
        """`start_time` is from the run's start; `ended` when the stream stopped."""
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        error = self.error or ("" if self.first is not None else "no token in the response")
        return RequestRecord(
            index=prompt.index,
            start_time=start_time,
            input_len=usage.get("prompt_tokens") or prompt.input_len,
            output_len=usage.get("completion_tokens") or self.num_token_events,
            ttft=None if self.first is None else self.first - self.sent,
            itl=tuple(self.itl),
            latency=(self.last or ended) - self.sent,
            status=status,
            error=error,
            queue_time=queue_time,
            cached_tokens=details.get("cached_tokens") or 0,
        )


def carries_text(choices) -> bool:
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    delta = choice.get("delta") or {}
    return bool(choice.get("text") or delta.get("content") or delta.get("reasoning_content"))


def error_message(body) -> str:
    """OpenAI's {"error": {"message": ...}} (or a bare string) as one line."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error if error is not None else body)[:300]


async def response_error(response: aiohttp.ClientResponse) -> str:
    """`HTTP 503: <the server's message>`."""
    raw = await response.read()
    try:
        message = error_message(orjson.loads(raw))
    except orjson.JSONDecodeError:
        message = raw.decode("utf-8", "replace").strip()[:300] or (response.reason or "")
    return f"HTTP {response.status}: {message}"


async def send(
    session: aiohttp.ClientSession,
    target: Target,
    prompt: Prompt,
    run_start: float,
    queue_time: float = 0.0,
) -> RequestRecord:
    """One streamed request; never raises for the server's or the network's failures.

    NOTE: a server closes a keep-alive connection that sat idle past its timeout (uvicorn,
    behind llama-server and vLLM: 5 s); if the pool hands that connection out as the close
    arrives, the request fails before any byte of a response ("Can not write request
    body", "Server disconnected"). That is the client's race, not the server's failure, so
    such a request is sent once more on a fresh connection and measured from there. A
    stream that broke after its response began is the server's error and is not resent."""
    data = encode(target, prompt)  # before the clock starts
    attempt = await post(session, target, prompt, data)
    if attempt.dropped_before_response:
        async with fresh_connection_session(session) as fresh:
            attempt = await post(fresh, target, prompt, data)
    clock = attempt.clock
    return clock.record(prompt, clock.sent - run_start, queue_time, attempt.status, attempt.ended)


@dataclass(frozen=True)
class Attempt:
    clock: StreamClock
    status: int  # 0: no response came
    ended: float  # when the stream stopped
    dropped_before_response: bool = False  # the connection closed before any response byte


async def post(
    session: aiohttp.ClientSession, target: Target, prompt: Prompt, data: bytes
) -> Attempt:
    clock = StreamClock(time.perf_counter())
    status = 0
    dropped = False
    try:
        async with session.post(
            target.url, data=data, headers=target.headers(prompt.index)
        ) as response:
            status = response.status
            if status != 200:
                clock.error = await response_error(response)
            else:
                await read_stream(response, clock)
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        clock.error = f"{type(e).__name__}: {e}"
        dropped = status == 0 and is_dropped_connection(e)
    return Attempt(clock, status, time.perf_counter(), dropped)


def is_dropped_connection(error: BaseException) -> bool:
    """An open connection the peer closed or reset; not a refused or failed connect."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return False
    return isinstance(
        error,
        aiohttp.ServerDisconnectedError
        | aiohttp.ClientOSError
        | ConnectionResetError
        | BrokenPipeError,
    )


def fresh_connection_session(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """A one-request session whose connection is new and is not pooled afterwards."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), timeout=session.timeout
    )


def encode(target: Target, prompt: Prompt) -> bytes:
    return orjson.dumps(target.body(prompt.prompt, prompt.output_len), option=_JSON_OPTIONS)


async def read_stream(response: aiohttp.ClientResponse, clock: StreamClock) -> None:
    decoder = SSEDecoder()
    async for chunk in response.content.iter_any():
        now = time.perf_counter()
        for data in decoder.feed(chunk):
            clock.on_data(data, now)
        if clock.done:
            return
