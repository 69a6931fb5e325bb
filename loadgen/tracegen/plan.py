"""Who asks what, and when: a workload's requests before their block ids.

Work arrives as *starts*: a single request, or the first turn of a session whose later
turns follow one think time apart. Starts arrive in loadgen's gamma process
(`loadgen/arrivals.py`) at the rate that makes all turns together arrive at `rate`. Each
start's story (session or not, prefix, lengths, think times) is drawn from its own
generator, seeded by (seed, start index), so a change of one knob (the tuner's) changes
the other draws as little as possible.

Starts begin a warm-up before time 0, so that the window the trace keeps opens on
sessions already under way, as a real trace's window does.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from loadgen.arrivals import arrival_times
from loadgen.tracegen.params import GenParams

LONG_SIGMA = 0.25  # spread of the long-context outliers around --long-input
WARM_UP_SPANS = 4  # warm-up = this many mean session spans (about 2% of sessions last longer)
START_STREAM, PREFIX_STREAM, ARRIVAL_STREAM = 0, 1, 2


@dataclass(frozen=True)
class Planned:
    time: float  # seconds; negative during the warm-up
    input_length: int
    output_length: int
    parent: int | None  # the previous turn of its session (an index into the plan)
    prefix: int | None  # the shared prefix a first turn starts with
    session: int  # the start it belongs to
    turn: int


@dataclass(frozen=True)
class Plan:
    requests: list[Planned]  # in start order, each session's turns in order
    prefix_lengths: tuple[int, ...]


def plan(params: GenParams, window: float) -> Plan:
    """The requests of the starts that arrive before `window` seconds, from the warm-up on."""
    prefixes = prefix_lengths(params)
    popularity = zipf_cdf(params.system_prompts, params.system_zipf)
    start_rate = params.rate / requests_per_start(params)
    warm_up = warm_up_time(params, window)
    count = max(1, math.ceil(start_rate * (warm_up + window)))
    seed = int(np.random.SeedSequence([params.seed, ARRIVAL_STREAM]).generate_state(1)[0])
    requests: list[Planned] = []
    for index, time in enumerate(arrival_times(count, start_rate, params.burstiness, seed)):
        plan_start(params, index, time - warm_up, prefixes, popularity, requests)
    return Plan(requests, prefixes)


def plan_start(
    params: GenParams,
    index: int,
    time: float,
    prefixes: tuple[int, ...],
    popularity: list[float],
    out: list[Planned],
) -> None:
    """Appends the start's requests: one, or a session's turns until the context is full."""
    rng = np.random.default_rng([params.seed, START_STREAM, index])
    # NOTE: every start draws the same numbers in the same order, used or not.
    u_session, u_prefix, u_choice, u_long = rng.random(4)
    extra_turns = int(rng.geometric(1.0 / (params.turns_mean - 1.0)))
    turns = 1 + extra_turns if u_session < session_start_share(params) else 1
    prefix = None
    if params.uses_prefixes and u_prefix < params.system_share:
        prefix = min(bisect.bisect_right(popularity, u_choice), len(prefixes) - 1)
    prompt = prefixes[prefix] if prefix is not None else 0
    message = first_message(params, rng, long=u_long < params.long_share)
    parent, answer = None, 0
    for turn in range(turns):
        if turn:
            time += float(rng.exponential(params.think_time))
            message = lognormal(rng, params.turn_input_mean, params.input_sigma)
        length = prompt + answer + message
        if length > params.input_max and turn:
            return  # the context is full: the session ends
        prompt, answer = min(length, params.input_max), output_length(params, rng)
        out.append(
            Planned(time, prompt, answer, parent, prefix if turn == 0 else None, index, turn)
        )
        parent = len(out) - 1


def first_message(params: GenParams, rng: np.random.Generator, long: bool) -> int:
    if long:
        return lognormal(rng, params.long_input, LONG_SIGMA)
    return lognormal(rng, params.input_mean, params.input_sigma)


def output_length(params: GenParams, rng: np.random.Generator) -> int:
    return min(lognormal(rng, params.output_mean, params.output_sigma), params.output_max)


def lognormal(rng: np.random.Generator, mean: float, sigma: float) -> int:
    """A length of `mean` tokens on average (before rounding), at least 1."""
    return max(1, round(mean * math.exp(sigma * rng.standard_normal() - sigma * sigma / 2)))


def prefix_lengths(params: GenParams) -> tuple[int, ...]:
    rng = np.random.default_rng([params.seed, PREFIX_STREAM])
    sigma = params.system_sigma
    scale = np.exp(sigma * rng.standard_normal(params.system_prompts) - sigma * sigma / 2)
    lengths = np.clip(np.rint(params.system_tokens * scale), 1, params.input_max - 1)
    return tuple(int(n) for n in lengths)


def zipf_cdf(count: int, exponent: float) -> list[float]:
    weights = np.arange(1, count + 1, dtype=float) ** -exponent
    return (np.cumsum(weights) / weights.sum()).tolist() if count else []


def session_start_share(params: GenParams) -> float:
    """The share of starts that are sessions, for `session_share` of all requests."""
    share, turns = params.session_share, params.turns_mean
    return share / (turns * (1 - share) + share)


def requests_per_start(params: GenParams) -> float:
    """Mean requests per start, ignoring sessions cut short by a full context."""
    return 1 + session_start_share(params) * (params.turns_mean - 1)


def warm_up_time(params: GenParams, window: float) -> float:
    if params.session_share == 0:
        return 0.0
    span = (params.turns_mean - 1) * params.think_time
    return min(WARM_UP_SPANS * span, 2 * window)
