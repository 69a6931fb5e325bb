"""compose.yaml is valid, and the stack it describes is the stack that serves requests.

Without a Docker engine: each kvstack service's own `command` from the file is started as
a local process against a local nats-server run with the file's own arguments and the
secrets `kvstack auth init` makes, with only what a container would differ in replaced:
host names, ports and where the secrets are mounted. The container suite (tests/compose,
`make compose-test`) runs the file itself on a Docker engine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import openai
import yaml

from services.cli.main import build_parser
from services.cli.main import main as kvstack
from services.stack.stack import Stack, StackConfig
from shared.runtime.nats_server import NatsServer
from tests.e2e.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
KVSTACK_SERVICES = ("conductor", "kvstore", "prefill", "decode", "gateway")


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    schema = json.loads((ROOT / "tests" / "compose_spec.json").read_text())
    jsonschema.Draft201909Validator(schema).validate(compose())


def test_compose_has_nats_every_service_and_prometheus() -> None:
    services = compose()["services"]
    assert {"nats", "prometheus", *KVSTACK_SERVICES} <= set(services)
    assert "-js" in services["nats"]["command"]
    assert services["grafana"]["profiles"] == ["grafana"]  # its image needs a registry
    for name in KVSTACK_SERVICES:
        assert services[name]["command"][:2] == ["kvstack", name]


def mounts(service: dict) -> dict[str, Path]:
    """Where each file or folder of the repository a service mounts goes."""
    pairs = [v.split(":")[:2] for v in service.get("volumes", []) if v.startswith("./")]
    return {target: ROOT / source for source, target in pairs}


def test_prometheus_scrapes_every_kvstack_service_at_its_metrics_port() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]
    [config_flag] = [a for a in prometheus["command"] if a.startswith("--config.file=")]
    config = yaml.safe_load(mounts(prometheus)[config_flag.partition("=")[2]].read_text())
    [job] = config["scrape_configs"]
    [dns] = job["dns_sd_configs"]
    scraped = {f"{name}:{dns['port']}" for name in dns["names"]}
    scraped |= {t for c in job["static_configs"] for t in c["targets"]}
    for name, service in services.items():
        command = service.get("command", [])
        if command[:1] == ["kvstack"]:
            port = command[command.index("--http-port") + 1]
            assert f"{name}:{port}" in scraped, name


def test_grafana_is_provisioned_with_the_dashboard_and_its_datasource() -> None:
    grafana = mounts(compose()["services"]["grafana"])
    provisioning = grafana["/etc/grafana/provisioning"]
    [datasource] = yaml.safe_load((provisioning / "datasources" / "kvstack.yml").read_text())[
        "datasources"
    ]
    [provider] = yaml.safe_load((provisioning / "dashboards" / "kvstack.yml").read_text())[
        "providers"
    ]
    folder = grafana[provider["options"]["path"]]
    dashboard = json.loads((folder / "kvstack.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {datasource["uid"]}
    assert datasource["url"] == "http://prometheus:9090"


def test_attention_workers_run_behind_the_offload_profile(tmp_path) -> None:
    services = compose()["services"]
    worker, decode = services["attention-worker"], services["decode-offload"]
    assert worker["profiles"] == decode["profiles"] == ["offload"]
    worker_args = build_parser().parse_args(worker["command"][1:])
    decode_args = build_parser().parse_args(decode["command"][1:])
    assert decode_args.attention_workers == worker_args.worker_id
    secrets = tmp_path / "secrets"
    assert kvstack(["auth", "init", "--dir", str(secrets)]) == 0
    for service in (worker, decode):
        creds = service["environment"]["KVSTACK_NATS_CREDS"]
        assert (secrets / Path(creds).name).is_file()
        assert Path(creds).name in service["secrets"]


def local_command(name: str, service: dict, tmp_path) -> tuple[list[str], int]:
    """The service's compose command with container ports and paths swapped for local ones."""
    args, http_port = list(service["command"][1:]), 0
    if "--disk-dir" in args:
        args[args.index("--disk-dir") + 1] = str(tmp_path / f"{name}-ssd")
    for flag in ("--http-port", "--data-port"):
        if flag in args:
            port = free_port()
            args[args.index(flag) + 1] = str(port)
            http_port = port if flag == "--http-port" else http_port
    if "--advertise-data-addr" in " ".join(service.get("entrypoint", [])):  # `hostname -i`
        args += ["--advertise-data-addr", f"127.0.0.1:{args[args.index('--data-port') + 1]}"]
    return args, http_port


def test_compose_has_no_default_secret_and_says_how_to_make_them() -> None:
    text = (ROOT / "compose.yaml").read_text()
    assert "change-me" not in text and not re.search(r"TOKEN[^\n]*:-", text)
    spec = compose()
    for name in KVSTACK_SERVICES:
        service = spec["services"][name]
        assert service["environment"]["KVSTACK_NATS_CREDS"] == f"/run/secrets/{name}.creds"
        assert f"{name}.creds" in service["secrets"]
    for secret in spec["secrets"].values():  # ${VAR:?message}: compose stops with it
        assert re.match(r"\$\{KVSTACK_SECRETS:\?[^}]*kvstack auth init[^}]*\}/", secret["file"])
    assert spec["services"]["nats"]["command"][-2:] == ["-c", "/run/secrets/nats-auth.conf"]


def environment(service: dict, secrets: Path) -> dict[str, str]:
    """The service's environment with secrets where `kvstack auth init` wrote them; NATS
    is the local server."""
    env = {
        k: str(v).replace("/run/secrets", str(secrets))
        for k, v in service.get("environment", {}).items()
    }
    return {k: v for k, v in env.items() if k != "KVSTACK_NATS"}


def nats_server(spec: dict, tmp_path: Path, secrets: Path) -> NatsServer:
    """nats-server with the config compose gives it (its other flags are the defaults')."""
    command = spec["services"]["nats"]["command"]
    config = command[command.index("-c") + 1].replace("/run/secrets", str(secrets))
    return NatsServer(tmp_path / "nats", config=Path(config))


def test_the_stack_compose_describes_serves_a_chat_request(tmp_path, smollm2_dir) -> None:
    spec, secrets = compose(), tmp_path / "secrets"
    assert kvstack(["auth", "init", "--dir", str(secrets)]) == 0
    nats = nats_server(spec, tmp_path, secrets)
    config = dict(nats_url=nats.url, log_dir=tmp_path, secrets_dir=secrets)
    stack = Stack(StackConfig(**config, ready_timeout=240))
    stack.nats_url = nats.url
    try:
        for name in KVSTACK_SERVICES:
            args, http_port = local_command(name, spec["services"][name], tmp_path)
            stack.spawn(name, args, environment(spec["services"][name], secrets))
            if name == "gateway":
                stack.config = StackConfig(**config, port=http_port)
        stack.wait_ready()
        key = (secrets / "api-key").read_text().strip()  # compose hands it to the gateway
        client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0)
        result = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            max_tokens=30,
            temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in result.choices[0].message.content
    finally:
        stack.stop()
        nats.stop()


def test_the_nats_cluster_profile_runs_three_nodes_on_the_config_auth_init_writes(
    tmp_path,
) -> None:
    services = compose()["services"]
    nodes = {name: s for name, s in services.items() if s.get("profiles") == ["nats-cluster"]}
    assert sorted(nodes) == ["nats-1", "nats-2", "nats-3"]
    secrets = tmp_path / "secrets"
    assert kvstack(["auth", "init", "--dir", str(secrets)]) == 0
    config = (secrets / "nats-cluster.conf").read_text()
    password = (secrets / "nats-route").read_text().strip()
    for name, node in nodes.items():
        command = node["command"]
        assert command[command.index("-n") + 1] == name  # unique names: JetStream's quorum
        assert command[-2:] == ["-c", "/run/secrets/nats-cluster.conf"]
        assert {"nats-auth.conf", "nats-cluster.conf"} <= set(node["secrets"])  # it includes
        assert f"nats-route://kvstack-route:{password}@{name}:6222" in config
