"""Fold one Kafka partition's batch and commit it, exactly once: the one function the Spark
tasks, the single-writer SQLite path and the plain path all call.

Every namespace lives on one partition, so a partition is the unit of order, of state and
of progress. :meth:`PartitionWriter.write` takes one partition's records (offsets strictly
increasing) and, in **one database transaction**:

1. locks the partition's ``audit_progress`` row (``SELECT ... FOR UPDATE`` on PostgreSQL;
   SQLite has one writer at a time anyway);
2. refuses the batch if the row's ``generation`` is not the writer's (:class:`Fenced`: a
   zombie task of an old driver, or of an old plain run);
3. cuts the records below the row's ``next_offset`` (a batch delivered again after a crash,
   a task retried after its commit) and refuses a gap (:class:`Gap`: the first new record
   lies beyond ``next_offset`` and the log holds a record in between);
4. takes the state of the namespaces the batch names: from this process's cache when the
   cache was left by this process's own commit of the same (offset, generation), else from
   ``audit_snapshots`` (a stored state that cannot be read, damaged or in a format this
   version does not know, or that is missing while the database holds records of the
   namespace, is refolded from the log up to the progress: the log is the truth, a
   snapshot only saves reading it);
5. folds (:class:`~registry.audit.projection.AuditProjection`, the library's fold);
6. writes the rows (``COPY`` on PostgreSQL), upserts the snapshots of the namespaces the
   batch changed, and advances the progress with a compare-and-set on the old offset and
   the generation;
7. commits.

A failure anywhere leaves nothing of the batch; the partition's progress says where to
start again. Different partitions commit independently: a failed Spark batch may leave
some partitions committed and others not, and the next run starts each from its own row.

:func:`begin_run` starts a run: it raises the stream's generation for every partition (so
every task of an earlier run is fenced from then on; on PostgreSQL it waits for a task
that holds a partition's lock to finish) and returns the progress to start from.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..extras import needs

with needs("audit", "the audit database (registry.audit)"):
    from sqlalchemy import Connection, Engine, select, update
    from sqlalchemy.exc import DBAPIError

from ..image import LogRecord
from .db import AuditError, engine_for
from .models import (
    AuditCheckpoint,
    AuditJob,
    AuditProgress,
    AuditQuarantine,
    AuditRecord,
    AuditSnapshot,
    AuditTerm,
)
from .projection import AuditProjection, BatchRows

_LOG = logging.getLogger("registry.audit")

__all__ = ["CACHE_PARTITIONS", "Fenced", "Gap", "PartitionCommit",
           "PartitionWriter", "begin_run", "clear_cache", "log_ahead", "log_history"]

CACHE_PARTITIONS = 64
"""At most this many partitions' states are kept in a process's cache (least recently used
dropped first)."""


class Fenced(AuditError):
    """The partition belongs to another run (generation): this task must not write."""


class Gap(AuditError):
    """The batch starts beyond the partition's progress, and records lie in between."""


@dataclass(frozen=True)
class PartitionCommit:
    """What one :meth:`PartitionWriter.write` committed: records ``[start, end)`` of
    ``partition`` (``end == start`` when nothing was new) and the record rows written."""

    partition: int
    start: int
    end: int
    rows: int
    newest_ms: int | None = None
    """The newest log time (ms) of the records written (``None``: none, or none stamped)."""


def _table(model: Any) -> Any:
    return model.__table__


@dataclass
class _Cached:
    next_offset: int
    generation: int
    state: Any  # the projection's state after this process's last commit of the partition


_CACHE: OrderedDict[tuple[str, str, str, int], _Cached] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_ENGINES: dict[str, Engine] = {}


def clear_cache() -> None:
    """Forget every cached state of this process (tests: a fresh executor)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _engine(url: str) -> Engine:
    """One engine per database URL per process (a Spark worker serves many tasks)."""
    with _CACHE_LOCK:
        engine = _ENGINES.get(url)
        if engine is None:
            engine = _ENGINES[url] = engine_for(url)
        return engine


def _progress_of(conn: Connection, stream: str, topic: str, *, partition: int | None = None,
                 lock: bool = False) -> list[Any]:
    t = _table(AuditProgress)
    q = select(t.c.partition, t.c.next_offset, t.c.generation).where(
        t.c.stream == stream, t.c.topic == topic)
    if partition is not None:
        q = q.where(t.c.partition == partition)
    if lock:
        q = q.with_for_update()
    return list(conn.execute(q.order_by(t.c.partition)).all())


def begin_run(engine: Engine, stream: str, topic: str, partitions: int
              ) -> tuple[int, dict[int, int], list[int]]:
    """Start a run of ``stream`` over ``topic``'s ``partitions``: raise the generation of
    every partition's progress row (creating missing rows at offset 0) in one transaction.
    Returns the new generation, partition -> next offset, and the partitions whose row
    predates migration 0006 (generation 0, offset > 0: no snapshots yet, see
    :meth:`registry.audit.writer.AuditWriter.catch_up`)."""
    t = _table(AuditProgress)
    now = int(time.time() * 1000)
    try:
        with engine.begin() as conn:
            rows = _progress_of(conn, stream, topic, lock=True)
            generation = max((g for _, _, g in rows), default=0) + 1
            have = {p for p, _, _ in rows}
            missing = [{"stream": stream, "topic": topic, "partition": p, "next_offset": 0,
                        "batch_id": -1, "updated_at": now, "generation": generation}
                       for p in range(partitions) if p not in have]
            if missing:
                conn.execute(t.insert(), missing)
            conn.execute(update(t).where(t.c.stream == stream, t.c.topic == topic)
                         .values(generation=generation))
    except DBAPIError as e:
        raise AuditError(f"starting the audit run failed: {' '.join(str(e.orig).split())}"
                         ) from None
    legacy = [p for p, n, g in rows if g == 0 and n > 0]
    return generation, {**{p: 0 for p in range(partitions)}, **{p: n for p, n, _ in rows}}, \
        legacy


class PartitionWriter:
    """Folds and commits one partition's batches into the audit database at ``url`` for the
    run ``generation`` (see the module docstring).

    ``probe(partition, start, end)``: whether the log holds a record at an offset in
    ``[start, end)`` (``None``: the caller reads the partition itself from its progress,
    so no gap can arise).

    ``history(partition, end)``: the partition's records below ``end``, from the log
    (:func:`log_history`). A namespace's stored state that cannot be read (a damaged row,
    or a format this version does not know) or is missing while the database holds records
    of the namespace is then refolded from them, and the batch writes every namespace's
    snapshot of the partition again; without ``history`` such a state stops the batch with
    an :class:`AuditError` naming the namespace."""

    def __init__(self, url: str, topic: str, generation: int, *, stream: str = "audit",
                 probe: Callable[[int, int, int], bool] | None = None,
                 history: Callable[[int, int], Iterable[LogRecord]] | None = None,
                 engine: Engine | None = None) -> None:
        self.url = url
        self.topic = topic
        self.stream = stream
        self.generation = generation
        self.probe = probe
        self.history = history
        self.engine = engine or _engine(url)

    def write(self, partition: int, records: Iterable[LogRecord], batch_id: int
              ) -> PartitionCommit:
        """Fold ``records`` (all of ``partition``, offsets strictly increasing) and commit
        their rows, the namespaces' snapshots and the partition's progress in one
        transaction. Raises :class:`Fenced`, :class:`Gap` or :class:`AuditError`; then
        nothing of the batch was written.

        ``records`` may be a lazy iterable (a Spark task's input as it arrives): the
        partition is locked first, then the records are checked and folded as they come."""
        key = (self.url, self.stream, self.topic, partition)
        try:
            with self.engine.begin() as conn:
                locked = _progress_of(conn, self.stream, self.topic, partition=partition,
                                      lock=True)
                if not locked:  # a partition the run did not know at its start: from 0
                    self._first_row(conn, partition, batch_id)
                    locked = _progress_of(conn, self.stream, self.topic,
                                          partition=partition, lock=True)
                (_, start, generation), = locked
                if generation != self.generation:
                    raise Fenced(f"{self.topic}[{partition}] belongs to run {generation}, not "
                                 f"{self.generation}: a task of an old run is refused")
                with _CACHE_LOCK:
                    cached = _CACHE.get(key)
                    if cached is not None and (cached.next_offset, cached.generation) != \
                            (start, generation):
                        cached = None
                refolded: list[AuditProjection] = []
                projection = AuditProjection(
                    self.topic,
                    loader=lambda ns: self._stored(conn, partition, start, ns, refolded),
                    repair=lambda ns, why: self._refold(partition, start, ns, why, refolded))
                if cached is not None:
                    projection.resume(cached.state)
                projection.start_at({partition: start})
                rows = projection.project(self._checked(partition, start, records))
                end = rows.progress.get(partition, start)
                if end == start:  # nothing new: the batch was committed already
                    return PartitionCommit(partition, start, start, 0)
                # After a refold, every namespace's snapshot of the partition is written
                # again: one the batch did not touch has the same state at ``end`` as at
                # ``start``, the refold's.
                states = {ns: r.state_of(ns) for r in refolded for ns in r.namespaces()}
                states.update({ns: projection.state_of(ns, rows) for ns in rows.namespaces})
                bulk = Bulk(conn)
                self._insert_rows(bulk, conn, rows)
                self._snapshots(bulk, partition, end, states)
                self._advance(conn, partition, start, end, batch_id)
        except DBAPIError as e:
            raise AuditError(f"writing batch {batch_id} of {self.topic}[{partition}] to the "
                             f"audit database failed; nothing of it was committed: "
                             f"{' '.join(str(e.orig).split())}") from None
        bulk.committed()
        with _CACHE_LOCK:
            _CACHE[key] = _Cached(end, generation, projection.state_after(rows))
            _CACHE.move_to_end(key)
            while len(_CACHE) > CACHE_PARTITIONS:
                _CACHE.popitem(last=False)
        newest = max((t for r in rows.records if (t := r.get("log_time")) is not None),
                     default=None)
        return PartitionCommit(partition, start, end, len(rows.records), newest)

    def _refold(self, partition: int, start: int, ns: str, why: str,
                refolded: list[AuditProjection]) -> bytes:
        """``ns``'s state at ``start``, refolded from the log (its stored one cannot be
        read: ``why``); the partition is refolded once per batch (``refolded``)."""
        where = f"{self.topic}[{partition}]"
        if self.history is None:
            raise AuditError(f"{where}: the stored state of namespace {ns!r} cannot be read "
                             f"({why}), and no broker is at hand to refold it from the log")
        if not refolded:
            _LOG.warning("%s: the stored state of namespace %r cannot be read (%s); "
                         "refolding the partition from the log up to offset %d", where, ns,
                         why, start)
            refolded.append(AuditProjection.refolded(self.topic,
                                                     self.history(partition, start)))
        return refolded[0].state_of(ns)

    def _checked(self, partition: int, start: int, records: Iterable[LogRecord]
                 ) -> Iterator[LogRecord]:
        """``records`` from ``start`` on, each checked: of ``partition``, offsets strictly
        increasing, and no gap before the first (see :attr:`probe`)."""
        last = -1
        first = True
        for r in records:
            if r.partition != partition:
                raise AuditError(f"a record of partition {r.partition} in a batch of "
                                 f"partition {partition}")
            if r.offset <= last:
                raise AuditError(f"{self.topic}[{partition}]: offsets arrive out of order "
                                 f"({last} then {r.offset}): refusing the batch")
            last = r.offset
            if r.offset < start:
                continue
            if first:
                first = False
                if r.offset > start and self.probe is not None and \
                        self.probe(partition, start, r.offset):
                    raise Gap(f"{self.topic}[{partition}]: the batch starts at offset "
                              f"{r.offset} but the database reflects the partition up to "
                              f"{start} and the log holds records in between")
            yield r

    # -- inside the transaction ------------------------------------------------------------

    def _stored(self, conn: Connection, partition: int, start: int, ns: str,
                refolded: list[AuditProjection]) -> bytes | None:
        """``ns``'s stored state; ``None`` for a namespace the database has no record of. A
        namespace with records but no stored state (a row deleted by hand) is refolded, not
        folded from nothing."""
        s = _table(AuditSnapshot)
        row = conn.execute(select(s.c.state, s.c.partition).where(
            s.c.stream == self.stream, s.c.topic == self.topic, s.c.namespace == ns)).first()
        if row is not None:
            if row[1] != partition:
                raise two_partitions(self.topic, ns, row[1], partition)
            return bytes(row[0])
        r = _table(AuditRecord)
        seen = conn.execute(select(r.c.partition).where(
            r.c.namespace == ns, r.c.topic == self.topic).limit(1)).first()
        if seen is None:
            return None  # new to the database
        if seen[0] != partition:
            raise two_partitions(self.topic, ns, seen[0], partition)
        return self._refold(partition, start, ns, "it is missing, though the database holds "
                            "records of the namespace", refolded)

    def _insert_rows(self, bulk: Bulk, conn: Connection, rows: BatchRows) -> None:
        bulk.insert(_table(AuditRecord), rows.records)
        bulk.insert(_table(AuditQuarantine), rows.quarantine)
        bulk.upsert(_table(AuditJob), rows.jobs)
        bulk.upsert(_table(AuditTerm), rows.terms)
        bulk.upsert(_table(AuditCheckpoint), rows.checkpoints)
        bulk.upsert(_table(AuditCheckpoint), rows.checkpoint_failures,
                    only=("counted", "ignored_reason", "failure_reason", "last_offset"))

    def _snapshots(self, bulk: Bulk, partition: int, end: int,
                   states: dict[str, bytes]) -> None:
        now = int(time.time() * 1000)
        bulk.upsert(_table(AuditSnapshot), [
            {"stream": self.stream, "topic": self.topic, "namespace": ns,
             "partition": partition, "next_offset": end, "state": data, "updated_at": now}
            for ns, data in sorted(states.items())])

    def _first_row(self, conn: Connection, partition: int, batch_id: int) -> None:
        """Create ``partition``'s progress row at offset 0 for this run, unless another
        writer just did (then its generation decides)."""
        table = _table(AuditProgress)
        row = {"stream": self.stream, "topic": self.topic, "partition": partition,
               "next_offset": 0, "batch_id": batch_id, "updated_at": int(time.time() * 1000),
               "generation": self.generation}
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects import postgresql

            conn.execute(postgresql.insert(table).values(row).on_conflict_do_nothing())
        else:
            from sqlalchemy.dialects import sqlite

            conn.execute(sqlite.insert(table).values(row).on_conflict_do_nothing())

    def _advance(self, conn: Connection, partition: int, start: int, end: int,
                 batch_id: int) -> None:
        t = _table(AuditProgress)
        done = conn.execute(update(t).where(
            t.c.stream == self.stream, t.c.topic == self.topic, t.c.partition == partition,
            t.c.next_offset == start, t.c.generation == self.generation).values(
            next_offset=end, batch_id=batch_id, updated_at=int(time.time() * 1000)))
        if done.rowcount != 1:  # cannot happen under the row lock; a guard, not a path
            raise AuditError(f"{self.topic}[{partition}]: the progress moved under the lock")


def two_partitions(topic: str, namespace: str, first: int, second: int) -> AuditError:
    """The error of a namespace found on two partitions: the audit folds a namespace from
    one log (every namespace lives on one partition, :mod:`registry.placement`)."""
    return AuditError(f"namespace {namespace!r} has records on partitions {first} and "
                      f"{second} of topic {topic!r}: it was written under two partition "
                      f"counts (partitions were added, and a client claimed it where the new "
                      f"count maps it); one namespace cannot be folded from two logs. See "
                      f"README \"Scaling the topic\"")


def log_ahead(topic: str, partition: int, next_offset: int, reached: int) -> AuditError:
    """The error of a database that reflects ``topic[partition]`` up to ``next_offset - 1``
    while the log ends at ``reached``."""
    return AuditError(f"the audit database reflects {topic}[{partition}] up to offset "
                      f"{next_offset - 1}, but the log ends at {reached}: another or a wiped "
                      f"topic. Write into a new database (or delete this stream's rows) to "
                      f"audit it")


def log_history(bootstrap: Any, topic: str, timeout: float
                ) -> Callable[[int, int], Iterator[LogRecord]]:
    """``history(partition, end)`` for :class:`PartitionWriter`: the partition's records
    below ``end``, read from the broker at ``bootstrap``; an :class:`AuditError` if the log
    ends before ``end`` (the database reflects records the log does not hold)."""
    from ..log import LogReader

    def history(partition: int, end: int) -> Iterator[LogRecord]:
        reader = LogReader(bootstrap, topic, partition)
        try:
            for batch in reader.read_to_end(timeout, until=end - 1):
                yield from (r for r in batch if r.offset < end)
            if reader.position < end:
                raise log_ahead(topic, partition, end, reader.position)
        finally:
            reader.close()

    return history


def write_snapshots(engine: Engine, stream: str, topic: str, partition: int, end: int,
                    projection: AuditProjection) -> None:
    """Write every namespace's state of ``projection`` as ``partition``'s snapshots at
    ``end`` (a partition adopted from before migration 0006)."""
    now = int(time.time() * 1000)
    with engine.begin() as conn:
        Bulk(conn).upsert(_table(AuditSnapshot), [
            {"stream": stream, "topic": topic, "namespace": ns, "partition": partition,
             "next_offset": end, "state": projection.state_of(ns), "updated_at": now}
            for ns in projection.namespaces()])


_TEMP_TABLES: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
"""Per database session: the temporary tables :class:`Bulk` created in it."""


class Bulk:
    """Many rows into one table, inside the caller's transaction, at the driver's speed.

    SQLAlchemy's executemany costs more per row than folding the record did, so rows go
    straight to the driver on the same connection (the same transaction): PostgreSQL
    ``COPY`` (into the table, or into a temporary table merged with ``INSERT ... ON
    CONFLICT`` for an upsert), SQLite ``executemany`` of one prepared statement.
    """

    def __init__(self, conn: Connection) -> None:
        raw = conn.connection.driver_connection
        assert raw is not None  # a connection in a transaction holds its driver's
        self.raw: Any = raw
        self.postgres = conn.dialect.name == "postgresql"
        self._filled: set[str] = set()  # temporary tables holding rows in this transaction
        self._created: set[str] = set()  # temporary tables this transaction created

    def committed(self) -> None:
        """The transaction committed: the temporary tables it created stay for the session
        (a rolled back one took them with it)."""
        if self._created:
            _TEMP_TABLES.setdefault(self.raw, set()).update(self._created)

    @staticmethod
    def _columns(table: Any) -> list[str]:
        return [c.name for c in table.columns]

    @staticmethod
    def _q(name: str) -> str:
        return f'"{name}"'

    def insert(self, table: Any, rows: Sequence[dict[str, Any]]) -> None:
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

    def upsert(self, table: Any, rows: Sequence[dict[str, Any]],
               only: Sequence[str] | None = None) -> None:
        """Insert ``rows``; where the primary key exists, update ``only`` these columns (all
        but the key if ``None``)."""
        if not rows:
            return
        cols = self._columns(table)
        keys = [c.name for c in table.primary_key.columns]
        update_cols = only or [c for c in cols if c not in keys]
        names = ", ".join(self._q(c) for c in cols)
        conflict = (f"ON CONFLICT ({', '.join(self._q(k) for k in keys)}) DO UPDATE SET "
                    + ", ".join(f"{self._q(c)} = excluded.{self._q(c)}" for c in update_cols))
        if self.postgres:
            tmp = f"_jobreg_{table.name}"
            with self.raw.cursor() as cur:
                if tmp not in _TEMP_TABLES.get(self.raw, ()) and tmp not in self._created:
                    # once per session (see committed); emptied by every commit
                    cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {tmp} "
                                f"(LIKE {table.name} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
                    self._created.add(tmp)
                elif tmp in self._filled:
                    cur.execute(f"TRUNCATE {tmp}")
                with cur.copy(f"COPY {tmp} ({names}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row([row[c] for c in cols])
                self._filled.add(tmp)
                cur.execute(f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {tmp} "
                            f"{conflict}")
        else:
            marks = ", ".join("?" * len(cols))
            self.raw.executemany(
                f"INSERT INTO {table.name} ({names}) VALUES ({marks}) {conflict}",
                [tuple(row[c] for c in cols) for row in rows])
