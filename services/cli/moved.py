"""Commands that left `kvstack`: the benchmarks run from a checkout as `python -m bench`.

Kept as a subcommand that only says where they went, so an old `kvstack bench ...` line
(in notes, scripts, shell history) gets directions instead of "invalid choice".
"""

from __future__ import annotations

import argparse

from shared.errors import KvstackError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="moved: run `python -m bench` from a checkout")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    command = " ".join(["python -m bench", *args.rest])
    raise KvstackError(
        f"the benchmarks moved out of kvstack: run `{command}` from a checkout (docs/benchmarks.md)"
    )
