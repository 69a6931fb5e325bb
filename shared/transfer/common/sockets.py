"""Socket helpers both transports use: tuning, exact reads, liveness, peer addresses."""

from __future__ import annotations

import socket
import time
from typing import Literal, overload


def tune(sock: socket.socket, buffer_bytes: int | None) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)


@overload
def recv_exact(
    sock: socket.socket, nbytes: int, eof_ok: Literal[False] = False, deadline: float | None = None
) -> bytes: ...


@overload
def recv_exact(
    sock: socket.socket, nbytes: int, eof_ok: bool, deadline: float | None = None
) -> bytes | None: ...


def recv_exact(
    sock: socket.socket, nbytes: int, eof_ok: bool = False, deadline: float | None = None
) -> bytes | None:
    """`nbytes` bytes, or None when the peer closed cleanly before the first (if `eof_ok`).
    With a `deadline` (time.monotonic()), TimeoutError once it passes, however the bytes
    trickle in; without one, the socket's timeout bounds each read."""
    buf = bytearray(nbytes)
    view, got = memoryview(buf), 0
    while got < nbytes:
        if deadline is not None:
            sock.settimeout(seconds_left(deadline))
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and eof_ok:
                return None
            raise ConnectionError("connection closed mid-frame")
        got += n
    return bytes(buf)


def seconds_left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def deadline_of(sock: socket.socket) -> float | None:
    """The socket's timeout from now on as a deadline (None for a blocking socket)."""
    timeout = sock.gettimeout()
    return None if timeout is None else time.monotonic() + timeout


def peer_closed(sock: socket.socket) -> bool:
    """Whether the receiver has closed an idle connection: it never sends between frames,
    so anything readable (an EOF, a reset, stray bytes) means it is gone."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # NOTE: with a timeout set, recv would wait for it first
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError:
        pass
    finally:
        sock.settimeout(timeout)
    return True


def shut_down(sock: socket.socket | None) -> None:
    """Wake whatever thread blocks on `sock` (its owner closes it)."""
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def split_peer(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    return host.strip("[]"), int(port)
