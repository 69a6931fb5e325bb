"""Worker and gateway command lines: the engine flags reach the configs, checked."""

from __future__ import annotations

import pytest

from services.cli.main import build_parser, main
from services.cli.service import engine_options, worker_config
from shared.engine.mock import MockSpec
from shared.errors import KvstackError


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_mock_flags_make_the_workers_mock_spec() -> None:
    args = parse(
        "prefill",
        "--engine",
        "mock",
        "--mock-model",
        "llama3-8b",
        "--mock-hardware",
        "h100",
        "--mock-kv-scale",
        "0.01",
        "--max-model-len",
        "200000",
        "--insecure",
    )
    config = worker_config(args)
    assert config.mock == MockSpec("llama3-8b", "h100", 0.01)
    assert config.engine_config().mock == config.mock
    assert config.engine_config().max_model_len == 200000


def test_the_torch_engine_is_the_default_and_takes_no_mock_flags() -> None:
    assert engine_options(parse("decode")) == dict(mock=None, max_model_len=None)
    assert engine_options(parse("gateway", "--engine", "mock"))["mock"] == MockSpec()
    with pytest.raises(KvstackError, match="need --engine mock"):
        engine_options(parse("decode", "--mock-model", "llama3-8b"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ("prefill", "--engine", "mock", "--mock-model", "gpt-9"),
            "unknown mock model 'gpt-9'; known: llama3-70b, llama2-70b, llama3-8b",
        ),
        (
            ("decode", "--engine", "mock", "--mock-hardware", "tpu"),
            "unknown mock hardware 'tpu'; known: a800, h100, h20, cpu",
        ),
        (
            ("decode", "--engine", "mock", "--attention-workers", "a,b"),
            "attention offload (--attention-workers) does not run with the mock engine",
        ),
        (("gateway", "--max-model-len", "-5"), "--max-model-len must not be negative"),
    ],
)
def test_bad_engine_flags_are_one_line_errors(capsys, argv, message) -> None:
    assert main([*argv, "--insecure"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_credentials_come_from_flags_files_or_the_environment(tmp_path, monkeypatch) -> None:
    from shared.auth.deployment import Identity, ensure_secrets

    monkeypatch.delenv("KVSTACK_DATA_TOKEN", raising=False)
    with pytest.raises(KvstackError, match="data plane needs a shared secret"):
        worker_config(parse("prefill"))
    secrets = ensure_secrets(tmp_path, [Identity("prefill", "prefill-0")])
    creds = str(secrets.creds_path(Identity("prefill", "prefill-0")))
    config = worker_config(
        parse("prefill", "--nats-creds", creds, "--data-token-file", str(secrets.data_token_path))
    )
    assert config.nats_auth.creds.user == "prefill.prefill-0" and not config.nats_auth.insecure
    assert config.data_token == secrets.data_token_path.read_text().strip()
    monkeypatch.setenv("KVSTACK_DATA_TOKEN", "from-env")
    assert worker_config(parse("prefill", "--insecure")).data_token == "from-env"
    with pytest.raises(KvstackError, match="not a kvstack credentials file"):
        worker_config(parse("prefill", "--nats-creds", str(secrets.data_token_path)))
