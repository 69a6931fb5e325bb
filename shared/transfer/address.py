"""The address a data-plane listener tells its peers to dial."""

from __future__ import annotations

import socket

WILDCARDS = ("0.0.0.0", "::", "")  # bound on every interface: no address to dial


def advertised(bound: str, advertise: str = "") -> str:
    """`advertise` (host:port) when given; else `bound`, with a wildcard host (0.0.0.0,
    ::) replaced by this host's own address. So a service bound to 0.0.0.0 in a container
    or a pod advertises the address its network reaches it at, as `hostname -i` says."""
    if advertise:
        return advertise
    host, _, port = bound.rpartition(":")
    if host.strip("[]") not in WILDCARDS:
        return bound
    return f"{own_address()}:{port}"


def own_address() -> str:
    """The address this host's name resolves to (loopback where it resolves to none)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
