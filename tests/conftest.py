"""Shared fixtures: one embedded broker per test session, a fresh topic per test."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Iterator

import pytest

with warnings.catch_warnings():
    # authlib, which confluent-kafka's schema registry client imports, installs
    # an "always" filter for its own deprecation warnings and then warns about
    # its httpx support on import; not ours to fix. Import it once, silenced.
    import authlib.deprecate  # noqa: F401

    warnings.simplefilter("ignore")
    import confluent_kafka.schema_registry  # noqa: F401
    from confluent_kafka.schema_registry import SchemaRegistryClient

    SchemaRegistryClient.new_client({"url": "mock://warm-up"})

from pg import pg_db, postgres_cluster, postgres_url  # noqa: E402,F401  (PostgreSQL fixtures)
from sparkfixture import spark  # noqa: E402,F401  (one local SparkSession per run)

from registry import EmbeddedBroker, Registry


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """Tansu on a free 127.0.0.1 port, stopped (by its pid) when the session ends."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return f"jobreg-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def connect(broker: EmbeddedBroker, topic: str, tmp_path) -> Iterator[Callable[..., Registry]]:
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
