"""Supervision with real processes: a killed service or nats-server comes back and the stack
serves again; a service that keeps dying is given up with its log; `kvstack up` drains on
Ctrl-C and leaves no process, temp dir or traceback behind, and rotates its logs."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from services.stack.restarts import RestartPolicy
from services.stack.stack import Stack, StackConfig
from shared.errors import KvstackError
from tests.e2e.conftest import free_port, running_stack, worker_stats

QUICK = RestartPolicy(first_backoff=0.2, max_restarts=2)
UP_ARGS = (
    "--prefill",
    "1",
    "--decode",
    "1",
    "--kvstore",
    "0",
    "--dtype",
    "float32",
    "--threads",
    "1",
    "--kv-cache-gib",
    "0.25",
    "--drain-timeout",
    "20",
)


@pytest.fixture(scope="module")
def supervised(tmp_path_factory, smollm2_dir):
    with running_stack(
        tmp_path_factory.mktemp("supervised"), restart=QUICK, metrics_port=0
    ) as stack:
        yield stack


def ask(stack: Stack) -> str:
    client = openai.OpenAI(
        base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0, timeout=60
    )
    result = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        max_tokens=8,
        temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    return result.choices[0].message.content


def ask_until_served(stack: Stack, timeout: float = 60) -> str:
    """Services reconnect and re-register on their own; until then the gateway says 503."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ask(stack)
        except (openai.APIStatusError, openai.APIConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def restarts_on_metrics(stack: Stack, name: str) -> float:
    with urllib.request.urlopen(stack.metrics.url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf'kvstack_up_restarts_total{{service="{name}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def wait_for_restart(stack: Stack, name: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while stack.restarts(name) < count:
        assert time.monotonic() < deadline, f"{name} was not restarted"
        time.sleep(0.1)


def test_a_killed_prefill_worker_comes_back_with_its_worker_id_and_serves(supervised):
    old = supervised.process("prefill-0").popen
    os.killpg(old.pid, signal.SIGKILL)
    wait_for_restart(supervised, "prefill-0", 1)
    supervised.wait_ready()
    new = supervised.process("prefill-0")
    assert new.popen.pid != old.pid and new.popen.poll() is None
    assert worker_stats(supervised, "prefill", "prefill-0").worker_id == "prefill-0"
    assert ask_until_served(supervised)
    assert restarts_on_metrics(supervised, "prefill-0") == 1
    assert supervised.restarts("decode-0") == 0


def test_nats_server_restarted_or_killed_comes_back_on_the_same_url(supervised):
    url = supervised.nats_url
    supervised.restart_nats()
    assert ask_until_served(supervised)
    os.kill(supervised.nats.process.pid, signal.SIGKILL)
    wait_for_restart(supervised, "nats-server", 1)
    assert supervised.nats.url == url and supervised.nats.poll() is None
    assert ask_until_served(supervised)


def kvstore_stack(log_dir: Path, *kvstore_args: str, restart: RestartPolicy) -> Stack:
    """A stack of one kvstore: no model to load, so it starts in seconds."""
    return Stack(
        StackConfig(
            num_prefill=0,
            num_decode=0,
            num_kvstore=1,
            with_conductor=False,
            with_gateway=False,
            kvstore_args=kvstore_args,
            log_dir=log_dir,
            restart=restart,
            ready_timeout=120,
        )
    )


def test_a_service_that_keeps_dying_is_given_up_with_its_log(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # NOTE: its data port: a taken HTTP port is refused before anything starts.
        stack = kvstore_stack(
            tmp_path,
            "--data-port",
            str(port),
            restart=RestartPolicy(first_backoff=0.1, max_restarts=2),
        )
        try:
            stack.start()
            with pytest.raises(KvstackError) as failure:
                stack.wait_ready()
        finally:
            stack.stop()
    message = str(failure.value)
    assert message.startswith("kvstore-0 keeps dying (2 restarts within 120s")
    assert f"cannot listen on 127.0.0.1:{port} (data plane)" in message  # its log's tail
    assert stack.restarts("kvstore-0") == 2


def test_kill_ends_every_child_and_nats_at_once_and_restarts_nothing(tmp_path) -> None:
    stack = kvstore_stack(tmp_path, restart=QUICK)
    try:
        stack.start()
        stack.wait_ready()
        pids = [stack.nats.process.pid, stack.process("kvstore-0").popen.pid]
        stack.kill()
        deadline = time.monotonic() + 5
        while stack.nats.poll() is None or stack.process("kvstore-0").poll() is None:
            assert time.monotonic() < deadline, "still running after SIGKILL"
            time.sleep(0.05)
        time.sleep(QUICK.first_backoff * 3)
        assert stack.restarts("kvstore-0") == 0 and stack.restarts("nats-server") == 0
    finally:
        stack.stop()
    assert not stack.nats.workdir.exists()
    assert not left_behind(pids)


def start_up(log_dir: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            "up",
            *UP_ARGS,
            "--port",
            str(port),
            "--log-dir",
            str(log_dir),
            "--secrets-dir",
            str(log_dir.parent / "secrets"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def api_key(log_dir: Path) -> str:
    """The key `kvstack up` made for its gateway (start_up's --secrets-dir)."""
    return (log_dir.parent / "secrets" / "api-key").read_text().strip()


def post_completion(port: int, body: dict, key: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    return conn.getresponse()


def open_stream(port: int, max_tokens: int, key: str) -> http.client.HTTPResponse:
    """A streamed completion, once its first event arrived: in flight."""
    body = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": "Once upon a time",
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    response = post_completion(port, body, key)
    assert response.status == 200 and response.readline().startswith(b"data: {")
    return response


def read_until(stream, text: str, timeout: float = 240) -> str:
    """The stream's lines until one contains `text` (the test fails after `timeout`)."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen:
        line = stream.readline()
        assert line and time.monotonic() < deadline, f"no {text!r}; got:\n{seen}"
        seen += line
    return seen


def process_groups() -> dict[int, int]:
    """pid -> process group of every process on the machine."""
    groups = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        groups[int(stat.parent.name)] = int(fields[2])
    return groups


def left_behind(pids: list[int]) -> set[int]:
    """Any process that is one of `pids` or in one of their process groups (each child of
    the stack leads a group of its own)."""
    return {p for p, group in process_groups().items() if group in pids or p in pids}


def children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout
    return [int(p) for p in out.split()]


def nats_dir(pids: list[int]) -> Path:
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--ports_file_dir" in argv:
            return Path(argv[argv.index(b"--ports_file_dir") + 1].decode())
    raise AssertionError("no nats-server among the children")


def test_up_drains_on_ctrl_c_leaves_nothing_behind_and_rotates_its_logs(tmp_path) -> None:
    log_dir = tmp_path / "logs"
    port = free_port()
    up = start_up(log_dir, port)
    try:
        read_until(up.stdout, "kvstack is up")
        pids = children(up.pid)
        store = nats_dir(pids)
        key = api_key(log_dir)
        assert len(key) >= 32
        assert post_completion(port, {"prompt": "Hi", "max_tokens": 1}, "wrong").status == 401
        stream = open_stream(port, max_tokens=24, key=key)
        up.send_signal(signal.SIGINT)
        events = [line for line in stream.read().split(b"\n") if line.startswith(b"data: ")]
        assert up.wait(timeout=40) == 0
    finally:
        up.kill()
    assert events[-1] == b"data: [DONE]"  # the drain let the stream finish
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
    stderr = up.stderr.read()
    assert "draining (Ctrl-C again to force)" in stderr and "stopped" in stderr
    assert f"requests need the API key in {log_dir.parent / 'secrets' / 'api-key'}" in stderr
    assert len(pids) == 5  # nats-server, conductor, prefill, decode, gateway
    assert not left_behind(pids)
    assert not store.exists()
    logs = sorted(log_dir.glob("*.log"))
    assert {p.name for p in logs} >= {"gateway-0.log", "prefill-0.log", "nats-server.log"}
    for log in logs:
        assert "Traceback" not in log.read_text(), log.name
    first_run = (log_dir / "prefill-0.log").read_text()

    again = start_up(log_dir, free_port())
    try:
        read_until(again.stderr, "starting")
        assert (log_dir / "prefill-0.log.1").read_text() == first_run
        again.send_signal(signal.SIGINT)
        assert again.wait(timeout=40) == 0
    finally:
        again.kill()
