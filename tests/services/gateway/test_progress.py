"""What a request keeps across attempts: a migrated attempt continues the same stream."""

from __future__ import annotations

import pytest

from services.gateway.errors import ApiError
from services.gateway.progress import Progress, WorkerLost
from services.gateway.protocol import GenerateRequest
from shared.messages import TokenEvent
from shared.sampling_params import SamplingParams

PROMPT = (1, 2, 3, 4)


def progress(max_tokens: int = 10, max_attempts: int = 3, migration_limit: int = 2) -> Progress:
    req = GenerateRequest(
        "r1",
        "completions",
        "m",
        PROMPT,
        SamplingParams(max_tokens=max_tokens, temperature=0),
        True,
        False,
        None,
    )
    return Progress(req, max_attempts, migration_limit)


def test_a_migrated_attempt_continues_from_the_tokens_so_far() -> None:
    p = progress(max_tokens=10)
    assert p.next_attempt() == "r1-0"
    first = p.record(TokenEvent("r1-0", 0, (7,), num_prompt_tokens=4, num_cached_tokens=2))
    p.record(TokenEvent("r1-0", 1, (8, 9), num_prompt_tokens=4))
    p.lost(WorkerLost("worker d0 stopped responding", (("d0", "i1"),)))
    assert p.prompt_token_ids == (*PROMPT, 7, 8, 9)
    assert p.params.max_tokens == 7 and p.params.temperature == 0
    assert p.next_attempt() == "r1-1" and p.migrations == 1
    assert p.lost_workers == (("d0", "i1"),)
    # The client still sees its own prompt and what it reused, not the longer one's.
    later = p.record(TokenEvent("r1-1", 0, (10,), num_prompt_tokens=7, num_cached_tokens=6))
    assert (first.num_cached_tokens, later.num_cached_tokens) == (2, 2)
    assert later.num_prompt_tokens == 4


def test_failures_before_the_first_token_are_retries_bounded_by_max_attempts() -> None:
    p = progress(max_attempts=2)
    p.next_attempt()
    p.lost(WorkerLost("no responder"))
    assert p.migrations == 0
    p.next_attempt()
    with pytest.raises(ApiError) as failure:
        p.lost(WorkerLost("no responder"))
    assert failure.value.status == 503 and "after 2 attempts" in failure.value.message


def test_migrations_are_bounded_by_the_migration_limit() -> None:
    p = progress(migration_limit=1)
    p.next_attempt()
    p.record(TokenEvent("r1-0", 0, (7,)))
    p.lost(WorkerLost("worker d0 restarted"))
    p.next_attempt()
    with pytest.raises(ApiError) as failure:
        p.lost(WorkerLost("worker d1 stopped"))
    assert failure.value.status == 503 and "limit 1" in failure.value.message


def test_workers_that_lost_a_request_are_welcome_back_only_once_heard_since_and_asked() -> None:
    from types import SimpleNamespace

    from services.gateway.backend import Backend
    from services.gateway.liveness import Liveness
    from tests.services.gateway.test_liveness import beat

    live = Liveness()
    for worker in ("d0", "d1", "d2"):
        live.observe(beat(worker, interval=60))
    p = progress()
    p.lost(WorkerLost("lost at a NATS node's cut", (("d0", "a"), ("d1", "a"), ("d2", "a"))))
    live.observe(beat("d0", interval=60))  # d0 came back; d1 and d2 are silent since
    gateway = SimpleNamespace(liveness=live)
    assert Backend._avoided(gateway, p) == ("d0", "d1", "d2")  # type: ignore[arg-type]
    assert Backend._avoided(gateway, p, welcome_back=True) == ("d1", "d2")  # type: ignore[arg-type]


def test_after_a_prefix_load_failed_the_next_attempts_compute_the_prefix() -> None:
    from shared.prefill.prefix import load_failure

    p = progress()
    p.next_attempt()
    p.lost(WorkerLost("no responder"))
    assert not p.recompute_prefix  # another failure: the retry may load it
    p.next_attempt()
    p.lost(WorkerLost(f"prefill failed: {load_failure('stalled past 1.000s', 3)}"))
    assert p.recompute_prefix
