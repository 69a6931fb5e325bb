"""Pick a data-plane implementation by name: `tcp` (default) or `mooncake` (the Mooncake
Transfer Engine, extra `rdma`: its `tcp` protocol here, `rdma` where NICs exist). Only `tcp`
encrypts (`encrypt`, `--data-encrypt`): the Transfer Engine moves bytes itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.errors import KvstackError
from shared.transfer.base import KVReceiver, KVSender, KVSink
from shared.transfer.common.limits import ConnectionLimits
from shared.transfer.tcp import TcpKVReceiver, TcpKVSender

if TYPE_CHECKING:
    import torch

TRANSPORTS = ("tcp", "mooncake")


def make_sender(
    kind: str,
    auth_token: str | None,
    protocol: str = "tcp",
    encrypt: bool = False,
    ring: bool = True,
) -> KVSender:
    """`ring`: tcp's payload through shared memory to a receiver on this host (`tcp.ring`)."""
    if kind == "mooncake":
        refuse_encryption(encrypt, "--transport mooncake")
        return _mooncake().MooncakeKVSender(auth_token=auth_token, protocol=protocol)
    return TcpKVSender(auth_token=auth_token, encrypt=encrypt, shared_memory=ring)


def make_receiver(
    kind: str,
    sink: KVSink,
    host: str,
    port: int,
    auth_token: str | None,
    memory: Sequence[torch.Tensor] = (),
    protocol: str = "tcp",
    limits: ConnectionLimits = ConnectionLimits(),
    encrypt: bool = False,
    ring: bool = True,
) -> KVReceiver:
    """`memory`: what the sink hands out destinations in (registered up front by engines
    that write one-sidedly into registered memory); `limits`: connections at once and how
    long each may keep the receiver waiting; `encrypt`: take only encrypted frames; `ring`:
    take tcp's payload through the shared memory a sender on this host offers."""
    if kind == "mooncake":
        refuse_encryption(encrypt, "--transport mooncake")
        return _mooncake().MooncakeKVReceiver(
            sink, host, port, auth_token, protocol=protocol, memory=memory, limits=limits
        )
    return TcpKVReceiver(
        sink, host, port, auth_token, limits=limits, encrypt=encrypt, shared_memory=ring
    )


def refuse_encryption(encrypt: bool, what: str) -> None:
    """Fail where KV bytes would travel in clear under `--data-encrypt`: `what` moves them
    outside the tcp transport, which is all that encryption covers."""
    if encrypt:
        raise KvstackError(
            f"--data-encrypt covers the tcp transport only: {what} would move KV bytes in "
            "clear (use --transport tcp, the kvstore pool and no attention offload, or run "
            "without --data-encrypt on a private network)"
        )


def _mooncake():
    from shared.transfer import mooncake

    if not mooncake.available():
        raise KvstackError(
            "--transport mooncake needs the Mooncake Transfer Engine: apt-get "
            "install libibverbs1 librdmacm1; pip install -e '.[rdma]'"
        )
    return mooncake
