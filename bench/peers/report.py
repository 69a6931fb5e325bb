"""Samples per (peer, metric) -> medians, kvstack's ratio to each peer, one table."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from bench.peers.lineup import is_kvstack


@dataclass(frozen=True)
class Metric:
    key: str  # e.g. "decode_tok_s", "serve_1_tpot_ms"
    label: str  # the table's row name
    lower_is_better: bool = False


def single_stream_metrics(prefill_len: int) -> list[Metric]:
    return [
        Metric("prefill_tok_s", f"prefill {prefill_len} tok/s"),
        Metric("decode_tok_s", "decode batch 1 tok/s"),
    ]


def serving_metrics(rate: float) -> list[Metric]:
    name = f"{rate:g} req/s"
    return [
        Metric(f"serve_{rate:g}_output_tok_s", f"{name}: output tok/s"),
        Metric(f"serve_{rate:g}_tpot_ms", f"{name}: TPOT ms", lower_is_better=True),
        Metric(f"serve_{rate:g}_ttft_ms", f"{name}: TTFT ms", lower_is_better=True),
    ]


@dataclass
class Samples:
    """Every measurement so far, by peer and metric, in the order the peers first ran."""

    values: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, peer: str, key: str, value: float | None) -> None:
        if value is not None:
            self.values[peer][key].append(value)

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            peer: {key: statistics.median(vals) for key, vals in metrics.items() if vals}
            for peer, metrics in self.values.items()
        }


def kvstack_columns(medians: dict) -> list[str]:
    return [peer for peer in medians if is_kvstack(peer)]


def reference(peer: str, ours: list[str]) -> str:
    """The kvstack column a peer is compared with: the first of its weight format (the
    name's last word, e.g. `llama.cpp Q8_0`), else the first."""
    same_format = [k for k in ours if k.split()[-1] == peer.split()[-1]]
    return (same_format or ours)[0]


def ratios(medians: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """kvstack's value over each peer's, per metric both have (for ms: lower is better)."""
    ours = kvstack_columns(medians)
    if not ours:
        return {}
    result = {}
    for peer, values in medians.items():
        if peer in ours:
            continue
        mine = medians[reference(peer, ours)]
        result[peer] = {
            key: mine[key] / value for key, value in values.items() if key in mine and value
        }
    return result


def format_table(medians: dict, metrics: list[Metric], header: str) -> str:
    ours = kvstack_columns(medians)
    peers = [p for p in medians if p not in ours]
    by_peer = ratios(medians)
    label_width = max([len(m.label) for m in metrics] + [8]) + 2
    width = max([len(k) + 2 for k in ours] + [12])
    columns = "".join(f"{k:>{width}}" for k in ours) + "".join(f"{p:>18}{'x':>7}" for p in peers)
    lines = [header, f"{'':{label_width}}{columns}"]
    for metric in metrics:
        cells = "".join(f"{cell(medians[k].get(metric.key)):>{width}}" for k in ours)
        cells += "".join(
            f"{cell(medians[p].get(metric.key)):>18}{cell(by_peer[p].get(metric.key), 2):>7}"
            for p in peers
        )
        lines.append(f"{metric.label:{label_width}}{cells}")
    first = f" (else {ours[0]})" if ours else ""
    lines.append(
        f"x: the value of the kvstack column of the peer's weight format{first} / the peer's "
        "(above 1 kvstack is ahead on tok/s, behind on ms)"
    )
    return "\n".join(lines)


def cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
