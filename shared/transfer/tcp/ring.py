"""Same host: a connection's KV payload through a ring in shared memory, not the socket.

Right after the handshake a sender offers a ring (one RING message: a file it made in
/dev/shm, a random cookie written at its start, its size). A receiver that can open that
file (same host, same /dev/shm, same user: containers apart have their own) and finds the
cookie in it answers yes, and the sender unlinks the file either way: the two mappings are
all that is left of it, and it vanishes with the later of the two processes. From then on
each KV part's header and span table still go over the socket, followed by the part's
position in the ring (or NOT_IN_RING, for a part larger than half the ring); its payload
is copied into the ring. The receiver copies each span out into the memory its sink names,
hashing it there, and answers with the position it has consumed up to, which is all the
sender waits for when the ring is full. So every promise of the socket path stays: the
checksums of the span table are checked on what landed, sizes and refusals as before, and
only an authenticated sender (the handshake came first) can offer a ring.

Under --data-encrypt no ring is offered: KV bytes go sealed over the socket, as before.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import socket
import stat
import struct
from collections.abc import Sequence

import numpy as np
import xxhash

from shared.transfer.common.frames import Pieces
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp.wire import Part, encode_part

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
RING_BYTES = 32 << 20  # a connection's ring; a part of more than half of it uses the socket
# NOTE: an asking connection's answers are parts of at most a megabyte, and a worker keeps
# up to a few such connections to each kvstore
ANSWER_RING_BYTES = 8 << 20
PREAMBLE = 64  # the cookie, before the ring's bytes
OFFER = struct.Struct("<48s16sQ")  # file name's own part (NUL-padded), cookie, ring bytes
POSITION = struct.Struct("<Q")  # a part's start in the ring; the receiver's consumed-up-to
NOT_IN_RING = (1 << 64) - 1  # the part's payload follows on the socket
YES, NO = b"\x01", b"\x00"
GIL_FREE_BYTES = 128 << 10  # copies this big or bigger let go of the GIL
# NOTE: the pages mapped at once, not faulted in one by one by the first pass of copies
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
PREFIX = "kvstack-ring-"
_NAME = re.compile(rb"([0-9]{1,10})-[0-9a-f]{32}")  # the creator's pid, then random


def _path(name: bytes) -> str:
    return os.path.join(SHM_DIR, PREFIX + name.decode())


def _new_name() -> bytes:
    return f"{os.getpid()}-{secrets.token_hex(16)}".encode()


def sweep() -> None:
    """Remove ring files whose creator is gone. A file lives one round trip (it is unlinked
    once the offer is answered) unless its sender died in between, as under SIGKILL; a
    file taken for another namespace's (its pid unknown here) only turns that one offer
    down, and its payload goes over the socket."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        match = _NAME.fullmatch(name[len(PREFIX) :].encode())
        if match is not None and not _alive(int(match[1])):
            _unlink(os.path.join(SHM_DIR, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive, and not ours to remove anyway
        return True
    return True


def copy_into(dst: memoryview, src: memoryview) -> None:
    """memcpy of equal-sized flat byte views. A big one through numpy, which lets go of the
    GIL meanwhile (so the process's event loop runs, as it does while a socket's kernel
    copy runs); a small one by assignment, at a tenth of numpy's cost a call (a kvstore
    block's layer is a piece of a few KB)."""
    if dst.nbytes < GIL_FREE_BYTES:
        dst[:] = src
    else:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))


class RingWriter:
    """The sender's side: where the next part goes, and how far the receiver has read."""

    def __init__(self, ring: mmap.mmap, size: int) -> None:
        self.mapping = ring
        self.data = memoryview(ring)[PREAMBLE:]
        self.size = size
        self.head = 0  # bytes placed so far (positions only grow)
        self.tail = 0  # bytes the receiver has consumed
        self.pending = b""  # a consumed-up-to answer that arrived in part

    def place(
        self, sock: socket.socket, spans: Sequence[tuple[object, Pieces, Pieces]], nbytes: int
    ) -> tuple[int, list[int] | None]:
        """Copy the spans' K and V pieces (`nbytes` in all) into the ring once the receiver
        has made room, hashing each piece's copy while it is in cache: (the part's
        position, each span's checksum); (NOT_IN_RING, None) for a part too big for the
        ring, which then goes over the socket."""
        if nbytes > self.size // 2:
            return NOT_IN_RING, None
        start = self.room(sock, nbytes)
        offset, digests = start % self.size, []
        for _, k, v in spans:
            hasher = xxhash.xxh3_64()
            for piece in (*k, *v):
                copy = self.data[offset : offset + piece.nbytes]
                copy_into(copy, piece)
                hasher.update(copy)
                offset += piece.nbytes
            digests.append(hasher.intdigest())
        self.head = start + nbytes
        return start, digests

    def room(self, sock: socket.socket, nbytes: int) -> int:
        """Where `nbytes` (at most half the ring) go next, in one piece, once the receiver
        has read far enough to make room for them; the caller fills them and moves `head`
        past them."""
        offset = self.head % self.size
        start = self.head if offset + nbytes <= self.size else self.head + self.size - offset
        while start + nbytes - self.tail > self.size:
            self._consumed(recv_exact(sock, POSITION.size - len(self.pending)))
        return start

    def settle(self, sock: socket.socket) -> None:
        """Wait until the receiver has read every part placed (before the connection carries
        anything else the other way: its answers then stop)."""
        while self.tail < self.head:
            self._consumed(recv_exact(sock, POSITION.size - len(self.pending)))

    def drained(self, sock: socket.socket) -> bool:
        """Take the receiver's answers that have arrived, without waiting; False when the
        receiver has closed the connection (anything else it sends is an answer)."""
        while True:
            try:
                got = sock.recv(64 << 10, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not got:
                return False
            self._consumed(got)

    def _consumed(self, answer: bytes) -> None:
        answer, self.pending = self.pending + answer, b""
        whole = len(answer) - len(answer) % POSITION.size
        self.pending = answer[whole:]
        for (position,) in POSITION.iter_unpack(answer[:whole]):
            if not self.tail <= position <= self.head:
                raise ConnectionError(f"the receiver says it read the ring up to {position}")
            self.tail = position

    def close(self) -> None:
        _unmap(self.mapping, self.data)


class RingReader:
    """The receiver's side: where each part's payload is, checked, and the answers."""

    def __init__(self, ring: mmap.mmap, size: int) -> None:
        self.mapping = ring
        self.data = memoryview(ring)[PREAMBLE:]
        self.size = size
        self.next = 0  # a part starts here or later

    def check(self, start: int, nbytes: int) -> int:
        """The offset of a part at `start`; ProtocolError-worthy (ValueError) when it lies
        outside the ring or before what was read already."""
        offset = start % self.size
        if start < self.next or offset + nbytes > self.size:
            raise ValueError(f"a part of {nbytes} bytes at ring position {start}")
        return offset

    def land(
        self, offset: int, landings: Sequence[tuple[memoryview, xxhash.xxh3_64 | None]]
    ) -> None:
        """Copy the part out into its landings, hashing each where it landed."""
        for view, hasher in landings:
            copy_into(view, self.data[offset : offset + view.nbytes])
            if hasher is not None:
                hasher.update(view)
            offset += view.nbytes

    def consumed(self, sock: socket.socket, end: int) -> None:
        self.next = end
        sock.sendall(POSITION.pack(end))

    def close(self) -> None:
        _unmap(self.mapping, self.data)


def wire_part(sock: socket.socket, shared: RingWriter | None, part: Part) -> list[memoryview]:
    """A part's wire data, hashed now: with a ring, its payload is copied into the ring
    first (and hashed there, still in cache) and its position follows the span table; one
    too big for the ring goes whole over the socket after the position."""
    if shared is None:
        return encode_part(part.kind, part.rid, part.layers, part.spans)
    start, digests = shared.place(sock, part.spans, part.payload_bytes)
    parts = encode_part(part.kind, part.rid, part.layers, part.spans, digests)
    position = memoryview(POSITION.pack(start))
    return [parts[0], position, *(parts[1:] if start == NOT_IN_RING else ())]


def offer(sock: socket.socket, send: bytes) -> RingWriter | None:
    """The sender's offer, made right after the handshake (`send` is the RING message's
    header); the ring when the receiver took it, None when it cannot (other host, no
    /dev/shm, no room in it)."""
    ring = _offered(sock, send, RING_BYTES)
    return None if ring is None else RingWriter(ring, RING_BYTES)


def offer_for_answers(sock: socket.socket, send: bytes) -> RingReader | None:
    """An asker's offer on its own connection (`asking`): the same, but the one who takes
    the ring writes its answers' payload into it and the asker reads them."""
    ring = _offered(sock, send, ANSWER_RING_BYTES)
    return None if ring is None else RingReader(ring, ANSWER_RING_BYTES)


def _offered(sock: socket.socket, send: bytes, size: int) -> mmap.mmap | None:
    sweep()
    name, cookie = _new_name(), secrets.token_bytes(16)
    ring = _create(_path(name), cookie, size)
    if ring is None:
        return None
    try:
        sock.sendall(send + OFFER.pack(name, cookie, size))
        taken = recv_exact(sock, 1) == YES
    finally:
        _unlink(_path(name))
    if not taken:
        _unmap(ring)
        return None
    return ring


def accept(sock: socket.socket, body: bytes) -> RingReader | None:
    """The receiver's answer to a RING message's `body`: the ring when it opened the file
    and found the cookie (then YES was sent), else None (NO was sent)."""
    ring, size = _accepted(sock, body)
    return None if ring is None else RingReader(ring, size)


def accept_for_answers(sock: socket.socket, body: bytes) -> RingWriter | None:
    """`accept` of an asker's offer: this side writes its answers' payload into the ring."""
    ring, size = _accepted(sock, body)
    return None if ring is None else RingWriter(ring, size)


def _accepted(sock: socket.socket, body: bytes) -> tuple[mmap.mmap | None, int]:
    padded, cookie, size = OFFER.unpack(body)
    name = padded.rstrip(b"\0")
    ring = _open(name, cookie, size) if _NAME.fullmatch(name) else None
    sock.sendall(YES if ring is not None else NO)
    return ring, size


def _create(path: str, cookie: bytes, size: int) -> mmap.mmap | None:
    """A new ring file with the cookie in its preamble; None when /dev/shm cannot hold it
    (its pages are allocated now: a full tmpfs fails here, never with a SIGBUS later)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, PREAMBLE + size)
        ring = mmap.mmap(fd, PREAMBLE + size, flags=MAP_FLAGS)
    except OSError as e:
        log.info("no shared-memory ring (%s): KV goes over the socket", e)
        _unlink(path)
        return None
    finally:
        os.close(fd)
    ring[: len(cookie)] = cookie
    return ring


def _open(name: bytes, cookie: bytes, size: int) -> mmap.mmap | None:
    """The sender's ring, if this process sees that very file: a regular file of ours
    (same user), of the size offered, with the cookie in it."""
    try:  # NOTE: never blocks on a FIFO, never follows a link
        fd = os.open(_path(name), os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.getuid()
            or info.st_size != PREAMBLE + size
            or size < 2
        ):
            return None
        ring = mmap.mmap(fd, PREAMBLE + size, flags=MAP_FLAGS)
    except OSError:
        return None
    finally:
        os.close(fd)
    if ring[: len(cookie)] != cookie:
        _unmap(ring)
        return None
    return ring


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _unmap(ring: mmap.mmap, *views: memoryview) -> None:
    try:
        for view in views:
            view.release()
        ring.close()
    except BufferError:  # a view of it still lives: unmapped when the last one goes
        pass
