"""Predictions from measurements of the real engine (`kvstack profile`), fitted as in the
paper: a low-degree polynomial in the prompt's new and cached lengths for prefill, and a
linear model in batch size and total context for a decode step."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from shared.errors import KvstackError

PREFILL_TERMS = ("1", "n", "n^2", "n*c", "c")  # n new tokens, c cached tokens
DECODE_TERMS = ("1", "batch", "context")  # context: KV tokens of the whole batch


def prefill_features(num_new: float, num_cached: float) -> list[float]:
    return [1.0, num_new, num_new * num_new, num_new * num_cached, num_cached]


def decode_features(batch_size: float, total_context: float) -> list[float]:
    return [1.0, batch_size, total_context]


def fit(
    rows: Sequence[tuple[float, ...]], features: Callable[..., list[float]]
) -> tuple[float, ...]:
    """Least squares on (x..., seconds) rows, weighted so that relative error counts: a
    20 ms prompt off by 10 ms matters as much as a 2 s one off by 1 s. No coefficient is
    negative: a term the data would weigh below 0 (noise, on a busy machine) is left out
    and the rest fitted again, so a prediction never falls as a prompt, a batch or a
    context grows (every feature grows with them)."""
    x = np.array([features(*row[:-1]) for row in rows], dtype=np.float64)
    y = np.array([row[-1] for row in rows], dtype=np.float64)
    weight = 1.0 / np.maximum(y, 1e-6)
    a, b = x * weight[:, None], y * weight
    kept = list(range(x.shape[1]))
    coef: np.ndarray = np.zeros(0)
    while kept:
        coef, *_ = np.linalg.lstsq(a[:, kept], b, rcond=None)
        if coef.min() >= 0:
            break
        del kept[int(coef.argmin())]
    result = np.zeros(x.shape[1])
    result[kept] = coef[: len(kept)]
    return tuple(float(c) for c in result)


@dataclass(frozen=True)
class FittedCostModel:
    model: str
    prefill_coef: tuple[float, ...]  # over PREFILL_TERMS
    decode_coef: tuple[float, ...]  # over DECODE_TERMS
    link_bw: float  # bytes/s of the data plane
    link_latency: float  # seconds per transfer
    kv_bytes_per_token: int
    # Seconds a served request spends outside the engine before its first token (HTTP,
    # placement, dispatch over the bus, token relay); `kvstack profile --gateway` measures it.
    request_overhead: float = 0.0
    dtype: str = ""  # what the engine was measured with: predictions hold
    threads: int = 0  # for workers that run the same way

    def __post_init__(self) -> None:
        if len(self.prefill_coef) != len(PREFILL_TERMS):
            raise KvstackError(
                f"prefill_coef needs {len(PREFILL_TERMS)} coefficients "
                f"({', '.join(PREFILL_TERMS)}), got {len(self.prefill_coef)}"
            )
        if len(self.decode_coef) != len(DECODE_TERMS):
            raise KvstackError(
                f"decode_coef needs {len(DECODE_TERMS)} coefficients "
                f"({', '.join(DECODE_TERMS)}), got {len(self.decode_coef)}"
            )
        if self.link_bw <= 0 or self.link_latency < 0 or self.kv_bytes_per_token <= 0:
            raise KvstackError(
                "link_bw and kv_bytes_per_token must be positive, link_latency not negative"
            )

    # NOTE: plain Python sums: the conductor calls these per worker and per placement, and
    # np.dot on five numbers costs several times more than the arithmetic.
    def prefill_time(self, num_new: int, num_cached: int = 0) -> float:
        terms = prefill_features(num_new, num_cached)
        return max(0.0, sum(c * t for c, t in zip(self.prefill_coef, terms)))

    def decode_step_time(self, batch_size: int, total_context: int) -> float:
        terms = decode_features(batch_size, total_context)
        return max(0.0, sum(c * t for c, t in zip(self.decode_coef, terms)))

    def decode_step_times(self, batch: np.ndarray, context: np.ndarray) -> np.ndarray:
        """decode_step_time over arrays: a conductor weighs every decode worker at once."""
        c0, c1, c2 = self.decode_coef
        return np.maximum(0.0, c0 + c1 * batch + c2 * context)

    def transfer_time(self, num_bytes: float) -> float:
        return self.link_latency + num_bytes / self.link_bw

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> FittedCostModel:
        if not path.is_file():
            raise KvstackError(f"no cost model at {path}; run `kvstack profile` first")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except KeyError as e:
            raise KvstackError(f"{path} is not a cost model file: no {e.args[0]!r}") from None
        except (ValueError, TypeError, KvstackError) as e:
            raise KvstackError(f"{path} is not a cost model file: {e}") from None

    @classmethod
    def from_dict(cls, data: dict) -> FittedCostModel:
        """Keys this version does not know are ignored, so older code reads newer files."""
        if not isinstance(data, dict):
            raise KvstackError(f"expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["prefill_coef"] = tuple(float(c) for c in data["prefill_coef"])
        values["decode_coef"] = tuple(float(c) for c in data["decode_coef"])
        return cls(**values)
