"""The bus and the service runtime every process runs on: NATS (`bus.py`, and the
nats-server it may start, alone or as a cluster), the service shell with its heartbeats,
owned tasks, tracing and metrics, and child processes."""
