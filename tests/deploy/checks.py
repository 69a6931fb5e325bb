"""What deploy/k8s must agree on with the code: each kvstack container's command line
parses with `kvstack`'s own parser, its probes and scrape annotation name a port it
listens on and a path it serves, each variable it sets is one the code reads, each
secret key is a file `kvstack auth init` writes, its resources match its --threads and
memory settings, and its grace period covers the drain. `problems` lists every
disagreement, one line each ("" when none)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from services.cli.main import build_parser
from services.settings import SETTINGS
from shared import subjects
from shared.auth.deployment import API_KEY, DATA_TOKEN
from shared.auth.roles import ROLES
from shared.conductor.settings import SCHEDULING_SETTINGS
from tests.deploy.manifests import ROOT, containers

# NOTE: after --drain-timeout, shared/runtime/service.py bounds the hand-off (10 s), discovery's
# stop (5 s) and the service's stop (10 s); the grace period must cover all of them.
AFTER_DRAIN_S = 25
SECRET = "kvstack"  # made from `kvstack auth init`'s files (docs/kubernetes.md)
TORCH_SERVICES = ("prefill", "decode", "attention-worker")
SAMPLE_POD_IP = "10.0.0.7"
ENV_REF = re.compile(r"\$\((\w+)\)")
# NOTE: a read of the environment, or the constant naming one (kernels/__init__.py)
CODE_ENV = re.compile(r'(?:environ(?:\.get)?\(|environ\[|getenv\(|_ENV = )"([A-Z0-9_]+)"')
PRESTOP_WAIT = re.compile(r"^sleep (\d+);")
MEMORY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@dataclass(frozen=True)
class Served:
    """The HTTP paths each service answers (GET), found on the running code."""

    common: frozenset[str]  # every service's (shared/runtime/service.py)
    own: dict[str, frozenset[str]]  # a service's own routes besides, by command

    def paths(self, service: str) -> frozenset[str]:
        return self.common | self.own.get(service, frozenset())


@dataclass(frozen=True)
class Container:
    workload: dict
    spec: dict

    @property
    def label(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}"

    @property
    def pod(self) -> dict:
        return self.workload["spec"]["template"]

    @property
    def env(self) -> dict[str, dict]:
        return {e["name"]: e for e in self.spec.get("env", [])}

    @property
    def words(self) -> list[str]:
        return [*self.spec.get("command", []), *self.spec.get("args", [])]

    def expand(self, word: str) -> str:
        """`word` as the kubelet passes it: $(VAR) from the container's env, the downward
        API's pod name and IP given sample values (a StatefulSet's first pod)."""
        return ENV_REF.sub(lambda m: self._value(m.group(1)), word)

    def _value(self, name: str) -> str:
        field = self.env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.name":
            return f"{self.workload['metadata']['name']}-0"
        if field == "status.podIP":
            return SAMPLE_POD_IP
        return str(self.env.get(name, {}).get("value", f"$({name})"))

    def port(self, port: int | str) -> int | None:
        """A probe's port, by number or by the name of one of the container's ports."""
        if isinstance(port, int):
            return port
        named = {p.get("name"): p["containerPort"] for p in self.spec.get("ports", [])}
        return named.get(port)


def problems(docs: list[dict], served: Served, secret_files: set[str]) -> list[str]:
    found: list[str] = config_map_problems(docs)
    for workload, spec in containers(docs):
        container = Container(workload, spec)
        if container.words[:1] == ["kvstack"]:
            found += kvstack_problems(container, served, secret_files)
    return found


def kvstack_problems(container: Container, served: Served, secret_files: set[str]) -> list[str]:
    args, error = parse(container)
    if args is None:
        return [f"{container.label}: `{' '.join(container.words)}`: {error}"]
    service = args.command
    found = [
        *worker_id_problems(args),
        *probe_problems(container, args.http_port, served.paths(service)),
        *scrape_problems(container, args.http_port, served.paths(service)),
        *env_problems(container),
        *secret_problems(container, service, secret_files),
        *resource_problems(container, service, args),
        *grace_problems(container, args.drain_timeout),
    ]
    return [f"{container.label}: {problem}" for problem in found]


def parse(container: Container) -> tuple[argparse.Namespace | None, str]:
    """The container's command line parsed by `kvstack`'s parser, or None and its error."""
    words = [container.expand(word) for word in container.words[1:]]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(words), ""
    except SystemExit:
        return None, stderr.getvalue().strip().splitlines()[-1]


def worker_id_problems(args: argparse.Namespace) -> list[str]:
    ids = [args.worker_id] if args.worker_id else []
    ids += [i for i in getattr(args, "attention_workers", "").split(",") if i]
    return [f"worker id {i!r} is no NATS subject token" for i in ids if not valid_id(i)]


def valid_id(worker_id: str) -> bool:
    return subjects.WORKER_ID.fullmatch(worker_id) is not None


def probe_problems(container: Container, http_port: int, paths: frozenset[str]) -> list[str]:
    found = []
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container.spec.get(kind, {}).get("httpGet")
        if get is None:
            found += [f"no {kind}"] if kind != "startupProbe" else []
            continue
        if container.port(get["port"]) != http_port:
            found.append(f"{kind} port {get['port']} is not --http-port {http_port}")
        if get["path"] not in paths:
            found.append(f"{kind} path {get['path']} is not served ({sorted(paths)})")
    return found


def scrape_problems(container: Container, http_port: int, paths: frozenset[str]) -> list[str]:
    notes = container.pod["metadata"].get("annotations", {})
    if notes.get("prometheus.io/scrape") != "true":
        return ["no prometheus.io/scrape annotation"]
    found = []
    if notes.get("prometheus.io/port") != str(http_port):
        found.append(f"prometheus.io/port {notes.get('prometheus.io/port')} != {http_port}")
    if notes.get("prometheus.io/path", "/metrics") not in paths:
        found.append(f"prometheus.io/path {notes.get('prometheus.io/path')} is not served")
    return found


def env_problems(container: Container) -> list[str]:
    """Every variable is one kvstack reads, or one the command line refers to as $(VAR)."""
    referenced = {m for word in container.words for m in ENV_REF.findall(word)}
    return [
        f"env {name}: kvstack does not read it"
        for name in container.env
        if name not in code_env_names() and name not in referenced
    ]


def config_map_problems(docs: list[dict]) -> list[str]:
    """Every ConfigMap containers take their environment from exists (or is optional) and
    holds variables kvstack reads, with values their settings accept."""
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d.get("kind") == "ConfigMap"}
    refs = [s.get("configMapRef", {}) for _, c in containers(docs) for s in c.get("envFrom", [])]
    found = [
        f"no ConfigMap {r['name']}" for r in refs if r["name"] not in maps and not r.get("optional")
    ]
    for name in sorted({r["name"] for r in refs} & maps.keys()):
        found += [f"ConfigMap {name}: {p}" for p in env_value_problems(maps[name])]
    return found


def env_value_problems(data: dict[str, str]) -> list[str]:
    by_env = {s.env: s for s in SETTINGS.values() if s.env}
    found = [f"{key}: kvstack does not read it" for key in data if key not in code_env_names()]
    for key, value in data.items():
        choices = getattr(by_env.get(key), "choices", None)
        if choices and value not in choices:
            found.append(f"{key}={value} is not one of {', '.join(choices)}")
    return found


@functools.cache
def code_env_names() -> frozenset[str]:
    """The variables kvstack reads: each setting's, and those its code reads itself."""
    names = {s.env for s in [*SETTINGS.values(), *SCHEDULING_SETTINGS.values()] if s.env}
    for folder in ("shared", "services"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(CODE_ENV.findall(path.read_text()))
    return frozenset(names)


def secret_problems(container: Container, service: str, secret_files: set[str]) -> list[str]:
    """Each key is a file `kvstack auth init` writes (or the API key); the credentials and
    the data token the variables name are the mounted files of this role."""
    mounted = mounted_secrets(container)
    keys = [*mounted.values(), *env_secret_keys(container)]
    found = [f"secret key {key}: no file of kvstack auth init" for key in keys]
    found = [problem for problem, key in zip(found, keys, strict=True) if key not in secret_files]
    wanted = {"KVSTACK_NATS_CREDS": f"{service}.creds", "KVSTACK_DATA_TOKEN_FILE": DATA_TOKEN}
    for name, key in wanted.items():
        value = container.env.get(name, {}).get("value")
        if value is not None and mounted.get(value) != key:
            found.append(f"env {name}={value} is not the mounted secret key {key}")
    if service not in ROLES:
        found.append(f"no NATS role {service}")
    return found


def mounted_secrets(container: Container) -> dict[str, str]:
    """{path in the container: secret key} for every item of the Secret it mounts."""
    volumes = {v["name"]: v for v in container.pod["spec"].get("volumes", [])}
    files = {}
    for mount in container.spec.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret", {})
        for item in secret.get("items", []) if secret.get("secretName") == SECRET else []:
            files[f"{mount['mountPath']}/{item['path']}"] = item["key"]
    return files


def env_secret_keys(container: Container) -> Iterable[str]:
    for entry in container.env.values():
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            yield ref["key"] if ref["name"] == SECRET else f"{ref['name']}/{ref['key']}"


def resource_problems(container: Container, service: str, args: argparse.Namespace) -> list[str]:
    resources = container.spec.get("resources", {})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    found = []
    if service in TORCH_SERVICES:
        threads = args.threads
        cpus = {cpu(requests.get("cpu", "0")), cpu(limits.get("cpu", "0"))}
        if threads is None or cpus != {threads}:
            found.append(f"cpu requests/limits {sorted(cpus)} are not --threads {threads}")
    held_gib = getattr(args, "kv_cache_gib", 0) if service in TORCH_SERVICES else 0
    held_gib = args.dram_gib if service == "kvstore" else held_gib
    if memory(requests.get("memory", "0")) < held_gib * 2**30:
        found.append(f"memory request {requests.get('memory')} holds no {held_gib} GiB")
    return found


def cpu(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def memory(quantity: str | int) -> float:
    text = str(quantity)
    unit = MEMORY_UNITS.get(text[-2:])
    return float(text[:-2]) * unit if unit else float(text)


def grace_problems(container: Container, drain_timeout: float) -> list[str]:
    hook = container.spec.get("lifecycle", {}).get("preStop", {}).get("exec", {})
    if not hook:
        return ["no preStop hook"]
    script = hook["command"][-1]
    wait = PRESTOP_WAIT.match(script)
    needed = (int(wait.group(1)) if wait else 0) + drain_timeout + AFTER_DRAIN_S
    grace = container.pod["spec"].get("terminationGracePeriodSeconds", 30)
    if "kill -TERM 1" not in script:
        return [f"the preStop hook {script!r} does not start the drain (SIGTERM)"]
    return [] if grace >= needed else [f"grace {grace}s < {needed:g}s the drain may take"]


def auth_init_files(directory: Path) -> set[str]:
    """The secret files `kvstack auth init --dir directory` wrote, plus the API key."""
    files = {p.name for p in directory.iterdir() if p.is_file()}
    return files | {API_KEY}
