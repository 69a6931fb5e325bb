"""The bearer key a gateway requires: given, read from a file, or none where that is safe.

A gateway reachable from other hosts needs a key unless the operator says --insecure; one
bound to a loopback address (the stacks `kvstack up` and the tests run on one machine) may
serve without one, with a warning.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging

from shared.auth.deployment import read_api_key
from shared.errors import KvstackError

log = logging.getLogger("kvstack.cli")


def gateway_api_key(args: argparse.Namespace) -> str:
    """--api-key, else the key in --api-key-file, else none (see the module's note)."""
    if args.api_key:
        return args.api_key
    if args.api_key_file:
        return read_api_key(args.api_key_file)
    if args.insecure:
        return ""
    if is_loopback(args.host):
        log.warning("no API key: anyone on this machine may call the gateway on %s", args.host)
        return ""
    raise KvstackError(
        f"the gateway listens on {args.host} without an API key: give --api-key-file "
        "(`kvstack auth init --dir DIR` writes DIR/api-key) or --api-key, or --insecure "
        "to let anyone who reaches it in"
    )


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine's loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False
