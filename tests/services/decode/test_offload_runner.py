"""Attention offloaded to shards of whole KV heads gives the local engine's logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.decode.offload_runner import split_micro_batches
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.runner import SeqChunk
from shared.sampling_params import SamplingParams
from tests.services.decode.offload_helpers import offloaded_engine, record_logits

PROMPTS = [[1, 17, 33, 8, 99, 4, 23, 61, 7], [5, 6, 7] * 11, [42, 11], list(range(3, 40))]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def run_steps(engine: LLMEngine) -> tuple[dict[str, list[int]], list]:
    logits = record_logits(engine)
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, GREEDY)
    while engine.has_unfinished:
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens, logits


def config_of(model_dir) -> EngineConfig:
    # max_num_batched_tokens small enough that prefills are chunked and mix with decodes
    return EngineConfig(
        model=str(model_dir),
        dtype="float32",
        num_blocks=64,
        enable_prefix_cache=False,
        max_num_batched_tokens=24,
        num_threads=1,
    )


@pytest.fixture(scope="module")
def local_smollm2(smollm2_dir):
    return run_steps(LLMEngine(config_of(smollm2_dir)))


# One micro-batch runs the local step's exact matmuls: the offloaded logits must match to
# 1e-4. Several micro-batches run the dense layers over fewer rows each, and this CPU's
# GEMMs round differently per row count (~5e-4 on logits of magnitude ~20), not attention.
@pytest.mark.parametrize(
    "group_size,micro_batches,atol", [(1, 1, 1e-4), (3, 1, 1e-4), (1, 2, 3e-3), (3, 3, 3e-3)]
)
def test_offloaded_logits_match_local_at_every_step(
    smollm2_dir, local_smollm2, group_size, micro_batches, atol
):
    want_tokens, want_logits = local_smollm2
    with offloaded_engine(config_of(smollm2_dir), group_size, micro_batches) as (engine, *_):
        tokens, logits = run_steps(engine)
    assert tokens == want_tokens
    assert len(logits) == len(want_logits)
    for step, (got, want) in enumerate(zip(logits, want_logits)):
        assert got.keys() == want.keys(), step
        for rid in want:
            assert got[rid].shape[0] == want[rid].shape[0], (step, rid)
            if want[rid].shape[0]:
                assert torch.allclose(got[rid], want[rid], atol=atol, rtol=0), (step, rid)


def test_two_shards_of_a_two_kv_head_model(tiny_llama_dir):
    want, _ = run_steps(LLMEngine(config_of(tiny_llama_dir)))
    with offloaded_engine(config_of(tiny_llama_dir), 2) as (engine, *_):
        assert run_steps(engine)[0] == want


def test_bytes_on_the_link_equal_the_formula(smollm2_dir):
    with offloaded_engine(config_of(smollm2_dir), 3) as (engine, group, _shards, _):
        run_steps(engine)
        mc, e = engine.info.model, 4
        num_tokens = sum(len(p) for p in PROMPTS) + len(PROMPTS) * (GREEDY.max_tokens - 1)
        per_token_layer_out = (mc.num_heads + 2 * mc.num_kv_heads) * mc.head_dim * e
        per_token_layer_back = mc.num_heads * mc.head_dim * e
        assert group.counter("qkv_bytes") == num_tokens * mc.num_layers * per_token_layer_out
        assert group.counter("out_bytes") == num_tokens * mc.num_layers * per_token_layer_back
        # each shard carries a third of it
        assert {link.counters["qkv_bytes"] for link in group.links} == {
            group.counter("qkv_bytes") // 3
        }


def test_finished_requests_leave_the_shards(smollm2_dir):
    with offloaded_engine(config_of(smollm2_dir), 3) as (engine, group, shards, _):
        run_steps(engine)
        assert all(shard.request_blocks for shard in shards)
        group.release([f"r{i}" for i in range(len(PROMPTS))])
        # a probe after the release: once its output is back, every shard has read both
        mc = engine.info.model
        group.begin_step(0, [SeqChunk("probe", (1,), 0, (0,))])
        group.send(
            0,
            0,
            torch.zeros(1, mc.num_heads, mc.head_dim),
            *[torch.zeros(1, mc.num_kv_heads, mc.head_dim)] * 2,
        )
        group.wait(0, 0)
        assert [set(s.request_blocks) for s in shards] == [{"probe"}] * 3


def test_micro_batches_split_in_order_with_balanced_tokens():
    chunks = [SeqChunk(f"r{i}", (0,) * n, 0, (0,)) for i, n in enumerate([1, 1, 1, 1, 20])]
    parts = split_micro_batches(chunks, 2)
    assert [c for part in parts for c in part] == chunks
    assert len(parts) == 2 and all(parts)
    assert split_micro_batches(chunks[:1], 4) == [chunks[:1]]


@pytest.mark.cuda
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_decode_engine_on_a_gpu_offloads_to_shards_on_the_cpu(tiny_llama_dir, micro_batches):
    """Lamina's heterogeneous case: the dense work on the GPU, the KV and attention in host
    memory; the tokens equal an engine's that runs everything on the GPU."""
    config = dataclasses.replace(config_of(tiny_llama_dir), device="cuda")
    want, _ = run_steps(LLMEngine(config))
    with offloaded_engine(config, 2, micro_batches) as (engine, group, shards, _):
        assert all(shard.storage.kv.device.type == "cpu" for shard in shards)
        assert run_steps(engine)[0] == want
        assert group.counter("qkv_bytes") > 0
