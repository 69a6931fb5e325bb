"""The fast policies decide exactly as the statement of Algorithm 1 (kvcentric.py), on
generated clusters and requests: equal shapes and queues (ties), workers that hold none
of the prompt, prefixes on peers and in the pool (and on workers gone from the cluster),
decode workers too small or too full, excluded workers, mixed block sizes, SLOs missed."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.conductor import admission, kvcentric, policies
from shared.conductor.config import SchedulingConfig
from shared.conductor.forecast import Ledger
from shared.conductor.loads import Pending, WorkerLoad
from shared.conductor.outputs import OutputLengths
from shared.conductor.policies import Choice, Inputs
from shared.conductor.snapshot import ClusterSnapshot, PrefixMatch
from shared.costmodel import CostModel, roofline
from tests.shared.conductor.builders import COST, request

EXAMPLES = settings(max_examples=600, deadline=None, database=None)
COSTS: tuple[CostModel, ...] = (COST, roofline("llama3-70b", "a800"))


@st.composite
def some_ids(draw: st.DrawFn, max_size: int) -> list[int]:
    """Worker numbers; none one time in eight (an empty pool)."""
    if draw(st.integers(0, 7)) == 0:
        return []
    return draw(st.lists(st.integers(0, 9), min_size=1, max_size=max_size, unique=True))


@st.composite
def prefill_workers(draw: st.DrawFn) -> list[WorkerLoad]:
    sizes = draw(st.sampled_from(((16,), (16,), (16, 32))))
    ids = draw(some_ids(max_size=7))
    return [
        prefill_worker(
            f"p{i}",
            draw(st.sampled_from((0, 0, 1, 2))),
            draw(st.sampled_from((0, 700, 1500))),
            draw(st.sampled_from((Pending(), Pending(), Pending(300, 1, 0.25)))),
            draw(st.sampled_from(sizes)),
        )
        for i in ids
    ]


def prefill_worker(
    worker_id: str, waiting: int, tokens_each: int, pending: Pending, block_size: int
) -> WorkerLoad:
    return WorkerLoad(
        worker_id,
        "prefill",
        0,
        waiting + pending.requests,
        waiting * tokens_each + pending.tokens,
        1000,
        1000,
        block_size,
        pending=pending,
    )


@st.composite
def decode_workers(draw: st.DrawFn) -> list[WorkerLoad]:
    workers = []
    for i in draw(some_ids(max_size=6)):
        total = draw(st.sampled_from((0, 80, 1000, 1000)))  # 0: a worker with no KV pool
        workers.append(
            WorkerLoad(
                f"d{i}",
                "decode",
                draw(st.sampled_from((0, 0, 3, 9))),
                draw(st.sampled_from((0, 1))),
                0,
                min(total, draw(st.sampled_from((0, 3, 80, 1000)))),
                total,
                16,
                draw(st.sampled_from((0, 2000, 9000))),
            )
        )
    return workers


@st.composite
def placements(draw: st.DrawFn) -> Inputs:
    """A cluster, a prefix match and a request, with the early admission (Algorithm 1's
    step 6) and SLOs that may be missed."""
    prefill, decode = draw(prefill_workers()), draw(decode_workers())
    holders = [w.worker_id for w in prefill] + ["gone"]  # "gone": in the index, not alive
    by_worker = {
        w: draw(st.sampled_from((0, 3, 40, 40, 90)))
        for w in draw(st.lists(st.sampled_from(holders), unique=True))
    }
    pool = draw(st.sampled_from((0, 3, 40, 90, 200)))
    # blocks on their way into a worker's cache count as its own, not as sendable
    senders = None
    if draw(st.booleans()):
        senders = {w: draw(st.integers(0, blocks)) for w, blocks in by_worker.items()}
    everyone = [w.worker_id for w in prefill + decode]
    exclude = draw(st.lists(st.sampled_from(everyone), max_size=2, unique=True)) if everyone else []
    req = request(
        draw(st.sampled_from((1, 200, 1600, 3000))),
        f"r{draw(st.integers(0, 99))}",
        exclude=tuple(exclude),
        slo_ttft=draw(st.sampled_from((0.0, 0.05, 0.5, 5.0))),
        slo_tbt=draw(st.sampled_from((0.0, 0.012, 0.03, 1.0))),
    )
    config = SchedulingConfig(
        admission="early", balancing_threshold=draw(st.sampled_from((1.0, 1.5, 3.0)))
    )
    snapshot = ClusterSnapshot(0.0, tuple(prefill), tuple(decode))
    prefix = PrefixMatch(by_worker, pool, senders)
    return Inputs(snapshot, req, prefix, config, draw(st.sampled_from(COSTS)))


@EXAMPLES
@given(placements())
def test_kvcentric_decides_as_algorithm_1(inputs: Inputs) -> None:
    assert policies.kvcentric(inputs) == kvcentric.kvcentric(inputs)


@EXAMPLES
@given(placements())
def test_cache_aware_decides_as_algorithm_1_without_balancing(inputs: Inputs) -> None:
    assert policies.cache_aware(inputs) == kvcentric.cache_aware(inputs)


@EXAMPLES
@given(placements())
def test_early_admission_rejects_as_algorithm_1(inputs: Inputs) -> None:
    fast, reference = policies.kvcentric(inputs), kvcentric.kvcentric(inputs)
    if isinstance(fast, Choice) and isinstance(reference, Choice):
        verdict = admission.verdict(inputs, fast, Ledger(), OutputLengths(20.0))
        assert bool(verdict) == kvcentric.over_slo(inputs, reference)


@EXAMPLES
@given(placements())
def test_the_fast_path_keeps_nothing_between_decisions(inputs: Inputs) -> None:
    """A policy is a function of its inputs: asked twice, or after another request on
    the same snapshot, it answers the same."""
    first = policies.kvcentric(inputs)
    other = replace(inputs, request=replace(inputs.request, num_prompt_tokens=17))
    policies.kvcentric(other)
    assert policies.kvcentric(inputs) == first
