"""Which attention backend an engine runs, chosen once at start-up."""

from __future__ import annotations

import importlib.util

from shared.errors import KvstackError
from shared.kvcache.storage import KVStorage
from shared.model.attention import AttentionBackend, TorchPagedAttention


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def attention_backend(name: str, storage: KVStorage, head_dim: int) -> AttentionBackend:
    """The backend `name` asks for ("auto": Triton's kernels where the cache is on a GPU
    and Triton is installed, else torch's and the native CPU kernels)."""
    on_gpu = storage.kv.device.type == "cuda"
    if name == "auto":
        name = "triton" if on_gpu and triton_available() else "torch"
    if name == "torch":
        return TorchPagedAttention(storage, head_dim)
    if not triton_available():
        raise KvstackError("--attention triton needs Triton (pip install triton)")
    from shared.model.triton_attention import TritonPagedAttention  # imports Triton

    return TritonPagedAttention(storage, head_dim)


def backend_name(backend: AttentionBackend) -> str:
    return getattr(backend, "name", type(backend).__name__)
