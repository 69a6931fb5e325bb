"""`kvstack auth init`: a deployment's secrets for compose, Kubernetes or hand-run services.

`kvstack up` makes its own (one NATS user per service). Here the default is one user per
role, shared by every worker of the role (compose's `--scale` names workers at run time);
`--worker ROLE:ID` adds a user allowed only that worker's own subjects.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.auth.deployment import ADMIN, Identity, ensure_api_key, ensure_secrets
from shared.auth.roles import ROLES
from shared.errors import KvstackError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "auth",
        help="make NATS credentials, nats-server's config and the "
        "data plane's secret and the gateway's API key (docs/security.md)",
    )
    actions = p.add_subparsers(dest="action", required=True)
    init = actions.add_parser("init", help="write a deployment's secrets into --dir")
    init.add_argument("--dir", default="secrets", help="where (made 0700; secrets 0600)")
    init.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="ROLE:ID",
        help="also a user for one worker id (repeatable), e.g. prefill:prefill-0",
    )
    init.add_argument(
        "--tls", action="store_true", help="also a CA and a nats-server certificate (TLS on NATS)"
    )
    init.add_argument(
        "--rotate",
        action="store_true",
        help="replace every secret; restart nats-server and every service after",
    )
    init.set_defaults(run=run_init)


def run_init(args: argparse.Namespace) -> int:
    identities = [Identity(role) for role in ROLES if role != ADMIN]
    identities += [_worker(spec) for spec in args.worker]
    secrets = ensure_secrets(Path(args.dir), identities, tls=args.tls, rotate=args.rotate)
    api_key = ensure_api_key(secrets.dir, rotate=args.rotate)
    print(f"secrets in {secrets.dir}:")
    for path in sorted(secrets.dir.rglob("*")):
        if path.is_file():
            print(f"  {path.relative_to(secrets.dir)}")
    print(f"nats-server: -c {secrets.server_config}")
    print(
        f"a service: --nats-creds {secrets.dir}/ROLE.creds --data-token-file "
        f"{secrets.data_token_path}"
        + (f" --nats-tls-ca {secrets.tls_ca}" if secrets.tls_ca else "")
    )
    print(f"the gateway: --api-key-file {api_key} (clients send it as their bearer key)")
    print(f"compose: export KVSTACK_SECRETS={secrets.dir.resolve()}")
    return 0


def _worker(spec: str) -> Identity:
    role, _, worker_id = spec.partition(":")
    if role not in ROLES or not worker_id:
        raise KvstackError(
            f"--worker {spec!r}: expected ROLE:ID with ROLE one of "
            f"{', '.join(r for r in ROLES if r != ADMIN)}"
        )
    return Identity(role, worker_id)
