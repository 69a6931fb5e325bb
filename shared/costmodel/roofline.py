"""Predictions from first principles: each step is bound by compute or by memory traffic,
whichever takes longer, at the achievable share of the hardware's peak."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.costmodel.hardware import Hardware
from shared.costmodel.shapes import ModelShape


@dataclass(frozen=True)
class RooflineCostModel:
    shape: ModelShape
    hardware: Hardware

    @property
    def kv_bytes_per_token(self) -> int:
        return self.shape.kv_bytes_per_token

    def prefill_time(self, num_new: int, num_cached: int = 0) -> float:
        flops = 2.0 * self.shape.params * num_new + self.shape.attention_flops(num_new, num_cached)
        kv_read = self.shape.kv_bytes_per_token * num_cached
        return self._bound(flops, self.shape.weight_bytes + kv_read)

    def decode_step_time(self, batch_size: int, total_context: int) -> float:
        compute, memory = self._decode_work(batch_size, total_context)
        return self.hardware.step_overhead + max(compute, memory)

    def decode_step_times(self, batch: np.ndarray, context: np.ndarray) -> np.ndarray:
        """decode_step_time over arrays: a conductor weighs every decode worker at once."""
        compute, memory = self._decode_work(batch, context)
        return self.hardware.step_overhead + np.maximum(compute, memory)

    def _decode_work(self, batch, context):
        """(compute seconds, memory seconds) of a step; scalars or arrays alike."""
        shape, hw = self.shape, self.hardware
        flops = (
            2.0 * shape.params * batch
            + 4.0 * shape.num_layers * shape.num_heads * shape.head_dim * context
        )
        traffic = shape.weight_bytes + shape.kv_bytes_per_token * context
        return flops / (hw.flops * hw.mfu), traffic / (hw.mem_bw * hw.bw_efficiency)

    def transfer_time(self, num_bytes: float) -> float:
        return self.hardware.link_latency + num_bytes / self.hardware.link_bw

    def _bound(self, flops: float, num_bytes: float) -> float:
        hw = self.hardware
        compute = flops / (hw.flops * hw.mfu)
        memory = num_bytes / (hw.mem_bw * hw.bw_efficiency)
        return hw.step_overhead + max(compute, memory)
