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
    """A local[2] SparkSession with ``jobreg-kafka`` registered; stopped when the session ends.

    Skips the test when Java is missing (pyspark cannot start its JVM).
    """
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no 'java' on PATH and JAVA_HOME is not set")
    from consumers.spark import spark_session

    started = time.monotonic()
    session = spark_session(app_name="jobreg-tests")
    STARTUP["seconds"] = time.monotonic() - started
    try:
        yield session
    finally:
        session.stop()
