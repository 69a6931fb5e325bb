"""The opening handshake: the receiver sends a nonce and, when it holds a token, expects
HMAC-SHA256(token, nonce) back before it accepts anything else. Each transport opens with
its own magic, so a sender of one is refused by a receiver of the other.

    receiver -> sender   HELLO    magic, version, auth required, 32-byte nonce
    sender -> receiver   proof    HMAC-SHA256(token, nonce), only when auth is required
    receiver -> sender   verdict  one byte: 1 accepted (then the transport's own extra);
                                  0, or a close, refused
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from dataclasses import dataclass

from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.sockets import deadline_of, recv_exact

HELLO = struct.Struct("<IBB32s")  # magic, version, auth required, nonce
PROOF_BYTES = 32
ACCEPTED, REFUSED = b"\x01", b"\x00"
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Greeting:
    """Which protocol a HELLO announces."""

    magic: int
    version: int
    name: str  # what a sender expected, in the error it raises on meeting another protocol


class AuthenticationError(ConnectionError):
    """The receiver refused the sender's proof (or the sender had none to give)."""


def proof_of(token: str, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), nonce, hashlib.sha256).digest()


def answer_hello(sock: socket.socket, token: str | None, greeting: Greeting) -> None:
    """Sender side of the handshake; raises AuthenticationError when refused."""
    hello = recv_exact(sock, HELLO.size, eof_ok=True)
    if hello is None:  # e.g. the receiver is at its connection cap
        raise ConnectionError("the receiver closed the connection before its HELLO")
    magic, version, auth_required, nonce = HELLO.unpack(hello)
    if (magic, version) != (greeting.magic, greeting.version):
        raise ProtocolError(f"not a {greeting.name} receiver")
    if auth_required:
        if token is None:
            raise AuthenticationError("authentication failed: the receiver needs a token")
        sock.sendall(proof_of(token, nonce))
    if sock.recv(1) != ACCEPTED:
        raise AuthenticationError("authentication failed")


def challenge(
    sock: socket.socket, token: str | None, greeting: Greeting, welcome: bytes = b""
) -> None:
    """Receiver side of the handshake; raises AuthenticationError on a wrong proof.
    `welcome` follows the verdict, so only an accepted sender learns it. The socket's
    timeout bounds the whole handshake, not each read (TimeoutError once it has passed)."""
    deadline = deadline_of(sock)
    nonce = os.urandom(32)
    sock.sendall(HELLO.pack(greeting.magic, greeting.version, token is not None, nonce))
    if token is not None:
        proof = recv_exact(sock, PROOF_BYTES, deadline=deadline)
        if not hmac.compare_digest(proof, proof_of(token, nonce)):
            sock.sendall(REFUSED)
            raise AuthenticationError("authentication failed")
    sock.sendall(ACCEPTED + welcome)
