"""A chaos run on a running stack: a steady load, each fault in turn, then the counts.

Per fault, the requests that ended between it and the next one: sent, completed (text
compared with the reference), migrated (moved to another worker mid-stream), errored (a
clear error), lost (completed with a text other than the reference: a token lost or
repeated; must be 0), hung (no end within the timeout; must be 0); and when the stack had
the faulted part back and answered a new request again. After the load, the KV blocks in
use on every worker must come back to where they were before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from bench.chaos.faults import FAULTS, Fault, choose, inject, wait_back
from bench.chaos.load import Case, Outcome, SteadyLoad
from services.stack.stack import Stack
from shared import subjects
from shared.messages import AttentionStats, StatsRequest, WorkerStats

KV_SERVICES = ("prefill", "decode", "attention-worker")


@dataclass(frozen=True)
class ChaosConfig:
    faults: tuple[str, ...] = FAULTS
    concurrency: int = 4
    max_tokens: int = 48
    settle_seconds: float = 5.0  # load alone before the first fault and after the last
    phase_seconds: float = 30.0  # from one fault to the next
    request_timeout: float = 180.0  # a request still open after this is hung
    recover_timeout: float = 120.0
    model: str = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Row:
    fault: str
    sent: int
    completed: int
    migrated: int
    errored: int
    lost: int
    hung: int
    back_s: float | None = None  # the faulted part restarted and answering
    first_answer_s: float | None = None  # a request begun after the fault answered right


@dataclass
class ChaosReport:
    rows: list[Row]
    kv_before: dict[str, int]
    kv_after: dict[str, int]
    errors: list[str] = field(default_factory=list)  # the first distinct error messages

    @property
    def leaked(self) -> dict[str, int]:
        """Workers holding more KV blocks after the load than before it."""
        return {
            w: n - self.kv_before[w]
            for w, n in self.kv_after.items()
            if w in self.kv_before and n > self.kv_before[w] >= 0
        }

    @property
    def silent(self) -> list[str]:
        """Workers that did not answer when the KV was counted after the load."""
        return [w for w, n in self.kv_after.items() if n < 0]

    @property
    def ok(self) -> bool:
        return (
            not self.leaked
            and not self.silent
            and all(r.lost == 0 and r.hung == 0 for r in self.rows)
        )

    def to_json(self) -> dict:
        return {
            "rows": [asdict(r) for r in self.rows],
            "kv_before": self.kv_before,
            "kv_after": self.kv_after,
            "leaked": self.leaked,
            "silent": self.silent,
            "errors": self.errors,
            "ok": self.ok,
        }


def run_chaos(
    stack: Stack,
    cases: list[Case],
    config: ChaosConfig,
    say: Callable[[str], None] = lambda _: None,
) -> ChaosReport:
    faults = choose(stack, list(config.faults))
    kv_before = baseline_kv(stack, config.recover_timeout)
    load = SteadyLoad(
        stack.api_url,
        config.model,
        cases,
        config.max_tokens,
        config.concurrency,
        config.request_timeout,
    )
    load.start()
    time.sleep(config.settle_seconds)
    marks = [_apply(stack, load, fault, config, say) for fault in faults]
    load.phase = "after"
    time.sleep(config.settle_seconds)
    say("stopping the load")
    load.stop()
    kv_after = settle_kv(stack, kv_before, config.recover_timeout)
    rows = [
        row_of(p, load.outcomes, cases, at, back)
        for p, at, back in [("warmup", None, None), *marks, ("after", None, None)]
    ]
    return ChaosReport(rows, kv_before, kv_after, first_errors(load.outcomes))


def _apply(
    stack: Stack, load: SteadyLoad, fault: Fault, config: ChaosConfig, say: Callable[[str], None]
) -> tuple[str, float, float | None]:
    before = stack.restarts(fault.child) if fault.child else 0
    say(f"fault: {fault.name} ({fault.child or 'restarting nats-server'})")
    load.phase, at = fault.name, time.monotonic()
    inject(stack, fault)
    back = wait_back(stack, fault, before, config.recover_timeout)
    say(
        f"{fault.name}: back after {back:.1f}s"
        if back is not None
        else f"{fault.name}: NOT back within {config.recover_timeout:.0f}s"
    )
    time.sleep(max(0.0, at + config.phase_seconds - time.monotonic()))
    return fault.name, at, back


def row_of(
    phase: str, outcomes: list[Outcome], cases: list[Case], at: float | None, back: float | None
) -> Row:
    mine = [o for o in outcomes if o.phase == phase]
    done = [o for o in mine if o.completed]
    right = [o for o in done if o.text == cases[o.case].want]
    first = None
    if at is not None:
        later = [
            o.ended - at
            for o in outcomes
            if o.started >= at and o.completed and o.text == cases[o.case].want
        ]
        first = min(later, default=None)
    return Row(
        phase,
        len(mine),
        len(right),
        sum(o.migrations > 0 for o in mine),
        sum(bool(o.error) for o in mine),
        len(done) - len(right),
        sum(o.hung for o in mine),
        back,
        first,
    )


def first_errors(outcomes: list[Outcome], limit: int = 5) -> list[str]:
    seen: list[str] = []
    for outcome in outcomes:
        if outcome.error and outcome.error not in seen and len(seen) < limit:
            seen.append(outcome.error)
    return seen


def baseline_kv(stack: Stack, timeout: float) -> dict[str, int]:
    """KV blocks in use per worker, once every worker answers: one still restarting after
    an earlier fault has no baseline, and its blocks would count as leaked later."""
    now = _poll_kv(stack, lambda counts: all(n >= 0 for n in counts.values()), timeout)
    silent = sorted(w for w, n in now.items() if n < 0)
    if silent:
        raise RuntimeError(
            f"no KV baseline: {', '.join(silent)} did not answer within {timeout:.0f}s"
        )
    return now


def settle_kv(stack: Stack, before: dict[str, int], timeout: float) -> dict[str, int]:
    """KV blocks in use per worker once they are back to `before` (or `timeout` passed)."""
    return _poll_kv(
        stack, lambda counts: all(n <= before.get(w, 0) for w, n in counts.items()), timeout
    )


def _poll_kv(
    stack: Stack, done: Callable[[dict[str, int]], bool], timeout: float
) -> dict[str, int]:
    """KV blocks in use per worker once `done` holds of them, or as they are at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        now = kv_in_use(stack)
        if done(now) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def kv_in_use(stack: Stack) -> dict[str, int]:
    """KV blocks each prefill, decode and attention worker holds (cached ones are free)."""
    workers = [(p.service, p.name) for p in stack.processes if p.service in KV_SERVICES]
    return asyncio.run(_kv_in_use(stack, workers))


async def _kv_in_use(stack: Stack, workers: list[tuple[str, str]]) -> dict[str, int]:
    bus = await stack.bus("chaos-kv")
    try:
        stats = await asyncio.gather(
            *(
                bus.request(subjects.worker_stats(service, name), StatsRequest(), 5.0)
                for service, name in workers
            ),
            return_exceptions=True,
        )
    finally:
        await bus.nc.close()
    return {name: _in_use(s) for (_, name), s in zip(workers, stats)}


def _in_use(stats: WorkerStats | AttentionStats | BaseException) -> int:
    """Blocks in use; -1 for a worker that did not answer."""
    if isinstance(stats, BaseException):
        return -1
    if isinstance(stats, AttentionStats):
        return stats.used_blocks
    return stats.total_blocks - stats.free_blocks
