"""Whether a decode worker adopts a request once prefill committed its KV."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import OVERLOADED
from shared.messages import Ack


@dataclass(frozen=True, slots=True)
class CommitVerdict:
    """Adopt the request, or release its blocks and say why (503: placed again)."""

    adopt: bool
    reason: str = ""
    transfer_failed: bool = False  # its KV did not land intact
    wasted: bool = False  # prefilled, then rejected here: the prefill was spent for nothing

    def ack(self, request_id: str) -> Ack:
        return Ack(request_id, self.adopt, self.reason, 200 if self.adopt else 503)


ADOPT = CommitVerdict(True)


def current_tbt(mean_step_seconds: float, busy: bool) -> float:
    """The TBT a worker gives now: its mean step time while it decodes, 0 when idle."""
    return mean_step_seconds if busy else 0.0


def over_tbt_slo(tbt: float, stage_tbt_slo: float) -> str:
    """The baseline's decode-stage check, after prefill was spent: "" when `tbt` is within
    the request's SLO (or it has none), else the overload message."""
    if not stage_tbt_slo or tbt <= stage_tbt_slo:
        return ""
    return (
        f"{OVERLOADED}decode TBT {tbt * 1000:.3g}ms exceeds the SLO "
        f"{stage_tbt_slo * 1000:.3g}ms (prefill wasted)"
    )


def commit_verdict(transfer_problem: str, tbt: float, stage_tbt_slo: float) -> CommitVerdict:
    """The KV arrived (`transfer_problem` says what went wrong, "" when nothing): refuse it
    when it is not intact, reject the request when this worker's TBT is over its stage
    SLO, else adopt it."""
    if transfer_problem:
        return CommitVerdict(False, f"KV transfer failed: {transfer_problem}", transfer_failed=True)
    overload = over_tbt_slo(tbt, stage_tbt_slo)
    if overload:
        return CommitVerdict(False, overload, wasted=True)
    return ADOPT


def holds_kv_for_pool(num_pool_members: int) -> bool:
    """Whether an adopted request keeps its KV past its end: only to write it back to a
    kvstore pool that has members (the write-back frees it after; 0: no pool)."""
    return num_pool_members > 0
