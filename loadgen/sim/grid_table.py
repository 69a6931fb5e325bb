"""What `loadgen sim sweep` prints: per trace, a Markdown table per metric (a row per load,
a column per policy, the best bolded), a capacity table, and a verdict on the issue's goal
for kvcentric. TBT is Mooncake's (the mean of a request's slowest 10% of gaps), SLO
attainment the share of requests sent that meet both SLOs, goodput those a second.
Pure functions of the runs' summaries (`grid.run_summary`'s dicts with trace, policy and
load), so tests pin them on made-up numbers.

The goal (issue 16): on every trace and load, kvcentric is never worse than the best of
the other policies in mean and p90 TTFT and in SLO attainment (goodput); and where the
trace's reuse is at least 30%, its mean TTFT is at least 15% below load-balance's and its
capacity at least 1.2x load-balance's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CANDIDATE = "kvcentric"
BASELINE = "load-balance"
REUSE_FOR_GAINS = 0.3  # the gains over the baseline are asked where reuse is this or more
TTFT_GAIN = 0.15  # mean TTFT at least this much below the baseline's
CAPACITY_GAIN = 1.2  # capacity at least this many times the baseline's


def ttft_estimate_error(run: dict) -> float | None:
    """The conductor's TTFT prediction error, where the run has estimates."""
    return run.get("estimates", {}).get("ttft", {}).get("median_abs_rel_error")


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    lower_is_better: bool
    format: str  # for str.format

    def value(self, run: dict) -> float | None:
        if self.key == "ttft_est_err":
            return ttft_estimate_error(run)
        return run.get(self.key)

    def cell(self, value: float | None) -> str:
        return "" if value is None else self.format.format(value)

    def best(self, values: Sequence[float]) -> float:
        return min(values) if self.lower_is_better else max(values)


METRICS = (
    Metric("mean_ttft_s", "mean TTFT (s)", True, "{:.2f}"),
    Metric("p90_ttft_s", "p90 TTFT (s)", True, "{:.2f}"),
    Metric("p90_tbt_ms", "p90 TBT (ms)", True, "{:.0f}"),
    Metric("slo_attainment", "SLO attainment", False, "{:.1%}"),
    Metric("goodput_rps", "goodput (req/s)", False, "{:.2f}"),
    Metric("hit_global", "hit ratio, global", False, "{:.3f}"),
    Metric("ttft_est_err", "TTFT est. err (median |rel|)", True, "{:.1%}"),
)
VERDICT_METRICS = tuple(
    m for m in METRICS if m.key in ("mean_ttft_s", "p90_ttft_s", "slo_attainment")
)
BY_KEY = {m.key: m for m in METRICS}


def by_load(runs: Sequence[dict]) -> dict[float, dict[str, dict]]:
    """{load: {policy: run}}, loads ascending."""
    table: dict[float, dict[str, dict]] = {}
    for run in sorted(runs, key=lambda r: r["load"]):
        table.setdefault(run["load"], {})[run["policy"]] = run
    return table


def load_label(load: float) -> str:
    return f"{load:g}x"


def metric_table(runs: Sequence[dict], metric: Metric, policies: Sequence[str]) -> str:
    """A row per load, a column per policy; each row's best value bolded (ties as
    printed too)."""
    lines = [
        f"| {metric.title} | " + " | ".join(policies) + " |",
        "| --- |" + " ---: |" * len(policies),
    ]
    for load, row in by_load(runs).items():
        values = [metric.value(row[p]) if p in row else None for p in policies]
        known = [v for v in values if v is not None]
        # bold what shows as the best: equal to it as printed
        best = metric.cell(metric.best(known)) if known else None
        cells = [bold(metric.cell(v), metric.cell(v) == best and len(known) > 1) for v in values]
        lines.append(f"| {load_label(load)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bold(text: str, on: bool) -> str:
    return f"**{text}**" if on and text else text


def trace_tables(runs: Sequence[dict], policies: Sequence[str]) -> str:
    """The metric tables of one trace's runs (a metric no run has is left out)."""
    tables = [
        metric_table(runs, m, policies)
        for m in METRICS
        if any(m.value(r) is not None for r in runs)
    ]
    return "\n\n".join(tables)


def capacity_cell(capacity: dict, rate: float) -> str:
    """'1.79x (7.0 req/s)'; '< 0.0156x' when not even the slowest replay tried was
    sustained, '>= 64x' when the fastest was."""
    if capacity["time_scale"] is None:
        return f"< {1 / capacity['failed_time_scale']:.3g}x"
    text = f"{capacity['speed']:.3g}x ({capacity['speed'] * rate:.2f} req/s)"
    return f">= {text}" if capacity["failed_time_scale"] is None else text


def capacity_table(
    capacities: Sequence[dict],
    rates: dict[str, float],
    names: dict[str, str],
    policies: Sequence[str],
) -> str:
    """A row per trace, a column per policy: the fastest replay meeting the target, and
    that as a request rate (`rates`: each trace's own, requests a second)."""
    lines = ["| capacity | " + " | ".join(policies) + " |", "| --- |" + " ---: |" * len(policies)]
    for trace, name in names.items():
        found = {c["policy"]: c for c in capacities if c["trace"] == trace}
        speeds = [found[p]["speed"] or 0.0 for p in policies if p in found]
        best = max(speeds, default=None)
        cells = [
            bold(capacity_cell(found[p], rates[trace]), (found[p]["speed"] or 0.0) == best)
            if p in found
            else ""
            for p in policies
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- the verdict --------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    goal: str
    met: bool
    detail: str = ""


def is_worse(metric: Metric, mine: float, best: float, tolerance: float) -> bool:
    """Worse than `best` by more than `tolerance` (relative)."""
    if metric.lower_is_better:
        return mine > best * (1 + tolerance)
    return mine < best * (1 - tolerance)


def shortfalls(runs: Sequence[dict], candidate: str, tolerance: float) -> list[str]:
    """Where `candidate` is worse than the best other policy at the same load, e.g.
    '2x: p90 TTFT (s) 12.30 vs 11.00 (cache-aware)'."""
    found = []
    for load, row in by_load(runs).items():
        others = {p: r for p, r in row.items() if p != candidate}
        if candidate not in row or not others:
            continue
        for m in VERDICT_METRICS:
            policy, best = best_of(others, m)
            mine = row[candidate][m.key]
            if is_worse(m, mine, best, tolerance):
                found.append(
                    f"{load_label(load)}: {m.title} {m.cell(mine)} vs {m.cell(best)} ({policy})"
                )
    return found


def best_of(runs: dict[str, dict], metric: Metric) -> tuple[str, float]:
    """The policy with the best value of `metric` (the first of equals), and the value."""
    values = {policy: run[metric.key] for policy, run in runs.items()}
    policy = (min if metric.lower_is_better else max)(values, key=values.__getitem__)
    return policy, values[policy]


def ttft_gains(runs: Sequence[dict], candidate: str, baseline: str) -> dict[float, float]:
    """{load: 1 - candidate's mean TTFT / baseline's}, where both ran (0.2: 20% lower)."""
    gains = {}
    for load, row in by_load(runs).items():
        if candidate in row and baseline in row and row[baseline]["mean_ttft_s"] > 0:
            gains[load] = 1 - row[candidate]["mean_ttft_s"] / row[baseline]["mean_ttft_s"]
    return gains


def capacity_ratio(capacities: Sequence[dict], candidate: str, baseline: str) -> float | None:
    speeds = {c["policy"]: c["speed"] for c in capacities}
    mine, theirs = speeds.get(candidate), speeds.get(baseline)
    return mine / theirs if mine and theirs else None


def verdict(
    runs: Sequence[dict],
    capacities: Sequence[dict],
    tolerance: float = 0.0,
    candidate: str = CANDIDATE,
    baseline: str = BASELINE,
) -> list[Check]:
    """The goal's checks for one trace's runs (and capacities, if searched)."""
    policies = {r["policy"] for r in runs}
    if candidate not in policies or len(policies) < 2:
        return []
    worse = shortfalls(runs, candidate, tolerance)
    checks = [Check("never worse than the best other policy", not worse, "; ".join(worse))]
    reuse = max(r["hit_ceiling"] for r in runs)
    if reuse < REUSE_FOR_GAINS or baseline not in policies:
        return checks
    return checks + [
        gain_check(runs, candidate, baseline),
        *capacity_check(capacities, candidate, baseline),
    ]


def gain_check(runs: Sequence[dict], candidate: str, baseline: str) -> Check:
    gains = ttft_gains(runs, candidate, baseline)
    short = [f"{load_label(load)}: {gain:.0%}" for load, gain in gains.items() if gain < TTFT_GAIN]
    span = f"{min(gains.values()):.0%} to {max(gains.values()):.0%}" if gains else "no runs"
    return Check(
        f"mean TTFT >= {TTFT_GAIN:.0%} below {baseline}'s",
        bool(gains) and not short,
        f"{span} lower" + (f"; short at {', '.join(short)}" if short else ""),
    )


def capacity_check(capacities: Sequence[dict], candidate: str, baseline: str) -> list[Check]:
    if not capacities:
        return []
    ratio = capacity_ratio(capacities, candidate, baseline)
    detail = "not found" if ratio is None else f"{ratio:.2f}x"
    goal = f"capacity >= {CAPACITY_GAIN:g}x {baseline}'s"
    return [Check(goal, ratio is not None and ratio >= CAPACITY_GAIN, detail)]


def verdict_line(name: str, checks: Sequence[Check], candidate: str = CANDIDATE) -> str:
    if not checks:
        return f"verdict ({name}): none ({candidate} and another policy are needed)"
    parts = [
        f"{c.goal}: {'yes' if c.met else 'NO'}" + (f" ({c.detail})" if c.detail else "")
        for c in checks
    ]
    overall = "met" if all(c.met for c in checks) else "NOT met"
    return f"verdict ({name}): {overall}. {candidate} " + "; ".join(parts)
