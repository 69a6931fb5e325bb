"""A chaos run on a compose stack: a steady load of streaming greedy requests, each fault in
turn, then per fault what became of the requests that ended between it and the next one
(`bench.chaos.runner.Row`), how many were in flight when it hit, and what the requests of
its phase cost in TTFT and TPOT beside the undisturbed warm-up's."""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from bench.chaos.load import Case, Outcome, SteadyLoad
from bench.chaos.runner import Row, first_errors, row_of
from bench.compose.faults import Fault, heal, inject
from bench.compose.stack import ComposeStack
from shared.errors import KvstackError


@dataclass(frozen=True)
class ComposeChaosConfig:
    faults: tuple[Fault, ...]
    concurrency: int = 4
    max_tokens: int = 48
    settle_seconds: float = 10.0  # load alone before the first fault and after the last
    phase_seconds: float = 30.0  # from one fault to the next, at least
    request_timeout: float = 240.0  # a request still open after this is hung
    recover_timeout: float = 240.0
    model: str = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Phase:
    row: Row
    in_flight: int  # requests open when the fault hit
    victim: str  # the container it hit
    victim_load: int  # requests the victim held then (-1: not a worker)
    ttft_s: float | None  # medians over the phase's completed requests
    tpot_s: float | None
    # NOTE: the longest prompt's own, apart: its KV is what a slow link delays, and the
    # short prompts, far more of them, hide it in any percentile of all
    long_ttft_s: float | None = None
    long_tpot_s: float | None = None
    # a long prompt no worker has seen, sent once in the phase: (TTFT, KV transfer) seconds
    probe: tuple[float, float] | None = None
    # requests begun once the stack was back after the fault (and before the next fault) that
    # ended with an error, in whatever phase they ended: the stack must serve them all
    errored_after_heal: int = 0


@dataclass
class ComposeChaosReport:
    phases: list[Phase]
    errors: list[str]

    @property
    def ok(self) -> bool:
        return all(p.row.lost == 0 and p.row.hung == 0 for p in self.phases)

    def to_json(self) -> dict:
        return {"phases": [asdict(p) for p in self.phases], "errors": self.errors, "ok": self.ok}


def run_compose_chaos(
    stack: ComposeStack,
    cases: list[Case],
    config: ComposeChaosConfig,
    say: Callable[[str], None] = lambda _: None,
) -> ComposeChaosReport:
    load = SteadyLoad(
        stack.api_url,
        config.model,
        cases,
        config.max_tokens,
        config.concurrency,
        config.request_timeout,
        stack.api_key,
    )
    load.start()
    time.sleep(config.settle_seconds)
    warm_probe = probe(stack, config.model, cases)
    hits = [_apply(stack, load, fault, config, say) for fault in config.faults]
    load.phase = "after"
    time.sleep(config.settle_seconds)
    say("stopping the load")
    load.stop()
    phases = [replace(_phase("warmup", load.outcomes, cases, None, None, None), probe=warm_probe)]
    ats = [at for _, _, (at, _), *_ in hits] + [float("inf")]
    phases += [
        replace(
            _phase(name, load.outcomes, cases, *hit),
            errored_after_heal=_errored_between(load.outcomes, healed, ats[i + 1]),
        )
        for i, (name, healed, *hit) in enumerate(hits)
    ]
    phases.append(_phase("after", load.outcomes, cases, None, None, None))
    return ComposeChaosReport(phases, first_errors(load.outcomes))


def _apply(stack: ComposeStack, load: SteadyLoad, fault: Fault, config, say) -> tuple:
    _until_in_flight(load)
    say(f"fault: {fault.name}")
    load.phase, at, in_flight = fault.name, time.monotonic(), load.in_flight()
    injected = inject(stack, fault)
    measured = probe(stack, config.model, load.cases) if fault.action == "slow-link" else None
    heal(injected)
    back = _wait_back(stack, injected, fault, config.recover_timeout)
    healed = time.monotonic()  # and back (or given up on)
    say(f"{fault.name}: hit {injected.victim.name} ({in_flight} in flight); back after "
        f"{'-' if back is None else f'{back:.1f}s'}")  # fmt: skip
    time.sleep(max(0.0, at + config.phase_seconds - time.monotonic()))
    return fault.name, healed, (at, back), in_flight, injected, measured


def _errored_between(outcomes: list[Outcome], begin: float, end: float) -> int:
    return sum(bool(o.error) and begin <= o.started < end for o in outcomes)


def _until_in_flight(load: SteadyLoad, timeout: float = 60) -> None:
    """A fault must land on work in flight: wait until a request is open."""
    deadline = time.monotonic() + timeout
    while load.in_flight() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_back(stack: ComposeStack, injected, fault: Fault, timeout: float) -> float | None:
    """Seconds from the fault's end until the victim was restarted (a kill) and every
    container is healthy and the gateway ready; None past `timeout`."""
    began, victim = time.monotonic(), injected.victim
    while fault.action == "kill" and stack.container(victim.name).restarts <= victim.restarts:
        if time.monotonic() - began > timeout:
            return None
        time.sleep(0.2)
    try:
        stack.wait_ready(max(1.0, timeout - (time.monotonic() - began)))
    except KvstackError:
        return None
    return time.monotonic() - began


def _phase(
    name: str,
    outcomes: list[Outcome],
    cases: list[Case],
    marks: tuple[float, float | None] | None,
    in_flight: int | None,
    injected,
    measured: tuple[float, float] | None = None,
) -> Phase:
    at, back = marks if marks is not None else (None, None)
    row = row_of(name, outcomes, cases, at, back)
    done = [o for o in outcomes if o.phase == name and o.completed]
    longest = max(range(len(cases)), key=lambda i: len(cases[i].prompt))
    long = [o for o in done if o.case == longest]
    return Phase(
        row,
        in_flight or 0,
        injected.victim.name if injected is not None else "",
        injected.victim_load if injected is not None else -1,
        _median([o.ttft for o in done]),
        _median([o.tpot for o in done]),
        _median([o.ttft for o in long]),
        _median([o.tpot for o in long]),
        measured,
    )


def probe(stack: ComposeStack, model: str, cases: list[Case]) -> tuple[float, float] | None:
    """One request for the longest case's prompt made new (so no worker holds its KV),
    its TTFT and KV transfer seconds, from its usage; None when it failed."""
    longest = max(cases, key=lambda c: len(c.prompt))
    # NOTE: new from its first block on: no cache anywhere holds any of it
    fresh = [*uuid.uuid4().bytes, *longest.prompt]
    body = {"model": model, "prompt": fresh, "max_tokens": 2, "temperature": 0}
    request = urllib.request.Request(
        f"{stack.api_url}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {stack.api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            timing = json.load(response)["usage"]["timing"]
    except (OSError, KeyError, ValueError):
        return None
    return timing["ttft"], timing["kv_transfer"]


def _median(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None
