"""The load gauges every model worker shows (vLLM's names where the concept is the same):
requests running and waiting, prompt tokens queued, and the share of KV blocks in use.
Set from the same numbers the worker's heartbeat tells the conductor."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Gauge

from shared.engine.interface import EngineInfo
from shared.engine.stats import EngineStats
from shared.runtime.metrics import Metrics


@dataclass(frozen=True)
class LoadGauges:
    running: Gauge
    waiting: Gauge
    queued_tokens: Gauge
    kv_usage: Gauge

    @classmethod
    def of(cls, metrics: Metrics) -> LoadGauges:
        return cls(
            metrics.gauge("num_requests_running", "requests in the engine's running batch"),
            metrics.gauge("num_requests_waiting", "requests accepted and waiting to run"),
            metrics.gauge("queued_tokens", "prompt tokens still to compute (the queue)"),
            metrics.gauge("kv_cache_usage_ratio", "share of KV blocks in use (0 to 1)"),
        )

    def show(self, stats: EngineStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.queued_tokens.set(stats.queued_tokens)
        self.kv_usage.set(stats.usage if stats.total_blocks else 0.0)


def show_engine(metrics: Metrics, info: EngineInfo) -> None:
    """`kvstack_<service>_engine_info` 1, labelled with what was chosen at start-up: the
    device, dtype, attention backend and whether decode steps replay CUDA graphs."""
    gauge = metrics.gauge(
        "engine_info",
        "the engine as started: device, dtype, attention backend, CUDA graphs",
        ("device", "dtype", "attention", "cuda_graphs"),
    )
    config = info.config
    labels = (config.device, config.resolved_dtype, info.attention, str(info.cuda_graphs).lower())
    gauge.labels(*labels).set(1)
