"""KV frames through the Mooncake Transfer Engine (`tcp` or `rdma` protocol): an optional data
plane beside the TCP one, with the same sender and receiver contract.

The engine writes one-sidedly into memory the receiver registered, and tells the receiver
nothing. So a plain TCP control connection per sender and receiver pair (with the HMAC
handshake of `common.handshake`, under this transport's own magic) carries everything but
the bytes:

    receiver -> sender   HELLO, [proof ->], verdict, then the receiver's engine session
    sender -> receiver   ASK      request id, layer, span table (no bytes)
    receiver -> sender   PLACES   per span the K and V addresses `sink.destination` chose,
                                  or a refusal
                         ...      the sender's engine writes the accepted spans there
    sender -> receiver   LANDED_MORE ... LANDED
                                  per part (a run of spans, `parts.PART_BYTES`), once the
                                  engine has written it: each span's xxh3_64 of K then V, as
                                  the sender read them
    sender -> receiver   END      request id, number of frames

On each LANDED the receiver hashes those spans where they landed; after the last part it
reports the frame to the sink: bytes that fail their checksum are never reported good. A
connection has at most one frame placed at a time, so the sink sees `destination` ...
`on_frame` of a frame before anything of the next, as with the TCP transport, and each frame
costs a round trip (ASK to PLACES) after the previous one was checked. What overlaps instead:
the sender hashes a part while the engine writes it and starts the next part's write before
waiting on this one, and the receiver checks a part while the next is written.

Registration: the receiver registers the tensors it is given (`memory=`) at start and, for
any other destination, the whole allocation behind it on first use. The engine's port has
no authentication of its own; see MooncakeKVReceiver.

Modules: `memory` (addresses, allocations, copies), `engine` (the TransferEngine and what
this package relies on about it), `control` (handshake and messages), `parts`, `sender`,
`receiver` (the last two on the channel, listener and connection bookkeeping of `common`).
`mooncake` itself is imported only when an engine starts, so this package imports anywhere.
"""

from __future__ import annotations

from shared.transfer.mooncake.engine import EngineError, available
from shared.transfer.mooncake.receiver import MooncakeKVReceiver
from shared.transfer.mooncake.sender import MooncakeKVSender

__all__ = ["EngineError", "MooncakeKVReceiver", "MooncakeKVSender", "available"]
