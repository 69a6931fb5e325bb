"""What both sides replay and what they measured: the slice, the cluster, a `loadgen`
command in a child process, and the numbers kept from its result document."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from services.stack.logs import tail
from shared.errors import KvstackError

DATA = Path(__file__).parent / "data"
DEFAULT_TRACE = DATA / "conversation-150.jsonl"
LOADGEN = "import sys; from loadgen.cli import main; sys.exit(main())"


@dataclass(frozen=True)
class Replay:
    """The trace slice and the cluster it runs on, live and simulated alike."""

    trace: Path = DEFAULT_TRACE
    max_requests: int = 100
    time_scale: float = 2.0
    model: str = "llama3-70b"
    hardware: str = "a800"
    prefill: int = 4
    decode: int = 4
    kvstore: int = 1
    admission: str = "none"  # nothing turned away: every request has a TTFT on both sides

    def slice_args(self) -> list[str]:
        return [
            *("--trace", str(self.trace)),
            *("--max-requests", str(self.max_requests)),
            *("--time-scale", repr(self.time_scale)),
        ]


@dataclass(frozen=True)
class Summary:
    """One side's numbers (seconds) and the conductor's estimate errors: estimate name
    -> EstimateError's fields (shared/messages.py)."""

    completed: int
    failed: int
    mean_ttft: float
    p50_ttft: float
    p90_ttft: float
    mean_tpot: float
    cached_tokens: int
    estimates: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, result: dict, estimates: dict[str, dict[str, float]]) -> Summary:
        ms = lambda key: (result.get(key) or 0.0) / 1e3
        return cls(
            result["completed"],
            result["failed"],
            ms("mean_ttft_ms"),
            ms("p50_ttft_ms"),
            ms("p90_ttft_ms"),
            ms("mean_tpot_ms"),
            result.get("cached_tokens") or 0,
            estimates,
        )


def run_loadgen(argv: list[str], log: Path) -> dict:
    """`loadgen ARGV` in a child (this checkout's code); its stdout goes to `log`, its
    progress to stderr. Returns the document its --output-json names."""
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-c", LOADGEN, *argv], stdout=out, check=False)
    if done.returncode != 0:
        raise KvstackError(f"loadgen {argv[0]} exited with {done.returncode}:\n{tail(log)}")
    return json.loads(Path(argv[argv.index("--output-json") + 1]).read_text())
