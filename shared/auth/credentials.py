"""One identity's NATS credentials (a `.creds` file, mode 0600) and how a client connects
with them: user and password (nats-server checks them against a bcrypt hash), a private
reply inbox, and optionally TLS verified against the deployment's CA."""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from shared.errors import KvstackError

CREDS_SUFFIX = ".creds"


@dataclass(frozen=True)
class NatsCredentials:
    user: str
    password: str
    role: str
    worker: str  # the worker id its permissions name ("*": any of its role)

    @property
    def inbox_prefix(self) -> str:
        # Replies to this user's requests land under its own prefix, which only it may
        # subscribe to: no other client can read them with a `_INBOX.>` wildcard.
        return f"_INBOX.{self.user}"

    @classmethod
    def load(cls, path: str | Path) -> NatsCredentials:
        try:
            fields = json.loads(Path(path).read_text())
            return cls(*(str(fields[k]) for k in ("user", "password", "role", "worker")))
        except OSError as e:
            raise KvstackError(f"cannot read NATS credentials {path}: {e.strerror}") from None
        except (ValueError, KeyError, TypeError):
            raise KvstackError(
                f"{path} is not a kvstack credentials file (JSON with user, "
                "password, role and worker); make one with `kvstack auth "
                "init`"
            ) from None

    def save(self, path: Path) -> None:
        write_private(path, json.dumps(self.__dict__, indent=1) + "\n")


@dataclass(frozen=True)
class NatsAuth:
    """How a service connects: with credentials (the default, required), or with none
    when the operator said --insecure."""

    creds: NatsCredentials | None = None
    tls_ca: str = ""  # verify the server's certificate against this CA (PEM)
    insecure: bool = False  # allow an open bus: no credentials, no check

    def connect_options(self) -> dict:
        options: dict = {}
        if self.creds is not None:
            options.update(
                user=self.creds.user,
                password=self.creds.password,
                inbox_prefix=self.creds.inbox_prefix,
            )
        if self.tls_ca:
            options["tls"] = ssl.create_default_context(cafile=self.tls_ca)
        return options

    def check(self, what: str) -> None:
        if self.creds is None and not self.insecure:
            raise KvstackError(
                f"{what} needs NATS credentials: --nats-creds FILE or KVSTACK_NATS_CREDS "
                "(`kvstack up` makes them; `kvstack auth init` for compose and Kubernetes), "
                "or --insecure to run on a bus without authentication"
            )


def load_auth(creds_path: str, tls_ca: str, insecure: bool) -> NatsAuth:
    creds = NatsCredentials.load(creds_path) if creds_path else None
    if tls_ca and not Path(tls_ca).is_file():
        raise KvstackError(f"--nats-tls-ca {tls_ca}: no such file")
    return NatsAuth(creds, tls_ca, insecure)


def write_private(path: Path, text: str) -> None:
    """Write a secret readable by its owner only (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
