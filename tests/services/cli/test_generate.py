"""`kvstack generate` as a user runs it: a subprocess, its output and exit code."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys

import pytest
import torch

from services.cli.main import main
from tests.conftest import make_hf_model


def kvstack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_clean_error(code: int, stderr: str, fragment: str) -> None:
    assert code == 2
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvstack: error: ") and fragment in lines[0]


def test_json_output_has_ids_text_and_logprobs(smollm2_dir) -> None:
    result = kvstack(
        "generate",
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "12",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert "Paris" in out["text"]
    assert len(out["logprobs"]) == len(out["token_ids"]) > 0
    assert [lp["token_id"] for lp in out["logprobs"]] == out["token_ids"]
    assert out["prompt_token_ids"][0] == 1  # <|im_start|> opens the chat template


def test_prompt_ids_with_a_directory_model(tiny_llama_dir) -> None:
    result = kvstack(
        "generate",
        "--model",
        str(tiny_llama_dir),
        "--prompt-ids",
        "5,6,7",
        "--max-tokens",
        "4",
        "--ignore-eos",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["token_ids"]) == 4


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    (root / "empty").mkdir()
    no_weights = make_hf_model(root / "no-weights")
    for f in no_weights.glob("*.safetensors"):
        f.unlink()
    gpt2 = root / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    return root


def test_bad_input_gets_one_line_errors(bad_models, tiny_llama_dir, capsys) -> None:
    cases = [
        (["--model", "no-such-model", "--prompt", "hi"], "unknown model"),
        (["--model", str(bad_models / "empty"), "--prompt", "hi"], "no config.json"),
        (["--model", str(bad_models / "no-weights"), "--prompt-ids", "1"], "no weights"),
        (["--model", str(bad_models / "gpt2"), "--prompt", "hi"], "unsupported architecture"),
        (["--model", str(tiny_llama_dir), "--prompt-ids", "1,x"], "comma-separated integers"),
        (
            ["--model", str(tiny_llama_dir), "--prompt-ids", ",".join(["1"] * 600)],
            "context limit is 512",
        ),
        (["--model", str(tiny_llama_dir), "--prompt", "hi"], "no tokenizer.json"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["--prompt", "hi", "--device", "gpu"], "unknown device 'gpu'"),
        (["--prompt", "hi", "--decode-burst", "0"], "decode_burst must be positive"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--prompt", "hi", "--device", "cuda"], "torch sees no CUDA device"))
    # NOTE: in this process, where each case as a process of its own imported torch (seconds
    # of CPU apiece); the two process cases below keep the real exit and stderr honest.
    threads = torch.get_num_threads()
    try:
        for args, fragment in cases:
            code = _main_exit_code(["generate", *args])
            assert_clean_error(code, capsys.readouterr().err, fragment)
    finally:
        torch.set_num_threads(threads)


def test_bad_input_as_a_process_exits_2_with_one_line(tiny_llama_dir) -> None:
    """Before a model loads and after one did: the real process's exit code and stderr."""
    cases = [
        (["--model", "no-such-model", "--prompt", "hi"], "unknown model"),
        (["--model", str(tiny_llama_dir), "--prompt-ids", "1,2,999"], "outside the vocabulary"),
    ]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: kvstack("generate", *case[0]), cases))
    for (_, fragment), result in zip(cases, results):
        assert_clean_error(result.returncode, result.stderr, fragment)


def _main_exit_code(argv: list[str]) -> int:
    """`kvstack` run in this process: its exit code (argparse's own errors exit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)
