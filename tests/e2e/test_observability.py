"""Every service's /metrics, scraped over HTTP from a real stack at the fixed ports
`kvstack up` gives them (through the Prometheus config it writes): names follow
Prometheus's conventions, each is documented in docs/observability.md, and the Grafana
dashboard queries only metrics that exist.

One mock stack (no model computes; the rest runs for real) with a kvstore, plus an
attention worker, serves a few requests that share a prefix, so that histograms and the
prefix-cache counters have seen traffic before the scrape.
"""

from __future__ import annotations

import json
import random
import re
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.stack import prometheus_config
from services.stack.ports import Listener, PortLayout, check_free
from shared.engine.mock import MockSpec
from shared.errors import KvstackError
from tests.e2e.conftest import free_port, running_stack

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "kvstack.json"
DOC = ROOT / "docs" / "observability.md"
SPEC = MockSpec("llama3-70b", "a800", 1e-3)
ATTENTION = "attention-9"

HISTOGRAM_UNITS = ("_seconds", "_bytes", "_ratio", "_tokens")
NOT_BASE_UNITS = {"ms", "milliseconds", "us", "microseconds", "minutes", "hours", "perc"}
NOT_BASE_UNITS |= {"percent", "kb", "mb", "gb", "kib", "mib", "gib", "kilobytes", "megabytes"}
TIME_WORDS = {"latency", "time", "duration", "ttft", "tpot", "itl"}
SIZE_WORDS = {"bytes", "memory", "size"}


def free_base() -> int:
    """A base port whose slots for this stack's shape are all free now."""
    for _ in range(20):
        base = random.randrange(20000, 60000, 10)
        layout = PortLayout(base)
        ports = [layout.port(s) for s in ("up", "conductor", "kvstore", "prefill", "decode")]
        try:
            check_free([Listener("", "", "127.0.0.1", p) for p in [*ports, base + 300]])
        except KvstackError:
            continue
        return base
    raise RuntimeError("no free base port found")


@pytest.fixture(scope="module")
def scraped(tmp_path_factory, smollm2_dir) -> dict[str, str]:
    """worker id -> its /metrics text, for every target of the written Prometheus config."""
    base, logs = free_base(), tmp_path_factory.mktemp("observability")
    with running_stack(
        logs,
        port=free_port(),
        base_port=base,
        metrics_port=base,
        num_kvstore=1,
        mock=SPEC,
        kvstore_args=("--dram-gib", "0.1"),
        worker_args=("--threads", "1", "--kv-cache-gib", "0.02"),
        gateway_args=(),
        before_ready=lambda stack: stack.spawn(
            ATTENTION,
            ["attention-worker", "--worker-id", ATTENTION, "--http-port", str(base + 300)],
        ),
    ) as stack:
        serve_requests(stack.api_url)
        config_path = logs / "prometheus.yml"
        listeners = [
            *stack.listeners(),
            Listener(ATTENTION, "attention-worker", "127.0.0.1", base + 300),
        ]
        prometheus_config.write(config_path, listeners)
        yield {name: scrape(target) for name, target in targets(config_path).items()}


def serve_requests(api_url: str) -> None:
    client = openai.OpenAI(base_url=f"{api_url}/v1", api_key="none", max_retries=0)
    prefix = [random.Random(7).randrange(100, 49000) for _ in range(200)]
    for i in range(4):
        client.completions.create(
            model="SmolLM2-135M-Instruct",
            prompt=[*prefix, 100 + i],
            max_tokens=4,
            extra_body={"ignore_eos": True},
        )


def targets(config_path: Path) -> dict[str, str]:
    config = json.loads(config_path.read_text().partition("\n")[2])
    [job] = config["scrape_configs"]
    return {c["labels"]["worker_id"]: c["targets"][0] for c in job["static_configs"]}


def scrape(target: str) -> str:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def declared(text: str) -> dict[str, str]:
    """Each metric's name as exposed (a counter's with `_total`) -> its type."""
    rows = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)
    return dict(rows)


def exposed(scraped: dict[str, str]) -> dict[str, str]:
    return {name: kind for text in scraped.values() for name, kind in declared(text).items()}


def convention_problems(name: str, kind: str) -> list[str]:
    bare = name.removesuffix("_total")
    words = set(bare.split("_"))
    checks = {
        "a counter's name ends in _total": kind != "counter" or name.endswith("_total"),
        "only a counter's name ends in _total": kind == "counter" or not name.endswith("_total"),
        "a histogram's name ends in its unit": kind != "histogram"
        or name.endswith(HISTOGRAM_UNITS),
        "units are base units (seconds, bytes, ratios)": not words & NOT_BASE_UNITS,
        "a time is in _seconds": not words & TIME_WORDS or bare.endswith("_seconds"),
        "a size is in _bytes": not words & SIZE_WORDS or bare.endswith("_bytes"),
        "kvstack's own names start with kvstack_": name.startswith(
            ("kvstack_", "process_", "python_")
        ),
        "snake case": re.fullmatch(r"[a-z][a-z0-9_]*", name) is not None,
    }
    return [f"{name}: {rule}" for rule, ok in checks.items() if not ok]


def test_every_service_in_the_prometheus_config_serves_metrics(scraped) -> None:
    services = {"up", "conductor-0", "kvstore-0", "prefill-0", "decode-0", "gateway-0", ATTENTION}
    assert set(scraped) == services
    for name, text in scraped.items():
        names = declared(text)
        assert "process_cpu_seconds_total" in names, name
        assert "python_gc_objects_collected_total" in names, name
        if name != "up":
            assert re.search(rf'kvstack_worker_info{{.*worker_id="{name}"', text), name


def test_metric_names_follow_prometheus_conventions(scraped) -> None:
    problems = [
        p for name, kind in exposed(scraped).items() for p in convention_problems(name, kind)
    ]
    assert problems == []


def test_the_parser_reads_every_exposition_and_counters_are_totals(scraped) -> None:
    for text in scraped.values():
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.type == "counter":
                    assert sample.name.endswith("_total"), sample.name
                if family.type == "histogram":
                    assert sample.name.removeprefix(family.name) in ("_bucket", "_sum", "_count")


def test_vllm_names_and_the_new_series_are_there(scraped) -> None:
    names = exposed(scraped)
    for name in (
        "kvstack_gateway_time_to_first_token_seconds",
        "kvstack_gateway_inter_token_latency_seconds",
        "kvstack_gateway_request_time_per_output_token_seconds",
        "kvstack_prefill_prefix_cache_queries_total",
        "kvstack_prefill_prefix_cache_hits_total",
        "kvstack_kvstore_block_hits_total",
        "kvstack_decode_num_requests_running",
        "kvstack_decode_num_requests_waiting",
        "kvstack_decode_kv_cache_usage_ratio",
        "kvstack_attention_worker_kv_cache_usage_ratio",
        "kvstack_prefill_kv_transfer_bytes_total",
    ):
        assert name in names, name
    assert not any("perc" in name for name in names)


def test_traffic_shows_in_the_counters(scraped) -> None:
    def value(worker: str, sample_name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(scraped[worker]):
            for s in family.samples:
                if s.name == sample_name and labels.items() <= s.labels.items():
                    return s.value
        raise AssertionError(f"{sample_name}{labels} not on {worker}")

    assert value("gateway-0", "kvstack_gateway_time_to_first_token_seconds_count") == 4
    assert value("prefill-0", "kvstack_prefill_prefix_cache_queries_total") == 4 * 201
    hits = value("prefill-0", "kvstack_prefill_prefix_cache_hits_total", tier="local")
    assert hits >= 3 * 192  # the 12 full blocks of the shared prefix, after the first
    assert value("prefill-0", "kvstack_prefill_kv_transfer_bytes_total") > 0


def test_engine_info_names_what_each_worker_chose(scraped) -> None:
    """The engine's device, dtype, attention and CUDA graphs, labelled on one series."""
    for worker, service in (("prefill-0", "prefill"), ("decode-0", "decode")):
        name = f"kvstack_{service}_engine_info"
        families = text_string_to_metric_families(scraped[worker])
        samples = [s for family in families for s in family.samples if s.name == name]
        assert [s.value for s in samples] == [1.0], (worker, samples)
        labels = samples[0].labels
        assert labels == dict(
            device="cpu", dtype=labels["dtype"], attention="mock", cuda_graphs="false"
        )


def test_the_dashboard_queries_only_metrics_that_exist(scraped) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    series = set()
    for name, kind in exposed(scraped).items():
        series |= (
            {f"{name}{s}" for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
        )
    used = {m for expr in exprs for m in re.findall(r"\b(?:kvstack|process|python)_\w+", expr)}
    assert used - series == set()


def test_docs_list_every_kvstack_metric_and_no_other(scraped) -> None:
    rows = r"^\| `(kvstack_\w+)` \| (?:counter|gauge|histogram)"  # the metric tables' rows
    documented = set(re.findall(rows, DOC.read_text(), re.MULTILINE))
    names = {name for name in exposed(scraped) if name.startswith("kvstack_")}
    assert names - documented == set(), "exposed but not documented"
    assert documented - names == set(), "documented but not exposed"
