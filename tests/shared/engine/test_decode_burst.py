"""Greedy decode steps chained in one native call (EngineConfig.decode_burst) against a token
a step, on the real SmolLM2: the same tokens, text, stops and named KV blocks; requests that
need every step's logits, a waiting request and a pool short of blocks keep single steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from shared.engine import burst as burst_module
from shared.engine.burst import burst_fits
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.output import RequestOutput
from shared.errors import KvstackError
from shared.model.kernels import cpu_ops
from shared.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


@pytest.fixture(autouse=True)
def bursts_of_any_time(monkeypatch) -> None:
    """Bursts as long as asked, however long this machine's steps take (the time cap has a
    test of its own)."""
    monkeypatch.setattr(burst_module, "BURST_EVENT_SECONDS", 60.0)


GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
PROMPT_A = [1, 504, 2, 17, 260, 9, 4, 30, 2, 88, 6, 1000, 3, 45]
PROMPT_B = [77, 12, 900, 4, 31, 7, 2000, 16]
SHIPPED_EVENT_SECONDS = burst_module.BURST_EVENT_SECONDS  # before a test changes it


@pytest.fixture(scope="module")
def engines(smollm2_dir) -> dict[int, LLMEngine]:
    """The shipped Q4_1 SmolLM2 (its head a GEMV the fused step computes), bursting 4 steps
    and stepping one at a time, on pools of their own."""
    config = EngineConfig(num_blocks=64)
    return {burst: LLMEngine(dataclasses.replace(config, decode_burst=burst)) for burst in (1, 4)}


@dataclasses.dataclass
class Run:
    """What each request got, and the most tokens one step gave each."""

    results: dict[str, tuple]
    most: dict[str, int]
    last: dict[str, int]  # the tokens of each request's last output

    @property
    def most_tokens_a_step(self) -> int:
        return max(self.most.values())


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> Run:
    got: dict[str, list[RequestOutput]] = {request_id: [] for request_id in requests}
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    while engine.has_unfinished:
        for out in engine.step():
            got[out.request_id].append(out)
    results = {request_id: summary(outs) for request_id, outs in got.items()}
    most = {r: max(len(out.new_token_ids) for out in outs) for r, outs in got.items()}
    return Run(results, most, {r: len(outs[-1].new_token_ids) for r, outs in got.items()})


def summary(outs: list[RequestOutput]) -> tuple:
    last = outs[-1]
    assert last.finished and not any(out.finished for out in outs[:-1])
    tokens = [t for out in outs for t in out.new_token_ids]
    logprobs = [lp for out in outs for lp in out.new_logprobs or ()]
    text = "".join(out.new_text for out in outs)
    assert last.num_output_tokens == len(tokens)
    return tokens, text, last.finish_reason, last.stop_reason, logprobs


def both(engines, requests, tag: str) -> tuple[Run, Run]:
    """The requests on each engine, under ids of their own (the engines live a module)."""
    tagged = {f"{tag}-{request_id}": request for request_id, request in requests.items()}
    return run(engines[1], tagged), run(engines[4], tagged)


def test_a_burst_gives_what_single_steps_give(engines) -> None:
    free = engines[1].generate([PROMPT_A], GREEDY)[0]
    assert engines[4].generate([PROMPT_A], GREEDY)[0] == free
    stop_token = free.token_ids[9]  # mid-burst: the prompt's step gives the first token
    stop_text = free.text[len(free.text) // 2 :][:3]
    assert stop_text.strip(), free.text
    requests = {
        "short": (PROMPT_A, dataclasses.replace(GREEDY, max_tokens=11)),
        "stop-token": (PROMPT_A, dataclasses.replace(GREEDY, stop_token_ids=(stop_token,))),
        "stop-string": (PROMPT_A, dataclasses.replace(GREEDY, stop=(stop_text,))),
        "eos": (PROMPT_B, dataclasses.replace(GREEDY, max_tokens=40, ignore_eos=False)),
    }
    single, burst = both(engines, requests, "same")
    assert burst.results == single.results
    assert single.most_tokens_a_step == 1 and burst.most_tokens_a_step == 4
    reasons = {request_id: r[2] for request_id, r in burst.results.items()}
    assert reasons["same-short"] == "length" and len(burst.results["same-short"][0]) == 11
    assert reasons["same-stop-token"] == reasons["same-stop-string"] == "stop"
    assert burst.results["same-stop-token"][3] == stop_token
    # the blocks each engine named for reuse: the same, by the same tokens' hashes
    assert sorted(engines[4].cached_block_hashes()) == sorted(engines[1].cached_block_hashes())
    for engine in engines.values():
        stats = engine.stats()
        assert stats.free_blocks == stats.total_blocks and not engine.has_unfinished


@pytest.mark.parametrize(
    "change",
    [
        dict(logprobs=2),
        dict(temperature=0.7, seed=5),
        dict(presence_penalty=0.5),
        dict(logit_bias=((13, 2.0),)),
    ],
    ids=["logprobs", "sampled", "penalty", "bias"],
)
def test_a_request_that_needs_each_steps_logits_keeps_the_batch_to_single_steps(
    engines, change
) -> None:
    requests = {
        "plain": (PROMPT_A, dataclasses.replace(GREEDY, max_tokens=9)),
        "needs-logits": (PROMPT_B, dataclasses.replace(GREEDY, max_tokens=9, **change)),
    }
    single, burst = both(engines, requests, "logits-" + "-".join(change))
    assert burst.most_tokens_a_step == 1
    assert burst.results == single.results


def test_a_request_waiting_for_a_step_keeps_the_running_ones_to_single_steps(
    smollm2_dir,
) -> None:
    """With one request at a time (max_num_seqs=1), the second waits while the first
    decodes: the first may not burst, or the second would wait longer for its first token."""
    engine = LLMEngine(EngineConfig(num_blocks=16, max_num_seqs=1, decode_burst=4))
    requests = {r: (PROMPT_A, dataclasses.replace(GREEDY, max_tokens=9)) for r in "ab"}
    got = run(engine, requests)
    assert got.results["a"] == got.results["b"]
    assert got.most == {"a": 1, "b": 4}  # "b" bursts once nobody waits


def test_a_pool_short_of_blocks_for_a_burst_steps_once_and_preempts_as_usual(engines) -> None:
    """Eight 127-token prompts fill the 64 blocks (16 tokens each): no row can have the block
    a burst needs, so each step is single, and the steps preempt as a token a step does."""
    requests = {f"r{i}": ([(7 * i + j) % 1000 + 10 for j in range(127)], GREEDY) for i in range(8)}
    single, burst = both(engines, requests, "short")
    assert burst.results == single.results
    assert all(len(r[0]) == 24 for r in burst.results.values())


def test_a_row_whose_logits_turn_non_finite_mid_burst_ends_as_single_steps_end_it(
    engines,
) -> None:
    """Position 32's rotary row made NaN in both engines' models: the request that reaches
    it (A: its prompt's 14 tokens, then decode steps from position 14 in bursts of 4, the
    first single while no step is timed yet: 32 is a burst's second or third step) keeps the
    tokens before it and ends with the sampler's error, as a token a step ends it; B, in the
    same bursts, stops at position 31 and is untouched."""
    poison = 32
    requests = {
        "a": (PROMPT_A, GREEDY),
        "b": (PROMPT_B, dataclasses.replace(GREEDY, max_tokens=poison - len(PROMPT_B) + 1)),
    }
    clean = run(engines[1], {"clean-b": requests["b"]})
    tables = [engine._runner.model.rotary.tables(64) for engine in engines.values()]
    kept = [(cos[poison].clone(), sin[poison].clone()) for cos, sin in tables]
    try:
        with torch.inference_mode():  # the engines made the tables in it
            for cos, sin in tables:
                cos[poison], sin[poison] = float("nan"), float("nan")
        single, burst = both(engines, requests, "nan")
    finally:
        with torch.inference_mode():
            for (cos, sin), (cos_row, sin_row) in zip(tables, kept, strict=True):
                cos[poison], sin[poison] = cos_row, sin_row
    assert burst.results == single.results
    tokens, _, finish, message, _ = burst.results["nan-a"]
    assert finish == "error" and message.startswith("sampling failed")
    assert len(tokens) == poison - len(PROMPT_A) + 1  # the prompt's token, then one a step
    assert burst.last["nan-a"] > 0  # the burst's steps before it gave tokens with the error
    assert burst.results["nan-b"] == clean.results["clean-b"]
    assert burst.most_tokens_a_step == 4


def test_decode_burst_must_be_positive() -> None:
    with pytest.raises(KvstackError, match="decode_burst must be positive, got 0"):
        EngineConfig(decode_burst=0)


def test_a_failed_burst_steps_once_and_the_engine_bursts_no_more(
    engines, smollm2_dir, monkeypatch, caplog
) -> None:
    engine = LLMEngine(EngineConfig(num_blocks=16, decode_burst=4))
    tried: list[int] = []

    def broken(chunks, steps, stop):
        tried.append(steps)
        raise RuntimeError("the native burst broke")

    monkeypatch.setattr(engine._runner, "burst", broken)
    requests = {"r": (PROMPT_A, dataclasses.replace(GREEDY, max_tokens=12))}
    got, want = run(engine, requests), run(engines[1], {"broken-r": requests["r"]})
    assert got.results["r"] == want.results["broken-r"] and got.most == {"r": 1}
    assert tried == [4]  # logged once, then a token a step
    assert "a burst of 4 decode steps failed" in caplog.text


def test_a_burst_takes_at_most_its_event_time_of_steps(engines, monkeypatch) -> None:
    """A burst's tokens reach the client together: its steps may take BURST_EVENT_SECONDS,
    sized by the engine's decode steps lately (a step of one until one is timed)."""
    monkeypatch.setattr(burst_module, "BURST_EVENT_SECONDS", SHIPPED_EVENT_SECONDS)
    assert SHIPPED_EVENT_SECONDS == 0.025
    assert burst_fits(4, 0.004) == 4 and burst_fits(8, 0.004) == 6
    assert burst_fits(4, 0.010) == 2 and burst_fits(4, 0.030) == 1
    assert burst_fits(4, 0.0) == 1
    monkeypatch.setattr(burst_module, "BURST_EVENT_SECONDS", 1e-6)  # every step "too slow"
    requests = {"r": (PROMPT_A, dataclasses.replace(GREEDY, max_tokens=9))}
    single, burst = both(engines, requests, "slow")
    assert burst.most_tokens_a_step == 1 and burst.results == single.results


def test_a_call_to_the_engine_ends_a_burst_after_its_step_in_progress(
    engines, smollm2_dir, monkeypatch
) -> None:
    """EngineLoop.call ends a burst (end_burst) so a new request waits for a step, not a
    burst: here every burst is ended as it starts, and each gives one step's tokens."""
    engine = LLMEngine(EngineConfig(num_blocks=16, decode_burst=4))
    bursts, burst = [], engine._runner.burst

    def ended_at_once(chunks, steps, stop):
        bursts.append(steps)
        engine.end_burst()  # as EngineLoop.call does from the event loop's thread
        return burst(chunks, steps, stop)

    monkeypatch.setattr(engine._runner, "burst", ended_at_once)
    requests = {"r": (PROMPT_A, dataclasses.replace(GREEDY, max_tokens=12))}
    got, want = run(engine, requests), run(engines[1], {"ended-r": requests["r"]})
    assert got.results["r"] == want.results["ended-r"]
    assert max(bursts) == 4 and min(bursts) >= 2 and got.most == {"r": 1}


def test_a_call_queued_before_a_step_ends_that_steps_burst_and_no_later_one(
    smollm2_dir,
) -> None:
    """A call queued after the engine loop ran its calls, before the next step, sets the
    flag ahead of the step: its burst gives one step's tokens, not a burst's; the flag is
    cleared as the step ends, so the next burst is whole."""
    engine = LLMEngine(EngineConfig(num_blocks=16, decode_burst=4))
    engine.add_request("r", PROMPT_A, dataclasses.replace(GREEDY, max_tokens=20))
    tokens = [len(out.new_token_ids) for out in engine.step()]  # the prompt: a token
    while max(tokens) < 4:  # until the engine has timed its decode steps and bursts
        tokens = [len(out.new_token_ids) for out in engine.step()]
    engine.end_burst()  # as EngineLoop.call does from the event loop's thread
    assert [len(out.new_token_ids) for out in engine.step()] == [1]
    assert [len(out.new_token_ids) for out in engine.step()] == [4]
    engine.abort("r")
