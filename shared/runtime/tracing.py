"""Optional OpenTelemetry tracing: one trace per request across the gateway, conductor,
prefill and decode workers, its context carried in NATS message headers (W3C
`traceparent`, put there and read back by `shared/runtime/bus.py`).

Off unless a process is given an OTLP endpoint (`--otlp-endpoint`, or the standard
OTEL_EXPORTER_OTLP_ENDPOINT). Off, nothing of OpenTelemetry is imported (it is the
optional `tracing` extra) and every hook returns at its first test. On, spans go through a
BatchSpanProcessor, which exports from its own thread: the event loop never waits on
the collector. docs/observability.md lists the spans and their attributes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from shared.errors import KvstackError

EXTRA = "kvstack[tracing]"
EXPORT_PATH = "/v1/traces"  # OTLP/HTTP: the traces endpoint under the collector's base URL


class Span(Protocol):
    """What a service does with its span: attributes (OpenTelemetry's, or NO_SPAN's)."""

    def set_attribute(self, key: str, value: Any) -> Any: ...

    def set_attributes(self, attributes: Mapping[str, Any]) -> Any: ...


class _NoSpan:
    """What a hook hands out while tracing is off: takes attributes, keeps nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass


NO_SPAN = _NoSpan()
_OFF = contextlib.nullcontext(NO_SPAN)  # reusable: entering it does nothing


class _On:
    """The process's tracer and what moves its context in and out of headers."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("kvstack")
        self.propagator = TraceContextTextMapPropagator()
        self.context = context
        self.trace = trace


_on: _On | None = None  # None: tracing is off


def enabled() -> bool:
    return _on is not None


def require() -> None:
    """A clear error where tracing is asked for but its packages are not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http import trace_exporter  # noqa: F401
        from opentelemetry.sdk import trace  # noqa: F401
    except ImportError as e:
        raise KvstackError(
            f"--otlp-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) needs OpenTelemetry, which is "
            f"not installed ({e}): pip install '{EXTRA}'"
        ) from None


def start(service: str, endpoint: str, instance: str = "") -> None:
    """Trace this process as `kvstack-<service>`, exporting over OTLP/HTTP to the collector
    at `endpoint` (its base URL, e.g. http://localhost:4318). One per process."""
    global _on
    require()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {"service.name": f"kvstack-{service}", "service.instance.id": instance or service}
    )
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + EXPORT_PATH)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _on = _On(provider)


def stop() -> None:
    """Export what is left and turn tracing off. Blocks (up to the exporter's timeout):
    call it once the event loop is done, or from a thread."""
    global _on
    on, _on = _on, None
    if on is not None:
        on.provider.shutdown()


def span(name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Span]:
    """A span around a block, current inside it (messages sent there carry it); off:
    NO_SPAN."""
    if _on is None:
        return _OFF
    return _on.tracer.start_as_current_span(name, attributes=attributes)


def headers(parent: Any = None) -> dict[str, str] | None:
    """The headers that carry the trace on with a message: `parent`'s (a span), else the
    current span's; None when off or outside any trace (the message goes without)."""
    if _on is None:
        return None
    context = _on.trace.set_span_in_context(parent) if parent is not None else None
    carrier: dict[str, str] = {}
    _on.propagator.inject(carrier, context=context)
    return carrier or None


def received(message_headers: Mapping[str, str] | None) -> AbstractContextManager:
    """Inside it, the trace a received message's headers carry is the current one (a task
    started inside keeps it); a message without one starts from no trace at all."""
    if _on is None:
        return _OFF
    return _attached(_on, message_headers or {})


@contextlib.contextmanager
def _attached(on: _On, message_headers: Mapping[str, str]):
    token = on.context.attach(on.propagator.extract(message_headers))
    try:
        yield
    finally:
        on.context.detach(token)


class RequestSpans:
    """Spans that outlive the handler that opens them: one per request, from where it
    arrives to where it leaves this service (another task, often)."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._open)

    def open(self, request_id: str, name: str, attributes: Mapping[str, Any]) -> None:
        """A span for `request_id`, a child of the current trace (the message's)."""
        if _on is None:
            return
        attributes = {"kvstack.request_id": request_id, **attributes}
        self._open[request_id] = _on.tracer.start_span(name, attributes=attributes)

    def get(self, request_id: str) -> Any:
        """The request's span (None: not open), the parent of the messages it sends."""
        return self._open.get(request_id)

    def close(
        self, request_id: str, attributes: Mapping[str, Any] | None = None, error: str = ""
    ) -> None:
        """End the request's span (nothing if not open): with `attributes`, failed if
        `error`."""
        span = self._open.pop(request_id, None)
        if span is None:
            return
        if attributes:
            span.set_attributes(attributes)
        if error:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end()
