"""A trace from parameters: plan the requests, give them block ids, keep the window.

The window is the first `requests` arrivals from time 0, or those before `duration`
seconds; it is planned with a margin, and planned again with a wider one in the rare case
the margin held too few. The same parameters always give the same rows."""

from __future__ import annotations

from loadgen.trace import TraceRow
from loadgen.tracegen import hashids
from loadgen.tracegen.params import DEFAULT_REQUESTS, GenParams
from loadgen.tracegen.plan import plan
from shared.errors import KvstackError

MARGINS = (1.3, 2.0, 4.0, 8.0)  # planned window over the expected one


def build(params: GenParams) -> list[TraceRow]:
    """The trace's rows in arrival order, timestamps from the first one, ids numbered by
    first appearance."""
    for margin in MARGINS:
        rows = _build(params, margin)
        if rows is not None:
            return rows
    raise KvstackError("could not plan enough requests; raise --rate or --duration")


def wanted_requests(params: GenParams) -> int | None:
    if params.requests is None and params.duration is None:
        return DEFAULT_REQUESTS
    return params.requests


def planned_window(params: GenParams, wanted: int | None, margin: float) -> float:
    if wanted is None:
        assert params.duration is not None
        return params.duration
    window = wanted / params.rate * margin
    return window if params.duration is None else min(window, params.duration)


def _build(params: GenParams, margin: float) -> list[TraceRow] | None:
    wanted = wanted_requests(params)
    window = planned_window(params, wanted, margin)
    planned = plan(params, window)
    order = hashids.arrival_order(planned.requests)
    ids = hashids.assign(planned, order)
    kept = [i for i in order if 0 <= planned.requests[i].time < window][:wanted]
    if wanted is not None and len(kept) < wanted and window != params.duration:
        return None
    if not kept:
        raise KvstackError("no request arrived in the window; raise --rate or --duration")
    first = planned.requests[kept[0]].time
    return [
        TraceRow(
            planned.requests[i].time - first,
            planned.requests[i].input_length,
            planned.requests[i].output_length,
            block_ids,
        )
        for i, block_ids in zip(kept, hashids.renumber([ids[i] for i in kept]))
    ]
