"""The JSON Schemas of the gateway's bodies (OpenAPI 3.1, so JSON Schema 2020-12).

Request schemas state exactly what `protocol.py` accepts, with its constants (`limits.py`,
`fields.py`): a body the schema rejects gets a 400 (the fuzz tests hold the gateway to
that), a body it accepts may still get a 400 for what a schema cannot know (the context
length, the vocabulary, the gateway's --max-tokens-limit). A null field is the same as an
absent one, as in protocol.py; unknown fields are ignored.
"""

from __future__ import annotations

from typing import Any

from services.gateway.fields import UNSUPPORTED
from services.gateway.limits import (
    CHAT_ROLES,
    MAX_CHOICES,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    SEED_RANGE,
)
from services.gateway.model_routes import READY_NEEDS
from services.gateway.responses import FINISH_REASONS
from shared.sampling_params import (
    MAX_LOGIT_BIAS,
    MAX_PENALTY,
    MAX_TOP_LOGPROBS,
    REPETITION_PENALTY_RANGE,
)


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict, description: str = "") -> dict:
    """`schema` or null (null: the default)."""
    described = {"description": description} if description else {}
    return {"anyOf": [schema, {"type": "null"}], **described}


def refused(names: tuple[str, ...]) -> dict:
    """Fields kvstack does not implement: null, or a 400 naming the field."""
    return {name: {"type": "null", "description": "not supported (400)"} for name in names}


INTEGER = {"type": "integer"}
BOOLEAN = {"type": "boolean"}
STRING = {"type": "string"}
TOKEN_ID = {
    "type": "integer",
    "minimum": 0,
    "description": "below the model's vocabulary size (else 400)",
}
STOP_STRING = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
MAX_TOKENS = {
    "type": "integer",
    "minimum": 1,
    "description": (
        "at most the gateway's --max-tokens-limit (default: the context length), and the "
        "prompt plus this must fit the context (GET /v1/models: max_model_len); else 400"
    ),
}
CHOICES = {"type": "integer", "minimum": 1, "maximum": MAX_CHOICES}
PENALTY = {"type": "number", "minimum": -MAX_PENALTY, "maximum": MAX_PENALTY}
TOP_LOGPROBS = {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}

# Fields both endpoints read the same way.
MODEL_FIELD = nullable(
    STRING,
    "a served model name or one of its aliases, in any case (else 404); absent: the served model",
)
SAMPLING = {
    "model": MODEL_FIELD,
    "temperature": nullable(
        {"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE}, "0 samples greedily"
    ),
    "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "top_k": nullable({"type": "integer", "minimum": -1}, "0 or -1: the whole vocabulary"),
    "min_p": nullable({"type": "number", "minimum": 0, "maximum": 1}),
    "seed": nullable(
        {"type": "integer", "minimum": SEED_RANGE.start, "maximum": SEED_RANGE.stop - 1}
    ),
    "stop": nullable(
        {
            "anyOf": [
                STOP_STRING,
                {"type": "array", "items": STOP_STRING, "maxItems": MAX_STOP_STRINGS},
            ]
        }
    ),
    "stop_token_ids": nullable(
        {"type": "array", "items": TOKEN_ID, "maxItems": MAX_STOP_TOKEN_IDS}
    ),
    "ignore_eos": nullable(BOOLEAN),
    "skip_special_tokens": nullable(BOOLEAN),
    "n": nullable(CHOICES, "choices returned, each generated on its own"),
    "presence_penalty": nullable(PENALTY, "subtracted once from every token in the output"),
    "frequency_penalty": nullable(PENALTY, "subtracted per occurrence in the output"),
    "repetition_penalty": nullable(
        {
            "type": "number",
            "minimum": REPETITION_PENALTY_RANGE[0],
            "maximum": REPETITION_PENALTY_RANGE[1],
        },
        "vLLM's: >1 discourages prompt+output tokens",
    ),
    "logit_bias": nullable(
        {
            "type": "object",
            "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {
                "type": "number",
                "minimum": -MAX_LOGIT_BIAS,
                "maximum": MAX_LOGIT_BIAS,
            },
        },
        "token id (below the vocabulary size, else 400) -> added to its logit",
    ),
    "min_tokens": nullable(
        {"type": "integer", "minimum": 0},
        "no EOS, stop token or stop string before this many tokens; at most max_tokens",
    ),
    "user": nullable(STRING, "the end user's id (accepted, not used)"),
    "response_format": nullable(
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": ["text", "json_object", "json_schema"]}},
        },
        "json_object, or json_schema {name, schema, strict}: enforced while sampling",
    ),
    "guided_json": nullable({"anyOf": [{"type": "object"}, STRING]}, "vLLM's: a JSON schema"),
    "guided_regex": nullable(STRING, "vLLM's: the whole output matches it"),
    "guided_choice": nullable({"type": "array", "items": STRING, "minItems": 1}),
    "guided_grammar": nullable(STRING, "vLLM's: a Lark or GBNF grammar"),
    "structured_outputs": nullable(
        {"type": "object"}, "vLLM's: one of json, regex, choice, grammar, json_object"
    ),
    "stream": nullable(BOOLEAN, "true: server-sent events (text/event-stream)"),
    "stream_options": nullable(
        {
            "type": "object",
            "properties": {"include_usage": nullable(BOOLEAN)},
            "description": "only with stream: true (else 400)",
        }
    ),
    "slo_ttft": nullable(
        {"type": "number", "exclusiveMinimum": 0}, "kvstack: time-to-first-token target in seconds"
    ),
    "slo_tbt": nullable(
        {"type": "number", "exclusiveMinimum": 0}, "kvstack: time-between-tokens target in seconds"
    ),
}

PROMPT = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": TOKEN_ID, "minItems": 1},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "maxItems": 1,
        },
        {
            "type": "array",
            "items": {"type": "array", "items": TOKEN_ID, "minItems": 1},
            "minItems": 1,
            "maxItems": 1,
        },
    ],
    "description": "text or token ids; one prompt per request (a one-element batch is fine)",
}

TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": STRING},
}
MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": list(CHAT_ROLES)},
        "content": {"anyOf": [STRING, {"type": "array", "items": TEXT_PART, "minItems": 1}]},
    },
}

MESSAGES = {"type": "array", "items": MESSAGE, "minItems": 1}

COMPLETION_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": PROMPT,
        "max_tokens": nullable(MAX_TOKENS, "default 16, cut to what fits"),
        "logprobs": nullable(TOP_LOGPROBS, "alternatives listed per token"),
        "echo": nullable(BOOLEAN, "the prompt's text before the reply (not with logprobs)"),
        "best_of": nullable(CHOICES, "generated; the n likeliest returned; >= n, not streamed"),
        **SAMPLING,
        **refused(UNSUPPORTED["completions"]),
    },
}

CHAT_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "messages": MESSAGES,
        "max_completion_tokens": nullable(MAX_TOKENS, "default: what fits the context"),
        "max_tokens": nullable(MAX_TOKENS, "older name of max_completion_tokens"),
        "logprobs": nullable(BOOLEAN),
        "top_logprobs": nullable(TOP_LOGPROBS, "needs logprobs: true when above 0"),
        "tools": nullable({"type": "array", "items": {"type": "object"}}, "functions offered"),
        "tool_choice": nullable(
            {"anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "object"}]},
            "required or a named function: the reply is calls, enforced while sampling",
        ),
        "parallel_tool_calls": nullable(BOOLEAN),
        **SAMPLING,
        **refused(UNSUPPORTED["chat"]),
    },
}

ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": STRING,
                "type": STRING,
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

COUNT = {"type": "integer", "minimum": 0}
USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": COUNT,
        "completion_tokens": COUNT,
        "total_tokens": COUNT,
        "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": COUNT}},
        "migrations": {
            **COUNT,
            "description": "kvstack: times the request moved to another worker",
        },
    },
}

FINISH = {"enum": list(FINISH_REASONS)}
LOGPROB = {"type": "number", "maximum": 0}
COMPLETION_LOGPROBS = {
    "type": "object",
    "properties": {
        "tokens": {"type": "array", "items": STRING},
        "token_logprobs": {"type": "array", "items": LOGPROB},
        "top_logprobs": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": LOGPROB},
        },
        "text_offset": {"type": "array", "items": COUNT},
    },
}
CHAT_TOKEN: dict[str, Any] = {
    "type": "object",
    "required": ["token", "logprob", "bytes"],
    "properties": {
        "token": STRING,
        "logprob": LOGPROB,
        "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}},
    },
}
CHAT_LOGPROBS = {
    "type": "object",
    "required": ["content"],
    "properties": {
        "content": {
            "type": "array",
            "items": {
                **CHAT_TOKEN,
                "properties": {
                    **CHAT_TOKEN["properties"],
                    "top_logprobs": {"type": "array", "items": CHAT_TOKEN},
                },
            },
        }
    },
}


def envelope(obj: str, choice: dict, usage: dict) -> dict:
    """id, object, created, model, choices (each `choice`), usage."""
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": STRING,
            "object": {"const": obj},
            "created": INTEGER,
            "model": STRING,
            "choices": {"type": "array", "items": choice},
            "usage": usage,
        },
    }


def choice(content: dict, logprobs: dict, finish: dict) -> dict:
    return {
        "type": "object",
        "required": ["index", *content, "logprobs", "finish_reason"],
        "properties": {
            "index": {"const": 0},
            **content,
            "logprobs": nullable(logprobs),
            "finish_reason": finish,
        },
    }


ASSISTANT = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {"role": {"const": "assistant"}, "content": STRING},
}
DELTA = {
    "type": "object",
    "properties": {"role": {"const": "assistant"}, "content": STRING},
    "additionalProperties": False,
}
CHUNK_USAGE = nullable(
    ref("Usage"),
    "null on content chunks when stream_options."
    "include_usage; the last chunk (no choices) carries the usage",
)

MODEL_CARD = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "root", "max_model_len", "permission"],
    "properties": {
        "id": STRING,
        "object": {"const": "model"},
        "created": INTEGER,
        "owned_by": STRING,
        "root": {**STRING, "description": "the model's Hugging Face repo id, or --model"},
        "parent": {"type": "null"},
        "max_model_len": {"type": "integer", "minimum": 1},
        "permission": {"type": "array", "items": {"type": "object"}},
    },
}

# POST /tokenize: a text prompt or chat messages, never both (as vLLM's two request kinds).
TOKENIZE_REQUEST = {
    "oneOf": [
        {
            "type": "object",
            "required": ["prompt"],
            "properties": {
                "model": MODEL_FIELD,
                "prompt": STRING,
                "messages": {"type": "null"},
                "add_special_tokens": nullable(BOOLEAN, "default true"),
            },
        },
        {
            "type": "object",
            "required": ["messages"],
            "properties": {
                "model": MODEL_FIELD,
                "prompt": {"type": "null"},
                "messages": MESSAGES,
                "add_generation_prompt": nullable(
                    BOOLEAN, "default true, as a chat completion tokenizes them"
                ),
            },
        },
    ]
}

SCHEMAS = {
    "CompletionRequest": COMPLETION_REQUEST,
    "ChatCompletionRequest": CHAT_REQUEST,
    "Error": ERROR,
    "Usage": USAGE,
    "Completion": envelope(
        "text_completion", choice({"text": STRING}, COMPLETION_LOGPROBS, FINISH), ref("Usage")
    ),
    "ChatCompletion": envelope(
        "chat.completion", choice({"message": ASSISTANT}, CHAT_LOGPROBS, FINISH), ref("Usage")
    ),
    "CompletionChunk": envelope(
        "text_completion",
        choice({"text": STRING}, COMPLETION_LOGPROBS, nullable(FINISH)),
        CHUNK_USAGE,
    ),
    "ChatCompletionChunk": envelope(
        "chat.completion.chunk",
        choice({"delta": DELTA}, CHAT_LOGPROBS, nullable(FINISH)),
        CHUNK_USAGE,
    ),
    "Model": MODEL_CARD,
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": ref("Model"), "minItems": 1},
        },
    },
    "TokenizeRequest": TOKENIZE_REQUEST,
    "Tokens": {
        "type": "object",
        "required": ["count", "max_model_len", "tokens"],
        "properties": {
            "count": COUNT,
            "max_model_len": {"type": "integer", "minimum": 1},
            "tokens": {"type": "array", "items": TOKEN_ID},
        },
    },
    "DetokenizeRequest": {
        "type": "object",
        "required": ["tokens"],
        "properties": {"model": MODEL_FIELD, "tokens": {"type": "array", "items": TOKEN_ID}},
    },
    "Text": {"type": "object", "required": ["prompt"], "properties": {"prompt": STRING}},
    "Version": {"type": "object", "required": ["version"], "properties": {"version": STRING}},
    "Ready": {
        "type": "object",
        "required": ["status", "workers", "missing"],
        "properties": {
            "status": {"enum": ["ready", "not ready"]},
            "workers": {
                "type": "object",
                "additionalProperties": COUNT,
                "description": "how many of each service take work now, by their heartbeats",
            },
            "missing": {
                "type": "array",
                "items": {"enum": ["gateway", *READY_NEEDS]},
                "description": "what keeps the gateway from serving (gateway: draining or "
                "cut off from NATS)",
            },
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "worker_id"],
        "properties": {"status": {"enum": ["ok", "unavailable"]}, "worker_id": STRING},
    },
}
