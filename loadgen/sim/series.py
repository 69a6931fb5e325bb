"""The cluster's load over time, sampled every few virtual seconds: what Mooncake's load
oscillation figure plots (§7.3). Prefill load is queued prefill seconds over the TTFT SLO,
decode load is TBT over the TBT SLO, each the mean over a pool's nodes (§7.1, §7.4)."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.sim.cluster import Cluster
from loadgen.sim.colocated import ColocatedNode
from loadgen.sim.decode import DecodeNode
from loadgen.sim.prefill import PrefillNode


@dataclass
class Counts:
    arrived: int = 0
    rejected: int = 0  # by admission, before any work
    wasted: int = 0  # prefilled, then refused by the decode node
    finished: int = 0


COLUMNS = (
    "time",
    "prefill_queue_s",
    "prefill_queue_s_max",
    "prefill_waiting",
    "prefill_load",
    "decode_tbt_s",
    "decode_tbt_s_max",
    "decode_load",
    "decode_running",
    "decode_waiting",
    "decode_kv_usage",
    "arrived",
    "rejected",
    "wasted",
    "finished",
)


class LoadSeries:
    def __init__(self, slo_ttft: float, slo_tbt: float) -> None:
        self.slo_ttft, self.slo_tbt = slo_ttft, slo_tbt
        self.columns: dict[str, list[float]] = {name: [] for name in COLUMNS}

    def sample(self, now: float, cluster: Cluster, counts: Counts) -> None:
        """Add a row (the cluster advanced to `now`)."""
        colocated: list[ColocatedNode] = list(cluster.colocated.values())
        prefill: list[PrefillNode | ColocatedNode] = [*cluster.prefill.values()] or [*colocated]
        decode: list[DecodeNode | ColocatedNode] = [*cluster.decode.values()] or [*colocated]
        queue = [node.queue_seconds(now) for node in prefill]
        tbt = [node.tbt for node in decode]
        mean_queue, mean_tbt = sum(queue) / len(queue), sum(tbt) / len(tbt)
        row = {
            "time": now,
            "prefill_queue_s": mean_queue,
            "prefill_queue_s_max": max(queue),
            "prefill_waiting": sum(len(node.queue) for node in prefill),
            "prefill_load": mean_queue / self.slo_ttft,
            "decode_tbt_s": mean_tbt,
            "decode_tbt_s_max": max(tbt),
            "decode_load": mean_tbt / self.slo_tbt,
            "decode_running": sum(node.batch.size for node in decode),
            "decode_waiting": sum(len(node.waiting) for node in decode),
            "decode_kv_usage": sum(node.batch.usage for node in decode) / len(decode),
            "arrived": counts.arrived,
            "rejected": counts.rejected,
            "wasted": counts.wasted,
            "finished": counts.finished,
        }
        for name, value in row.items():
            self.columns[name].append(value)
