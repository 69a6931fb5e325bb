"""What the `kvstack` and `loadgen` command lines share: subcommand modules that each add
their parser (`add_parser(sub)`, setting `run=<function>`), and one way to run them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from shared.errors import KvstackError


def build_parser(
    prog: str, description: str, commands: Sequence[ModuleType]
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        command.add_parser(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse and run; a KvstackError is a usage error: one line on stderr, exit 2."""
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except KvstackError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside a command's own Ctrl-C handling
        return 130
