"""`kvstack`: one command line for every part of the stack."""

from __future__ import annotations

import argparse
import sys

from services.cli import auth, fuzz, generate, moved, profile, serve, service, up
from shared import cli

COMMANDS = (up, serve, generate, service, profile, fuzz, auth, moved)


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser("kvstack", __doc__, COMMANDS)


def main(argv: list[str] | None = None) -> int:
    return cli.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
