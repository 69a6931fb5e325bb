"""A GGUF whose weights the kernels cannot all read as they are (as most Q4_K_M files: Q6_K
tensors, q, k and v in differing formats) loads those weights re-quantized to Q8_0, not
dequantized to float32, keeps the rest as the file has them (Q5_0 among them), and predicts
as the file's weights do."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from shared.model.gguf_convert import hf_tensor_name, unpermute_rotary
from shared.model.gguf_index import read_tensors
from shared.model.kernels import cpu_ops
from shared.model.loader import param_slot
from shared.model.quant import QuantLinear, set_activations
from shared.model.quant_formats import FORMATS, as_q8_0, dequantize, quantize
from shared.model.quant_loader import load_model_as
from shared.model.registry import gguf_source
from shared.model.scoring import causal_logits, greedy_agreement
from shared.model.tokenizer import Tokenizer
from tests.shared.model.gguf_files import write_recoded
from tests.shared.model.test_quant_model import MODEL, TEXT

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")
Q5_0, Q5_1 = gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q5_1
Q8_0 = gguf.GGMLQuantizationType.Q8_0
# Re-encoded: q and k as Q5_0 and v as Q8_0 (qkv's parts differ, each exactly Q8_0's values),
# o as Q5_0 (one format with a kernel: kept), gate as Q5_0 beside up's Q4_1 (they differ, and
# Q4_1 is not exactly Q8_0), down as Q5_1 (a format without a kernel here)
MIXED = {
    "attn_q": Q5_0,
    "attn_k": Q5_0,
    "attn_v": Q8_0,
    "attn_output": Q5_0,
    "ffn_gate": Q5_0,
    "ffn_down": Q5_1,
}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory) -> Path:
    """SmolLM2's GGUF with every layer's v, o and down projections re-encoded (MIXED)."""

    def encode(name: str, floats):
        kind = MIXED.get(name.split(".")[-2])
        if kind is None:
            return None
        return gguf.quants.quantize(floats().astype(np.float32), kind), kind

    path = tmp_path_factory.mktemp("mixed") / "mixed.gguf"
    return write_recoded(path, gguf_source(MODEL), encode)


def file_values(path: Path, config) -> dict[str, torch.Tensor]:
    """The re-encoded tensors of `path` dequantized, by Hugging Face name and in its order."""
    values = {}
    for t in read_tensors(path):
        part = t.name.split(".")[-2]
        if part not in MIXED or not t.name.startswith("blk."):
            continue
        array = gguf.quants.dequantize(np.asarray(t.data), t.ggml_type).reshape(t.shape)
        if part in ("attn_q", "attn_k"):  # llama.cpp's rotary order, as the loader undoes it
            heads = config.num_heads if part == "attn_q" else config.num_kv_heads
            array = unpermute_rotary(array, heads)
        values[hf_tensor_name(t.name)] = torch.from_numpy(np.ascontiguousarray(array))
    return values


@pytest.fixture(scope="module")
def file_model(smollm2_dir, mixed_gguf):
    """The float32 model of the mixed file's own values (v, o and down as re-encoded)."""
    model = load_model_as("float", smollm2_dir, gguf_source(MODEL), torch.float32, "cpu")
    for name, values in file_values(mixed_gguf, model.config).items():
        param, row = param_slot(model.config, name)
        model.get_parameter(param).data[row : row + values.shape[0]].copy_(values)
    return model


def test_weights_no_kernel_reads_are_requantized_to_q8_0(
    smollm2_dir, mixed_gguf, file_model, capfd
) -> None:
    model = load_model_as("auto", smollm2_dir, mixed_gguf, torch.float32, "cpu")
    layer = model.layers[0]
    modules = {
        "qkv": layer.self_attn.qkv_proj,
        "o": layer.self_attn.o_proj,
        "gate_up": layer.mlp.gate_up_proj,
        "down": layer.mlp.down_proj,
    }
    formats = {name: m.fmt.name for name, m in modules.items() if isinstance(m, QuantLinear)}
    assert formats == {"qkv": "q8_0", "o": "q5_0", "gate_up": "q8_0", "down": "q8_0"}
    log = capfd.readouterr().err
    assert "down_proj x30, gate_up_proj x30" in log and "exactly as q8_0: qkv_proj x30" in log
    set_activations(model, "float")
    ids = Tokenizer.from_dir(smollm2_dir).encode(TEXT)
    ours, expected = causal_logits(model, ids), causal_logits(file_model, ids)
    # NOTE: Q8_0's rounding of gate_up and down, 60 of the 150 linears (a step of 1/127 of each
    # block's largest value): measured 50 of 51 greedy tokens, logits within 0.67 (0.085 on
    # average)
    assert greedy_agreement(ours, expected) >= 0.94
    assert (ours - expected).abs().max() < 1.0


def test_requantized_weights_are_q8_0_blocks_of_the_files_values(smollm2_dir, mixed_gguf):
    model = load_model_as("auto", smollm2_dir, mixed_gguf, torch.float32, "cpu")
    down = model.layers[3].mlp.down_proj
    assert isinstance(down, QuantLinear) and down.fmt is FORMATS["q8_0"]
    expected = file_values(mixed_gguf, model.config)["model.layers.3.mlp.down_proj.weight"]
    fmt = FORMATS["q8_0"]
    assert torch.equal(down.dequantized(), dequantize(quantize(expected, fmt), fmt))
    # Q8_0 rounds each value to a step of its block's largest magnitude / 127 (the step itself
    # an fp16): within about half a step of the file's value
    blocks = expected.reshape(-1, 32)
    step = blocks.abs().amax(1, keepdim=True) / 127
    assert ((down.dequantized().reshape(-1, 32) - blocks).abs() <= 0.55 * step).all()


def test_fused_parts_q8_0_holds_exactly_are_the_files_values(smollm2_dir, mixed_gguf):
    """q and k in Q5_0 beside v in Q8_0: one Q8_0 weight of exactly the file's values."""
    model = load_model_as("auto", smollm2_dir, mixed_gguf, torch.float32, "cpu")
    qkv = model.layers[7].self_attn.qkv_proj
    assert isinstance(qkv, QuantLinear) and qkv.fmt is FORMATS["q8_0"]
    values = file_values(mixed_gguf, model.config)
    parts = [values[f"model.layers.7.self_attn.{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(qkv.dequantized(), torch.cat(parts))


def test_q5_0_rows_become_interleaved_q8_0_of_the_same_values_under_16_bit_activations(
    smollm2_dir, mixed_gguf, kernels
) -> None:
    """Q5_0's values are Q8_0's exactly (d * (q - 16)): under q16 its rows take Q8_0's
    interleaved GEMV, the same products; q8 and float activations keep them Q5_0."""
    model = load_model_as("auto", smollm2_dir, mixed_gguf, torch.float32, "cpu")
    o = model.layers[5].self_attn.o_proj
    before, x = o.dequantized(), torch.randn(3, o.in_features)
    set_activations(model, "float")
    assert o.fmt.name == "q5_0" and not o.interleaved
    plain = o.linear(x)
    set_activations(model, "q16")
    assert o.fmt.name == "q8_0" and o.interleaved
    assert torch.equal(o.dequantized(), before)
    set_activations(model, "float")  # back in GGUF's order, and still Q8_0's values
    assert o.fmt.name == "q8_0" and not o.interleaved
    torch.testing.assert_close(o.linear(x), plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["q4_0", "q5_0"])
def test_q4_0_and_q5_0_as_q8_0_keep_every_value(name) -> None:
    weight = torch.randn(19, 96, generator=torch.Generator().manual_seed(4))
    blocks = quantize(weight, FORMATS[name])
    wide = as_q8_0(blocks, FORMATS[name])
    assert wide.shape == (19, FORMATS["q8_0"].row_bytes(96))
    assert torch.equal(dequantize(wide, FORMATS["q8_0"]), dequantize(blocks, FORMATS[name]))
