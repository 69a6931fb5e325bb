"""The engine on a CUDA GPU: parity with transformers, CUDA graphs against eager steps,
sampling on the device. Skipped, saying why, where torch sees no GPU (make test-gpu)."""

from __future__ import annotations

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.sampling_params import SamplingParams

pytestmark = pytest.mark.cuda

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def prompts(lengths, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in lengths]


def engine(model_dir, **overrides) -> LLMEngine:
    config = dict(
        model=str(model_dir),
        device="cuda",
        dtype="float32",
        block_size=4,
        num_blocks=256,
        max_num_batched_tokens=16,  # chunked prefills beside decodes
        max_num_seqs=16,
    )
    return LLMEngine(EngineConfig(**{**config, **overrides}))


def tokens(eng: LLMEngine, batch, params=GREEDY) -> list[list[int]]:
    return [c.token_ids for c in eng.generate(batch, params)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_decode_as_eager_steps(tiny_llama_dir, dtype):
    """Five sequences (a padded bucket), one a prefix of another (a cache hit), contexts
    that outgrow the smallest block table (8 blocks of 4 tokens)."""
    batch = prompts((5, 19, 2, 30, 11))
    batch.append(batch[1][:12])
    graphed = engine(tiny_llama_dir, dtype=dtype)
    eager = engine(tiny_llama_dir, dtype=dtype, cuda_graphs=False)
    assert graphed._runner.graphs is not None and eager._runner.graphs is None
    assert tokens(graphed, batch) == tokens(eager, batch)
    captured = set(graphed._runner.graphs.graphs)
    assert {width for _, width in captured} >= {8, 16}, captured  # both table widths ran
    assert any(batch_size > 1 for batch_size, _ in captured)


def test_float32_greedy_equals_transformers(tiny_llama_dir):
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_llama_dir, dtype=torch.float32, device_map="cuda"
    ).eval()
    batch = prompts((7, 23, 40), seed=9)
    ours = tokens(engine(tiny_llama_dir), batch)
    for prompt, got in zip(batch, ours):
        ids = torch.tensor([prompt], device="cuda")
        expected = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=GREEDY.max_tokens,
            do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert got == expected


def test_seeded_sampling_on_the_gpu_repeats_and_unseeded_runs(tiny_llama_dir):
    eng = engine(tiny_llama_dir, dtype="bfloat16")
    seeded = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    batch = prompts((6, 13))
    first, again = tokens(eng, batch, seeded), tokens(eng, batch, seeded)
    assert first == again
    unseeded = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)
    assert all(len(t) == 8 for t in tokens(eng, batch, unseeded))


def test_logprobs_on_the_gpu_match_eager(tiny_llama_dir):
    params = SamplingParams(max_tokens=4, temperature=0, logprobs=3, ignore_eos=True)
    batch = prompts((9, 4))
    runs = [
        engine(tiny_llama_dir, cuda_graphs=graphs).generate(batch, params)
        for graphs in (True, False)
    ]
    for graphed, eager in zip(*runs):
        assert graphed.token_ids == eager.token_ids
        for a, b in zip(graphed.logprobs, eager.logprobs):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4


@pytest.mark.parametrize("vocab", [128256, 49152, 257])  # Llama 3's, SmolLM2's, a prime
def test_greedy_rows_on_the_gpu_take_the_first_max_and_flag_broken_rows(vocab):
    from shared.engine.sampler import _greedy_and_usable

    logits = torch.randn(5, vocab, device="cuda")
    logits[0, [7, vocab - 3]] = 50.0  # a tie: the first index wins
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")  # everything masked
    logits[3, vocab // 2] = float("inf")
    greedy, usable = _greedy_and_usable(logits)
    assert greedy[0] == 7 and greedy[4] == int(logits[4].argmax())
    assert usable == [True, False, False, False, True]
