"""The events of the registry log: frozen dataclasses, one per ``schemas/jobreg.<Type>.avsc``.

Every event carries the envelope (:class:`Event`'s fields): ``event_id`` (a
UUID, the idempotency key), ``namespace`` (one coordinator cluster),
``epoch`` (the fencing epoch the writer claims to hold), ``writer`` (the
contender's name), ``created_at`` (milliseconds since the Unix epoch on the
writer's clock; informational only, never used for ordering) and
``schema_version`` (the version of the writer schema, set by the codec).

Events are named in the past tense; the commands that produce them live on
:class:`registry.client.Term`. Only :func:`registry.fold.replay` gives them
meaning. A test may build any event here and write it raw (see
:func:`registry.log.write_raw`) to play a zombie that ignores fencing.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "EVENT_TYPES",
    "Event",
    "GraphRef",
    "InlineGraph",
    "JobAdopted",
    "JobCancelled",
    "JobEvent",
    "JobLockReleased",
    "JobReasserted",
    "JobStatus",
    "JobSubmitted",
    "JobTerminated",
    "LeadershipGranted",
    "LeadershipRevoked",
    "new_event_id",
    "now_ms",
]


class JobStatus:
    """Job status names (plain strings so they survive Avro and JSON unchanged)."""

    ACTIVE = "ACTIVE"
    CANCELLED = "CANCELLED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"

    TERMINAL: ClassVar[frozenset[str]] = frozenset({CANCELLED, FINISHED, FAILED})
    ALL: ClassVar[tuple[str, ...]] = (ACTIVE, CANCELLED, FINISHED, FAILED)


def new_event_id() -> str:
    """A fresh random event id (UUID4, canonical text form)."""
    return str(uuid.uuid4())


def now_ms() -> int:
    """Wall-clock milliseconds since the Unix epoch (for ``created_at`` only)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class InlineGraph:
    """A job graph carried in the event itself (up to the inline limit)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class GraphRef:
    """A job graph stored in a content-addressed blob store."""

    uri: str
    sha256: str
    size: int


Graph = InlineGraph | GraphRef


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """The envelope shared by every event (see the module docstring)."""

    TYPE: ClassVar[str] = ""

    event_id: str
    namespace: str
    epoch: int
    writer: str
    created_at: int
    schema_version: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class LeadershipGranted(Event):
    """A contender claimed the term ``epoch``; accepted iff ``prev_epoch`` is current (a CAS)."""

    TYPE: ClassVar[str] = "LeadershipGranted"

    prev_epoch: int
    lease_ms: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LeadershipRevoked(Event):
    """The leader of ``epoch`` gave its term up; no write of that term is accepted after it."""

    TYPE: ClassVar[str] = "LeadershipRevoked"

    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobEvent(Event):
    """Base of the events about one job (``job_id``)."""

    job_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSubmitted(JobEvent):
    """A new job id with its graph; a terminal id can never be submitted again."""

    TYPE: ClassVar[str] = "JobSubmitted"

    graph: InlineGraph | GraphRef


@dataclass(frozen=True, kw_only=True, slots=True)
class JobAdopted(JobEvent):
    """The current term takes the job's lock (on recovery)."""

    TYPE: ClassVar[str] = "JobAdopted"


@dataclass(frozen=True, kw_only=True, slots=True)
class JobLockReleased(JobEvent):
    """The term that holds the job's lock lets it go; the job stays."""

    TYPE: ClassVar[str] = "JobLockReleased"


@dataclass(frozen=True, kw_only=True, slots=True)
class JobCancelled(JobEvent):
    """The job was cancelled: terminal for ever."""

    TYPE: ClassVar[str] = "JobCancelled"

    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobTerminated(JobEvent):
    """The job finished or failed (``state`` is FINISHED or FAILED): terminal for ever."""

    TYPE: ClassVar[str] = "JobTerminated"

    state: str
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobReasserted(JobEvent):
    """The leader re-states a job's whole accepted state on a key a refused record landed on.

    This is what keeps compaction from changing the answer: Kafka's cleaner
    keeps the newest record of a key, so after a refused write the newest
    record must again be one that carries the accepted state. ``status``,
    ``owner_epoch`` and ``graph`` are the job's state after this event
    (``graph`` is ``None`` for terminal jobs).
    """

    TYPE: ClassVar[str] = "JobReasserted"

    status: str
    owner_epoch: int | None
    graph: InlineGraph | GraphRef | None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        LeadershipGranted,
        LeadershipRevoked,
        JobSubmitted,
        JobAdopted,
        JobLockReleased,
        JobCancelled,
        JobTerminated,
        JobReasserted,
    )
}
"""Event type name (the Avro record name without namespace) -> dataclass."""
