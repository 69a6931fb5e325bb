"""KV frames over plain TCP: the default data plane.

Every connection opens with the handshake of `common.handshake` (HELLO under this
transport's MAGIC, an HMAC proof when the receiver holds a token, a verdict), then carries
frames, each a fixed HEADER (magic, version, kind, request-id length, layers, count, body
bytes) and a body of `body bytes`:

    KV, KV_MORE  request id, `count` SPAN records (each with xxh3_64 of its K then V bytes),
                 then each span's K bytes and V bytes
    END          request id; `count` is the number of KV frames of the request
    RING         a sender on this host offers its shared-memory ring (`ring`); after it,
                 each KV part's payload travels in the ring and the socket carries its
                 header, span table and ring position (the receiver answers with how far
                 it has read). With `count` 1 an asker offers the receiver it dialed a
                 ring for its answers: the receiver writes the payload of the frames that
                 follow its replies there, and the asker answers how far it has read
    ASK, ANSWER  a question from the peer that dialed (a worker asking a kvstore for blocks)
                 and the receiver's reply, in the bus's message encoding; a get's KV frames
                 and END follow the reply on the same connection (`asking`, `asker`)
    PLACED       on one host, instead of a get's KV frames: where the blocks lie in the
                 kvstore's shared-memory arena, which the asker mapped after its ring was
                 taken; the asker copies them out, checks each block's checksum there and
                 answers DONE (`placed`)

`layers` names the first layer a frame carries (low 16 bits) and how many more follow it
(high 16): a span of a frame of several layers holds its K of each layer in turn, then its
V likewise, and the receiver reports the frame to its sink as one frame per layer. A span's
K or V may be gathered from pieces on send and scattered into pieces the sink names on
receipt (the kvstore keeps each block in its own buffer): no byte is copied to join them.
A frame larger than PART_BYTES travels as several parts (KV_MORE ... KV) that the receiver
reports as one frame. The sender hashes each part right before `sendmsg` copies it, and the
receiver hashes each piece right after `recvmsg_into` lands it in the sink's memory, so both
hash bytes that are still in cache (hashing whole frames apart from the copy cost about a
fifth of loopback throughput in `python -m bench transfer`).

Under `--data-encrypt` (`encrypt=True` on both ends, which needs the token) the handshake
says so and derives keys for the connection, and everything after each HEADER travels
sealed with AES-256-GCM, the HEADER authenticated with it (`sealing`); off, nothing on the
path above changes.

One thread and one connection per peer on the sending side keep a request's frames and END
in order; one thread per accepted connection on the receiving side, up to a cap, each with a
handshake deadline, a read timeout inside a frame and an idle timeout between frames (both
from `common`; see `ConnectionLimits`).

Modules: `wire` (frame format, encoding, decoding), `sockets` (scatter/gather I/O), `sealing`
(the same frames encrypted), `ring` (the same frames' payload through shared memory, same
host), `placed` (a kvstore's gets read where the blocks lie, and puts placed whole in the
asker's ring, same host: `arena_view`, `placed_puts`), `sender`,
`receiver`, `asking` (answers on an accepted connection), `asker` (asks on connections of
one's own).
"""

from __future__ import annotations

from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.handshake import HELLO, AuthenticationError
from shared.transfer.common.limits import ConnectionLimits
from shared.transfer.common.sockets import tune
from shared.transfer.tcp.receiver import TcpKVReceiver
from shared.transfer.tcp.sender import TcpKVSender
from shared.transfer.tcp.sockets import IOV_MAX, SOCKET_BUFFER_BYTES, send_all
from shared.transfer.tcp.wire import (
    HEADER,
    KIND_ANSWER,
    KIND_ASK,
    KIND_END,
    KIND_KV,
    KIND_KV_MORE,
    KIND_PLACED,
    KIND_RING,
    MAGIC,
    MAX_SPANS,
    PART_BYTES,
    SPAN,
    VERSION,
)

__all__ = [
    "HEADER",
    "HELLO",
    "IOV_MAX",
    "KIND_ANSWER",
    "KIND_ASK",
    "KIND_END",
    "KIND_KV",
    "KIND_KV_MORE",
    "KIND_PLACED",
    "KIND_RING",
    "MAGIC",
    "MAX_SPANS",
    "PART_BYTES",
    "SOCKET_BUFFER_BYTES",
    "SPAN",
    "VERSION",
    "AuthenticationError",
    "ConnectionLimits",
    "ProtocolError",
    "TcpKVReceiver",
    "TcpKVSender",
    "send_all",
    "tune",
]
