"""The model's names and the routes about the model and the gateway (model_routes.py) on
the real GatewayService's HTTP server, without NATS, through the official openai client
where it has a call for the route: GET /v1/models[/{id}], POST /tokenize and /detokenize,
GET /version and /ready. tests/e2e/test_models_api.py runs them on a live stack."""

from __future__ import annotations

import importlib.metadata
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openapi_schema_validator import OAS31Validator

from services.gateway.limits import GatewayLimits
from services.gateway.liveness import Liveness
from services.gateway.model_names import ModelNames
from services.gateway.model_routes import readiness, version
from services.gateway.openapi import OPENAPI
from services.gateway.protocol import parse_chat
from services.gateway.service import GatewayConfig
from shared.messages import Heartbeat
from shared.model.tokenizer import Tokenizer
from tests.services.gateway.test_edge import serving

KEY = "models-key"
MODEL = "SmolLM2-135M-Instruct"
HF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
MESSAGES = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def gateway(smollm2_dir) -> Iterator[str]:
    """Served as `smol` and `chat`, with an API key and a 4096-token context."""
    config = GatewayConfig(
        http_port=0, api_key=KEY, served_model_names=("smol", "chat"), max_model_len=4096
    )
    with serving(config) as (host, port):
        yield f"http://{host}:{port}"


@pytest.fixture(scope="module")
def plain(smollm2_dir) -> Iterator[str]:
    """The defaults: no --served-model-name, no key."""
    with serving(GatewayConfig(http_port=0)) as (host, port):
        yield f"http://{host}:{port}"


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def call(url: str, path: str, body: dict | None = None, key: str = KEY) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# -- names -----------------------------------------------------------------------------------------


def test_the_default_model_is_listed_by_its_name_then_its_hugging_face_repo_id(plain) -> None:
    cards = client(plain, "none").models.list().data
    assert [card.id for card in cards] == [MODEL, HF_REPO]
    for card in cards:
        extra = card.model_extra or {}
        assert card.owned_by == "kvstack" and extra["root"] == HF_REPO
        assert extra["max_model_len"] == 8192  # SmolLM2's context
        assert extra["permission"][0]["object"] == "model_permission"


def test_served_model_names_are_listed_first_and_the_first_is_reported(gateway) -> None:
    api = client(gateway)
    assert [card.id for card in api.models.list().data] == ["smol", "chat", HF_REPO]
    assert api.models.list().data[0].model_extra["max_model_len"] == 4096


@pytest.mark.parametrize(
    "asked,card",
    [
        ("smol", "smol"),
        ("CHAT", "chat"),  # any case; the card keeps the listed spelling
        (HF_REPO, HF_REPO),  # a slash in the id
        (HF_REPO.lower(), HF_REPO),
        (MODEL, MODEL),  # --model stays accepted beside the served names
        ("smollm2", "smollm2"),  # a known model's alias
    ],
)
def test_retrieve_answers_every_accepted_name(gateway, asked, card) -> None:
    model = client(gateway).models.retrieve(asked)
    assert model.id == card and model.object == "model"


def test_retrieve_of_an_unknown_model_is_a_404_error_object(gateway) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(gateway).models.retrieve("gpt-4o")
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client(gateway).models.retrieve("HuggingFaceTB/other")


def test_model_routes_want_the_key(gateway) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "wrong").models.retrieve("smol")
    assert call(gateway, "/tokenize", {"prompt": "hi"}, key="wrong")[0] == 401
    assert call(gateway, "/detokenize", {"tokens": [1]}, key="wrong")[0] == 401


def test_names_are_matched_in_any_case(smollm2_dir: Path) -> None:
    names = ModelNames.for_model(MODEL, ("smol",), smollm2_dir)
    assert names.reported == "smol" and names.served == ("smol", HF_REPO)
    assert all(n in names for n in ("SMOL", HF_REPO.upper(), MODEL, "SmolLM2", smollm2_dir.name))
    assert "gpt-4o" not in names and 5 not in names
    assert names.listed("Smol") == "smol" and names.listed("gpt-4o") is None
    # A request naming any of them gets the reported name back (protocol.py's check).
    limits = GatewayLimits(max_model_len=2048)
    body = {"model": HF_REPO.upper(), "messages": MESSAGES}
    tokenizer = Tokenizer.from_dir(smollm2_dir)
    assert parse_chat(body, tokenizer, limits, names.reported, "r", names).model == "smol"


def test_an_unknown_model_directory_is_served_under_its_own_names(tiny_llama_dir) -> None:
    names = ModelNames.for_model(str(tiny_llama_dir), (), tiny_llama_dir)
    assert names.served == (str(tiny_llama_dir),) and names.root == str(tiny_llama_dir)
    assert tiny_llama_dir.name in names and HF_REPO not in names


# -- tokenize and detokenize ---------------------------------------------------------------------


def test_tokenize_messages_counts_what_a_chat_completion_counts(gateway, smollm2_dir) -> None:
    status, body = call(gateway, "/tokenize", {"model": HF_REPO, "messages": MESSAGES})
    assert status == 200 and body["max_model_len"] == 4096
    limits = GatewayLimits(max_model_len=4096)
    tokenizer = Tokenizer.from_dir(smollm2_dir)
    chat = parse_chat({"messages": MESSAGES}, tokenizer, limits, "smol", "r")
    assert body["tokens"] == list(chat.prompt_token_ids) and body["count"] == chat.num_prompt_tokens
    _, without = call(gateway, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert (
        without["count"] < body["count"] and body["tokens"][: without["count"]] == without["tokens"]
    )


def test_tokenize_then_detokenize_gives_the_text_back(gateway, smollm2_dir) -> None:
    text = "Hello, world! Ünïcödé and   spaces."
    status, body = call(gateway, "/tokenize", {"model": "smol", "prompt": text})
    assert status == 200 and body["count"] == len(body["tokens"]) > 0
    assert body["tokens"] == Tokenizer.from_dir(smollm2_dir).encode(text)
    status, back = call(gateway, "/detokenize", {"model": "chat", "tokens": body["tokens"]})
    assert (status, back) == (200, {"prompt": text})


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
        ("/detokenize", {"tokens": [49152]}, "tokens"),  # SmolLM2's vocabulary is 49152
        ("/detokenize", {"tokens": [-1]}, "tokens"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(gateway, path, body, param) -> None:
    status, answer = call(gateway, path, body)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_an_unknown_model_is_a_404_there_too(gateway) -> None:
    status, answer = call(gateway, "/tokenize", {"model": "gpt-4o", "prompt": "a"})
    assert status == 404 and answer["error"]["code"] == "model_not_found"


# -- version and readiness -----------------------------------------------------------------------


def test_version_and_health_need_no_key(gateway) -> None:
    assert call(gateway, "/version", key="wrong") == (200, {"version": version()})
    assert version() == importlib.metadata.version("kvstack")


def beat(service: str, worker_id: str, **fields) -> Heartbeat:
    return Heartbeat(service, worker_id, time.time(), 0.05, **fields)


def test_ready_wants_a_conductor_a_prefill_and_a_decode_worker() -> None:
    liveness = Liveness()
    ok, body = readiness(liveness, healthy=True)
    assert not ok and body["missing"] == ["conductor", "prefill", "decode"]
    liveness.observe(beat("conductor", "conductor-0"))
    liveness.observe(beat("prefill", "prefill-0"))
    liveness.observe(beat("kvstore", "kvstore-0"))
    ok, body = readiness(liveness, healthy=True)
    assert (ok, body["missing"], body["status"]) == (False, ["decode"], "not ready")
    liveness.observe(beat("decode", "decode-0"))
    ok, body = readiness(liveness, healthy=True)
    assert (ok, body) == (
        True,
        {"status": "ready", "workers": {"conductor": 1, "prefill": 1, "decode": 1}, "missing": []},
    )
    assert readiness(liveness, healthy=False)[1]["missing"] == ["gateway"]
    liveness.observe(beat("decode", "decode-0", draining=True))  # takes no new work
    assert readiness(liveness, healthy=True)[1]["missing"] == ["decode"]
    liveness.observe(beat("decode", "decode-0"))
    time.sleep(0.2)  # past 3 of their 0.05 s intervals: nobody is heard any more
    assert readiness(liveness, healthy=True)[1]["missing"] == ["conductor", "prefill", "decode"]


def test_ready_is_a_503_saying_what_is_missing(gateway) -> None:
    status, body = call(gateway, "/ready", key="")
    assert status == 503 and body["status"] == "not ready"  # no NATS here, no workers
    assert body["missing"] == ["gateway", "conductor", "prefill", "decode"]


def test_the_answers_fit_the_openapi_document(gateway) -> None:
    def fits(name: str, body: dict) -> None:
        schema = {"$ref": f"#/components/schemas/{name}", "components": OPENAPI["components"]}
        assert not [e.message for e in OAS31Validator(schema).iter_errors(body)], (name, body)

    fits("ModelList", call(gateway, "/v1/models")[1])
    fits("Model", call(gateway, "/v1/models/HuggingFaceTB%2FSmolLM2-135M-Instruct")[1])
    fits("Tokens", call(gateway, "/tokenize", {"prompt": "Hello"})[1])
    fits("Tokens", call(gateway, "/tokenize", {"messages": MESSAGES})[1])
    fits("Text", call(gateway, "/detokenize", {"tokens": [1, 2, 3]})[1])
    fits("Version", call(gateway, "/version")[1])
    fits("Ready", call(gateway, "/ready")[1])
    fits("TokenizeRequest", {"model": "smol", "prompt": "Hello", "add_special_tokens": False})
    fits("TokenizeRequest", {"messages": MESSAGES, "add_generation_prompt": False})
    fits("DetokenizeRequest", {"tokens": [1, 2]})
