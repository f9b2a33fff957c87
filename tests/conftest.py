"""Shared fixtures: one broker per test session, a fresh topic per test.

The session's broker (``broker``) is, by ``$JOBREG_TEST_BROKER``:

* ``embedded`` (the default): Tansu on 127.0.0.1, started here;
* ``kafka``: Apache Kafka (one KRaft node from Maven Central's jars,
  :class:`registry.dev.kafka.KafkaCluster`), started here on free loopback ports;

or, when ``$JOBREG_TEST_BOOTSTRAP`` (``HOST:PORT[,HOST:PORT...]``) is set, that Kafka
cluster, left as it is. On any broker but the embedded one, tests marked
``embedded_only("why")`` (they start, stop, freeze or proxy a broker of their own, or test
the embedded broker itself) are skipped with the reason "needs the embedded broker: why";
every other test runs there, each on topics of its own. The marker without a reason stops
the run at collection, on every broker.

Tests of Apache Kafka itself (marker ``kafka``) ask for ``kafka`` (one node: the session's
broker when that is Kafka) or ``kafka3`` (a three-node cluster, replication 3,
``min.insync.replicas=2``), whatever the session's broker.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import settings

with warnings.catch_warnings():
    # authlib, which confluent-kafka's schema registry client imports, installs
    # an "always" filter for its own deprecation warnings and then warns about
    # its httpx support on import; not ours to fix. Import it once, silenced.
    import authlib.deprecate  # noqa: F401

    warnings.simplefilter("ignore")
    import confluent_kafka.schema_registry  # noqa: F401
    from confluent_kafka.schema_registry import SchemaRegistryClient

    SchemaRegistryClient.new_client({"url": "mock://warm-up"})

from support.brokers import test_broker_kind  # noqa: E402
from support.pg import pg_db, postgres_cluster, postgres_url  # noqa: E402,F401  (PostgreSQL fixtures)
from support.sparkfixture import spark  # noqa: E402,F401  (one local SparkSession per run)

from registry import ConfigError, EmbeddedBroker, Registry
from registry.dev.kafka import KAFKA_VERSION, KafkaCluster
from registry.log import check_bootstrap

# CI explores the same examples on every run (a fixed seed per test), so that whether a
# change lands does not depend on the draw; run without it (the default) to search anew.
# A counterexample found either way is kept as a test of its own (test_fold_properties).
# No deadline: a loaded machine (CI's two pytest processes on two shared cores) eats any
# per-example time margin; the suite's own timeouts bound a test that hangs.
settings.register_profile("default", deadline=None)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.load_profile(os.environ.get("JOBREG_HYPOTHESIS_PROFILE", "default"))

TEST_BOOTSTRAP = "JOBREG_TEST_BOOTSTRAP"
TEST_BROKER = "JOBREG_TEST_BROKER"
EMBEDDED_ONLY = "needs the embedded broker"


def _test_bootstrap() -> str | None:
    """``$JOBREG_TEST_BOOTSTRAP``, checked to be ``HOST:PORT[,HOST:PORT...]``; else ``None``."""
    value = os.environ.get(TEST_BOOTSTRAP, "").strip()
    if not value:
        return None
    try:
        return check_bootstrap(value)
    except ConfigError as e:
        raise pytest.UsageError(f"{TEST_BOOTSTRAP}: {e}") from None


def pytest_configure(config: pytest.Config) -> None:
    _test_bootstrap()  # a malformed value stops the run before any test
    test_broker_kind()


def pytest_report_header(config: pytest.Config) -> str:
    bootstrap = _test_bootstrap()
    if bootstrap is not None:
        return f"broker: {bootstrap} (${TEST_BOOTSTRAP}); embedded_only tests are skipped"
    if test_broker_kind() == "kafka":
        return (f"broker: Apache Kafka {KAFKA_VERSION}, one node on 127.0.0.1 "
                f"(${TEST_BROKER}=kafka); embedded_only tests are skipped")
    return "broker: embedded (Tansu on 127.0.0.1)"


def _reason_of(marker: pytest.Mark) -> str:
    """The one reason an ``embedded_only`` marker gives (positionally or as ``reason=``),
    stripped; ``""`` when it gives none, an empty one or more than one."""
    given = [*marker.args, *marker.kwargs.values()]
    if len(given) != 1 or set(marker.kwargs) - {"reason"} or not isinstance(given[0], str):
        return ""
    return given[0].strip()


def _embedded_only_reason(item: pytest.Item) -> str | None:
    """Why ``item`` needs the embedded broker (the closest ``embedded_only`` marker's reason
    when a module and the test both say); ``None`` when unmarked, ``""`` when any of its
    ``embedded_only`` markers gives no reason."""
    reasons = [_reason_of(m) for m in item.iter_markers("embedded_only")]  # closest first
    if not reasons:
        return None
    return reasons[0] if all(reasons) else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Checked on every broker (not only where the marker skips), before -k/-m deselect: a
    # test marked without saying why stops the run, so no marked test can skip the rule.
    reasons = {item: _embedded_only_reason(item) for item in items}
    unexplained = [item.nodeid for item, reason in reasons.items() if reason == ""]
    if unexplained:
        more = f" (and {len(unexplained) - 5} more)" if len(unexplained) > 5 else ""
        raise pytest.UsageError(
            f"{', '.join(unexplained[:5])}{more}: the embedded_only marker needs one reason, "
            'why the test needs the embedded broker: @pytest.mark.embedded_only("freezes the '
            'broker with SIGSTOP")')
    if test_broker_kind() == "embedded":
        return
    for item, reason in reasons.items():
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"{EMBEDDED_ONLY}: {reason}"))


@dataclass(frozen=True)
class ExternalBroker:
    """The Kafka cluster of ``$JOBREG_TEST_BOOTSTRAP``: what tests use of a broker
    (``bootstrap``); nothing here starts, stops or owns it."""

    bootstrap: str


def _check_reachable(bootstrap: str, timeout: float = 15.0) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as e:
        pytest.exit(f"{TEST_BOOTSTRAP}={bootstrap}: no Kafka broker answered within "
                    f"{timeout:g} s ({e})", returncode=pytest.ExitCode.USAGE_ERROR)
    finally:
        del admin


Broker = EmbeddedBroker | KafkaCluster | ExternalBroker


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """The session's broker (module docstring): Tansu or one Apache Kafka node on free
    127.0.0.1 ports, stopped (by pid) when the session ends; or ``$JOBREG_TEST_BOOTSTRAP``'s
    cluster, left as it is."""
    bootstrap = _test_bootstrap()
    if bootstrap is not None:
        _check_reachable(bootstrap)
        yield ExternalBroker(bootstrap)
        return
    if test_broker_kind() == "kafka":
        with KafkaCluster(nodes=1) as k:
            yield k
        return
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="session")
def kafka(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """One Apache Kafka node (KRaft) on free 127.0.0.1 ports for the session: the session's
    broker when that is Kafka, else one of its own, stopped when the session ends."""
    if test_broker_kind() == "kafka" and _test_bootstrap() is None:
        yield request.getfixturevalue("broker")
        return
    with KafkaCluster(nodes=1) as k:
        yield k


@pytest.fixture(scope="session")
def kafka3() -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes (replication 3, ``min.insync.replicas=2``, unclean leader
    election off) on free 127.0.0.1 ports for the session. A test that kills, freezes or
    cuts off a node brings it back before it ends (:meth:`KafkaCluster.restart`)."""
    with KafkaCluster(nodes=3) as k:
        yield k


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    with contextlib.suppress(Exception):  # best effort: a kept topic says what it was
        admin.delete_topics([topic], operation_timeout=10)[topic].result(15)
    del admin


@pytest.fixture
def topic() -> Iterator[str]:
    """A topic name no other test uses; on a cluster of one's own ($JOBREG_TEST_BOOTSTRAP)
    its deletion is asked for after the test."""
    name = f"jobreg-test-{uuid.uuid4().hex[:12]}"
    yield name
    bootstrap = _test_bootstrap()
    if bootstrap is not None:
        _delete_topic(bootstrap, name)


@pytest.fixture
def connect(broker: Broker, topic: str,
            tmp_path) -> Iterator[Callable[..., Registry]]:
    """Factory: ``connect(namespace="prod")`` -> a Registry on this test's topic, closed afterwards.

    Every registry of a test shares one blob store in the test's temporary directory.
    """
    made: list[Registry] = []

    def make(namespace: str = "prod", **kwargs) -> Registry:
        kwargs.setdefault("blob_store", tmp_path / "blobs")
        reg = Registry.connect(broker.bootstrap, namespace, topic=topic, **kwargs)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A migrated audit database: a SQLite file, then a fresh PostgreSQL database."""
    from registry.audit.db import migrate

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'audit.db'}"
    else:
        url = request.getfixturevalue("pg_db")
    migrate(url)
    return url
