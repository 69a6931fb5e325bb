"""What the gateway allows a request: the context and output limits of the served model
(`GatewayLimits`), and OpenAI's bounds on the fields that have them."""

from __future__ import annotations

from dataclasses import dataclass

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_STRING_CHARS = 1000  # each; held back while streaming, matched at every token
MAX_STOP_TOKEN_IDS = 64
MAX_TEMPERATURE = 2.0  # OpenAI's documented range is [0, 2]
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's, less "function"
SEED_RANGE = range(-(2**63), 2**64)  # what torch.Generator.manual_seed accepts
MAX_CHOICES = 16  # n and best_of: each choice is a request of its own on the workers
MAX_LOGIT_BIAS_ENTRIES = 1024


@dataclass(frozen=True)
class GatewayLimits:
    max_model_len: int  # context limit: prompt + output tokens
    max_tokens_limit: int | None = None  # cap on a requested max_tokens; None: max_model_len
    default_max_tokens: int = 16  # completions without max_tokens (OpenAI's default)
    max_body_bytes: int = 4 * 1024 * 1024
    vocab_size: int | None = None  # checks token ids when there is no tokenizer

    def __post_init__(self) -> None:
        if self.max_tokens_limit is None:
            object.__setattr__(self, "max_tokens_limit", self.max_model_len)
        if min(self.max_model_len, self.output_limit, self.default_max_tokens) < 1:
            raise ValueError(f"gateway limits must be positive: {self}")

    @property
    def output_limit(self) -> int:
        """The cap on a requested max_tokens (max_tokens_limit, resolved)."""
        return self.max_model_len if self.max_tokens_limit is None else self.max_tokens_limit
