"""The permission table: what docs/security.md says is what nats-server is told."""

from __future__ import annotations

from pathlib import Path

from shared.auth.roles import ANY, ROLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def row(role) -> str:
    cell = lambda patterns: ", ".join(f"`{p}`" for p in patterns)
    return f"| {role.name} | {cell(role.publish)} | {cell(role.subscribe)} |"


def test_the_documented_table_is_the_codes() -> None:
    text = DOC.read_text()
    for role in ROLES.values():
        assert row(role) in text, f"docs/security.md is out of date for {role.name}"


def test_a_worker_role_names_its_own_id_and_no_one_but_admin_has_everything() -> None:
    for role in ROLES.values():
        if role.name == "admin":
            continue
        assert ">" not in role.publish and ">" not in role.subscribe
        mine = role.for_worker("w-1")
        assert f"kvstack.heartbeat.{role.name}.w-1" in mine.publish
        assert role.for_worker(ANY).publish[0] == f"kvstack.heartbeat.{role.name}.*"


def test_only_the_gateway_submits_places_and_aborts() -> None:
    for name, role in ROLES.items():
        gateway_only = {"kvstack.conductor.place", "kvstack.abort", "kvstack.prefill.*.submit"}
        if name not in ("gateway", "admin"):
            assert not gateway_only & set(role.publish), name
