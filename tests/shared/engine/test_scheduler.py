from shared.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from shared.engine.sequence import SeqStatus, Sequence
from shared.kvcache import KVCacheManager
from shared.sampling_params import SamplingParams

BS = 4


def make(
    num_blocks: int = 64,
    budget: int = 64,
    max_seqs: int = 8,
    chunked: bool = True,
    long_prefill_tokens: int | None = None,
):
    kv = KVCacheManager(num_blocks, BS)
    config = SchedulerConfig(budget, max_seqs, chunked, long_prefill_tokens)
    return Scheduler(config, kv), kv


def seq(rid: str, n: int, first: int = 0) -> Sequence:
    return Sequence(rid, list(range(first, first + n)), SamplingParams(), BS, "test")


def advance(sched: Scheduler, out: SchedulerOutput) -> None:
    """What the engine does after the model step: count computed tokens, sample when caught up."""
    for s in out.scheduled:
        s.seq.num_computed_tokens += s.num_new_tokens
        sched.kv.name_full_blocks(s.seq.request_id, s.seq.block_hashes, s.seq.num_computed_tokens)
        if s.seq.num_computed_tokens == s.seq.num_tokens:
            s.seq.append(1000)


def plan(out: SchedulerOutput) -> dict[str, int]:
    return {s.seq.request_id: s.num_new_tokens for s in out.scheduled}


def test_requests_join_and_leave_between_steps() -> None:
    sched, kv = make()
    a = seq("a", 6)
    sched.add(a)
    out = sched.schedule()
    assert plan(out) == {"a": 6}
    advance(sched, out)
    sched.add(seq("b", 3))
    out = sched.schedule()
    assert plan(out) == {"a": 1, "b": 3}
    advance(sched, out)
    sched.finish(a, "stop")
    assert a.status is SeqStatus.FINISHED and kv.block_ids("a") == []
    assert plan(sched.schedule()) == {"b": 1}


def test_token_budget_chunks_prefill_after_decodes() -> None:
    sched, _ = make(budget=10)
    sched.add(seq("a", 3))
    advance(sched, sched.schedule())
    sched.add(seq("long", 25, first=100))
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        assert plan(out)["a"] == 1  # the decode always goes first
        chunks.append(plan(out)["long"])
        advance(sched, out)
    assert chunks == [9, 9, 7]


def test_without_chunked_prefill_a_long_prompt_waits_for_the_budget() -> None:
    sched, _ = make(budget=10, chunked=False)
    sched.add(seq("long", 25))
    assert plan(sched.schedule()) == {}


def test_admission_waits_when_blocks_are_short() -> None:
    sched, _ = make(num_blocks=4)
    sched.add(seq("a", 12))
    sched.add(seq("b", 8, first=50))
    out = sched.schedule()
    assert plan(out) == {"a": 12}
    assert [s.request_id for s in sched.waiting] == ["b"]


def test_out_of_blocks_preempts_the_latest_and_recomputes_it() -> None:
    sched, kv = make(num_blocks=4)
    sched.add(seq("a", 8))
    sched.add(seq("b", 7, first=50))
    out = sched.schedule()
    assert plan(out) == {"a": 8, "b": 7}
    advance(sched, out)  # a: 9 tokens (needs a 3rd block), b: 8 tokens
    out = sched.schedule()
    assert [s.request_id for s in out.preempted] == ["b"]
    assert plan(out) == {"a": 1}
    assert sched.waiting[0].request_id == "b" and sched.waiting[0].num_computed_tokens == 0
    assert kv.block_ids("b") == []


def test_a_lone_sequence_that_cannot_grow_preempts_itself() -> None:
    sched, _ = make(num_blocks=2)
    a = seq("a", 8)
    sched.add(a)
    advance(sched, sched.schedule())
    out = sched.schedule()
    assert out.preempted == [a] and out.scheduled == []


def test_prefix_hit_skips_cached_blocks_but_computes_the_last_token() -> None:
    sched, _ = make()
    a = seq("a", 8)
    sched.add(a)
    advance(sched, sched.schedule())
    sched.finish(a, "stop")
    b = seq("b", 8)  # same 8 tokens: both blocks cached, yet one token must run
    c = seq("c", 10)
    sched.add(b)
    sched.add(c)
    out = sched.schedule()
    assert plan(out) == {"b": 4, "c": 2}
    assert b.num_cached_tokens == 4 and c.num_cached_tokens == 8


def test_max_num_seqs_limits_the_running_set() -> None:
    sched, _ = make(max_seqs=2)
    for i in range(3):
        sched.add(seq(f"r{i}", 3, first=10 * i))
    assert set(plan(sched.schedule())) == {"r0", "r1"}


# -- fair prefill ----------------------------------------------------------------------------


def test_the_chunk_cap_defaults_to_a_quarter_of_the_budget_and_at_least_a_block() -> None:
    assert make(budget=64)[0].prefill_chunk_cap == 16
    assert make(budget=8)[0].prefill_chunk_cap == BS
    assert make(long_prefill_tokens=0)[0].prefill_chunk_cap == 0
    assert make(chunked=False)[0].prefill_chunk_cap == 0  # a prompt runs whole or not at all


def test_a_long_prompt_alone_takes_the_whole_budget() -> None:
    sched, _ = make(num_blocks=128)
    sched.add(seq("long", 200))
    chunks = []
    while sched.waiting or sched.running[0].num_output_tokens == 0:
        out = sched.schedule()
        chunks.append(plan(out)["long"])
        advance(sched, out)
    assert chunks == [64, 64, 64, 8]


def test_a_short_prompt_behind_a_long_one_runs_whole_in_the_next_step() -> None:
    sched, _ = make(num_blocks=128)
    sched.add(seq("long", 200))
    advance(sched, sched.schedule())
    sched.add(seq("short", 10, first=500))
    out = sched.schedule()
    assert plan(out) == {"long": 16, "short": 10}  # the long one gets the cap, no more
    advance(sched, out)
    # The short one decodes first; the long one prefills alone again, with what is left.
    assert list(plan(sched.schedule()).items()) == [("short", 1), ("long", 63)]


def test_prompts_prefilling_together_each_get_the_cap() -> None:
    sched, _ = make(num_blocks=128)
    sched.add(seq("a", 100))
    sched.add(seq("b", 100, first=200))
    sched.add(seq("c", 8, first=400))
    assert plan(sched.schedule()) == {"a": 16, "b": 16, "c": 8}


def test_without_fairness_a_long_prompt_holds_the_budget_as_before() -> None:
    sched, _ = make(num_blocks=128, long_prefill_tokens=0)
    sched.add(seq("long", 200))
    advance(sched, sched.schedule())
    sched.add(seq("short", 10, first=500))
    steps = []
    while sched.waiting:
        out = sched.schedule()
        steps.append(plan(out))
        advance(sched, out)
    # The short one waits until the long prompt's last chunk leaves room in a step.
    assert steps == [{"long": 64}, {"long": 64}, {"long": 8, "short": 10}]
