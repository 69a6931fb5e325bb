"""Reading a request body at the edge: its encoding, its deadline, its decoding."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from services.gateway import errors

# What aiohttp decodes with the standard library alone; brotli and zstd need optional
# packages, so they are refused everywhere rather than accepted where those happen to be.
SUPPORTED_ENCODINGS = ("identity", "gzip", "deflate")


async def read_body(request: web.Request, timeout: float) -> bytes:
    """The decoded body: 415 for an encoding not supported, 400 for a body that does not
    decode, 408 when it has not arrived within `timeout` seconds (413 comes from aiohttp)."""
    check_encoding(request.headers.get("Content-Encoding", ""))
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        raise errors.read_timeout(timeout) from None
    except RequestPayloadError as exc:  # a broken gzip stream, a bad chunk, a cut body
        raise errors.undecodable_body(_reason(exc)) from None


def check_encoding(header: str) -> None:
    encoding = header.strip().lower()
    if encoding and encoding not in SUPPORTED_ENCODINGS:
        raise errors.unsupported_encoding(SUPPORTED_ENCODINGS, header.strip())


def _reason(exc: RequestPayloadError) -> str:
    cause = exc.__cause__
    return cause.message if isinstance(cause, HttpProcessingError) else str(exc)
