"""`kvstack serve`: the gateway's API over one engine in one process, started as users
start it (a real process, the real SmolLM2, a generated API key), checked through HTTP
against `kvstack generate`'s greedy output; and a started process's threads run on the
cores the plan gives it."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from services.stack.pinning import usable_cores
from shared.cpu_cores import format_cores, plan_cores
from shared.sampling_params import SamplingParams
from tests.e2e.conftest import free_port

MODEL = "SmolLM2-135M-Instruct"


class Served:
    def __init__(self, popen: subprocess.Popen, url: str, log: Path, secrets: Path) -> None:
        self.popen, self.url, self.log, self.secrets = popen, url, log, secrets

    @property
    def api_key(self) -> str:
        return (self.secrets / "api-key").read_text().strip()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=self.api_key, max_retries=0, timeout=120
        )


def start(tmp_path: Path, *args: str) -> Served:
    port, secrets, log = free_port(), tmp_path / "secrets", tmp_path / "serve.log"
    argv = ["serve", "--port", str(port), "--secrets-dir", str(secrets), *args]
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", *argv], stdout=out, stderr=out
        )
    served = Served(popen, f"http://127.0.0.1:{port}", log, secrets)
    wait_healthy(served, deadline=time.monotonic() + 240)
    return served


def wait_healthy(served: Served, deadline: float) -> None:
    while time.monotonic() < deadline:
        assert served.popen.poll() is None, served.log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"{served.url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not healthy in time:\n{served.log.read_text()[-2000:]}")


def stop(served: Served) -> None:
    if served.popen.poll() is None:
        served.popen.kill()
        served.popen.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_dir) -> Iterator[Served]:
    s = start(tmp_path_factory.mktemp("serve"), "--dtype", "float32", "--kv-cache-gib", "0.25")
    try:
        yield s
    finally:
        stop(s)


def expected(reference, messages: list[dict], max_tokens: int, **params):
    prompt = reference.info.tokenizer.encode_chat(messages)
    return reference.generate(
        [prompt], SamplingParams(max_tokens=max_tokens, temperature=0, **params)
    )[0]


def test_requests_without_the_generated_key_are_refused(served) -> None:
    assert len(served.api_key) >= 32
    bad = openai.OpenAI(base_url=f"{served.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_generate(served, reference, stream) -> None:
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    want = expected(reference, messages, 24)
    kwargs = dict(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    client = served.client()
    if not stream:
        result = client.chat.completions.create(**kwargs)
        assert result.choices[0].message.content == want.text
        assert result.usage.completion_tokens == len(want.token_ids)
        assert result.choices[0].finish_reason == want.finish_reason
        return
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason
    # greedy tokens come several a step (--decode-burst), a chunk for each step's
    with_text = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(with_text) < len(want.token_ids)


def test_two_concurrent_requests_both_complete(served) -> None:
    client = served.client()

    def ask(topic: str):
        return client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Write one sentence about {topic}."}],
            max_tokens=16,
            temperature=0,
            extra_body={"ignore_eos": True},
        )

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(ask, ["the sea", "a cat"]))
    for result in results:
        assert result.usage.completion_tokens == 16
        assert result.choices[0].finish_reason == "length"
        assert result.choices[0].message.content


def test_a_bad_request_is_a_400_naming_its_field(served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        served.client().chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    assert caught.value.body["param"] == "messages"
    too_long = served.client().completions.create
    with pytest.raises(openai.BadRequestError):  # the engine's context, checked up front
        too_long(model=MODEL, prompt=[1] * 10, max_tokens=100_000)


def test_sigterm_finishes_the_stream_in_flight_then_exits_cleanly(served) -> None:
    # NOTE: last in this module: it ends the process the fixture started.
    stream = served.client().completions.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=24,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    text = next(chunks).choices[0].text
    served.popen.send_signal(signal.SIGTERM)
    rest = list(chunks)
    assert rest[-1].choices[0].finish_reason == "length"
    assert (text + "".join(c.choices[0].text for c in rest)).strip()
    assert served.popen.wait(timeout=60) == 0
    assert "draining" in served.log.read_text()


def test_a_started_process_runs_every_thread_on_the_cores_its_plan_gives(tmp_path) -> None:
    """What `kvstack up` would give decode-0 beside prefill-0, on the mock engine (no
    weights to load): the threads started after pinning (engine, torch) inherit it."""
    cores = plan_cores(usable_cores(), ["prefill-0", "decode-0"])["decode-0"]
    served = start(tmp_path, "--engine", "mock", "--insecure", "--cores", format_cores(cores))
    try:
        tasks = os.listdir(f"/proc/{served.popen.pid}/task")
        assert len(tasks) > 2  # the engine thread and the executor's at least
        for task in tasks:
            assert os.sched_getaffinity(int(task)) == set(cores), task
    finally:
        stop(served)
