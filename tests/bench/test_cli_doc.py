"""docs/cli.md is what the parsers say: every command and flag of `kvstack` and `loadgen`;
a flag added to a parser and not to the page fails here, named."""

from __future__ import annotations

import argparse

from bench import cli_doc
from services.cli.main import build_parser as kvstack_parser


def test_the_page_is_what_the_parsers_say() -> None:
    drift = cli_doc.differences(cli_doc.DOC.read_text(), cli_doc.render())
    assert not drift, f"docs/cli.md drifted; run `python -m bench cli-doc`:\n{drift}"


def test_a_flag_the_page_lacks_fails_the_check_and_is_named(monkeypatch, capsys) -> None:
    def with_a_new_flag() -> argparse.ArgumentParser:
        parser = kvstack_parser()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices["up"].add_argument("--brand-new-flag", help="nobody wrote it down")
        return parser

    monkeypatch.setattr(cli_doc, "kvstack_parser", with_a_new_flag)
    assert cli_doc.run(argparse.Namespace(check=True)) == 1
    said = capsys.readouterr().err
    assert "+| `--brand-new-flag BRAND_NEW_FLAG` |  | nobody wrote it down |" in said


def test_defaults_set_by_the_environment_stay_off_the_page(monkeypatch) -> None:
    monkeypatch.setenv("KVSTACK_KV_POOL", "mooncake")
    assert "| `--kv-pool {kvstore,mooncake}` | `kvstore` |" in cli_doc.render()
    assert kvstack_parser().parse_args(["up"]).kv_pool == "mooncake"  # the variable is kept
