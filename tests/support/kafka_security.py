"""Apache Kafka with security on its own listeners, as an operator would run it: no
PLAINTEXT listener at all. Clients reach it only over SASL_SSL (SCRAM-SHA-512 over TLS, the
tests' own CA, :func:`support.tls.make_certs`); the brokers talk to each other over a
SASL_SSL listener of their own as the SCRAM user ``broker``; the controller listener is SSL
with client certificates required (SCRAM cannot serve it: its credentials live in the
metadata the controllers serve), so a node's controller client is ``User:CN=localhost``, the
name in the node's certificate; the StandardAuthorizer decides every request.

Super users: ``broker``, ``admin`` (who creates topics and ACLs) and ``CN=localhost``. A
PLAINTEXT controller listener would make its peers ``User:ANONYMOUS``, which must then be a
super user (without it the broker cannot register: ``Unable to register broker 1 because
the controller returned error CLUSTER_AUTHORIZATION_FAILED``), so anyone reaching that port
would be one. Every other user can do only what :func:`grant` gives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from registry.dev.kafka import KafkaCluster

from .tls import Certs, make_certs

MECHANISM = "SCRAM-SHA-512"
CLIENT_LISTENER = "SASL_SSL"
BROKER_LISTENER = "BROKER"
SUPER_USERS = ("broker", "admin")
#: Who a node's controller client is, from its certificate (support.tls: CN=localhost).
CONTROLLER_PRINCIPAL = "CN=localhost"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass(frozen=True)
class SecuredKafka:
    """A :class:`KafkaCluster` with security on (running inside :func:`secured_kafka`), and
    how to log in to it."""

    cluster: KafkaCluster
    certs: Certs
    passwords: dict[str, str]

    @property
    def bootstrap(self) -> str:
        """The SASL_SSL listener's addresses: the only one clients can reach."""
        return self.cluster.bootstrap

    def client_config(self, user: str, password: str | None = None) -> dict[str, str]:
        """The librdkafka properties a user of ``user`` sets (the README's example)."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM,
                "sasl.username": user,
                "sasl.password": self.passwords[user] if password is None else password,
                "ssl.ca.location": str(self.certs.ca)}

    def admin(self) -> AdminClient:
        """An AdminClient logged in as the ``admin`` super user."""
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0,
                            **self.client_config("admin")})


def broker_config(certs: Certs, broker_password: str,
                  controller: str = "SSL") -> dict[str, str]:
    """The settings every node gets over :class:`KafkaCluster`'s defaults; ``controller``:
    the controller listener's protocol (``PLAINTEXT`` only to show what it would need)."""
    jaas_client = f'{_SCRAM_MODULE} required username="broker" password="{broker_password}";'
    settings = {
        "inter.broker.listener.name": BROKER_LISTENER,
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        # A server-side SCRAM listener needs a login module, with no credentials: the
        # credentials it checks are the SCRAM users in the cluster's metadata.
        f"listener.name.{CLIENT_LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config":
            f"{_SCRAM_MODULE} required;",
        # The inter-broker listener's also logs the node in, as the broker user.
        f"listener.name.{BROKER_LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config":
            jaas_client,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(_keystore(certs)),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca),
        "ssl.client.auth": "none",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": ";".join(f"User:{u}" for u in SUPER_USERS),
    }
    if controller == "SSL":
        # The controller listener: TLS both ways, the peer named by its certificate.
        settings["listener.name.controller.ssl.client.auth"] = "required"
        settings["super.users"] += f";User:{CONTROLLER_PRINCIPAL}"
    return settings


def _keystore(certs: Certs) -> Path:
    """The server's key and certificate in one PEM file (Kafka's PEM keystore)."""
    path = certs.key.parent / "server-keystore.pem"
    path.write_bytes(certs.key.read_bytes() + certs.cert.read_bytes())
    return path


def secured_cluster(directory: Path, users: dict[str, str], *, controller: str = "SSL",
                    startup_timeout: float = 90.0) -> SecuredKafka:
    """One Kafka node secured as the module docstring says, not started yet, with the SCRAM
    ``users`` (``broker`` and ``admin`` are added). ``controller``: the controller listener's
    protocol (:func:`broker_config`)."""
    certs = make_certs(directory)
    passwords = {"broker": "broker-pw-0", "admin": "admin-pw-0", **users}
    admin_login = {"security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM,
                   "sasl.username": "admin", "sasl.password": passwords["admin"],
                   "ssl.ca.location": str(certs.ca)}
    cluster = KafkaCluster(nodes=1, directory=directory / "kafka",
                           config=broker_config(certs, passwords["broker"], controller),
                           scram=passwords, startup_timeout=startup_timeout,
                           listeners=[f"{CLIENT_LISTENER}:SASL_SSL",
                                      f"{BROKER_LISTENER}:SASL_SSL"],
                           plaintext=False, client_config=admin_login,
                           controller_protocol=controller)
    return SecuredKafka(cluster, certs, passwords)


@contextmanager
def secured_kafka(directory: Path, users: dict[str, str]) -> Iterator[SecuredKafka]:
    """:func:`secured_cluster`, started, and stopped on exit."""
    secured = secured_cluster(directory, users)
    with secured.cluster:
        yield secured


def acl(user: str, resource: ResourceType, name: str, operation: AclOperation,
        pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    """An ALLOW binding for ``User:user`` from any host."""
    return AclBinding(resource, name, pattern, f"User:{user}", "*", operation,
                      AclPermissionType.ALLOW)


def grant(kafka: SecuredKafka, bindings: Iterable[AclBinding], timeout: float = 30.0) -> None:
    """Create ``bindings`` as the admin user (CreateAcls); raises what the broker refuses."""
    admin = kafka.admin()
    for future in admin.create_acls(list(bindings), request_timeout=timeout).values():
        future.result(timeout)
