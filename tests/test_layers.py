"""The layers hold: `lint-imports` keeps pyproject.toml's contracts, the contract modules
load with nothing heavier than the standard library and orjson, and the linter does fail
on a tree that breaks a contract (so a green run means something)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_MODULES = (
    "shared.messages",
    "shared.subjects",
    "shared.codec",
    "shared.errors",
    "shared.sampling_params",
    "shared.logprob",
    "shared.kvblocks",
    "shared.structured.spec",
)
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; "
LINT_IMPORTS += "sys.exit(lint_imports_command())"
# What a fresh interpreter lists as loaded, beyond the standard library, after importing
# the contract modules; printed by the child, one name per line.
LOADED = """
import importlib, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
loaded = set(sys.modules) - before
print("\\n".join(sorted(m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names)))
"""


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_lint_imports_keeps_every_contract() -> None:
    result = run_python("-c", LINT_IMPORTS, "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_contract_modules_load_only_the_standard_library_and_orjson() -> None:
    result = run_python("-c", LOADED, *CONTRACT_MODULES)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "torch" not in loaded and "numpy" not in loaded
    heavier = {m for m in loaded if m.split(".")[0] != "orjson"} - {
        "shared",
        "shared.engine",
        "shared.structured",
        *CONTRACT_MODULES,
    }
    assert not heavier, heavier


def test_lint_imports_fails_on_a_broken_contract(tmp_path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text(
        "[tool.importlinter]\n"
        'root_packages = ["shared"]\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "messages without the codec (they use it: broken)"\n'
        'type = "forbidden"\n'
        'source_modules = ["shared.messages"]\n'
        'forbidden_modules = ["shared.codec"]\n'
    )
    result = run_python("-c", LINT_IMPORTS, "--no-cache", str(config))
    assert result.returncode != 0
    assert "messages without the codec (they use it: broken) BROKEN" in result.stdout


def test_no_two_modules_import_each_other() -> None:
    # import-linter checks cycles between the subpackages of shared; this checks every
    # module of each top-level package (a cycle through function-level imports counts too).
    import grimp

    for package in ("shared", "services", "loadgen", "bench"):
        graph = grimp.build_graph(package)
        cycles = {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if graph.chain_exists(importer=imported, imported=module)
        }
        assert not cycles, f"{package}: {sorted(cycles)}"
