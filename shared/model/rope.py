"""Rotary position embeddings (Hugging Face "rotate half" layout), with llama3 scaling."""

from __future__ import annotations

import math

import torch

from shared.model.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding:
    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        self.inv_freq = inverse_frequencies(rope, head_dim)
        # NOTE: a copy per device, made once: copying it every step is a host-to-device
        # transfer per forward, and a CUDA graph cannot capture one.
        self._on_device: dict[torch.device, torch.Tensor] = {self.inv_freq.device: self.inv_freq}

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin for `positions` [T], each [T, head_dim / 2]."""
        freqs = positions.float()[:, None] * self._inv_freq_on(positions.device)[None, :]
        return freqs.cos(), freqs.sin()

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        if device not in self._on_device:
            self._on_device[device] = self.inv_freq.to(device)
        return self._on_device[device]
