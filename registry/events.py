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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import ClassVar, NamedTuple

__all__ = [
    "LAYOUT",
    "CHECKPOINT_FAILURE_REASONS",
    "COUNTED_BEFORE_RECORDED",
    "COUNTED_FAILURE_REASONS",
    "EARLIER_FLINK_REASONS",
    "FLINK_FAILURE_REASONS",
    "FLINK_RELEASE",
    "EMPTY_CHECKPOINTS",
    "EVENT_TYPES",
    "MAX_PARALLELISM",
    "MAX_REQUIREMENTS",
    "MEMBER_TYPES",
    "NESTED_TYPES",
    "UNKNOWN_CHECKPOINT",
    "VertexParallelism",
    "as_call",
    "CallCommitted",
    "CheckpointCompleted",
    "CheckpointDiscarded",
    "CheckpointEvent",
    "CheckpointFailed",
    "CheckpointState",
    "CheckpointTriggered",
    "CompletedCheckpoint",
    "Event",
    "FailureReason",
    "GraphRef",
    "InlineGraph",
    "JobAdopted",
    "JobCancelled",
    "JobCleanedUp",
    "JobEvent",
    "JobLockReleased",
    "JobReasserted",
    "JobRecoveryFailed",
    "JobRescaled",
    "JobRestarted",
    "JobStatus",
    "JobSubmitted",
    "JobTerminated",
    "LeaderInformationPublished",
    "LeadershipGranted",
    "LeadershipRevoked",
    "LeaseRenewed",
    "new_event_id",
    "now_ms",
]


class JobStatus:
    """Job status names (plain strings so they survive Avro and JSON unchanged)."""

    ACTIVE = "ACTIVE"
    RECOVERY_FAILED = "RECOVERY_FAILED"  # live, but not recovered until retried or cancelled
    CANCELLED = "CANCELLED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"

    ABSENT = "ABSENT"  # only in a JobReasserted: the job does not exist (fold rule 8)

    TERMINAL: ClassVar[frozenset[str]] = frozenset({CANCELLED, FINISHED, FAILED})
    ALL: ClassVar[tuple[str, ...]] = (ACTIVE, RECOVERY_FAILED, CANCELLED, FINISHED, FAILED)


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


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    """A completed checkpoint that recovery may restore: its id and where it is stored."""

    checkpoint_id: int
    location: str


MAX_PARALLELISM = 32768
"""The highest parallelism a vertex can have (Flink's
``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``)."""

MAX_REQUIREMENTS = 512
"""The most vertices one :class:`JobRescaled` may name: every later checkpoint record of the
job carries them (about 40 bytes a vertex), so a larger graph is refused, not carried."""


@dataclass(frozen=True, slots=True)
class VertexParallelism:
    """The parallelism a coordinator asked for one vertex of a job (Flink's
    ``JobVertexResourceRequirements.Parallelism``, written by ``putJobResourceRequirements``):
    ``vertex_id`` its 32 lower-case hex digits (Flink's ``JobVertexID``), the bounds between
    1 and :data:`MAX_PARALLELISM`, or -1 for a bound left to the scheduler (lower: 1, upper:
    the vertex's maximum parallelism), the lower never above the upper (fold rule 6,
    :func:`registry.rules.requirements_error`)."""

    vertex_id: str
    lower_bound: int
    upper_bound: int


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """A job's checkpoint bookkeeping after an event (rule 6 of the fold).

    ``seq`` counts the checkpoint records the fold accepted for the job;
    ``last_completed`` is the newest completed id (-1: none); ``retained`` the
    newest completed checkpoints, oldest first; ``pending`` the triggered ids
    not yet finished; ``discarded`` the ids newer than ``last_completed`` that ended
    without completing (discarded, or failed and no longer counted); ``counted`` the failed
    ids counted since the last completion or restart; ``unknown_failures`` the counted
    failures in the trigger phase (no id) since then. Every id triggered stays in one of
    them until a newer one completes, so :attr:`newest_id` never goes back. All id tuples
    are sorted, so equal states compare equal.

    ``requirements``: the resource requirements of the job's newest accepted
    :class:`JobRescaled` (sorted by vertex; empty: none set, the graph's own). They are part
    of this state so that the records every later checkpoint event carries keep them, and
    the fold's keeping of the record a job's state stands on keeps them through every
    compaction (rule 6): a rescale is never undone by the cleaner nor by a stale leader.
    """

    seq: int = 0
    last_completed: int = -1
    retained: tuple[CompletedCheckpoint, ...] = ()
    pending: tuple[int, ...] = ()
    discarded: tuple[int, ...] = ()
    counted: tuple[int, ...] = ()
    unknown_failures: int = 0
    requirements: tuple[VertexParallelism, ...] = ()

    @property
    def newest_id(self) -> int:
        """The highest checkpoint id this state knows of (-1: none): a trigger must name a
        higher one (fold rule 6), and a checkpoint id counter continues after it."""
        return max((self.last_completed, *self.pending, *self.discarded, *self.counted))

    @property
    def consecutive_failures(self) -> int:
        """Failures counted since the last completion or restart: the counted checkpoint ids
        and the failures in the trigger phase (no id)."""
        return len(self.counted) + self.unknown_failures


EMPTY_CHECKPOINTS = CheckpointState()


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """The envelope shared by every event (see the module docstring)."""

    TYPE: ClassVar[str] = ""

    event_id: str
    namespace: str
    epoch: int
    writer: str
    created_at: int
    # How the record was encoded, not what happened: left out of equality.
    schema_version: int = field(default=1, compare=False)


LAYOUT = 2
"""The record layout this jobreg writes (:attr:`LeadershipGranted.layout`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LeadershipGranted(Event):
    """A contender claimed the term ``epoch``; accepted iff ``prev_epoch`` is current (a CAS).

    ``partitions`` and ``partition``: the topic's partition count the claimant mapped the
    namespace with, and the partition that gave (``0`` and ``-1``: not recorded, a grant
    written before jobreg recorded them). Forensic facts for :mod:`registry.placement`;
    the fold's rules do not read them."""

    TYPE: ClassVar[str] = "LeadershipGranted"

    prev_epoch: int
    lease_ms: int | None = None
    partitions: int = 0
    partition: int = -1
    saw_renewal: int | None = None
    """The highest renewal ordinal (:attr:`LeaseRenewed.renewal`) of the term it replaces
    that the contender had folded: fold rule 3 refuses the grant (``renewed_since``) if a
    renewal of that term with a higher ordinal was accepted before it. ``None``: no compare
    on renewals (an external election's claim, and grants written before this field)."""
    layout: int = 0
    """The record layout its writer uses (fold rules 5 and 6): ``2`` (:data:`LAYOUT`, what
    this jobreg writes), checkpoint records under keys of their own too
    (:func:`~registry.keys.checkpoint_key`); ``1``, submits under keys of their own
    (:func:`~registry.keys.birth_key`); ``0``, submits (and ends) under the job's key
    (grants written before this field). Once a grant of layout 1 was accepted, the fold
    refuses a submit or an end under the job's key (``wrong_key``); once one of layout 2
    was, a checkpoint record under the job's one checkpoints key."""


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
    """A new job id with its graph; a terminal id can never be submitted again.

    ``max_checkpoint_failures`` is the job's tolerable number of consecutive
    failed checkpoints (Flink's ``tolerable-failed-checkpoints``, default 0);
    ``retained_checkpoints`` how many completed checkpoints recovery keeps.
    """

    TYPE: ClassVar[str] = "JobSubmitted"

    graph: InlineGraph | GraphRef
    max_checkpoint_failures: int = 0
    retained_checkpoints: int = 1
    call_id: str | None = None
    """Set on the records of a multi-record call: the event id of its
    :class:`CallCommitted`, at which the fold decides them all (fold rule 8)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobAdopted(JobEvent):
    """The current term takes the job's lock (on recovery)."""

    TYPE: ClassVar[str] = "JobAdopted"

    call_id: str | None = None
    """Set on the records of a multi-record call: the event id of its
    :class:`CallCommitted`, at which the fold decides them all (fold rule 8)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobLockReleased(JobEvent):
    """The term that holds the job's lock lets it go; the job stays."""

    TYPE: ClassVar[str] = "JobLockReleased"


@dataclass(frozen=True, kw_only=True, slots=True)
class JobCancelled(JobEvent):
    """The job was cancelled: terminal for ever, its result dirty until cleaned up.

    Written under a key of its own (:func:`registry.keys.end_key`, schema version 3 on),
    so that no later record can supersede it; it carries no copy of the job's graph or
    checkpoint state (the fold keeps its own, fold rule 5). ``graph`` and ``checkpoints``
    are read only from records of schema version 2, written under the job's key, where
    they were the job's graph and checkpoint state as it ended. Records of schema
    version 1 carry neither: their result is clean (there was no cleanup before results
    existed).
    """

    TYPE: ClassVar[str] = "JobCancelled"

    reason: str = ""
    graph: InlineGraph | GraphRef | None = None
    checkpoints: CheckpointState = EMPTY_CHECKPOINTS


@dataclass(frozen=True, kw_only=True, slots=True)
class JobTerminated(JobEvent):
    """The job finished or failed (``state`` is FINISHED or FAILED): terminal for ever, its
    result dirty until cleaned up (its key, ``graph`` and ``checkpoints`` as in
    :class:`JobCancelled`)."""

    TYPE: ClassVar[str] = "JobTerminated"

    state: str
    reason: str = ""
    graph: InlineGraph | GraphRef | None = None
    checkpoints: CheckpointState = EMPTY_CHECKPOINTS


@dataclass(frozen=True, kw_only=True, slots=True)
class JobCleanedUp(JobEvent):
    """The job's result is clean: its graph, checkpoints and other data were deleted
    (Flink's ``JobResultStore.markResultAsClean``). ``status`` and ``reason`` restate the
    result. ``end_event_id`` names the end it cleans (schema version 2 on): such a record
    is accepted only for a job the fold knows has ended, which it always does, since ends
    have keys of their own. A record of version 1 (no ``end_event_id``) was written when
    the cancel or terminate shared the job's key, which the cleanup then superseded: the
    fold accepts one for a job it does not know, and it alone keeps the job terminal."""

    TYPE: ClassVar[str] = "JobCleanedUp"

    status: str
    reason: str | None = None
    end_event_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRecoveryFailed(JobEvent):
    """Recovering the job failed (graph missing or corrupt, or the recovery hook raised).

    The job keeps its place but is not recovered again until a term retries
    it (a ``JobAdopted``) or it is cancelled; ``error`` says why.
    """

    TYPE: ClassVar[str] = "JobRecoveryFailed"

    error: str
    call_id: str | None = None
    """Set on the records of a multi-record call: the event id of its
    :class:`CallCommitted`, at which the fold decides them all (fold rule 8)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointEvent(JobEvent):
    """Base of the checkpoint lifecycle events of one job.

    ``seq`` and ``state`` are the job's :class:`CheckpointState` sequence and
    whole state *after* this event, as the writer computed them with the
    fold's own rule: after compaction the fold can only learn the state from
    the newest record of the job's checkpoint key.
    """

    checkpoint_id: int
    state: CheckpointState


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointTriggered(CheckpointEvent):
    """Checkpoint ``checkpoint_id`` of the job started."""

    TYPE: ClassVar[str] = "CheckpointTriggered"


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointCompleted(CheckpointEvent):
    """Checkpoint ``checkpoint_id`` completed and is stored at ``location``. ``retained``: how
    many completed checkpoints the job keeps with this one (the newest, by id): Flink's
    ``state.checkpoints.num-retained`` as its checkpoint store was built with it; 0 (and
    every record before schema version 3): the job's ``retained_checkpoints``, from its
    submit."""

    TYPE: ClassVar[str] = "CheckpointCompleted"

    location: str
    retained: int = 0


UNKNOWN_CHECKPOINT = -1
"""The checkpoint id of a failure in the trigger phase, before the id existed (Flink's
``CheckpointFailureManager.UNKNOWN_CHECKPOINT_ID``)."""

FLINK_RELEASE = "2.3.0"
"""The Flink release whose checkpoint failure table jobreg follows
(:data:`FLINK_FAILURE_REASONS`)."""


class FailureReason(NamedTuple):
    """One of Flink's ``CheckpointFailureReason`` values: ``pre_flight`` (it happens before
    the checkpoint reaches the job's tasks, so Flink handles it as a job-level failure) and
    ``counted`` (``CheckpointFailureManager.checkFailureCounter`` counts it against the
    tolerable number of failed checkpoints)."""

    pre_flight: bool
    counted: bool


FLINK_FAILURE_REASONS: Mapping[str, FailureReason] = MappingProxyType({
    # Flink 2.3.0's CheckpointFailureReason in its declaration order, and its
    # CheckpointFailureManager.checkFailureCounter: these five count, every other is ignored
    # (read from the 2.3.0 release's classes, flink-dist-2.3.0.jar; its unknown-reason
    # default throws). Its CheckpointFailureManagerTest.testTotalCountValue asserts 5.
    "PERIODIC_SCHEDULER_SHUTDOWN": FailureReason(True, False),
    "TOO_MANY_CHECKPOINT_REQUESTS": FailureReason(True, False),
    "MINIMUM_TIME_BETWEEN_CHECKPOINTS": FailureReason(True, False),
    "NOT_ALL_REQUIRED_TASKS_RUNNING": FailureReason(True, False),
    "IO_EXCEPTION": FailureReason(True, True),
    "BLOCKING_OUTPUT_EXIST": FailureReason(True, False),
    "CHECKPOINT_ASYNC_EXCEPTION": FailureReason(False, True),
    "CHANNEL_STATE_SHARED_STREAM_EXCEPTION": FailureReason(False, False),
    "CHECKPOINT_EXPIRED": FailureReason(False, True),
    "CHECKPOINT_SUBSUMED": FailureReason(False, False),
    "CHECKPOINT_DECLINED": FailureReason(False, True),
    "CHECKPOINT_DECLINED_TASK_NOT_READY": FailureReason(False, False),
    "CHECKPOINT_DECLINED_TASK_CLOSING": FailureReason(False, False),
    "CHECKPOINT_DECLINED_SUBSUMED": FailureReason(False, False),
    "CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER": FailureReason(False, False),
    "CHECKPOINT_DECLINED_INPUT_END_OF_STREAM": FailureReason(False, False),
    "CHECKPOINT_COORDINATOR_SHUTDOWN": FailureReason(False, False),
    "CHECKPOINT_COORDINATOR_SUSPEND": FailureReason(False, False),
    "JOB_FAILOVER_REGION": FailureReason(False, False),
    "TASK_FAILURE": FailureReason(False, False),
    "TASK_CHECKPOINT_FAILURE": FailureReason(False, False),
    "UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE": FailureReason(False, False),
    "FINALIZE_CHECKPOINT_FAILURE": FailureReason(False, True),
    "TRIGGER_CHECKPOINT_FAILURE": FailureReason(False, False),
})
"""Flink :data:`FLINK_RELEASE`'s checkpoint failure reasons, in Flink's order, each with its
``preFlight`` flag and whether Flink counts it."""

EARLIER_FLINK_REASONS: tuple[str, ...] = (
    "TOO_MANY_CONCURRENT_CHECKPOINTS",
    "CHECKPOINT_DECLINED_TASK_NOT_CHECKPOINTING",
    "CHECKPOINT_DECLINED_ALIGNMENT_LIMIT_EXCEEDED",
    "JOB_FAILURE",
)
"""Names earlier Flink releases had and :data:`FLINK_RELEASE` has not; no release counted
them. jobreg still takes them (a coordinator on an older Flink reports them), uncounted."""

CHECKPOINT_FAILURE_REASONS: tuple[str, ...] = (
    "UNSPECIFIED",
    "PERIODIC_SCHEDULER_SHUTDOWN",
    "TOO_MANY_CONCURRENT_CHECKPOINTS",
    "TOO_MANY_CHECKPOINT_REQUESTS",
    "MINIMUM_TIME_BETWEEN_CHECKPOINTS",
    "NOT_ALL_REQUIRED_TASKS_RUNNING",
    "IO_EXCEPTION",
    "CHECKPOINT_ASYNC_EXCEPTION",
    "CHECKPOINT_EXPIRED",
    "CHECKPOINT_SUBSUMED",
    "CHECKPOINT_DECLINED",
    "CHECKPOINT_DECLINED_TASK_NOT_READY",
    "CHECKPOINT_DECLINED_TASK_CLOSING",
    "CHECKPOINT_DECLINED_TASK_NOT_CHECKPOINTING",
    "CHECKPOINT_DECLINED_SUBSUMED",
    "CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER",
    "CHECKPOINT_DECLINED_ALIGNMENT_LIMIT_EXCEEDED",
    "CHECKPOINT_DECLINED_INPUT_END_OF_STREAM",
    "CHECKPOINT_COORDINATOR_SHUTDOWN",
    "CHECKPOINT_COORDINATOR_SUSPEND",
    "JOB_FAILURE",
    "JOB_FAILOVER_REGION",
    "TASK_FAILURE",
    "TASK_CHECKPOINT_FAILURE",
    "UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE",
    "FINALIZE_CHECKPOINT_FAILURE",
    "TRIGGER_CHECKPOINT_FAILURE",
    "BLOCKING_OUTPUT_EXIST",
    "CHANNEL_STATE_SHARED_STREAM_EXCEPTION",
)
"""Every name a failure can carry: the symbols of the Avro enum
``jobreg.CheckpointFailureReason`` (new symbols go at the end; none is ever removed, so old
records keep their names): ``UNSPECIFIED`` (jobreg's own: no reason given, or written before
reasons existed), :data:`FLINK_FAILURE_REASONS` and :data:`EARLIER_FLINK_REASONS`."""

COUNTED_FAILURE_REASONS: frozenset[str] = frozenset(
    {"UNSPECIFIED"} | {name for name, r in FLINK_FAILURE_REASONS.items() if r.counted})
"""The reasons that count against a job's tolerable failures: Flink :data:`FLINK_RELEASE`'s
(IO_EXCEPTION, CHECKPOINT_ASYNC_EXCEPTION, CHECKPOINT_EXPIRED, CHECKPOINT_DECLINED,
FINALIZE_CHECKPOINT_FAILURE) and ``UNSPECIFIED``, which counts as every failure did before
reasons existed. Every other name of :data:`CHECKPOINT_FAILURE_REASONS` is ignored. A writer
decides with this table and records its decision (``CheckpointFailed.reason_counts``)."""

COUNTED_BEFORE_RECORDED: frozenset[str] = frozenset(
    {"UNSPECIFIED", "IO_EXCEPTION", "CHECKPOINT_ASYNC_EXCEPTION", "CHECKPOINT_DECLINED",
     "CHECKPOINT_EXPIRED"})
"""The table of the jobregs that did not record their decision (``CheckpointFailed``
versions 1 and 2, Flink 1.x's ``checkFailureCounter``: FINALIZE_CHECKPOINT_FAILURE not
counted): the fold judges their records by it, so old logs fold to the answer they had."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointFailed(CheckpointEvent):
    """Checkpoint ``checkpoint_id`` failed (:data:`UNKNOWN_CHECKPOINT`: it failed while being
    triggered, before it had an id); ``failure_reason`` is Flink's name for why
    (:data:`CHECKPOINT_FAILURE_REASONS`), ``reason`` says it for people. ``reason_counts`` is
    the writer's decision whether that reason counts (:data:`COUNTED_FAILURE_REASONS`), which
    the fold follows; ``None``: not recorded (written before version 3), judged by
    :data:`COUNTED_BEFORE_RECORDED`."""

    TYPE: ClassVar[str] = "CheckpointFailed"

    reason: str
    task: str | None = None
    failure_reason: str = "UNSPECIFIED"
    reason_counts: bool | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRestarted(CheckpointEvent):
    """The coordinator restarted (failed over) the job from its newest completed checkpoint
    ``checkpoint_id`` (-1: none), as Flink does when the tolerable checkpoint failures are
    exceeded: the failure count starts again, pending checkpoints are aborted (discarded),
    the retained checkpoints are kept."""

    TYPE: ClassVar[str] = "JobRestarted"

    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRescaled(CheckpointEvent):
    """The coordinator set the job's resource requirements (Flink's adaptive scheduler:
    ``ExecutionPlanWriter.putJobResourceRequirements``, what ``PUT
    /jobs/<id>/resource-requirements`` and the Kubernetes operator's autoscaler call) to
    ``state.requirements``; nothing else of the checkpoint state changes. A fenced record of
    its own, on the job's checkpoint record keys (rule 6), never a replace of the graph:
    the next leader recovers the graph as submitted with these requirements.
    ``checkpoint_id`` is always :data:`UNKNOWN_CHECKPOINT` (a rescale names none)."""

    TYPE: ClassVar[str] = "JobRescaled"

    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointDiscarded(CheckpointEvent):
    """The coordinator gave checkpoint ``checkpoint_id`` up; late failures of it do not count."""

    TYPE: ClassVar[str] = "CheckpointDiscarded"

    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaseRenewed(Event):
    """The leader of ``epoch`` is alive; contenders restart their lease clock when they see it.

    ``renewal``: its ordinal in the term (1, 2, ...: one more than the highest the renewer
    had folded or sent); ``attempts``: how many refused grant attempts against the term the
    renewer had folded when it planned it, plus how many of its renewals it had sent and not
    seen confirmed (a renewal whose write failed may land later). Both choose its key
    (:func:`registry.keys.lease_key`: ``<ns>/term/<epoch>/lease/<attempts>/<renewal % 2>``),
    so that the cleaner never removes the renewal a grant's verdict rests on (fold rule 3).
    ``None``: written before these fields (keyed ``<ns>/term/<epoch>/lease``)."""

    TYPE: ClassVar[str] = "LeaseRenewed"

    renewal: int | None = None
    attempts: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderInformationPublished(Event):
    """The leader of ``epoch`` publishes who leads ``component`` (Flink's leader information:
    ``resourcemanager``, ``dispatcher``, ``rest_server``, or a job's id) and where: the
    leader's ``session`` id and ``address``; ``address`` ``None`` deletes the component's
    information (Flink's ``deleteLeaderInformation``). Fenced like every leader write
    (fold rule 9); the image holds the current term's publications only."""

    TYPE: ClassVar[str] = "LeaderInformationPublished"

    component: str
    session: str
    address: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CallCommitted(Event):
    """The end of a multi-record call: its ``size`` records (each carrying this event's id
    as ``call_id``) are decided here, all accepted or none (fold rule 8).

    Keyed by its own id (``<ns>/call/<event_id>``), so the cleaner never removes it.
    """

    TYPE: ClassVar[str] = "CallCommitted"

    size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class JobReasserted(JobEvent):
    """The leader re-states a job's whole accepted state on a key a refused record landed on.

    This is what keeps compaction from changing the answer: Kafka's cleaner
    keeps the newest record of a key, so after a refused write the newest
    record must again be one that carries the accepted state. ``status``,
    ``owner_epoch``, ``graph``, ``error``, the checkpoint budget and
    ``checkpoints`` are the job's state after this event (``graph`` is
    ``None`` for terminal jobs). ``status`` ``ABSENT`` re-states that the job
    does not exist (a refused call submitted it; fold rule 8).
    """

    TYPE: ClassVar[str] = "JobReasserted"

    status: str
    owner_epoch: int | None
    graph: InlineGraph | GraphRef | None
    error: str | None = None
    max_checkpoint_failures: int = 0
    retained_checkpoints: int = 1
    checkpoints: CheckpointState = EMPTY_CHECKPOINTS
    reason: str | None = None
    dirty: bool = False
    """For a terminal job: its result is not yet cleaned up (``graph`` and ``checkpoints``
    are then what cleanup must delete)."""


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
        JobRecoveryFailed,
        CheckpointTriggered,
        CheckpointCompleted,
        CheckpointFailed,
        CheckpointDiscarded,
        LeaseRenewed,
        CallCommitted,
        JobRestarted,
        JobCleanedUp,
        LeaderInformationPublished,
        JobRescaled,
    )
}
"""Event type name (the Avro record name without namespace) -> dataclass."""

MEMBER_TYPES: tuple[type[Event], ...] = (JobSubmitted, JobAdopted, JobRecoveryFailed)
"""The events a multi-record call may hold (fold rule 8 argues compaction for these)."""


def as_call(events: list[Event]) -> list[Event]:
    """The records of one call of ``events`` (fold rule 8): a single event as it is;
    several, each with ``call_id`` set, then their :class:`CallCommitted`.

    Every event must be a :data:`MEMBER_TYPES` one of the same namespace, epoch and
    writer; ``ValueError`` otherwise.
    """
    if len(events) < 2:
        return list(events)
    first = events[0]
    for e in events:
        if not isinstance(e, MEMBER_TYPES):
            raise ValueError("a call of several records may hold only "
                             + ", ".join(t.TYPE for t in MEMBER_TYPES) + f", not {e.TYPE}")
        if (e.namespace, e.epoch, e.writer) != (first.namespace, first.epoch, first.writer):
            raise ValueError("the records of one call share namespace, epoch and writer")
    commit = CallCommitted(event_id=new_event_id(), namespace=first.namespace,
                           epoch=first.epoch, writer=first.writer, created_at=now_ms(),
                           size=len(events))
    return [replace(e, call_id=commit.event_id) for e in events] + [commit]  # type: ignore[call-arg]

NESTED_TYPES: dict[str, type] = {
    "InlineGraph": InlineGraph,
    "GraphRef": GraphRef,
    "CheckpointState": CheckpointState,
    "CompletedCheckpoint": CompletedCheckpoint,
    "VertexParallelism": VertexParallelism,
}
"""Records nested inside events (Avro name without namespace) -> dataclass."""
