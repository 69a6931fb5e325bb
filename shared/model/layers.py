"""The dense parts of a Llama-family layer."""

from __future__ import annotations

import torch
from torch import nn

from shared.model import ops


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)

    def matmul_dtype(self, x: torch.Tensor) -> torch.dtype:
        """What rows like x multiply in: their own dtype (QuantLinear's may differ)."""
        return x.dtype


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(norm(x + residual), x + residual), fused."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class GatedMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: a prefill chunk whose quantized weights multiply in bfloat16 goes through the
        # MLP in it: one conversion in and one out instead of one per matmul side (the
        # 2x1536-wide ones were most of a 128-token prefill's copies).
        dtype = self.gate_up_proj.matmul_dtype(x)
        up = self.gate_up_proj(x.to(dtype))
        return self.down_proj(ops.silu_and_mul(up)).to(x.dtype)
