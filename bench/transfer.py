"""`python -m bench transfer`: KV data-plane throughput beside a raw-socket ceiling.

Both sides move the same bytes from this process to a child process over loopback TCP
into a preallocated tensor, one transfer at a time, timed until the child has them all:
- kvstack: TcpKVSender -> TcpKVReceiver, one frame per layer, one span per block,
  checksums computed and verified; the child is on this host, so the payload goes through
  the shared-memory ring (`shared.transfer.tcp.ring`), as it does between workers here;
- socket: the same with the ring off (`--no-shared-memory`): every byte over the socket;
- encrypted (with `--encrypt`): the same under `--data-encrypt` (AES-256-GCM), beside it;
- raw: one `socket.sendall` of the whole region into `recv_into` of the buffer;
- memcpy: the same bytes copied once within this process (the ring's ceiling);
- mooncake (when `mooncake.engine` imports): MooncakeKVSender -> MooncakeKVReceiver, the same
  frames written by the Transfer Engine (`tcp` protocol) into the child's registered tensor,
  checksums computed and verified.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import multiprocessing.connection
import os
import secrets
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import torch

from shared.transfer import mooncake
from shared.transfer.base import BlockSpan
from shared.transfer.tcp import SOCKET_BUFFER_BYTES, TcpKVReceiver, TcpKVSender, tune
from shared.transfer.tensor_bytes import tensor_bytes

MAX_LAYERS = 32
TOKENS_PER_BLOCK = 16  # nominal; the data plane only moves bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("transfer", help="KV data-plane GB/s vs a raw TCP socket")
    p.add_argument("--sizes", default="1,4,16,64,256", help="MiB per transfer, comma-separated")
    p.add_argument("--block-kib", type=int, default=768, help="K+V bytes of one block of a layer")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--auth-token", default=None)
    p.add_argument(
        "--encrypt",
        action="store_true",
        help="also time the data plane with --data-encrypt (AES-256-GCM), beside the plain one",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


@dataclass(frozen=True, slots=True)
class Layout:
    """A transfer as KV of shape [layers, 2 (k/v), blocks, half_bytes]; a frame per layer."""

    layers: int
    blocks: int
    half_bytes: int

    @classmethod
    def of(cls, size_mib: float, block_kib: int) -> Layout:
        block_bytes = block_kib * 1024
        num_blocks = max(1, round(size_mib * 2**20 / block_bytes))
        layers = max(d for d in range(1, MAX_LAYERS + 1) if num_blocks % d == 0)
        return cls(layers, num_blocks // layers, block_bytes // 2)

    @property
    def nbytes(self) -> int:
        return self.layers * 2 * self.blocks * self.half_bytes

    def k_offset(self, layer: int, block: int) -> int:
        return ((layer * 2) * self.blocks + block) * self.half_bytes

    def v_offset(self, layer: int, block: int) -> int:
        return ((layer * 2 + 1) * self.blocks + block) * self.half_bytes


def run(args: argparse.Namespace) -> int:
    layouts = [Layout.of(float(s), args.block_kib) for s in args.sizes.split(",")]
    capacity = max(layout.nbytes for layout in layouts)
    source = tensor_bytes(torch.randint(0, 256, (capacity,), dtype=torch.uint8))
    sides: dict[str, KvstackSide | RawSide | CopySide] = {
        "kvstack": KvstackSide(capacity, args.auth_token),
        "socket": KvstackSide(capacity, args.auth_token, shared_memory=False),
        "raw": RawSide(capacity),
        "memcpy": CopySide(capacity),
    }
    if args.encrypt:  # encryption is keyed by the token: a made-up one when none is given
        token = args.auth_token or secrets.token_urlsafe(32)
        sides["encrypted"] = KvstackSide(capacity, token, encrypt=True)
    if mooncake.available():
        sides["mooncake"] = KvstackSide(capacity, args.auth_token, transport="mooncake")
    try:
        rows = [measure(layout, source, sides, args.repeats) for layout in layouts]
    finally:
        for side in sides.values():
            side.close()
    report = {
        "block_kib": args.block_kib,
        "auth": args.auth_token is not None,
        "encrypt": args.encrypt,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    print(
        orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
        if args.json
        else format_table(report)
    )
    return 0


def measure(
    layout: Layout,
    source: memoryview,
    sides: dict[str, KvstackSide | RawSide | CopySide],
    repeats: int,
) -> dict:
    progress(f"{layout.nbytes / 2**20:.1f} MiB: {layout.layers} frames x {layout.blocks} blocks")
    times: dict[str, list[float]] = {name: [] for name in sides}
    for side in sides.values():
        side.transfer(layout, source)  # warm-up: connection, page faults
    for _ in range(repeats):
        for name, side in sides.items():  # interleaved, so drift hits both alike
            times[name].append(side.transfer(layout, source))
    rate = {name: layout.nbytes / statistics.median(t) / 1e9 for name, t in times.items()}
    row = {
        "mib": round(layout.nbytes / 2**20, 2),
        "frames": layout.layers,
        "spans_per_frame": layout.blocks,
        "kvstack_gb_s": round(rate["kvstack"], 3),
        "memcpy_gb_s": round(rate["memcpy"], 3),
        "of_memcpy": round(rate["kvstack"] / rate["memcpy"], 3),
        "socket_gb_s": round(rate["socket"], 3),
        "raw_gb_s": round(rate["raw"], 3),
        "ratio": round(rate["socket"] / rate["raw"], 3),
    }
    if "encrypted" in rate:
        row |= {
            "encrypted_gb_s": round(rate["encrypted"], 3),
            "encrypted_ratio": round(rate["encrypted"] / rate["socket"], 3),
        }
    if "mooncake" in rate:
        row |= {
            "mooncake_gb_s": round(rate["mooncake"], 3),
            "mooncake_ratio": round(rate["mooncake"] / rate["raw"], 3),
        }
    return row


def progress(message: str) -> None:
    print(f"[bench transfer] {message}", file=sys.stderr, flush=True)


def format_table(report: dict) -> str:
    moon = bool(report["rows"]) and "mooncake_gb_s" in report["rows"][0]
    sealed = report["encrypt"]
    lines = [
        (
            f"loopback TCP to a child process, {report['cpus']} CPUs; block {report['block_kib']}"
            f" KiB (K+V of a layer); auth {'on' if report['auth'] else 'off'}; median of "
            f"{report['repeats']}"
            + ("; encrypted: AES-256-GCM, authenticated, vs the socket's" if sealed else "")
            + "; kvstack: through the shared-memory ring, x of memcpy; socket: kvstack over"
            " the socket, ratio to raw"
        ),
        f"{'MiB':>8}{'frames':>8}{'spans/fr':>10}{'kvstack GB/s':>14}{'memcpy':>8}{'x':>6}"
        f"{'socket GB/s':>13}"
        + (f"{'encrypted GB/s':>16}{'vs plain':>10}" if sealed else "")
        + f"{'raw GB/s':>10}{'ratio':>7}"
        + (f"{'mooncake GB/s':>15}{'ratio':>7}" if moon else ""),
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['mib']:>8}{r['frames']:>8}{r['spans_per_frame']:>10}{r['kvstack_gb_s']:>14}"
            f"{r['memcpy_gb_s']:>8}{r['of_memcpy']:>6}{r['socket_gb_s']:>13}"
            + (f"{r['encrypted_gb_s']:>16}{r['encrypted_ratio']:>10}" if sealed else "")
            + f"{r['raw_gb_s']:>10}{r['ratio']:>7}"
            + (f"{r['mooncake_gb_s']:>15}{r['mooncake_ratio']:>7}" if moon else "")
        )
    return "\n".join(lines)


# --- the sending side (this process) --------------------------------------------------------


class _Child:
    """A receiving child process and its two one-way pipes (commands in, events out)."""

    def __init__(self, target, *args: object) -> None:
        ctx = mp.get_context("spawn")
        self.events, events_w = ctx.Pipe(duplex=False)
        cmds_r, self.cmds = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=target, args=(cmds_r, events_w, *args), daemon=True)
        self.process.start()
        self.address = self.expect("address")

    def expect(self, kind: str) -> Any:  # what the child sent: its pipe carries any object
        ready = mp.connection.wait([self.events, self.process.sentinel], timeout=120)
        if self.events not in ready:
            state = "timed out" if self.process.is_alive() else "exited"
            raise RuntimeError(f"receiver child {state} before sending {kind!r}")
        got_kind, value = self.events.recv()
        if got_kind != kind:
            raise RuntimeError(f"receiver child sent {got_kind!r} ({value}), expected {kind!r}")
        return value

    def close(self) -> None:
        self.cmds.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


class KvstackSide:
    def __init__(
        self,
        capacity: int,
        auth_token: str | None,
        transport: str = "tcp",
        encrypt: bool = False,
        shared_memory: bool = True,
    ) -> None:
        self.child = _Child(serve_kvstack, capacity, auth_token, transport, encrypt)
        self.sender = (
            mooncake.MooncakeKVSender(auth_token=auth_token)
            if transport == "mooncake"
            else TcpKVSender(auth_token=auth_token, encrypt=encrypt, shared_memory=shared_memory)
        )
        self.count = 0

    def transfer(self, layout: Layout, source: memoryview) -> float:
        self.count += 1
        rid = f"bench-{self.count}"
        self.child.cmds.send(layout)
        self.child.expect("ready")
        done = []
        start = time.perf_counter()
        for layer in range(layout.layers):
            self.sender.send(self.child.address, rid, layer, frame(layout, source, layer))
        self.sender.finish(self.child.address, rid, lambda *result: done.append(result))
        num_frames, rejected = self.child.expect("end")
        elapsed = time.perf_counter() - start
        if rejected or num_frames != layout.layers:
            raise RuntimeError(f"{rid}: {num_frames} frames, {rejected} rejected")
        return elapsed

    def close(self) -> None:
        self.sender.close()
        self.child.close()


def frame(layout: Layout, source: memoryview, layer: int) -> list:
    half = layout.half_bytes
    return [
        (
            BlockSpan(b, 0, TOKENS_PER_BLOCK),
            source[layout.k_offset(layer, b) : layout.k_offset(layer, b) + half],
            source[layout.v_offset(layer, b) : layout.v_offset(layer, b) + half],
        )
        for b in range(layout.blocks)
    ]


class CopySide:
    """memcpy of a transfer's bytes into a buffer of this process: no peer at all."""

    def __init__(self, capacity: int) -> None:
        self.buffer = torch.zeros(capacity, dtype=torch.uint8)
        self.buffer.fill_(1)  # its pages mapped before any timing

    def transfer(self, layout: Layout, source: memoryview) -> float:
        into = np.frombuffer(tensor_bytes(self.buffer)[: layout.nbytes], np.uint8)
        start = time.perf_counter()
        np.copyto(into, np.frombuffer(source[: layout.nbytes], np.uint8))
        return time.perf_counter() - start

    def close(self) -> None:
        pass


class RawSide:
    def __init__(self, capacity: int) -> None:
        self.child = _Child(serve_raw, capacity)
        self.sock = socket.create_connection(self.child.address)
        tune(self.sock, SOCKET_BUFFER_BYTES)

    def transfer(self, layout: Layout, source: memoryview) -> float:
        self.child.cmds.send(layout.nbytes)
        self.child.expect("ready")
        start = time.perf_counter()
        self.sock.sendall(source[: layout.nbytes])
        self.child.expect("done")
        return time.perf_counter() - start

    def close(self) -> None:
        self.sock.close()
        self.child.close()


# --- the receiving side (child processes) ---------------------------------------------------


class _BenchSink:
    """Writes every span into one preallocated tensor laid out as the current `Layout`."""

    def __init__(self, destination: memoryview, events) -> None:
        self.buffer = destination
        self.events = events
        self.layout: Layout | None = None
        self.rejected = 0

    def destination(self, request_id, layer, span, nbytes):
        k = self.layout.k_offset(layer, span.block_id)
        v = self.layout.v_offset(layer, span.block_id)
        return self.buffer[k : k + nbytes], self.buffer[v : v + nbytes]

    def on_frame(self, request_id, layer, spans, ok, error) -> None:
        self.rejected += not ok

    def on_end(self, request_id, num_frames) -> None:
        self.events.send(("end", (num_frames, self.rejected)))
        self.rejected = 0

    def on_lost(self, request_ids, error) -> None:
        self.events.send(("lost", error))


def serve_kvstack(
    cmds, events, capacity: int, auth_token: str | None, transport: str, encrypt: bool
) -> None:
    torch.set_num_threads(1)
    sink = _BenchSink(tensor_bytes(torch.zeros(capacity, dtype=torch.uint8)), events)
    receiver = (
        mooncake.MooncakeKVReceiver(
            sink, host="127.0.0.1", auth_token=auth_token, memory=[sink.buffer]
        )
        if transport == "mooncake"
        else TcpKVReceiver(sink, host="127.0.0.1", auth_token=auth_token, encrypt=encrypt)
    )
    host, port = receiver.start().rsplit(":", 1)
    events.send(("address", f"{host}:{port}"))
    while (layout := cmds.recv()) is not None:
        sink.layout = layout
        events.send(("ready", None))
    receiver.stop()


def serve_raw(cmds, events, capacity: int) -> None:
    torch.set_num_threads(1)
    buffer = tensor_bytes(torch.zeros(capacity, dtype=torch.uint8))
    listener = socket.create_server(("127.0.0.1", 0))
    events.send(("address", listener.getsockname()[:2]))
    sock, _ = listener.accept()
    tune(sock, SOCKET_BUFFER_BYTES)
    while (nbytes := cmds.recv()) is not None:
        events.send(("ready", None))
        received = 0
        while received < nbytes:
            n = sock.recv_into(buffer[received:nbytes])
            if n == 0:
                raise ConnectionError("sender closed mid-transfer")
            received += n
        events.send(("done", None))
    sock.close()
