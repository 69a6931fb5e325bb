"""Hardware profiles of one serving instance (a node of accelerators, or this CPU).

Peak figures are vendor dense-bf16 numbers; `mfu` and `bw_efficiency` say how much of
them serving really gets (a roofline is an upper bound: these make it a prediction).
"""

from __future__ import annotations

from dataclasses import dataclass

TB = 1e12
GB = 1e9


@dataclass(frozen=True)
class Hardware:
    name: str
    flops: float  # peak dense bf16 FLOP/s of the instance
    mem_bw: float  # bytes/s of its memory (HBM; DRAM for a CPU)
    link_bw: float  # bytes/s between instances (the KV data plane)
    link_latency: float = 20e-6  # seconds per transfer
    mfu: float = 0.5  # achieved share of peak FLOP/s
    bw_efficiency: float = 0.8  # achieved share of peak memory bandwidth
    step_overhead: float = 0.0  # fixed seconds per engine step (launches, Python)
    price_per_hour: float = 0.0  # for cost comparisons (Lamina); USD per instance-hour


def gpus(
    name: str, count: int, tflops: float, hbm_tb_s: float, nic_gbps: float, price: float, **kw
) -> Hardware:
    """A node of `count` GPUs working as one instance (tensor parallel)."""
    return Hardware(
        f"{count}x{name}",
        count * tflops * TB,
        count * hbm_tb_s * TB,
        nic_gbps / 8 * GB,
        price_per_hour=count * price,
        **kw,
    )


# Prices per GPU-hour: H100 and H20 as in Lamina (Google Cloud; H20 estimated there); A800
# derived from MegaScale-Infer's relative prices (A800 2.26 vs H20 1.85, so 1.22x H20).
# Node links: Mooncake's A800 nodes have 800 Gbps; H100/H20 nodes 8 x 400 Gbps NICs.
HARDWARE = {
    "a800": gpus("A800", 8, 312, 2.0, 800, 4.63 * 2.26 / 1.85, step_overhead=2e-3),
    "h100": gpus("H100", 8, 989, 3.35, 3200, 11.06, step_overhead=2e-3),
    "h20": gpus("H20", 8, 148, 4.0, 3200, 4.63, step_overhead=2e-3),
    # This machine: 2 vCPUs with AMX, bf16 GEMMs measured at up to 1.4 TFLOP/s
    # (`python -m bench engine`), copies at about 20 GB/s, loopback data plane ~2 GB/s.
    "cpu": Hardware(
        "cpu-2vcpu",
        1.4 * TB,
        20 * GB,
        2 * GB,
        link_latency=2e-3,
        mfu=0.35,
        bw_efficiency=0.5,
        step_overhead=5e-3,
    ),
}
