"""`loadgen`: measure OpenAI-compatible endpoints (`run`), compare results (`report`) and
simulate a cluster in virtual time (`sim`; `sim sweep`: policies x loads x traces;
`sim-sweep`: a capacity search), and generate, inspect and import traces
(`trace gen|stats|import`). The chaos run, which starts a kvstack
of its own, is `python -m bench chaos`.

Each command is a module with `add_parser(sub)`, which adds its subparser and sets
`run=<its function>` as a default, and that function, `run(args) -> int` (the exit code).
A new command is one import and one entry in COMMANDS.
"""

from __future__ import annotations

import argparse
import sys

from loadgen import report, run_command, trace_command
from loadgen.sim import cli as sim
from loadgen.sim import sweep
from shared import cli

COMMANDS = (run_command, report, sim, sweep, trace_command)


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser(
        "loadgen",
        "Load generator for OpenAI-compatible endpoints, with "
        "vLLM's metric names and formulas (docs/loadgen.md).",
        COMMANDS,
    )


def main(argv: list[str] | None = None) -> int:
    return cli.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
