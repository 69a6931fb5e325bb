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
    name = ", ".join(action.option_strings) or str(action.metavar or action.dest)
    if action.option_strings and action.nargs != 0:
        name += f" {_metavar(action)}"
    return f"| `{name}` | {_default(action)} | {_cell(_help(parser, action))} |"


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return " ".join(action.metavar) if isinstance(action.metavar, tuple) else action.metavar
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper()


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0:
        return ""
    if isinstance(default, list | tuple):
        default = " ".join(map(str, default))
    return f"`{_cell(str(default))}`" if str(default) else ""


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as --help prints it (its %(default)s and the like filled in)."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = parser.prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return action.help % params


def _cell(text: str) -> str:
    """One line of a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")
