"""What the TCP and Mooncake data planes share: they differ in how bytes move, not in how
peers connect, authenticate, queue work or report it.

Modules: `frames` (a queued frame, its checks and checksum), `sockets` (connecting,
reading, liveness), `handshake` (the HMAC challenge, under each transport's own magic),
`encryption` (a connection's keys and sealed records, for `--data-encrypt`), `counters`,
`limits` (what a receiver allows each connection and each peer address), `sender` (a
per-peer channel and the sender around it), `receiver` (the listener, one thread per
connection up to its caps, and what a connection does with its sink).
"""
