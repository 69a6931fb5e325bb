"""The opening handshake: the receiver sends a nonce and, when it holds a token, expects
HMAC-SHA256(token, nonce) back before it accepts anything else. Each transport opens with
its own magic, so a sender of one is refused by a receiver of the other.

    receiver -> sender   HELLO    magic, version, flags (AUTH: a proof is wanted; ENCRYPT:
                                  frames are encrypted), 32-byte nonce
    sender -> receiver   proof    HMAC-SHA256(token, nonce), only when auth is required;
                                  under ENCRYPT, a 32-byte salt first and the proof over
                                  nonce + salt (`encryption` derives the keys from both)
    receiver -> sender   verdict  one byte: 1 accepted (then the transport's own extra);
                                  0, or a close, refused

A sender checks ENCRYPT against its own setting before it answers: when the two differ it
hangs up with a ProtocolError that says so, so neither end ever takes plaintext for
ciphertext or the other way round.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from dataclasses import dataclass

from shared.transfer.common.encryption import (
    SALT_BYTES,
    SENDER_TO_RECEIVER,
    SealingKey,
    derive_key,
    require_token,
)
from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.sockets import deadline_of, recv_exact

HELLO = struct.Struct("<IBB32s")  # magic, version, flags, nonce
AUTH, ENCRYPT = 1, 2  # HELLO's flags
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


def answer_hello(
    sock: socket.socket, token: str | None, greeting: Greeting, encrypt: bool = False
) -> SealingKey | None:
    """Sender side of the handshake: the key to seal frames with under encryption (else
    None). AuthenticationError when refused, ProtocolError when the receiver speaks another
    protocol or does not agree on encryption."""
    hello = recv_exact(sock, HELLO.size, eof_ok=True)
    if hello is None:  # e.g. the receiver is at its connection cap
        raise ConnectionError("the receiver closed the connection before its HELLO")
    magic, version, flags, nonce = HELLO.unpack(hello)
    if (magic, version) != (greeting.magic, greeting.version):
        raise ProtocolError(f"not a {greeting.name} receiver")
    check_encryption(flags, encrypt)
    salt = os.urandom(SALT_BYTES) if encrypt else b""
    if flags & AUTH:
        if token is None:
            raise AuthenticationError("authentication failed: the receiver needs a token")
        sock.sendall(salt + proof_of(token, nonce + salt))
    if sock.recv(1) != ACCEPTED:
        raise AuthenticationError("authentication failed")
    return derive_key(token, nonce, salt, SENDER_TO_RECEIVER) if token and encrypt else None


def check_encryption(flags: int, encrypt: bool) -> None:
    """A sender meets its receiver's encryption setting, or hangs up saying which differs."""
    if bool(flags & ENCRYPT) == encrypt:
        return
    sides = ("the receiver", "this sender") if flags & ENCRYPT else ("this sender", "the receiver")
    raise ProtocolError(
        f"{sides[0]} encrypts KV bytes (--data-encrypt) and {sides[1]} does not: every "
        "data-plane peer needs the same setting"
    )


def challenge(
    sock: socket.socket,
    token: str | None,
    greeting: Greeting,
    welcome: bytes = b"",
    encrypt: bool = False,
) -> SealingKey | None:
    """Receiver side of the handshake: the key to open frames with under encryption (which
    needs a token; else None). AuthenticationError on a wrong proof. `welcome` follows the
    verdict, so only an accepted sender learns it. The socket's timeout bounds the whole
    handshake, not each read (TimeoutError once it has passed)."""
    require_token(token, encrypt)
    deadline = deadline_of(sock)
    nonce = os.urandom(32)
    flags = (AUTH if token is not None else 0) | (ENCRYPT if encrypt else 0)
    sock.sendall(HELLO.pack(greeting.magic, greeting.version, flags, nonce))
    salt = b"" if token is None else take_proof(sock, token, nonce, encrypt, deadline)
    sock.sendall(ACCEPTED + welcome)
    return derive_key(token, nonce, salt, SENDER_TO_RECEIVER) if token and encrypt else None


def take_proof(
    sock: socket.socket, token: str, nonce: bytes, encrypt: bool, deadline: float | None
) -> bytes:
    """Read and check the sender's proof; its salt (empty unless encrypting)."""
    answer = recv_exact(sock, (SALT_BYTES if encrypt else 0) + PROOF_BYTES, True, deadline)
    if answer is None:  # a sender hangs up here on a setting it does not share
        raise ConnectionError(
            "the sender hung up in the handshake (it had no token, or --data-encrypt "
            "differs between the two ends: the sender's error says which)"
        )
    salt, proof = answer[:-PROOF_BYTES], answer[-PROOF_BYTES:]
    if not hmac.compare_digest(proof, proof_of(token, nonce + salt)):
        sock.sendall(REFUSED)
        raise AuthenticationError("authentication failed")
    return salt
