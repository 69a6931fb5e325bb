"""The same slice in `loadgen sim`, with what the live stack has: the node counts, the cost
model its mock workers sleep, the policy and admission, the heartbeat interval, and per
node the KV tokens a mock worker's pool holds (its prefix cache, and decode's KV room)."""

from __future__ import annotations

from pathlib import Path

from bench.live_vs_sim.replay import Replay, Summary, run_loadgen
from services.settings import SETTINGS
from shared.engine.config import EngineConfig
from shared.engine.mock import MockSpec


def mock_spec(replay: Replay) -> MockSpec:
    """What `kvstack up --engine mock` gives its workers (the default KV scale)."""
    return MockSpec(replay.model, replay.hardware)


def worker_kv_tokens(replay: Replay) -> int:
    """Tokens of a mock worker's block pool: the hardware's HBM, bounded by --kv-cache-gib."""
    block_size = EngineConfig.block_size
    gib = float(SETTINGS["kv_cache_gib"].current_default())
    return mock_spec(replay).num_blocks(block_size, int(gib * (1 << 30))) * block_size


def sim_argv(replay: Replay, policy: str, out: Path) -> list[str]:
    kv_tokens = str(worker_kv_tokens(replay))
    heartbeat = SETTINGS["heartbeat_interval"].current_default()
    return [
        "sim",
        *replay.slice_args(),
        *("--prefill", str(replay.prefill), "--decode", str(replay.decode)),
        *("--model", replay.model, "--hardware", replay.hardware),
        *("--policy", policy, "--admission", replay.admission),
        *("--cache-tokens", kv_tokens, "--kv-tokens", kv_tokens),
        *("--heartbeat-interval", str(heartbeat), "--label", f"sim-{policy}", "--quiet"),
        *("--output-json", str(out)),
    ]


def run_sim(replay: Replay, policy: str, work_dir: Path) -> Summary:
    out = work_dir / f"sim-{policy}.json"
    result = run_loadgen(sim_argv(replay, policy, out), work_dir / "loadgen-sim.log")
    return Summary.of(result, result["sim"].get("estimates", {}))


def idle_ttft(replay: Replay, num_tokens: int) -> float:
    """A single request's TTFT on an idle simulated cluster: its KV lands when both the
    compute and the stream of its KV to decode are done."""
    cost = mock_spec(replay).cost()
    compute = cost.prefill_time(num_tokens, 0)
    return max(compute, cost.transfer_time(num_tokens * cost.kv_bytes_per_token))
