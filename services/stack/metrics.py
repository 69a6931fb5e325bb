"""The metrics of `kvstack up` itself: restarts per child and children up, on GET /metrics."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from shared.runtime.metrics import Metrics


class UpMetrics:
    def __init__(self) -> None:
        self.metrics = Metrics("up")
        self.restarts = self.metrics.counter(
            "restarts", "children restarted after they exited", ("service",)
        )
        self.children_up = self.metrics.gauge("children_up", "children running now")
        self.url = ""
        self._server: WSGIServer | None = None

    def serve(self, host: str, port: int) -> str:
        """Serve /metrics on host:port (0: a free port); returns the URL."""
        self._server = server = start_http_server(port, host, self.metrics.registry)[0]
        self.url = f"http://{host}:{server.server_port}/metrics"
        return self.url

    @property
    def port(self) -> int:
        """The port /metrics is served on (0: not served)."""
        return self._server.server_port if self._server is not None else 0

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
