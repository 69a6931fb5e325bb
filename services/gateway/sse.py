"""Server-sent events framing for streamed replies: `data: <json>\\n\\n`, then `[DONE]`."""

from __future__ import annotations

import orjson

from services.gateway.errors import ApiError, error_body

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SSE_DONE = b"data: [DONE]\n\n"
# A comment line: clients skip it; writing it notices a client that has gone away.
SSE_KEEPALIVE = b": keepalive\n\n"


def sse_event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_error(err: ApiError) -> bytes:
    """An error in a stream whose 200 status is already sent; follow it with SSE_DONE."""
    return sse_event(error_body(err))
