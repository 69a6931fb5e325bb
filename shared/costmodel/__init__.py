"""Time predictions the conductor, the mock engine and the simulator share.

A cost model answers three questions: how long a prefill of `num_new` tokens takes
after `num_cached` cached ones, how long one decode step of `batch` requests with
`total_context` tokens of KV takes, and how long moving `num_bytes` of KV between
instances takes. `roofline` derives the answers from a model shape and a hardware
profile; `fitted` from measurements of the real engine (`kvstack profile`, with
`shared.profiling` and `overhead`, which this package does not import: they need torch and
a running stack).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from shared.costmodel.fitted import FittedCostModel
from shared.costmodel.hardware import HARDWARE, Hardware
from shared.costmodel.roofline import RooflineCostModel
from shared.costmodel.shapes import MODELS, ModelShape
from shared.errors import KvstackError

ROOFLINE_PREFIX = "roofline:"


class CostModel(Protocol):
    @property
    def kv_bytes_per_token(self) -> int: ...

    def prefill_time(self, num_new: int, num_cached: int = 0) -> float: ...

    def decode_step_time(self, batch_size: int, total_context: int) -> float: ...

    def transfer_time(self, num_bytes: float) -> float: ...


def roofline(model: str, hardware: str) -> RooflineCostModel:
    if model not in MODELS:
        raise KvstackError(f"unknown model shape {model!r}; known: {', '.join(MODELS)}")
    if hardware not in HARDWARE:
        raise KvstackError(f"unknown hardware {hardware!r}; known: {', '.join(HARDWARE)}")
    return RooflineCostModel(MODELS[model], HARDWARE[hardware])


def load(path: str | Path) -> FittedCostModel:
    return FittedCostModel.load(Path(path))


def from_spec(spec: str) -> CostModel:
    """`roofline:<model>:<hardware>` (e.g. roofline:llama3-70b:a800), or the path of a file
    `kvstack profile` wrote."""
    if not spec:
        raise KvstackError("no cost model given: a profile's path or roofline:<model>:<hw>")
    if not spec.startswith(ROOFLINE_PREFIX):
        return load(spec)
    parts = spec.split(":")
    if len(parts) != 3:
        raise KvstackError(
            f"bad cost model {spec!r}: expected roofline:<model>:<hardware>, "
            f"e.g. roofline:llama3-70b:a800"
        )
    return roofline(parts[1], parts[2])


__all__ = [
    "HARDWARE",
    "MODELS",
    "CostModel",
    "FittedCostModel",
    "Hardware",
    "ModelShape",
    "RooflineCostModel",
    "from_spec",
    "load",
    "roofline",
]
