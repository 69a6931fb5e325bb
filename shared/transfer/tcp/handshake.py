"""The opening handshake: the receiver sends a nonce and, when it holds a token, expects
HMAC-SHA256(token, nonce) back before it accepts any frame."""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

from shared.transfer.tcp.sockets import recv_exact
from shared.transfer.tcp.wire import MAGIC, VERSION, ProtocolError

HELLO = struct.Struct("<IBB32s")  # magic, version, auth required, nonce
PROOF_BYTES = 32
ACCEPTED, REFUSED = b"\x01", b"\x00"
HANDSHAKE_TIMEOUT_S = 10.0


class AuthenticationError(ConnectionError):
    """The receiver refused the sender's proof (or the sender had none to give)."""


def proof_of(token: str, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), nonce, hashlib.sha256).digest()


def answer_hello(sock: socket.socket, token: str | None) -> None:
    """Sender side of the handshake; raises AuthenticationError when refused."""
    magic, version, auth_required, nonce = HELLO.unpack(recv_exact(sock, HELLO.size))
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a kvstack v{VERSION} receiver")
    if auth_required:
        if token is None:
            raise AuthenticationError("authentication failed: the receiver needs a token")
        sock.sendall(proof_of(token, nonce))
    if sock.recv(1) != ACCEPTED:
        raise AuthenticationError("authentication failed")


def challenge(sock: socket.socket, token: str | None) -> None:
    """Receiver side of the handshake; raises AuthenticationError on a wrong proof."""
    nonce = os.urandom(32)
    sock.sendall(HELLO.pack(MAGIC, VERSION, token is not None, nonce))
    if token is not None:
        proof = recv_exact(sock, PROOF_BYTES)
        if not hmac.compare_digest(proof, proof_of(token, nonce)):
            sock.sendall(REFUSED)
            raise AuthenticationError("authentication failed")
    sock.sendall(ACCEPTED)
