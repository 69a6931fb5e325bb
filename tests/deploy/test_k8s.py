"""deploy/k8s agrees with the code it runs, checked without a cluster (docs/kubernetes.md):
rendered as kustomize would (PyYAML here; `kubectl kustomize` too where kubectl is
installed), every kvstack container is checked by `checks.problems` against the real
parsers, the paths the real services serve, the variables the code reads and the files
`kvstack auth init` writes; NATS's config is checked by nats-server itself and Mooncake
Store's master is started with the manifest's own flags."""

from __future__ import annotations

import asyncio
import copy
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from services.cli.main import main as kvstack
from services.conductor.service import ConductorConfig, ConductorService
from services.gateway.service import GatewayConfig, GatewayService
from shared.costmodel import roofline
from shared.runtime.nats_server import nats_server_binary
from shared.runtime.service import Service, ServiceConfig, _start_http
from tests.deploy import checks
from tests.deploy.manifests import K8S, containers, find, kubectl, load, render, workloads

ALL = K8S / "overlays" / "all"
COST = roofline("llama3-70b", "a800")
KVSTACK_SERVICES = ("gateway", "conductor", "prefill", "decode", "kvstore", "attention-worker")


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return load(ALL)


@pytest.fixture(scope="module")
def secret_files(tmp_path_factory) -> set[str]:
    directory = tmp_path_factory.mktemp("auth") / "secrets"
    assert kvstack(["auth", "init", "--dir", str(directory)]) == 0
    return checks.auth_init_files(directory)


@pytest.fixture(scope="module")
def served(docs, smollm2_dir) -> checks.Served:
    """What a running service answers (not 404) among the paths the manifests name, and
    the gateway's and the conductor's own GET routes."""
    named = {path for _, c in containers(docs) for path in probe_paths(c)} | {"/metrics"}
    own = {
        "gateway": GatewayService(GatewayConfig(http_port=0)).routes(),
        "conductor": ConductorService(ConductorConfig(lease_ttl=1.0), COST).routes(),
    }
    return checks.Served(
        frozenset(asyncio.run(answered(named))),
        {
            name: frozenset(r.path for r in routes if r.method == "GET")
            for name, routes in own.items()
        },
    )


async def answered(paths: set[str]) -> set[str]:
    """The paths a service's HTTP (shared/runtime/service.py) answers with anything but 404."""
    service = Service(ServiceConfig(http_port=0))
    runner = await _start_http(service)
    try:
        async with aiohttp.ClientSession(f"http://{service.http_addr}") as session:
            return {path for path in paths if await _found(session, path)}
    finally:
        await runner.cleanup()


async def _found(session: aiohttp.ClientSession, path: str) -> bool:
    async with session.get(path) as reply:
        return reply.status != 404


def probe_paths(container: dict) -> list[str]:
    probes = (container.get(k, {}) for k in ("readinessProbe", "livenessProbe"))
    return [p["httpGet"]["path"] for p in probes if "httpGet" in p]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as e:
        return e.code


def test_every_service_nats_and_mooncake_master_are_there(docs) -> None:
    commands = {tuple(c.get("command", [])[:2]) for _, c in containers(docs)}
    assert {("kvstack", name) for name in KVSTACK_SERVICES} <= commands
    assert find(docs, "StatefulSet", "nats")["spec"]["replicas"] == 3
    assert find(docs, "StatefulSet", "mooncake-master")


def test_every_kvstack_container_agrees_with_the_code(docs, served, secret_files) -> None:
    assert checks.problems(docs, served, secret_files) == []


@pytest.mark.skipif(kubectl() is None, reason="kubectl is not installed: no kustomize render")
def test_kubectl_kustomize_renders_what_the_check_reads(docs, served, secret_files) -> None:
    rendered = render(ALL)
    assert checks.problems(rendered, served, secret_files) == []
    assert names(rendered) == names(docs)
    assert by_workload(rendered) == by_workload(docs)
    assert names(render(K8S / "base")) == names(load(K8S / "base"))


def names(docs: list[dict]) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in docs)


def by_workload(docs: list[dict]) -> dict[str, dict]:
    return {w["metadata"]["name"]: c for w, c in containers(docs)}


def container_of(docs: list[dict], workload: str) -> dict:
    [container] = [c for w, c in containers(docs) if w["metadata"]["name"] == workload]
    return container


def break_flag(c: dict) -> None:
    c["args"] = [a.replace("--threads=", "--thread-count=") for a in c["args"]]


def break_probe(c: dict) -> None:
    c["livenessProbe"]["httpGet"]["port"] = 9101


def break_path(c: dict) -> None:
    c["readinessProbe"]["httpGet"]["path"] = "/readyz"  # served by none


def break_env(c: dict) -> None:
    c["env"].append({"name": "KVSTACK_NATS_URL", "value": "nats://nats:4222"})


def break_secret(c: dict) -> None:
    c["env"][-2]["value"] = "/run/secrets/kvstack/decode.creds"


def break_cpu(c: dict) -> None:
    c["resources"]["limits"]["cpu"] = "4"


@pytest.mark.parametrize(
    ("breaking", "complaint"),
    [
        (break_flag, "unrecognized arguments: --thread-count=2"),
        (break_probe, "livenessProbe port 9101 is not --http-port 9100"),
        (break_path, "readinessProbe path /readyz is not served"),
        (break_env, "env KVSTACK_NATS_URL: kvstack does not read it"),
        (break_secret, "KVSTACK_NATS_CREDS=/run/secrets/kvstack/decode.creds is not"),
        (break_cpu, "are not --threads 2"),
    ],
)
def test_a_broken_manifest_fails_the_check(docs, served, secret_files, breaking, complaint) -> None:
    broken = copy.deepcopy(docs)
    breaking(container_of(broken, "prefill"))
    [problem] = checks.problems(broken, served, secret_files)
    assert problem.startswith("Deployment/prefill: ") and complaint in problem


def test_a_grace_period_shorter_than_the_drain_fails_the_check(docs, served, secret_files) -> None:
    broken = copy.deepcopy(docs)
    find(broken, "Deployment", "gateway")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ] = 30
    [problem] = checks.problems(broken, served, secret_files)
    assert "grace 30s < 60s" in problem  # the hook's 5 s, --drain-timeout 30, 25 after


def test_conductors_kvstores_and_nats_have_disruption_budgets(docs) -> None:
    for name in ("conductor", "kvstore", "nats"):
        budget = find(docs, "PodDisruptionBudget", name)["spec"]
        [workload] = [w for w in workloads(docs) if w["metadata"]["name"] == name]
        assert budget["selector"] == workload["spec"]["selector"]
        assert budget["maxUnavailable"] == 1


def test_attention_workers_named_by_decode_are_pods_of_the_stateful_set(docs) -> None:
    args = container_of(docs, "decode-offload")["args"]
    [group] = [a.partition("=")[2] for a in args if a.startswith("--attention-workers=")]
    workers = find(docs, "StatefulSet", "attention-worker")["spec"]["replicas"]
    assert set(group.split(",")) <= {f"attention-worker-{i}" for i in range(workers)}


def test_services_dial_nats_where_its_service_listens(docs) -> None:
    [port] = [p["port"] for p in find(docs, "Service", "nats")["spec"]["ports"]]
    for _, container in containers(docs):
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if container.get("command", [""])[0] == "kvstack":
            assert env["KVSTACK_NATS"] == f"nats://nats:{port}"


def test_nats_server_accepts_its_config_with_kvstack_auth_init_users(
    docs, secret_files, tmp_path
) -> None:
    """The node's config as the pod assembles it: the ConfigMap's, the cluster block the
    init container writes (its own script, run here) and the Secret's users."""
    nats = find(docs, "StatefulSet", "nats")
    pod = nats["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    auth = [v["secret"] for v in pod["volumes"] if "secret" in v]
    assert {item["key"] for a in auth for item in a["items"]} <= secret_files
    assert kvstack(["auth", "init", "--dir", str(tmp_path / "auth")]) == 0
    (tmp_path / "cluster").mkdir()
    subprocess.run([sys.executable, *init["command"][1:]], cwd=tmp_path, check=True, timeout=30)
    cluster = (tmp_path / "cluster" / "cluster.conf").read_text()
    name = nats["spec"]["serviceName"]
    assert all(f"@nats-{i}.{name}:6222" in cluster for i in range(nats["spec"]["replicas"]))
    config = find(docs, "ConfigMap", "nats-config")["data"]["nats.conf"]
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "nats.conf").write_text(config)
    [hook] = [
        c["lifecycle"]["preStop"]["exec"]["command"] for w, c in containers(docs) if w is nats
    ]
    assert f"ldm={config.split('pid_file: ')[1].split()[0]}" in hook  # lame duck finds the pid
    checked = subprocess.run(
        [nats_server_binary(), "-c", str(tmp_path / "conf" / "nats.conf"), "-t"],
        capture_output=True,
        text=True,
        env={"POD_NAME": "nats-0"},
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr


def mooncake_master() -> str | None:
    """The wheel's mooncake_master: beside this Python (a venv), else on PATH."""
    beside_python = Path(sys.executable).parent / "mooncake_master"
    return str(beside_python) if beside_python.exists() else shutil.which("mooncake_master")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(
    mooncake_master() is None,
    reason="mooncake_master is not installed (pip install mooncake-transfer-engine-non-cuda)",
)
def test_mooncake_master_takes_its_flags_and_serves_its_probes(docs) -> None:
    container = container_of(docs, "mooncake-master")
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])
    usage = subprocess.run([mooncake_master(), "--help"], capture_output=True, text=True).stdout
    assert all(f"  -{flag} (" in usage for flag in flags), usage
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(flags["metrics_port"])
    notes = find(docs, "StatefulSet", "mooncake-master")["spec"]["template"]["metadata"]
    assert notes["annotations"]["prometheus.io/port"] == flags["metrics_port"]
    paths = [*probe_paths(container), notes["annotations"]["prometheus.io/path"]]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
    here = {k: str(free_port()) if k.endswith("port") else v for k, v in flags.items()}
    with subprocess.Popen(
        [mooncake_master(), *(f"--{k}={v}" for k, v in here.items())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as master:
        try:
            url = f"http://127.0.0.1:{here['metrics_port']}"
            assert [answer(url + path) for path in paths] == [200] * len(paths)
        finally:
            master.terminate()


def answer(url: str, within: float = 10.0) -> int:
    """The status of GET `url` once something listens there."""
    deadline = time.monotonic() + within
    while True:
        try:
            return status(url)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_wrong_kv_pool_setting_fails_the_check(docs, served, secret_files) -> None:
    broken = copy.deepcopy(docs)
    data = find(broken, "ConfigMap", "kvstack-kv-pool")["data"]
    data["KVSTACK_KV_POOL"] = "redis"
    data["KVSTACK_MOONCAKE_URL"] = "mooncake-master:50051"
    assert checks.problems(broken, served, secret_files) == [
        "ConfigMap kvstack-kv-pool: KVSTACK_MOONCAKE_URL: kvstack does not read it",
        "ConfigMap kvstack-kv-pool: KVSTACK_KV_POOL=redis is not one of kvstore, mooncake",
    ]
