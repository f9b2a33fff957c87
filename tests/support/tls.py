"""TLS for the tests: a throwaway CA and server certificate, and a proxy that terminates TLS
in front of the embedded broker (which then advertises the proxy's port).

The embedded broker's own ``--cert``/``--key`` flags do not give a TLS listener that works
here (README, "Connecting to a secured cluster"), so TLS ends in this proxy, as it would in
a TLS-terminating load balancer in front of Kafka: the client speaks TLS to the address the
broker advertises, and every byte after the handshake is the Kafka protocol unchanged.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .relay import Relay


@dataclass(frozen=True)
class Certs:
    """PEM files: the CA a client trusts, and the server's certificate and key."""

    ca: Path
    cert: Path
    key: Path


def make_certs(directory: Path, name: str = "jobreg test") -> Certs:
    """A CA and a certificate it signed for 127.0.0.1 and localhost, valid for a day."""
    now = dt.datetime.now(dt.UTC)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    ca_key, server_key = key(), key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
              .issuer_name(ca_name).public_key(server_key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(minutes=5))
              .not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([
                  x509.DNSName("localhost"),
                  x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .sign(ca_key, hashes.SHA256()))
    certs = Certs(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return certs


class TlsProxy(Relay):
    """Accepts TLS on 127.0.0.1:``port`` and forwards the plain bytes to ``target`` (set it
    once the broker behind it listens). Stopped by :meth:`stop`; its threads are daemons."""

    name = "tls-proxy"

    def __init__(self, certs: Certs) -> None:
        self._context = server_context(certs)
        super().__init__()

    def open(self, raw: socket.socket) -> socket.socket | None:
        """The TLS server side of ``raw`` (``None``, closed: the handshake failed)."""
        return accept_tls(self._context, raw)


def server_context(certs: Certs) -> ssl.SSLContext:
    """A TLS server context serving ``certs``' certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.cert, certs.key)
    return context


def accept_tls(context: ssl.SSLContext, raw: socket.socket) -> ssl.SSLSocket | None:
    """``raw`` after a server-side TLS handshake; ``None`` (and ``raw`` closed) if it failed."""
    try:
        return context.wrap_socket(raw, server_side=True)
    except (ssl.SSLError, OSError):  # a plaintext client, or one that does not trust us
        raw.close()
        return None
