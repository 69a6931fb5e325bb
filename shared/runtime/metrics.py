"""Prometheus names and buckets shared by every service (`kvstack_<service>_<what>_<unit>`).

Names follow Prometheus's conventions (counters end in `_total`, base units: seconds,
bytes, ratios) and vLLM's where the concept is the same; buckets follow vLLM's, so
dashboards and loadgen's client-side numbers compare. docs/observability.md lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

# NOTE: no `<name>_created` series beside every counter and histogram: dashboards never
# use them, and they double what each scrape carries (vLLM turns them off too).
disable_created_metrics()

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Metrics of one service instance, in its own registry (several may share a process),
    with the process's own: `process_*` (CPU, memory, open files) and `python_*` (GC)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)

    def _name(self, what: str) -> str:
        return f"kvstack_{self.service}_{what}"

    def counter(self, what: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(self._name(what), doc, labels, registry=self.registry)

    def gauge(self, what: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(self._name(what), doc, labels, registry=self.registry)

    def histogram(
        self, what: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()
    ) -> Histogram:
        return Histogram(self._name(what), doc, labels, buckets=buckets, registry=self.registry)

    def counter_of(
        self, what: str, doc: str, read: Callable[[], float | Mapping[str, float]], label: str = ""
    ) -> None:
        """A counter whose total another object keeps (a transfer's I/O threads, the block
        store), read at each scrape; with `label`, `read` returns a total per label value."""
        self.registry.register(_ReadCounter(self._name(what), doc, read, label))


class _ReadCounter(Collector):
    def __init__(
        self, name: str, doc: str, read: Callable[[], float | Mapping[str, float]], label: str
    ) -> None:
        self.name, self.doc, self.read, self.label = name, doc, read, label

    def collect(self) -> Iterator[Metric]:
        labels = [self.label] if self.label else None
        family = CounterMetricFamily(self.name, self.doc, labels=labels)
        values = self.read()
        if isinstance(values, Mapping):
            for value_of_label, value in values.items():
                family.add_metric([value_of_label], value)
        else:
            family.add_metric([], values)
        yield family
