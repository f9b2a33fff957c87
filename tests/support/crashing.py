"""Crash injection for the exactly-once tests of the audit job (see ``crash/sitecustomize.py``)."""

from __future__ import annotations

import os


def crashing_env(after_rows: int) -> dict[str, str]:
    """The environment of a job process that SIGKILLs itself (and, from a Spark worker, the
    driver) once the audit tables hold ``after_rows`` rows, before that batch commits:
    ``tests/support/crash/sitecustomize.py``, loaded first through ``PYTHONPATH``."""
    crash = os.path.join(os.path.dirname(__file__), "crash")
    path = os.pathsep.join(p for p in (crash, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "JOBREG_TEST_KILL_AFTER_ROWS": str(after_rows)}


def executor_crash_conf(after_rows: int, marker: str) -> list[str]:
    """``--spark-conf`` settings under which the first executor task to find ``after_rows``
    rows in the audit tables, inside its uncommitted transaction, SIGKILLs its executor's JVM
    and itself, once (``marker`` records the JVM's pid; ``crash/sitecustomize.py``). The
    executors' Python gets the crash folder first on its path; the driver is left alone."""
    crash = os.path.join(os.path.dirname(__file__), "crash")
    path = os.pathsep.join(p for p in (crash, os.environ.get("PYTHONPATH")) if p)
    return [f"spark.executorEnv.PYTHONPATH={path}",
            f"spark.executorEnv.JOBREG_TEST_KILL_EXECUTOR_AFTER_ROWS={after_rows}",
            f"spark.executorEnv.JOBREG_TEST_KILL_ONCE={marker}"]
