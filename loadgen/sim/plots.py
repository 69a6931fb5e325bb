"""The simulated cluster's load over time (Mooncake §7.3's oscillation figure): prefill
and decode load against their SLOs, and requests turned away per interval. Drawn with
matplotlib's Figure directly (no pyplot state), like loadgen/plots.py, which loads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadgen.plots import new_figure


def plot_load(result: dict, out_dir: Path, prefix: str = "") -> list[Path]:
    """`{prefix}load.png` from the result's sim timeseries."""
    series = {k: np.asarray(v, dtype=float) for k, v in result["sim"]["timeseries"].items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig = new_figure(figsize=(10, 7), layout="constrained")
    load, turned_away = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    _loads(load, series)
    _turned_away(turned_away, series)
    fig.suptitle(f"{result.get('label', 'sim')}: load over time")
    path = out_dir / f"{prefix}load.png"
    fig.savefig(path, dpi=110)
    return [path]


def _loads(ax, series: dict[str, np.ndarray]) -> None:
    t = series["time"]
    ax.plot(t, series["prefill_load"], label="prefill: queued seconds / TTFT SLO")
    ax.plot(t, series["decode_load"], label="decode: TBT / TBT SLO")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_ylabel("load (mean over nodes)")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)


def _turned_away(ax, series: dict[str, np.ndarray]) -> None:
    t = series["time"]
    for key, label in (
        ("rejected", "rejected by admission"),
        ("wasted", "refused after prefill (wasted)"),
    ):
        per_sample = np.diff(series[key], prepend=0.0)
        ax.step(t, per_sample, where="post", label=label)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("requests per sample")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
