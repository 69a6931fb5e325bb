"""The JSON the gateway answers with, in OpenAI's shapes (completions and chat).

Streaming, in the order a client sees it:
- content chunks: `stream_chunk(req, text, first=...)`. In chat the first chunk sent carries
  `role: "assistant"` with the first text; there is never a role-only chunk ahead of the first
  token, because benchmark clients start their TTFT clock at the first chunk with choices.
- the last content chunk carries `finish_reason`.
- with `req.include_usage`: every chunk has `"usage": null`, then `usage_chunk` (no choices).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from services.gateway.protocol import GenerateRequest
from shared.logprob import TokenLogprob
from shared.model.tokenizer import Tokenizer

# All a client is sent (tool_calls: a chat reply that called tools); aborts and errors
# become errors.
FINISH_REASONS = ("stop", "length", "tool_calls")
MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way
OWNED_BY = "kvstack"


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    migrations: int = 0,
    timing: dict | None = None,
) -> dict:
    """OpenAI's usage; kvstack adds `migrations` when a lost worker's request moved on, and
    `timing`, its TTFT's breakdown (services/gateway/timing.py)."""
    body = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    extras = {"migrations": migrations} if migrations else {}
    return {**body, **extras, **({"timing": timing} if timing is not None else {})}


# -- whole responses ---------------------------------------------------------------------------


def final_response(
    req: GenerateRequest,
    text: str,
    finish_reason: str,
    token_usage: dict,
    logprobs: dict | None = None,
) -> dict:
    """A one-choice answer."""
    return choices_response(req, [choice(req, 0, text, finish_reason, logprobs)], token_usage)


def choices_response(req: GenerateRequest, choices: list[dict], token_usage: dict) -> dict:
    """The whole answer of either endpoint, its `choices` built by `choice`."""
    obj = "chat.completion" if req.endpoint == "chat" else "text_completion"
    return {**_envelope(req, obj, choices), "usage": token_usage}


def choice(
    req: GenerateRequest,
    index: int,
    text: str,
    finish_reason: str,
    logprobs: dict | None,
    message: dict | None = None,
) -> dict:
    """One choice of a whole answer: `text` for completions, a `message` for chat (its
    content and tool calls given as `message`, else `text` as content)."""
    content = (
        {"message": {"role": "assistant", **(message or {"content": text})}}
        if req.endpoint == "chat"
        else {"text": text}
    )
    return {
        "index": index,
        **content,
        "logprobs": logprobs,
        "finish_reason": _checked(finish_reason),
    }


# -- stream chunks -------------------------------------------------------------------------------


def stream_chunk(
    req: GenerateRequest,
    text: str,
    *,
    first: bool,
    logprobs: dict | None = None,
    finish_reason: str | None = None,
    index: int = 0,
) -> dict:
    """A content chunk of either endpoint; `first`: no chunk of this choice (`index`) was
    sent before this one."""
    if req.endpoint == "chat":
        return chat_chunk(
            req, text, first=first, logprobs=logprobs, finish_reason=finish_reason, index=index
        )
    return completion_chunk(req, text, logprobs=logprobs, finish_reason=finish_reason, index=index)


def completion_chunk(
    req: GenerateRequest,
    text: str,
    *,
    logprobs: dict | None = None,
    finish_reason: str | None = None,
    index: int = 0,
) -> dict:
    return _choice_chunk(req, index, {"text": text}, logprobs, finish_reason)


def chat_chunk(
    req: GenerateRequest,
    text: str,
    *,
    first: bool,
    logprobs: dict | None = None,
    finish_reason: str | None = None,
    index: int = 0,
) -> dict:
    """`first` puts the role in this chunk's delta, next to its text (never on its own)."""
    return delta_chunk(
        req, {"content": text} if text or first else {}, first=first, logprobs=logprobs,
        finish_reason=finish_reason, index=index,
    )  # fmt: skip


def delta_chunk(
    req: GenerateRequest,
    delta: dict,
    *,
    first: bool,
    logprobs: dict | None = None,
    finish_reason: str | None = None,
    index: int = 0,
) -> dict:
    """A chat chunk with any delta (content, or tool calls); `first` adds the role."""
    content = {"delta": {"role": "assistant", **delta} if first else delta}
    return _choice_chunk(req, index, content, logprobs, finish_reason)


def _choice_chunk(
    req: GenerateRequest,
    index: int,
    content: dict,
    logprobs: dict | None,
    finish_reason: str | None,
) -> dict:
    body = {
        "index": index,
        **content,
        "logprobs": logprobs,
        "finish_reason": _checked_or_none(finish_reason),
    }
    return _chunk(req, [body])


def usage_chunk(req: GenerateRequest, token_usage: dict) -> dict:
    """The last chunk before [DONE] when `req.include_usage`: usage and no choices."""
    return {**_envelope(req, _chunk_object(req), []), "usage": token_usage}


def _chunk(req: GenerateRequest, choices: list[dict]) -> dict:
    chunk = _envelope(req, _chunk_object(req), choices)
    return {**chunk, "usage": None} if req.include_usage else chunk


def _chunk_object(req: GenerateRequest) -> str:
    return "chat.completion.chunk" if req.endpoint == "chat" else "text_completion"


def _envelope(req: GenerateRequest, obj: str, choices: list[dict]) -> dict:
    return {
        "id": req.response_id,
        "object": obj,
        "created": req.created,
        "model": req.model,
        "choices": choices,
    }


def _checked(finish_reason: str) -> str:
    if finish_reason not in FINISH_REASONS:
        raise ValueError(
            f"finish_reason sent to clients must be stop or length, got {finish_reason!r}"
        )
    return finish_reason


def _checked_or_none(finish_reason: str | None) -> str | None:
    return None if finish_reason is None else _checked(finish_reason)


# -- logprobs ------------------------------------------------------------------------------------


def format_logprobs(
    req: GenerateRequest,
    tokenizer: Tokenizer | None,
    entries: Sequence[TokenLogprob] | None,
    text_offset: int = 0,
) -> dict | None:
    """Logprobs in the endpoint's format, or None when the request did not ask for them."""
    if req.logprobs is None or entries is None:
        return None
    if req.endpoint == "chat":
        return chat_logprobs(tokenizer, entries)
    return completion_logprobs(tokenizer, entries, text_offset)


def completion_logprobs(
    tokenizer: Tokenizer | None, entries: Sequence[TokenLogprob], text_offset: int = 0
) -> dict:
    """Legacy format; `text_offset`: characters of reply text before the first entry."""
    tokens = [token_text(tokenizer, entry.token_id) for entry in entries]
    return {
        "tokens": tokens,
        "token_logprobs": [_finite(entry.logprob) for entry in entries],
        "top_logprobs": [_top_by_text(tokenizer, entry) for entry in entries],
        "text_offset": list(accumulate(map(len, tokens), initial=text_offset))[:-1],
    }


def chat_logprobs(tokenizer: Tokenizer | None, entries: Sequence[TokenLogprob]) -> dict:
    return {"content": [_chat_entry(tokenizer, entry) for entry in entries]}


def token_text(tokenizer: Tokenizer | None, token_id: int) -> str:
    """One token as text, special tokens kept; vLLM's `token_id:N` without a tokenizer."""
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _top_by_text(tokenizer: Tokenizer | None, entry: TokenLogprob) -> dict[str, float]:
    # The chosen token is listed too, as OpenAI's legacy format does (logprobs + 1 entries).
    pairs = (*entry.top, (entry.token_id, entry.logprob))
    top: dict[str, float] = {}
    for token_id, logprob in pairs:
        top.setdefault(token_text(tokenizer, token_id), _finite(logprob))
    return top


def _chat_entry(tokenizer: Tokenizer | None, entry: TokenLogprob) -> dict:
    top = [_chat_token(tokenizer, token_id, logprob) for token_id, logprob in entry.top]
    return {**_chat_token(tokenizer, entry.token_id, entry.logprob), "top_logprobs": top}


def _chat_token(tokenizer: Tokenizer | None, token_id: int, logprob: float) -> dict:
    text = token_text(tokenizer, token_id)
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)
