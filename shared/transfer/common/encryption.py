"""Opt-in encryption of a data-plane connection (`--data-encrypt`): AES-256-GCM under keys
that no other connection uses.

Both ends derive a connection's keys with HKDF-SHA256 from the deployment's data token and
what the handshake exchanged in the open: the receiver's nonce and the sender's salt, both
fresh per connection (the salt, so that a peer replaying a nonce cannot make a sender reuse
a key). A key serves one direction (HKDF's info names it, so the other direction's would
differ; KV frames travel sender to receiver only) and numbers its records 0, 1, 2, ...: a
record's number is its GCM nonce, so no (key, nonce) pair is ever used twice, and a record
dropped, replayed or reordered fails its tag. A record is its header, sent in
clear and authenticated as associated data, then its ciphertext and a 16-byte tag.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import (
    AEADDecryptionContext,
    AEADEncryptionContext,
    Cipher,
    algorithms,
    modes,
)
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from shared.errors import KvstackError
from shared.transfer.common.frames import ProtocolError

KEY_BYTES = 32  # AES-256
SALT_BYTES = 32
TAG_BYTES = 16
NONCE_BYTES = 12
SENDER_TO_RECEIVER = b"sender to receiver"  # the direction KV frames travel
KDF_LABEL = b"kvstack data plane v1: "


class SealingKey:
    """One direction of one connection: its key and the number of its next record. Both ends
    hold one and use it in the same order, one record at a time."""

    def __init__(self, key: bytes) -> None:
        self._algorithm = algorithms.AES(key)
        self._records = 0

    def encryptor(self, header: bytes | memoryview) -> AEADEncryptionContext:
        encryptor = Cipher(self._algorithm, modes.GCM(self._next_nonce())).encryptor()
        encryptor.authenticate_additional_data(header)
        return encryptor

    def decryptor(self, header: bytes | memoryview) -> AEADDecryptionContext:
        decryptor = Cipher(self._algorithm, modes.GCM(self._next_nonce())).decryptor()
        decryptor.authenticate_additional_data(header)
        return decryptor

    def _next_nonce(self) -> bytes:
        nonce = self._records.to_bytes(NONCE_BYTES, "big")
        self._records += 1
        return nonce


def derive_key(token: str, nonce: bytes, salt: bytes, direction: bytes) -> SealingKey:
    """The key of one direction of the connection whose handshake exchanged `nonce` and `salt`."""
    hkdf = HKDF(hashes.SHA256(), KEY_BYTES, salt=nonce + salt, info=KDF_LABEL + direction)
    return SealingKey(hkdf.derive(token.encode()))


def require_token(token: str | None, encrypt: bool) -> None:
    """Encryption is keyed by the data token: refuse to run it without one."""
    if encrypt and not token:
        raise KvstackError(
            "--data-encrypt needs the data plane's shared secret (KVSTACK_DATA_TOKEN or "
            "--data-token-file): the keys of every connection come from it"
        )


def seal(key: SealingKey, header: bytes | memoryview, plaintext: bytes | memoryview) -> bytes:
    """One whole record: the ciphertext of `plaintext`, then its tag."""
    encryptor = key.encryptor(header)
    ciphertext = encryptor.update(plaintext) + encryptor.finalize()
    return ciphertext + encryptor.tag


def open_sealed(key: SealingKey, header: bytes, sealed: bytes) -> bytes:
    """The plaintext of one whole record (ciphertext and tag); ProtocolError if it fails
    authentication."""
    decryptor = key.decryptor(header)
    plaintext = decryptor.update(sealed[:-TAG_BYTES])
    check_tag(decryptor, sealed[-TAG_BYTES:])
    return plaintext


def check_tag(decryptor: AEADDecryptionContext, tag: bytes) -> None:
    try:
        decryptor.finalize_with_tag(tag)
    except InvalidTag:
        raise ProtocolError(
            "a record failed authentication: tampered with or damaged in transit, or sealed "
            "with another key"
        ) from None
