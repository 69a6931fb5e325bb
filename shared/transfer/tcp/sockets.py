"""Socket plumbing: tuning, scatter/gather sends and receives, and liveness checks."""
from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Sequence
from itertools import islice

import xxhash

RECV_CHUNK = 256 << 10  # bytes per recvmsg_into, hashed right after they land
SOCKET_BUFFER_BYTES = 4 << 20
IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))  # buffers per sendmsg/recvmsg

Landing = tuple[memoryview, xxhash.xxh3_64 | None]  # where bytes go, what hashes them


def tune(sock: socket.socket, buffer_bytes: int | None) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)


def send_all(sock: socket.socket, buffers: Sequence[memoryview]) -> None:
    """`sendmsg` until every byte has gone (it may send only part of the scatter list)."""
    pending = deque(b for b in buffers if b.nbytes)
    while pending:
        sent = sock.sendmsg(list(islice(pending, IOV_MAX)))
        while sent:
            first = pending[0]
            if sent < first.nbytes:
                pending[0] = first[sent:]
                break
            sent -= first.nbytes
            pending.popleft()


def recv_exact(sock: socket.socket, nbytes: int, eof_ok: bool = False) -> bytes | None:
    """`nbytes` bytes, or None when the peer closed cleanly before the first (if `eof_ok`)."""
    buf = bytearray(nbytes)
    view, got = memoryview(buf), 0
    while got < nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and eof_ok:
                return None
            raise ConnectionError("connection closed mid-frame")
        got += n
    return bytes(buf)


def first_bytes(pending: deque[Landing], limit: int) -> list[memoryview]:
    """Views of the first `limit` bytes of `pending` (at most IOV_MAX of them)."""
    views, total = [], 0
    for view, _ in islice(pending, IOV_MAX):
        views.append(view[:limit - total])
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


def peer_closed(sock: socket.socket) -> bool:
    """Whether the receiver has closed an idle connection: it never sends after the
    handshake, so anything readable (an EOF, a reset, stray bytes) means it is gone."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


def split_peer(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    return host.strip("[]"), int(port)
