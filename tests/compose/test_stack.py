"""compose.yaml's stack as users run it: images from `make image`, `kvstack auth init`
secrets, `docker compose up -d --scale prefill=2 --scale decode=2`; the official openai
client with the key from the secrets; every container its own host; then every fault of
`python -m bench compose-chaos` under a steady load of streaming greedy requests, each
answer compared token for token with the reference engine's; a stop that drains; a down
that leaves nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import openai
import pytest

from bench.compose.cli import FAULTS
from bench.compose.faults import Fault
from bench.compose.runner import ComposeChaosConfig, run_compose_chaos
from bench.compose.stack import ComposeStack
from shared import subjects
from shared.messages import Heartbeat
from shared.runtime.bus import Bus
from tests.compose.conftest import MAX_TOKENS, MODEL, client, greedy_text, started

IMAGE_USER = "10001"  # the image's kvstack user
CONNECTION_ERRORS = ("Client", "ServerDisconnected")  # aiohttp's, for a broken connection
PROBE = "urllib.request"  # compose.yaml's health checks


@pytest.fixture(scope="module")
def stack(docker, tmp_path_factory):
    yield from started(tmp_path_factory, "compose", scale={"prefill": 2, "decode": 2})


def test_the_openai_client_with_the_key_from_the_secrets_gets_smollm2s_answers(
    stack, cases
) -> None:
    api = client(stack, (stack.secrets_dir / "api-key").read_text().strip())
    chat = api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    assert "Paris" in chat.choices[0].message.content
    assert greedy_text(api, cases[0]) == cases[0].want
    with pytest.raises(openai.AuthenticationError):
        client(stack, "not-the-key").models.list()


def test_every_container_is_a_host_of_its_own_and_kv_moves_between_their_addresses(
    stack,
) -> None:
    beats = asyncio.run(heartbeats(stack, ("prefill", "decode", "kvstore")))
    ips = {c.ip for c in stack.containers() if c.ip}
    data_hosts = {beat.data_addr.rpartition(":")[0] for beat in beats.values()}
    assert len(beats) == 5  # 2 prefill, 2 decode, 1 kvstore
    assert len(data_hosts) == 5 and data_hosts <= ips  # each at its container's address
    assert not any(ipaddress.ip_address(h).is_loopback for h in data_hosts)
    api = client(stack)
    completion = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    timing = completion.usage.model_extra["timing"]
    assert timing["kv_transfer"] > 0  # prefill's KV crossed to a decode container


def test_every_kvstack_process_runs_as_the_images_own_user(stack) -> None:
    from bench.compose.docker import run

    for container in stack.containers():
        if container.service == "prometheus":
            continue
        # NOTE: docker top wants the pid among the fields
        top = run(["docker", "top", container.id, "-eo", "pid,uid,args"]).stdout.splitlines()[1:]
        # NOTE: docker-init (PID 1, which only reaps and passes signals on) and Docker's own
        # health probes run as root; everything the entrypoint starts runs as kvstack. A
        # probe caught exiting has no command line left (ps shows "[python3]"), so a line
        # whose args are bracketed is a process on its way out, not one the stack runs
        ours = [line for line in top if not _root_by_design(line)]
        users = {line.split()[1] for line in ours}
        assert users == {IMAGE_USER}, (container.name, top)


def _root_by_design(top_line: str) -> bool:
    args = top_line.split(None, 2)[2]
    return "docker-init" in args or PROBE in args or args.startswith("[")


def test_every_fault_under_load_loses_no_token_and_nothing_hangs(stack, cases, root) -> None:
    faults = tuple(Fault.parse(spec) for spec in FAULTS)
    config = ComposeChaosConfig(
        faults, concurrency=4, max_tokens=MAX_TOKENS, settle_seconds=5, phase_seconds=15
    )
    report = run_compose_chaos(stack, cases, config, print)
    table = {p.row.fault: p for p in report.phases}
    for phase in report.phases:
        assert phase.row.lost == 0 and phase.row.hung == 0, phase
    for fault in faults:
        phase = table[fault.name]
        assert phase.in_flight >= 1, phase  # it landed on requests in flight
        assert phase.row.back_s is not None, phase  # and the stack came back
        if fault.service in ("prefill", "decode") and fault.action != "slow-link":
            assert phase.victim_load >= 1, phase  # on the very worker holding them
        if fault.service != "gateway":
            assert phase.row.errored == 0, (phase, report.errors)
    # a killed gateway ends its own streams with an error (their connections break), and
    # refuses connections until it is back: no other error anywhere
    gateway = table["kill:gateway"]
    assert all(e.startswith(CONNECTION_ERRORS) for e in report.errors), report.errors
    assert gateway.row.completed + gateway.row.errored == gateway.row.sent
    for fault in ("kill:decode", "docker-kill:decode", "partition:decode", "pause:decode"):
        assert table[fault].row.migrated >= 1, table[fault]  # its streams went on elsewhere
    after = table["after"].row
    assert after.sent and after.completed == after.sent, report.errors
    slow = table["slow-link:prefill"]
    print(f"slow link: TTFT {slow.ttft_s} s, TPOT {slow.tpot_s} s; undisturbed: "
          f"{table['warmup'].ttft_s} s, {table['warmup'].tpot_s} s")  # fmt: skip


def test_compose_stop_drains_each_service_and_it_exits_cleanly(stack) -> None:
    began = time.monotonic()
    stack.compose("stop", timeout=300)
    stopped = stack.containers()
    assert all(c.state == "exited" for c in stopped), stopped
    codes = {c.name: exit_code(c.id) for c in stopped if c.service != "prometheus"}
    assert set(codes.values()) == {0}, codes
    assert "draining" in stack.logs(200)
    assert time.monotonic() - began < 120


def exit_code(container_id: str) -> int:
    from bench.compose.docker import run

    return int(run(["docker", "inspect", "-f", "{{.State.ExitCode}}", container_id]).stdout)


async def heartbeats(stack: ComposeStack, services: tuple[str, ...]) -> dict[str, Heartbeat]:
    """The latest heartbeat of each worker of `services`, by worker id (a few seconds)."""
    bus = await Bus.connect(stack.nats_url, "compose-test", stack.admin(), 5.0)
    seen: dict[str, Heartbeat] = {}

    async def on_beat(beat: Heartbeat) -> None:
        if beat.service in services and not beat.stopped:
            seen[beat.worker_id] = beat

    await bus.subscribe(subjects.all_heartbeats(), on_beat, expected=Heartbeat)
    await asyncio.sleep(3.0)
    await bus.nc.close()
    return seen
