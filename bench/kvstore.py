"""`python -m bench kvstore`: the KV pools' put/get throughput side by side (the kvstore
per tier, Mooncake Store), a block and a request's blocks per call, beside what a raw
loopback socket and memcpy move in the same calls (measured in the same run), and what a
hit saves: TTFT of a 2,048-token prompt cold, with its first 1,984 tokens in the kvstore,
and with them in the prefill worker's own cache."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

from bench.transfer import Layout, RawSide
from services.stack.stack import Stack, StackConfig
from shared import subjects
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.errors import KvstackError
from shared.kvcache.storage import KVStorage
from shared.kvpool.kvstore_client import KvstorePool
from shared.kvpool.pool import KVPool
from shared.messages import Heartbeat
from shared.runtime.bus import Bus
from shared.sampling_params import SamplingParams
from shared.transfer.inbox import KVInbox
from shared.transfer.tcp import TcpKVReceiver, TcpKVSender
from shared.worker.pool import asker_for

# SmolLM2-135M in bfloat16: 30 layers, 3 KV heads of 64, 16-token blocks (368,640 B a block)
LAYOUT = dict(num_layers=30, block_size=16, num_kv_heads=3, head_dim=64)
PUT_BLOCKS = 16  # blocks per put: what one 256-token request writes back
# --handoff-baseline: a decode worker that keeps no prefix takes the pool's, or is sent all
# (report key: its decode worker's flags, its table's title)
HANDOFF_BASELINES = {
    "ttft_decode_from_pool": (("--no-prefix-cache",), "decode keeps no prefix: from the pool"),
    "ttft_decode_sent_whole": (
        ("--no-prefix-cache", "--no-pool-prefix"),
        "decode keeps no prefix: sent whole",
    ),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kvstore", help="KV pool put/get throughput (kvstore, Mooncake Store), TTFT with a hit"
    )
    p.add_argument("--blocks", type=int, default=256, help="blocks per throughput run")
    p.add_argument("--trials", type=int, default=3, help="TTFT trials per case")
    p.add_argument("--skip-ttft", action="store_true")
    p.add_argument(
        "--handoff-baseline",
        action="store_true",
        help="the TTFT cases again with a decode worker that keeps no prefix (--no-prefix-cache):"
        " once taking what the pool holds itself, once sent every prompt's KV whole"
        " (--no-pool-prefix)",
    )
    p.add_argument(
        "--skip-mooncake", action="store_true", help="the kvstore only (no Mooncake Store)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="kvstack-bench-"))
    rows = [row for tier in TIERS for row in measure_tier(work, tier, args.blocks)]
    if not args.skip_mooncake:
        rows += measure_mooncake(work, args.blocks)
    report: dict[str, Any] = {"throughput": rows, "references": references(args.blocks)}
    if not args.skip_ttft:
        report["ttft"] = measure_ttft(work, args.trials)
        report["ttft"]["engine_local_hit"] = _engine_hit(args.trials)
    if not args.skip_ttft and args.handoff_baseline:
        for key, (decode_args, _) in HANDOFF_BASELINES.items():
            report[key] = measure_ttft(work, args.trials, decode_args)
    print(
        orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
        if args.json
        else format_table(report)
    )
    return 0


def progress(message: str) -> None:
    print(f"[bench kvstore] {message}", file=sys.stderr, flush=True)


# -- throughput: a stand-in worker puts blocks into one kvstore and gets them back --------


class PoolClient:
    """A worker's side of the pool without a model: a KV tensor and the data plane."""

    def __init__(
        self,
        bus: Bus,
        num_blocks: int,
        token: str | None,
        seed: int = 0,
        ask: bool = True,
    ) -> None:
        self.storage = KVStorage(
            LAYOUT["num_layers"],
            num_blocks,
            LAYOUT["block_size"],
            LAYOUT["num_kv_heads"],
            LAYOUT["head_dim"],
            torch.bfloat16,
        )
        self.storage.kv.copy_(
            torch.randn(self.storage.kv.shape, generator=torch.Generator().manual_seed(seed))
        )
        self.inbox = KVInbox(self.storage, asyncio.get_running_loop())
        self.receiver = TcpKVReceiver(self.inbox, "127.0.0.1", 0, auth_token=token)
        self.sender = TcpKVSender(auth_token=token)
        data_addr = self.receiver.start()
        asker = asker_for(self.receiver, 10.0) if ask else None
        self.pool: KVPool = KvstorePool(
            bus, self.sender, self.storage, self.inbox, data_addr, asker=asker
        )

    async def join(self, bus: Bus, num_stores: int) -> None:
        async def observe(hb: Heartbeat) -> None:
            self.pool.observe(hb)

        await bus.subscribe(subjects.all_heartbeats(), observe, expected=Heartbeat)
        while self.pool.num_members() < num_stores:
            await asyncio.sleep(0.1)

    async def put(self, name: str, hashes: list[int], block_ids: list[int]) -> None:
        done, loop = asyncio.Event(), asyncio.get_running_loop()

        def sent() -> None:  # from a sender thread
            loop.call_soon_threadsafe(done.set)

        await self.pool.put(name, hashes, block_ids, sent)
        await asyncio.wait_for(done.wait(), 120)

    async def get(self, name: str, hashes: list[int], block_ids: list[int]) -> bool:
        loads = await self.pool.get(name, hashes, block_ids)
        for expected in loads or ():
            await asyncio.wait_for(expected.settled.wait(), 120)
        return loads is not None and all(not e.verdict() for e in loads)

    async def close(self) -> None:
        await self.pool.close()
        self.receiver.stop()
        self.sender.close()


BLOCK_BYTES = 2 * LAYOUT["num_layers"] * LAYOUT["block_size"] * LAYOUT["num_kv_heads"] * 64 * 2
BATCHES = (1, PUT_BLOCKS)  # blocks per call: one block, one 256-token request's


# a kvstore's tiers, each get and put asked on the worker's own connection to the kvstore
# (tcp.asking), over its socket; "bus": DRAM with each get and put asked over the bus
# instead (as under --data-encrypt), the blocks on connections of their senders, through
# the shared-memory ring
TIERS = ("dram", "bus", "ssd")


def measure_tier(work: Path, tier: str, num_blocks: int) -> list[dict]:
    """A fresh store per call size, so that each run's first puts land in memory the store
    never used (its DRAM holds one run's blocks; the SSD tier, when there is one, the rest),
    and its second round of puts in the memory the first one's evicted blocks leave."""
    return [_store_run(work, tier, num_blocks, batch) for batch in BATCHES]


def _store_run(work: Path, tier: str, num_blocks: int, batch: int) -> dict:
    progress(f"kvstore, {tier}: {num_blocks} blocks, {batch} a call")
    gib = num_blocks * BLOCK_BYTES / (1 << 30)  # one round's blocks
    args = (
        ("--dram-gib", str(gib + 0.001))
        if tier != "ssd"
        else (
            "--dram-gib",
            str(gib / 4),
            "--disk-dir",
            str(work / f"ssd-{batch}"),
            "--disk-gib",
            str(2 * gib + 0.01),  # both rounds, and headroom
        )
    )
    stack = Stack(
        StackConfig(
            num_prefill=0,
            num_decode=0,
            num_kvstore=1,
            kvstore_args=args,
            with_conductor=False,
            with_gateway=False,
            log_dir=work / f"{tier}-{batch}",
        )
    )
    stack.start()
    try:
        stack.wait_ready()
        return asyncio.run(_kvstore_run(stack, tier, num_blocks, batch))
    finally:
        stack.stop()


async def _kvstore_run(stack: Stack, tier: str, num_blocks: int, batch: int) -> dict:
    bus = await stack.bus("bench-kvstore")
    client = PoolClient(bus, num_blocks, stack.data_token, ask=tier != "bus")
    await client.join(bus, 1)
    row = await _round_trip(client, f"kvstore {tier}", num_blocks, batch, full_store=True)
    await client.close()
    await bus.drain()
    return row


def measure_mooncake(work: Path, num_blocks: int) -> list[dict]:
    from bench.kvstore_mooncake import mooncake_store

    progress(f"Mooncake Store: {num_blocks} blocks")
    segment = len(BATCHES) * num_blocks * (BLOCK_BYTES + 4096) + (64 << 20)
    with mooncake_store(work / "mooncake", segment) as master:
        return asyncio.run(_mooncake_runs(master, num_blocks))


async def _mooncake_runs(master: str, num_blocks: int) -> list[dict]:
    from bench.kvstore_mooncake import open_pool

    client = PoolClient(None, num_blocks, None)  # type: ignore[arg-type]  # no bus needed
    client.pool = await open_pool(None, client.storage, client.inbox, master)  # type: ignore[arg-type]
    rows = [await _round_trip(client, "mooncake", num_blocks, n) for n in BATCHES]
    await client.close()
    return rows


async def _round_trip(
    client: PoolClient, pool: str, num_blocks: int, batch: int, full_store: bool = False
) -> dict:
    """Put `num_blocks` blocks, `batch` per call, until all are committed; get them back
    the same way, then again (a hot prefix read once more); with `full_store`, put as many
    new blocks into the store they fill, which evicts the first ones to make room. A miss
    first: the worker's connection to the store (and its ring, on one host) is made once,
    at its first call, and is no part of any row."""
    first, again = _hashes(num_blocks, batch, 0), _hashes(num_blocks, batch, 1)
    if await client.get("connect", _hashes(1, batch, 2), [0]):
        raise KvstackError(f"{pool} had a block nobody put")
    put_s = await _put_all(client, pool, first, batch)
    get_s = await _get_all(client, pool, first, batch, "get")
    get_again_s = await _get_all(client, pool, first, batch, "again")
    nbytes = num_blocks * BLOCK_BYTES
    row = {
        "pool": pool,
        "blocks_per_call": batch,
        "blocks": num_blocks,
        "bytes": nbytes,
        "put_gb_s": _gb_s(nbytes, put_s),
        "get_gb_s": _gb_s(nbytes, get_s),
        "get_again_gb_s": _gb_s(nbytes, get_again_s),
    }
    if full_store:
        row["put_full_gb_s"] = _gb_s(nbytes, await _put_all(client, pool, again, batch))
    return row


def _hashes(num_blocks: int, batch: int, round_: int) -> list[int]:
    """New hashes per run and round: a block the pool holds is not sent again."""
    salt = batch * 0x5BD1E995 + round_ * 0x27D4EB2F
    return [(i * 0x9E3779B97F4A7C15 + 12345 + salt) % (1 << 64) for i in range(num_blocks)]


async def _put_all(client: PoolClient, pool: str, hashes: list[int], batch: int) -> float:
    """Seconds until every block is put and committed."""
    ids = list(range(len(hashes)))
    start = time.perf_counter()
    for first in range(0, len(hashes), batch):
        await client.put(
            f"put-{hashes[first]:x}", hashes[first : first + batch], ids[first : first + batch]
        )
    deadline = time.monotonic() + 60
    while await client.pool.longest_prefix(hashes) < len(hashes):  # committed, all of them
        if time.monotonic() > deadline:
            raise KvstackError(f"{pool} did not store every block (too small?)")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


async def _get_all(
    client: PoolClient, pool: str, hashes: list[int], batch: int, name: str
) -> float:
    ids = list(range(len(hashes)))
    start = time.perf_counter()
    for first in range(0, len(hashes), batch):
        request = f"{name}-{batch}-{first}"
        if not await client.get(request, hashes[first : first + batch], ids[first : first + batch]):
            raise KvstackError(f"getting blocks {first}.. from {pool} failed")
    return time.perf_counter() - start


def _gb_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3)


# -- what the same calls cost without a pool: a raw socket, memcpy -----------------------


def references(num_blocks: int) -> list[dict]:
    """Per blocks-per-call: GB/s of a raw loopback socket (one `sendall` per call into a
    child's `recv_into`, each call waiting for the child's word that it has every byte, as
    a pool call waits for its answer) and of memcpy, over the same calls as the pool's."""
    progress("references: a raw loopback socket and memcpy")
    source = np.random.default_rng(0).integers(0, 256, num_blocks * BLOCK_BYTES, np.uint8)
    raw = RawSide(source.nbytes)
    try:
        return [
            {
                "blocks_per_call": batch,
                "socket_gb_s": round(_socket_rate(raw, source, batch), 3),
                "memcpy_gb_s": round(_memcpy_rate(source, batch), 3),
            }
            for batch in BATCHES
        ]
    finally:
        raw.close()


def _socket_rate(raw: RawSide, source: np.ndarray, batch: int) -> float:
    call = Layout(1, 1, batch * BLOCK_BYTES // 2)  # one call's bytes, as one region
    data = source.data.cast("B")
    raw.transfer(call, data)  # warm-up: the connection, page faults
    runs = [_calls(lambda: raw.transfer(call, data), source.nbytes, batch) for _ in range(3)]
    return source.nbytes / statistics.median(runs) / 1e9


def _memcpy_rate(source: np.ndarray, batch: int) -> float:
    n = batch * BLOCK_BYTES
    dest = np.empty_like(source)
    dest[:] = source  # warm-up: page faults

    def copy_all() -> None:
        for at in range(0, source.nbytes, n):
            np.copyto(dest[at : at + n], source[at : at + n])

    runs = [_timed(copy_all) for _ in range(3)]
    return source.nbytes / statistics.median(runs) / 1e9


def _calls(call, total_bytes: int, batch: int) -> float:
    """Seconds for as many calls as move `total_bytes` in `batch` blocks each."""
    return _timed(lambda: [call() for _ in range(total_bytes // (batch * BLOCK_BYTES))])


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


# -- TTFT: the real stack, 2 prefill workers taking turns --------------------------------


CASES = ("cold", "kvstore_hit", "local_hit")


def measure_ttft(work: Path, trials: int, decode_args: tuple[str, ...] = ()) -> dict:
    import openai

    progress(f"TTFT: starting the stack (2 prefill, 1 decode {' '.join(decode_args)}, 1 kvstore)")
    stack = Stack(
        StackConfig(
            num_prefill=2,
            num_kvstore=1,
            port=_free_port(),
            conductor_args=("--policy", "round-robin"),
            worker_args=("--threads", "2"),
            decode_args=decode_args,
            log_dir=work / f"ttft{'-'.join(decode_args)}",
        )
    )
    stack.start()
    try:
        stack.wait_ready()
        client = openai.OpenAI(
            base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0, timeout=300
        )
        _ttft(client, _prompt(10_000, 2048))  # warm-up
        _ttft(client, _prompt(10_001, 2048))  # both workers warm, turn back at 0
        cases: dict[str, list[tuple[float, dict]]] = {c: [] for c in CASES}
        for trial in range(trials):
            progress(f"TTFT trial {trial + 1}/{trials}")
            prefix = _prompt(trial, 1984)
            cases["cold"].append(_ttft(client, prefix + _prompt(100 + trial, 64)))  # worker 0
            time.sleep(1.0)  # write-back to the pool
            cases["kvstore_hit"].append(_ttft(client, prefix + _prompt(200 + trial, 64)))  # 1
            cases["local_hit"].append(_ttft(client, prefix + _prompt(300 + trial, 64)))  # 0
            _ttft(client, _prompt(400 + trial, 64))  # keep the turns aligned
    finally:
        stack.stop()
    result: dict = {case: _ms(t for t, _ in runs) for case, runs in cases.items()}
    result["speedup_kvstore"] = round(result["cold"] / result["kvstore_hit"], 2)
    result["speedup_local"] = round(result["cold"] / result["local_hit"], 2)
    result["parts"] = {case: _parts([timing for _, timing in runs]) for case, runs in cases.items()}
    return result


def _ms(seconds) -> float:
    return round(statistics.median(seconds) * 1000, 1)


# usage.timing's stages of a TTFT, in order (docs/observability.md)
STAGES = (
    "conductor",
    "decode_reserve",
    "prefix_plan",
    "prefill_queue",
    "prefill_compute",
    "kv_transfer",
    "network",
)


def _parts(timings: list[dict]) -> dict:
    """Medians of where the case's TTFT went: each stage, its KV hand-off to decode."""
    return {
        "gateway_ttft_ms": _ms(t["ttft"] for t in timings),  # the client's less HTTP and SSE
        "prefill_compute_ms": _ms(t["prefill_compute"] for t in timings),
        "stages_ms": {stage: _ms(t.get(stage, 0.0) for t in timings) for stage in STAGES},
        "handoff_mb": round(statistics.median(t["kv_handoff"]["bytes"] for t in timings) / 1e6, 1),
        "held_by_decode": statistics.median(t["kv_handoff"]["held_by_decode"] for t in timings),
    }


def _engine_hit(trials: int) -> float:
    """Median ms of the local hit's prefill in a bare engine in this process: the 64 new
    tokens' compute over the 1,984 cached, what a hit cannot go below."""
    progress("TTFT: the bare engine's compute of the local hit (no service around it)")
    engine = LLMEngine(EngineConfig(num_threads=2))
    params = SamplingParams(max_tokens=1, temperature=0)

    def prefill(request_id: str, prompt: list[int]) -> float:
        start = time.perf_counter()
        engine.add_request(request_id, prompt, params)
        while not any(out.finished for out in engine.step()):
            pass
        return time.perf_counter() - start

    prefix = _prompt(0, 1984)
    prefill("cold", prefix + _prompt(100, 64))
    return _ms(prefill(f"hit-{i}", prefix + _prompt(300 + i, 64)) for i in range(max(3, trials)))


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(
        100, 40000, (length,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def _ttft(client, prompt: list[int]) -> tuple[float, dict]:
    """Its TTFT in seconds and its `usage.timing`."""
    start = time.perf_counter()
    stream = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=prompt,
        max_tokens=2,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    first: float | None = None
    timing: dict = {}
    for chunk in stream:
        if first is None and chunk.choices:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            timing = chunk.usage.model_dump().get("timing") or {}
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first, timing


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def format_table(report: dict) -> str:
    refs = {r["blocks_per_call"]: r for r in report["references"]}
    lines = [
        (
            "KV pool throughput (one store process, one client, one host; SmolLM2 bf16 "
            "blocks of 368,640 B), GB/s; x: of the raw socket's rate in the same calls"
        ),
        (
            "put: into memory the store never used; full: new blocks into a store they"
            " fill (evicting); get: each block read once; again: a second time"
        ),
        f"{'pool':14}{'blocks/call':>12}"
        + "".join(f"{name:>9}{'x':>6}" for name in ("put", "full", "get", "again")),
    ]
    for row in report["throughput"]:
        socket_rate = refs[row["blocks_per_call"]]["socket_gb_s"]
        cells = [row.get(k) for k in ("put_gb_s", "put_full_gb_s", "get_gb_s", "get_again_gb_s")]
        lines.append(
            f"{row['pool']:14}{row['blocks_per_call']:>12}"
            + "".join(
                f"{'-':>9}{'':>6}" if rate is None else f"{rate:>9}{rate / socket_rate:>6.2f}"
                for rate in cells
            )
        )
    for batch, ref in refs.items():
        lines.append(
            f"{'raw socket':14}{batch:>12}{ref['socket_gb_s']:>9}"
            f"   (memcpy {ref['memcpy_gb_s']} GB/s)"
        )
    titles = {"ttft": "", **{key: f", {title}" for key, (_, title) in HANDOFF_BASELINES.items()}}
    for key, title in titles.items():
        if key in report:
            lines += _ttft_lines(report[key], title)
    return "\n".join(lines)


def _ttft_lines(t: dict, title: str) -> list[str]:
    lines = [
        "",
        f"TTFT of a 2,048-token prompt (median ms{title})",
        (
            f"cold {t['cold']}   1,984 tokens in the kvstore {t['kvstore_hit']} "
            f"({t['speedup_kvstore']}x)   in the local cache {t['local_hit']} "
            f"({t['speedup_local']}x)"
        ),
    ]
    if "engine_local_hit" in t:
        floor = t["engine_local_hit"]
        lines.append(f"the bare engine's compute of the local hit (its floor): {floor}")
    lines.append(
        f"{'case':14}{'gateway TTFT ms':>17}{'prefill_compute ms':>20}"
        f"{'KV to decode MB':>17}{'held by decode':>16}"
    )
    for case, parts in t["parts"].items():
        lines.append(
            f"{case:14}{parts['gateway_ttft_ms']:>17}{parts['prefill_compute_ms']:>20}"
            f"{parts['handoff_mb']:>17}{parts['held_by_decode']:>16}"
        )
    lines.append("usage.timing's stages, median ms: " + " ".join(STAGES))
    for case, parts in t["parts"].items():
        stages = parts.get("stages_ms", {})
        lines.append(f"{case:14}" + "".join(f"{stages.get(s, '-'):>9}" for s in STAGES))
    return lines
