"""The prefill worker's decisions, free of I/O: where a prompt's prefix comes from, which
requests it takes, and how a prefill ends. services/prefill wraps them with NATS and the
engine; loadgen/sim wraps them with simulated time."""
