"""Admission under overload (Mooncake §7): whether a placed request is worth starting.

`none` admits all. `baseline` checks only the prefill stage here (predicted TTFT); the
decode worker checks its own TBT when the KV arrives, after prefill was spent (the
paper's baseline, whose wasted prefill early rejection avoids). `early` also checks the
decode worker's TBT now. `predictive` checks the decode load forecast for the moment the
prefill ends, every request decoding for one uniform time (system-level, as deployed in
the paper). `predictive-request` forecasts the chosen worker with each request's own
expected decode time (its max_tokens, and output lengths seen for its prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.conductor.config import SchedulingConfig
from shared.conductor.forecast import Ledger, tbt_at
from shared.conductor.outputs import OutputLengths
from shared.conductor.policies import Choice, Inputs
from shared.errors import OVERLOADED
from shared.messages import PlacementRequest

FORECAST_MODES = ("predictive", "predictive-request")


@dataclass(frozen=True, slots=True)
class Slo:
    ttft: float
    tbt: float


def slo_of(request: PlacementRequest, config: SchedulingConfig) -> Slo:
    """The request's own SLOs where it set them, else the conductor's defaults."""
    return Slo(request.slo_ttft or config.slo_ttft, request.slo_tbt or config.slo_tbt)


def verdict(inputs: Inputs, choice: Choice, ledger: Ledger, outputs: OutputLengths) -> str:
    """ "" to admit; otherwise why not, for the client."""
    mode = inputs.config.admission
    if mode == "none":
        return ""
    slo = slo_of(inputs.request, inputs.config)
    if choice.ttft > slo.ttft:
        return f"{OVERLOADED}predicted TTFT {choice.ttft:.3g}s exceeds the SLO {slo.ttft:.3g}s"
    if mode == "baseline":
        return ""
    tbt = decode_tbt(inputs, choice, ledger, outputs)
    if tbt > slo.tbt:
        return (
            f"{OVERLOADED}predicted TBT {tbt * 1000:.3g}ms exceeds the SLO {slo.tbt * 1000:.3g}ms"
        )
    return ""


def decode_tbt(inputs: Inputs, choice: Choice, ledger: Ledger, outputs: OutputLengths) -> float:
    """The TBT the mode judges by: now (early), or forecast for when prefill ends."""
    mode = inputs.config.admission
    if mode == "early":
        return choice.tbt
    now, t = inputs.snapshot.time, inputs.snapshot.time + choice.ttft
    n = inputs.request.num_prompt_tokens
    chosen = next(w for w in inputs.snapshot.decode if w.worker_id == choice.decode_id)
    if mode == "predictive-request":
        return tbt_at(ledger, chosen, now, t, inputs.cost, n)
    slo_tbt = slo_of(inputs.request, inputs.config).tbt
    loads = [
        tbt_at(ledger, w, now, t, inputs.cost, n if w is chosen else 0) / slo_tbt
        for w in inputs.snapshot.decode
    ]
    return sum(loads) / len(loads) * slo_tbt


def forecasts(config: SchedulingConfig) -> bool:
    """Whether the mode reads the decode ledger (the others need no bookings)."""
    return config.admission in FORECAST_MODES


def decode_duration(inputs: Inputs, choice: Choice, outputs: OutputLengths) -> float:
    """How long the request is booked on its decode worker."""
    if inputs.config.admission != "predictive-request":
        return outputs.uniform_decode_time()
    request = inputs.request
    first = request.block_hashes[0] if request.block_hashes else 0
    return outputs.expected_tokens(first, request.max_tokens) * choice.tbt
