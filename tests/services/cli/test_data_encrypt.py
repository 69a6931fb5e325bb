"""`--data-encrypt` (KVSTACK_DATA_ENCRYPT) reaches every data-plane service's config, and a
service refuses to start where it cannot encrypt: without the data token, or where KV bytes
would leave the tcp transport."""

from __future__ import annotations

import pytest

from services.cli.main import build_parser, main
from services.cli.service import worker_config


@pytest.fixture(autouse=True)
def no_data_plane_env(monkeypatch) -> None:
    for variable in ("KVSTACK_DATA_TOKEN", "KVSTACK_DATA_TOKEN_FILE", "KVSTACK_DATA_ENCRYPT"):
        monkeypatch.delenv(variable, raising=False)


def test_the_flag_and_the_variable_turn_encryption_on(monkeypatch) -> None:
    monkeypatch.setenv("KVSTACK_DATA_TOKEN", "a-token")
    parse = build_parser().parse_args
    assert not worker_config(parse(["prefill", "--insecure"])).data_encrypt
    assert worker_config(parse(["prefill", "--insecure", "--data-encrypt"])).data_encrypt
    monkeypatch.setenv("KVSTACK_DATA_ENCRYPT", "1")
    assert worker_config(build_parser().parse_args(["decode", "--insecure"])).data_encrypt
    for command in ("kvstore", "attention-worker"):
        assert build_parser().parse_args([command]).data_encrypt


@pytest.mark.parametrize(
    "argv, message",
    [
        (("prefill",), "--data-encrypt needs the data plane's shared secret"),
        (("kvstore",), "--data-encrypt needs the data plane's shared secret"),
        (
            ("prefill", "--transport", "mooncake"),
            "covers the tcp transport only: --transport mooncake would move KV bytes in clear",
        ),
        (
            ("decode", "--kv-pool", "mooncake", "--mooncake-master", "127.0.0.1:1"),
            "covers the tcp transport only: --kv-pool mooncake",
        ),
        (("decode", "--attention-workers", "a,b"), "only: attention offload (--attention-workers)"),
        (("attention-worker",), "covers the tcp transport only: an attention worker's link"),
    ],
)
def test_a_service_that_cannot_encrypt_refuses_to_start(capsys, monkeypatch, argv, message):
    if "needs the data plane's shared secret" not in message:
        monkeypatch.setenv("KVSTACK_DATA_TOKEN", "a-token")
    assert main([*argv, "--data-encrypt", "--insecure"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
