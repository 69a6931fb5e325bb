"""The conductor's scheduling settings on a command line, defined once: `kvstack up` and
`kvstack conductor` (services/settings.py) and `loadgen sim` add them from here."""

from __future__ import annotations

from shared.conductor.config import ADMISSION_MODES, POLICY_NAMES, SchedulingConfig
from shared.setting import Setting

_scheduling = SchedulingConfig()

SCHEDULING_SETTINGS: dict[str, Setting] = {
    "policy": Setting("--policy", choices=POLICY_NAMES, default=_scheduling.policy),
    "admission": Setting(
        "--admission",
        "how overload is refused (see docs/conductor.md)",
        choices=ADMISSION_MODES,
        default=_scheduling.admission,
    ),
    "slo_ttft": Setting(
        "--slo-ttft", "seconds (default SLO)", type=float, default=_scheduling.slo_ttft
    ),
    "slo_tbt": Setting(
        "--slo-tbt", "seconds (default SLO)", type=float, default=_scheduling.slo_tbt
    ),
    "balancing_threshold": Setting(
        "--balancing-threshold",
        "kvcentric loads a remote prefix when it is this many times the local (below it, "
        "when loading is faster than recomputing)",
        type=float,
        default=_scheduling.balancing_threshold,
    ),
    "decode_time": Setting(
        "--decode-time",
        "predictive admission's uniform decode seconds, until learned",
        type=float,
        default=_scheduling.decode_time,
    ),
}
