"""The audit streaming job: Spark Structured Streaming from the registry topic into the audit
database, exactly once.

Each micro-batch reaches :func:`_write_batch` on the driver (``foreachBatch``), which
hands the records, in offset order per partition, to
:class:`registry.audit.writer.AuditWriter`: the library's fold decides every record
(no rule is restated here) and the rows and the source offsets are committed in one
database transaction.

**Where the stream starts.** The database is the only progress store: at start the
job reads ``audit_progress``, folds the log up to it (no writes) and starts the query
at exactly those offsets. Spark's own checkpoint lives in a fresh temporary directory
per run, so a checkpoint that disagrees with the database (a restored backup, a
database reset) can never skip or repeat records. A batch delivered again after a
crash is cut at the database's progress by the writer.

Triggers: ``once`` is Spark's ``availableNow`` (everything there now, in batches of
at most ``max_offsets_per_trigger`` records, then stop); ``follow`` is a
processing-time trigger that runs until stopped (Ctrl-C, or ``stop_after``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from registry.audit.db import AuditError
from registry.audit.writer import AuditWriter, Pipeline
from registry.errors import ConfigError
from registry.image import LogRecord
from registry.kafka_config import Kafka, java_client_options
from registry.log import topic_partitions

__all__ = ["AuditRun", "run_audit"]


@dataclass
class AuditRun:
    """What one run of the job did."""

    batches: int
    records: int
    caught_up: int
    seconds: float
    source: str
    startup: float = 0.0
    """Seconds of :attr:`seconds` before the stream read anything: the JVM and the Spark
    session (unless one was passed in), the catch-up fold and starting the query."""


def _records(df: Any) -> list[LogRecord]:
    """The micro-batch as LogRecords, each partition in offset order."""
    from pyspark.sql import functions as F  # noqa: N812

    table = df.select(
        F.col("partition"), F.col("offset"), F.col("key"), F.col("value"),
        F.floor(F.unix_micros(F.col("timestamp")) / 1000).cast("long").alias("ms"),
    ).toArrow()
    cols = table.to_pydict()
    out = [LogRecord(o, k, v, ms, p) for p, o, k, v, ms in zip(
        cols["partition"], cols["offset"], cols["key"], cols["value"], cols["ms"], strict=True)]
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


def _first_lines(e: BaseException, limit: int = 600) -> str:
    """The start of an error's message (a failed query's carries a whole JVM trace)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def run_audit(url: str, bootstrap: str | Kafka, topic: str, *,
              mode: Literal["once", "follow"] = "once", interval: str = "1 second",
              max_offsets_per_trigger: int | None = 100_000,
              source: Literal["auto", "python", "kafka"] = "auto",
              stream: str = "audit", spark: Any = None,
              stop_after: Callable[[AuditWriter], bool] | None = None,
              stop_event: threading.Event | None = None,
              on_batch: Callable[[int, int], None] | None = None,
              timeout: float = 30.0) -> AuditRun:
    """Run the audit stream into the database at ``url`` (migrated already).

    ``on_batch(batch_id, records)`` is called after each committed batch. In ``follow``
    mode the job runs until ``stop_event`` is set or ``stop_after(writer)`` is true
    (checked after each batch and every ``interval``).
    """
    from consumers.spark import kafka_format_available, read_stream, spark_session

    started = time.monotonic()
    writer = AuditWriter(url, topic, stream=stream)
    checkpoint = tempfile.mkdtemp(prefix="jobreg-audit-ckpt-")
    query = None
    pipeline: Pipeline | None = None
    try:
        writer.require_schema()
        caught_up = writer.catch_up(bootstrap, timeout=timeout)
        partitions = topic_partitions(bootstrap, topic, timeout)
        done = writer.projection.next_offsets
        starting = json.dumps({topic: {str(p): done.get(p, -2) for p in range(partitions)}})
        spark = spark or spark_session()
        used = "kafka" if source == "kafka" or (
            source == "auto" and kafka_format_available(spark)) else "jobreg-kafka"
        if used == "kafka" and source == "auto":
            try:  # properties the Java client has no name for: librdkafka reads them
                java_client_options(Kafka.of(bootstrap).config)
            except ConfigError:
                used = "jobreg-kafka"
        # librdkafka's long-poll setting; the Java client names it fetch.max.wait.ms
        wait = {"fetch.wait.max.ms": 10} if used == "jobreg-kafka" else {"fetch.max.wait.ms": 10}
        df = read_stream(spark, bootstrap, topic, source="kafka" if used == "kafka" else "python",
                         starting_offsets=starting,
                         max_offsets_per_trigger=max_offsets_per_trigger, **wait)

        # Spark reads the next micro-batch while this one is folded and committed.
        pipeline = Pipeline(writer, on_batch=on_batch)

        def batch(frame: Any, batch_id: int) -> None:
            pipeline.submit(_records(frame), batch_id)

        sink = df.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
        sink = sink.trigger(availableNow=True) if mode == "once" else \
            sink.trigger(processingTime=interval)
        query = sink.queryName(f"jobreg_audit_{stream}").start()
        startup = time.monotonic() - started
        failure: BaseException | None = None
        try:
            if mode == "once":
                query.awaitTermination()
            else:
                while query.isActive:
                    if (stop_event is not None and stop_event.is_set()) or \
                            (stop_after is not None and stop_after(writer)):
                        break
                    query.awaitTermination(0.2)
            failure = query.exception()
        except Exception as e:  # StreamingQueryException: the query failed
            failure = e
        # Stop between triggers where possible: interrupting a running trigger makes
        # Spark log a long stack trace even though nothing is lost.
        quiet = time.monotonic() + 5
        while query.isActive and query.status.get("isTriggerActive") and \
                time.monotonic() < quiet:
            time.sleep(0.05)
        query.stop()
        closing, pipeline = pipeline, None
        closing.close()  # raises the writer's own error (AuditError, ...) if it had one
        if failure is not None:
            raise AuditError(f"the audit stream failed: {_first_lines(failure)}") from None
        return AuditRun(writer.batches, writer.rows, caught_up, time.monotonic() - started,
                        used, startup)
    finally:
        if query is not None and query.isActive:
            query.stop()
        if pipeline is not None:
            with contextlib.suppress(Exception):  # an error is raised above already
                pipeline.close()
        writer.close()
        shutil.rmtree(checkpoint, ignore_errors=True)
