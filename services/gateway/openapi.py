"""The gateway's OpenAPI 3.1 document, served at GET /openapi.json: every route, its
bodies (openapi_schemas.py) and every error it answers, each an OpenAI error object."""

from __future__ import annotations

from services.gateway.body import SUPPORTED_ENCODINGS
from services.gateway.edge import EdgeConfig
from services.gateway.limits import GatewayLimits
from services.gateway.openapi_schemas import SCHEMAS, ref
from shared.runtime.service import VERSION

EDGE = EdgeConfig()
DESCRIPTION = f"""OpenAI-compatible completions and chat completions in front of kvstack's
prefill and decode workers.

Limits the gateway enforces (defaults; flags of `kvstack gateway`):
- a request's line and headers must arrive within {EDGE.read_timeout:g} s of the connection
  opening (or of the previous response), then its body within {EDGE.read_timeout:g} s
  (`--read-timeout`); a stalled client gets 408 or a closed connection;
- request line and each header at most {EDGE.max_line_bytes} bytes, at most
  {EDGE.max_headers} headers (431);
- the body at most {GatewayLimits.max_body_bytes >> 20} MiB once decoded (413), its
  Content-Encoding one of {", ".join(SUPPORTED_ENCODINGS)} (else 415);
- with `--max-concurrent-per-key N`, at most N generation requests in flight per API key
  (429 with Retry-After);
- the prompt plus max_tokens within the model's context (GET /v1/models: max_model_len).

The model answers to each --served-model-name (the first is the one responses report),
to --model and, for a known model, to its Hugging Face repo id, in any case. The /v1/
routes, /tokenize and /detokenize want the API key when the gateway has one; /health,
/ready, /version, /metrics and this document do not.

Errors are OpenAI error objects: {{"error": {{"message", "type", "param", "code"}}}}. A
stream that fails after its first event carries the error object as an event, then
`data: [DONE]`."""

RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}
}
ERRORS = {
    400: (
        (
            "invalid request: a field of the wrong type or out of range, a prompt too long "
            "for the context, a body that is not JSON or does not decode"
        ),
        {},
    ),
    401: (
        "missing or wrong API key (when the gateway has one)",
        {"WWW-Authenticate": {"schema": {"type": "string"}}},
    ),
    404: ("unknown model", {}),
    408: ("the body did not arrive within the read timeout", {}),
    413: ("the body is larger than the limit", {}),
    415: ("Content-Encoding not supported", {}),
    429: ("too many requests in flight for this API key", RETRY_AFTER),
    431: ("request line or headers too large, or too many headers", {}),
    503: ("no worker or conductor can take it now, or the gateway is shutting down", RETRY_AFTER),
}
BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
REQUEST_ID = {
    "name": "x-request-id",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "echoed in logs; any string",
}


def errors(*statuses: int) -> dict:
    return {
        str(s): {
            "description": ERRORS[s][0],
            "headers": ERRORS[s][1],
            "content": {"application/json": {"schema": ref("Error")}},
        }
        for s in statuses
    }


def sse_event(chunk: str) -> dict:
    """One server-sent event of a stream: its data is a `chunk` as JSON, an Error object
    (a failure after the first chunk), or the last event's `[DONE]`."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [ref(chunk), ref("Error")]},
    }
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}},
    }


def generation(summary: str, operation_id: str, request: str, response: str, chunk: str) -> dict:
    """POST /v1/completions or /v1/chat/completions."""
    stream = (
        f"with stream: true, server-sent events, each `data: <{chunk}>` (an Error "
        f"object if it fails mid-stream), then `data: [DONE]`"
    )
    return {
        "post": {
            "summary": summary,
            "operationId": operation_id,
            "security": BEARER,
            "parameters": [REQUEST_ID],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref(request)}},
            },
            "responses": {
                "200": {
                    "description": f"a {response}; {stream}",
                    "content": {
                        "application/json": {"schema": ref(response)},
                        "text/event-stream": {"schema": sse_event(chunk)},
                    },
                },
                **errors(400, 401, 404, 408, 413, 415, 429, 431, 503),
            },
        }
    }


def post(summary: str, operation_id: str, request: str, response: str) -> dict:
    """POST /tokenize or /detokenize: a JSON body in, a JSON body out, the API key wanted."""
    return {
        "post": {
            "summary": summary,
            "operationId": operation_id,
            "security": BEARER,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref(request)}},
            },
            "responses": {
                "200": {
                    "description": f"a {response}",
                    "content": {"application/json": {"schema": ref(response)}},
                },
                **errors(400, 401, 404, 408, 413, 415, 431),
            },
        }
    }


def plain_get(
    summary: str, operation_id: str, media_type: str, schema: dict, extra: dict | None = None
) -> dict:
    return {
        "get": {
            "summary": summary,
            "operationId": operation_id,
            "responses": {
                "200": {"description": summary, "content": {media_type: {"schema": schema}}},
                **(extra or {}),
            },
        }
    }


OPENAPI = {
    "openapi": "3.1.0",
    "info": {"title": "kvstack gateway", "version": VERSION, "description": DESCRIPTION},
    "paths": {
        "/v1/completions": generation(
            "Complete a prompt",
            "createCompletion",
            "CompletionRequest",
            "Completion",
            "CompletionChunk",
        ),
        "/v1/chat/completions": generation(
            "Answer a conversation",
            "createChatCompletion",
            "ChatCompletionRequest",
            "ChatCompletion",
            "ChatCompletionChunk",
        ),
        "/v1/models": {
            "get": {
                "summary": "The served model: a card per served name",
                "operationId": "listModels",
                "security": BEARER,
                "responses": {
                    "200": {
                        "description": "a card per --served-model-name (the first is the "
                        "name responses report), then a known model's Hugging Face repo id",
                        "content": {"application/json": {"schema": ref("ModelList")}},
                    },
                    **errors(401),
                },
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "summary": "The card of one model name",
                "operationId": "retrieveModel",
                "security": BEARER,
                "parameters": [
                    {
                        "name": "model_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1},
                        "description": "any name the gateway accepts, in any case; may hold "
                        "a slash (HuggingFaceTB/SmolLM2-135M-Instruct)",
                    }
                ],
                "responses": {
                    "200": {
                        "description": "the model's card",
                        "content": {"application/json": {"schema": ref("Model")}},
                    },
                    **errors(401, 404),
                },
            }
        },
        "/tokenize": post(
            "Tokenize a prompt or chat messages as the completions and chat routes do",
            "tokenize",
            "TokenizeRequest",
            "Tokens",
        ),
        "/detokenize": post(
            "The text of token ids (special tokens kept)", "detokenize", "DetokenizeRequest", "Text"
        ),
        "/version": plain_get(
            "The gateway's kvstack version", "version", "application/json", ref("Version")
        ),
        "/ready": plain_get(
            "Whether a conductor, a prefill and a decode worker are there to serve requests",
            "ready",
            "application/json",
            ref("Ready"),
            {
                "503": {
                    "description": "not ready: `missing` says what is missing",
                    "content": {"application/json": {"schema": ref("Ready")}},
                }
            },
        ),
        "/health": plain_get(
            "Whether the gateway takes requests",
            "health",
            "application/json",
            ref("Health"),
            {
                "503": {
                    "description": "draining or cut off from NATS",
                    "content": {"application/json": {"schema": ref("Health")}},
                }
            },
        ),
        "/metrics": plain_get("Prometheus metrics", "metrics", "text/plain", {"type": "string"}),
        "/openapi.json": plain_get(
            "This document", "openapi", "application/json", {"type": "object"}
        ),
    },
    "components": {
        "schemas": SCHEMAS,
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "description": "the gateway's --api-key"}
        },
    },
}
