"""A GGUF whose weights the kernels cannot all read as they are (as most Q4_K_M files: Q5_0
and Q6_K tensors, q, k and v in differing formats) loads those weights re-quantized to Q8_0,
not dequantized to float32, and predicts as the file's weights do."""

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
from shared.model.quant_formats import FORMATS, dequantize, quantize
from shared.model.quant_loader import load_model_as
from shared.model.registry import gguf_source
from shared.model.scoring import causal_logits, greedy_agreement
from shared.model.tokenizer import Tokenizer
from tests.shared.model.test_quant_model import MODEL, TEXT

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")
Q5_0 = gguf.GGMLQuantizationType.Q5_0  # a format without a kernel here
MIXED = ("attn_v", "ffn_down")  # re-encoded as Q5_0: qkv's parts differ, down has no kernel


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory) -> Path:
    """SmolLM2's GGUF with every layer's v and down projections re-encoded as Q5_0."""
    path = tmp_path_factory.mktemp("mixed") / "mixed.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for tensor in read_tensors(gguf_source(MODEL)):
        kind = gguf.GGMLQuantizationType(tensor.ggml_type)
        data = np.asarray(tensor.data)
        if tensor.name.split(".")[-2] in MIXED:
            floats = gguf.quants.dequantize(data, kind).reshape(tensor.shape)
            data, kind = gguf.quants.quantize(floats.astype(np.float32), Q5_0), Q5_0
        elif kind == gguf.GGMLQuantizationType.F32:
            data = data.view(np.float32).reshape(tensor.shape)
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def file_values(path: Path) -> dict[str, torch.Tensor]:
    """The re-encoded tensors of `path` dequantized, by Hugging Face name."""
    return {
        hf_tensor_name(t.name): torch.from_numpy(
            gguf.quants.dequantize(np.asarray(t.data), Q5_0).reshape(t.shape).copy()
        )
        for t in read_tensors(path)
        if t.ggml_type == Q5_0
    }


@pytest.fixture(scope="module")
def file_model(smollm2_dir, mixed_gguf):
    """The float32 model of the mixed file's own values (v and down as Q5_0 holds them)."""
    model = load_model_as("float", smollm2_dir, gguf_source(MODEL), torch.float32, "cpu")
    for name, values in file_values(mixed_gguf).items():
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
    assert formats == {"qkv": "q8_0", "o": "q4_1", "gate_up": "q4_1", "down": "q8_0"}
    assert "down_proj x30, qkv_proj x30" in capfd.readouterr().err
    set_activations(model, "float")
    ids = Tokenizer.from_dir(smollm2_dir).encode(TEXT)
    ours, expected = causal_logits(model, ids), causal_logits(file_model, ids)
    # NOTE: measured 49 of 51 greedy tokens, logits within 0.41 (0.064 on average): Q8_0's
    # rounding of 60 of the 150 linears (a step of 1/127 of each block's largest value)
    assert greedy_agreement(ours, expected) >= 0.94
    assert (ours - expected).abs().max() < 1.0


def test_requantized_weights_are_q8_0_blocks_of_the_files_values(smollm2_dir, mixed_gguf):
    model = load_model_as("auto", smollm2_dir, mixed_gguf, torch.float32, "cpu")
    down = model.layers[3].mlp.down_proj
    assert isinstance(down, QuantLinear) and down.fmt is FORMATS["q8_0"]
    expected = file_values(mixed_gguf)["model.layers.3.mlp.down_proj.weight"]
    fmt = FORMATS["q8_0"]
    assert torch.equal(down.dequantized(), dequantize(quantize(expected, fmt), fmt))
    # Q8_0 rounds each value to a step of its block's largest magnitude / 127 (the step itself
    # an fp16): within about half a step of the file's value
    blocks = expected.reshape(-1, 32)
    step = blocks.abs().amax(1, keepdim=True) / 127
    assert ((down.dequantized().reshape(-1, 32) - blocks).abs() <= 0.55 * step).all()
