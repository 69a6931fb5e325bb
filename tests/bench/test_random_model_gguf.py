"""`python -m bench random-model --gguf`: a float32 GGUF of a shape with SmolLM2's tokenizer,
which kvstack loads (here a small shape; llama-300m's is 1.2 GB), and a clear error for a
shape of another vocabulary."""

from __future__ import annotations

import gguf
import pytest
import torch

from bench import random_model
from bench.cli import build_parser
from shared.errors import KvstackError
from shared.model.quant_loader import load_model_as
from shared.model.registry import resolve_model
from shared.model.scoring import causal_logits

TINY = dict(random_model.SHAPES["llama-300m"], hidden_size=256, intermediate_size=512,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip


def run(*argv: str) -> int:
    args = build_parser().parse_args(["random-model", *argv])
    return args.run(args)


def test_a_gguf_of_the_shape_loads_and_predicts(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(random_model.SHAPES, "tiny", TINY)
    path = tmp_path / "tiny.gguf"
    assert run("--shape", "tiny", "--gguf", str(path)) == 0
    reader = gguf.GGUFReader(path)
    assert reader.fields["llama.embedding_length"].contents() == 256
    assert reader.fields["llama.block_count"].contents() == 2
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 49152 and tokens[:2] == ["<|endoftext|>", "<|im_start|>"]
    assert len(reader.tensors) == 1 + 2 * 9 + 1
    model = load_model_as("auto", resolve_model(str(path)), path, torch.float32, "cpu")
    assert model.config.hidden_size == 256 and model.config.num_layers == 2
    logits = causal_logits(model, [1, 504, 2, 17])
    assert logits.shape == (4, 49152) and torch.isfinite(logits).all()


def test_a_shape_of_another_vocabulary_is_refused(tmp_path) -> None:
    with pytest.raises(KvstackError, match="vocabulary is not SmolLM2's"):
        run("--shape", "llama-3.2-1b", "--gguf", str(tmp_path / "x.gguf"))
    assert not (tmp_path / "x.gguf").exists()
