"""The fold: the only code that turns log records into registry state.

``replay(image, record) -> image`` is pure and total: it never raises because
of what a record contains. Records that cannot be decoded (or have an unknown
type) are quarantined; records that break a rule are rejected with a reason;
both are kept in the image. Everything that shows state calls this module.

Rules, in the order the fold applies them to one record of this namespace:

0. Records whose key names another namespace are skipped (namespaces share
   partitions). A record without a value (tombstone) or that does not decode
   is quarantined.
1. A duplicate ``event_id`` has no second effect (outcome ``DUPLICATE``).
2. The event must name this namespace and sit under the key its type
   belongs to (``namespace_mismatch``, ``wrong_key``).
3. ``LeadershipGranted`` is a compare-and-set: accepted iff ``prev_epoch`` is
   the current epoch (``cas_failed``) and it claims ``prev_epoch + 1``
   (``bad_epoch``).
4. Every other event is accepted only from the current term: ``no_leader``,
   ``stale_epoch``, ``future_epoch``, ``not_leader`` (right epoch, wrong
   writer), ``term_revoked``. Fencing rejections carry the expected
   (current) and actual (record) epoch and the current leader.
5. Jobs: a new id may be submitted; a known id may not (``job_exists``), a
   terminal one never again (``terminal_job``). Cancel and terminate make a
   job terminal for ever, whether or not its submit is still in the log
   (compaction may have removed it). Adopt sets the owner to the current
   term, release clears it; neither applies to unknown (``unknown_job``) or
   terminal jobs.
   A reassertion sets the job's whole state, except that it can never make a
   terminal job live again. A failed recovery marks a live job
   ``RECOVERY_FAILED`` (no owner, the error kept); only an adopt (a retry)
   or a cancel moves it on; it cannot be released.
6. Checkpoints (Flink's ``CheckpointFailureManager``; :func:`checkpoint_step`):
   ids of triggers increase per job; a failure of a checkpoint that was
   discarded, completed, or is not newer than the last completed one, or
   that was already counted, is ignored (outcome ``IGNORED``, with why);
   other failures count once each; a completion resets the count and keeps
   the newest ``retained_checkpoints``. Each record carries the job's
   checkpoint state after it and its sequence number ``seq``: the fold
   computes the state itself and refuses a record whose state differs
   (``checkpoint_state_mismatch``) or whose ``seq`` is not the next one
   (``stale_checkpoint_seq``), unless ``seq`` jumps ahead, which only
   compaction causes (the earlier records of the key are gone): then the
   carried state is the state.
7. ``LeaseRenewed`` is fenced like any write and counts in the term's
   ``TermInfo``; no clock is read by the fold.

After each record the fold notes whether the newest record of a known job's
key was accepted; keys where it was not are ``unsettled`` until the leader
reasserts them (:func:`plan_reassertions`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator

from .codec import Codec, default_codec
from .errors import CodecError
from .events import (
    CheckpointCompleted,
    CheckpointDiscarded,
    CheckpointEvent,
    CheckpointFailed,
    CheckpointState,
    CheckpointTriggered,
    CompletedCheckpoint,
    Event,
    JobAdopted,
    JobCancelled,
    JobEvent,
    JobLockReleased,
    JobReasserted,
    JobRecoveryFailed,
    JobStatus,
    JobSubmitted,
    JobTerminated,
    LeadershipGranted,
    LeadershipRevoked,
    LeaseRenewed,
    new_event_id,
    now_ms,
)
from .image import Decision, Image, JobView, LogRecord, Outcome, Provenance, TermInfo
from .keys import allowed_keys, parse_key, record_key

__all__ = [
    "CheckpointRuleViolation",
    "Delta",
    "bulk",
    "checkpoint_step",
    "fencing_detail",
    "fencing_reason",
    "fold",
    "fold_batches",
    "plan_reassertions",
    "replay",
]


class _Verdict(Exception):
    """Internal: a rejection raised inside a rule and turned into a Decision."""

    def __init__(self, reason: str, detail: str, expected: int | None = None,
                 actual: int | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.expected = expected
        self.actual = actual


def fencing_reason(epoch: int, leader: str | None, revoked: bool, writer_epoch: int,
                   writer: str) -> str | None:
    """Rule 4: why a write of ``writer`` with ``writer_epoch`` is fenced, or ``None`` if it is not.

    The one statement of the fencing rule; the client asks it too when the
    broker fenced its producer before its record reached the log.
    """
    if leader is None:
        return "no_leader"
    if writer_epoch < epoch:
        return "stale_epoch"
    if writer_epoch > epoch:
        return "future_epoch"
    if writer != leader:
        return "not_leader"
    if revoked:
        return "term_revoked"
    return None


def fencing_detail(reason: str, epoch: int, leader: str | None, writer_epoch: int,
                   writer: str) -> str:
    """The sentence for people that goes with a fencing ``reason`` (both epochs, the leader)."""
    head = f"expected epoch {epoch}, actual {writer_epoch}: "
    return head + {
        "no_leader": f"no term has been granted; {writer!r} cannot write",
        "stale_epoch": f"{writer!r} writes for an old term; the leader is {leader!r}",
        "future_epoch": f"no grant for epoch {writer_epoch} was accepted",
        "not_leader": f"epoch {epoch} belongs to {leader!r}, not {writer!r}",
        "term_revoked": f"term {epoch} of {leader!r} was revoked; no write of it is accepted",
    }[reason]


class CheckpointRuleViolation(Exception):
    """A checkpoint event that breaks rule 6 outright (the fold refuses it)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def checkpoint_step(state: CheckpointState, kind: type[CheckpointEvent], checkpoint_id: int,
                    *, location: str = "", retained: int = 1) -> tuple[CheckpointState, str | None]:
    """Rule 6: the checkpoint state after one event, and why it was ignored (``None``: it counted).

    Pure; the fold applies it, and the client calls it to compute the state
    its records carry. Raises :class:`CheckpointRuleViolation` for an event
    the fold refuses.
    """
    cp = checkpoint_id
    last = state.last_completed
    pending, discarded, counted = set(state.pending), set(state.discarded), set(state.counted)
    seq = state.seq + 1
    if kind is CheckpointTriggered:
        newest = max([last, *pending, *discarded, *counted])
        if cp <= newest:
            raise CheckpointRuleViolation(
                "checkpoint_id_not_increasing",
                f"checkpoint {cp} triggered after checkpoint {newest}; ids increase per job")
        pending.add(cp)
        why = None
    elif cp <= last:
        why = f"checkpoint {cp} is not newer than the last completed checkpoint {last}"
    elif cp in discarded and kind is not CheckpointDiscarded:
        why = f"checkpoint {cp} was discarded"
    elif kind is CheckpointCompleted:
        retained_cps = (*state.retained, CompletedCheckpoint(cp, location))
        return CheckpointState(
            seq, cp, retained_cps[-max(retained, 1):], tuple(sorted(p for p in pending if p > cp)),
            tuple(sorted(d for d in discarded if d > cp)), ()), None
    elif kind is CheckpointFailed:
        if cp in counted:
            why = f"a failure of checkpoint {cp} was already counted"
        else:
            counted.add(cp)
            pending.discard(cp)
            why = None
    else:  # CheckpointDiscarded
        if cp in discarded:
            why = f"checkpoint {cp} was already discarded"
        else:
            discarded.add(cp)
            pending.discard(cp)
            why = None
    return CheckpointState(seq, last, state.retained, tuple(sorted(pending)),
                           tuple(sorted(discarded)), tuple(sorted(counted))), why


class Delta:
    """Accumulates the effect of records on an image (KRaft's ``MetadataDelta``).

    ``Delta(image).replay(r1) ... .apply()`` gives the same image as replaying
    the records one by one; it exists so a batch costs one copy of each
    touched collection instead of one per record.
    """

    def __init__(self, image: Image, codec: Codec | None = None) -> None:
        self._base = image
        self._codec = codec or default_codec()
        self._ns = image.provenance.namespace
        self._prefix = self._ns + "/"
        self.epoch = image.epoch
        self.leader = image.leader
        self.revoked = image.revoked
        self._jobs = image.jobs.mutate()
        self._terms = image.terms.mutate()
        self._unsettled = image.unsettled.mutate()
        self._seen = image.seen.mutate()
        self._rejected: list[Decision] = []
        self._ignored: list[Decision] = []
        self._quarantined: list[Decision] = []
        self._duplicates = image.duplicates
        self._last_offset = image.provenance.last_offset
        self._log_time = image.provenance.log_time
        self.last_event: Event | None = None

    # -- the one entry point -------------------------------------------------

    def replay(self, record: LogRecord) -> Decision:
        """Fold one record; return the verdict. Never raises for record content.

        :attr:`last_event` is then the record's decoded event (``None`` if it did
        not decode), for consumers that need more of it than the verdict says.
        """
        self.last_event = None
        self._last_offset = record.offset
        if record.timestamp is not None:
            self._log_time = record.timestamp
        key: str | None = None
        if record.key is not None:
            try:
                key = record.key.decode("utf-8")
            except UnicodeDecodeError:
                key = None
        parsed = parse_key(key) if key is not None else None
        if parsed is not None and parsed.namespace != self._ns:
            return Decision(record.offset, Outcome.SKIPPED, record.timestamp, key)
        if record.value is None:
            return self._quarantine(record, key, "tombstone",
                                    "a record without a value (tombstone): jobreg never writes one")
        try:
            event = self._codec.decode(record.value)
        except CodecError as e:
            return self._quarantine(record, key, "undecodable", str(e))
        if parsed is None and event.namespace != self._ns:
            return Decision(record.offset, Outcome.SKIPPED, record.timestamp, key)
        self.last_event = event
        decision = self._decide(record, key, event)
        if parsed is not None and parsed.job_id is not None:
            self._note_settlement(key, parsed.job_id, decision)
        return decision

    def job(self, job_id: str) -> JobView | None:
        """The job as the records replayed so far leave it (``None``: unknown); for
        consumers that record the state after each record, such as the audit stream."""
        return self._jobs.get(job_id)

    def term(self, epoch: int) -> TermInfo | None:
        """The term ``epoch`` as the records replayed so far leave it (``None``: unknown)."""
        return self._terms.get(epoch)

    def apply(self) -> Image:
        """The image with every replayed record applied."""
        base = self._base
        return Image(
            provenance=Provenance(self._ns, self._last_offset, self.epoch, self._log_time),
            epoch=self.epoch,
            leader=self.leader,
            revoked=self.revoked,
            jobs=self._jobs.finish(),
            terms=self._terms.finish(),
            rejected=base.rejected + tuple(self._rejected) if self._rejected else base.rejected,
            ignored=base.ignored + tuple(self._ignored) if self._ignored else base.ignored,
            quarantined=(base.quarantined + tuple(self._quarantined)
                         if self._quarantined else base.quarantined),
            unsettled=self._unsettled.finish(),
            seen=self._seen.finish(),
            duplicates=self._duplicates,
        )

    # -- internals -----------------------------------------------------------

    def _quarantine(self, record: LogRecord, key: str | None, reason: str, detail: str) -> Decision:
        d = Decision(record.offset, Outcome.QUARANTINED, record.timestamp, key,
                     reason=reason, detail=detail)
        self._quarantined.append(d)
        parsed = parse_key(key) if key is not None else None
        if parsed is not None and parsed.job_id is not None and key is not None:
            self._note_settlement(key, parsed.job_id, d)
        return d

    def _note_settlement(self, key: str, job_id: str, decision: Decision) -> None:
        # ``key`` is a job key of this namespace (``parse_key`` said so).
        if decision.outcome == Outcome.ACCEPTED:
            if key in self._unsettled:
                del self._unsettled[key]
        elif job_id in self._jobs:
            self._unsettled[key] = decision.offset

    def _decide(self, record: LogRecord, key: str | None, event: Event) -> Decision:
        # Decisions are built positionally: this is the hot path of every replay.
        job_id = getattr(event, "job_id", None)
        if event.event_id in self._seen:
            self._duplicates += 1
            return Decision(record.offset, Outcome.DUPLICATE, record.timestamp, key, event.TYPE,
                            event.event_id, job_id, event.epoch, event.writer, "duplicate",
                            f"event {event.event_id} was already folded; no second effect")
        self._seen[event.event_id] = None
        try:
            if event.namespace != self._ns:
                raise _Verdict("namespace_mismatch",
                               f"event names namespace {event.namespace!r}, its key {key!r}")
            if key != record_key(event) and key not in allowed_keys(event):
                raise _Verdict("wrong_key", f"a {event.TYPE} must be keyed "
                               f"{' or '.join(allowed_keys(event))}, not {key!r}")
            if isinstance(event, LeadershipGranted):
                self._grant(event, record.offset)
                ignored = None
            else:
                self._fence(event)
                ignored = self._apply(event, record.offset)
        except _Verdict as v:
            d = Decision(record.offset, Outcome.REJECTED, record.timestamp, key, event.TYPE,
                         event.event_id, job_id, event.epoch, event.writer, v.reason, v.detail,
                         v.expected, v.actual, self.leader)
            self._rejected.append(d)
            return d
        if ignored is not None:
            d = Decision(record.offset, Outcome.IGNORED, record.timestamp, key, event.TYPE,
                         event.event_id, job_id, event.epoch, event.writer, "ignored", ignored,
                         None, None, self.leader)
            self._ignored.append(d)
            return d
        return Decision(record.offset, Outcome.ACCEPTED, record.timestamp, key, event.TYPE,
                        event.event_id, job_id, event.epoch, event.writer, None, "", None, None,
                        self.leader)

    def _grant(self, e: LeadershipGranted, offset: int) -> None:
        if e.prev_epoch != self.epoch:
            raise _Verdict("cas_failed",
                           f"grant to {e.writer!r} expected epoch {e.prev_epoch} to be current, "
                           f"but epoch {self.epoch} is (leader {self.leader!r})",
                           expected=self.epoch, actual=e.prev_epoch)
        if e.epoch != e.prev_epoch + 1:
            raise _Verdict("bad_epoch", f"a grant after epoch {e.prev_epoch} must claim epoch "
                           f"{e.prev_epoch + 1}, not {e.epoch}",
                           expected=e.prev_epoch + 1, actual=e.epoch)
        self.epoch, self.leader, self.revoked = e.epoch, e.writer, False
        self._terms[e.epoch] = TermInfo(e.epoch, e.writer, offset, lease_ms=e.lease_ms)

    def _fence(self, e: Event) -> None:
        reason = fencing_reason(self.epoch, self.leader, self.revoked, e.epoch, e.writer)
        if reason is not None:
            raise _Verdict(reason, fencing_detail(reason, self.epoch, self.leader, e.epoch,
                                                  e.writer), expected=self.epoch, actual=e.epoch)

    def _apply(self, e: Event, offset: int) -> str | None:
        """Apply a fenced event; return why it was ignored, if it was."""
        if isinstance(e, LeadershipRevoked):
            self.revoked = True
            info = self._terms.get(self.epoch)
            if info is not None:
                self._terms[self.epoch] = info._replace(revoked_offset=offset)
            return None
        if isinstance(e, LeaseRenewed):
            info = self._terms.get(self.epoch)
            if info is not None:
                self._terms[self.epoch] = info._replace(renewals=info.renewals + 1,
                                                        last_renewal_offset=offset)
            return None
        assert isinstance(e, JobEvent)
        job: JobView | None = self._jobs.get(e.job_id)
        if isinstance(e, JobSubmitted):
            if job is not None:
                if not job.live:
                    raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}; a "
                                   "terminal id can never be submitted again")
                raise _Verdict("job_exists", f"job {e.job_id!r} already exists")
            self._jobs[e.job_id] = JobView(e.job_id, JobStatus.ACTIVE, e.epoch, e.graph, None,
                                           e.max_checkpoint_failures, e.retained_checkpoints)
        elif isinstance(e, (JobCancelled, JobTerminated)):
            status = JobStatus.CANCELLED if isinstance(e, JobCancelled) else e.state
            if status not in JobStatus.TERMINAL:
                raise _Verdict("bad_state", f"a job can terminate as FINISHED or FAILED, "
                               f"not {status!r}")
            if job is not None and not job.live:
                raise _Verdict("terminal_job", f"job {e.job_id!r} is already {job.status}")
            self._jobs[e.job_id] = JobView(e.job_id, status, None, None)
        elif isinstance(e, JobReasserted):
            if e.status not in JobStatus.ALL:
                raise _Verdict("bad_state", f"unknown job status {e.status!r}")
            if job is not None and not job.live and e.status not in JobStatus.TERMINAL:
                raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}; a "
                               "reassertion cannot make it live again")
            if e.status in JobStatus.TERMINAL:
                self._jobs[e.job_id] = JobView(e.job_id, e.status, None, None)
            else:
                self._jobs[e.job_id] = JobView(e.job_id, e.status, e.owner_epoch, e.graph,
                                               e.error, e.max_checkpoint_failures,
                                               e.retained_checkpoints, e.checkpoints)
        else:
            if job is None:
                raise _Verdict("unknown_job", f"job {e.job_id!r} was never submitted")
            if not job.live:
                raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}")
            if isinstance(e, CheckpointEvent):
                return self._checkpoint(job, e)
            # The lock records (adopt, release, recovery failed) each set the whole lock
            # aspect of the job, and none checks who holds the lock now: fencing
            # already limits them to the current leader, and a precondition on the
            # lock key's earlier records would flip once the cleaner removed them.
            if isinstance(e, JobAdopted):
                self._jobs[e.job_id] = job._replace(status=JobStatus.ACTIVE, owner_epoch=e.epoch,
                                                    error=None)
            elif isinstance(e, JobRecoveryFailed):
                self._jobs[e.job_id] = job._replace(status=JobStatus.RECOVERY_FAILED,
                                                    owner_epoch=None, error=e.error)
            else:
                assert isinstance(e, JobLockReleased)
                if job.status == JobStatus.RECOVERY_FAILED:
                    raise _Verdict("recovery_failed", f"job {e.job_id!r} failed recovery and "
                                   "is held by no term; retry or cancel it")
                self._jobs[e.job_id] = job._replace(owner_epoch=None)
        return None

    def _checkpoint(self, job: JobView, e: CheckpointEvent) -> str | None:
        cur = job.checkpoints
        seq = e.state.seq
        if seq > cur.seq + 1:
            # The key's earlier records were compacted away: the record carries the state.
            self._jobs[e.job_id] = job._replace(checkpoints=e.state)
            return None
        if seq <= cur.seq:
            raise _Verdict("stale_checkpoint_seq", f"checkpoint record {seq} of job "
                           f"{e.job_id!r} follows record {cur.seq}; expected {cur.seq + 1}")
        try:
            new, why = checkpoint_step(cur, type(e), e.checkpoint_id,
                                       location=getattr(e, "location", ""),
                                       retained=job.retained_checkpoints)
        except CheckpointRuleViolation as v:
            raise _Verdict(v.reason, v.detail) from None
        if new != e.state:
            raise _Verdict("checkpoint_state_mismatch", f"the record carries checkpoint state "
                           f"{e.state}, the fold computes {new}")
        self._jobs[e.job_id] = job._replace(checkpoints=new)
        return why


def replay(image: Image, record: LogRecord, codec: Codec | None = None) -> Image:
    """The image after one more record. Pure and total."""
    delta = Delta(image, codec)
    delta.replay(record)
    return delta.apply()


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """Suspend the cyclic garbage collector around a long replay (re-entrant).

    Wrap a whole catch-up in it, not each batch: between batches a full
    collection would walk the ever larger image again.
    """
    # The fold allocates only immutable, acyclic objects (named tuples,
    # persistent maps, frozen events), so the cyclic collector can find
    # nothing to free in them; during a long replay it would only walk the
    # ever larger image again and again (measured: ~40% of replay time).
    # Reference counting still frees everything.
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def fold(records: Iterable[LogRecord], image: Image | str, codec: Codec | None = None) -> Image:
    """Fold ``records`` (in log order) onto ``image`` (or onto the empty image of a namespace)."""
    if isinstance(image, str):
        image = Image.empty(image)
    delta = Delta(image, codec)
    with bulk():
        for record in records:
            delta.replay(record)
    return delta.apply()


def fold_batches(batches: Iterable[list[LogRecord]], image: Image, codec: Codec | None = None,
                 on_decision: Callable[[Decision], None] | None = None) -> Image:
    """Fold batches of records as they arrive (e.g. from a reader); one image per batch.

    ``on_decision`` sees the fold's verdict on every record, in order (the
    client uses it to learn the fate of its own writes, forensics to build
    timelines). Returns the image after the last batch.
    """
    with bulk():
        for batch in batches:
            delta = Delta(image, codec)
            if on_decision is None:
                for record in batch:
                    delta.replay(record)
            else:
                for record in batch:
                    on_decision(delta.replay(record))
            image = delta.apply()
    return image


def plan_reassertions(image: Image, epoch: int, writer: str) -> list[tuple[str, JobReasserted]]:
    """The (key, event) pairs the leader of ``epoch`` must write to settle the log.

    One :class:`JobReasserted` per unsettled key of a known job, carrying the
    job's whole accepted state, written on that same key so that it becomes
    the key's newest record again. Pure: the client and the model-based
    tests both call it.
    """
    out: list[tuple[str, JobReasserted]] = []
    ns = image.namespace
    for key in sorted(image.unsettled.keys()):
        parsed = parse_key(key)
        if parsed is None or parsed.job_id is None:
            continue
        job = image.jobs.get(parsed.job_id)
        if job is None:
            continue
        out.append((key, JobReasserted(
            event_id=new_event_id(), namespace=ns, epoch=epoch, writer=writer,
            created_at=now_ms(), job_id=job.job_id, status=job.status,
            owner_epoch=job.owner_epoch, graph=job.graph, error=job.error,
            max_checkpoint_failures=job.max_checkpoint_failures,
            retained_checkpoints=job.retained_checkpoints, checkpoints=job.checkpoints,
        )))
    return out
