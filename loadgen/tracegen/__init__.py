"""`loadgen trace gen`: Mooncake-format traces from parameters (docs/loadgen.md, "Traces").

- `params.py`: what a workload is (`GenParams`) and its checks;
- `presets.py`: named workloads to sweep the conductor on;
- `plan.py`: who asks what and when (sessions, shared prefixes, lengths, arrivals);
- `hashids.py`: the prompts' block ids, prefix-chained as Mooncake's are;
- `generate.py`: plan + ids + the window kept = the trace; `tune.py`: a target reuse;
- `flags.py`: the command-line flags, one per parameter.
"""
