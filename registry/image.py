"""The image: the registry's state as the fold left it, immutable, with provenance.

An :class:`Image` is never changed in place; :func:`registry.fold.replay` makes
a new one. The small value types are named tuples: immutable, and cheap to
build on the hot path of a replay. Large collections are persistent maps (``immutables.Map``) so a new
image shares everything the record did not touch.

Equality that compaction must preserve (README, "Compaction") is
:meth:`Image.answer`: the job set, the epoch, the leader, whether its term
is revoked, and the term's published leader information. Provenance, rejections and quarantine describe *this* log and
legitimately differ between a log and its compacted form.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import immutables

from .events import (
    EMPTY_CHECKPOINTS,
    CheckpointState,
    CompletedCheckpoint,
    GraphRef,
    InlineGraph,
    JobStatus,
)

__all__ = [
    "CheckpointRecords",
    "Decision",
    "Image",
    "JobView",
    "LeaderInfo",
    "LeaderView",
    "LogRecord",
    "Outcome",
    "Provenance",
    "TermInfo",
]


class LogRecord(NamedTuple):
    """One record as read from the topic (or from a model of it in tests).

    ``value`` is the encoded event (``None`` for a tombstone); ``timestamp`` is
    the broker's timestamp in ms (LogAppendTime on the topics we create).
    """

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    partition: int = 0


@dataclass(frozen=True, slots=True)
class Provenance:
    """Which log position an image reflects (as KRaft's ``MetadataProvenance``).

    ``log_time``: the newest record stamp folded (ms; ``None`` before any stamped record),
    never an earlier stamp that came later in the log."""

    namespace: str
    last_offset: int = -1
    epoch: int = 0
    log_time: int | None = None


class JobView(NamedTuple):
    """One job as the fold sees it.

    ``owner_epoch`` is the term holding the job's lock (``None`` once released,
    after a failed recovery, or terminal); ``error`` says why recovery
    failed (status ``RECOVERY_FAILED``). ``max_checkpoint_failures`` and
    ``retained_checkpoints`` come from the submit; ``checkpoints`` is the
    job's checkpoint state (fold rule 6).

    A terminal job is the job's *result* (Flink's ``JobResult``): its status,
    ``reason``, and while it is ``dirty`` (not yet cleaned up) the ``graph`` and
    ``checkpoints`` it ended with, which cleanup must delete. Once clean
    (:meth:`registry.client.Term.mark_clean`) the graph is ``None`` (it may be
    garbage-collected) and the checkpoints empty. ``ended_by`` is the event id of the
    record under the job's end key that ended it (``None`` while live, and for a job
    whose end was written under its job key by a jobreg before ends had keys of their
    own: the leader restates such an end under an end key, fold rule 5). ``born_by`` is the
    event id of the record under the job's birth key that brought it into existence (its
    submit, or a reassertion restating its birth; ``None`` for a job born under its job key
    by a jobreg before submits had keys of their own: the leader restates such a live job's
    birth under a birth key, fold rule 5).
    """

    job_id: str
    status: str
    owner_epoch: int | None
    graph: InlineGraph | GraphRef | None
    error: str | None = None
    max_checkpoint_failures: int = 0
    retained_checkpoints: int = 1
    checkpoints: CheckpointState = EMPTY_CHECKPOINTS
    reason: str | None = None
    dirty: bool = False
    ended_by: str | None = None
    born_by: str | None = None

    @property
    def live(self) -> bool:
        """True unless the job is terminal (cancelled, finished or failed)."""
        return self.status not in JobStatus.TERMINAL

    @property
    def latest_checkpoints(self) -> tuple[CompletedCheckpoint, ...]:
        """The retained completed checkpoints, oldest first (what recovery restores)."""
        return self.checkpoints.retained

    @property
    def over_budget(self) -> bool:
        """True once consecutive failed checkpoints exceed the job's tolerable number."""
        return self.checkpoints.consecutive_failures > self.max_checkpoint_failures


class CheckpointRecords(NamedTuple):
    """The checkpoint records of one job under keys of their own
    (:func:`registry.keys.checkpoint_key`) that the log still holds, for fold rule 6's
    collection (:func:`registry.fold.plan_collection`).

    ``holder``: the key of the record whose carried state (``state``) the job's checkpoint
    state is (``None``: no record's); the state is due to be restated under a new key when
    the job's differs from it. ``keys``: every such key the fold saw and no tombstone
    removed since, in log order, each with whether its record's state was the job's when it
    landed (``True``: superseded since, unless it is the holder; ``False``: refused, a
    duplicate or junk: a record no state stands on)."""

    holder: str | None = None
    state: CheckpointState | None = None
    keys: tuple[tuple[str, bool], ...] = ()


class TermInfo(NamedTuple):
    """One leadership term: who got it, where it began, where it was revoked (if so), its
    lease (``None``: no lease, an external election) and its lease renewals: how many were
    accepted, the offset of the newest, ``renewal`` the highest ordinal among them (fold
    rule 3: a grant that saw a lower one is refused, ``renewed_since``; renewals written
    before ordinals do not raise it), and ``refused_grants`` how many grant attempts were
    refused while the term was current (its renewer keys the renewals it plans after them
    apart, :func:`registry.keys.lease_key`)."""

    epoch: int
    leader: str
    granted_offset: int
    revoked_offset: int | None = None
    lease_ms: int | None = None
    renewals: int = 0
    last_renewal_offset: int | None = None
    renewal: int = 0
    refused_grants: int = 0


class LeaderView(NamedTuple):
    """The current leader: ``epoch`` and ``contender`` name."""

    epoch: int
    contender: str


class LeaderInfo(NamedTuple):
    """The leader information of one component as the current term published it (fold rule
    9): the leader's ``session`` id and its ``address``."""

    session: str
    address: str


class Outcome:
    """What the fold did with a record."""

    ACCEPTED = "ACCEPTED"
    IGNORED = "IGNORED"  # valid and kept, but without effect (a late checkpoint failure)
    REJECTED = "REJECTED"
    DUPLICATE = "DUPLICATE"
    QUARANTINED = "QUARANTINED"
    COLLECTED = "COLLECTED"  # the leader's tombstone of a checkpoint record no state needs
    SKIPPED = "SKIPPED"  # another namespace's record on the same partition
    PENDING = "PENDING"  # a record of a multi-record call, decided at the call's commit


class Decision(NamedTuple):
    """The fold's verdict on one record.

    ``reason`` is a stable code (``stale_epoch``, ``cas_failed``,
    ``terminal_job``, ...; see :mod:`registry.rules`), ``detail`` says it for
    people. For fencing rejections ``expected_epoch`` is the epoch the fold
    holds, ``actual_epoch`` the record's, and ``leader`` the current leader.
    """

    offset: int
    outcome: str
    timestamp: int | None = None
    key: str | None = None
    event_type: str | None = None
    event_id: str | None = None
    job_id: str | None = None
    epoch: int | None = None
    writer: str | None = None
    reason: str | None = None
    detail: str = ""
    expected_epoch: int | None = None
    actual_epoch: int | None = None
    leader: str | None = None

    @property
    def accepted(self) -> bool:
        """True if the record passed every rule (outcome ACCEPTED or IGNORED)."""
        return self.outcome in (Outcome.ACCEPTED, Outcome.IGNORED)

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (stable field names, for JSON output)."""
        return self._asdict()


_EMPTY_MAP: immutables.Map[Any, Any] = immutables.Map()


@dataclass(frozen=True, slots=True)
class Image:
    """The registry's state after folding a log prefix.

    Build the empty image of a namespace with :meth:`empty`; change it only
    with :func:`registry.fold.replay` / :func:`registry.fold.fold`.

    * ``epoch``/``leader``/``revoked``: the current term (epoch 0: never led).
    * ``jobs``: job id -> :class:`JobView`, terminal jobs included (a terminal
      id is remembered for ever so it can never be submitted again).
    * ``term``: the current term's :class:`TermInfo` (``None``: never led).
      Earlier terms are history: :meth:`registry.forensics.Forensics.terms`.
    * ``rejected`` / ``ignored`` / ``quarantined``: the newest refused records,
      records that were valid but had no effect (with why), and undecodable
      ones, at most :data:`registry.rules.HISTORY_KEPT` of each; forensics
      replays the log for all of them.
    * ``unsettled``: job-record keys (and keys of the current term's leader
      information) whose newest record was not accepted, and
      so must be reasserted by the leader before the cleaner could see them
      (key -> offset of that record).
    * ``recent_ids``: the event ids folded in the current and the previous
      duplicate window (window number -> ``"<event id>\\x00<key>"`` -> the CRC-32 of
      the bytes of the first record of that id under that key; fold rule 1): a copy
      (the same id, key and bytes) has no second effect; any other record is decided
      by the rules (one of a seen id and key with other bytes is junk to that key).
    * ``calls``: the records of multi-record calls whose commit has not been
      folded yet (call id -> the records, in log order; fold rule 8).
    * ``leaders``: component -> :class:`LeaderInfo`, the leader information the current
      term published (fold rule 9; empty after a grant or a revoke). Read-only.
    """

    provenance: Provenance
    epoch: int = 0
    leader: str | None = None
    revoked: bool = False
    jobs: immutables.Map[str, JobView] = field(default=_EMPTY_MAP)
    term: TermInfo | None = None
    rejected: tuple[Decision, ...] = ()
    ignored: tuple[Decision, ...] = ()
    quarantined: tuple[Decision, ...] = ()
    unsettled: immutables.Map[str, int] = field(default=_EMPTY_MAP)
    recent_ids: immutables.Map[int, immutables.Map[str, int]] = field(default=_EMPTY_MAP)
    duplicates: int = 0
    calls: immutables.Map[str, tuple[LogRecord, ...]] = field(default=_EMPTY_MAP)
    leaders: immutables.Map[str, LeaderInfo] = field(default=_EMPTY_MAP)
    ends_keyed: bool = False
    """A grant written by a jobreg whose ends have keys of their own was accepted (fold rule
    5): from then on a cleanup written before (schema version 1) never stands for an end the
    cleaner removed."""
    births_keyed: bool = False
    """A grant of layout 1 (submits under keys of their own) was accepted (fold rule 5):
    from then on a submit or an end under the job's key is refused (``wrong_key``), and only
    a birth or an end key brings a job into existence."""
    checkpoints_keyed: bool = False
    """A grant of layout 2 (checkpoint records under keys of their own) was accepted (fold
    rule 6): from then on a checkpoint record under the job's one checkpoints key is refused
    (``wrong_key``), and a job's checkpoint state stands only on those keys."""
    checkpoint_records: immutables.Map[str, CheckpointRecords] = field(default=_EMPTY_MAP)
    """Job id -> its :class:`CheckpointRecords` (fold rule 6)."""
    checkpoint_floors: immutables.Map[str, int] = field(default=_EMPTY_MAP)
    """Job id -> the highest checkpoint ``seq`` a record of the job carried that the fold did
    not take (refused, ignored, a duplicate, or accepted and to be restated), while it is
    above the job's own (fold rule 6): after the cleaner such a record can be read as
    carrying the state (rule 6's jump), so the leader's restatement carries a ``seq`` at
    least this high, and a restatement with a lower one is stale."""
    call_members: immutables.Map[str, str] = field(default=_EMPTY_MAP)
    """The key of a call's member (a birth or a lock key) that the call's accepted commit
    made hold a part of a job, while it is that key's newest record -> the commit's key
    (fold rule 8): a record over the commit that is not the commit (junk, a tombstone, a
    misplaced event) leaves the member waiting in a log cleaned past it, so the part it
    holds is due, as if that record had landed on the member's own key."""

    @classmethod
    def empty(cls, namespace: str) -> Image:
        """The image of a namespace before any record (KRaft's ``EMPTY``)."""
        return cls(provenance=Provenance(namespace))

    @property
    def namespace(self) -> str:
        """The namespace this image folds."""
        return self.provenance.namespace

    @property
    def active_leader(self) -> LeaderView | None:
        """The leader whose term is current and not revoked, or ``None``."""
        if self.leader is None or self.revoked:
            return None
        return LeaderView(self.epoch, self.leader)

    def live_jobs(self) -> dict[str, JobView]:
        """Job id -> view, for the jobs that are not terminal."""
        return {k: v for k, v in self.jobs.items() if v.live}

    def results(self, *, dirty: bool | None = None) -> dict[str, JobView]:
        """Job id -> view, for the terminal jobs (their results); only the dirty ones (not
        yet cleaned up) with ``dirty=True``, only the clean ones with ``dirty=False``; in
        job id order."""
        return {k: v for k, v in sorted(self.jobs.items())
                if not v.live and (dirty is None or v.dirty == dirty)}

    def referenced_blobs(self) -> set[str]:
        """The uris of the blob-store graphs jobs reference: every live job's, and every
        dirty result's (its cleanup still needs it). Blob collection keeps these."""
        return {v.graph.uri for v in self.jobs.values() if isinstance(v.graph, GraphRef)}

    def answer(self) -> tuple[Any, ...]:
        """What compaction must not change: (jobs, epoch, leader, revoked, leaders)."""
        return (dict(self.jobs.items()), self.epoch, self.leader, self.revoked,
                dict(self.leaders.items()))

    def with_provenance(self, **changes: Any) -> Image:
        """A copy with provenance fields replaced (used by snapshots)."""
        return replace(self, provenance=replace(self.provenance, **changes))
