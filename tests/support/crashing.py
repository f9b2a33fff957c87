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
