"""deploy/k8s rendered without a cluster: by `kubectl kustomize` where kubectl is installed,
else by reading the kustomizations' `resources` and `components` with PyYAML. The base
and its components use nothing else (no patches, generators or transformers), so both
give the same objects; `load` refuses a kustomization that uses more."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
PLAIN_KEYS = {"apiVersion", "kind", "resources", "components"}


def load(directory: Path) -> list[dict]:
    """The objects the kustomization in `directory` renders to."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    extra = set(kustomization) - PLAIN_KEYS
    if extra:
        raise ValueError(f"{directory}: {sorted(extra)}: kubectl kustomize renders these")
    docs: list[dict] = []
    for entry in kustomization.get("resources", []) + kustomization.get("components", []):
        path = (directory / entry).resolve()
        docs += load(path) if path.is_dir() else _documents(path)
    return docs


def _documents(path: Path) -> list[dict]:
    return documents(path.read_text())


def documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(directory: Path) -> list[dict]:
    """`kubectl kustomize directory`, parsed."""
    out = subprocess.run(
        [kubectl() or "kubectl", "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return documents(out)


def find(docs: list[dict], kind: str, name: str) -> dict:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def workloads(docs: list[dict]) -> Iterator[dict]:
    return (d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))


def containers(docs: list[dict]) -> Iterator[tuple[dict, dict]]:
    """(workload, container) for every container of every workload."""
    for workload in workloads(docs):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            yield workload, container
