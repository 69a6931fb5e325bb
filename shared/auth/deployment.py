"""A deployment's secrets, in one directory (mode 0700, every secret 0600):

    <user>.creds      NATS credentials of one identity (credentials.py)
    nats-auth.conf    nats-server's users and permissions, made from the .creds files
    data-token        the data plane's shared secret (KVSTACK_DATA_TOKEN_FILE)
    nats-route        the password of a NATS cluster's routes (routes.py)
    nats-cluster.conf a compose NATS cluster node's config (cluster_config.py)
    api-key           the gateway's bearer key (`kvstack auth init`, `kvstack up`,
                      `kvstack serve`), when none is given
    tls/              optional: the deployment's CA and nats-server certificate

`ensure_secrets` makes what is missing and keeps what exists, so a second `kvstack up`
finds the same credentials; deleting the directory (or `kvstack auth init --rotate`)
rotates them all.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shared.auth.cluster_config import ClusterNode, node_config
from shared.auth.credentials import CREDS_SUFFIX, NatsAuth, NatsCredentials, write_private
from shared.auth.roles import ANY, ROLES
from shared.auth.routes import RouteCredentials, ensure_route_credentials
from shared.auth.server_config import server_config
from shared.auth.tls import make_tls
from shared.errors import KvstackError

SERVER_CONFIG = "nats-auth.conf"
COMPOSE_CLUSTER_CONFIG = "nats-cluster.conf"
# compose.yaml's nats-cluster profile: every node routes to all three (a node's route to
# itself is dropped by nats-server), each named on its command line
COMPOSE_CLUSTER = ClusterNode("0.0.0.0:6222", ("nats-1:6222", "nats-2:6222", "nats-3:6222"))
DATA_TOKEN = "data-token"
API_KEY = "api-key"
TLS_DIR = "tls"
ADMIN = "admin"


@dataclass(frozen=True)
class Identity:
    role: str
    worker: str = ANY  # ANY: credentials shared by every worker of the role

    @property
    def user(self) -> str:
        # Unique by construction: role names have no dots, per-worker users always do.
        return self.role if self.worker == ANY else f"{self.role}.{self.worker}"


@dataclass(frozen=True)
class Secrets:
    dir: Path

    def creds_path(self, identity: Identity) -> Path:
        return self.dir / f"{identity.user}{CREDS_SUFFIX}"

    def auth(self, identity: Identity) -> NatsAuth:
        return NatsAuth(NatsCredentials.load(self.creds_path(identity)), self.tls_ca)

    @property
    def server_config(self) -> Path:
        return self.dir / SERVER_CONFIG

    @property
    def routes(self) -> RouteCredentials:
        return ensure_route_credentials(self.dir)

    @property
    def data_token_path(self) -> Path:
        return self.dir / DATA_TOKEN

    @property
    def tls_ca(self) -> str:
        ca = self.dir / TLS_DIR / "ca.pem"
        return str(ca) if ca.is_file() else ""

    def child_env(self, identity: Identity) -> dict[str, str]:
        """What a service started with these secrets finds in its environment."""
        env = {
            "KVSTACK_NATS_CREDS": str(self.creds_path(identity)),
            "KVSTACK_DATA_TOKEN_FILE": str(self.data_token_path),
        }
        return {**env, "KVSTACK_NATS_TLS_CA": self.tls_ca} if self.tls_ca else env


def ensure_secrets(
    directory: Path, identities: Iterable[Identity], tls: bool = False, rotate: bool = False
) -> Secrets:
    """Make the credentials of `identities` (and the admin's) that do not exist yet, the
    data token, with `tls` a CA and server certificate; then nats-server's config."""
    found = Secrets(Path(directory))
    found.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(found.dir, 0o700)
    for identity in {*identities, Identity(ADMIN)}:
        _ensure_creds(found, identity, rotate)
    if rotate or not found.data_token_path.is_file():
        write_private(found.data_token_path, secrets.token_urlsafe(32) + "\n")
    routes = ensure_route_credentials(found.dir, rotate)
    if tls and (rotate or not found.tls_ca):
        make_tls(found.dir / TLS_DIR)
    users = [NatsCredentials.load(p) for p in sorted(found.dir.glob(f"*{CREDS_SUFFIX}"))]
    tls_dir = found.dir / TLS_DIR if found.tls_ca else None
    write_private(found.server_config, server_config(users, tls_dir))
    compose_node = node_config(COMPOSE_CLUSTER, routes, SERVER_CONFIG, tls_dir)
    write_private(found.dir / COMPOSE_CLUSTER_CONFIG, compose_node)
    return found


def _ensure_creds(found: Secrets, identity: Identity, rotate: bool) -> None:
    if identity.role not in ROLES:
        raise KvstackError(f"no role {identity.role!r}; roles: {', '.join(ROLES)}")
    path = found.creds_path(identity)
    if path.is_file() and not rotate:
        return
    NatsCredentials(identity.user, secrets.token_urlsafe(32), identity.role, identity.worker).save(
        path
    )


def ensure_api_key(directory: Path, rotate: bool = False) -> Path:
    """The file of the API key kept in `directory`, made on first use (or anew: rotate)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / API_KEY
    if rotate or not path.is_file():
        write_private(path, secrets.token_urlsafe(32) + "\n")
    return path


def read_data_token(path: str | Path) -> str:
    return read_secret(path, "the data-plane token")


def read_api_key(path: str | Path) -> str:
    return read_secret(path, "the API key")


def read_secret(path: str | Path, what: str) -> str:
    """A secret kept in a file (surrounding whitespace dropped); a clear error when the
    file cannot be read or holds nothing."""
    try:
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise KvstackError(f"cannot read {what} file {path}: {e.strerror}") from None
    if not secret:
        raise KvstackError(f"{what} file {path} is empty")
    return secret
