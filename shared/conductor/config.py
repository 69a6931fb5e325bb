"""How the conductor schedules: policy, SLOs and admission, as one frozen value that the
live conductor and the simulator both pass to the same pure functions."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import KvstackError

POLICY_NAMES = ("random", "round-robin", "load-balance", "cache-aware", "kvcentric")
ADMISSION_MODES = ("none", "baseline", "early", "predictive", "predictive-request")


@dataclass(frozen=True)
class SchedulingConfig:
    policy: str = "kvcentric"
    admission: str = "none"
    slo_ttft: float = 30.0  # seconds, unless a request sets its own
    slo_tbt: float = 1.0
    # kvcentric loads a remote prefix only when it is this many times the local one (the
    # paper's kvcache_balancing_threshold; it publishes no value): below it, recomputing
    # the difference costs less than the transfer and the hot holder's queue.
    balancing_threshold: float = 1.5
    decode_time: float = 20.0  # `predictive`'s uniform decode seconds until learned
    retry_after: float = 2.0  # what a rejection tells the client to wait

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise KvstackError(
                f"unknown policy {self.policy!r}; choose from {', '.join(POLICY_NAMES)}"
            )
        if self.admission not in ADMISSION_MODES:
            raise KvstackError(
                f"unknown admission mode {self.admission!r}; choose from "
                f"{', '.join(ADMISSION_MODES)}"
            )
        for name in ("slo_ttft", "slo_tbt", "balancing_threshold", "decode_time"):
            if getattr(self, name) <= 0:
                raise KvstackError(f"{name} must be positive, got {getattr(self, name)}")
