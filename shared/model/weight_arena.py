"""The weights a CPU decode step streams, moved into one run of memory in the order the step
reads them, backed by transparent huge pages where the kernel grants them.

A batch-1 decode step reads every weight once, a few hundred bytes a row. Loaded tensor by
tensor, the weights sit in 4 KiB pages scattered over the heap: a TLB miss every 4 KiB, and
each matrix starts a new stream that the prefetchers have to find again. One arena in 2 MiB
pages, qkv, o, gate_up and down layer after layer, is one stream (`python -m bench gemv
--arena`, docs/notes/2026-11-26-amx-xeon.md: "Decode's weights in huge pages").
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from shared.huge_pages import zeros_bytes
from shared.model.quant import QuantLinear

ALIGN = 64  # each tensor starts on a cache line of its own


def pack_weights(model: nn.Module) -> int:
    """Move `model`'s CPU weights (quantized blocks, float matrices and embeddings) into one
    arena, in the order its modules run; tied weights stay tied. Returns the arena's bytes
    (0: nothing to move)."""
    slots: dict[tuple, list[tuple[nn.Module, str]]] = {}
    sizes: dict[tuple, int] = {}
    for module, name, tensor in _weight_slots(model):
        key = _key(tensor)
        slots.setdefault(key, []).append((module, name))
        sizes[key] = tensor.nbytes
    if not slots:
        return 0
    offsets, size = _layout(sizes)
    arena = zeros_bytes(size)
    for key, owners in slots.items():  # keys taken before any rebinding moved a tensor
        module, name = owners[0]
        tensor = getattr(module, name)
        view = arena[offsets[key] : offsets[key] + tensor.nbytes].view(tensor.dtype)
        view = view.view(tensor.shape).copy_(tensor)
        # NOTE: one tensor at a time: each old one is freed as soon as its owners let go, so
        # the peak is the weights plus one tensor, not twice the weights.
        for module, name in owners:
            _rebind(module, name, view)
    return size


def _weight_slots(model: nn.Module) -> Iterator[tuple[nn.Module, str, torch.Tensor]]:
    """(module, attribute, tensor) of each weight a step streams, in module order."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            yield module, "blocks", module.blocks
            continue
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Parameter) and weight.dim() == 2 and weight.device.type == "cpu":
            yield module, "weight", weight


def _key(tensor: torch.Tensor) -> tuple:
    return tensor.data_ptr(), tuple(tensor.shape), tensor.dtype


def _layout(sizes: dict[tuple, int]) -> tuple[dict[tuple, int], int]:
    offsets, end = {}, 0
    for key, nbytes in sizes.items():
        offsets[key] = end
        end += -(-nbytes // ALIGN) * ALIGN
    return offsets, end


def _rebind(module: nn.Module, name: str, view: torch.Tensor) -> None:
    current = getattr(module, name)
    if isinstance(current, nn.Parameter):
        current.data = view  # the same Parameter: whatever else holds it (a tied head) follows
    else:
        setattr(module, name, view)
