"""A deployment's own certificate authority and nats-server certificate (optional TLS on
the control bus), made with `cryptography`: clients verify the server against ca.pem."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shared.auth.credentials import write_private

VALID_DAYS = 825
SERVER_NAMES = ("localhost", "nats")  # "nats": the server's name in compose.yaml


def make_tls(tls_dir: Path, names: tuple[str, ...] = SERVER_NAMES) -> None:
    """ca.pem (public), server.pem and server-key.pem (0600) in `tls_dir`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvstack deployment CA")])
    ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, is_ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvstack nats-server")])
    alt = x509.SubjectAlternativeName(
        [*(x509.DNSName(n) for n in names), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    server = _certificate(
        server_name, ca_name, server_key.public_key(), ca_key, is_ca=False, alt_names=alt
    )
    tls_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (tls_dir / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tls_dir / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    write_private(
        tls_dir / "server-key.pem",
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
    )


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key,
    signing_key,
    is_ca: bool,
    alt_names: x509.SubjectAlternativeName | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if alt_names is not None:
        builder = builder.add_extension(alt_names, critical=False)
    return builder.sign(signing_key, hashes.SHA256())
