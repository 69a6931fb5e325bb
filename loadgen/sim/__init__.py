"""`loadgen sim`: a discrete-event simulation of a kvstack cluster (prefill, decode and
kvstore nodes, or colocated vLLM-like nodes) that replays a Mooncake trace in virtual time
through the conductor's own placement and admission code (shared/conductor/core.py) and
the shared cost model. docs/simulator.md says what is modelled and what is not."""
