"""Where a model directory keeps its weights (no torch: the gateway names KV layouts with
it)."""

from __future__ import annotations

import json
from pathlib import Path

from shared.errors import ModelNotFound


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"no weights (*.safetensors) in {model_dir}")
    return files
