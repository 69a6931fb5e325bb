"""Convert a llama.cpp GGUF file into a Hugging Face-style model directory.

The directory holds `config.json`, float32 `model.safetensors` (dequantized with the `gguf`
package), `tokenizer.json` rebuilt from the vocabulary and merges the file stores, and
`tokenizer_config.json` with the chat template. Only the `llama` architecture with a byte-level
BPE (`gpt2`) vocabulary is supported; anything else is refused with `UnsupportedModel`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from shared.errors import UnsupportedModel

ARCHITECTURE = "llama"
VOCAB_TYPE = "gpt2"
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types of added tokens
SPECIAL_TOKEN_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}

GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # NOTE: SmolLM's vocabulary was trained on single digits; GPT-2's regex alone groups them.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _gpt2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# tokenizer.ggml.pre -> how text is split before BPE, as llama.cpp splits it for that vocabulary.
PRE_TOKENIZERS = {"smollm": _smollm_pre_tokenizer, "gpt-2": _gpt2_pre_tokenizer}


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config, float32 weights and tokenizer files for `gguf_path` into `out_dir`."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    _log(f"reading {gguf_path}")
    reader = _open(gguf_path)
    meta = {key: field.contents() for key, field in reader.fields.items()}
    _check_supported(gguf_path, meta, reader)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = hf_config(meta, {tensor.name for tensor in reader.tensors})
    _write_json(out_dir / "config.json", config)
    _log(f"dequantizing {len(reader.tensors)} tensors to float32")
    save_file(
        hf_weights(reader, config), str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    build_tokenizer(meta).save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(meta))
    _log(f"wrote {out_dir}")


def _open(gguf_path: Path) -> GGUFReader:
    if not gguf_path.is_file():
        raise UnsupportedModel(f"{gguf_path} is not a file")
    try:
        return GGUFReader(gguf_path)
    except (ValueError, IndexError, KeyError, TypeError, OSError) as exc:
        raise UnsupportedModel(f"{gguf_path} is not a readable GGUF file ({exc})") from None


def _check_supported(gguf_path: Path, meta: dict, reader: GGUFReader) -> None:
    arch = meta.get("general.architecture")
    if arch != ARCHITECTURE:
        raise UnsupportedModel(
            f"{gguf_path.name}: GGUF architecture {arch!r} is not supported; only {ARCHITECTURE!r}"
        )
    vocab = meta.get("tokenizer.ggml.model")
    if vocab != VOCAB_TYPE:
        raise UnsupportedModel(
            f"{gguf_path.name}: GGUF tokenizer {vocab!r} is not supported; "
            f"only {VOCAB_TYPE!r} (byte-level BPE)"
        )
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModel(
            f"{gguf_path.name}: GGUF pre-tokenizer {pre!r} is not supported; "
            f"supported: {', '.join(PRE_TOKENIZERS)}"
        )
    if any(tensor.name == "rope_freqs.weight" for tensor in reader.tensors):
        raise UnsupportedModel(
            f"{gguf_path.name}: GGUF rope frequency factors (rope_freqs) are not supported"
        )


def hf_config(meta: dict, tensor_names: set[str]) -> dict:
    """The `config.json` of a LlamaForCausalLM with the GGUF file's hyperparameters."""
    arch = meta["general.architecture"]
    hidden, heads = meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": meta.get(f"{arch}.vocab_size", len(meta["tokenizer.ggml.tokens"])),
        "hidden_size": hidden,
        "intermediate_size": meta[f"{arch}.feed_forward_length"],
        "num_hidden_layers": meta[f"{arch}.block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", heads),
        "head_dim": meta.get(f"{arch}.attention.key_length", hidden // heads),
        "rms_norm_eps": meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        "max_position_embeddings": meta.get(f"{arch}.context_length", 2048),
        "rope_theta": meta.get(f"{arch}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        config["rope_scaling"] = {
            "rope_type": "linear",
            "factor": meta[f"{arch}.rope.scaling.factor"],
        }
    return config


def hf_weights(reader: GGUFReader, config: dict) -> dict[str, np.ndarray]:
    """Every tensor dequantized to float32, under its Hugging Face name and layout."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    weights = {}
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dims innermost first
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        part = tensor.name.split(".")[-2]
        if part in heads:
            array = unpermute_rotary(array, heads[part])
        weights[hf_tensor_name(tensor.name)] = np.ascontiguousarray(array)
    return weights


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order, as transformers' GGUF loader does.

    llama.cpp interleaves each head's rotary pairs (x0, y0, x1, y1, ...) for its rope kernel;
    Hugging Face keeps the two halves apart (x0, x1, ..., y0, y1, ...).
    """
    half = weight.shape[0] // num_heads // 2
    rows = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


def hf_tensor_name(gguf_name: str) -> str:
    base, _, kind = gguf_name.rpartition(".")
    hf_base = GLOBAL_TENSORS.get(base)
    if base.startswith("blk.") and base.count(".") == 2:
        _, layer, part = base.split(".")
        hf_base = f"model.layers.{layer}.{LAYER_TENSORS[part]}" if part in LAYER_TENSORS else None
    if not hf_base:
        raise UnsupportedModel(f"unexpected tensor {gguf_name!r} in GGUF file")
    return f"{hf_base}.{kind}"


def build_tokenizer(meta: dict) -> Tokenizer:
    """A byte-level BPE tokenizer equal to the one llama.cpp builds from this metadata."""
    spelling = byte_spelling()
    alphabet = frozenset(spelling.values())
    vocab = {
        _spelled(token, spelling, alphabet): index
        for index, token in enumerate(meta["tokenizer.ggml.tokens"])
    }
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[meta.get("tokenizer.ggml.pre", "gpt-2")]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(meta)
    tokenizer.add_special_tokens(_added_tokens(meta, CONTROL, alphabet))
    tokenizer.add_tokens(_added_tokens(meta, USER_DEFINED, alphabet))
    return tokenizer


def byte_spelling() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character, in which byte-level vocabularies
    are written."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    spelling = {byte: chr(byte) for byte in printable}
    others = (byte for byte in range(256) if byte not in spelling)
    spelling.update({byte: chr(256 + n) for n, byte in enumerate(others)})
    return spelling


def _spelled(token: str, spelling: dict[int, str], alphabet: frozenset[str]) -> str:
    # NOTE: llama.cpp stores some added tokens as plain text; the BPE model needs byte spelling.
    if alphabet.issuperset(token):
        return token
    return "".join(spelling[byte] for byte in token.encode("utf-8"))


def _added_tokens(meta: dict, token_type: int, alphabet: frozenset[str]) -> list[AddedToken]:
    # NOTE: one outside the byte alphabet would get a new id past the model's vocabulary.
    types = meta.get("tokenizer.ggml.token_type") or []
    return [
        AddedToken(token, special=token_type == CONTROL, normalized=False)
        for token, kind in zip(meta["tokenizer.ggml.tokens"], types)
        if kind == token_type and alphabet.issuperset(token)
    ]


def _post_processor(meta: dict) -> processors.PostProcessor:
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if not meta.get("tokenizer.ggml.add_bos_token", False) or bos_id is None:
        return processors.ByteLevel(trim_offsets=False)
    bos = meta["tokenizer.ggml.tokens"][bos_id]
    return processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )


def tokenizer_config(meta: dict) -> dict:
    """`tokenizer_config.json`: special tokens, BOS handling and the chat template."""
    tokens = meta["tokenizer.ggml.tokens"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get(f"{meta['general.architecture']}.context_length", 2048),
    }
    for name, key in SPECIAL_TOKEN_KEYS.items():
        token_id = meta.get(key)
        if token_id is not None and token_id < len(tokens):
            config[name] = tokens[token_id]
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _log(message: str) -> None:
    print(f"[gguf] {message}", file=sys.stderr, flush=True)
