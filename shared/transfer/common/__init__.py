"""What the TCP and Mooncake data planes share: they differ in how bytes move, not in how
peers connect, authenticate, queue work or report it.

Modules: `frames` (a queued frame, its checks and checksum), `sockets` (connecting,
reading, liveness), `handshake` (the HMAC challenge, under each transport's own magic),
`counters`, `limits` (what a receiver allows each connection), `sender` (a per-peer channel
and the sender around it), `receiver` (the listener, one thread per connection up to a cap,
and what a connection does with its sink).
"""
