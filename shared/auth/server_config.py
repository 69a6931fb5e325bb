"""The nats-server configuration of a deployment: one user per credentials file, its
password as a bcrypt hash, its permissions from the role table (roles.py)."""

from __future__ import annotations

import json
from pathlib import Path

import bcrypt

from shared.auth.credentials import NatsCredentials
from shared.auth.roles import ROLES

BCRYPT_ROUNDS = 10  # nats-server checks a hash per connection: ~50 ms, not per message


def server_config(users: list[NatsCredentials], tls_dir: Path | None = None) -> str:
    """nats-server's config text (JSON is a subset of its format; every string quoted,
    since `$SRV.>` would otherwise read as a variable)."""
    text = (
        "# Written by kvstack from the .creds files beside it; edits are overwritten.\n"
        f"authorization: {json.dumps({'users': [_user(c) for c in users]}, indent=1)}\n"
    )
    if tls_dir is not None:
        tls = {
            "cert_file": str(tls_dir / "server.pem"),
            "key_file": str(tls_dir / "server-key.pem"),
            "timeout": 5,
        }
        text += f"tls: {json.dumps(tls, indent=1)}\n"
    return text


def _user(creds: NatsCredentials) -> dict:
    role = ROLES[creds.role].for_worker(creds.worker)
    hashed = bcrypt.hashpw(creds.password.encode(), bcrypt.gensalt(BCRYPT_ROUNDS, b"2a"))
    return {
        "user": creds.user,
        "password": hashed.decode(),
        "permissions": {
            "publish": {"allow": list(role.publish)},
            "subscribe": {"allow": [*role.subscribe, f"{creds.inbox_prefix}.>"]},
            "allow_responses": True,
        },
    }
