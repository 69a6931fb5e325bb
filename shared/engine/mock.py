"""The mock engine's model: which cluster-scale model and hardware a worker stands in for.

A mock worker runs no model. Its steps take the cost model's time for that model on that
hardware (`shared/engine/mock_runner.py`), and its KV cache has the model's layer count
but each token's bytes scaled down by `kv_scale`, so the real scheduler, block pool, prefix
cache, data plane and kvstore run at cluster scale on one machine. The pool holds as many
blocks as the real hardware would (its HBM minus the weights), unless the worker's KV
cache size in scaled bytes bounds it first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shared.costmodel import HARDWARE, MODELS, ModelShape, RooflineCostModel, roofline
from shared.costmodel.offload import GPUS_PER_NODE, HBM_BYTES, Assumptions, Pool
from shared.errors import KvstackError
from shared.model.config import ModelConfig

ENGINES = ("torch", "mock")
# 320 KiB of llama3-70b KV per token become 320 bytes: a whole 8xA800 pool of it (~83k
# blocks) is ~425 MB, so 16 mock workers fit in a 24 GiB machine with room for a kvstore.
DEFAULT_KV_SCALE = 1e-3
# The 128k-token window of current 70B-class models; `--max-model-len` changes it.
MOCK_MAX_MODEL_LEN = 131072


@dataclass(frozen=True)
class MockSpec:
    model: str = "llama3-70b"  # a cost model shape (shared/costmodel/shapes.py)
    hardware: str = "a800"  # a cost model hardware profile (an 8-GPU node)
    kv_scale: float = DEFAULT_KV_SCALE  # KV bytes moved and stored, relative to the real

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise KvstackError(f"unknown mock model {self.model!r}; known: {', '.join(MODELS)}")
        if self.hardware not in HARDWARE:
            raise KvstackError(
                f"unknown mock hardware {self.hardware!r}; known: {', '.join(HARDWARE)}"
            )
        if not 0 < self.kv_scale <= 1:
            raise KvstackError(f"the mock KV scale must be in (0, 1], got {self.kv_scale}")

    @property
    def shape(self) -> ModelShape:
        return MODELS[self.model]

    @property
    def cost_spec(self) -> str:
        """The conductor's `--cost-model` for the same predictions."""
        return f"roofline:{self.model}:{self.hardware}"

    def cost(self) -> RooflineCostModel:
        return roofline(self.model, self.hardware)

    @property
    def token_half_bytes(self) -> int:
        """Bytes of one token's K (and of its V) in one layer: the real size times the
        scale, rounded to whole bytes (at least one)."""
        shape = self.shape
        real = shape.num_kv_heads * shape.head_dim * shape.bytes_per_element
        return max(1, round(real * self.kv_scale))

    @property
    def kv_bytes_per_token(self) -> int:
        """Scaled KV bytes of one token, all layers: what the data plane moves per token."""
        return self.shape.num_layers * 2 * self.token_half_bytes

    @property
    def namespace(self) -> str:
        """Names the KV layout in block hashes: workers and gateway must agree on it."""
        return f"mock/{self.model}/{self.kv_bytes_per_token}B"

    def real_capacity_blocks(self, block_size: int) -> int | None:
        """Blocks of real KV an instance of this hardware holds beside the weights (None
        when its memory size is not known, e.g. "cpu")."""
        if self.hardware not in HBM_BYTES:
            return None
        usable = Pool(self.hardware, GPUS_PER_NODE).usable_bytes(Assumptions())
        free = usable - self.shape.weight_bytes
        if free < self.shape.kv_bytes_per_token * block_size:
            raise KvstackError(
                f"{self.model} on {self.hardware}: the weights leave no room "
                f"for one KV block of {block_size} tokens"
            )
        return int(free // (self.shape.kv_bytes_per_token * block_size))

    def num_blocks(self, block_size: int, kv_cache_bytes: int) -> int:
        """The real hardware's capacity, bounded by `kv_cache_bytes` of scaled KV."""
        bounded = max(1, kv_cache_bytes // (self.kv_bytes_per_token * block_size))
        real = self.real_capacity_blocks(block_size)
        return bounded if real is None else min(real, bounded)

    def model_config(self, tokenizer_model: ModelConfig, max_model_len: int | None) -> ModelConfig:
        """The config workers see: the mock model's layers with one KV head of
        `token_half_bytes` one-byte elements; vocabulary and stop tokens stay the tokenizer
        model's, so the gateway's tokenizer reads every token."""
        shape = self.shape
        return dataclasses.replace(
            tokenizer_model,
            hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size,
            num_layers=shape.num_layers,
            num_heads=1,
            num_kv_heads=1,
            head_dim=self.token_half_bytes,
            max_position_embeddings=max_model_len or MOCK_MAX_MODEL_LEN,
        )
