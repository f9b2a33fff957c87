"""A session-scoped Spark fixture: one local[2] session for every Spark test of a run.

Import it into a test module with ``from sparkfixture import spark  # noqa: F401``
(``tests/`` is on ``sys.path`` because ``tests/conftest.py`` is the rootdir conftest).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import pytest

#: Seconds the session took to start (reported by the tests that care).
STARTUP: dict[str, float] = {}


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local[2] SparkSession with ``jobreg-kafka`` registered and, where it can be had,
    Spark's Kafka connector on its classpath (:func:`connector`); stopped when the session
    ends.

    Skips the test when Java is missing (pyspark cannot start its JVM).
    """
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no 'java' on PATH and JAVA_HOME is not set")
    from consumers.spark import spark_session

    jars = connector()
    started = time.monotonic()
    session = spark_session(app_name="jobreg-tests", jars=jars)
    STARTUP["seconds"] = time.monotonic() - started
    try:
        yield session
    finally:
        session.stop()


#: Why Spark's Kafka connector cannot be had here, once :func:`connector` has looked.
MISSING: dict[str, str] = {}


def _required() -> bool:
    """On CI (``CI`` set) or with ``JOBREG_REQUIRE_SPARK_KAFKA=1`` the connector must be had:
    a test of Spark's ``kafka`` source fails instead of skipping."""
    return bool(os.environ.get("CI")) or os.environ.get("JOBREG_REQUIRE_SPARK_KAFKA") == "1"


def connector() -> tuple[str, ...]:
    """The jars of Spark's Kafka connector, as ``jobreg audit run`` finds them (the cache,
    else Maven Central, once: ``registry.dev.kafka.spark_kafka_jars``); () and the reason in
    :data:`MISSING` when they cannot be had."""
    import pyspark

    from consumers.spark import choose_source
    from registry.dev.kafka import spark_kafka_jars
    from registry.errors import RegistryError

    try:
        choice = choose_source("kafka", "127.0.0.1:9092", spark_version=pyspark.__version__,
                               fetch=lambda v, d: spark_kafka_jars(v, download=d))
    except RegistryError as e:
        MISSING["why"] = str(e)
        return ()
    return choice.jars


def need_source(spark: object | None, source: str) -> None:
    """Skip a test of Spark's ``kafka`` source on the embedded broker, whose ListOffsets
    under-reports batches of several records written outside a transaction (jobreg's leaders'
    since issue 35; README "What differs"): the source is not supported there, and runs on
    Apache Kafka (the suite's Kafka pass). Skip (fail on CI) where its connector is
    missing: from ``spark``'s classpath, or (``spark`` None: a test that starts a Spark
    application of its own) where :func:`connector` cannot have its jars."""
    from consumers.spark import kafka_format_available
    from support.brokers import on_embedded

    if source == "kafka" and on_embedded():
        pytest.skip("Spark's kafka source is not supported on the embedded broker: its "
                    "ListOffsets under-reports batches written outside a transaction "
                    "(README 'What differs'); it runs in the suite's Kafka pass")
    if source == "kafka" and not (connector() if spark is None else
                                  kafka_format_available(spark)):  # type: ignore[arg-type]
        why = MISSING.get("why", "not on the session's classpath")
        if _required():
            pytest.fail(f"Spark's Kafka connector is required here: {why}")
        pytest.skip(f"Spark's Kafka connector cannot be had: {why}")


#: The two sources of the audit job, as tests parametrise them.
SOURCES = ["python", "kafka"]
