"""Where each service of `kvstack up` serves HTTP (/health, /metrics): fixed offsets from
one base port, so that a Prometheus config written once finds every service. The gateway
keeps its own `--port` (the API). docs/observability.md has the table.

    base + 0          kvstack up itself        base + 200 + i    decode-i
    base + 1 + i      conductor-i              base + 300 + k    the k-th attention worker
    base + 10 + i     kvstore-i                                  (attention-i-j: k = i * N + j)
    base + 100 + i    prefill-i
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from shared.errors import KvstackError

DEFAULT_BASE_PORT = 8100
# service -> (offset from the base, how many instances get a port)
SLOTS: dict[str, tuple[int, int]] = {
    "up": (0, 1),
    "conductor": (1, 9),
    "kvstore": (10, 90),
    "prefill": (100, 100),
    "decode": (200, 100),
    "attention-worker": (300, 100),
}


@dataclass(frozen=True)
class PortLayout:
    base: int = DEFAULT_BASE_PORT

    def port(self, service: str, index: int = 0) -> int:
        offset, count = SLOTS[service]
        if not 0 <= index < count:
            raise KvstackError(
                f"fixed ports fit {count} {service} instances; run more with --base-port 0 "
                "(every service on a free port)"
            )
        port = self.base + offset + index
        if port > 65535:
            raise KvstackError(f"--base-port {self.base} puts {service} past port 65535")
        return port


@dataclass(frozen=True)
class Listener:
    """One HTTP endpoint of the stack, for the port check and the Prometheus config."""

    name: str  # the child's name (its worker id), or "up"
    service: str  # "gateway", "prefill", ..., "up"
    host: str
    port: int


def check_free(listeners: list[Listener]) -> None:
    """Refuse to start when a port is taken, naming it and who wanted it: better than a
    child that fails to bind and is restarted until the supervisor gives up."""
    taken = [f"{x.host}:{x.port} ({x.name})" for x in listeners if not _free(x.host, x.port)]
    if taken:
        raise KvstackError(
            f"port{'s' if len(taken) > 1 else ''} in use: {', '.join(taken)}; stop what "
            "holds them, or move the stack with --base-port (and the API with --port)"
        )


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like the servers bind
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
