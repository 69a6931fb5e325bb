"""`bench engine` sizes the KV pool for its largest decode batch at full length, and refuses
a batch its pool cannot hold (the engine would preempt part of it, and the table would name
a batch that never decoded together)."""

from __future__ import annotations

import argparse

import pytest

from bench.engine import KvstackSide, kv_blocks
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.errors import KvstackError


def args(**given) -> argparse.Namespace:
    defaults = {"batch_sizes": "1,8,32", "prefill_lens": "512,2048", "prompt_len": 128}
    return argparse.Namespace(**{**defaults, "decode_tokens": 64, **given})


def test_the_pool_holds_the_largest_batch_or_the_longest_prompt() -> None:
    # 32 sequences of 1024 + 32 tokens: 66 blocks of 16 each
    assert kv_blocks(args(prompt_len=1024, decode_tokens=32)) == 32 * 66
    # a 4096-token prompt (and its first token) outgrows 8 x (128 + 64)
    assert kv_blocks(args(batch_sizes="1,8", prefill_lens="4096")) == 257


def test_a_batch_the_pool_holds_decodes_together_and_a_larger_one_is_refused() -> None:
    num_blocks = kv_blocks(args(batch_sizes="3", prefill_lens="16", prompt_len=40, decode_tokens=8))
    engine = LLMEngine(EngineConfig(num_blocks=num_blocks, enable_prefix_cache=False))
    seen = []  # the scheduler's queues after each step
    step = engine.step

    def observed_step(*args, **kwargs):
        outputs = step(*args, **kwargs)
        seen.append(engine.stats())
        return outputs

    engine.step = observed_step  # type: ignore[method-assign]
    side = KvstackSide(engine)
    assert side.decode_time(3, 40, 8) > 0
    assert max(s.num_running for s in seen) == 3
    assert all(s.num_waiting == 0 for s in seen)  # none preempted back into the queue
    with pytest.raises(KvstackError, match=r"decode batch 4 of 48 tokens each needs 12 KV blocks"):
        side.decode_time(4, 40, 8)
    assert not side.engine.has_unfinished  # refused before any request went in
