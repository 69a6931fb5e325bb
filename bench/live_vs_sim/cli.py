"""`python -m bench live-vs-sim`: for each policy, a trace slice replayed live on a mock-engine
stack (`kvstack up --engine mock`, `loadgen run --trace`) and in `loadgen sim` on the same
cluster; mean, p50 and p90 TTFT, TPOT, cached tokens and the conductor's TTFT estimate
error side by side, and whether the mean TTFTs agree within --tolerance. Also the TTFT of
single requests on the idle stack beside the cost model's (the fixed live overhead), and
every estimate's error live and simulated."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from bench.live_vs_sim import live, sim
from bench.live_vs_sim.live import PROBE_TOKENS, LiveRun
from bench.live_vs_sim.replay import Replay, Summary
from shared.conductor.accuracy import ESTIMATES
from shared.conductor.policies import POLICIES
from shared.errors import KvstackError

DEFAULT_POLICIES = "load-balance,kvcentric,cache-aware,random"


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = Replay()
    p = sub.add_parser(
        "live-vs-sim",
        help="one trace slice per policy, live (mock engine) and in loadgen sim: TTFT, TPOT",
        description=__doc__,
    )
    p.add_argument("--trace", type=Path, default=d.trace, help="Mooncake JSONL trace")
    p.add_argument("--max-requests", type=int, default=d.max_requests)
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="x the timestamps")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help=f"(default: {DEFAULT_POLICIES})")
    p.add_argument("--prefill", type=int, default=d.prefill)
    p.add_argument("--decode", type=int, default=d.decode)
    p.add_argument("--kvstore", type=int, default=d.kvstore)
    p.add_argument("--model", default=d.model, help="the mock model and the sim's roofline")
    p.add_argument("--hardware", default=d.hardware)
    p.add_argument("--admission", default=d.admission)
    p.add_argument("--tolerance", type=float, default=0.15, help="|live / sim - 1| that agrees")
    p.add_argument("--work-dir", type=Path, default=Path(".kvstack/live-vs-sim"))
    p.add_argument("--output-json", type=Path, help="also write every number here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    replay = Replay(
        args.trace,
        args.max_requests,
        args.time_scale,
        args.model,
        args.hardware,
        args.prefill,
        args.decode,
        args.kvstore,
        args.admission,
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if unknown := [p for p in policies if p not in POLICIES]:
        raise KvstackError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    say(f"results and logs in {args.work_dir}")
    rows = {p: _compare(replay, p, args.work_dir) for p in policies}
    print(format_table(rows, args.tolerance))
    print()
    print(format_idle(rows, replay))
    print()
    print(format_estimates(rows))
    if args.output_json:
        args.output_json.write_text(json.dumps(to_json(replay, rows), indent=2))
    return 0


def _compare(replay: Replay, policy: str, work_dir: Path) -> tuple[LiveRun, Summary]:
    live_run = live.run_live(replay, policy, work_dir, say)
    say(f"{policy}: the same slice in loadgen sim")
    return live_run, sim.run_sim(replay, policy, work_dir)


HEADER = (
    "policy",
    "live mean TTFT (s)",
    "sim mean TTFT (s)",
    "live / sim",
    "agree",
    "live p50",
    "sim p50",
    "live p90",
    "sim p90",
    "live TPOT (ms)",
    "sim TPOT (ms)",
    "cached tokens live / sim",
    "TTFT est. err live",
    "TTFT est. err sim",
)


def format_table(rows: dict[str, tuple[LiveRun, Summary]], tolerance: float) -> str:
    """A Markdown table, a row per policy; estimate errors as median |relative error|
    (mean signed: > 0 when the conductor predicted long)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    for policy, (live_run, s) in rows.items():
        lv = live_run.summary
        ratio = lv.mean_ttft / s.mean_ttft if s.mean_ttft else float("nan")
        cells = (
            policy,
            f"{lv.mean_ttft:.3f}",
            f"{s.mean_ttft:.3f}",
            f"{ratio:.2f}",
            "yes" if abs(ratio - 1) <= tolerance else "no",
            f"{lv.p50_ttft:.3f}",
            f"{s.p50_ttft:.3f}",
            f"{lv.p90_ttft:.3f}",
            f"{s.p90_ttft:.3f}",
            f"{lv.mean_tpot * 1e3:.1f}",
            f"{s.mean_tpot * 1e3:.1f}",
            f"{lv.cached_tokens} / {s.cached_tokens}",
            _estimate(lv),
            _estimate(s),
        )
        lines.append("| " + " | ".join(cells) + " |")
    failed = {p: r.summary.failed for p, (r, _) in rows.items() if r.summary.failed}
    if failed:
        lines.append(f"\nfailed live requests (left out of the numbers): {failed}")
    return "\n".join(lines)


def _estimate(summary: Summary, name: str = "ttft") -> str:
    error = summary.estimates.get(name)
    if error is None:
        return "-"
    return f"{error['median_abs_rel_error']:.0%} ({error['mean_rel_error']:+.0%})"


def format_estimates(rows: dict[str, tuple[LiveRun, Summary]]) -> str:
    """Each estimate's median |relative error| (signed mean), live and simulated, per
    policy; `-` where a side measures none (live: transfer, which overlaps the compute)."""
    header = ["policy"] + [f"{name} {side}" for name in ESTIMATES for side in ("live", "sim")]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for policy, (live_run, s) in rows.items():
        cells = [policy]
        for name in ESTIMATES:
            cells += [_estimate(live_run.summary, name), _estimate(s, name)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_idle(rows: dict[str, tuple[LiveRun, Summary]], replay: Replay) -> str:
    """Single requests on the idle stack after each replay, beside the cost model."""
    header = ["policy's stack"]
    for n in PROBE_TOKENS:
        header += [f"{n} tokens live (s)", "modelled (s)", "live - modelled"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for policy, (live_run, _) in rows.items():
        cells = [policy]
        for n in PROBE_TOKENS:
            got, want = live_run.idle_ttft[n], sim.idle_ttft(replay, n)
            cells += [f"{got:.3f}", f"{want:.3f}", f"{got - want:+.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_json(replay: Replay, rows: dict[str, tuple[LiveRun, Summary]]) -> dict:
    modelled = {n: sim.idle_ttft(replay, n) for n in PROBE_TOKENS}
    return {
        "replay": asdict(replace(replay, trace=str(replay.trace))),  # type: ignore[arg-type]
        "policies": {
            policy: {
                "live": asdict(live_run.summary),
                "sim": asdict(s),
                "idle_ttft": {"live": live_run.idle_ttft, "modelled": modelled},
            }
            for policy, (live_run, s) in rows.items()
        },
    }


def say(message: str) -> None:
    print(f"bench live-vs-sim: {message}", file=sys.stderr, flush=True)
