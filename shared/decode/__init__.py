"""The decode worker's decisions, free of I/O: whether it reserves blocks for a request's
KV, whether it adopts the request once the KV landed, how its token events are numbered
and how they end. services/decode wraps them with NATS and the engine; loadgen/sim wraps
them with simulated time."""
