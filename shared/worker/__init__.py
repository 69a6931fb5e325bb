"""What prefill and decode workers share: their config and heartbeat, the I/O-free core
of their decisions, their metrics, and the pool their config asks for."""
