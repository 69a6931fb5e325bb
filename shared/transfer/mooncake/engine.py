"""One Mooncake Transfer Engine: start it, register memory with it, write into a peer's memory.

Facts about `mooncake.engine.TransferEngine` (wheel 0.3.13) this module relies on:
- `initialize(hostname, "P2PHANDSHAKE", protocol, device)` needs no metadata server: the
  engine listens on a random RPC port (`get_rpc_port()`) and a peer names it by the session
  "hostname:rpc_port", which is what `target_hostname` must be in every transfer call.
- A peer may write only into memory registered with `register_memory(address, nbytes)`; the
  engine refuses a write that is not inside one registered region, and refuses to register a
  region that overlaps one already registered.
- `transfer_submit_write` starts one write and returns its batch id ((uint64)-1 when it
  could not start); `transfer_check_status(id)` answers at once: 1 done, 0 running, -1 failed
  (both free the batch: asking again crashes), -2 timed out. The batch calls' only wait,
  `get_batch_transfer_status`, spins a core until done; on 2 CPUs that halved throughput
  (1.3 vs 2.1 GB/s for 384 KiB writes, 64 MiB at a time), so writes are polled instead.
- Nothing tells the receiving side that bytes arrived (notifies exist but must be polled), so
  kvstack says so itself over its control channel.
- Destroying an engine can block forever (its destructor joins a handshake thread that sits in
  `accept`), and it runs wherever the last reference drops, holding the GIL: seen here when a
  garbage collection freed an engine inside another thread. So no engine is ever destroyed.
"""

from __future__ import annotations

import bisect
import importlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from shared.transfer.mooncake.memory import Copy, Region, allocation_of, region_of

log = logging.getLogger(__name__)

P2P_HANDSHAKE = "P2PHANDSHAKE"
# NOTE: the engine logs at INFO on every batch (through glog, straight to stderr); it reads
# this variable when an engine starts, so a caller's own setting wins.
os.environ.setdefault("MC_LOG_LEVEL", "ERROR")

POLL_S = 100e-6  # between status checks of writes in flight
WRITE_TIMEOUT_S = 30.0  # plus a second per GB, as the engine's own synchronous calls allow
Wait = Callable[[], bool]  # blocks until a write is done; whether every byte landed
_ENGINES: list[object] = []  # every TransferEngine made, kept alive for the process's lifetime


class EngineError(ConnectionError):
    """The Transfer Engine could not start or register memory."""


def available() -> bool:
    """Whether the Transfer Engine can be loaded here (the wheel and its RDMA libraries)."""
    try:
        importlib.import_module("mooncake.engine")
    except (ImportError, OSError):
        return False
    return True


def _valid_batch(batch_id: int) -> bool:
    return 0 < batch_id < 1 << 63  # failures come back as 0, -1 or (uint64)-1


class Engine:
    """A started TransferEngine and the regions registered with it."""

    def __init__(self, hostname: str, protocol: str = "tcp", device_name: str = "") -> None:
        from mooncake.engine import TransferEngine

        self._engine = TransferEngine()
        _ENGINES.append(self._engine)  # NOTE: even one that fails to start
        if self._engine.initialize(hostname, P2P_HANDSHAKE, protocol, device_name) != 0:
            raise EngineError(
                f"cannot start the Mooncake Transfer Engine ({protocol}) on {hostname}"
            )
        self.protocol = protocol
        self.session = f"{hostname}:{self._engine.get_rpc_port()}"
        self._starts: list[int] = []  # registered regions, sorted by start
        self._ends: list[int] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        """Unregister everything, so that no peer can write into this memory any more (and a
        later allocation there can be registered); the engine itself stays alive."""
        with self._lock:
            for start in self._starts:
                self._engine.unregister_memory(start)
            self._starts, self._ends = [], []

    # --- memory ---------------------------------------------------------------------------

    def register(self, views: Sequence[memoryview]) -> None:
        """Register the allocations behind `views` now (EngineError when the engine refuses)."""
        for view in views:
            if view.nbytes and not self.ensure_registered(view):
                raise EngineError(f"the transfer engine refused to register {view.nbytes} bytes")

    def ensure_registered(self, view: memoryview) -> bool:
        """Whether `view` lies in registered memory, registering its whole allocation if not."""
        with self._lock:
            return self._covers(region_of(view)) or self._add(allocation_of(view))

    def _covers(self, region: Region) -> bool:
        i = bisect.bisect_right(self._starts, region[0]) - 1
        return i >= 0 and region[1] <= self._ends[i]

    def _add(self, region: Region) -> bool:
        start, end = region
        if self._engine.register_memory(start, end - start) != 0:
            log.warning("transfer engine refused to register [%#x, %#x)", start, end)
            return False
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)
        return True

    # --- writes ---------------------------------------------------------------------------

    def start_writes(self, session: str, copies: Sequence[Copy]) -> Wait:
        """Start writing `copies` into the peer `session`; call the result exactly once."""
        batch_ids = [
            self._engine.transfer_submit_write(session, c.source, c.target, c.nbytes)
            for c in copies
        ]
        deadline = time.monotonic() + WRITE_TIMEOUT_S + sum(c.nbytes for c in copies) / 1e9
        return lambda: self._wait(batch_ids, deadline)

    def _wait(self, batch_ids: list[int], deadline: float) -> bool:
        """Poll the writes in the order they were started (the engine finishes them in about
        that order, so each round checks little more than what completed)."""
        running = deque(b for b in batch_ids if _valid_batch(b))
        ok = len(running) == len(batch_ids)
        while running:
            while running and (status := self._engine.transfer_check_status(running[0])) != 0:
                ok = ok and status == 1
                running.popleft()
            if running and time.monotonic() > deadline:
                return False  # NOTE: the engine keeps what is left; it is not freed
            if running:
                time.sleep(POLL_S)
        return ok
