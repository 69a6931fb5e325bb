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


# -- a reference of every command and flag, in Markdown (docs/cli.md) ----------------------


def reference(parser: argparse.ArgumentParser) -> str:
    """Every command under `parser`, depth first in the order they were added: what it
    does, its commands, and a table of its arguments (flags, defaults, help)."""
    return "\n".join(_sections(parser, parser.prog))


def _sections(parser: argparse.ArgumentParser, path: str) -> list[str]:
    lines = [f"## `{path}`", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    commands = _commands(parser)
    if commands:
        lines += ["| command | what it does |", "| --- | --- |"]
        lines += [f"| `{path} {name}` | {_cell(about)} |" for name, about, _ in commands]
        lines.append("")
    rows = [_row(parser, a) for a in parser._actions if _documented(a)]
    if rows:
        lines += ["| argument | default | what it does |", "| --- | --- | --- |", *rows, ""]
    for name, _, child in commands:
        lines += _sections(child, f"{path} {name}")
    return lines


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, aliases left out."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            about = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [
                (name, about.get(name, ""), child)
                for name, child in action.choices.items()
                if name in about or not about
            ]
    return []


def _documented(action: argparse.Action) -> bool:
    hidden = isinstance(action, argparse._SubParsersAction | argparse._HelpAction)
    return not hidden and action.help != argparse.SUPPRESS


def _row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    # NOTE: argparse's own formatter, so each row says what --help says (a plain one: the
    # default has its own column, where ArgumentDefaultsHelpFormatter would repeat it)
    formatter = argparse.HelpFormatter(parser.prog)
    name = formatter._format_action_invocation(action)
    help_text = formatter._expand_help(action) if action.help else ""
    return f"| `{name}` | {_default(action)} | {_cell(help_text)} |"


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0:
        return ""
    if isinstance(default, list | tuple):
        default = " ".join(map(str, default))
    return f"`{_cell(str(default))}`" if str(default) else ""


def _cell(text: str) -> str:
    """One line of a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")
