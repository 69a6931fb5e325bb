"""The name of a KV layout (no torch: the gateway names blocks in it without a model)."""

from __future__ import annotations

from pathlib import Path

import xxhash

from shared.model.files import weight_files


def kv_namespace(model_dir: Path, dtype: str, weights: str = "float") -> str:
    """Names the KV layout: the same model weights, held the same way (`weights`:
    shared/engine/config.py's kv_weights), and dtype give the same block hashes."""
    digest = xxhash.xxh3_64((model_dir / "config.json").read_bytes())
    for path in weight_files(model_dir):
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    held = "" if weights == "float" else f"/{weights}"
    return f"{digest.hexdigest()}/{dtype}{held}"
