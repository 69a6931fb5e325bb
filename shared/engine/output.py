"""What the engine reports about a request after each step."""

from __future__ import annotations

from dataclasses import dataclass

from shared.logprob import TokenLogprob

# Why a request ended with finish_reason "error" (RequestOutput.error_kind):
REQUEST_ERROR = "request"  # its own fault (its sampling, its chunk): a retry fails again
ENGINE_ERROR = "engine"  # the engine or a transfer failed: retry it elsewhere
# What it asked for cannot be done (a grammar this model's vocabulary cannot write): the
# client's to change, a 400.
UNSATISFIABLE_ERROR = "unsatisfiable"


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """The tokens (and text) a request gained in one step, and whether it is done."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    new_logprobs: tuple[TokenLogprob, ...] | None
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort" or "error"
    stop_reason: str | int | None  # the stop string or token id that ended it; the error
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    error_kind: str = ""  # with "error": REQUEST_ERROR, ENGINE_ERROR or UNSATISFIABLE_ERROR


@dataclass
class Completion:
    """A whole request's result, gathered from its step outputs."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    num_cached_tokens: int = 0

    def add(self, out: RequestOutput) -> None:
        self.token_ids.extend(out.new_token_ids)
        self.text += out.new_text
        if out.new_logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(out.new_logprobs)
        self.finish_reason = out.finish_reason
        self.num_cached_tokens = out.num_cached_tokens
