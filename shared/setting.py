"""One command-line setting, defined once: its flag, environment variable, type, default
and help. `services/settings.py` holds the table; the parsers of `kvstack up` and of
every service are built from it (`add`), and `kvstack up` writes its children's command
lines with it (`argv`), so a setting reaches every command from one definition. The
conductor's scheduling settings live in `shared/conductor/settings.py`, which the
simulator's command line (`loadgen sim`) shares.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    flag: str  # "--kv-cache-gib"
    help: str = ""
    type: Callable[[str], Any] | None = None  # None: a string
    default: Any = None
    env: str = ""  # the environment variable that gives the default ("": none)
    choices: tuple[str, ...] | None = None
    switch: bool = False  # a flag without a value (store_true)
    many: bool = False  # one or more values (`--flag a b`); parsed as a list

    @property
    def dest(self) -> str:
        """The attribute of the parsed namespace."""
        return self.flag.removeprefix("--").replace("-", "_")

    def current_default(self) -> Any:
        """The default, from the environment where the setting has a variable and it is set
        (read when the parser is built, so a test's monkeypatched env counts)."""
        if not self.env or self.env not in os.environ:
            return self.default
        value = os.environ[self.env]
        return value not in ("", "0") if self.switch else value

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        options: dict[str, Any] = dict(default=self.current_default())
        if self.help:
            options["help"] = self.help
        if self.switch:
            parser.add_argument(self.flag, action="store_true", **options)
            return
        if self.type is not None:
            options["type"] = self.type
        if self.choices is not None:
            options["choices"] = self.choices
        if self.many:
            options["nargs"] = "+"
        parser.add_argument(self.flag, **options)

    def argv(self, value: Any) -> list[str]:
        """`value` as this setting's command-line words; none for an unset one (None, an
        empty string or list, a switch that is off), so the child keeps its own default."""
        if self.many:
            return [self.flag, *map(str, value)] if value else []
        if value is None or value == "" or value is False:
            return []
        return [self.flag] if value is True else [self.flag, str(value)]


def add(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    table: Mapping[str, Setting],
    names: Iterable[str],
    changes: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Add the settings `names` to `parser`; `changes[name]` replaces fields of one for this
    command (another default or help), e.g. {"http_port": {"default": 8000}}."""
    changes = changes or {}
    for name in names:
        dataclasses.replace(table[name], **changes.get(name, {})).add_to(parser)
