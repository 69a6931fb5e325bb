"""The gateway's API key: required off loopback unless --insecure, read from --api-key-file;
`kvstack auth init` and `kvstack up` make one by default."""

from __future__ import annotations

import stat

import pytest

from services.cli.main import build_parser
from services.cli.main import main as kvstack
from services.cli.up import stack_config
from services.gateway.api_key import gateway_api_key, is_loopback
from shared.errors import KvstackError


def gateway_args(*argv: str):
    return build_parser().parse_args(["gateway", *argv])


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.7", "::", "gateway.example"])
def test_a_gateway_reachable_from_other_hosts_refuses_to_start_without_a_key(host) -> None:
    with pytest.raises(KvstackError, match="without an API key: give --api-key-file"):
        gateway_api_key(gateway_args("--host", host))


def test_insecure_lets_a_gateway_off_loopback_serve_without_a_key() -> None:
    assert gateway_api_key(gateway_args("--host", "0.0.0.0", "--insecure")) == ""


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_a_gateway_on_loopback_may_serve_without_a_key(host) -> None:
    assert is_loopback(host)
    assert gateway_api_key(gateway_args("--host", host)) == ""


def test_the_key_file_is_read_and_its_newline_dropped(tmp_path) -> None:
    (tmp_path / "api-key").write_text("s3cret-key\n")
    args = gateway_args("--host", "0.0.0.0", "--api-key-file", str(tmp_path / "api-key"))
    assert gateway_api_key(args) == "s3cret-key"


def test_the_key_file_comes_from_the_environment(tmp_path, monkeypatch) -> None:
    (tmp_path / "api-key").write_text("from-env\n")
    monkeypatch.setenv("KVSTACK_API_KEY_FILE", str(tmp_path / "api-key"))
    assert gateway_api_key(gateway_args("--host", "0.0.0.0")) == "from-env"


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_a_missing_or_empty_key_file_is_a_clear_error(tmp_path, content) -> None:
    path = tmp_path / "api-key"
    if content is not None:
        path.write_text(content)
    args = gateway_args("--host", "0.0.0.0", "--api-key-file", str(path))
    with pytest.raises(KvstackError, match=f"the API key file {path}"):
        gateway_api_key(args)


def test_auth_init_writes_a_private_api_key_and_keeps_it_until_rotated(tmp_path) -> None:
    secrets = tmp_path / "secrets"
    assert kvstack(["auth", "init", "--dir", str(secrets)]) == 0
    key = (secrets / "api-key").read_text().strip()
    assert len(key) >= 32
    assert stat.S_IMODE((secrets / "api-key").stat().st_mode) == 0o600
    assert kvstack(["auth", "init", "--dir", str(secrets)]) == 0
    assert (secrets / "api-key").read_text().strip() == key
    assert kvstack(["auth", "init", "--dir", str(secrets), "--rotate"]) == 0
    assert (secrets / "api-key").read_text().strip() != key


@pytest.mark.parametrize(
    ("argv", "made"),
    [([], True), (["--insecure"], False), (["--api-key", "given"], False)],
)
def test_up_makes_a_key_for_its_gateway_unless_given_one_or_insecure(argv, made) -> None:
    assert stack_config(build_parser().parse_args(["up", *argv])).api_key is made
