"""The TCP wire under `--data-encrypt`: each wire part keeps its HEADER in clear (authenticated
as the associated data of its records) and seals the rest as records of `common.encryption`:

    KV, KV_MORE  HEADER | request id and span table, sealed | the spans' K and V bytes, sealed
    END          HEADER | request id, sealed

A sealed record is as long as its plaintext, then a 16-byte tag. The sender encrypts a
payload a buffer at a time and sends each buffer while it is still in cache. The receiver
opens the request id and span table before it asks the sink for any destination, so a
tampered table never names where bytes go; the payload's ciphertext lands in a scratch
buffer a chunk at a time and is decrypted from there into the sink's memory (the cipher
cannot work in place), then hashed, still in cache. A payload whose tag fails drops the
connection: its frame is never reported, its requests are lost.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Sequence

from cryptography.hazmat.primitives.ciphers import AEADDecryptionContext

from shared.transfer.common.encryption import TAG_BYTES, SealingKey, check_tag, open_sealed, seal
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp.sockets import RECV_CHUNK, Landing, send_all
from shared.transfer.tcp.wire import HEADER, KIND_END

SEAL_CHUNK = 1 << 20  # ciphertext per sendmsg: encrypted, then sent while still in L2


class Sealer:
    """The sending end of an encrypted connection: seals each wire part as it sends it, the
    payload a buffer at a time (encrypted, then sent while still in cache), so that sealing
    takes no more memory than that buffer however large the part."""

    def __init__(self, key: SealingKey) -> None:
        self.key = key
        self.buffer = memoryview(bytearray(SEAL_CHUNK))

    def send(self, sock: socket.socket, part: list[memoryview]) -> None:
        """Send `part` (from `wire.encode_part` or `wire.encode_end`) sealed."""
        header, meta = part[0][: HEADER.size], part[0][HEADER.size :]
        sealed_meta = memoryview(seal(self.key, header, meta))
        if HEADER.unpack_from(header)[2] == KIND_END:
            send_all(sock, [header, sealed_meta])
        else:
            self._send_payload(sock, header, part[1:], [header, sealed_meta])

    def _send_payload(
        self,
        sock: socket.socket,
        header: memoryview,
        views: list[memoryview],
        pending: list[memoryview],
    ) -> None:
        """Seal `views` as one record behind the buffers `pending`, sending each time the
        buffer is full."""
        encryptor, out, filled = self.key.encryptor(header), self.buffer, 0
        for view in views:
            done = 0
            while done < view.nbytes:
                if filled == out.nbytes:
                    send_all(sock, [*pending, out])
                    pending, filled = [], 0
                n = min(view.nbytes - done, out.nbytes - filled)
                encryptor.update_into(view[done : done + n], out[filled:])
                done, filled = done + n, filled + n
        encryptor.finalize()
        send_all(sock, [*pending, out[:filled], memoryview(encryptor.tag)])


class Opener:
    """The receiving end of an encrypted connection: opens its wire parts' records in the
    order they were sealed."""

    def __init__(self, key: SealingKey) -> None:
        self.key = key
        self.scratch = memoryview(bytearray(RECV_CHUNK))  # where ciphertext lands

    def read_meta(self, sock: socket.socket, header: bytes, nbytes: int) -> bytes:
        """The request id and span table (`nbytes` of plaintext) that follow `header`."""
        return open_sealed(self.key, header, recv_exact(sock, nbytes + TAG_BYTES))

    def receive(self, sock: socket.socket, header: bytes, landings: Sequence[Landing]) -> None:
        """The payload that follows the span table, decrypted into `landings`; ProtocolError
        when its tag fails."""
        decryptor = self.key.decryptor(header)
        recv_decrypted(sock, landings, decryptor, self.scratch)
        check_tag(decryptor, recv_exact(sock, TAG_BYTES))


def recv_decrypted(
    sock: socket.socket,
    landings: Sequence[Landing],
    decryptor: AEADDecryptionContext,
    scratch: memoryview,
) -> None:
    """Fill every view with the plaintext of the ciphertext that arrives in `scratch`,
    feeding each piece to its hasher as soon as it is written."""
    pending = deque(landing for landing in landings if landing[0].nbytes)
    left = sum(view.nbytes for view, _ in pending)
    while pending:
        received = sock.recv_into(scratch, min(left, scratch.nbytes))
        if received == 0:
            raise ConnectionError("connection closed mid-frame")
        left -= received
        done = 0
        while done < received:
            view, hasher = pending[0]
            n = min(received - done, view.nbytes)
            decryptor.update_into(scratch[done : done + n], view)
            if hasher is not None:
                hasher.update(view[:n])
            done += n
            if n < view.nbytes:
                pending[0] = (view[n:], hasher)
            else:
                pending.popleft()
