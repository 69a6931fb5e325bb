"""Load or recompute, per request, from what the prefill worker measured lately: the KV
pool's (or a peer's) bytes a second over its recent fetches, and the engine's prefill
tokens a second. A prefix is loaded only where loading it is predicted faster than
computing what the prefill would compute without it (a live load overlaps computing the
rest of the prompt layer by layer, so that is all the prompt past its local prefix), and
a fetch, once started, is never waited on longer than the prompt's own prefill would
take: past that it has stalled, and the prompt is computed instead. Pure: the live worker
keeps the measures (services/prefill/prefix.py), the simulator predicts with its cost
model (loadgen/sim/prefill.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shared.engine.step_time import smoothed

STALL_FACTOR = 3.0  # without a prefill rate yet: a fetch may take this many times its
# predicted time
MIN_STALL_SECONDS = 0.25  # any fetch may take this long (a small one's latency varies)


@dataclass(frozen=True, slots=True)
class Rates:
    """A worker's recent rates (0: not measured yet)."""

    load_bytes_per_s: float = 0.0  # prefix fetches, asked until the last layer landed
    prefill_tokens_per_s: float = 0.0  # prompt tokens computed per second of compute


def seconds(amount: float, rate: float) -> float | None:
    """How long `amount` takes at `rate` (None: the rate is not known yet)."""
    return amount / rate if rate > 0 else None


def worth_loading(load_seconds: float | None, compute_seconds: float | None) -> bool:
    """Load unless computing is known to be faster (an unknown rate loads: the measure
    comes from loading)."""
    return load_seconds is None or compute_seconds is None or load_seconds <= compute_seconds


def stall_bound(rates: Rates, nbytes: int, num_prompt_tokens: int, ceiling: float) -> float:
    """Seconds a fetch of `nbytes` may take before the request gives up on it and computes
    instead: as long as the whole prompt's prefill would take (a loaded prefix must not
    cost more than computing it), else a few times the fetch's predicted time; never
    more than `ceiling`."""
    own = seconds(num_prompt_tokens, rates.prefill_tokens_per_s)
    predicted = seconds(nbytes, rates.load_bytes_per_s)
    if own is not None:
        bound = own
    elif predicted is not None:
        bound = STALL_FACTOR * predicted
    else:
        return ceiling
    return min(max(MIN_STALL_SECONDS, bound), ceiling)


def after_load(rates: Rates, nbytes: int, load_seconds: float) -> Rates:
    """The rates after a fetch of `nbytes` that landed whole in `load_seconds`."""
    mean = _moved(rates.load_bytes_per_s, nbytes, load_seconds)
    return dataclasses.replace(rates, load_bytes_per_s=mean)


def after_prefill(rates: Rates, num_computed: int, compute_seconds: float) -> Rates:
    """The rates after a prefill that computed `num_computed` tokens in `compute_seconds`."""
    mean = _moved(rates.prefill_tokens_per_s, num_computed, compute_seconds)
    return dataclasses.replace(rates, prefill_tokens_per_s=mean)


def _moved(mean: float, amount: float, seconds_taken: float) -> float:
    """A moving average of rates after `amount` in `seconds_taken` (the first measure
    starts it; an empty one leaves it)."""
    if amount <= 0 or seconds_taken <= 0:
        return mean
    rate = amount / seconds_taken
    return smoothed(mean, rate) if mean else rate
