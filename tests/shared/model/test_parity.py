"""Teacher-forced logits equal transformers' on small random models, in float32.

Every scenario drives the real paged cache: prefill then decode across block
boundaries, chunked prefill, a prefix-cache hit, and a mixed batch of sequences
of different lengths in one step.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from shared.engine.runner import ModelRunner, SeqChunk
from shared.hashing import block_hashes
from shared.kvcache import KVCacheManager, KVStorage
from shared.model.attention import TorchPagedAttention
from shared.model.loader import load_model
from tests.conftest import make_hf_model

TOL = 1e-4
BLOCK_SIZE = 4
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

MODELS = {
    "llama-gqa2-headdim-untied-llama3rope": (
        "llama",
        dict(head_dim=24, tie_word_embeddings=False, rope_scaling=LLAMA3_ROPE),
    ),
    "llama-mha-tied": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama-gqa4-untied": (
        "llama",
        dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False),
    ),
    "llama-mqa-headdim": (
        "llama",
        dict(
            num_attention_heads=6,
            num_key_value_heads=1,
            hidden_size=48,
            head_dim=20,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2-bias-tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2-bias-untied-gqa3": (
        "qwen2",
        dict(
            num_attention_heads=6,
            num_key_value_heads=2,
            hidden_size=48,
            head_dim=16,
            tie_word_embeddings=False,
        ),
    ),
    "mistral-gqa2": ("mistral", dict(sliding_window=None, tie_word_embeddings=False)),
}


class Harness:
    """Our model on a paged cache next to the transformers reference."""

    def __init__(self, model_dir, reference) -> None:
        model = load_model(model_dir)
        cfg = model.config
        self.storage = KVStorage(cfg.num_layers, 128, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
        self.kv = KVCacheManager(128, BLOCK_SIZE)
        backend = TorchPagedAttention(self.storage, cfg.head_dim)
        self.runner = ModelRunner(model, self.storage, backend)
        self.reference = reference

    def expected(self, tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.reference(torch.tensor([tokens])).logits[0].float()

    def chunk(
        self, rid: str, tokens: list[int], start: int, end: int, cached: list = ()
    ) -> SeqChunk:
        assert self.kv.allocate_slots(rid, end, list(cached))
        return SeqChunk(rid, tokens[start:end], start, self.kv.block_ids(rid), end - start)

    def run(self, chunks: list[SeqChunk]) -> list[torch.Tensor]:
        return self.runner.execute(chunks)


@pytest.fixture(scope="module", params=list(MODELS))
def harness(request, tmp_path_factory) -> Harness:
    import transformers

    arch, overrides = MODELS[request.param]
    model_dir = make_hf_model(tmp_path_factory.mktemp(request.param), arch, **overrides)
    auto = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return Harness(model_dir, auto.eval())


def random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    err = (actual - expected).abs().max().item()
    assert err < TOL, f"max |logit diff| {err:.2e}"


def test_prefill_then_decode_across_blocks(harness: Harness) -> None:
    tokens = random_tokens(37, seed=1)
    expected = harness.expected(tokens)
    (logits,) = harness.run([harness.chunk("a", tokens, 0, 10)])
    assert_close(logits, expected[:10])
    for pos in range(10, len(tokens)):
        (logits,) = harness.run([harness.chunk("a", tokens, pos, pos + 1)])
        assert_close(logits[0], expected[pos])


def test_chunked_prefill(harness: Harness) -> None:
    tokens = random_tokens(33, seed=2)
    expected = harness.expected(tokens)
    bounds = [0, 5, 12, 13, 26, 33]
    for start, end in itertools.pairwise(bounds):
        (logits,) = harness.run([harness.chunk("b", tokens, start, end)])
        assert_close(logits, expected[start:end])


def test_prefix_cache_hit(harness: Harness) -> None:
    first = random_tokens(22, seed=3)
    second = first[:20] + random_tokens(9, seed=4)
    harness.run([harness.chunk("c1", first, 0, len(first))])
    harness.kv.name_full_blocks("c1", block_hashes(first, BLOCK_SIZE), len(first))
    harness.kv.free("c1")
    cached = harness.kv.match_prefix(block_hashes(second, BLOCK_SIZE))
    assert len(cached) * BLOCK_SIZE == 20
    (logits,) = harness.run([harness.chunk("c2", second, 20, len(second), cached)])
    assert_close(logits, harness.expected(second)[20:])


@pytest.fixture(params=["native-ops", "torch-ops"])
def kernels(request, monkeypatch) -> str:
    from shared.model import ops

    if request.param == "torch-ops":
        monkeypatch.setattr(ops, "_native", lambda x: None)
    return request.param


def test_mixed_batch_of_different_lengths(harness: Harness, kernels: str) -> None:
    seqs = {f"m{i}": random_tokens(n, seed=10 + i) for i, n in enumerate((30, 17, 9, 25))}
    expected = {rid: harness.expected(tokens) for rid, tokens in seqs.items()}
    # Two sequences decode while one prefills in chunks and one prefills whole.
    harness.run([harness.chunk("m0", seqs["m0"], 0, 21), harness.chunk("m1", seqs["m1"], 0, 6)])
    positions = {"m0": 21, "m1": 6, "m2": 0, "m3": 0}
    for _ in range(4):
        chunks = [
            harness.chunk("m0", seqs["m0"], positions["m0"], positions["m0"] + 1),
            harness.chunk("m2", seqs["m2"], positions["m2"], positions["m2"] + 2),
            harness.chunk("m1", seqs["m1"], positions["m1"], positions["m1"] + 1),
        ]
        if positions["m3"] == 0:
            chunks.append(harness.chunk("m3", seqs["m3"], 0, 25))
        for chunk, logits in zip(chunks, harness.run(chunks)):
            start = chunk.start_pos
            assert_close(logits, expected[chunk.request_id][start : chunk.context_len])
            positions[chunk.request_id] = chunk.context_len
    for rid in seqs:
        harness.kv.free(rid)
