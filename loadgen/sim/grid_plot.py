"""`loadgen sim sweep --plot`: per trace, mean and p90 TTFT (log scale), SLO attainment
and goodput against load, a line per policy; each policy's capacity, when searched, as a
dashed line in its colour. Drawn with matplotlib's Figure (no pyplot state)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from loadgen.plots import new_figure

PANELS = (
    ("mean_ttft_s", "mean TTFT (s, log scale)", True),
    ("p90_ttft_s", "p90 TTFT (s, log scale)", True),
    ("slo_attainment", "SLO attainment (both met / sent)", False),
    ("goodput_rps", "goodput (req/s meeting both SLOs)", False),
)


def plot_trace(
    name: str,
    runs: Sequence[dict],
    capacities: Sequence[dict],
    policies: Sequence[str],
    target: float,
    path: Path,
) -> Path:
    fig = new_figure(figsize=(10, 7), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True).flatten()
    for ax, (key, label, log) in zip(axes, PANELS):
        for policy in policies:
            mine = sorted((r for r in runs if r["policy"] == policy), key=lambda r: r["load"])
            ax.plot([r["load"] for r in mine], [r[key] for r in mine], marker=".", label=policy)
        ax.set_ylabel(label)
        ax.set_yscale("log" if log else "linear")
        ax.grid(alpha=0.3)
    _capacities(axes[2], capacities, policies)
    axes[2].axhline(target, color="grey", linestyle=":", linewidth=1)
    axes[2].set_ylim(0, 1.02)
    for ax in axes[2:]:
        ax.set_xlabel("load (replay speed, x the trace's)")
    axes[0].legend(fontsize="small")
    fig.suptitle(f"{name}: policies against load")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


def _capacities(ax, capacities: Sequence[dict], policies: Sequence[str]) -> None:
    colours = {line.get_label(): line.get_color() for line in ax.get_lines()}
    for c in capacities:
        if c["speed"] and c["policy"] in policies:
            ax.axvline(c["speed"], color=colours.get(c["policy"]), linestyle="--", linewidth=0.8)
