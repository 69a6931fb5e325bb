"""PNG plots of one run (`plot_run`) or several side by side (`plot_compare`), drawn from
the per-request records of the result document. Uses matplotlib's Figure directly (the Agg
canvas), never pyplot, so no global backend or figure state is touched.

matplotlib is an extra (`kvstack[bench]`): it is imported when a figure is drawn, so the
rest of loadgen runs without it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loadgen.output import records_of
from loadgen.records import RequestRecord
from shared.errors import KvstackError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NO_MATPLOTLIB = "plots need matplotlib: pip install 'kvstack[bench]'"

# (metric, axis label) in the order of the 2x2 CDF panels
CDF_METRICS = (
    ("ttft", "TTFT (ms)"),
    ("tpot", "TPOT (ms)"),
    ("itl", "ITL (ms)"),
    ("e2el", "E2EL (ms)"),
)
MIN_BUCKET_S = 0.1
NUM_BUCKETS = 60


def new_figure(**kwargs: Any) -> Figure:
    """A matplotlib Figure (Agg canvas, no pyplot state); a usage error without matplotlib."""
    try:
        from matplotlib import figure
    except ImportError:
        raise KvstackError(NO_MATPLOTLIB) from None
    return figure.Figure(**kwargs)


def latencies_ms(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """Each CDF metric's values in ms, as `metrics.metric_values` defines them."""
    done = [r for r in records if r.success]
    values = {
        "ttft": [r.ttft for r in done],
        "tpot": [r.tpot for r in done if r.output_len > 1],
        "itl": [gap for r in done for gap in r.itl],
        "e2el": [r.latency for r in done],
    }
    return {name: np.sort(np.asarray(v, dtype=float)) * 1000.0 for name, v in values.items()}


def throughput_series(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(bucket edges [s], output tokens/s in each bucket); about NUM_BUCKETS buckets."""
    times = np.asarray([t for r in records if r.success for t in r.token_times()], dtype=float)
    if times.size == 0:
        return np.zeros(0), np.zeros(0)
    width = max(MIN_BUCKET_S, float(times.max()) / NUM_BUCKETS)
    counts = np.bincount((times // width).astype(int))
    return np.arange(counts.size + 1) * width, counts / width


def plot_run(result: dict, out_dir: Path, prefix: str = "") -> list[Path]:
    """`{prefix}latency-cdf.png`, `{prefix}throughput.png`, `{prefix}ttft-over-time.png`."""
    return plot_compare(
        [(result.get("label") or "run", result)], out_dir, prefix, with_ttft_timeline=True
    )


def plot_compare(
    runs: Sequence[tuple[str, dict]],
    out_dir: Path,
    prefix: str = "",
    with_ttft_timeline: bool = False,
) -> list[Path]:
    """One figure per kind with a line per run: latency CDFs, throughput over time."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labelled = [(label, records_of(result)) for label, result in runs]
    paths = [
        _save(cdf_figure(labelled), out_dir / f"{prefix}latency-cdf.png"),
        _save(throughput_figure(labelled), out_dir / f"{prefix}throughput.png"),
    ]
    if with_ttft_timeline:
        paths.append(_save(ttft_timeline_figure(labelled), out_dir / f"{prefix}ttft-over-time.png"))
    return paths


def cdf_figure(runs: Sequence[tuple[str, Sequence[RequestRecord]]]) -> Figure:
    fig = new_figure(figsize=(10, 7), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    for ax, (name, label) in zip(axes, CDF_METRICS):
        for run_label, records in runs:
            values = latencies_ms(records)[name]
            if values.size:
                ax.step(
                    values,
                    np.arange(1, values.size + 1) / values.size,
                    where="post",
                    label=run_label,
                )
        ax.set(
            xlabel=label,
            ylabel="fraction of requests" if name != "itl" else "fraction of gaps",
            ylim=(0, 1.02),
            title=f"{name.upper()} CDF",
        )
        ax.grid(alpha=0.3)
        _legend_or_empty(ax)
    return fig


def throughput_figure(runs: Sequence[tuple[str, Sequence[RequestRecord]]]) -> Figure:
    fig = new_figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    for run_label, records in runs:
        edges, rates = throughput_series(records)
        if rates.size:
            ax.stairs(rates, edges, label=run_label)
    ax.set(
        xlabel="time since start (s)",
        ylabel="output tokens/s",
        title="Output token throughput over time",
    )
    ax.grid(alpha=0.3)
    _legend_or_empty(ax)
    return fig


def ttft_timeline_figure(runs: Sequence[tuple[str, Sequence[RequestRecord]]]) -> Figure:
    fig = new_figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    for run_label, records in runs:
        # a success has a ttft (RequestRecord.success): the test only tells the type checker
        done = [(r.start_time, r.ttft) for r in records if r.success and r.ttft is not None]
        ax.scatter([t for t, _ in done], [ttft * 1000 for _, ttft in done], s=10, label=run_label)
        failed = [r.start_time for r in records if not r.success]
        if failed:
            ax.scatter(failed, [0] * len(failed), marker="x", color="red", label="failed")
    ax.set(xlabel="send time since start (s)", ylabel="TTFT (ms)", title="TTFT over time")
    ax.grid(alpha=0.3)
    _legend_or_empty(ax)
    return fig


def _legend_or_empty(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path
