"""What a receiver allows its peers: how many connections at once and how long each may keep
it waiting, plus a warning that a flood of refusals cannot turn into a flood of log lines."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from shared.transfer.common.handshake import HANDSHAKE_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """A receiver's limits per connection. The read and idle timeouts count seconds without
    a byte; the handshake's is a deadline.

    max_connections: accepted connections at once; one more is closed at accept. Senders
        keep one connection per peer, so a receiver's fan-in is its number of senders.
    max_connections_per_peer: accepted connections at once from one peer address (IP); one
        more is closed at accept, so that one host cannot take every place. A host with a
        container of its own holds one or two (a worker's KV stream and its pool sender);
        the default leaves room for a stack whose every process shares one address
        (`kvstack up`: all on 127.0.0.1).
    handshake_timeout_s: for the whole handshake (a deadline, so a peer dripping its proof a
        byte at a time is cut as well).
    read_timeout_s: once a message has begun, or while a frame's parts are still due.
    idle_timeout_s: between frames; None keeps an idle connection open forever. Senders
        reconnect when they find theirs closed (and retire it themselves before this).
    """

    max_connections: int = 256
    max_connections_per_peer: int = 64
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    read_timeout_s: float = 30.0
    idle_timeout_s: float | None = 300.0

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_connections_per_peer) < 1:
            raise ValueError(f"connection limits must be at least 1: {self}")
        timeouts = (self.handshake_timeout_s, self.read_timeout_s, self.idle_timeout_s)
        if any(t is not None and t <= 0 for t in timeouts):
            raise ValueError(f"timeouts must be positive: {self}")


class ThrottledWarning:
    """Logs a warning at most once per `interval_s`, saying how often it was raised since;
    counts every occurrence in `total`."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.total = 0
        self._unlogged = 0
        self._next_log = 0.0
        self._lock = threading.Lock()

    def __call__(self, message: str, *args: object) -> None:
        with self._lock:
            self.total += 1
            self._unlogged += 1
            now = time.monotonic()
            if now < self._next_log:
                return
            self._next_log = now + self.interval_s
            times, self._unlogged = self._unlogged, 0
        self.logger.warning(message + " (%d time(s) since the last such warning)", *args, times)
