"""Writing the audit tables exactly once, and checking them against the library's fold.

:class:`AuditWriter` owns one :class:`~registry.audit.projection.AuditProjection`
and one database. :meth:`AuditWriter.write` commits a batch's rows *and* the
stream's progress (``audit_progress``: per partition, the first offset not yet
reflected) in one database transaction. The database is the only progress
store that counts:

* a crash before the commit leaves neither rows nor progress; the restarted
  stream starts from the progress and writes the batch again;
* a batch delivered twice (a source replaying after a crash, a Spark
  checkpoint behind the database) is cut at the progress, so nothing is
  written twice;
* on start, :meth:`AuditWriter.catch_up` folds the log up to the progress (no
  writes) so the projection's images match the rows already committed.

:func:`check` compares a database with the fold the library computes on the
same log up to the same offsets: every record exactly once, the same verdicts,
the same jobs and terms. Any difference is listed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, Table, delete, func, select
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ..image import LogRecord, Outcome
from ..kafka_config import Kafka
from ..log import LogReader, topic_partitions
from .db import AuditError, current_revision, engine_for
from .models import (
    AuditCheckpoint,
    AuditJob,
    AuditProgress,
    AuditQuarantine,
    AuditRecord,
    AuditTerm,
)
from .projection import AuditProjection, BatchRows

__all__ = ["FAULT_KILL_ENV", "AuditWriter", "Pipeline", "check", "check_dumps", "follow_plain",
           "run_plain"]

FAULT_KILL_ENV = "JOBREG_FAULT_KILL_AFTER_ROWS"
"""Fault injection for crash tests: when set to N, the process kills itself (SIGKILL) as soon as
it has written N record rows in all, after the rows and before their batch's commit."""



def _table(model: Any) -> Table:
    return model.__table__


class AuditWriter:
    """Projects batches of one topic's records into an audit database, exactly once."""

    def __init__(self, url: str, topic: str, *, stream: str = "audit") -> None:
        self.url = url
        self.topic = topic
        self.stream = stream
        self.engine: Engine = engine_for(url)
        self.projection = AuditProjection(topic)
        self.batches = 0
        self.rows = 0
        self._broken = False
        kill = os.environ.get(FAULT_KILL_ENV)
        self._kill_after = int(kill) if kill else None

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
        """Fold the log up to the database's progress without writing; return the records
        folded. Call once, before the first :meth:`write`."""
        done = self.progress()
        self.projection.start_at({})
        folded = 0
        for partition, next_offset in sorted(done.items()):
            reader = LogReader(bootstrap, self.topic, partition)
            try:
                for batch in reader.read_to_end(timeout, until=next_offset - 1):
                    keep = [r for r in batch if r.offset < next_offset]
                    self.projection.replay(keep)
                    folded += len(keep)
                    if on_progress is not None:
                        on_progress(folded)
                if reader.position < next_offset:
                    raise AuditError(
                        f"the audit database reflects {self.topic}[{partition}] up to offset "
                        f"{next_offset - 1}, but the log ends at {reader.position}: another or "
                        f"a wiped topic. Write into a new database (or delete this stream's "
                        f"rows) to audit it")
            finally:
                reader.close()
        self.projection.start_at(done)
        return folded

    # -- write ---------------------------------------------------------------------

    def write(self, records: Iterable[LogRecord], batch_id: int) -> int:
        """Project ``records`` and commit their rows and the progress in one transaction;
        return the number of records written (those already in the database are skipped).
        The projection advances only once the commit succeeded."""
        self._usable()
        rows = self.projection.project(records)
        n = self.commit(rows, batch_id)
        self.projection.advance(rows)
        return n

    def prepare(self, records: Iterable[LogRecord]) -> BatchRows:
        """Project ``records`` and advance the projection *before* the rows are committed
        (so the next batch can be folded while this one is written). The rows must then
        be committed, in order, with :meth:`commit`; if one commit fails this writer is
        unusable (its projection is ahead of the database) and a new one must catch up."""
        self._usable()
        rows = self.projection.project(records)
        self.projection.advance(rows)
        return rows

    def commit(self, rows: BatchRows, batch_id: int) -> int:
        """Commit a batch's rows and the progress in one transaction; return its records."""
        if not rows.progress:
            return 0
        try:
            with self.engine.begin() as conn:
                self._insert_rows(conn, rows)
                self._progress(conn, rows, batch_id)
        except DBAPIError as e:
            self._broken = True
            raise AuditError(f"writing batch {batch_id} to the audit database failed; nothing "
                             f"of it was committed: {' '.join(str(e.orig).split())}") from None
        except BaseException:
            self._broken = True
            raise
        self.batches += 1
        self.rows += len(rows.records)
        return len(rows.records)

    def _usable(self) -> None:
        if self._broken:
            raise AuditError("this audit writer lost a batch and is ahead of its database; "
                             "start a new one (it catches up from the database's progress)")

    def _insert_rows(self, conn: Connection, rows: BatchRows) -> None:
        bulk = _Bulk(conn)
        bulk.insert(_table(AuditRecord), rows.records)
        if self._kill_after is not None and self.rows + len(rows.records) >= self._kill_after:
            # rows are written, the transaction is open: die as a crashed driver would
            os.kill(os.getpid(), signal.SIGKILL)
        bulk.insert(_table(AuditQuarantine), rows.quarantine)
        bulk.upsert(_table(AuditJob), rows.jobs)
        bulk.upsert(_table(AuditTerm), rows.terms)
        bulk.upsert(_table(AuditCheckpoint), rows.checkpoints)
        bulk.upsert(_table(AuditCheckpoint), rows.checkpoint_failures,
                    only=("counted", "ignored_reason", "failure_reason", "last_offset"))

    def _progress(self, conn: Connection, rows: BatchRows, batch_id: int) -> None:
        now = int(time.time() * 1000)
        _Bulk(conn).upsert(_table(AuditProgress), [
            {"stream": self.stream, "topic": self.topic, "partition": p, "next_offset": n,
             "batch_id": batch_id, "updated_at": now} for p, n in sorted(rows.progress.items())])

    def _conn(self) -> Any:
        try:
            return self.engine.connect()
        except (DBAPIError, OSError) as e:
            raise AuditError(f"cannot connect to the audit database "
                             f"{self.engine.url.render_as_string()!r}: {e}") from None

    def reset(self) -> None:
        """Delete every row this stream wrote (all audit tables) and its progress."""
        with self.engine.begin() as conn:
            for model in (AuditRecord, AuditQuarantine, AuditJob, AuditTerm, AuditCheckpoint):
                conn.execute(delete(_table(model)))
            t = _table(AuditProgress)
            conn.execute(delete(t).where(t.c.stream == self.stream, t.c.topic == self.topic))

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()


class _Bulk:
    """Many rows into one table, inside the caller's transaction, at the driver's speed.

    SQLAlchemy's executemany costs more per row than folding the record did, so rows go
    straight to the driver on the same connection (the same transaction): PostgreSQL
    ``COPY`` (into the table, or into a temporary table merged with ``INSERT ... ON
    CONFLICT`` for an upsert), SQLite ``executemany`` of one prepared statement.
    """

    def __init__(self, conn: Connection) -> None:
        self.raw = conn.connection.driver_connection
        self.postgres = conn.dialect.name == "postgresql"

    @staticmethod
    def _columns(table: Table) -> list[str]:
        return [c.name for c in table.columns]

    @staticmethod
    def _q(name: str) -> str:
        return f'"{name}"'

    def insert(self, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """Insert ``rows`` (dicts with every column of ``table``)."""
        if not rows:
            return
        cols = self._columns(table)
        names = ", ".join(self._q(c) for c in cols)
        if self.postgres:
            with self.raw.cursor() as cur, \
                    cur.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row([row[c] for c in cols])
        else:
            marks = ", ".join("?" * len(cols))
            self.raw.executemany(f"INSERT INTO {table.name} ({names}) VALUES ({marks})",
                                 [tuple(row[c] for c in cols) for row in rows])

    def upsert(self, table: Table, rows: Sequence[dict[str, Any]],
               only: Sequence[str] | None = None) -> None:
        """Insert ``rows``; where the primary key exists, update ``only`` these columns (all
        but the key if ``None``)."""
        if not rows:
            return
        cols = self._columns(table)
        keys = [c.name for c in table.primary_key.columns]
        update = only or [c for c in cols if c not in keys]
        names = ", ".join(self._q(c) for c in cols)
        conflict = (f"ON CONFLICT ({', '.join(self._q(k) for k in keys)}) DO UPDATE SET "
                    + ", ".join(f"{self._q(c)} = excluded.{self._q(c)}" for c in update))
        if self.postgres:
            tmp = f"_jobreg_{table.name}"
            with self.raw.cursor() as cur:
                cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {tmp} "
                            f"(LIKE {table.name} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
                with cur.copy(f"COPY {tmp} ({names}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row([row[c] for c in cols])
                cur.execute(f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {tmp} "
                            f"{conflict}")
                cur.execute(f"TRUNCATE {tmp}")
        else:
            marks = ", ".join("?" * len(cols))
            self.raw.executemany(
                f"INSERT INTO {table.name} ({names}) VALUES ({marks}) {conflict}",
                [tuple(row[c] for c in cols) for row in rows])


class Pipeline:
    """Fold and commit batches on two background threads, so that reading batch N+2
    (Kafka, or Spark's executors), folding N+1 and committing N overlap.

    Exactly once is unchanged: each batch is one transaction with its progress, committed
    in order. The fold runs ahead of the commits (:meth:`AuditWriter.prepare`); a batch
    that fails to commit stops the pipeline, its error is raised by the next
    :meth:`submit` or by :meth:`close`, nothing queued behind it is written, and the
    writer is unusable: a restart catches up from the database's progress.
    """

    def __init__(self, writer: AuditWriter, *, depth: int = 2,
                 on_batch: Callable[[int, int], None] | None = None) -> None:
        import queue
        import threading

        self.writer = writer
        self.on_batch = on_batch
        self.written = 0
        self._records: queue.Queue[tuple[list[LogRecord], int] | None] = queue.Queue(depth)
        self._rows: queue.Queue[tuple[BatchRows, int] | None] = queue.Queue(depth)
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=target, name=name, daemon=True)
                         for target, name in ((self._fold, "jobreg-audit-fold"),
                                              (self._commit, "jobreg-audit-commit"))]
        for t in self._threads:
            t.start()

    def _fold(self) -> None:
        while (item := self._records.get()) is not None:
            if self._error is not None:
                continue  # drain: nothing after a failed batch may be written
            try:
                self._rows.put((self.writer.prepare(item[0]), item[1]))
            except BaseException as e:  # noqa: B036 - handed to the caller's thread
                self._error = e
        self._rows.put(None)

    def _commit(self) -> None:
        while (item := self._rows.get()) is not None:
            if self._error is not None:
                continue
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
        for t in self._threads:
            t.join()
        self._raise()
        return self.written


# -- check -------------------------------------------------------------------------------


def check(url: str, bootstrap: str | Kafka, topic: str, *, stream: str = "audit",
          timeout: float = 30.0) -> list[str]:
    """Compare the audit database with the library's fold of the same log up to the same
    offsets; return the differences (empty: the database is right).

    Checked: every record of every partition below the stream's progress has exactly one
    row and no other row exists; every namespace's verdicts (outcome, reason, type,
    epoch, writer, job) equal those of :class:`~registry.forensics.Forensics` replaying
    the namespace from the broker; the ``audit_jobs`` and ``audit_terms`` rows equal the
    fold's jobs and terms (a job's ``graph_uri`` and ``held_checkpoints`` only where the
    row has them: rows written before migration 0004 may not).
    """
    from ..forensics import BrokerSource
    from ..keys import partition_for

    def scopes(namespaces: list[str], done: dict[int, int], stored: dict[int, set[int]]
               ) -> Iterable[_Scope]:
        partitions = topic_partitions(bootstrap, topic, timeout)
        for ns in sorted(namespaces):
            partition = partition_for(ns, partitions)
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

    writer = AuditWriter(url, topic, stream=stream)
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
                final: dict[int, Any] = {}
                terms: dict[int, Any] = {}
                image = Forensics(scope.source, ns).replay(
                    until_offset=upto - 1,
                    on_decision=lambda d, final=final: final.__setitem__(d.offset, d),
                    on_term=lambda t, terms=terms: terms.__setitem__(t.epoch, t))
                decisions = [d for _, d in sorted(final.items())
                             if d.outcome not in (Outcome.SKIPPED, Outcome.PENDING)]
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
    fallback where Spark cannot run.)"""
    pipeline = Pipeline(writer, on_batch=on_batch)
    progress = writer.projection.next_offsets
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
    progress = writer.projection.next_offsets
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
