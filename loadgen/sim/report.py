"""A simulation's result: one RequestRecord per request (virtual times), vLLM's summary of
them (`loadgen.metrics.summarize`) in loadgen's result document, and a "sim" section:
cache hit ratios, rejections, wasted prefill, Mooncake-style SLO attainment and the load
series. The records themselves stay out of the document (`records_file.py`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from itertools import pairwise

import numpy as np

from loadgen.metrics import summarize
from loadgen.output import result_header
from loadgen.records import RequestRecord
from loadgen.sim.config import SimConfig
from loadgen.sim.estimates import estimate_errors
from loadgen.sim.job import Job
from loadgen.sim.runner import SimRun
from loadgen.trace import TraceRow
from loadgen.tracestats import infinite_cache_hit_ratio

SLOWEST_SHARE = 0.1  # Mooncake's TBT of a request: mean of its slowest 10% of gaps


def record_of(job: Job) -> RequestRecord:
    extra = placement_facts(job)
    if job.first_token is None:
        return RequestRecord(
            job.index,
            job.arrival,
            job.num_prompt_tokens,
            0,
            None,
            (),
            0.0,
            job.status,
            job.error,
            extra=extra,
        )
    times = [job.first_token, *job.token_ends]
    gaps = tuple(b - a for a, b in pairwise(times))
    return RequestRecord(
        job.index,
        job.arrival,
        job.num_prompt_tokens,
        job.num_output_tokens,
        job.first_token - job.arrival,
        gaps,
        times[-1] - job.arrival,
        cached_tokens=job.prefix_tokens,
        extra=extra,
    )


def placement_facts(job: Job) -> dict:
    """Where the request ran and what its prefill found (empty when it was rejected)."""
    if not job.prefill_id:
        return {}
    facts = {
        "prefill": job.prefill_id,
        "decode": job.decode_id,
        "total_blocks": len(job.row.hash_ids),
    }
    if job.placement is not None:
        facts["predicted_ttft"] = job.placement.predicted_ttft
    if prefilled(job):
        facts.update(
            local_blocks=job.plan.local_blocks,
            fetched_blocks=job.plan.fetched_blocks,
            fetched_from=job.plan.source,
            prefill_queue_s=job.prefill_start - job.arrival,
            fetch_s=job.fetch_seconds,
            compute_s=job.compute_seconds,
        )
    if job.wasted:
        facts["wasted_prefill"] = True
    return facts


def prefilled(job: Job) -> bool:
    return job.first_token is not None or job.wasted


def mooncake_tbt(itl: Sequence[float]) -> float:
    """The mean of a request's slowest 10% of token gaps (Mooncake FAST §5.1)."""
    if not itl:
        return 0.0
    slowest = np.sort(np.asarray(itl))[-math.ceil(SLOWEST_SHARE * len(itl)) :]
    return float(slowest.mean())


def hit_ratios(jobs: Sequence[Job], rows: Sequence[TraceRow]) -> dict:
    """Over the prompts that were prefilled: blocks found in the chosen node's own cache
    (local), also counting those fetched from the pool or a peer (global); and the
    ceiling over the whole trace."""
    done = [job for job in jobs if prefilled(job)]
    total = sum(len(job.row.hash_ids) for job in done)
    local = sum(job.plan.local_blocks for job in done)
    fetched = sum(job.plan.fetched_blocks for job in done)
    return {
        "local": local / total if total else 0.0,
        "global": (local + fetched) / total if total else 0.0,
        "ceiling": infinite_cache_hit_ratio(rows),
        "blocks": {
            "total": total,
            "local": local,
            "fetched": fetched,
            "prefilled_requests": len(done),
        },
    }


def mooncake_slo(records: Sequence[RequestRecord], slo_ttft: float, slo_tbt: float) -> dict:
    """Attainment as the Mooncake papers count it: requests within the TTFT SLO and whose
    TBT (mean of the slowest 10% of gaps) is within the TBT SLO, over all requests sent."""
    done = [r for r in records if r.success]
    tbts = [mooncake_tbt(r.itl) for r in done]
    good = sum((r.ttft or 0.0) <= slo_ttft and tbt <= slo_tbt for r, tbt in zip(done, tbts))
    # (every done record has a ttft: `success` says so)
    ms = np.asarray(tbts or [0.0]) * 1000
    return {
        "slo_attainment": good / len(records) if records else 0.0,
        "mean_tbt_ms": float(ms.mean()),
        "p90_tbt_ms": float(np.percentile(ms, 90)),
    }


def rounded(column: Sequence[float]) -> list[float]:
    """A load sample to 6 significant digits (a count without ".0"): plenty for a plot,
    and a smaller JSON."""
    values = (float(f"{value:.6g}") for value in column)
    return [int(value) if value.is_integer() else value for value in values]


def sim_section(
    run: SimRun,
    rows: Sequence[TraceRow],
    records: Sequence[RequestRecord],
    config: SimConfig,
    describe: dict,
) -> dict:
    """`describe`: how the run was made (cost model, trace replay) for the record."""
    scheduling = config.scheduling
    wasted = [job for job in run.jobs if job.wasted]
    return {
        **describe,
        "mode": "colocated" if config.colocated else "disaggregated",
        "nodes": (
            {"colocated": config.num_colocated}
            if config.colocated
            else {"prefill": config.num_prefill, "decode": config.num_decode}
        ),
        "policy": scheduling.policy,
        "admission": scheduling.admission,
        "slo_ttft_s": scheduling.slo_ttft,
        "slo_tbt_s": scheduling.slo_tbt,
        "pool": config.pool and not config.colocated,
        "remote_prefix": config.remote_prefix and not config.colocated,
        "cache_tokens_per_node": config.cache_tokens,
        "kv_tokens_per_node": config.kv_tokens,
        "heartbeat_interval_s": config.heartbeat_interval,
        "seed": config.seed,
        "hit_ratio": hit_ratios(run.jobs, rows),
        "rejected": sum(job.status == 503 and not job.wasted for job in run.jobs),
        "wasted_prefill": {
            "requests": len(wasted),
            "seconds": sum(job.busy_seconds for job in wasted),
            "tokens": sum(job.num_prompt_tokens for job in wasted),
        },
        "prefill_busy_seconds": sum(job.busy_seconds for job in run.jobs if prefilled(job)),
        "mooncake_slo": mooncake_slo(records, scheduling.slo_ttft, scheduling.slo_tbt),
        "estimates": estimate_errors(run.jobs),
        "conductor": asdict(run.conductor),
        "virtual_seconds": run.end,
        "wall_seconds": run.wall_seconds,
        "timeseries": {name: rounded(column) for name, column in run.series.items()},
    }


def build_sim_result(
    run: SimRun, rows: Sequence[TraceRow], config: SimConfig, meta: dict, describe: dict
) -> dict:
    """The result document of `run` (see `sim_result`)."""
    return sim_result(run, rows, [record_of(job) for job in run.jobs], config, meta, describe)


def sim_result(
    run: SimRun,
    rows: Sequence[TraceRow],
    records: Sequence[RequestRecord],
    config: SimConfig,
    meta: dict,
    describe: dict,
) -> dict:
    """The result document as `loadgen run` writes it, less the per-request arrays and
    records (`loadgen/sim/records_file.py` writes those on request), with the "sim"
    section. SLOs for goodput: the TTFT SLO and the TBT SLO as a TPOT bound (vLLM's keys)."""
    first = min((job.arrival for job in run.jobs), default=0.0)
    slos = {"ttft": config.scheduling.slo_ttft, "tpot": config.scheduling.slo_tbt}
    summary = summarize(records, run.end - first, slos)
    result = result_header(summary, meta)
    result["sim"] = sim_section(run, rows, records, config, describe)
    return result
