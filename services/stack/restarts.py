"""When a child that exited is started again, and when to give up on it. No I/O, no clock:
the supervisor passes `now` in, so the rules are tested with plain numbers."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    first_backoff: float = 1.0  # seconds before the first restart; doubles on each next one
    max_backoff: float = 30.0
    stable_after: float = 60.0  # a child up this long starts its backoff over
    max_restarts: int = 5  # restarts allowed within `window` seconds;
    window: float = 120.0  # an exit beyond them gives up on the child
    poll_interval: float = 0.2  # how often the supervisor looks at its children


def backoff(policy: RestartPolicy, streak: int) -> float:
    """Seconds to wait before restart number `streak + 1` of an unbroken run of exits."""
    return min(policy.first_backoff * 2**streak, policy.max_backoff)


class RestartHistory:
    """One child's exits: the delay before each restart, or None once it keeps dying."""

    def __init__(self, policy: RestartPolicy, started_at: float) -> None:
        self.policy = policy
        self.started_at = started_at
        self.streak = 0  # restarts since the child last stayed up
        self.recent: deque[float] = deque()  # times of the restarts within the window

    def started(self, now: float) -> None:
        self.started_at = now

    def exited(self, now: float) -> float | None:
        """The child exited at `now`: seconds until its restart, or None to give up."""
        policy = self.policy
        while self.recent and self.recent[0] <= now - policy.window:
            self.recent.popleft()
        if len(self.recent) >= policy.max_restarts:
            return None
        if now - self.started_at >= policy.stable_after:
            self.streak = 0
        delay = backoff(policy, self.streak)
        self.streak += 1
        self.recent.append(now)
        return delay
