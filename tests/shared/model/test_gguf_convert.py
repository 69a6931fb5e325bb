"""GGUF -> Hugging Face directory: weights, config, tokenizer and chat template.

SmolLM2 is checked against transformers' own GGUF loader; a tiny GGUF written here checks the
q/k un-permutation against weights known before llama.cpp's permutation was applied.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from shared.errors import UnsupportedModel
from shared.model.config import ModelConfig
from shared.model.gguf_convert import convert_gguf
from shared.model.tokenizer import Tokenizer

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello world",
    "Hello world 12345",
    "x 1 22 333 4444",
    "a1b2c3",
    "3.14159 and 1,000,000",
    "  leading spaces\n\nnew\tline  \n",
    "émoji 😀 中文 Ünïcödé",
    "naïve café — “quotes”",
    "don't I'll we've",
    "   ",
    "",
    "def f(x):\n    return x**2\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|><repo_name>x<file_sep>",
    "🎉🎉🎉 👩‍👩‍👧 ñ",
    "tab\tand\r\nwindows lines",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi 😀"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count: 1 2 3\n\nthen stop"},
    ],
]


@pytest.fixture(scope="module")
def transformers_smollm2(hf_smollm2):
    model, tokenizer = hf_smollm2
    return model.state_dict(), tokenizer


@pytest.fixture(scope="module")
def ours(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def test_every_tensor_equals_transformers(smollm2_dir: Path, transformers_smollm2) -> None:
    reference, _ = transformers_smollm2
    converted = load_file(str(smollm2_dir / "model.safetensors"))
    # NOTE: tied embeddings: transformers lists lm_head as a view of embed_tokens; we store none.
    assert set(converted) == set(reference) - {"lm_head.weight"}
    for name, tensor in converted.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, reference[name]), name


def test_config_fields(smollm2_dir: Path) -> None:
    hf = json.loads((smollm2_dir / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["model_type"] == "llama"
    config = ModelConfig.from_dir(smollm2_dir)
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (49152, 576, 1536)
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (30, 9, 3)
    assert config.head_dim == 64 and config.tie_word_embeddings
    assert config.rope.theta == 100000.0 and config.max_position_embeddings == 8192
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.bos_token_id == 1 and config.eos_token_ids == (2,)


@pytest.mark.parametrize("text", TEXTS)
def test_token_ids_equal_transformers(ours: Tokenizer, transformers_smollm2, text: str) -> None:
    _, reference = transformers_smollm2
    assert ours.encode(text) == reference(text)["input_ids"]


def test_digits_split_before_whitespace_runs(ours: Tokenizer) -> None:
    # SmolLM2's own tokenizer.json and llama.cpp's "smollm" pre-tokenizer cut digits out first, so
    # "\n\n" between digits is one piece ("ĊĊ"). transformers' GGUF loader skips the digit split
    # and gives "Ċ", "Ċ" here -- the one place we deliberately differ from it.
    newline, double_newline = ours.encode("\n"), ours.encode("\n\n")
    assert len(double_newline) == 1
    assert ours.encode("1\n2\n\n3") == [
        *ours.encode("1"),
        *newline,
        *ours.encode("2"),
        *double_newline,
        *ours.encode("3"),
    ]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(
    ours: Tokenizer, transformers_smollm2, messages, add_generation_prompt: bool
) -> None:
    _, reference = transformers_smollm2
    expected = reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.apply_chat_template(messages, add_generation_prompt) == expected


def test_tokenizer_config(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<|im_start|>" and config["eos_token"] == "<|im_end|>"
    assert config["add_bos_token"] is False and config["model_max_length"] == 8192
    assert "<|im_start|>assistant" in config["chat_template"]


# --- a tiny GGUF written here, with weights known before llama.cpp's permutation -------------

TINY = dict(hidden=32, ffn=64, layers=2, heads=4, kv_heads=2)
TINY_CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q and k rows."""
    rows = weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """Control tokens, GPT-2's 256 byte characters, a user-defined token and three merges."""
    byte_chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [
        chr(c) for c in [*range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    ]
    byte_chars += [chr(256 + n) for n in range(256 - len(byte_chars))]
    merges = ["Ġ t", "h e", "Ġt he"]
    tokens = ["<s>", "</s>", *byte_chars, "<think>", "Ġt", "he", "Ġthe"]
    types = [3, 3, *[1] * len(byte_chars), 4, 1, 1, 1]
    return tokens, types, merges


def tiny_hf_weights(vocab_size: int, tied: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h, f, kv = TINY["hidden"], TINY["ffn"], TINY["kv_heads"] * TINY["hidden"] // TINY["heads"]
    shapes = {"model.embed_tokens.weight": (vocab_size, h), "model.norm.weight": (h,)}
    for i in range(TINY["layers"]):
        layer = f"model.layers.{i}"
        shapes.update(
            {
                f"{layer}.self_attn.q_proj.weight": (h, h),
                f"{layer}.self_attn.k_proj.weight": (kv, h),
                f"{layer}.self_attn.v_proj.weight": (kv, h),
                f"{layer}.self_attn.o_proj.weight": (h, h),
                f"{layer}.mlp.gate_proj.weight": (f, h),
                f"{layer}.mlp.up_proj.weight": (f, h),
                f"{layer}.mlp.down_proj.weight": (h, f),
                f"{layer}.input_layernorm.weight": (h,),
                f"{layer}.post_attention_layernorm.weight": (h,),
            }
        )
    if not tied:
        shapes["lm_head.weight"] = (vocab_size, h)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


GGUF_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf_name: str) -> str:
    base = hf_name.removesuffix(".weight")
    if base.startswith("model.layers."):
        _, _, layer, part = base.split(".", 3)
        return f"blk.{layer}.{GGUF_NAMES[part]}.weight"
    return f"{GGUF_NAMES[base]}.weight"


def add_gguf_tensor(writer: gguf.GGUFWriter, hf_name: str, weight: np.ndarray) -> np.ndarray:
    """Write one tensor as llama.cpp would; return what a lossless reader must get back."""
    if ".q_proj." in hf_name or ".k_proj." in hf_name:
        heads = TINY["heads"] if ".q_proj." in hf_name else TINY["kv_heads"]
        writer.add_tensor(gguf_name(hf_name), llama_cpp_permute(weight, heads))
        return weight
    if ".up_proj." in hf_name:  # quantized, as most GGUF files are
        blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(gguf_name(hf_name), blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
    if ".v_proj." in hf_name:
        writer.add_tensor(gguf_name(hf_name), weight.astype(np.float16))
        return weight.astype(np.float16).astype(np.float32)
    writer.add_tensor(gguf_name(hf_name), weight)
    return weight


def write_tiny_gguf(path: Path, tied: bool = False, add_bos: bool = True) -> dict[str, np.ndarray]:
    """A small llama GGUF at `path`; returns the HF-layout weights a converter must produce."""
    tokens, types, merges = tiny_vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(TINY["layers"])
    writer.add_context_length(128)
    writer.add_embedding_length(TINY["hidden"])
    writer.add_feed_forward_length(TINY["ffn"])
    writer.add_head_count(TINY["heads"])
    writer.add_head_count_kv(TINY["kv_heads"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(500000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(TINY_CHAT_TEMPLATE)
    expected = {
        name: add_gguf_tensor(writer, name, weight)
        for name, weight in tiny_hf_weights(len(tokens), tied).items()
    }
    _finish(writer)
    return expected


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("tiny-gguf")
    expected = write_tiny_gguf(root / "tiny.gguf")
    convert_gguf(root / "tiny.gguf", root / "out")
    return root / "out", expected


def test_tiny_weights_unpermuted_exactly(tiny_dir) -> None:
    out, expected = tiny_dir
    converted = load_file(str(out / "model.safetensors"))
    assert set(converted) == set(expected)
    for name, weight in expected.items():
        assert torch.equal(converted[name], torch.from_numpy(np.asarray(weight))), name


def test_tiny_config(tiny_dir) -> None:
    out, _ = tiny_dir
    config = ModelConfig.from_dir(out)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 2, 8)
    assert not config.tie_word_embeddings and config.rope.theta == 500000.0
    assert config.rms_norm_eps == pytest.approx(1e-6) and config.max_position_embeddings == 128


def test_tiny_tokenizer(tiny_dir) -> None:
    out, _ = tiny_dir
    tokenizer = Tokenizer.from_dir(out)
    the, think = tokenizer.encode(" the", False), tokenizer.encode("<think>", False)
    assert len(the) == 1 and len(think) == 1  # merged; user-defined token kept whole
    assert tokenizer.encode("x the")[0] == tokenizer.bos_token_id == 0  # add_bos_token
    assert tokenizer.decode(tokenizer.encode("a<think> the</s>")) == "a<think> the"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "yo"}]) == "<s>yo</s>"


def test_tied_embeddings_store_no_head(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tied.gguf", tied=True)
    convert_gguf(tmp_path / "tied.gguf", tmp_path / "out")
    assert ModelConfig.from_dir(tmp_path / "out").tie_word_embeddings
    assert "lm_head.weight" not in load_file(str(tmp_path / "out" / "model.safetensors"))


def test_non_llama_gguf_is_refused(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "other.gguf"), "qwen2")
    writer.add_block_count(1)
    _finish(writer)
    with pytest.raises(UnsupportedModel, match="architecture 'qwen2' is not supported"):
        convert_gguf(tmp_path / "other.gguf", tmp_path / "out")


def test_garbage_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(UnsupportedModel, match="not a readable GGUF file") as info:
        convert_gguf(tmp_path / "junk.gguf", tmp_path / "out")
    assert "\n" not in str(info.value)
