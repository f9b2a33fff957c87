"""Shared fixtures: one broker per test session, a fresh topic per test.

The session's broker is an embedded one (Tansu on 127.0.0.1), or the Kafka cluster named by
``$JOBREG_TEST_BOOTSTRAP`` (``HOST:PORT[,HOST:PORT...]``). Against a cluster, tests marked
``embedded_only`` (they start, stop, freeze or proxy a broker of their own, or test the
embedded broker itself) are skipped with the reason "needs the embedded broker"; every other
test runs there, each on topics of its own.
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

from support.pg import pg_db, postgres_cluster, postgres_url  # noqa: E402,F401  (PostgreSQL fixtures)
from support.sparkfixture import spark  # noqa: E402,F401  (one local SparkSession per run)

from registry import ConfigError, EmbeddedBroker, Registry
from registry.log import check_bootstrap

# CI explores the same examples on every run (a fixed seed per test), so that whether a
# change lands does not depend on the draw; run without it (the default) to search anew.
# A counterexample found either way is kept as a test of its own (test_fold_properties).
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("JOBREG_HYPOTHESIS_PROFILE", "default"))

TEST_BOOTSTRAP = "JOBREG_TEST_BOOTSTRAP"
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


def pytest_report_header(config: pytest.Config) -> str:
    bootstrap = _test_bootstrap()
    if bootstrap is None:
        return "broker: embedded (Tansu on 127.0.0.1)"
    return f"broker: {bootstrap} (${TEST_BOOTSTRAP}); embedded_only tests are skipped"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _test_bootstrap() is None:
        return
    skip = pytest.mark.skip(reason=f"{EMBEDDED_ONLY} (${TEST_BOOTSTRAP} is set)")
    for item in items:
        if item.get_closest_marker("embedded_only") is not None:
            item.add_marker(skip)


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


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker | ExternalBroker]:
    """Tansu on a free 127.0.0.1 port, stopped (by its pid) when the session ends; or, when
    ``$JOBREG_TEST_BOOTSTRAP`` is set, that Kafka cluster (left as it is)."""
    bootstrap = _test_bootstrap()
    if bootstrap is not None:
        _check_reachable(bootstrap)
        yield ExternalBroker(bootstrap)
        return
    with EmbeddedBroker() as b:
        yield b


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
def connect(broker: EmbeddedBroker | ExternalBroker, topic: str,
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
