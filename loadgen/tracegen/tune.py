"""--target-reuse: bisect one knob until the trace's reuse ceiling is within TOLERANCE.

The knobs raise reuse as they grow: the shared prefixes' length (`system-tokens`: more of
each prompt is shared) or the share of requests in sessions (`session-share`: more prompts
extend an earlier one). Each step builds the whole trace; starts keep their draws across
steps (plan.py), so reuse moves almost monotonically with the knob."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from loadgen.trace import TraceRow
from loadgen.tracegen.generate import build
from loadgen.tracegen.params import GenParams
from loadgen.tracestats import infinite_cache_hit_ratio

TOLERANCE = 0.01
MAX_STEPS = 20
MAX_SESSION_SHARE = 0.95


@dataclass(frozen=True)
class Tuned:
    params: GenParams  # with the knob set to the value that gave `rows`
    rows: list[TraceRow]
    reuse: float


def generate(params: GenParams, note: Callable[[str], None] = lambda _: None) -> Tuned:
    """The trace for `params`, tuned when it has a target reuse."""
    if params.target_reuse is None:
        rows = build(params)
        return Tuned(params, rows, infinite_cache_hit_ratio(rows))
    return tune(params, params.target_reuse, note)


def tune(params: GenParams, target: float, note: Callable[[str], None]) -> Tuned:
    low, high = knob_range(params)
    best: Tuned | None = None
    for _ in range(MAX_STEPS):
        value = midpoint(params, low, high)
        trial = at_knob(params, value)
        note(f"{params.knob} {knob_value(trial.params)}: reuse {trial.reuse:.3f}")
        if best is None or abs(trial.reuse - target) < abs(best.reuse - target):
            best = trial
        if abs(trial.reuse - target) <= TOLERANCE or high - low < knob_resolution(params):
            break
        low, high = (value, high) if trial.reuse < target else (low, value)
    assert best is not None
    return best


def midpoint(params: GenParams, low: float, high: float) -> float:
    """Prefix lengths span five orders of magnitude: halve them on a log scale."""
    return math.sqrt(low * high) if params.knob == "system-tokens" else (low + high) / 2


def knob_range(params: GenParams) -> tuple[float, float]:
    if params.knob == "system-tokens":
        return 1.0, float(params.input_max - 1)
    return 0.0, MAX_SESSION_SHARE


def knob_resolution(params: GenParams) -> float:
    return 1.0 if params.knob == "system-tokens" else 1e-3


def at_knob(params: GenParams, value: float) -> Tuned:
    if params.knob == "system-tokens":
        tuned = replace(params, system_tokens=max(1, round(value)))
    else:
        tuned = replace(params, session_share=value)
    rows = build(tuned)
    return Tuned(tuned, rows, infinite_cache_hit_ratio(rows))


def knob_value(params: GenParams) -> str:
    if params.knob == "system-tokens":
        return str(params.system_tokens)
    return f"{params.session_share:.3f}"
