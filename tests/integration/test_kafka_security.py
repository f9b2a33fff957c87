"""Issue 34 part 6: security on Kafka's own listener. One Apache Kafka node with no PLAINTEXT
listener (tests/support/kafka_security.py): clients reach it over SASL_SSL only (SCRAM-SHA-512,
the tests' own CA), the StandardAuthorizer decides every request, and each role holds exactly
the ACLs of the README's table (:data:`ROLES`, which a test holds to the table):

* ``creator`` creates the registry topic with jobreg's settings;
* ``jobreg``, the coordinator, claims and writes through jobreg's client with the README's
  SASL/SCRAM properties;
* ``audit`` reads (forensics, the CLI, the audit job without Spark) and is refused every
  write in one line naming the permission it lacks;
* ``nobody`` (no ACL), a wrong password and an unknown user are each refused in one line, at
  once (not after the timeout).

Spark is left out here: the audit job on Spark with SASL runs against the proxy
(test_sasl.py), and a Spark session costs more than this whole module.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)
from support.kafka_security import SecuredKafka, acl, grant, secured_cluster, secured_kafka

from registry import AuthenticationFailed, NotAuthorized, OutcomeUnknown, Registry
from registry.errors import BrokerError, BrokerStartError
from registry.forensics import Forensics
from registry.kafka_config import Kafka, load_properties
from registry.log import PlainWriter, TopicConfig, ensure_topic, write_raw

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

JOBREG = [sys.executable, "-m", "registry.cli"]
TOPIC = "jobreg"
PASSWORDS = {"creator": "creator-pw-1", "jobreg": "coordinator-pw-1", "audit": "audit-pw-1",
             "nobody": "nobody-pw-1", "revoked": "revoked-pw-1", "reader": "reader-pw-1"}
WRONG = "wr0ng-Pw-never-shown"
ENV = {"PATH": "/usr/bin:/bin"}
TIMEOUT = 60.0  # what the clients are given: a refusal must come long before it

T, X = ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
# role -> (resource type, name, pattern, operation): exactly what the README's table lists.
ROLES: dict[str, list[tuple[ResourceType, str, ResourcePatternType, AclOperation]]] = {
    "creator": [(T, TOPIC, LITERAL, AclOperation.CREATE),
                (T, TOPIC, LITERAL, AclOperation.DESCRIBE),
                (T, TOPIC, LITERAL, AclOperation.DESCRIBE_CONFIGS)],
    "jobreg": [(T, TOPIC, LITERAL, AclOperation.WRITE),
               (T, TOPIC, LITERAL, AclOperation.READ),
               (T, TOPIC, LITERAL, AclOperation.DESCRIBE_CONFIGS)],
    "audit": [(T, TOPIC, LITERAL, AclOperation.READ),
              (T, TOPIC, LITERAL, AclOperation.DESCRIBE_CONFIGS)],
}


def _bindings(user: str, role: str) -> list[AclBinding]:
    return [acl(user, kind, name, op, pattern) for kind, name, pattern, op in ROLES[role]]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """The secured node, its ACLs granted by the admin user, and the registry topic made by
    the creator (not the coordinator) with jobreg's settings."""
    with secured_kafka(tmp_path_factory.mktemp("kafka-security"), PASSWORDS) as kafka:
        grant(kafka, [*_bindings("creator", "creator"), *_bindings("jobreg", "jobreg"),
                      *_bindings("audit", "audit"), *_bindings("revoked", "jobreg"),
                      acl("reader", T, TOPIC, AclOperation.READ)])
        ensure_topic(_kafka(kafka, "creator"), TOPIC, TopicConfig(partitions=2), TIMEOUT)
        yield kafka


def _kafka(secured: SecuredKafka, user: str, password: str | None = None) -> Kafka:
    return Kafka(secured.bootstrap, secured.client_config(user, password))


def _connect(secured: SecuredKafka, user: str, namespace: str,
             password: str | None = None) -> Registry:
    return Registry.connect(secured.bootstrap, namespace, topic=TOPIC, timeout=TIMEOUT,
                            client_config=secured.client_config(user, password))


def _properties(tmp_path: Path, secured: SecuredKafka, user: str) -> tuple[Path, dict[str, str]]:
    """The README's SASL/SCRAM properties for ``user`` (its CA path made the fixture's), the
    password in the environment as the README has it."""
    path = tmp_path / f"{user}.properties"
    path.write_text(_readme_scram_properties()
                    .replace("sasl.username=jobreg", f"sasl.username={user}")
                    .replace("/etc/jobreg/kafka-ca.pem", str(secured.certs.ca)))
    return path, {**ENV, "JOBREG_KAFKA_PASSWORD": PASSWORDS.get(user, WRONG)}


def _readme_section() -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return text.split("### Connecting to a secured cluster", 1)[1].split("\n## ", 1)[0]


def _readme_scram_properties() -> str:
    [scram] = [p for p in re.findall(r"```properties\n(.*?)```", _readme_section(), re.S)
               if "sasl.mechanism=SCRAM-SHA-512" in p]
    return scram


def _cli(base: list[str], *command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*base, *command], capture_output=True, text=True, timeout=300,
                          env=env)


def _one_line(text: str) -> str:
    assert text.endswith("\n") and text.count("\n") == 1 and "Traceback" not in text, text
    return text


def _names(error: NotAuthorized, operation: str, kind: str, resource: str, user: str) -> None:
    text = str(error)
    assert "\n" not in text, text
    assert f"user {user!r} is not authorized: {operation} on {kind} {resource!r}" in text, text
    assert (error.operation, error.resource_type, error.resource) == (operation, kind, resource)


# -- the listeners ----------------------------------------------------------------------------

def test_no_listener_is_plaintext_and_the_controllers_wants_a_certificate(secured) -> None:
    """Clients and brokers on SASL_SSL, the controller listener on TLS with client
    certificates: a client with the CA but no certificate of its own gets no answer there,
    and a plaintext client gets none on the client listener."""
    node = secured.cluster.nodes[0]
    settings = secured.cluster.node_config(node)
    protocols = dict(p.split(":") for p in settings["listener.security.protocol.map"].split(","))
    assert protocols == {"CONTROLLER": "SSL", "SASL_SSL": "SASL_SSL", "BROKER": "SASL_SSL"}
    assert "PLAINTEXT" not in settings["listeners"]
    assert settings["listener.name.controller.ssl.client.auth"] == "required"
    assert "ANONYMOUS" not in settings["super.users"]
    assert _kafka_answers_plaintext(node.port) is False
    assert _kafka_answers_tls(node.controller_port, secured.certs.ca) is False


def test_a_plaintext_controller_listener_would_need_anonymous_as_a_super_user(
        tmp_path) -> None:
    """Its peers (the node's own controller client: registration, heartbeats) are
    User:ANONYMOUS; without it among the super users the node cannot register. (With it,
    anyone reaching that port would be a super user: hence SSL with certificates above.)
    Waits for the refusal in the node's log, then kills the node (by its pid)."""
    secured = secured_cluster(tmp_path, {}, controller="PLAINTEXT", startup_timeout=300)
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            secured.cluster.start()
        except BaseException as e:  # noqa: BLE001 - the test reads it
            outcome.append(e)

    starting = threading.Thread(target=start)
    starting.start()
    log = tmp_path / "kafka" / "node-1" / "logs" / "server.log"
    refused = ("Unable to register broker 1 because the controller returned error "
               "CLUSTER_AUTHORIZATION_FAILED")
    deadline = time.monotonic() + 300
    try:
        while not (log.exists() and refused in log.read_text(errors="replace")):
            assert starting.is_alive(), outcome
            assert time.monotonic() < deadline, "the node never tried to register"
            time.sleep(0.2)
    finally:
        while starting.is_alive():
            with contextlib.suppress(BrokerError):
                secured.cluster.kill(1)
            starting.join(1)
    assert len(outcome) == 1 and isinstance(outcome[0], BrokerStartError), outcome
    secured.cluster.stop()


def _api_versions_request() -> bytes:
    body = struct.pack(">hhih", 18, 0, 1, -1)  # ApiVersions v0, correlation 1, no client id
    return struct.pack(">i", len(body)) + body


def _answered(sock: socket.socket) -> bool:
    """Whether the peer answers ApiVersions in the Kafka protocol (a size, then our
    correlation id); a TLS listener answers plaintext with an alert, which is not that."""
    sock.sendall(_api_versions_request())
    try:
        head = b""
        while len(head) < 8:
            more = sock.recv(8 - len(head))
            if not more:
                return False
            head += more
    except (OSError, ssl.SSLError):
        return False
    size, correlation = struct.unpack(">ii", head)
    return 0 < size < 1 << 20 and correlation == 1


def _kafka_answers_plaintext(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        return _answered(sock)


def _kafka_answers_tls(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as sock:
                return _answered(sock)
        except (OSError, ssl.SSLError):
            return False


# -- the roles at work --------------------------------------------------------------------------

def test_the_coordinator_writes_with_exactly_its_acls(secured, tmp_path) -> None:
    """Claim, submit, cancel and a group of concurrent calls (one transaction), through the
    README's properties as they stand; the audit user reads it all back."""
    props, env = _properties(tmp_path, secured, "jobreg")
    config = load_properties(props, environ=env)
    reg = Registry.connect(secured.bootstrap, "coord", topic=TOPIC, timeout=TIMEOUT,
                           client_config=config)
    try:
        term = reg.claim_leadership("jm-1")
        term.submit("a", b"graph")
        term.cancel("a", "over SASL_SSL")
        errors: list[BaseException] = []

        def submit(i: int) -> None:
            try:
                term.submit(f"g-{i}", b"g")
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert reg.job("a").status == "CANCELLED"
    finally:
        reg.close()
    audit = Forensics.from_broker(_kafka(secured, "audit"), TOPIC, "coord", TIMEOUT)
    assert [d.job_id for d in audit.timeline("a")] == ["a", "a"]
    fresh = _connect(secured, "audit", "coord")
    try:
        assert {f"g-{i}" for i in range(8)} <= set(fresh.jobs())
        assert fresh.leader() == (1, "jm-1")
    finally:
        fresh.close()


def test_the_creator_made_the_topic_with_jobregs_settings(secured) -> None:
    admin = secured.admin()
    resource = ConfigResource("topic", TOPIC)
    entries = admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert entries["cleanup.policy"].value == "compact"
    assert entries["message.timestamp.type"].value == "LogAppendTime"


def test_the_coordinator_may_not_create_a_topic(secured) -> None:
    """It holds no CREATE: a missing topic is the administrator's to make, said in one line."""
    started = time.monotonic()
    with pytest.raises(NotAuthorized) as e:
        Registry.connect(secured.bootstrap, "coord", topic="jobreg-missing", timeout=TIMEOUT,
                         client_config=secured.client_config("jobreg"))
    assert time.monotonic() - started < TIMEOUT / 2
    _names(e.value, "CREATE", "topic", "jobreg-missing", "jobreg")
    assert "TOPIC_AUTHORIZATION_FAILED" in str(e.value)


def test_the_audit_user_reads_through_forensics_the_cli_and_the_audit_job(secured,
                                                                        tmp_path) -> None:
    reg = _connect(secured, "jobreg", "audited")
    try:
        term = reg.claim_leadership("jm-1")
        term.submit_many([(f"job-{i}", b"g") for i in range(5)])
        term.cancel("job-3", "audited")
    finally:
        reg.close()
    props, env = _properties(tmp_path, secured, "audit")
    base = [*JOBREG, "--bootstrap", secured.bootstrap, "--topic", TOPIC, "--namespace",
            "audited", "--timeout", str(TIMEOUT), "-F", str(props)]
    jobs = _cli(base, "jobs", env=env)
    assert jobs.returncode == 0 and "job-4" in jobs.stdout, jobs.stderr
    state = _cli(base, "state", "--time", "2100-01-01T00:00:00", env=env)
    assert state.returncode == 0 and "jm-1" in state.stdout, state.stderr
    timeline = _cli(base, "timeline", "job-3", env=env)
    assert timeline.returncode == 0 and "audited" in timeline.stdout, timeline.stderr
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    run = _cli(base, "audit", "run", "--once", "--plain", "--db", db, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"wrote \d+ records", run.stdout), run.stdout
    check = _cli(base, "audit", "check", "--db", db, env=env)
    assert check.returncode == 0 and "agrees with the fold" in check.stdout, check.stderr
    for out in (jobs, state, timeline, run, check):
        assert PASSWORDS["audit"] not in out.stdout + out.stderr


# -- refusals, each one line and at once ---------------------------------------------------

def test_the_audit_user_is_refused_every_write_in_one_line(secured) -> None:
    """A claim (its idempotent producer gets no producer id without WRITE on a topic: nothing
    is written) and a raw write (the same producer of grants and write_raw); the log is as it
    was."""
    reg = _connect(secured, "audit", "refused")
    try:
        started = time.monotonic()
        with pytest.raises(NotAuthorized) as claim:
            reg.claim_leadership("auditor")
        claim_s = time.monotonic() - started
        _names(claim.value, "WRITE", "topic", TOPIC, "audit")
        assert "CLUSTER_AUTHORIZATION_FAILED" in str(claim.value)
        assert len(claim.value.event_ids) == 1  # the grant it sent, refused
        started = time.monotonic()
        with pytest.raises(NotAuthorized) as raw:
            write_raw(_kafka(secured, "audit"), TOPIC, reg.partition, "refused/job/z", b"x",
                      timeout=TIMEOUT)
        raw_s = time.monotonic() - started
        _names(raw.value, "WRITE", "topic", TOPIC, "audit")
        # The same producer again (the grants' is kept by the client): confluent-kafka raises
        # a fatal error once; the writer remembers it.
        writer = PlainWriter(_kafka(secured, "audit"), TIMEOUT, TOPIC)
        try:
            for _ in range(2):
                with pytest.raises(NotAuthorized) as again:
                    writer.write(TOPIC, reg.partition, [(b"refused/job/z", b"x")])
                _names(again.value, "WRITE", "topic", TOPIC, "audit")
        finally:
            writer.close()
        assert claim_s < TIMEOUT / 2 and raw_s < TIMEOUT / 2, (claim_s, raw_s)
        print(f"\nrefused: claim in {claim_s:.2f} s: {claim.value}\n"
              f"refused: raw write in {raw_s:.2f} s: {raw.value}")
        assert reg.sync().epoch == 0 and len(reg.image.jobs) == 0
    finally:
        reg.close()


def test_a_user_without_acls_is_refused_in_one_line(secured, tmp_path) -> None:
    """The library (whose connect would create a missing topic), forensics, and the CLI."""
    started = time.monotonic()
    with pytest.raises(NotAuthorized) as connect:
        _connect(secured, "nobody", "any")
    _names(connect.value, "CREATE", "topic", TOPIC, "nobody")
    assert "DESCRIBE" in str(connect.value)
    with pytest.raises(NotAuthorized) as forensics:
        Forensics.from_broker(_kafka(secured, "nobody"), TOPIC, "any", TIMEOUT)
    _names(forensics.value, "DESCRIBE", "topic", TOPIC, "nobody")
    assert time.monotonic() - started < TIMEOUT / 2
    props, env = _properties(tmp_path, secured, "nobody")
    base = [*JOBREG, "--bootstrap", secured.bootstrap, "--topic", TOPIC, "--namespace", "any",
            "--timeout", str(TIMEOUT), "-F", str(props)]
    db = tmp_path / "never.db"
    for command in (["jobs"], ["audit", "run", "--once", "--plain", "--db", f"sqlite:///{db}"]):
        result = _cli(base, *command, env=env)
        assert result.returncode == 1 and result.stdout == "", result.stderr
        line = _one_line(result.stderr)
        assert "user 'nobody' is not authorized: DESCRIBE on topic 'jobreg'" in line, line
        print(f"\n{' '.join(command[:2])}: {line.strip()}")
    assert not db.exists()


def test_read_alone_serves_forensics_and_the_audit_job_but_not_connect(secured,
                                                                        tmp_path) -> None:
    """DESCRIBE_CONFIGS in the audit reader's row is for Registry.connect's topic check."""
    from consumers.audit_job import materialize

    reg = _connect(secured, "jobreg", "read-only")
    try:
        reg.claim_leadership("jm-1").submit("j", b"g")
    finally:
        reg.close()
    kafka = _kafka(secured, "reader")
    forensics = Forensics.from_broker(kafka, TOPIC, "read-only", TIMEOUT)
    assert [d.job_id for d in forensics.timeline("j")] == ["j"]
    run = materialize(f"sqlite:///{tmp_path / 'audit.db'}", kafka, TOPIC, engine="plain")
    assert run.records > 0
    with pytest.raises(NotAuthorized) as e:
        _connect(secured, "reader", "read-only")
    _names(e.value, "DESCRIBE_CONFIGS", "topic", TOPIC, "reader")


def test_a_reader_without_read_is_refused_at_once(secured) -> None:
    """The creator may describe the topic but not read it: the read is one line at once, not
    "made no progress" after the timeout (librdkafka retries a refused fetch for ever)."""
    started = time.monotonic()
    with pytest.raises(NotAuthorized) as e:
        Forensics.from_broker(_kafka(secured, "creator"), TOPIC, "coord", TIMEOUT)
    assert time.monotonic() - started < TIMEOUT / 2
    _names(e.value, "READ", "topic", TOPIC, "creator")


@pytest.mark.parametrize("user", ["jobreg", "ghost"])
def test_a_wrong_password_or_an_unknown_user_is_one_line_at_once(secured, tmp_path,
                                                                 user) -> None:
    """Kafka's own authenticator: AuthenticationFailed well before the client's timeout,
    in the library and in the CLI."""
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed) as e:
        Registry.connect(secured.bootstrap, "coord", topic=TOPIC, timeout=TIMEOUT,
                         client_config={**secured.client_config("jobreg", WRONG),
                                        "sasl.username": user})
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT / 2, elapsed
    text = str(e.value)
    assert "\n" not in text and WRONG not in text
    assert f"refused the SASL login (mechanism SCRAM-SHA-512, user {user!r})" in text, text
    print(f"\nwrong password for {user!r} refused in {elapsed:.2f} s: {text}")
    props, env = _properties(tmp_path, secured, user)  # WRONG for every user not in PASSWORDS
    if user == "jobreg":
        env["JOBREG_KAFKA_PASSWORD"] = WRONG
    started = time.monotonic()
    result = _cli([*JOBREG, "--bootstrap", secured.bootstrap, "--topic", TOPIC,
                   "--timeout", str(TIMEOUT), "-F", str(props)], "jobs", env=env)
    cli_s = time.monotonic() - started
    assert result.returncode == 1 and result.stdout == "", result.stderr
    line = _one_line(result.stderr)
    assert "refused the SASL login" in line and WRONG not in line, line
    assert cli_s < TIMEOUT / 2, cli_s


def test_a_write_acl_revoked_mid_term_refuses_the_next_call_in_one_line(secured) -> None:
    """The operator takes WRITE on the topic away from a leading coordinator: its next call
    is refused (not appended, so not accepted), one line, at once; nothing lands."""
    reg = _connect(secured, "revoked", "revoked")
    try:
        term = reg.claim_leadership("jm-1")
        term.submit("before", b"g")
        admin = secured.admin()
        write = AclBindingFilter(T, TOPIC, LITERAL, "User:revoked", "*", AclOperation.WRITE,
                                 AclPermissionType.ALLOW)
        for future in admin.delete_acls([write], request_timeout=TIMEOUT).values():
            assert len(future.result(TIMEOUT)) == 1
        deadline = time.monotonic() + TIMEOUT
        while admin.describe_acls(write, request_timeout=TIMEOUT).result(TIMEOUT):
            assert time.monotonic() < deadline, "the broker kept the deleted ACL"
            time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(NotAuthorized) as e:
            term.submit("after", b"g")
        elapsed = time.monotonic() - started
        assert not isinstance(e.value, OutcomeUnknown)
        _names(e.value, "WRITE", "topic", TOPIC, "revoked")
        assert len(e.value.event_ids) == 1  # the call's record, sent and refused
        assert elapsed < TIMEOUT / 2, elapsed
        print(f"\nrevoked WRITE: refused in {elapsed:.2f} s: {e.value}")
        assert "after" not in reg.sync().jobs and "before" in reg.image.jobs
    finally:
        reg.close()


# -- the README ---------------------------------------------------------------------------------

def test_the_readme_table_lists_exactly_the_acls_the_tests_grant() -> None:
    """Rows ``| role | resource | pattern | operations |`` of the section's ACL table."""
    section = _readme_section()
    rows = re.findall(r"^\| \*\*(\w[\w ]*)\*\* \(`(\w+)`\) \| (\w[\w ]*) `([^`]+)` \| (\w+) \| "
                      r"([A-Z_, ]+) \|", section, re.M)
    found: dict[str, set[tuple[str, str, str, str]]] = {}
    for _role, user, kind, name, pattern, operations in rows:
        for op in operations.split(", "):
            found.setdefault(user, set()).add((kind.lower(), name, pattern.upper(), op))
    kinds = {T: "topic", X: "transactional id"}
    expected = {user: {(kinds[k], n, p.name, op.name) for k, n, p, op in acls}
                for user, acls in ROLES.items()}
    assert found == expected
