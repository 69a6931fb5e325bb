"""The gateway's routes about the model and the gateway itself, in vLLM's shapes:

- GET /v1/models: a card per served name (`model_names.py`), each with `root`,
  `max_model_len`, `owned_by` and `permission` as vLLM reports them;
- GET /v1/models/{id}: the card of one name (an id may hold a slash, e.g. the Hugging
  Face repo id); an unknown one is a 404 OpenAI error object;
- POST /tokenize: {"prompt"} or {"messages", "add_generation_prompt"} -> {"count",
  "max_model_len", "tokens"}; the messages' tokens are the ones a chat completion of the
  same messages counts as its prompt_tokens;
- POST /detokenize: {"tokens"} -> {"prompt"}; an id out of the vocabulary is a 400;
- GET /version: {"version"}, the installed kvstack's;
- GET /ready: 200 once a conductor, a prefill and a decode worker are heard from (their
  heartbeats) and this gateway takes requests; else 503 naming what is missing.

The /v1/ routes, /tokenize and /detokenize want the API key when the gateway has one
(`KEYED_PATHS`); /health, /ready and /version do not, as in vLLM.
"""

from __future__ import annotations

import importlib.metadata
import uuid
from typing import Any

from aiohttp import web

from services.gateway import errors
from services.gateway.body import read_body
from services.gateway.fields import BOOL, INT_LIST, STRING, checked_model, decode_body, read
from services.gateway.prompts import chat_message, checked_ids, tokenizer_for
from services.gateway.responses import OWNED_BY
from shared.errors import InvalidRequest, KvstackError
from shared.runtime.service import VERSION

KEYED_PATHS = frozenset({"/tokenize", "/detokenize"})  # besides /v1/*
READY_NEEDS = ("conductor", "prefill", "decode")  # services heard from before /ready is 200


def version() -> str:
    try:
        return importlib.metadata.version("kvstack")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return VERSION


def model_card(name: str, root: str, created: int, max_model_len: int) -> dict:
    """One entry of GET /v1/models, as vLLM writes it."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": OWNED_BY,
        "root": root,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


def tokenize(body: dict, tokenizer, limits, names) -> dict:
    """POST /tokenize: the tokens of a text prompt or of chat messages."""
    checked_model(body, names.reported, names)
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise errors.invalid_request("Give either prompt or messages.", param="prompt")
    if prompt is not None:
        text = read(body, "prompt", STRING)
        special = read(body, "add_special_tokens", BOOL)
        tokenizer = tokenizer_for("a text prompt", tokenizer)
        tokens = tokenizer.encode(text, add_special_tokens=special is not False)
    else:
        generation = read(body, "add_generation_prompt", BOOL)
        tokens = _chat_tokens(messages, tokenizer, generation is not False)
    return {"count": len(tokens), "max_model_len": limits.max_model_len, "tokens": tokens}


def _chat_tokens(messages: Any, tokenizer, add_generation_prompt: bool) -> list[int]:
    """As prompts.py tokenizes a chat request's messages (which always adds the
    generation prompt)."""
    if not isinstance(messages, list) or not messages:
        raise errors.invalid_request(
            "messages must be a non-empty list of {role, content} objects.", param="messages"
        )
    turns = [chat_message(message, index) for index, message in enumerate(messages)]
    tokenizer = tokenizer_for("chat", tokenizer)
    try:
        return list(tokenizer.encode_chat(turns, add_generation_prompt=add_generation_prompt))
    except InvalidRequest as exc:
        raise errors.invalid_request(str(exc), param="messages") from None
    except KvstackError as exc:  # the model's template is broken: our problem
        raise errors.internal_error(str(exc)) from None


def detokenize(body: dict, tokenizer, limits, names) -> dict:
    """POST /detokenize: the text of token ids, special tokens kept (as vLLM)."""
    checked_model(body, names.reported, names)
    tokens = read(body, "tokens", INT_LIST)
    if tokens is None:
        raise errors.invalid_request("tokens (a list of token ids) is required.", param="tokens")
    ids = checked_ids(tokens, tokenizer, limits, "tokens")
    tokenizer = tokenizer_for("detokenize", tokenizer)
    return {"prompt": tokenizer.decode(list(ids), skip_special_tokens=False)}


def readiness(liveness, healthy: bool) -> tuple[bool, dict]:
    """Whether the gateway can serve a request now, and GET /ready's body."""
    workers = {service: len(liveness.serving(service)) for service in READY_NEEDS}
    missing = [service for service, count in workers.items() if count == 0]
    if not healthy:
        missing.insert(0, "gateway")
    body: dict[str, Any] = {
        "status": "not ready" if missing else "ready",
        "workers": workers,
        "missing": missing,
    }
    return not missing, body


class ModelRoutes:
    """The handlers; `service` is the GatewayService (names, tokenizer, limits, liveness)."""

    def __init__(self, service, created: int) -> None:
        self.service = service
        self.created = created

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model_id:.+}", self.model),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/version", self.version),
            web.get("/ready", self.ready),
        ]

    def _card(self, name: str) -> dict:
        names = self.service.names
        return model_card(name, names.root, self.created, self.service.limits.max_model_len)

    async def models(self, request: web.Request) -> web.Response:
        cards = [self._card(name) for name in self.service.names.served]
        return self._ok({"object": "list", "data": cards})

    async def model(self, request: web.Request) -> web.Response:
        asked = request.match_info["model_id"]
        name = self.service.names.listed(asked)
        if name is None:
            raise errors.model_not_found(asked)
        return self._ok(self._card(name))

    async def tokenize(self, request: web.Request) -> web.Response:
        return self._ok(tokenize(await self._body(request), *self._model_parts()))

    async def detokenize(self, request: web.Request) -> web.Response:
        return self._ok(detokenize(await self._body(request), *self._model_parts()))

    async def version(self, request: web.Request) -> web.Response:
        return self._ok({"version": version()})

    async def ready(self, request: web.Request) -> web.Response:
        ok, body = self.service.readiness()
        return web.json_response(body, status=200 if ok else 503)

    def _model_parts(self) -> tuple:
        s = self.service
        return s.tokenizer, s.limits, s.names

    async def _body(self, request: web.Request) -> dict:
        raw = await read_body(request, self.service.config.edge.read_timeout)
        return decode_body(raw, self.service.limits)

    @staticmethod
    def _ok(body: dict) -> web.Response:
        return web.json_response(body)
