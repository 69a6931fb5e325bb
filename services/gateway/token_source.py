"""Where the gateway's requests get their tokens: the NATS backend (`backend.py`: placed
by the conductor, prefilled and decoded by workers), or an engine in the same process
(`services/colocated/`, `kvstack serve`). The routes, text, streaming and metrics above
it are the same for both."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from services.gateway.progress import Progress
from services.gateway.protocol import GenerateRequest
from shared.messages import TokenEvent


class TokenSource(Protocol):
    closing: bool  # shutting down: end what is in flight, each with a clear error

    def progress(self, req: GenerateRequest) -> Progress:
        """What the request has received so far (nothing yet)."""
        ...

    def generate(self, progress: Progress) -> AsyncGenerator[TokenEvent, None]:
        """The request's token events in order, the last with finished=True; an ApiError
        when it fails. Closing it early aborts the request."""
        ...
