"""Scatter/gather I/O: sends and receives of many buffers per system call, the receive
hashing each piece as soon as it has landed."""

from __future__ import annotations

import os
import socket
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from itertools import accumulate, islice
from operator import attrgetter

import xxhash

RECV_CHUNK = 256 << 10  # bytes per recvmsg_into, hashed right after they land
SOCKET_BUFFER_BYTES = 4 << 20
IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))  # buffers per sendmsg/recvmsg

_NBYTES = attrgetter("nbytes")
Landing = tuple[memoryview, xxhash.xxh3_64 | None]  # where bytes go, what hashes them


def send_all(sock: socket.socket, buffers: Sequence[memoryview]) -> None:
    """`sendmsg` until every byte has gone (it may send only part of the scatter list)."""
    pending = [b for b in buffers if b.nbytes]
    while pending:
        batch = pending[:IOV_MAX]
        sent = sock.sendmsg(batch)
        # NOTE: what went is found by C loops: a kvstore get of 16 blocks has 960 pieces
        ends = [0, *accumulate(map(_NBYTES, batch))]
        whole = bisect_right(ends, sent) - 1  # pieces that went whole
        pending = pending[whole:]
        if sent > ends[whole]:  # the next one went in part
            pending[0] = pending[0][sent - ends[whole] :]


def first_bytes(pending: deque[Landing], limit: int) -> list[memoryview]:
    """Views of the first `limit` bytes of `pending` (at most IOV_MAX of them)."""
    views, total = [], 0
    for view, _ in islice(pending, IOV_MAX):
        views.append(view[: limit - total])
        total += views[-1].nbytes
        if total >= limit:
            break
    return views


def recv_hashed(sock: socket.socket, landings: Sequence[Landing]) -> None:
    """Fill every view, feeding each piece to its hasher as soon as it has landed."""
    pending = deque(landing for landing in landings if landing[0].nbytes)
    while pending:
        received = sock.recvmsg_into(first_bytes(pending, RECV_CHUNK))[0]
        if received == 0:
            raise ConnectionError("connection closed mid-frame")
        while received:
            view, hasher = pending[0]
            if hasher is not None:
                hasher.update(view[:received])
            if received < view.nbytes:
                pending[0] = (view[received:], hasher)
                break
            received -= view.nbytes
            pending.popleft()
