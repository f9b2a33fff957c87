"""Writing the audit tables exactly once, and checking them against the library's fold.

:class:`AuditWriter` is the plain (driver-side) entry to the audit database: it starts a
run (:meth:`AuditWriter.catch_up`: raise the stream's generation, check the log reaches the
database's progress) and commits batches of any partitions through
:class:`~registry.audit.partition.PartitionWriter`, the per-partition fold-and-commit the
Spark tasks run too. Per partition, the rows, the namespaces' snapshots and the progress
(``audit_progress``: the first offset not yet reflected) commit in one transaction; the
database is the only progress store that counts:

* a crash before a commit leaves neither rows nor progress of that partition's batch; the
  restarted stream starts from the progress and writes the batch again;
* a batch delivered twice (a source replaying after a crash, a task retried after its
  commit) is cut at the progress, so nothing is written twice;
* nothing is folded at start: each partition's fold resumes from the namespaces'
  snapshots in ``audit_snapshots``.

:func:`check` compares a database with the fold the library computes on the
same log up to the same offsets: every record exactly once, the same verdicts,
the same jobs and terms. Any difference is listed.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..extras import needs

with needs("audit", "the audit database (registry.audit)"):
    from sqlalchemy import Engine, delete, func, select
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ..image import Decision, LogRecord, Outcome, TermInfo
from ..kafka_config import Kafka
from ..log import LogReader, topic_partitions
from ..metrics import AuditMetrics, metrics_for
from .db import AuditError, current_revision, engine_for, read_engine
from .models import (
    AuditCheckpoint,
    AuditJob,
    AuditProgress,
    AuditQuarantine,
    AuditRecord,
    AuditSnapshot,
    AuditTerm,
)
from .partition import (
    PartitionCommit,
    PartitionWriter,
    _table,
    begin_run,
    log_ahead,
    log_history,
    write_snapshots,
)
from .projection import REFOLD_CHUNK, AuditProjection

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["AuditWriter", "Pipeline", "check", "check_dumps", "follow_plain",
           "log_reaches", "run_plain"]




def log_reaches(bootstrap: str | Kafka, topic: str, partition: int, next_offset: int,
                timeout: float) -> int:
    """Whether the log of ``partition`` reaches ``next_offset``: ``next_offset`` when the
    broker's end offset says so (it may under-report, never over-report), else the position
    a read of the whole partition up to there gets to (below ``next_offset``: the database
    reflects records the log lacks)."""
    reader = LogReader(bootstrap, topic, partition)
    try:
        end = reader.end_offset(timeout)
        if end is not None and end >= next_offset:
            return next_offset
        for _ in reader.read_to_end(timeout, until=next_offset - 1):
            pass
        return reader.position
    finally:
        reader.close()


class LogEnds:
    """How far the audit database is behind the log (the audit lag), asked of the broker
    with one read_committed consumer kept for the run."""

    def __init__(self, bootstrap: str | Kafka, topic: str, timeout: float) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        # A metric only: a broker that does not answer soon delays the next batch no longer.
        self.timeout = min(timeout, 5.0)
        self._consumer = Consumer(Kafka.of(bootstrap).settings({}, {
            "group.id": f"jobreg-audit-lag-{uuid.uuid4()}",  # required; never used
            "enable.auto.commit": False, "enable.partition.eof": True,
            "isolation.level": "read_committed", "fetch.wait.max.ms": 10}))

    def behind(self, reached: dict[int, int]) -> int | None:
        """Offsets from ``reached`` (partition -> first offset not reflected) to each
        partition's end (its last stable offset), summed; ``None`` if the broker did not
        say. A span that holds no record (a transaction's commit marker after the last
        record reflected) counts 0, and ``reached`` moves past it."""
        from confluent_kafka import KafkaException, TopicPartition

        total = 0
        try:
            meta = self._consumer.list_topics(self.topic, timeout=self.timeout).topics
            found = meta.get(self.topic)
            partitions = 0 if found is None or found.error is not None else \
                len(found.partitions)
            for p in range(partitions):
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.timeout, cached=False)
                start = reached.get(p, 0)
                if high <= start:
                    continue
                if not self._holds_record(p, start, high):
                    reached[p] = high
                    continue
                total += high - start
        except KafkaException:
            return None
        return total

    def _holds_record(self, partition: int, start: int, end: int) -> bool:
        """Whether a read_committed read of ``[start, end)`` returns a record (unsure:
        ``True``)."""
        from confluent_kafka import KafkaError, TopicPartition

        self._consumer.assign([TopicPartition(self.topic, partition, start)])
        deadline = time.monotonic() + self.timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                m = self._consumer.poll(min(left, 0.5))
                if m is None:
                    continue
                err = m.error()
                if err is None:
                    offset = m.offset()
                    return offset is None or offset < end
                if err.code() == KafkaError._PARTITION_EOF:
                    return False  # the end came before any record
            return True
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        """Leave the broker."""
        self._consumer.close()


class AuditWriter:
    """Commits batches of one topic's records into an audit database, exactly once, per
    partition (see the module docstring). Each batch is reported to :attr:`metrics`."""

    def __init__(self, url: str, topic: str, *, stream: str = "audit",
                 readonly: bool = False, metrics: CollectorRegistry | None = None) -> None:
        self.url = url
        self.topic = topic
        self.stream = stream
        # readonly: for checks; the database must be an audit database already, and the
        # engine refuses every write (and creates no SQLite file)
        self.engine: Engine = read_engine(url) if readonly else engine_for(url)
        self.generation: int | None = None
        self.next_offsets: dict[int, int] = {}
        """partition -> the first offset the database did not reflect when the run began
        (:meth:`catch_up`)."""
        self.batches = 0
        self.rows = 0
        self._partitions: PartitionWriter | None = None
        self.metrics: AuditMetrics = metrics_for(metrics).audit(stream, topic)
        """This stream's series of the metrics (README "Metrics")."""
        self._reached: dict[int, int] = {}  # partition -> first offset not reflected
        self._ends: LogEnds | None = None  # made by catch_up (it has the broker)

    # -- start ---------------------------------------------------------------------

    def require_schema(self) -> None:
        """Raise :class:`AuditError` unless the database is migrated to the head revision."""
        from alembic.script import ScriptDirectory

        from .db import alembic_config

        head = ScriptDirectory.from_config(alembic_config(self.url)).get_current_head()
        have = current_revision(self.url)
        if have != head:
            raise AuditError(f"the audit database {self.engine.url.render_as_string()!r} is at "
                             f"revision {have or 'none'}, not {head}: run `jobreg audit "
                             f"migrate --db ...` first")

    def progress(self) -> dict[int, int]:
        """partition -> the first offset the database does not reflect yet."""
        t = _table(AuditProgress)
        with self._conn() as conn:
            rows = conn.execute(select(t.c.partition, t.c.next_offset).where(
                t.c.stream == self.stream, t.c.topic == self.topic)).all()
        return {p: n for p, n in rows}

    def catch_up(self, bootstrap: str | Kafka, *, timeout: float = 30.0,
                 on_progress: Callable[[int], None] | None = None) -> int:
        """Begin a run: raise the stream's generation (fencing every task of an earlier
        run), check that the log reaches the database's progress, and return the record
        rows the database holds already. Call once, before the first :meth:`commit`.

        Nothing is folded here: each partition's fold resumes from its namespaces'
        snapshots. Only a partition written before migration 0006 (no snapshots yet) is
        folded up to its progress once, here, to write them."""
        partitions = topic_partitions(bootstrap, self.topic, timeout)
        generation, done, legacy = begin_run(self.engine, self.stream, self.topic, partitions)
        folded = 0
        for partition, next_offset in sorted(done.items()):
            if next_offset <= 0:
                continue
            if partition in legacy:
                folded += self._adopt(bootstrap, partition, next_offset, timeout, on_progress)
                continue
            reached = log_reaches(bootstrap, self.topic, partition, next_offset, timeout)
            if reached < next_offset:
                raise log_ahead(self.topic, partition, next_offset, reached)
        self.generation = generation
        self.next_offsets = done
        self._reached = dict(done)
        self._partitions = PartitionWriter(self.url, self.topic, generation,
                                           stream=self.stream, engine=self.engine,
                                           history=log_history(bootstrap, self.topic, timeout))
        if self._ends is None:
            self._ends = LogEnds(bootstrap, self.topic, timeout)
            behind = self._ends.behind(self._reached)
            if behind is not None:
                self.metrics.behind(behind)
        r = _table(AuditRecord)
        with self._conn() as conn:
            count: int = conn.execute(select(func.count()).select_from(r).where(
                r.c.topic == self.topic)).scalar_one()
        return count

    def _adopt(self, bootstrap: str | Kafka, partition: int, next_offset: int, timeout: float,
               on_progress: Callable[[int], None] | None) -> int:
        """Fold a partition written before migration 0006 up to its progress and write its
        namespaces' snapshots; return the records folded (``on_progress`` hears every
        :data:`~registry.audit.projection.REFOLD_CHUNK` of them)."""
        folded = 0

        def counted(records: Iterable[LogRecord]) -> Iterator[LogRecord]:
            nonlocal folded
            for r in records:
                folded += 1
                if on_progress is not None and folded % REFOLD_CHUNK == 0:
                    on_progress(folded)
                yield r

        history = log_history(bootstrap, self.topic, timeout)
        projection = AuditProjection.refolded(self.topic,
                                              counted(history(partition, next_offset)))
        write_snapshots(self.engine, self.stream, self.topic, partition, next_offset,
                        projection)
        return folded

    # -- write ---------------------------------------------------------------------

    def partition_writer(self) -> PartitionWriter:
        """The per-partition fold-and-commit of this run. Without :meth:`catch_up` (no
        broker at hand) the run begins here, over the partitions the database knows; a
        partition it does not know starts at offset 0."""
        if self._partitions is None:
            generation, self.next_offsets, legacy = begin_run(
                self.engine, self.stream, self.topic, 0)
            if legacy:
                raise AuditError(f"partitions {legacy} were written before migration 0006: "
                                 "begin the run with AuditWriter.catch_up(bootstrap)")
            self.generation = generation
            self._partitions = PartitionWriter(self.url, self.topic, generation,
                                               stream=self.stream, engine=self.engine)
        return self._partitions

    def commit(self, records: Iterable[LogRecord], batch_id: int) -> int:
        """Fold and commit ``records`` (any partitions, each in offset order): one
        transaction per partition (:meth:`PartitionWriter.write`); return the record rows
        written (records already in the database are skipped)."""
        started = time.perf_counter()
        by_partition: dict[int, list[LogRecord]] = {}
        for r in records:
            by_partition.setdefault(r.partition, []).append(r)
        writer = self.partition_writer()
        commits = [writer.write(partition, batch, batch_id)
                   for partition, batch in sorted(by_partition.items())]
        n = sum(c.rows for c in commits)
        if by_partition:
            self.batches += 1
            self.rows += n
            self.observe(time.perf_counter() - started, commits)
        return n

    def observe(self, seconds: float, commits: Sequence[PartitionCommit]) -> None:
        """Report a batch committed in ``seconds`` as ``commits`` to :attr:`metrics`: its
        duration, rows, newest record, and the lag it leaves (asked of the broker)."""
        for c in commits:
            if c.end > self._reached.get(c.partition, 0):
                self._reached[c.partition] = c.end
        # The lag first: a scrape that sees the batch's rows sees the lag it left too.
        if self._ends is not None:
            behind = self._ends.behind(self._reached)
            if behind is not None:
                self.metrics.behind(behind)
        newest = max((c.newest_ms for c in commits if c.newest_ms is not None), default=None)
        self.metrics.batch(seconds, sum(c.rows for c in commits), newest)

    write = commit

    def _conn(self) -> Any:
        try:
            return self.engine.connect()
        except (DBAPIError, OSError) as e:
            raise AuditError(f"cannot connect to the audit database "
                             f"{self.engine.url.render_as_string()!r}: {e}") from None

    def reset(self) -> None:
        """Delete every row this stream wrote (all audit tables), its snapshots and its
        progress."""
        with self.engine.begin() as conn:
            for model in (AuditRecord, AuditQuarantine, AuditJob, AuditTerm, AuditCheckpoint):
                conn.execute(delete(_table(model)))
            for own in (AuditProgress, AuditSnapshot):
                t = _table(own)
                conn.execute(delete(t).where(t.c.stream == self.stream,
                                             t.c.topic == self.topic))

    def close(self) -> None:
        """Release the database connections (and the broker's)."""
        if self._ends is not None:
            self._ends.close()
            self._ends = None
        self.engine.dispose()


class Pipeline:
    """Commit batches on a background thread, so that reading batch N+1 (Kafka) and
    folding and committing batch N overlap.

    Exactly once is unchanged: each batch commits partition by partition, each with its
    progress, in order. A batch that fails stops the pipeline: its error is raised by the
    next :meth:`submit` or by :meth:`close`, and nothing queued behind it is written.
    """

    def __init__(self, writer: AuditWriter, *, depth: int = 2,
                 on_batch: Callable[[int, int], None] | None = None) -> None:
        import queue
        import threading

        self.writer = writer
        self.on_batch = on_batch
        self.written = 0
        self._records: queue.Queue[tuple[list[LogRecord], int] | None] = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._commit, name="jobreg-audit-commit",
                                        daemon=True)
        self._thread.start()

    def _commit(self) -> None:
        while (item := self._records.get()) is not None:
            if self._error is not None:
                continue  # drain: nothing after a failed batch may be written
            try:
                n = self.writer.commit(*item)
                self.written += n
                if self.on_batch is not None:
                    self.on_batch(item[1], n)
            except BaseException as e:  # noqa: B036 - handed to the caller's thread
                self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, records: list[LogRecord], batch_id: int) -> None:
        """Queue a batch (blocks while ``depth`` batches wait); raises an earlier failure."""
        self._raise()
        self._records.put((records, batch_id))

    def close(self) -> int:
        """Wait until every queued batch is committed; raise a failure; return records written."""
        self._records.put(None)
        self._thread.join()
        self._raise()
        return self.written


# -- check -------------------------------------------------------------------------------


def check(url: str, bootstrap: str | Kafka, topic: str, *, stream: str = "audit",
          timeout: float = 30.0, partitions: int | None = None) -> list[str]:
    """Compare the audit database with the library's fold of the same log up to the same
    offsets; return the differences (empty: the database is right).

    Checked: every record of every partition below the stream's progress has exactly one
    row and no other row exists; every namespace's verdicts (outcome, reason, type,
    epoch, writer, job) equal those of :class:`~registry.forensics.Forensics` replaying
    the namespace from the broker; the ``audit_jobs`` and ``audit_terms`` rows equal the
    fold's jobs and terms (a job's ``graph_uri`` and ``held_checkpoints`` only where the
    row has them: rows written before migration 0004 may not). Each namespace is read where
    :func:`registry.placement.locate` finds it (``partitions``: the count to map with); a
    namespace whose records lie elsewhere raises :class:`~registry.errors.NamespaceMoved`.
    """
    from ..forensics import BrokerSource
    from ..placement import locate

    def scopes(namespaces: list[str], done: dict[int, int], stored: dict[int, set[int]]
               ) -> Iterable[_Scope]:
        kafka = Kafka.of(bootstrap)
        for ns in sorted(namespaces):
            partition = locate(kafka, topic, ns, timeout, partitions=partitions).partition
            yield _Scope(ns, partition, BrokerSource(bootstrap, topic, partition, timeout))
        for partition in sorted(set(done) | set(stored)):
            upto = done.get(partition, 0)
            offsets: set[int] = set()
            if upto > 0:
                reader = LogReader(bootstrap, topic, partition)
                try:
                    for batch in reader.read_to_end(timeout, until=upto - 1):
                        offsets.update(x.offset for x in batch if x.offset < upto)
                finally:
                    reader.close()
            yield _Scope(None, partition, None, offsets)

    return _check(url, topic, stream, scopes)


def check_dumps(url: str, dumps: Sequence[Any], *, topic: str | None = None,
                stream: str = "audit") -> tuple[list[str], list[str]]:
    """:func:`check` against dumps (:class:`~registry.forensics.DumpSource`) instead of a
    broker: the namespace of each dump is checked as :func:`check` checks it, its rows
    against the dump's records. Returns the differences and the namespaces that have
    rows but no dump (not checked). ``topic``: the topic whose rows are compared when a
    dump does not name its own."""
    topics = {d.topic or topic for d in dumps}
    if len(topics) != 1 or None in topics:
        raise AuditError("the dumps must all come from one topic (they name "
                         f"{sorted(str(t) for t in topics)}); pass --topic for dumps "
                         "that name none")
    (dump_topic,) = topics
    unchecked: list[str] = []

    def scopes(namespaces: list[str], done: dict[int, int], stored: dict[int, set[int]]
               ) -> Iterable[_Scope]:
        by_ns = {d.namespace: d for d in dumps}
        unchecked.extend(sorted(set(namespaces) - set(by_ns)))
        for ns, dump in sorted(by_ns.items()):
            placed = [(r.partition, r.offset) for batch in dump.batches() for r in batch]
            partitions = {p for p, _ in placed}
            if len(partitions) > 1:
                raise AuditError(f"{dump.path}: records of several partitions "
                                 f"{sorted(partitions)}: not a dump of one namespace")
            if not partitions:
                continue  # an empty dump: nothing to check (nor rows to expect)
            (partition,) = partitions
            upto = done.get(partition, 0)
            offsets = {o for _, o in placed if o < upto}
            yield _Scope(ns, partition, dump, offsets)

    return _check(url, str(dump_topic), stream, scopes), unchecked


class _Scope(NamedTuple):
    """One unit :func:`_check` compares: a namespace folded from ``source`` (``namespace``
    and ``source`` set), and/or a partition's record rows against ``offsets`` (every row of
    the partition when ``namespace`` is ``None``, else the namespace's and the blameless)."""

    namespace: str | None
    partition: int
    source: Any
    offsets: set[int] | None = None


def _check(url: str, topic: str, stream: str,
           scopes: Callable[[list[str], dict[int, int], dict[int, set[int]]],
                            Iterable[_Scope]]) -> list[str]:
    from ..forensics import Forensics, Scan

    writer = AuditWriter(url, topic, stream=stream, readonly=True)
    diffs: list[str] = []
    try:
        done = writer.progress()
        engine = writer.engine
        r = _table(AuditRecord)
        with writer._conn() as conn:
            stored: dict[int, set[int]] = {}
            for p, o in conn.execute(select(r.c.partition, r.c.offset).where(r.c.topic == topic)):
                stored.setdefault(p, set()).add(o)
            dup = conn.execute(select(func.count()).select_from(r).where(r.c.topic == topic)
                               ).scalar_one() - sum(len(s) for s in stored.values())
            namespaces = [n for (n,) in conn.execute(
                select(r.c.namespace).where(r.c.topic == topic, r.c.namespace.is_not(None))
                .distinct())]
        if dup:
            diffs.append(f"{dup} record rows are duplicates")
        folded = []
        waiting: dict[int, set[int]] = {}  # records of calls not decided at the progress
        for scope in scopes(namespaces, done, stored):
            ns, partition, upto = scope.namespace, scope.partition, done.get(scope.partition, 0)
            if ns is not None and scope.source is not None:
                final: dict[int, Decision] = {}
                terms: dict[int, TermInfo] = {}
                image = Forensics(scope.source, ns).replay(
                    until_offset=upto - 1,
                    on_decision=functools.partial(_keep_decision, final),
                    on_term=functools.partial(_keep_term, terms))
                decisions = [d for _, d in sorted(final.items())
                             if d.outcome not in (Outcome.SKIPPED, Outcome.PENDING,
                                                       Outcome.COLLECTED)]
                waiting.setdefault(partition, set()).update(
                    r.offset for records in image.calls.values() for r in records)
                folded.append((ns, partition, Scan(image, decisions,
                                                   [terms[e] for e in sorted(terms)])))
            if scope.offsets is None:
                continue
            if ns is None:
                have = stored.get(partition, set())
            else:
                with writer._conn() as conn:
                    have = {o for (o,) in conn.execute(select(r.c.offset).where(
                        r.c.topic == topic, r.c.partition == partition,
                        (r.c.namespace == ns) | r.c.namespace.is_(None)))}
            log_offsets = scope.offsets - waiting.get(partition, set())
            missing, extra = sorted(log_offsets - have), sorted(have - log_offsets)
            where = f"partition {partition}" + (f" ({ns})" if ns else "")
            if missing:
                diffs.append(f"{where}: {len(missing)} records have no row "
                             f"(first offsets {missing[:5]})")
            if extra:
                diffs.append(f"{where}: {len(extra)} rows are for no record "
                             f"below the progress {upto} (first offsets {extra[:5]})")
        for ns, partition, found in folded:
            diffs.extend(_compare_namespace(engine, topic, ns, partition, found.image,
                                            found.decisions, Forensics.terms_from(found)))
    finally:
        writer.close()
    return diffs


def _compare_namespace(engine: Engine, topic: str, ns: str, partition: int, image: Any,
                       decisions: list[Any], terms: list[Any]) -> list[str]:
    from .projection import _job_row

    r, j, t = _table(AuditRecord), _table(AuditJob), _table(AuditTerm)
    diffs: list[str] = []
    fields = ("outcome", "reason", "event_type", "epoch", "writer", "job_id")
    try:
        with engine.connect() as conn:
            # a record no namespace can be blamed for is stored once, with no namespace;
            # every namespace of its partition quarantines it
            rows = {row.offset: row for row in conn.execute(
                select(r).where(r.c.topic == topic, r.c.partition == partition,
                                (r.c.namespace == ns) | r.c.namespace.is_(None)))}
            jobs = {row.job_id: row for row in conn.execute(select(j).where(j.c.namespace == ns))}
            term_rows = {row.epoch: row for row in conn.execute(
                select(t).where(t.c.namespace == ns))}
    except SQLAlchemyError as e:
        raise AuditError(f"reading the audit database failed: {e}") from None
    for d in decisions:
        row = rows.pop(d.offset, None)
        if row is None:
            diffs.append(f"{ns}: no row for offset {d.offset} ({d.event_type} {d.outcome})")
            continue
        mismatch = [f"{k} {getattr(row, k)!r} != {getattr(d, k)!r}" for k in fields
                    if getattr(row, k) != getattr(d, k)]
        if mismatch:
            diffs.append(f"{ns}: offset {d.offset}: " + ", ".join(mismatch))
    diffs.extend(f"{ns}: row for offset {o} the fold did not decide" for o, row in
                 sorted(rows.items()) if row.namespace is not None)
    compare = ("status", "owner_epoch", "error", "max_checkpoint_failures",
               "retained_checkpoints", "consecutive_failures", "graph_kind", "reason", "dirty")
    # Rows written before migration 0004 whose job has not changed since have no holdings
    # (held_checkpoints NULL, graph_uri NULL): nothing to compare, nothing wrong.
    holdings = ("graph_uri", "held_checkpoints")
    for job_id, view in image.jobs.items():
        row = jobs.pop(job_id, None)
        want = _job_row(ns, view, 0, None)
        if row is None:
            diffs.append(f"{ns}: job {job_id!r} ({view.status}) has no row")
            continue
        checked = compare + holdings if row.held_checkpoints is not None else compare
        mismatch = [f"{k} {getattr(row, k)!r} != {want[k]!r}" for k in checked
                    if getattr(row, k) != want[k]]
        if mismatch:
            diffs.append(f"{ns}: job {job_id!r}: " + ", ".join(mismatch))
    diffs.extend(f"{ns}: job row {k!r} the fold does not know" for k in sorted(jobs))
    for term in terms:
        row = term_rows.pop(term.epoch, None)
        if row is None:
            diffs.append(f"{ns}: term {term.epoch} has no row")
            continue
        want = {"leader": term.leader, "granted_offset": term.first_offset,
                "accepted_writes": term.accepted, "rejected_writes": term.rejected}
        mismatch = [f"{k} {getattr(row, k)!r} != {v!r}" for k, v in want.items()
                    if getattr(row, k) != v]
        if mismatch:
            diffs.append(f"{ns}: term {term.epoch}: " + ", ".join(mismatch))
    diffs.extend(f"{ns}: term row {e} the fold does not know" for e in sorted(term_rows))
    return diffs


def run_plain(writer: AuditWriter, bootstrap: str | Kafka, *, timeout: float = 30.0,
              on_batch: Callable[[int, int], None] | None = None) -> int:
    """The same work without Spark: read every partition from the database's progress to
    its end with confluent-kafka and write each batch; return the records written. The
    caller has run :meth:`AuditWriter.catch_up`. (The benchmark's baseline, and a
    fallback where Spark cannot run.) Each batch commits through the same per-partition
    fold-and-commit as the Spark tasks."""
    pipeline = Pipeline(writer, on_batch=on_batch)
    progress = writer.progress()
    batch_id = 0
    try:
        for partition in range(topic_partitions(bootstrap, writer.topic, timeout)):
            reader = LogReader(bootstrap, writer.topic, partition,
                               start_offset=progress.get(partition, 0), batch_size=5000)
            try:
                for batch in reader.read_to_end(timeout):
                    pipeline.submit(batch, batch_id)
                    batch_id += 1
            finally:
                reader.close()
    finally:
        written = pipeline.close()
    return written


def follow_plain(writer: AuditWriter, bootstrap: str | Kafka, stop: Any, *, poll: float = 0.05,
                 timeout: float = 30.0) -> int:
    """:func:`run_plain`, but following the log until ``stop`` (a ``threading.Event``) is set:
    each partition's new records are written as they arrive. Returns the records written."""
    progress = writer.progress()
    readers = [LogReader(bootstrap, writer.topic, p, start_offset=progress.get(p, 0))
               for p in range(topic_partitions(bootstrap, writer.topic, timeout))]
    pipeline = Pipeline(writer)
    batch_id = 0
    try:
        while not stop.is_set():
            batch: list[LogRecord] = []
            for reader in readers:
                batch.extend(reader.poll(poll / len(readers)))
            if batch:
                pipeline.submit(batch, batch_id)
                batch_id += 1
    finally:
        for reader in readers:
            reader.close()
        written = pipeline.close()
    return written


def _keep_decision(into: dict[int, Decision], d: Decision) -> None:
    into[d.offset] = d


def _keep_term(into: dict[int, TermInfo], term: TermInfo) -> None:
    into[term.epoch] = term
