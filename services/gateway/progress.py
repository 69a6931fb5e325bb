"""What a request has received so far, across its attempts: a new attempt continues from it.

An attempt that fails before its first token is retried from the prompt (up to
`max_attempts` placements). One that fails after tokens arrived is migrated: the prompt plus
the tokens so far become the next attempt's prompt, with the rest of `max_tokens`, so the
stream goes on with no token lost or repeated (up to `migration_limit` migrations).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from services.gateway.errors import ApiError, service_unavailable
from services.gateway.protocol import GenerateRequest
from shared.errors import is_prefix_load_failure
from shared.messages import Placement, PrefillTiming, TokenEvent
from shared.sampling_params import SamplingParams

Worker = tuple[str, str]  # (worker id, instance): one process behind an id


class WorkerLost(Exception):
    """An attempt ended in a way another worker can fix: place the request again, away
    from `workers` (while the same processes are behind their ids)."""

    def __init__(
        self, reason: str, workers: tuple[Worker, ...] = (), why: str = "worker_lost"
    ) -> None:
        super().__init__(reason)
        self.workers = workers
        self.why = why  # a metrics label: worker_lost, refused, reconnect, timeout


@dataclass
class Progress:
    req: GenerateRequest
    max_attempts: int
    migration_limit: int
    token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int | None = None  # the first attempt's: what the client's prompt reused
    attempts: int = 0
    migrations: int = 0
    lost_workers: tuple[Worker, ...] = ()  # avoided until another process takes the id
    lost_at: float = 0.0  # time.monotonic() of the latest loss
    placement: Placement | None = None  # the latest attempt's (its predicted TTFT and TBT)
    placement_seconds: float | None = None  # asking for the placement that gave a token
    prefill_timing: PrefillTiming | None = None  # the first token's prefill worker's
    decode_wait: float = 0.0  # adoption to the first decoded token, on the decode worker
    # a prefix fetch failed or stalled: later attempts compute the prefix, not load it
    recompute_prefix: bool = False

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return (*self.req.prompt_token_ids, *self.token_ids)

    @property
    def params(self) -> SamplingParams:
        """The next attempt's: what is left of the budgets, and how many of its prompt's
        tokens are output already (so penalties and a grammar see them as output)."""
        params, done = self.req.params, len(self.token_ids)
        return dataclasses.replace(
            params,
            max_tokens=params.max_tokens - done,
            min_tokens=max(0, params.min_tokens - done),
            prior_output_tokens=params.prior_output_tokens + done,
        )

    def next_attempt(self) -> str:
        """The internal id of the next attempt (its own, so no stale token mixes in)."""
        attempt_id = f"{self.req.request_id}-{self.attempts}"
        self.attempts += 1
        return attempt_id

    def record(self, event: TokenEvent) -> TokenEvent:
        """Take an event in order; returned as the client's request sees it."""
        self.token_ids.extend(event.token_ids)
        if event.prefill_timing is not None and self.prefill_timing is None:
            self.prefill_timing = event.prefill_timing
        if event.decode_wait and not self.decode_wait:
            self.decode_wait = event.decode_wait
        if self.num_cached_tokens is None:
            self.num_cached_tokens = event.num_cached_tokens
        return dataclasses.replace(
            event,
            num_prompt_tokens=self.req.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
        )

    def lost(self, failure: WorkerLost) -> None:
        """Count the failure; an ApiError when no attempt is left."""
        self.lost_workers += failure.workers
        self.lost_at = time.monotonic()
        self.recompute_prefix |= is_prefix_load_failure(str(failure))
        if not self.token_ids:
            if self.attempts >= self.max_attempts:
                raise _gave_up(f"request failed after {self.attempts} attempts: {failure}")
            return
        self.migrations += 1
        if self.migrations > self.migration_limit:
            raise _gave_up(
                f"request lost its worker {self.migrations} times (limit "
                f"{self.migration_limit}): {failure}"
            )


def _gave_up(message: str) -> ApiError:
    return service_unavailable(message, retry_after_s=1)
