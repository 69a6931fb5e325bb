"""The device a command asked for, made concrete where torch can tell what exists."""

from __future__ import annotations

from dataclasses import replace

import torch

from shared.engine.config import EngineConfig
from shared.errors import KvstackError

DEVICE_CHOICES_HELP = "auto (CUDA when present, else CPU), cpu, cuda or cuda:N"


def resolve_device(name: str) -> str:
    """ "auto" is the first CUDA device where one exists, else the CPU; a CUDA device that
    torch cannot see is an error here, at start-up, not in the first request."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise KvstackError(f"--device {name}: torch sees no CUDA device on this machine")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise KvstackError(f"--device {name}: this machine has {torch.cuda.device_count()}")
    return name


def with_concrete_device(config: EngineConfig) -> EngineConfig:
    """The config with "auto" resolved, so that everything after (the dtype "auto" picks,
    the KV namespace, generators) sees the device the engine really runs on."""
    device = resolve_device(config.device)
    return config if device == config.device else replace(config, device=device)
