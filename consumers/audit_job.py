"""The audit streaming job: Spark Structured Streaming from the registry topic into the audit
database, exactly once, the fold running on the executors.

**Shape.** Every namespace lives on one Kafka partition, so a Kafka partition is the unit of
order. Each micro-batch reaches :func:`run_audit`'s ``foreachBatch`` function, which runs
``batch.coalesce(cores).mapInArrow(FoldTask(...), "partition int, start long, end long,
rows long").collect()`` (:func:`fold_plan`): no exchange, and never more tasks than the
executors have cores (``spark.default.parallelism``). Spark's ``kafka`` source plans one input
partition per Kafka partition and ``coalesce`` (no shuffle) hands each task whole input
partitions one after the other; ``jobreg-kafka`` is told ``maxPartitions=cores`` and plans
the groups itself (each Kafka partition whole, read in turn by one consumer), because Spark
runs every input partition of a Python source in a Python worker of its own, a cost that
``coalesce`` cannot take back. Either way a task gets whole Kafka partitions, each complete
and in offset order. Each task folds each of its Kafka partitions with the library's fold and
commits it through :class:`registry.audit.partition.PartitionWriter` (rows + that
partition's progress + its namespaces' snapshots, one transaction per Kafka partition); the
driver gets one summary row per partition and never folds. The Python workers fork from
:mod:`consumers.spark_daemon`, which has imported the fold already.

**SQLite** has one writer at a time: there the driver collects the batch (``toArrow``) and
commits it partition by partition with the same :class:`PartitionWriter`.

**Where the stream starts.** The database is the only progress store: at start the driver
raises the run's generation (:func:`registry.audit.partition.begin_run`: tasks of an older
driver are refused from then on), reads ``audit_progress`` and starts the query at exactly
those offsets; nothing is folded on the driver, each task resumes its namespaces from their
snapshots. Spark's own checkpoint lives in a fresh temporary directory per run, so a
checkpoint that disagrees with the database (a restored backup, a database reset) can never
skip or repeat records. A batch (or a task) delivered again after a crash is cut at the
partition's progress.

**Speculation stays off** (``spark.speculation=false``, set by
:func:`consumers.spark.spark_session`): a speculative copy of a task would be fenced by the
row lock and the compare-and-set, but it would fold the batch twice for nothing.

**The entry point.** :func:`materialize` is what the CLI's ``audit run`` and the demo call:
it migrates the database and runs the job with Spark or, with ``engine="plain"``, the same
fold and writes from plain Python. The audit benchmark calls :func:`run_audit` with sessions
of its own masters (:func:`spark_session`). Nothing in ``registry`` imports another module of
``consumers`` (an import contract says so).

Triggers: ``once`` is Spark's ``availableNow`` (everything there now, in batches of
at most ``max_offsets_per_trigger`` records, then stop); ``follow`` is a
processing-time trigger that runs until stopped (Ctrl-C, or ``stop_after``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from registry.audit.db import AuditError, migrate
from registry.audit.partition import PartitionCommit, PartitionWriter, log_history
from registry.audit.writer import AuditWriter, follow_plain, run_plain
from registry.errors import ConfigError, RegistryError
from registry.image import LogRecord
from registry.kafka_config import Kafka, java_client_options
from registry.log import LogReader, topic_partitions

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["SUMMARY_SCHEMA", "AuditRun", "FoldTask", "StreamFailed", "choose_source", "fold_plan",
           "root_cause", "run_audit"]

SUMMARY_SCHEMA = "partition int, start long, end long, rows long, newest long"
"""What each task returns to the driver: one row per Kafka partition it committed (``newest``:
the newest log time written, ms, or null)."""


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
    session (unless one was passed in), starting the run and starting the query."""


def _columns(df: Any) -> Any:
    """The micro-batch's columns the fold needs (a narrow projection: no exchange)."""
    from pyspark.sql import functions as F  # noqa: N812

    return df.select(
        F.col("partition"), F.col("offset"), F.col("key"), F.col("value"),
        F.floor(F.unix_micros(F.col("timestamp")) / 1000).cast("long").alias("ms"))


def fold_plan(frame: Any, task: FoldTask, cores: int) -> Any:
    """The micro-batch's plan on the executors: at most ``cores`` tasks (``coalesce``: no
    exchange; each task gets whole input partitions, each one Kafka partition or a
    ``jobreg-kafka`` group of whole ones, in order), each running ``task``; one summary row
    per Kafka partition (:data:`SUMMARY_SCHEMA`)."""
    return _columns(frame).coalesce(max(1, cores)).mapInArrow(task, SUMMARY_SCHEMA)


def _as_records(cols: dict[str, list[Any]]) -> list[LogRecord]:
    return [LogRecord(o, k, v, ms, p) for p, o, k, v, ms in zip(
        cols["partition"], cols["offset"], cols["key"], cols["value"], cols["ms"], strict=True)]


def _records(df: Any) -> list[LogRecord]:
    """The micro-batch as LogRecords on the driver, each partition in offset order (SQLite)."""
    out = _as_records(_columns(df).toArrow().to_pydict())
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


@dataclass(frozen=True)
class FoldTask:
    """The function ``mapInArrow`` runs on the executors: one Spark partition's records (one
    or more Kafka partitions', each whole and in increasing offsets: :func:`fold_plan`)
    folded and committed by :class:`PartitionWriter` for the run ``generation``, one
    transaction per Kafka partition; yields one summary row per Kafka partition
    (:data:`SUMMARY_SCHEMA`). Calling it again with the same records (a retried
    task) writes nothing: the progress cuts them."""

    url: str
    topic: str
    generation: int
    bootstrap: Any
    stream: str = "audit"
    timeout: float = 30.0
    batch_id: int = -1

    def writer(self) -> PartitionWriter:
        return PartitionWriter(self.url, self.topic, self.generation, stream=self.stream,
                               probe=self.probe,
                               history=log_history(self.bootstrap, self.topic, self.timeout))

    def probe(self, partition: int, start: int, end: int) -> bool:
        """Whether the log holds a record in ``[start, end)`` (a hole of transaction markers,
        or of records the cleaner removed, is no gap)."""
        reader = LogReader(self.bootstrap, self.topic, partition, start_offset=start)
        try:
            for batch in reader.read_to_end(self.timeout, until=end - 1):
                if any(r.offset < end for r in batch):
                    return True
            return False
        finally:
            reader.close()

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import itertools

        import pyarrow as pa

        # Folded as the input arrives (the reading and the folding overlap); one
        # transaction per Kafka partition (a Spark partition holds one or more, one after
        # the other; a partition met twice would be cut at its progress or refused as a gap).
        records = (r for batch in batches for r in _as_records(batch.to_pydict()))
        writer = self.writer()
        out = [writer.write(p, group, self.batch_id)
               for p, group in itertools.groupby(records, key=lambda r: r.partition)]
        yield pa.RecordBatch.from_pydict(
            {"partition": [c.partition for c in out], "start": [c.start for c in out],
             "end": [c.end for c in out], "rows": [c.rows for c in out],
             "newest": [c.newest_ms for c in out]},
            schema=pa.schema([("partition", pa.int32()), ("start", pa.int64()),
                              ("end", pa.int64()), ("rows", pa.int64()),
                              ("newest", pa.int64())]))


_EXCEPTION_LINE = re.compile(
    r"^(?:Caused by: )?([A-Za-z_][\w.$]*(?:Error|Exception|Exit|Interrupt|Failure)): (\S.*)$")


def root_cause(text: str) -> str:
    """The line of a failed query's error that says why, in one line: the innermost Python
    exception (the exception line after the last Python traceback in the text: what a task
    or the source raised), else the innermost Java one (the last ``Caused by:``), else the
    first line. A failed query's text carries whole JVM and Python traces; this is the part
    a person needs first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    last_tb = max((i for i, line in enumerate(lines)
                   if "Traceback (most recent call last)" in line), default=None)
    if last_tb is not None:
        for line in lines[last_tb + 1:]:
            m = _EXCEPTION_LINE.match(line)
            if m and not line.startswith(("File ", "Caused by: ")):
                return f"{m.group(1)}: {m.group(2)}"
    causes = [m for m in map(_EXCEPTION_LINE.match, lines) if m and m.string.startswith(
        "Caused by: ")]
    if causes:
        return f"{causes[-1].group(1)}: {causes[-1].group(2)}"
    return lines[0]


class StreamFailed(AuditError):
    """The audit stream failed: the message is the root cause in one line
    (:func:`root_cause`), :attr:`detail` the whole text of the error."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


# A jobreg error raised in a Python worker, as the JVM's trace of the failed task quotes it.
_WORKER_ERROR = re.compile(r"^registry\.[\w.]+\.(\w+): (.+)$", re.MULTILINE)


def _failure(e: BaseException, raised: list[BaseException]) -> AuditError:
    """The error a failed stream ends with: the jobreg error that failed it (raised in a
    batch on the driver, or quoted from an executor's trace) when there is one, so that its
    one line says what happened (a namespace on two partitions, a fenced task, ...)."""
    for error in raised:
        if isinstance(error, AuditError):
            return error
        if isinstance(error, RegistryError):
            return AuditError(str(error))
    found = _WORKER_ERROR.search(str(e))
    if found is not None:
        return AuditError(found.group(2).strip())
    detail = str(e)
    return StreamFailed(f"the audit stream failed: {root_cause(detail)}", detail)


def materialize(url: str, bootstrap: str | Kafka, topic: str, *,
                engine: Literal["spark", "plain"] = "spark",
                mode: Literal["once", "follow"] = "once",
                stop_event: threading.Event | None = None,
                on_batch: Callable[[int, int], None] | None = None,
                timeout: float = 30.0, metrics: CollectorRegistry | None = None,
                **spark_options: Any) -> AuditRun:
    """Migrate the database at ``url``, then run the audit job into it: :func:`run_audit`
    (``spark_options`` are its ``interval``, ``max_offsets_per_trigger``, ``source``,
    ``stream``, ``spark``), or with ``engine="plain"`` the same fold and writes without
    Spark (``on_batch`` is then called in ``once`` mode only). The run's
    :attr:`AuditRun.source` is ``"plain"`` there, and its ``startup`` 0. Each batch is
    reported to ``metrics`` (a ``prometheus_client.CollectorRegistry``, default
    ``prometheus_client.REGISTRY``; README "Metrics")."""
    migrate(url)
    if engine == "spark":
        return run_audit(url, bootstrap, topic, mode=mode, stop_event=stop_event,
                         on_batch=on_batch, timeout=timeout, metrics=metrics, **spark_options)
    if spark_options:
        raise ConfigError(f"options of the Spark job without Spark: {sorted(spark_options)}")
    writer = AuditWriter(url, topic, metrics=metrics)
    try:
        started = time.monotonic()
        writer.require_schema()
        caught_up = writer.catch_up(bootstrap, timeout=timeout)
        if mode == "once":
            run_plain(writer, bootstrap, timeout=timeout, on_batch=on_batch)
        else:
            follow_plain(writer, bootstrap, stop_event or threading.Event(), timeout=timeout)
        return AuditRun(writer.batches, writer.rows, caught_up, time.monotonic() - started,
                        "plain")
    finally:
        writer.close()


def choose_source(requested: str, kafka: str | Kafka, *,
                  named_jars: str | None = None,
                  fetch: Callable[[str, bool], Any] | None = None) -> Any:
    """:func:`consumers.spark.choose_source` for the installed pyspark, for callers outside
    ``consumers``; ``--jars``/``--packages`` in ``PYSPARK_SUBMIT_ARGS`` or
    ``$JOBREG_SPARK_PACKAGES`` naming the connector count as the launch's classpath."""
    import os

    import pyspark

    from consumers.spark import choose_source as choose

    launch = " ".join([os.environ.get("PYSPARK_SUBMIT_ARGS", ""),
                       os.environ.get("JOBREG_SPARK_PACKAGES", "")])
    if requested not in ("auto", "python", "kafka"):
        raise ConfigError(f"the source must be auto, python or kafka, not {requested!r}")
    from consumers.spark import on_embedded_broker

    return choose(cast(Literal["auto", "python", "kafka"], requested), kafka,
                  spark_version=pyspark.__version__, named_jars=named_jars,
                  fetch=fetch, on_classpath="spark-sql-kafka-0-10" in launch,
                  embedded=requested == "auto" and on_embedded_broker(kafka))


def spark_session(**kwargs: Any) -> Any:
    """:func:`consumers.spark.spark_session`, for callers outside ``consumers`` (this module
    is their one entry point)."""
    from consumers.spark import spark_session as make

    return make(**kwargs)


def run_audit(url: str, bootstrap: str | Kafka, topic: str, *,
              mode: Literal["once", "follow"] = "once", interval: str = "1 second",
              max_offsets_per_trigger: int | None = 100_000,
              source: Literal["auto", "python", "kafka"] = "auto",
              stream: str = "audit", spark: Any = None,
              stop_after: Callable[[AuditWriter], bool] | None = None,
              stop_event: threading.Event | None = None,
              on_batch: Callable[[int, int], None] | None = None,
              timeout: float = 30.0, master: str | None = None,
              spark_conf: dict[str, str] | None = None,
              executor_timeout: float = 120.0,
              metrics: CollectorRegistry | None = None,
              jars: Sequence[str] = (), why: str | None = None,
              announce: Callable[[str], None] | None = None) -> AuditRun:
    """Run the audit stream into the database at ``url`` (migrated already).

    ``on_batch(batch_id, records)`` is called after each committed batch. In ``follow``
    mode the job runs until ``stop_event`` is set or ``stop_after(writer)`` is true
    (checked after each batch and every ``interval``). Without ``spark``, a session is made
    by :func:`consumers.spark.spark_session` with ``master`` and ``spark_conf``; on a
    cluster the run fails with one line when no executor has registered within
    ``executor_timeout`` seconds (executors that cannot reach the driver are relaunched
    for ever, and a query would wait for ever). Each batch is reported to ``metrics``
    (default ``prometheus_client.REGISTRY``; README "Metrics").

    ``source``: ``"kafka"`` (Spark's source; its connector on the classpath, or in ``jars``,
    which a session this call starts is launched with: :func:`choose_source`), ``"python"``
    (``jobreg-kafka``) or ``"auto"``. Once the source is settled, ``announce`` is told which
    in one line, with ``why`` (:func:`choose_source`'s words) or what the classpath said.
    """
    from consumers.spark import (
        EMBEDDED_WHY,
        KafkaConnectorMissing,
        NoExecutors,
        is_local,
        kafka_format_available,
        on_embedded_broker,
        read_stream,
        spark_session,
        wait_for_executors,
    )

    started = time.monotonic()
    writer = AuditWriter(url, topic, stream=stream, metrics=metrics)
    checkpoint = tempfile.mkdtemp(prefix="jobreg-audit-ckpt-")
    query = None
    try:
        writer.require_schema()
        caught_up = writer.catch_up(bootstrap, timeout=timeout)
        partitions = topic_partitions(bootstrap, topic, timeout)
        done = writer.next_offsets
        starting = json.dumps({topic: {str(p): done.get(p, 0) or -2 for p in range(partitions)}})
        spark = spark or spark_session(master=master, extra_conf=spark_conf, jars=jars)
        if not is_local(spark.sparkContext.master):
            try:
                wait_for_executors(spark, executor_timeout)
            except NoExecutors as e:
                raise AuditError(f"the audit stream cannot start: {e}") from None
        available = source != "python" and kafka_format_available(spark)
        if source == "kafka" and not available:
            raise KafkaConnectorMissing(
                "Spark's kafka source is not on the driver's classpath"
                + (f" ({why})" if why else "") + ": name the connector's jars with "
                "--kafka-jars, or use --source python")
        used = "kafka" if available else "jobreg-kafka"
        said = why if why and source != "auto" else (
            "its connector is on the classpath" if available else
            "Spark's Kafka connector is not on the classpath")
        if used == "kafka" and source == "auto":
            try:  # properties the Java client has no name for: librdkafka reads them
                java_client_options(Kafka.of(bootstrap).config)
            except ConfigError:
                used, said = "jobreg-kafka", "the client settings are librdkafka's only"
            if used == "kafka" and on_embedded_broker(bootstrap, timeout):
                used, said = "jobreg-kafka", EMBEDDED_WHY
        if announce is not None:
            name = "Spark's kafka source" if used == "kafka" else "jobreg-kafka"
            announce(f"audit source: {name} ({said})")
        cores = spark.sparkContext.defaultParallelism
        # librdkafka's long-poll setting; the Java client names it fetch.max.wait.ms
        wait = {"fetch.wait.max.ms": 10} if used == "jobreg-kafka" else {"fetch.max.wait.ms": 10}
        # jobreg-kafka plans at most one input partition per core (its Kafka partitions read
        # one after the other by one consumer): Spark runs each input partition of a Python
        # source in a Python worker of its own, a cost paid per input partition, which
        # coalesce cannot take back. Spark's kafka source reads in the JVM: coalesce suffices.
        grouped = {"maxPartitions": cores} if used == "jobreg-kafka" else {}
        df = read_stream(spark, bootstrap, topic, source="kafka" if used == "kafka" else "python",
                         starting_offsets=starting, options=grouped,
                         max_offsets_per_trigger=max_offsets_per_trigger, **wait)
        assert writer.generation is not None
        on_executors = writer.engine.dialect.name != "sqlite"
        task = FoldTask(url, topic, writer.generation, bootstrap, stream=stream,
                        timeout=timeout)

        stopping = threading.Event()  # set: batches that begin from now on do nothing
        working = threading.Lock()  # held while a batch works

        raised: list[BaseException] = []  # a jobreg error a batch raised on the driver

        def batch(frame: Any, batch_id: int) -> None:
            with working:
                if stopping.is_set():  # the run ends: the next run starts at the progress
                    return
                try:
                    fold_batch(frame, batch_id)
                except RegistryError as e:
                    raised.append(e)
                    raise

        def fold_batch(frame: Any, batch_id: int) -> None:
            if on_executors:
                started = time.perf_counter()
                summaries = fold_plan(frame, dataclasses.replace(task, batch_id=batch_id),
                                      cores).collect()
                n = sum(s["rows"] for s in summaries)
                if summaries:
                    writer.batches += 1
                    writer.rows += n
                    writer.observe(time.perf_counter() - started, [
                        PartitionCommit(s["partition"], s["start"], s["end"], s["rows"],
                                        s["newest"]) for s in summaries])
            else:  # SQLite: one writer; the driver commits partition by partition
                n = writer.commit(_records(frame), batch_id)
            if on_batch is not None:
                on_batch(batch_id, n)

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
                    # pyspark annotates int seconds, and takes any number (int(timeout * 1000))
                    query.awaitTermination(0.2)  # type: ignore[arg-type]
            failure = query.exception()
        except Exception as e:  # StreamingQueryException: the query failed
            failure = e
        # Stop between batches: the batch at work finishes first (waited for at most
        # max(timeout, 60 s)), and a batch that begins later does nothing. Stopping a query
        # cancels the Spark job of a batch at work, and Spark (4.3) then matches a regex
        # against the whole text of the Python error, which overflows the stack of its
        # stream thread: a 1,000-line StackOverflowError on the terminal, though nothing
        # is lost.
        stopping.set()
        if working.acquire(timeout=max(timeout, 60.0)):
            working.release()
        query.stop()
        if failure is not None:
            raise _failure(failure, raised) from None
        return AuditRun(writer.batches, writer.rows, caught_up, time.monotonic() - started,
                        used, startup)
    finally:
        if query is not None and query.isActive:
            query.stop()
        writer.close()
        shutil.rmtree(checkpoint, ignore_errors=True)
