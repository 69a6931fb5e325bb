"""`kvstack up` refuses what the mock engine cannot run before starting anything."""
from __future__ import annotations

from services.cli.main import main


def test_attention_offload_with_the_mock_engine_is_refused(capsys) -> None:
    assert main(["up", "--engine", "mock", "--attention-workers", "2"]) == 2
    assert "--attention-workers does not run with --engine mock" in capsys.readouterr().err


def test_an_unknown_mock_model_is_refused_with_the_known_ones(capsys) -> None:
    assert main(["up", "--engine", "mock", "--mock-model", "llama4"]) == 2
    assert "known: llama3-70b, llama2-70b" in capsys.readouterr().err
