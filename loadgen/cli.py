"""`loadgen`: measure OpenAI-compatible endpoints (`run`) and compare results (`report`).

Each command is a module with `add_parser(sub)`, which adds its subparser and sets
`run=<its function>` as a default, and that function, `run(args) -> int` (the exit code).
A new command is one import and one entry in COMMANDS.
"""
from __future__ import annotations

import argparse
import sys

from loadgen import report, run_command
from loadgen.sim import cli as sim
from shared.errors import KvstackError

COMMANDS = (run_command, report, sim)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadgen", description="Load generator for OpenAI-compatible endpoints, "
                                    "with vLLM's metric names and formulas (docs/loadgen.md).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except KvstackError as e:
        print(f"loadgen: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # outside a run's own Ctrl-C handling (e.g. while connecting)
        return 130


if __name__ == "__main__":
    sys.exit(main())
