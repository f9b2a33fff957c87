"""SASL for the tests: a proxy that terminates SASL in front of the embedded broker, as
Kroxylicious does in front of Kafka in production.

The embedded broker cannot authenticate anyone (README, "Connecting to a secured cluster"), so
SASL ends in this proxy. Per client connection, before authentication, it speaks the part of
the Kafka protocol a broker's SASL authenticator speaks (Kafka's ``SaslServerAuthenticator``):

* ``ApiVersions`` (18) goes to the broker, and its answer comes back with ``SaslHandshake``
  (17, version 1) and ``SaslAuthenticate`` (36, versions 0-2) set to what this proxy answers;
* ``SaslHandshake`` is answered here: the mechanism if enabled, else error 33
  (UNSUPPORTED_SASL_MECHANISM) with the enabled ones, and the connection is closed;
* ``SaslAuthenticate`` is answered here: PLAIN (RFC 4616) checked against the fixture's users,
  SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802/7677) by the ``scramp`` library's server; a wrong
  password or unknown user is error 58 (SASL_AUTHENTICATION_FAILED) with Kafka's own message,
  and the connection is closed;
* any other request closes the connection (Kafka: "Unexpected Kafka request of type ... during
  SASL handshake").

After a successful authentication the connection is a byte pipe to the broker: every request
and response passes unchanged. The broker advertises the proxy's port
(``EmbeddedBroker(advertised_port=proxy.port)``), so its Metadata and FindCoordinator answers
send every later connection (the partition leader, the transaction coordinator) through the
proxy, where it authenticates again. With ``certs`` the proxy terminates TLS first
(``SASL_SSL``), otherwise the client speaks ``SASL_PLAINTEXT``.

Frames: a request is ``int32 size``, header v1 (``api_key int16, api_version int16,
correlation_id int32, client_id nullable string``), or header v2 for a flexible version (then
tagged fields), and the body. A response header is the correlation id, followed by tagged
fields for a flexible version, except ``ApiVersions``, whose response header is always v0.
"""

from __future__ import annotations

import hmac
import socket
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from registry.dev.broker import _ProtocolError, _recv_exactly

from .relay import Relay
from .tls import Certs, accept_tls, server_context

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""What the proxy can authenticate with."""

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
#: The versions this proxy answers, advertised in place of the broker's. SaslHandshake v0
#: (raw SASL tokens after it, no SaslAuthenticate) is not spoken, so it is not advertised.
ANSWERED = {SASL_HANDSHAKE: (1, 1), SASL_AUTHENTICATE: (0, 2)}
NONE, UNSUPPORTED_VERSION, UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 0, 35, 33, 58
#: Kafka's own messages (PlainSaslServer; SaslServerAuthenticator for SCRAM).
PLAIN_FAILED = "Authentication failed: Invalid username or password"
SCRAM_FAILED = ("Authentication failed during authentication due to invalid credentials with "
                "SASL mechanism {}")
_MAX_FRAME = 100 << 20
_SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM credentials


@dataclass(frozen=True)
class Login:
    """One authentication the proxy decided: which mechanism, which user, and whether it held."""

    mechanism: str
    user: str
    ok: bool


class SaslProxy(Relay):
    """Terminates SASL (and TLS, given ``certs``) on 127.0.0.1:``port`` for ``users`` (name ->
    password) with ``mechanisms``, and forwards authenticated connections to ``target``.

    :attr:`logins` lists every authentication decided, :attr:`refused` every request refused
    before one (api key), and :attr:`seen` the (api key, version) pairs answered before one,
    so a test can see that a client really authenticated, and how."""

    name = "sasl-proxy"

    def __init__(self, users: Mapping[str, str], mechanisms: Iterable[str] = MECHANISMS, *,
                 certs: Certs | None = None) -> None:
        self.mechanisms = tuple(mechanisms)
        unknown = set(self.mechanisms) - set(MECHANISMS)
        if unknown:
            raise ValueError(f"the proxy speaks {', '.join(MECHANISMS)}, not {unknown}")
        self._plain = dict(users)
        # What a SCRAM server stores per user: salt, StoredKey, ServerKey, iterations, never
        # the password (Kafka's ScramCredential).
        self._scram = {m: {u: ScramMechanism(m).make_auth_info(p, _SCRAM_ITERATIONS)
                           for u, p in users.items()}
                       for m in self.mechanisms if m.startswith("SCRAM-")}
        self._context = server_context(certs) if certs is not None else None
        self.logins: list[Login] = []
        self.refused: list[int] = []
        self.seen: set[tuple[int, int]] = set()
        self._record = threading.Lock()
        super().__init__()

    @property
    def protocol(self) -> str:
        """``security.protocol`` a client needs here."""
        return "SASL_PLAINTEXT" if self._context is None else "SASL_SSL"

    def open(self, raw: socket.socket) -> socket.socket | None:
        """The client's end: ``raw`` itself, or its TLS server side."""
        return raw if self._context is None else accept_tls(self._context, raw)

    def relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Authenticate the client, then pipe the connection's bytes unchanged."""
        try:
            authenticated = self._authenticate(client, upstream)
        except (OSError, _ProtocolError, struct.error, UnicodeDecodeError):
            return  # the connection ends (closed by Relay)
        if authenticated:
            super().relay(client, upstream)

    # -- before authentication ------------------------------------------------------------

    def _authenticate(self, client: socket.socket, upstream: socket.socket) -> bool:
        mechanism: str | None = None
        scram = None
        while True:
            frame = _read_frame(client)
            key, version, correlation, body, flexible = _request(frame)
            with self._record:
                self.seen.add((key, version))
            if key == API_VERSIONS:
                upstream.sendall(struct.pack(">i", len(frame)) + frame)
                _send(client, _api_versions(_read_frame(upstream), version))
            elif key == SASL_HANDSHAKE and mechanism is None and version in (0, 1):
                (length,) = struct.unpack_from(">h", body)
                asked = body[2:2 + length].decode()
                enabled = asked in self.mechanisms
                _send(client, struct.pack(">ihi", correlation,
                                          NONE if enabled else UNSUPPORTED_SASL_MECHANISM,
                                          len(self.mechanisms))
                      + b"".join(_string(m) for m in self.mechanisms))
                if not enabled or version == 0:  # v0 would carry raw tokens: not spoken here
                    return False
                mechanism = asked
                if asked in self._scram:
                    users = self._scram[asked]
                    scram = ScramMechanism(asked).make_server(users.__getitem__)
            elif key == SASL_AUTHENTICATE and mechanism is not None and version <= 2:
                token = _auth_bytes(body, flexible)
                if mechanism == "PLAIN":
                    user, ok = self._plain_login(token)
                    self._decided(mechanism, user, ok)
                    _send(client, _authenticate_response(correlation, version, ok, b"",
                                                         None if ok else PLAIN_FAILED))
                    return ok
                assert scram is not None
                try:
                    if scram.stage is None:  # client-first -> server-first
                        scram.set_client_first(token.decode())
                        _send(client, _authenticate_response(
                            correlation, version, True, scram.get_server_first().encode(), None))
                        continue
                    scram.set_client_final(token.decode())  # proof checked here
                    final = scram.get_server_final().encode()
                except ScramException:
                    self._decided(mechanism, _scram_user(token, scram), False)
                    _send(client, _authenticate_response(correlation, version, False, b"",
                                                         SCRAM_FAILED.format(mechanism)))
                    return False
                self._decided(mechanism, _scram_user(token, scram), True)
                _send(client, _authenticate_response(correlation, version, True, final, None))
                return True
            else:  # Kafka closes the connection: "Unexpected Kafka request ... during SASL"
                with self._record:
                    self.refused.append(key)
                return False

    def _plain_login(self, token: bytes) -> tuple[str, bool]:
        """(user, password right?) of a PLAIN message ``authzid NUL authcid NUL passwd``."""
        parts = token.split(b"\x00")
        if len(parts) != 3:
            return "", False
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        known = self._plain.get(user)
        ok = (known is not None and authzid in ("", user)
              and hmac.compare_digest(known.encode(), password.encode()))
        return user, ok

    def _decided(self, mechanism: str, user: str, ok: bool) -> None:
        with self._record:
            self.logins.append(Login(mechanism, user, ok))


def _scram_user(token: bytes, server: object) -> str:
    """The user name of a SCRAM exchange (scramp keeps the client-first-bare ``n=...,r=...``)."""
    bare = getattr(server, "client_first_bare", None) or token.decode("utf-8", "replace")
    for part in bare.split(","):
        if part.startswith("n="):
            return part[2:].replace("=2C", ",").replace("=3D", "=")
    return ""


# -- frames ---------------------------------------------------------------------------------

def _read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
    if not 0 < size <= _MAX_FRAME:
        raise _ProtocolError(f"implausible frame size {size}")
    return _recv_exactly(sock, size)


def _send(sock: socket.socket, message: bytes) -> None:
    sock.sendall(struct.pack(">i", len(message)) + message)


def _flexible(key: int, version: int) -> bool:
    """Whether a request of these three APIs uses the flexible encoding (header v2)."""
    return (key == API_VERSIONS and version >= 3) or (key == SASL_AUTHENTICATE and version >= 2)


def _request(frame: bytes) -> tuple[int, int, int, bytes, bool]:
    """(api key, version, correlation id, body, flexible) of a request frame."""
    key, version, correlation, client_id = struct.unpack_from(">hhih", frame)
    offset = 10 + max(client_id, 0)  # client_id stays an int16 string in header v2
    flexible = _flexible(key, version)
    if flexible:
        offset = _skip_tags(frame, offset)
    return key, version, correlation, frame[offset:], flexible


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def _put_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _skip_tags(data: bytes, offset: int) -> int:
    count, offset = _uvarint(data, offset)
    for _ in range(count):
        _tag, offset = _uvarint(data, offset)
        size, offset = _uvarint(data, offset)
        offset += size
    return offset


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _api_versions(frame: bytes, version: int) -> bytes:
    """The broker's ApiVersions response with SaslHandshake and SaslAuthenticate set to
    :data:`ANSWERED` (added if the broker lacks them). Header v0 whatever the version; an
    error answer (the version is too new for the broker: error 35 in the v0 layout) passes."""
    correlation, error = struct.unpack_from(">ih", frame)
    if error != NONE:
        return frame
    flexible = version >= 3
    offset = 6
    if flexible:
        count, offset = _uvarint(frame, offset)
        count -= 1
    else:
        (count,) = struct.unpack_from(">i", frame, offset)
        offset += 4
    entries: dict[int, bytes] = {}
    for _ in range(count):
        start = offset
        key = struct.unpack_from(">h", frame, offset)[0]
        offset += 6
        if flexible:
            offset = _skip_tags(frame, offset)
        entries[key] = frame[start:offset]
    for key, (low, high) in ANSWERED.items():
        entries[key] = struct.pack(">hhh", key, low, high) + (b"\x00" if flexible else b"")
    head = struct.pack(">ih", correlation, error)
    head += _put_uvarint(len(entries) + 1) if flexible else struct.pack(">i", len(entries))
    return head + b"".join(entries[k] for k in sorted(entries)) + frame[offset:]


def _auth_bytes(body: bytes, flexible: bool) -> bytes:
    if flexible:
        size, offset = _uvarint(body, 0)
        return body[offset:offset + size - 1]
    (size,) = struct.unpack_from(">i", body)
    return body[4:4 + size]


def _authenticate_response(correlation: int, version: int, ok: bool, token: bytes,
                           message: str | None) -> bytes:
    """A SaslAuthenticate response: error code, error message, auth bytes, and from v1 the
    session lifetime (0: no re-authentication); v2 is flexible (header v1, tagged fields)."""
    error = NONE if ok else SASL_AUTHENTICATION_FAILED
    raw = None if message is None else message.encode()
    if version >= 2:
        return (struct.pack(">i", correlation) + b"\x00" + struct.pack(">h", error)
                + (b"\x00" if raw is None else _put_uvarint(len(raw) + 1) + raw)
                + _put_uvarint(len(token) + 1) + token + struct.pack(">q", 0) + b"\x00")
    out = struct.pack(">ih", correlation, error)
    out += struct.pack(">h", -1) if raw is None else struct.pack(">h", len(raw)) + raw
    out += struct.pack(">i", len(token)) + token
    if version >= 1:
        out += struct.pack(">q", 0)
    return out
