"""The OpenAI-compatible HTTP routes of the gateway (aiohttp)."""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import os
import time
import uuid
from collections import defaultdict

from aiohttp import web

from services.gateway import errors
from services.gateway.body import read_body
from services.gateway.choices import Answer, Choices
from services.gateway.concurrency import PerKeyLimit
from services.gateway.cors import Cors
from services.gateway.errors import ApiError, error_body
from services.gateway.fields import decode_body
from services.gateway.grammar_check import GrammarCheck
from services.gateway.model_routes import KEYED_PATHS, ModelRoutes
from services.gateway.openapi import OPENAPI
from services.gateway.protocol import GenerateRequest, parse_chat, parse_completion
from services.gateway.responses import (
    choice,
    choices_response,
    delta_chunk,
    format_logprobs,
    stream_chunk,
    usage_chunk,
)
from services.gateway.sse import SSE_DONE, SSE_HEADERS, sse_error, sse_event
from services.gateway.tool_replies import StreamedReply, whole_reply
from shared.runtime import tracing

log = logging.getLogger("kvstack.gateway")
_counter = itertools.count()


class GatewayApp:
    """Routes and middlewares; `service` supplies tokenizer, limits, backend and metrics."""

    def __init__(self, service) -> None:
        self.service = service
        self.created = int(time.time())
        edge = service.config.edge
        self.per_key = PerKeyLimit(edge.max_concurrent_per_key)
        self.cors = Cors(edge.cors_origins) if edge.cors_origins else None
        self.grammars = GrammarCheck(service.tokenizer)
        self.model_routes = ModelRoutes(service, self.created)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat),
            *self.model_routes.routes(),
            web.get("/openapi.json", self.openapi),
        ]

    def middlewares(self) -> list:
        cors = [self.cors.preflight_middleware] if self.cors else []
        return [*cors, self.errors_middleware, self.auth_middleware]

    def on_response_prepare(self) -> list:
        """Signal handlers run right before any response's headers go out."""
        return [self.cors.on_response_prepare] if self.cors else []

    # -- middlewares ------------------------------------------------------------------

    @web.middleware
    async def errors_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            if e.close_connection:
                return await self._error_and_close(request, e)
            return self._error_response(e)
        except web.HTTPRequestEntityTooLarge:
            return self._error_response(errors.body_too_large(self.service.limits.max_body_bytes))
        except web.HTTPNotFound:
            return self._error_response(errors.route_not_found(request.method, request.path))
        except web.HTTPMethodNotAllowed as e:
            return self._error_response(
                errors.method_not_allowed(request.method, request.path, e.allowed_methods)
            )
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:  # a bug: the client still gets an OpenAI error object
            log.exception("unhandled error on %s %s", request.method, request.path)
            return self._error_response(errors.internal_error())

    @web.middleware
    async def auth_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        key = self.service.config.api_key
        bearer = request.headers.get("Authorization", "")
        keyed = request.path.startswith("/v1/") or request.path in KEYED_PATHS
        if key and keyed and not _same(bearer, f"Bearer {key}"):
            raise errors.authentication_failed()
        return await handler(request)

    def _error_response(self, e: ApiError) -> web.Response:
        self.service.count_request(e.status)
        return web.json_response(error_body(e), status=e.status, headers=e.headers)

    async def _error_and_close(self, request: web.Request, e: ApiError) -> web.Response:
        """The error, then the connection closes at once: aiohttp would otherwise linger
        to read the rest of a body that is stalled or does not decode."""
        response = self._error_response(e)
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()
        return response

    # -- routes -------------------------------------------------------------------------

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_completion)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_chat)

    async def _generate(self, request: web.Request, parse) -> web.StreamResponse:
        if self.service.draining:
            raise errors.service_unavailable(
                "the gateway is shutting down; retry on another", retry_after_s=1
            )
        # NOTE: the request's root span: the messages sent inside it carry it to the workers
        with (
            self.per_key.hold(request.headers.get("Authorization", "")),
            tracing.span("gateway.request", {"http.route": request.path}) as span,
        ):
            return await self._read_and_generate(request, parse, span)

    async def _read_and_generate(
        self, request: web.Request, parse, span: tracing.Span
    ) -> web.StreamResponse:
        raw = await read_body(request, self.service.config.edge.read_timeout)
        body = decode_body(raw, self.service.limits)
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        req = parse(
            body,
            self.service.tokenizer,
            self.service.limits,
            self.service.served_model,
            _internal_id(request_id),
            self.service.model_aliases,
        )
        span.set_attributes(_span_attributes(req))
        await self.grammars.check(req)
        choices = Choices.of(req, self.service.tokenizer, self.service.backend)
        self.service.begin()
        try:
            if req.stream:
                return await self._stream(request, req, choices)
            return await self._complete(req, choices)
        finally:
            self.service.end(choices.relays)
            outputs = sum(relay.num_output_tokens for relay in choices.relays)
            span.set_attribute("gen_ai.usage.output_tokens", outputs)

    async def _complete(self, req: GenerateRequest, choices: Choices) -> web.Response:
        answers = await choices.answers()
        bodies = [self._choice(req, answer) for answer in answers]
        self.service.count_request(200)
        token_usage = choices.usage([a.source for a in answers])
        return web.json_response(choices_response(req, bodies, token_usage))

    def _choice(self, req: GenerateRequest, answer: Answer) -> dict:
        logprobs = format_logprobs(req, self.service.tokenizer, answer.entries or None)
        text, finish = (req.echo or "") + answer.text, answer.finish_reason
        message = None
        if req.tools is not None:
            message, finish = whole_reply(text, finish)
        return choice(req, answer.index, text, finish, logprobs, message)

    async def _stream(
        self, request: web.Request, req: GenerateRequest, choices: Choices
    ) -> web.StreamResponse:
        pieces = choices.pieces()
        try:
            first = await anext(pieces)  # errors before the first token keep their status
        except StopAsyncIteration:
            raise errors.internal_error("the request ended without a token") from None
        response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await response.prepare(request)
        self.service.count_request(200)
        try:
            await self._write_stream(response, req, choices, first, pieces)
        except ConnectionResetError:  # the client left; its request is aborted below
            log.info("request %s: the client went away mid-stream", req.request_id)
        finally:
            await pieces.aclose()
        return response

    async def _write_stream(
        self, response: web.StreamResponse, req: GenerateRequest, choices: Choices, first, pieces
    ) -> None:
        """Chunks, then usage and [DONE]; once the status line is out, any error travels
        in the stream as an error event (never a second HTTP response inside it)."""
        started: set[int] = set()  # choices with a chunk sent
        replies: dict[int, StreamedReply] = defaultdict(StreamedReply)  # with tools

        async def write(index: int, piece) -> None:
            if req.tools is None:
                await response.write(sse_event(self._chunk(req, piece, index, started)))
                return
            for chunk in self._tool_chunks(req, piece, index, started, replies[index]):
                await response.write(sse_event(chunk))

        try:
            await write(*first)
            async for index, piece in pieces:
                await write(index, piece)
            if req.include_usage:
                await response.write(sse_event(usage_chunk(req, choices.usage())))
        except ApiError as e:
            await response.write(sse_error(e))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:  # a bug: still a clear end of the stream
            log.exception("request %s failed mid-stream", req.request_id)
            await response.write(sse_error(errors.internal_error()))
        await response.write(SSE_DONE)

    @staticmethod
    def _chunk(req: GenerateRequest, piece, index: int, started: set[int]) -> dict:
        """A choice's first chunk carries the echoed prompt (and, in chat, the role)."""
        first = _opens(started, index)
        text = (req.echo or "") + piece.text if first else piece.text
        return stream_chunk(
            req,
            text,
            first=first,
            logprobs=piece.logprobs,
            finish_reason=piece.finish_reason,
            index=index,
        )

    @staticmethod
    def _tool_chunks(
        req: GenerateRequest, piece, index: int, started: set[int], reply: StreamedReply
    ) -> list[dict]:
        """A piece of a reply read for tool calls: a chunk per delta, the last one with
        the piece's logprobs and finish reason (`tool_calls` once a call was made)."""
        deltas = reply.deltas(piece.text, finished=piece.finish_reason is not None)
        finish = reply.finish_reason(piece.finish_reason)
        if not deltas and (finish or piece.logprobs):
            deltas = [{}]
        chunks = []
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            chunks.append(
                delta_chunk(
                    req,
                    delta,
                    first=_opens(started, index),
                    logprobs=piece.logprobs if last else None,
                    finish_reason=finish if last else None,
                    index=index,
                )
            )
        return chunks


def _opens(started: set[int], index: int) -> bool:
    """Whether a chunk of choice `index` is its first (then it counts as started)."""
    first = index not in started
    started.add(index)
    return first


def _span_attributes(req: GenerateRequest) -> dict:
    return {
        "kvstack.request_id": req.request_id,
        "gen_ai.request.model": req.model,
        "gen_ai.usage.input_tokens": req.num_prompt_tokens,
        "gen_ai.request.choice.count": req.n,
    }


def _same(given: str, expected: str) -> bool:
    """Constant-time, so that response times do not reveal how much of a key was right."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


def _internal_id(client_id: str) -> str:
    """Unique even when clients reuse x-request-id, and safe inside a NATS subject."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in client_id)[:64]
    return f"{safe}-{os.getpid()}-{next(_counter)}"
