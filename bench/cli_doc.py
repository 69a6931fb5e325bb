"""`python -m bench cli-doc`: docs/cli.md, every `kvstack` and `loadgen` command and flag,
written from their own argument parsers; `--check` fails where the file has drifted
from them (tests/bench/test_cli_doc.py runs the same check)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadgen.cli import build_parser as loadgen_parser
from services.cli.main import build_parser as kvstack_parser
from shared.cli import reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
# NOTE: settings take their defaults from these variables where they are set; the page
# shows the defaults a fresh shell gets
ENVIRONMENT_PREFIXES = ("KVSTACK_", "OTEL_")
HEADER = """# Command line reference

Every command and flag of `kvstack` and `loadgen`, as their `--help` gives them.
Generated from the argument parsers by `python -m bench cli-doc`; a test fails when this
page and the parsers differ. The defaults are a fresh shell's: a setting with an
environment variable (named in its help) takes its default from it where it is set. The
benchmarks (`python -m bench`, from a checkout) are in [benchmarks.md](benchmarks.md).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cli-doc", help="write docs/cli.md from the command line's parsers")
    p.add_argument("--check", action="store_true", help="only say whether docs/cli.md drifted")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    text = render()
    if not args.check:
        DOC.write_text(text)
        print(f"wrote {DOC} ({len(text.splitlines())} lines)", file=sys.stderr)
        return 0
    drift = differences(DOC.read_text() if DOC.exists() else "", text)
    if drift:
        print(f"{DOC} differs from the parsers (run `python -m bench cli-doc`):", file=sys.stderr)
        print(drift, file=sys.stderr)
        return 1
    return 0


def render() -> str:
    with _fresh_environment():
        parts = [HEADER, reference(kvstack_parser()), reference(loadgen_parser())]
    return "\n".join(parts)


def differences(written: str, rendered: str) -> str:
    """A unified diff from the page as written to the parsers' (empty: none)."""
    lines = difflib.unified_diff(
        written.splitlines(), rendered.splitlines(), "docs/cli.md", "the parsers", lineterm=""
    )
    return "\n".join(lines)


@contextmanager
def _fresh_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENVIRONMENT_PREFIXES)}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)
