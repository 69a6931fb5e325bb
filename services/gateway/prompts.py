"""A request's prompt as token ids: a completion's text or ids, a chat's messages through
the model's template (tools offered in the system turn), checked against the vocabulary
and the context."""

from __future__ import annotations

from typing import Any

from services.gateway.errors import internal_error, invalid_request
from services.gateway.fields import INT_LIST, STRING, is_int
from services.gateway.limits import CHAT_ROLES, GatewayLimits
from shared.errors import InvalidRequest, KvstackError
from shared.model.tokenizer import Tokenizer
from shared.structured.tool_prompt import messages_for_template
from shared.structured.tools import ToolChoice


def completion_prompt(
    prompt: Any, tokenizer: Tokenizer | None, limits: GatewayLimits
) -> tuple[int, ...]:
    if isinstance(prompt, list) and len(prompt) == 1 and not is_int(prompt[0]):
        prompt = prompt[0]  # a one-element batch: ["text"] or [[ids]]
    if isinstance(prompt, str):
        return tuple(tokenizer_for("a text prompt", tokenizer).encode(prompt))
    if INT_LIST.accepts(prompt):
        return checked_ids(prompt, tokenizer, limits, "prompt")
    if isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid_request("Only one prompt per request is supported.", param="prompt")
    raise invalid_request("prompt must be a string or a list of token ids.", param="prompt")


def chat_prompt(
    messages: Any, tokenizer: Tokenizer | None, tools: ToolChoice | None = None
) -> tuple[int, ...]:
    if not isinstance(messages, list) or not messages:
        raise invalid_request(
            "messages must be a non-empty list of {role, content} objects.", param="messages"
        )
    turns = [chat_message(message, index) for index, message in enumerate(messages)]
    tokenizer = tokenizer_for("chat", tokenizer)
    try:
        # Tool calls and results as text, and the tools offered in the system turn, for
        # templates that know no tools (docs/structured-output.md).
        turns = messages_for_template(turns, tools.offered if tools else ())
        return tuple(tokenizer.encode_chat(turns, add_generation_prompt=True))
    except InvalidRequest as exc:
        raise invalid_request(str(exc), param="messages") from None
    except KvstackError as exc:  # the model's template is broken: our problem, not the client's
        raise internal_error(str(exc)) from None


def chat_message(message: Any, index: int) -> dict:
    if not isinstance(message, dict) or not STRING.accepts(message.get("role")):
        raise invalid_request(
            "Each message must be an object with a string role.", param=f"messages[{index}].role"
        )
    if message["role"] not in CHAT_ROLES:
        raise invalid_request(
            f"Unknown role {message['role']!r}; the roles are {', '.join(CHAT_ROLES)}.",
            param=f"messages[{index}].role",
        )
    calls = message.get("tool_calls") if message["role"] == "assistant" else None
    if calls is not None and not isinstance(calls, list):
        raise invalid_request("tool_calls must be a list.", param=f"messages[{index}].tool_calls")
    if calls and message.get("content") is None:  # a turn of calls only
        return {"role": "assistant", "content": "", "tool_calls": calls}
    turn = {"role": message["role"], "content": _chat_content(message.get("content"), index)}
    return {**turn, "tool_calls": calls} if calls else turn


def _chat_content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(map(_is_text_part, content)):
        return "\n".join(part["text"] for part in content)  # joined as vLLM joins text parts
    raise invalid_request(
        'content must be a string or a list of {"type": "text", "text": ...} parts.',
        param=f"messages[{index}].content",
    )


def _is_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def tokenizer_for(what: str, tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise invalid_request(
            f"This model has no tokenizer, so {what} cannot be used; "
            "send the prompt as a list of token ids.",
            param="prompt",
        )
    return tokenizer


def checked_ids(
    ids: list, tokenizer: Tokenizer | None, limits: GatewayLimits, param: str
) -> tuple[int, ...]:
    vocab_size = tokenizer.vocab_size if tokenizer is not None else limits.vocab_size
    bad = next((i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)), None)
    if bad is not None:
        raise invalid_request(
            f"Token id {bad} is out of vocabulary (size {vocab_size}).", param=param
        )
    return tuple(ids)


def check_prompt_length(num_tokens: int, limits: GatewayLimits, param: str) -> None:
    if num_tokens == 0:
        raise invalid_request("The prompt is empty.", param=param)
    if num_tokens >= limits.max_model_len:
        raise invalid_request(
            f"This model's maximum context length is {limits.max_model_len} tokens; your "
            f"prompt has {num_tokens} tokens, which leaves no room for output.",
            param=param,
            code="context_length_exceeded",
        )
