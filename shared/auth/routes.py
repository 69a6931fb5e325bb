"""The credentials with which the nats-server nodes of one cluster authenticate their
routes to each other: one user and a random password, made on first use and kept in the
deployment's secrets (0600) like every other secret; never a default."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from shared.auth.credentials import write_private

ROUTE_SECRET = "nats-route"  # the password's file in the secrets directory
ROUTE_USER = "kvstack-route"


@dataclass(frozen=True)
class RouteCredentials:
    user: str
    password: str  # URL-safe: it goes into every node's route URLs

    def __repr__(self) -> str:  # NOTE: never print the password in a traceback or log
        return f"RouteCredentials(user={self.user!r}, password=...)"


def ensure_route_credentials(directory: Path, rotate: bool = False) -> RouteCredentials:
    """The cluster's route credentials in `directory`, made when missing (or `rotate`)."""
    path = Path(directory) / ROUTE_SECRET
    if rotate or not path.is_file():
        write_private(path, secrets.token_urlsafe(32) + "\n")
    return RouteCredentials(ROUTE_USER, path.read_text().strip())
