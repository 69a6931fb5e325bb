"""A stand-in OTLP/HTTP collector for the tracing tests: it accepts POST /v1/traces
(protobuf, as OpenTelemetry's exporter sends it) and keeps every span it is sent, from any
process, so a test can check the traces a whole stack wrote."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # its resource's service.name
    name: str
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    attributes: dict
    failed: bool


class Collector:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self._receive))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The base URL (what --otlp-endpoint takes)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans received, once `done(spans)` holds (the last ones seen past timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        received = [
            _span(resource_spans, span)
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self._lock:
            self.spans.extend(received)


def _span(resource_spans, span) -> ReceivedSpan:
    resource = _attributes(resource_spans.resource.attributes)
    return ReceivedSpan(
        resource["service.name"],
        span.name,
        span.trace_id.hex(),
        span.span_id.hex(),
        span.parent_span_id.hex(),
        _attributes(span.attributes),
        span.status.code == ERROR,
    )


def _attributes(pairs: list[KeyValue]) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in pairs}


def _handler(receive: Callable[[bytes], None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receive(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args) -> None:
            pass  # quiet: the test's output is for failures

    return Handler
