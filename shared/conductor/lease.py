"""Which conductor is active: the lease, as facts in and a verdict out (no I/O, no clock).

The lease is one key in a JetStream key-value bucket whose TTL is the lease's
(services/conductor/lease.py does the I/O). A conductor claims it with `create` (only one
claim can succeed), renews it with `update` against the revision it last wrote (fails once
another wrote since), and the server drops it `ttl` after the last write. The revision of
the claim is the conductor's epoch: a fencing token that every placement it makes
carries, and that grows with each new active conductor.

A holder acts only until `ttl` after it *sent* its last successful write: the server
expires the key no earlier than `ttl` after that write landed, so no other conductor can
claim before this holder has stopped (given clocks that run at the same rate; `SAFETY`
leaves room for a slow one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.errors import KvstackError

SAFETY = 0.8  # a holder acts for this share of the ttl after each write it sent
RENEWALS_PER_TTL = 4  # renew this often per ttl: a write or two may be late or lost
CLAIMS_PER_TTL = 10  # a standby tries to claim this often per ttl


@dataclass(frozen=True)
class LeaseConfig:
    ttl: float = 1.0  # seconds: a standby takes over within about this after the active dies

    def __post_init__(self) -> None:
        if not 0.1 <= self.ttl <= 60:
            raise KvstackError(f"the lease ttl must be 0.1 to 60 seconds, got {self.ttl}")

    @property
    def renew_every(self) -> float:
        return self.ttl / RENEWALS_PER_TTL

    @property
    def claim_every(self) -> float:
        return self.ttl / CLAIMS_PER_TTL


@dataclass
class Lease:
    """This conductor's hold on the lease. Times are the caller's monotonic seconds."""

    config: LeaseConfig
    revision: int = 0  # the key's revision this holder last wrote (0: not held)
    epoch: int = 0  # the revision of its claim: the fencing token of its placements
    valid_until: float = -math.inf

    @property
    def held(self) -> bool:
        return self.revision > 0

    def active(self, now: float) -> bool:
        """Whether this conductor may place now."""
        return self.held and now < self.valid_until

    def claimed(self, revision: int, sent_at: float) -> None:
        self.epoch = revision
        self.renewed(revision, sent_at)

    def renewed(self, revision: int, sent_at: float) -> None:
        self.revision = revision
        self.valid_until = sent_at + SAFETY * self.config.ttl

    def lost(self) -> None:
        """Another wrote the key since (a renewal was refused), or it expired here."""
        self.revision = 0
        self.valid_until = -math.inf

    def next_wait(self) -> float:
        """Seconds until the next renewal (held) or claim attempt (standby)."""
        return self.config.renew_every if self.held else self.config.claim_every
