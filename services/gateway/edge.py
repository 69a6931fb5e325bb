"""The gateway's public HTTP edge: what holds before any route runs.

- Header deadline (slowloris): aiohttp arms a connection's keep-alive timer when the
  connection opens and again after each response, and when it fires on a connection still
  waiting for a complete request head, it closes it (`RequestHandler.connection_made` and
  `_process_keepalive` in aiohttp 3.14; data arriving does not push it back). So
  `keepalive_timeout = read_timeout` is the header timeout: the request line and headers
  must be in within `read_timeout` of the connection opening or of the previous response.
  An idle keep-alive connection is closed after the same time.
- Body deadline: `body.read_body`, in the routes that read one.
- Header limits: aiohttp's parser counts the request line and each header field in bytes
  and the headers in number; past a limit the request is answered 431.
- Protocol errors (those limits, malformed HTTP, an encoding aiohttp cannot decode) are
  answered as OpenAI error objects instead of aiohttp's text/plain.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from services.gateway import errors
from services.gateway.body import SUPPORTED_ENCODINGS
from services.gateway.errors import ApiError, error_body
from shared.errors import KvstackError

log = logging.getLogger("kvstack.gateway")


@dataclass(frozen=True)
class EdgeConfig:
    read_timeout: float = 30.0  # seconds for a request's head, and then for its body
    max_line_bytes: int = 8190  # the request line (method, path, query)
    max_field_bytes: int = 8190  # one header, name and value
    max_headers: int = 100
    max_concurrent_per_key: int = 0  # generation requests in flight per API key; 0: no limit
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call; empty: CORS off

    def __post_init__(self) -> None:
        if not self.read_timeout > 0:  # NaN too
            raise KvstackError(f"--read-timeout must be positive, got {self.read_timeout}")
        if self.max_concurrent_per_key < 0:
            raise KvstackError(
                f"--max-concurrent-per-key must not be negative, got {self.max_concurrent_per_key}"
            )

    def handler_args(self) -> dict:
        """aiohttp's per-connection settings (`RequestHandler`'s keyword arguments)."""
        return dict(
            keepalive_timeout=self.read_timeout,
            max_line_size=self.max_line_bytes,
            max_field_size=self.max_field_bytes,
            max_headers=self.max_headers,
        )


def edge_runner(app: web.Application, edge: EdgeConfig) -> web.AppRunner:
    return EdgeRunner(app, handler_cancellation=True, access_log=None, **edge.handler_args())


class EdgeRunner(web.AppRunner):
    """aiohttp's AppRunner whose connections are `EdgeRequestHandler`s."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # NOTE: aiohttp builds the Server inside Application._make_handler; only the
        # protocol class it makes per connection changes, so nothing else is copied.
        server.__class__ = EdgeServer
        return server


class EdgeServer(web.Server):
    def __call__(self) -> RequestHandler:
        return EdgeRequestHandler(self, loop=self._loop, **self._kwargs)


class EdgeRequestHandler(RequestHandler):
    """aiohttp's connection protocol, answering what fails before a route as OpenAI errors."""

    def handle_error(
        self,
        request,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # too late for an answer; aiohttp closes it
            return super().handle_error(request, status, exc, message)
        error = protocol_error(status, exc, message)
        if error.status >= 500:
            log.error("error before any route on %s", request.remote, exc_info=exc)
        else:
            log.debug("refused a request from %s: %s", request.remote, error.message)
        response = web.json_response(error_body(error), status=error.status, headers=error.headers)
        response.force_close()
        return response


def protocol_error(status: int, exc: BaseException | None, message: str | None) -> ApiError:
    """The OpenAI error for what aiohttp reports before a route runs."""
    if isinstance(exc, LineTooLong) or (
        isinstance(exc, HttpProcessingError) and "Too many headers" in exc.message
    ):
        return errors.headers_too_large(exc.message)
    if isinstance(exc, ContentEncodingError):  # e.g. br without Brotli installed
        return errors.unsupported_encoding(SUPPORTED_ENCODINGS)
    if isinstance(exc, HttpProcessingError) and status < 500:
        return errors.bad_http(exc.message)
    if status < 500:
        return errors.bad_http(message or "the request could not be parsed")
    return ApiError(
        status, "server_error", "The server had an error before the request reached a route."
    )
