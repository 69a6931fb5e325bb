"""The weights moved into one arena (shared/model/weight_arena.py): the same model computes
the same logits bit for bit, every streamed weight lies in the arena in the order a step reads
it, and tied weights stay tied."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.model.kernels import cpu_ops
from shared.model.loader import load_model
from shared.model.quant import QuantLinear
from shared.model.quant_loader import load_model_as
from shared.model.registry import gguf_source
from shared.model.scoring import causal_logits
from shared.model.weight_arena import pack_weights
from shared.sampling_params import SamplingParams

MODEL = "SmolLM2-135M-Instruct"


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return causal_logits(model, ids)


def streamed(model) -> list[torch.Tensor]:
    """The weights pack_weights moves, in module order."""
    out = []
    for module in model.modules():
        if isinstance(module, QuantLinear):
            out.append(module.blocks)
        elif isinstance(weight := getattr(module, "weight", None), torch.nn.Parameter):
            out += [weight] if weight.dim() == 2 else []
    return out


def in_one_run_in_order(tensors: list[torch.Tensor], arena_bytes: int) -> bool:
    starts = [t.data_ptr() for t in tensors]
    distinct = sorted(set(starts))
    return starts == sorted(starts) and distinct[-1] - distinct[0] < arena_bytes


@pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")
def test_a_quantized_model_computes_the_same_from_its_arena(smollm2_dir) -> None:
    model = load_model_as("auto", smollm2_dir, gguf_source(MODEL), torch.float32, "cpu")
    ids = list(range(100, 140))
    before = logits(model, ids)
    nbytes = pack_weights(model)
    assert nbytes >= sum(t.nbytes for t in streamed(model)) > 90e6  # the file's Q4_1 and Q8_0
    assert in_one_run_in_order(streamed(model), nbytes)
    assert torch.equal(logits(model, ids), before)


def test_float_weights_stay_parameters(tiny_llama_dir: Path) -> None:
    model = load_model(tiny_llama_dir)
    ids = list(range(3, 19))
    before = logits(model, ids)
    parameters = dict(model.named_parameters())
    nbytes = pack_weights(model)
    assert dict(model.named_parameters()) == parameters  # the same Parameter objects
    assert in_one_run_in_order(streamed(model), nbytes)
    assert torch.equal(logits(model, ids), before)


def test_a_weight_two_modules_share_is_moved_once_and_stays_shared() -> None:
    first, second = torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(64, 32, bias=False)
    second.weight = first.weight
    expected = first.weight.detach().clone()
    assert pack_weights(torch.nn.Sequential(first, second)) == expected.nbytes
    assert second.weight is first.weight and torch.equal(first.weight, expected)


def test_a_model_of_no_weights_needs_no_arena() -> None:
    assert pack_weights(torch.nn.Sequential(torch.nn.ReLU())) == 0


@pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")
def test_an_engine_decodes_the_same_tokens_with_and_without_the_arena(smollm2_dir) -> None:
    del smollm2_dir  # converted once, before either engine loads it
    outputs = []
    for arena in (True, False):
        config = EngineConfig(model=MODEL, weights="auto", num_blocks=16, huge_pages=arena)
        (result,) = LLMEngine(config).generate(
            [list(range(200, 230))], SamplingParams(max_tokens=12, temperature=0)
        )
        outputs.append(result.token_ids)
    assert outputs[0] == outputs[1]
