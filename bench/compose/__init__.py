"""kvstack as users deploy it: compose.yaml on a real Docker engine, driven from Python for
the container suite (tests/compose) and `python -m bench compose-chaos` (docs/reliability.md).

Modules: `docker` (the engine and compose commands), `stack` (one compose project: up,
containers, down), `network` (partitions, slow and lossy links), `relay` (the delaying TCP
relay of a slow link), `faults` (what each fault does and undoes), `runner` (faults under a
steady load), `cli`.
"""
