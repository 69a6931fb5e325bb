"""The model's names and the routes about the model and the gateway, on live stacks, with
the official openai client: the Hugging Face repo id works as the model's name, the names
of `kvstack up --served-model-name` reach the gateway, /tokenize counts what a chat
completion counts, /detokenize gives the text back, /version, /health, and /ready goes
from 503 to 200 as the last worker it needs registers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from services.gateway.model_routes import version
from services.stack.stack import Stack, StackConfig
from shared.engine.mock import MockSpec
from tests.e2e.conftest import API_KEY, free_port, running_stack
from tests.e2e.test_supervision import read_until

MODEL = "SmolLM2-135M-Instruct"
HF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
UP_KEY = "up-key"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
SPEC = MockSpec("llama3-70b", "a800", 1e-3)


def call(url: str, path: str, body: dict | None = None, key: str = "") -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# -- the real model, the session's stack -------------------------------------------------------


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=API_KEY, max_retries=0)


def test_the_hugging_face_repo_id_is_listed_retrieved_and_served(client, stack) -> None:
    assert [card.id for card in client.models.list().data] == [MODEL, HF_REPO]
    card = client.models.retrieve(HF_REPO)
    assert card.id == HF_REPO and card.model_extra["max_model_len"] == 8192
    answer = client.chat.completions.create(
        model=HF_REPO, messages=MESSAGES, max_tokens=8, temperature=0
    )
    assert answer.model == MODEL and answer.usage.completion_tokens > 0
    status, tokens = call(
        stack.api_url, "/tokenize", {"model": HF_REPO, "messages": MESSAGES}, API_KEY
    )
    assert status == 200 and tokens["count"] == answer.usage.prompt_tokens
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("HuggingFaceTB/SmolLM2-1.7B-Instruct")


def test_detokenize_gives_back_the_text_of_a_completion(client, stack) -> None:
    answer = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=0
    )
    status, tokens = call(stack.api_url, "/tokenize", {"prompt": answer.choices[0].text}, API_KEY)
    assert status == 200
    status, text = call(stack.api_url, "/detokenize", {"tokens": tokens["tokens"]}, API_KEY)
    assert (status, text) == (200, {"prompt": answer.choices[0].text})


def test_health_ready_and_version_answer_without_the_key(stack) -> None:
    assert call(stack.api_url, "/health")[0] == 200
    assert call(stack.api_url, "/version") == (200, {"version": version()})
    ready = wait_for_status(stack.api_url, 200, timeout=30)
    assert ready["workers"] == {"conductor": 1, "prefill": 1, "decode": 1}
    assert call(stack.api_url, "/tokenize", {"prompt": "hi"})[0] == 401


# -- `kvstack up --served-model-name`, mock workers ----------------------------------------------


@pytest.fixture(scope="module")
def up(tmp_path_factory) -> Iterator[str]:
    """`kvstack up` of mock workers, served as `smol` and `chat`; its API URL."""
    tmp, port = tmp_path_factory.mktemp("up"), free_port()
    argv = [
        *("--engine", "mock", "--kvstore", "0", "--threads", "1", "--kv-cache-gib", "0.02"),
        *("--served-model-name", "smol", "chat", "--api-key", UP_KEY, "--port", str(port)),
        *("--log-dir", str(tmp / "logs"), "--secrets-dir", str(tmp / "secrets")),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "up", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        read_until(process.stdout, "kvstack is up")
        yield f"http://127.0.0.1:{port}"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()


def test_up_serves_every_served_model_name_and_reports_the_first(up) -> None:
    api = openai.OpenAI(base_url=f"{up}/v1", api_key=UP_KEY, max_retries=0)
    assert [card.id for card in api.models.list().data] == ["smol", "chat", HF_REPO]
    assert api.models.retrieve("Chat").id == "chat"
    for name in ("chat", HF_REPO, MODEL):
        answer = api.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2)
        assert answer.model == "smol"
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    wait_for_status(up, 200, timeout=30)  # a loaded machine may delay a heartbeat


# -- /ready as workers come and go -----------------------------------------------------------------


def wait_for_status(url: str, status: int, timeout: float = 120, missing=None) -> dict:
    """GET /ready's body once it answers `status` (and names `missing`, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        got, body = call(url, "/ready")
        if got == status and missing in (None, body["missing"]):
            return body
        assert time.monotonic() < deadline, (got, body)
        time.sleep(0.2)


def test_ready_is_503_without_a_decode_worker_and_200_once_one_registers(tmp_path) -> None:
    shape = dict(mock=SPEC, worker_args=("--threads", "1", "--kv-cache-gib", "0.02"))
    with running_stack(tmp_path / "logs", num_decode=0, gateway_args=(), **shape) as stack:
        # The gateway hears each worker's next beat after it subscribed: within a second.
        body = wait_for_status(stack.api_url, 503, timeout=30, missing=["decode"])
        assert body["workers"] == {"conductor": 1, "prefill": 1, "decode": 0}
        time.sleep(3)  # still, as long as no decode worker comes
        status, body = call(stack.api_url, "/ready")
        assert status == 503 and "decode" in body["missing"]
        decode = dict(Stack(StackConfig(**shape)).commands())["decode-0"]
        stack.spawn("decode-0", decode)
        body = wait_for_status(stack.api_url, 200)
        assert body == {
            "status": "ready",
            "workers": {"conductor": 1, "prefill": 1, "decode": 1},
            "missing": [],
        }
