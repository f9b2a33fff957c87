"""Where a Kafka client connects, and with what settings: one value for every client jobreg makes.

A :class:`Kafka` is the bootstrap address plus the extra librdkafka properties a
secured cluster needs (``security.protocol``, ``ssl.*``, ``sasl.*``). Every
producer, consumer and admin client jobreg creates (the leader's transactional
producer, the grant producer, readers, forensics, the audit catch-up, ``write_raw``)
takes its settings from :meth:`Kafka.settings`, so the properties are given once:
``Registry.connect(..., client_config={...})``, or for the CLI a properties file as
Kafka's own tools take it (``--command-config FILE``, ``$JOBREG_KAFKA_CONFIG``).

**Secrets** may stay out of the file: a value ``${env:NAME}`` is the environment
variable ``NAME``, ``${file:PATH}`` the contents of ``PATH`` (stripped), as Kafka's
``EnvVarConfigProvider`` and ``FileConfigProvider`` do. Errors name keys, files and
variables, never a value; :func:`redacted` hides secret values for anyone who prints
a configuration.

**A refused SASL login** is one line that names the mechanism and the user, never the secret
(:func:`login_refused`; :class:`~registry.errors.AuthenticationFailed`), and text that jobreg
did not write (the broker's reason, librdkafka's complaint) is shown :func:`scrubbed` of
secret values.

**Guarded properties**: jobreg's guarantees rest on some settings (idempotent
producers, read_committed readers, writers without transactions), so a
configuration that sets one of :data:`GUARDED` is refused with the reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["GUARDED", "Kafka", "check_client_config", "java_client_options", "load_properties",
           "login_refused", "not_authorized_text", "redacted", "scrubbed", "user_of"]

GUARDED: dict[str, str] = {
    "bootstrap.servers": "give the brokers as the bootstrap address (--bootstrap)",
    "enable.idempotence": "jobreg's producers are idempotent: a retried record must never "
                          "land twice out of order",
    "transactional.id": "jobreg's leaders write without transactions (the fold fences a "
                        "stale term): a transactional producer refuses every produce outside "
                        "a transaction",
    "acks": "jobreg's writes wait for every in-sync replica (acks=all)",
    "isolation.level": "jobreg's readers read committed records only",
    "auto.offset.reset": "jobreg's readers position themselves",
    "enable.auto.commit": "jobreg's readers keep no consumer-group offsets",
    "enable.auto.offset.store": "jobreg's readers keep no consumer-group offsets",
    "group.id": "jobreg's readers use no consumer group",
    "enable.partition.eof": "jobreg's readers need it to know they have caught up",
}
"""Properties jobreg sets itself and refuses from a user's configuration, with why."""

_SECRET = re.compile(r"password|secret|jaas|token|credential|key\.pem|private", re.I)
_REF = re.compile(r"\$\{(env|file):([^}]+)\}")


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the values of secret-looking keys replaced by ``***``."""
    return {k: "***" if _SECRET.search(k) else v for k, v in config.items()}


def scrubbed(text: str, config: Mapping[str, Any]) -> str:
    """``text`` with every value of a secret-looking key of ``config`` replaced by ``***``:
    for text jobreg did not write (a broker's or librdkafka's message) before it is shown."""
    for key, value in config.items():
        if _SECRET.search(key) and value not in (None, ""):
            text = text.replace(str(value), "***")
    return text


# librdkafka's words around the broker's reason: "sasl_ssl://HOST:PORT/ID: SASL authentication
# error: REASON (after 3ms in state AUTH_REQ, 2 identical error(s) suppressed)".
_RDKAFKA_WHERE = re.compile(r"^\S+://\S+?: ")
_RDKAFKA_WHEN = re.compile(r"\s*\(after \d+ms in state \w+(, \d+ identical error\(s\) "
                           r"suppressed)?\)\s*$")
_RDKAFKA_WHAT = re.compile(r"^SASL authentication error: ")


def user_of(kafka: Kafka) -> str | None:
    """The user name the client logs in with, as its properties give it (``None``: none)."""
    config = kafka.config
    user = (config.get("sasl.username") or config.get("sasl.oauthbearer.client.id")
            or config.get("sasl.kerberos.principal"))
    return str(user) if user else None


def not_authorized_text(kafka: Kafka, operation: str, resource_type: str, resource: str,
                        code: str, hint: str = "") -> str:
    """The one line that says the broker's authorizer refused ``operation`` on a resource:
    where, who (the user, never a secret), what, the broker's error code, and ``hint``."""
    user = user_of(kafka)
    who = f"user {user!r}" if user else "this client (no SASL user: the broker's ANONYMOUS)"
    hint = f"; {hint}" if hint else ""
    return (f"{kafka.bootstrap}: {who} is not authorized: {operation} on {resource_type} "
            f"{resource!r} ({code}){hint}; an administrator grants it with an ACL (README "
            "\"Connecting to a secured cluster\")")


def login_refused(kafka: Kafka, reason: str) -> str:
    """The one line that says the broker at ``kafka`` refused its SASL login: where, the
    mechanism and the user (never the secret), and the broker's ``reason`` (librdkafka's
    message, trimmed and scrubbed of secret values)."""
    config = kafka.config
    mechanism = config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI"
    user = user_of(kafka)
    who = f"user {user!r}" if user else "no user name given"
    why = _RDKAFKA_WHAT.sub("", _RDKAFKA_WHEN.sub("", _RDKAFKA_WHERE.sub("", reason)))
    why = " ".join(scrubbed(why, config).split())
    return (f"{kafka.bootstrap} refused the SASL login (mechanism {mechanism}, {who}): {why}; "
            "check the sasl.* properties")


def check_client_config(config: Mapping[str, Any] | None) -> dict[str, str]:
    """The extra client properties as strings; :class:`ConfigError` for a guarded one or a
    key that is not a property name."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"client_config must be a mapping of property names to values, not "
                          f"{type(config).__name__}")
    out: dict[str, str] = {}
    for key, value in config.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_.-]*", key):
            raise ConfigError(f"client_config: {key!r} is not a Kafka client property name")
        if key in GUARDED:
            raise ConfigError(f"client_config: jobreg does not let {key} be set: "
                              f"{GUARDED[key]}")
        if value is None or isinstance(value, (dict, list, tuple, set)):
            raise ConfigError(f"client_config: {key} needs a plain value")
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def load_properties(path: str | os.PathLike[str],
                    environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Read a Java-style properties file (``key=value``, ``key: value`` or ``key value``;
    ``#`` and ``!`` comments; a trailing ``\\`` continues a line), resolving ``${env:NAME}``
    and ``${file:PATH}`` in values, and check it (:func:`check_client_config`)."""
    environ = os.environ if environ is None else environ
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the client properties file {str(path)!r}: "
                          f"{getattr(e, 'strerror', None) or e}") from None
    props: dict[str, str] = {}
    logical = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = (logical + raw.lstrip()) if logical else raw.strip()
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical = line[:-1]
            continue
        logical = ""
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            raise ConfigError(f"{path}:{number}: not a property line (key=value)")
        key, value = match.group(1), match.group(2).strip()
        props[key] = _resolve(value, key, f"{path}:{number}", environ)
    return check_client_config(props)


def _resolve(value: str, key: str, where: str, environ: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        kind, ref = m.group(1), m.group(2)
        if kind == "env":
            if ref not in environ:
                raise ConfigError(f"{where}: {key} refers to the environment variable {ref}, "
                                  "which is not set")
            return environ[ref]
        if "\0" in ref:  # no file has such a name (open() would raise ValueError)
            raise ConfigError(f"{where}: {key} refers to the file {ref!r}, which cannot be "
                              "read (its name holds a NUL byte)")
        try:
            return Path(ref).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{where}: {key} refers to the file {ref!r}, which cannot be "
                              f"read ({getattr(e, 'strerror', None) or e})") from None
    return _REF.sub(one, value)


@dataclass(frozen=True)
class Kafka:
    """A bootstrap address and the extra client properties for it. ``str()`` is the
    address, so messages that name where jobreg connects never show a property."""

    bootstrap: str
    config: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, where: str | Kafka) -> Kafka:
        """``where`` as a :class:`Kafka` (a plain bootstrap address has no extra properties)."""
        return where if isinstance(where, Kafka) else cls(where)

    def settings(self, defaults: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
        """A client's settings: ``defaults`` (the user's properties may change them), the
        user's properties, the bootstrap, then ``ours`` (what jobreg's guarantees need)."""
        return {**defaults, **self.config, "bootstrap.servers": self.bootstrap, **ours}

    def __str__(self) -> str:
        return self.bootstrap

    def __repr__(self) -> str:
        return f"Kafka({self.bootstrap!r}, config={redacted(self.config)!r})"


_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_SAME_IN_JAVA = {"security.protocol", "sasl.mechanism", "ssl.endpoint.identification.algorithm",
                 "client.id", "request.timeout.ms", "reconnect.backoff.ms",
                 "reconnect.backoff.max.ms", "socket.connection.setup.timeout.ms"}


def java_client_options(config: Mapping[str, str]) -> dict[str, str]:
    """The extra properties (librdkafka's names) as the Java Kafka client spells them, for
    Spark's built-in ``kafka`` source (each then takes the ``kafka.`` prefix, as Spark's
    Kafka integration guide documents). TLS with a CA file (``ssl.ca.location`` ->
    a PEM truststore) and SASL PLAIN/SCRAM with a user name and password (-> the login
    module's ``sasl.jaas.config``) translate; anything else raises :class:`ConfigError`
    naming the property: give the Java names through the source's own options, or read
    with jobreg's Python source, which takes librdkafka's names as they are."""
    out: dict[str, str] = {}
    config = dict(config)
    mechanism = config.pop("sasl.mechanism", None) or config.pop("sasl.mechanisms", None)
    if mechanism is not None:
        out["sasl.mechanism"] = mechanism
    user, password = config.pop("sasl.username", None), config.pop("sasl.password", None)
    if user is not None or password is not None:
        module = _JAAS_MODULES.get((mechanism or "GSSAPI").upper())
        if module is None or user is None or password is None:
            raise ConfigError("sasl.username/sasl.password translate to the Java client only "
                              "with sasl.mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, and "
                              "both given")

        def quoted(v: str) -> str:
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

        out["sasl.jaas.config"] = (f"{module} required username={quoted(user)} "
                                   f"password={quoted(password)};")
    ca = config.pop("ssl.ca.location", None)
    if ca is not None:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = ca
    for key, value in config.items():
        if key not in _SAME_IN_JAVA:
            raise ConfigError(f"{key} has no Java Kafka client equivalent jobreg knows: for "
                              "Spark's built-in kafka source give the Java property as a "
                              "'kafka.'-prefixed source option, or use jobreg's Python source "
                              "(--source python)")
        out[key] = value
    return out
