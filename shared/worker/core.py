"""Decisions prefill and decode workers share, free of I/O: whether a request is taken at
all, the status code of a request the engine ended with an error, and a heartbeat built
from the load numbers (the live workers read them off the engine, the simulator off its
nodes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from shared.engine.output import REQUEST_ERROR, UNSATISFIABLE_ERROR
from shared.engine.stats import EngineStats
from shared.messages import Heartbeat


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a worker does not take a request: a metrics label, the message, an HTTP code."""

    label: str
    reason: str
    code: int


def draining_refusal(service: str) -> Refusal:
    """A draining worker takes nothing new: 503, so that the request is placed elsewhere."""
    return Refusal("draining", f"{service} worker is draining", 503)


def invalid_prompt(problem: str) -> Refusal:
    """The prompt is the client's fault (400): no other worker would take it either."""
    return Refusal("invalid", problem, 400)


def intake_refusal(draining: bool, prompt_problem: str, service: str) -> Refusal | None:
    """Whether a worker refuses a new request: draining, then an invalid prompt."""
    if draining:
        return draining_refusal(service)
    if prompt_problem:
        return invalid_prompt(prompt_problem)
    return None


def error_code(error_kind: str) -> int:
    """A request the engine ended with an error: 400 when what it asks cannot be done,
    500 when it was the request's own fault otherwise (a retry fails again), else 503
    (another worker goes on with it)."""
    if error_kind == UNSATISFIABLE_ERROR:
        return 400
    return 500 if error_kind == REQUEST_ERROR else 503


def load_heartbeat(
    service: str,
    worker_id: str,
    now: float,
    interval: float,
    block_size: int,
    load: EngineStats,
    *,
    http_addr: str = "",
    data_addr: str = "",
    model: str = "",
    draining: bool = False,
    caches_prefixes: bool = True,
) -> Heartbeat:
    return Heartbeat(
        service,
        worker_id,
        now,
        interval,
        http_addr=http_addr,
        data_addr=data_addr,
        model=model,
        block_size=block_size,
        draining=draining,
        caches_prefixes=caches_prefixes,
        **asdict(load),
    )
