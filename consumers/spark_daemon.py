"""Spark's Python worker daemon, with the audit job's modules imported before it forks.

Spark starts the Python workers of an executor by forking a daemon (``pyspark.daemon``,
or the module named by ``spark.python.daemon.module``, which :mod:`consumers.spark` sets to
this one). A forked worker has what the daemon imported. Spark's own daemon imports none of
ours, so every new worker paid for importing the fold, SQLAlchemy, psycopg and
confluent-kafka (0.66 s alone, 1 to 2 s on a busy machine) in the first task it ran: a slow
first batch after each start, and again whenever a worker was replaced or a fold task came
to a worker that had only read Kafka. Measured with ``local[4]`` on 2 cores: the first batch
after a start had tasks begin up to 1.9 s late.

Nothing imported here starts a thread: forking a process that runs threads can leave locks
held in the child. pyarrow and pandas start threads when imported, which is why Spark's
daemon imports them only in the child after the fork; this module does not import them
either (``consumers.audit_job`` and ``consumers.kafka_source`` import pyarrow inside
functions).
"""

from __future__ import annotations

import importlib
import sys

from registry.extras import needs

with needs("spark", "the Spark worker daemon (consumers.spark_daemon)"):
    from pyspark.daemon import manager

#: What the daemon imports before it forks (psycopg: SQLAlchemy imports its driver only
#: when an engine is made).
PRELOAD = ("psycopg", "consumers.audit_job", "consumers.kafka_source",
           "registry.audit.partition")


def preload() -> list[str]:
    """Import :data:`PRELOAD`; return the modules that could not be imported. A worker host
    whose environment lacks one of them still gets Spark's own daemon (``manager``): its
    tasks then import jobreg from what was shipped to them (``--py-files``), or fail with
    the import's own error."""
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing.append(f"{name} ({e})")
    if missing:
        print(f"consumers.spark_daemon: not preloaded: {', '.join(missing)}", file=sys.stderr)
    return missing


if __name__ == "__main__":
    preload()
    manager()
