"""One request's failure ends that request alone: a chunk that breaks the forward pass, or
logits that cannot be sampled. The others in its batch finish as if it had not been there."""

from __future__ import annotations

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.output import ENGINE_ERROR, REQUEST_ERROR, Completion, RequestOutput
from shared.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.8, seed=5, ignore_eos=True)


def prompts() -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(9)
    return {
        rid: torch.randint(3, 256, (n,), generator=gen).tolist()
        for rid, n in (("a", 7), ("bad", 21), ("c", 30), ("d", 3))
    }


def engine(model_dir) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            block_size=4,
            num_blocks=96,
            max_num_batched_tokens=32,
        )
    )


def run(
    eng: LLMEngine, params: dict[str, SamplingParams], **hooks
) -> tuple[dict[str, Completion], dict[str, RequestOutput]]:
    """Every prompt to its end (GREEDY unless `params` says otherwise): each request's
    completion and its last output."""
    done, last = {}, {}
    for rid, prompt in prompts().items():
        eng.add_request(rid, prompt, params.get(rid, GREEDY))
        done[rid] = Completion(rid, prompt, [], "", None, None)
    while eng.has_unfinished:
        for out in eng.step(**hooks):
            done[out.request_id].add(out)
            last[out.request_id] = out
    return done, last


def poison(eng: LLMEngine, fault) -> list[list[str]]:
    """Make the runner call `fault(chunks, logits)` on each forward pass; return the
    request ids of every pass it was asked to run."""
    passes = []

    def poisoned(runner):
        execute = runner.execute

        def faulty(chunks, **hooks):
            passes.append([c.request_id for c in chunks])
            return fault(chunks, execute(chunks, **hooks))

        runner.execute = faulty
        return runner

    eng.use_runner(poisoned)
    return passes


def fails_with_bad(chunks, logits):
    if any(c.request_id == "bad" for c in chunks):
        raise RuntimeError("boom")
    return logits


def raises(error: Exception):
    def fault(chunks, logits):
        raise error

    return fault


def add_all(eng: LLMEngine) -> None:
    for rid, prompt in prompts().items():
        eng.add_request(rid, prompt, GREEDY)


def assert_others_unharmed(
    model_dir, done: dict[str, Completion], params: dict[str, SamplingParams]
) -> None:
    clean, _ = run(engine(model_dir), params)
    for rid in ("a", "c", "d"):
        assert done[rid].token_ids == clean[rid].token_ids
        assert done[rid].finish_reason == "length"


def test_a_chunk_that_fails_alone_ends_only_its_request(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir)
    passes = poison(eng, fails_with_bad)
    hooked = []
    done, last = run(
        eng, {"c": SAMPLED}, layer_hook=lambda layer, chunks: hooked.append(len(chunks))
    )
    assert last["bad"].finish_reason == "error" and done["bad"].token_ids == []
    assert (last["bad"].stop_reason, last["bad"].error_kind) == (
        "engine step failed for this request: RuntimeError: boom",
        REQUEST_ERROR,
    )
    assert ["bad"] in passes and ["a"] in passes  # each chunk ran again alone
    assert 1 in hooked  # with the layer hook, one chunk at a time
    assert_others_unharmed(tiny_llama_dir, done, {"c": SAMPLED})
    assert eng.stats().free_blocks == 96 and not eng.has_unfinished


def test_when_every_chunk_fails_alone_the_step_raises(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir)
    passes = poison(eng, raises(RuntimeError("dead")))
    add_all(eng)
    with pytest.raises(RuntimeError, match="dead"):
        eng.step()
    assert len(passes) == 1 + len(prompts())
    outputs = eng.fail_all("engine step failed")
    assert {out.error_kind for out in outputs} == {ENGINE_ERROR}
    assert eng.stats().free_blocks == 96


def test_a_peer_failure_is_not_retried_chunk_by_chunk(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir)
    passes = poison(eng, raises(ConnectionError("gone")))
    add_all(eng)
    with pytest.raises(ConnectionError):
        eng.step()
    assert len(passes) == 1


def nan_for_bad(chunks, logits):
    return [
        torch.full_like(row, float("nan")) if c.request_id == "bad" else row
        for c, row in zip(chunks, logits)
    ]


@pytest.mark.parametrize("bad_params", [GREEDY, SAMPLED])
def test_logits_that_cannot_be_sampled_end_only_their_request(tiny_llama_dir, bad_params) -> None:
    eng = engine(tiny_llama_dir)
    poison(eng, nan_for_bad)
    params = {"bad": bad_params, "c": SAMPLED}
    done, last = run(eng, params)
    message, kind = last["bad"].stop_reason, last["bad"].error_kind
    assert last["bad"].finish_reason == "error" and kind == REQUEST_ERROR
    assert message.startswith("sampling failed: the next-token distribution is broken")
    assert f"temperature={bad_params.temperature}" in message
    assert_others_unharmed(tiny_llama_dir, done, params)


def test_a_tiny_temperature_is_greedy(tiny_llama_dir) -> None:
    tiny = SamplingParams(max_tokens=6, temperature=1e-320, ignore_eos=True)
    done, _ = run(engine(tiny_llama_dir), {"bad": tiny})
    assert done["bad"].token_ids == run(engine(tiny_llama_dir), {})[0]["bad"].token_ids


def test_a_failed_prefix_load_is_an_engine_error(tiny_llama_dir) -> None:
    eng = engine(tiny_llama_dir)
    eng.add_request("a", prompts()["a"], GREEDY)
    eng.invalidate("a", "loading the prefix failed: checksum")
    (out,) = eng.step()
    assert (out.finish_reason, out.stop_reason, out.error_kind) == (
        "error",
        "loading the prefix failed: checksum",
        ENGINE_ERROR,
    )
