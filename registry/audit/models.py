"""The SQL audit tables: SQLAlchemy 2.0 declarative models.

A streaming job folds the registry log and writes what the fold decided
(:class:`registry.image.Decision`) and what state it left (the
:class:`registry.image.Image`) into these tables. They are a *projection*: the
log stays the truth, and every row can be rebuilt by folding the log again.

Conventions:

* every time is a ``BIGINT`` of milliseconds since the Unix epoch: ``log_time``
  and ``*_at`` columns are the broker's record timestamps (LogAppendTime),
  ``created_at`` is the writer's clock (informational only);
* offsets are ``BIGINT``; a record is identified by ``(topic, partition, offset)``;
* enumerations (outcomes, job and checkpoint statuses) are ``CHECK``-constrained,
  so a status the schema does not know is refused by the database instead of
  slipping past the views (adding one to :class:`registry.events.JobStatus`
  needs a migration, and a look at the ``resurrections`` view).

Migration ``0001_audit_schema`` creates these tables plus the views listed in
:data:`VIEWS`; later revisions add columns (``0002``: ``audit_jobs.reason``, ``0003``:
``audit_jobs.dirty``, ``0004``: ``audit_jobs.graph_uri`` and
``audit_jobs.held_checkpoints``, ``0006``: ``audit_progress.generation`` and the table
``audit_snapshots``). A test compares the database migrated to head with this
metadata. Migrations are frozen: they do not import this module.
"""

from __future__ import annotations

from ..extras import needs

with needs("audit", "the audit database (registry.audit)"):
    from sqlalchemy import (
        BigInteger,
        Boolean,
        CheckConstraint,
        Index,
        Integer,
        LargeBinary,
        MetaData,
        String,
        Text,
        false,
    )
    from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ..events import JobStatus
from ..image import Outcome

__all__ = [
    "CHECKPOINT_STATUSES",
    "GRAPH_KINDS",
    "JOB_STATUSES",
    "OUTCOMES",
    "TABLES",
    "TERMINAL_STATUSES",
    "VIEWS",
    "AuditCheckpoint",
    "AuditJob",
    "AuditProgress",
    "AuditQuarantine",
    "AuditRecord",
    "AuditSnapshot",
    "AuditTerm",
    "Base",
]

#: Outcomes a row of ``audit_records`` can have (``SKIPPED`` records, another
#: namespace's, are not this namespace's audit and are never written).
OUTCOMES: tuple[str, ...] = (
    Outcome.ACCEPTED,
    Outcome.IGNORED,
    Outcome.REJECTED,
    Outcome.DUPLICATE,
    Outcome.QUARANTINED,
)
#: Outcomes that passed every rule (``Decision.accepted``).
ACCEPTED_OUTCOMES: tuple[str, ...] = (Outcome.ACCEPTED, Outcome.IGNORED)
#: Job statuses (:attr:`registry.events.JobStatus.ALL`).
JOB_STATUSES: tuple[str, ...] = JobStatus.ALL
#: Terminal job statuses, sorted (the ``resurrections`` view spells them out).
TERMINAL_STATUSES: tuple[str, ...] = tuple(sorted(JobStatus.TERMINAL))
#: Checkpoint statuses in ``audit_checkpoints``.
CHECKPOINT_STATUSES: tuple[str, ...] = ("TRIGGERED", "COMPLETED", "FAILED", "DISCARDED")
#: How a job's graph is stored: in the event, or in the blob store.
GRAPH_KINDS: tuple[str, ...] = ("inline", "blob")

#: The views migration 0001 creates (not part of the metadata: SQLAlchemy does not model views).
VIEWS: tuple[str, ...] = (
    "refused_writes",
    "leadership_terms",
    "job_history",
    "checkpoint_failures",
    "resurrections",
)


def _in(column: str, values: tuple[str, ...]) -> str:
    """SQL ``column IN ('a', 'b')`` for a CHECK constraint (values are our own constants)."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


#: Constraint names are derived from these patterns, identically on every backend
#: (SQLite's batch migrations need named constraints).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of the audit tables; ``Base.metadata`` is the schema."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class AuditRecord(Base):
    """One log record and the fold's verdict on it (a :class:`registry.image.Decision`)."""

    __tablename__ = "audit_records"
    __table_args__ = (
        Index(None, "namespace", "job_id"),
        Index(None, "namespace", "outcome"),
        CheckConstraint(_in("outcome", OUTCOMES), name="outcome"),
        CheckConstraint(
            f"accepted = ({_in('outcome', ACCEPTED_OUTCOMES)})", name="accepted_matches_outcome"
        ),
        CheckConstraint(_in("job_status", JOB_STATUSES), name="job_status"),
    )

    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    #: ``None`` only for records whose namespace could not be told (undecodable, no key).
    namespace: Mapped[str | None] = mapped_column(Text)
    key: Mapped[str | None] = mapped_column(Text)
    event_id: Mapped[str | None] = mapped_column(Text)
    event_type: Mapped[str | None] = mapped_column(Text)
    job_id: Mapped[str | None] = mapped_column(Text)
    epoch: Mapped[int | None] = mapped_column(BigInteger)
    writer: Mapped[str | None] = mapped_column(Text)
    #: The event's ``created_at`` (the writer's clock).
    created_at: Mapped[int | None] = mapped_column(BigInteger)
    #: The broker's timestamp of the record.
    log_time: Mapped[int | None] = mapped_column(BigInteger)
    outcome: Mapped[str] = mapped_column(String(16))
    #: ``outcome`` is ACCEPTED or IGNORED (``Decision.accepted``).
    accepted: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[str | None] = mapped_column(Text)
    expected_epoch: Mapped[int | None] = mapped_column(BigInteger)
    actual_epoch: Mapped[int | None] = mapped_column(BigInteger)
    leader: Mapped[str | None] = mapped_column(Text)
    #: The job's status in the image right after this record (``None``: not about a job).
    job_status: Mapped[str | None] = mapped_column(String(32))


class AuditJob(Base):
    """A job as the fold sees it now (a :class:`registry.image.JobView`)."""

    __tablename__ = "audit_jobs"
    __table_args__ = (
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        CheckConstraint(_in("graph_kind", GRAPH_KINDS), name="graph_kind"),
    )

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    job_id: Mapped[str] = mapped_column(Text, primary_key=True)
    status: Mapped[str] = mapped_column(String(32))
    owner_epoch: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    max_checkpoint_failures: Mapped[int] = mapped_column(Integer)
    retained_checkpoints: Mapped[int] = mapped_column(Integer)
    consecutive_failures: Mapped[int] = mapped_column(Integer)
    #: ``'inline'``, ``'blob'``, or ``None`` (a terminal job keeps its graph only while its
    #: result is dirty).
    graph_kind: Mapped[str | None] = mapped_column(String(8))
    #: Offset of the record that last changed the job.
    last_offset: Mapped[int] = mapped_column(BigInteger)
    #: Log time of that record.
    updated_at: Mapped[int | None] = mapped_column(BigInteger)
    #: Why a terminal job ended (its cancel's or terminate's reason), if it said.
    reason: Mapped[str | None] = mapped_column(Text)
    #: A terminal job whose result is not yet cleaned up (no ``JobCleanedUp`` yet): its
    #: graph and retained checkpoints still wait for the coordinator's cleanup.
    dirty: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)
    #: The blob's URI when ``graph_kind`` is ``'blob'`` (a live job's graph, or the one a
    #: dirty result holds and its cleanup must delete); ``None`` otherwise.
    graph_uri: Mapped[str | None] = mapped_column(Text)
    #: How many completed checkpoints the job holds (``JobView.latest_checkpoints``): those
    #: recovery may restore, and for a dirty result those its cleanup must delete; 0 once
    #: clean. ``None`` only on rows written before migration 0004 whose job has not
    #: changed since (the audit database keeps nothing to fill them from).
    held_checkpoints: Mapped[int | None] = mapped_column(Integer)


class AuditTerm(Base):
    """A leadership term (a :class:`registry.image.TermInfo`) with its write counts."""

    __tablename__ = "audit_terms"

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    leader: Mapped[str] = mapped_column(Text)
    granted_offset: Mapped[int] = mapped_column(BigInteger)
    revoked_offset: Mapped[int | None] = mapped_column(BigInteger)
    #: ``None``: no lease (an external election).
    lease_ms: Mapped[int | None] = mapped_column(BigInteger)
    renewals: Mapped[int] = mapped_column(BigInteger)
    accepted_writes: Mapped[int] = mapped_column(BigInteger)
    rejected_writes: Mapped[int] = mapped_column(BigInteger)
    granted_at: Mapped[int | None] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)


class AuditCheckpoint(Base):
    """One checkpoint of one job, as fold rule 6 left it."""

    __tablename__ = "audit_checkpoints"
    __table_args__ = (CheckConstraint(_in("status", CHECKPOINT_STATUSES), name="status"),)

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    job_id: Mapped[str] = mapped_column(Text, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    #: For a failure: whether it counted toward the job's budget; ``None`` otherwise.
    counted: Mapped[bool | None] = mapped_column(Boolean)
    #: Why a failure did not count (the IGNORED record's reason).
    ignored_reason: Mapped[str | None] = mapped_column(Text)
    location: Mapped[str | None] = mapped_column(Text)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    last_offset: Mapped[int] = mapped_column(BigInteger)


class AuditQuarantine(Base):
    """A record the fold could not decode (or a tombstone, or an unknown type), kept as bytes."""

    __tablename__ = "audit_quarantine"

    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    namespace: Mapped[str | None] = mapped_column(Text)
    key: Mapped[str | None] = mapped_column(Text)
    value: Mapped[bytes | None] = mapped_column(LargeBinary)
    reason: Mapped[str] = mapped_column(Text)
    detail: Mapped[str | None] = mapped_column(Text)
    log_time: Mapped[int | None] = mapped_column(BigInteger)


class AuditProgress(Base):
    """How far a stream has written, committed in the same transaction as its rows."""

    __tablename__ = "audit_progress"

    stream: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The first offset not yet reflected in the tables.
    next_offset: Mapped[int] = mapped_column(BigInteger)
    batch_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    #: The run allowed to write this partition (migration 0006): each start of the job
    #: raises it; a task of another generation is refused (a zombie of an old driver).
    generation: Mapped[int] = mapped_column(BigInteger, server_default="0", default=0)


class AuditSnapshot(Base):
    """A namespace's audit projection state (the fold's image and per-term counts) as of
    its partition's ``next_offset``, committed with the rows and the progress (0006)."""

    __tablename__ = "audit_snapshots"

    stream: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer)
    next_offset: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[int] = mapped_column(BigInteger)


#: Every audit table, in creation order.
TABLES: tuple[str, ...] = tuple(Base.metadata.tables)
