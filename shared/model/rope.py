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
        empty = self.inv_freq.new_empty(0, self.inv_freq.numel())
        self._table = (empty, empty)  # CPU positions' cos and sin (tables)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin for `positions` [T], each [T, head_dim / 2]."""
        if positions.device.type == "cpu" and positions.numel():
            cos, sin = self.tables(int(positions.max()) + 1)
            return cos[positions], sin[positions]
        return _cos_sin(positions.float(), self._inv_freq_on(positions.device))

    def tables(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin [P, head_dim / 2] of CPU positions 0..P-1, P >= num_positions:
        grown as asked, never recomputed per step.

        NOTE: a CPU decode step's rotary phase was four small torch calls, each paying cold
        caches after the weights had streamed through them (~100 us of a 4 ms SmolLM2 step:
        `python -m bench step-phases`); the fused step reads rows of these instead. Each row
        is the formula's own value: a vector op's lanes compute what a per-step call did."""
        if num_positions > self._table[0].shape[0]:
            rows = max(TABLE_MIN_ROWS, 2 * self._table[0].shape[0], num_positions)
            rows = -(-rows // TABLE_MIN_ROWS) * TABLE_MIN_ROWS
            self._table = _cos_sin(torch.arange(rows).float(), self.inv_freq)
        return self._table

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        if device not in self._on_device:
            self._on_device[device] = self.inv_freq.to(device)
        return self._on_device[device]


# The rotary tables grow by whole multiples of this many positions.
TABLE_MIN_ROWS = 256


def _cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = positions[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()
