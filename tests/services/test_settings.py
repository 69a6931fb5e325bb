"""Each command-line setting is defined once (services/settings.py): every command's
parser takes the settings meant for it, `kvstack up` hands its children only settings
they take, and compose.yaml and the stack's child environments use no flag or variable
the table does not define."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from services.cli.main import build_parser
from services.settings import (
    COMMAND_CHANGES,
    COMMAND_SETTINGS,
    FORWARDED_BY_UP,
    SETTINGS,
    forward,
)
from services.stack.auth import StackAuth
from shared.auth.deployment import Identity

ROOT = Path(__file__).resolve().parents[2]


def subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def flags_of(command: str) -> set[str]:
    return {SETTINGS[name].flag for name in COMMAND_SETTINGS[command]}


def envs_of(command: str) -> set[str]:
    return {SETTINGS[name].env for name in COMMAND_SETTINGS[command]} - {""}


@pytest.mark.parametrize("command", sorted(COMMAND_SETTINGS))
def test_every_command_takes_each_of_its_settings_with_its_default(command, monkeypatch) -> None:
    for setting in SETTINGS.values():
        if setting.env:
            monkeypatch.delenv(setting.env, raising=False)
    parsed = vars(build_parser().parse_args([command]))
    options = {o for a in subparser(command)._actions for o in a.option_strings}
    for name in COMMAND_SETTINGS[command]:
        setting = SETTINGS[name]
        expected = COMMAND_CHANGES.get(command, {}).get(name, {}).get("default", setting.default)
        assert setting.flag in options, (command, name)
        assert parsed[setting.dest] == expected, (command, name)


@pytest.mark.parametrize("child", sorted(FORWARDED_BY_UP))
def test_up_hands_its_children_only_settings_they_take_and_they_parse(child) -> None:
    up = build_parser().parse_args(["up", "--threads", "3", "--long-prefill-tokens", "9"])
    names = FORWARDED_BY_UP[child]
    assert set(names) <= set(COMMAND_SETTINGS["up"]) & set(COMMAND_SETTINGS[child])
    parsed = build_parser().parse_args([child, *forward(up, names)])
    for name in names:
        dest = SETTINGS[name].dest
        assert getattr(parsed, dest) == getattr(up, dest), (child, name)


def compose_services() -> dict[str, dict]:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    return {n: s for n, s in services.items() if s.get("command", [None])[0] == "kvstack"}


def test_compose_uses_only_flags_and_variables_the_table_defines() -> None:
    services = compose_services()
    assert {"conductor", "prefill", "decode", "kvstore", "gateway"} <= set(services)
    for name, service in services.items():
        command = service["command"][1]
        entrypoint = " ".join(service.get("entrypoint", []))
        used = {w for w in service["command"][2:] if w.startswith("--")}
        used |= set(re.findall(r"--[a-z][a-z-]+", entrypoint))
        assert used <= flags_of(command), (name, used - flags_of(command))
        variables = {v for v in service.get("environment", {}) if v.startswith("KVSTACK_")}
        assert variables <= envs_of(command), (name, variables - envs_of(command))


@pytest.mark.parametrize("insecure", [False, True])
def test_the_stack_gives_its_children_only_variables_the_table_defines(tmp_path, insecure) -> None:
    auth = StackAuth.prepare(tmp_path, [], insecure=insecure, tls=False)
    env, _ = auth.child_env(Identity("prefill", "prefill-0"))
    assert env and {"KVSTACK_NATS", *env} <= envs_of("prefill")


def test_a_flag_means_one_setting_per_command() -> None:
    for command, names in COMMAND_SETTINGS.items():
        flags = [SETTINGS[name].flag for name in names]
        assert len(flags) == len(set(flags)), command
