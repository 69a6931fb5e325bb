"""A request as the engine tracks it: its tokens, progress and KV naming."""

from __future__ import annotations

import enum
from collections.abc import Sequence as Seq

from shared.hashing import block_hashes, chain_hash, root_hash
from shared.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        params: SamplingParams,
        block_size: int,
        namespace: str,
    ) -> None:
        self.request_id = request_id
        self.params = params
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache
        self.num_external_tokens = 0  # prompt tokens whose KV is placed in its blocks for it
        self.invalid_reason = ""  # set when its KV cannot be trusted: no token, no reuse
        self.error_kind = ""  # how it failed, when it did (output.py's kinds)
        self.block_size = block_size
        self.root_hash = root_hash(namespace)
        self.block_hashes = block_hashes(self.token_ids, block_size, namespace)
        self.status = SeqStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_with_prior(self) -> int:
        """Output tokens, counting those of earlier attempts that its prompt carries (a
        migrated request: `params.prior_output_tokens`)."""
        return min(self.num_output_tokens + self.params.prior_output_tokens, self.num_tokens)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def append(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.num_tokens % self.block_size == 0:
            parent = self.block_hashes[-1] if self.block_hashes else self.root_hash
            self.block_hashes.append(chain_hash(parent, self.token_ids[-self.block_size :]))

    def invalidate(self, reason: str, error_kind: str) -> None:
        """It ends with an error at the end of this step: no token, none of its KV named."""
        self.invalid_reason, self.error_kind = reason, error_kind

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status = SeqStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
