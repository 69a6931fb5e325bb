"""A GGUF with Q4_K weights (SmolLM2's down projections, the only ones whose rows hold whole
super-blocks of 256) keeps them as the file has them, interleaves their rows under 16-bit
activations (quant_x8.h), predicts as the file's values do, and decodes through the fused
stack bit for bit as through the module path, on every ISA build."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from shared.model.gguf_convert import hf_tensor_name
from shared.model.gguf_index import read_tensors
from shared.model.kernels import cpu_ops
from shared.model.loader import param_slot
from shared.model.quant import QuantLinear, set_activations
from shared.model.quant_loader import load_model_as
from shared.model.registry import gguf_source
from shared.model.scoring import causal_logits, greedy_agreement
from shared.model.tokenizer import Tokenizer
from tests.shared.engine import test_fused_decode
from tests.shared.engine.test_fused_decode import PROMPTS, assert_same, decode, prefill, runner
from tests.shared.model.gguf_files import quantize_q4_k, write_recoded
from tests.shared.model.test_quant_model import MODEL, TEXT

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")
Q4_K = gguf.GGMLQuantizationType.Q4_K
isa = test_fused_decode.isa  # each ISA build's fused stack (a fixture)


@pytest.fixture(scope="module")
def q4_k_gguf(tmp_path_factory) -> Path:
    """SmolLM2's GGUF with every layer's ffn_down re-encoded as Q4_K."""

    def encode(name: str, floats):
        return (quantize_q4_k(floats()), Q4_K) if name.endswith("ffn_down.weight") else None

    path = tmp_path_factory.mktemp("q4_k") / "q4_k.gguf"
    return write_recoded(path, gguf_source(MODEL), encode)


def down_values(path: Path) -> dict[str, torch.Tensor]:
    """The file's down projections dequantized, by Hugging Face name."""
    return {
        hf_tensor_name(t.name): torch.from_numpy(
            np.ascontiguousarray(gguf.quants.dequantize(np.asarray(t.data), Q4_K))
        ).reshape(t.shape)
        for t in read_tensors(path)
        if t.name.endswith("ffn_down.weight")
    }


@pytest.fixture(scope="module")
def q4_k_model(smollm2_dir, q4_k_gguf):
    return load_model_as("auto", smollm2_dir, q4_k_gguf, torch.float32, "cpu")


def test_q4_k_rows_are_kept_and_interleave_under_16_bit_activations(
    smollm2_dir, q4_k_gguf, q4_k_model
) -> None:
    model, values_of = q4_k_model, down_values(q4_k_gguf)
    down = model.layers[4].mlp.down_proj
    expected = values_of["model.layers.4.mlp.down_proj.weight"]
    set_activations(model, "float")
    assert isinstance(down, QuantLinear) and down.fmt.name == "q4_k" and not down.interleaved
    assert torch.equal(down.dequantized(), expected)
    set_activations(model, "q16")
    assert down.interleaved and torch.equal(down.dequantized(), expected)
    # predicts as the file's values do: the float32 model with those down projections
    file_model = load_model_as("float", smollm2_dir, gguf_source(MODEL), torch.float32, "cpu")
    for name, values in values_of.items():
        param, row = param_slot(file_model.config, name)
        file_model.get_parameter(param).data[row : row + values.shape[0]].copy_(values)
    ids = Tokenizer.from_dir(smollm2_dir).encode(TEXT)
    ours, theirs = causal_logits(model, ids), causal_logits(file_model, ids)
    # NOTE: the other linears are the file's Q4_1 under q16 too; x rounded to 16 bits a block
    # (measured: every greedy token, logits within 0.0073)
    assert greedy_agreement(ours, theirs) >= 0.98
    assert (ours - theirs).abs().max() < 0.05


def test_fused_decode_on_interleaved_q4_k_gives_the_module_paths_logits(q4_k_model, isa) -> None:
    set_activations(q4_k_model, "q16")
    fused, plain = runner(q4_k_model, True, isa), runner(q4_k_model, False)
    assert fused.fused is not None
    tokens = {name: list(ids) for name, ids in PROMPTS.items()}
    for step in range(4):  # the prompts, then steps of B=3
        chunks = [prefill(n) for n in "abc"] if step == 0 else decode(tokens, "abc")
        out_fused, out_plain = fused.execute(chunks), plain.execute(chunks)
        assert_same(out_fused, out_plain)
        for chunk, logits in zip(chunks, out_fused, strict=True):
            tokens[chunk.request_id].append(int(logits[-1].argmax()))
