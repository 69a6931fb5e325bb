"""`python -m bench live-vs-sim`: one trace slice replayed per policy live (a mock-engine
stack, `loadgen run --trace`) and in `loadgen sim` on the same cluster shape, their TTFT
and TPOT side by side (docs/live-vs-sim.md)."""
