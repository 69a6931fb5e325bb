"""The credentials of a stack on this machine: one NATS user per service (permissions
narrowed to its own worker id), the admin's for the stack's own checks, the data plane's
secret and, where asked for, the gateway's API key; all made on first start
(shared/auth/deployment.py) and kept in `secrets_dir`. Without a `secrets_dir` they live in
a temporary directory, removed at stop."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shared.auth.credentials import NatsAuth
from shared.auth.deployment import (
    ADMIN,
    TLS_DIR,
    Identity,
    Secrets,
    ensure_api_key,
    ensure_secrets,
)
from shared.auth.routes import RouteCredentials


@dataclass
class StackAuth:
    secrets: Secrets | None  # None: --insecure, nothing is checked
    owns_dir: bool = False
    tls: bool = False
    api_key_file: Path | None = None  # the gateway's key (None: it requires none)

    @classmethod
    def prepare(
        cls, secrets_dir: Path | None, identities: list[Identity], insecure: bool, tls: bool
    ) -> StackAuth:
        if insecure:
            return cls(None)
        if secrets_dir is None:
            directory = Path(tempfile.mkdtemp(prefix="kvstack-secrets-"))
            return cls(ensure_secrets(directory, identities, tls), True, tls)
        return cls(ensure_secrets(secrets_dir, identities, tls), False, tls)

    @property
    def server_config(self) -> Path | None:
        return self.secrets.server_config if self.secrets is not None else None

    @property
    def tls_dir(self) -> Path | None:
        """The certificates nats-server presents (None: no TLS)."""
        if self.secrets is None or not self.secrets.tls_ca:
            return None
        return self.secrets.dir / TLS_DIR

    def route_credentials(self) -> RouteCredentials | None:
        """What a NATS cluster's routes authenticate with (None: insecure, they do not)."""
        return self.secrets.routes if self.secrets is not None else None

    def require_api_key(self) -> Path | None:
        """Make (or keep) the gateway's API key among the secrets; None when insecure."""
        if self.secrets is not None:
            self.api_key_file = ensure_api_key(self.secrets.dir)
        return self.api_key_file

    def admin(self) -> NatsAuth:
        return self.secrets.auth(Identity(ADMIN)) if self.secrets else NatsAuth(insecure=True)

    def child_env(self, identity: Identity) -> tuple[dict[str, str], bool]:
        """The environment of one service, and whether its credentials are new (then
        nats-server must reload its config before they work)."""
        if self.secrets is None:
            return {"KVSTACK_INSECURE": "1"}, False
        new = not self.secrets.creds_path(identity).is_file()
        if new:
            ensure_secrets(self.secrets.dir, [identity], self.tls)
        env = self.secrets.child_env(identity)
        if identity.role == "gateway" and self.api_key_file is not None:
            env["KVSTACK_API_KEY_FILE"] = str(self.api_key_file)
        return env, new

    def close(self) -> None:
        if self.owns_dir and self.secrets is not None:
            shutil.rmtree(self.secrets.dir, ignore_errors=True)
