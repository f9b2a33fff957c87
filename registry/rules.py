"""The fold's rules: the only code that turns log records into registry state.

Pure: no I/O, no Avro, no clock. :class:`Delta` is handed a decoder (a record's value ->
its event); :mod:`registry.fold` binds the codec's and is what callers use.
``registry.fold.replay(image, record) -> image`` is pure and total: it never raises because
of what a record contains. Records that cannot be decoded (or have an unknown
type) are quarantined; records that break a rule are rejected with a reason;
the image keeps the newest of both (:data:`HISTORY_KEPT`), forensics all.
Everything that shows state calls this module.

Rules, in the order the fold applies them to one record of this namespace:

0. Records whose key names another namespace are skipped (namespaces share
   partitions). A record without a value (tombstone) or that does not decode
   is quarantined (but a tombstone under a checkpoint record's key: rule 6).
1. A copy of a record that was not refused (its ``event_id`` under its key, with the same
   bytes) has no second effect (outcome ``DUPLICATE``). A copy of a refused record is
   decided by the rules at its own position, as every log the cleaner passed decides it
   (the copy supersedes the first under their key): refused again, or accepted where the
   log changed since (the fourteenth adversarial read's F3; a call's member refused at its
   commit or at the next grant is forgotten then). Any other record is decided by the
   rules below, whatever records of its id lie under other keys (the cleaner may remove
   those); one
   with the id and key of an earlier record but other bytes is junk to that key's
   bookkeeping (rules 5, 6, 8), whatever its verdict: it supersedes that record without
   being it. So is a verbatim copy under a key that holds one record (a birth, an end, a
   checkpoint record, a commit): the cleaner keeps the later copy, which moves the fact
   past the records that rest on it, so the part is due, restated under a new key.
   The fold does not remember every id ever folded: broker time is cut into
   windows of :data:`DUPLICATE_WINDOW_MS` (window ``timestamp // W``), and
   it remembers the ids folded in the newest window any record reached and
   in the one before (an id folded in an earlier window than the newest is
   remembered in the newest). It assumes every copy of an event lands
   within one window of the first (a client re-sends only within one call,
   and gives up re-sending half a window after its first send; the
   idempotent producer's own retries never reach the log twice). Records
   without a broker timestamp (models) never open a window.
2. The event must name this namespace and sit under the key its type
   belongs to (``namespace_mismatch``, ``wrong_key``).
3. ``LeadershipGranted`` is a compare-and-set: accepted iff ``prev_epoch`` is
   the current epoch (``cas_failed``) and it claims ``prev_epoch + 1``
   (``bad_epoch``), and, if it says what it saw of the current term
   (``saw_renewal``, the highest renewal ordinal its contender had folded), iff no
   renewal of the current term with a higher ordinal was accepted before it
   (``renewed_since``; expected: the fold's highest ordinal, actual: ``saw_renewal``):
   a contender that read before the leader renewed loses. ``saw_renewal`` ``None``
   (an external election's claim) compares epochs only. A refused grant counts in the
   current term's ``TermInfo.refused_grants``; the term's renewer keys the renewals it
   plans after folding one apart (:func:`~registry.keys.lease_key`), so the cleaner never
   removes the renewal a grant's verdict rests on.
4. Every other event is accepted only from the current term: ``no_leader``,
   ``stale_epoch``, ``future_epoch``, ``not_leader`` (right epoch, wrong
   writer), ``term_revoked``. Fencing rejections carry the expected
   (current) and actual (record) epoch and the current leader.
5. Jobs: a new id may be submitted; a known id may not (``job_exists``), a
   terminal one never again (``terminal_job``). A submit (a job's birth) is written under a
   key of its own (``<ns>/job/<id>/birth/<event_id>``), which no later record supersedes, so
   whether a job exists is a fact the cleaner never removes, and ``job_exists`` and every
   ``unknown_job`` are the same in a compacted log. Once a grant of layout 1
   (:data:`BIRTHS_KEYED_LAYOUT`) is accepted, a submit or an end under the job's key (where a
   jobreg before wrote them) is refused ``wrong_key`` after fencing, and only a record under
   a birth key (a live job) or an end key (an ended one) brings a job into existence; a live
   job born under its job key before (``born_by`` ``None``) is due to have its birth restated
   under a birth key (``unsettled`` holds ``<ns>/job/<id>/birth/``), as is one whose birth
   key a record that is not its birth superseded. A refused submit of a live job under its own
   birth key (not a copy of the birth itself) is removed by the leader (an ABSENT reassertion
   there naming ``job_exists``, which removes that record and never the job: where the record
   reads as the birth, the birth is due again), so that a record superseding the birth it
   rests on never lets it read as the birth once the cleaner ran. Cancel and terminate make a
   job terminal for ever, whether or not its submit is still in the log
   (compaction may have removed it), and make its result (Flink's job
   result store): dirty, holding the graph and checkpoint state the job
   ended with, which cleanup must delete. An end is written under a key of its own
   (``<ns>/job/<id>/end/<event_id>``), which no later record can supersede, so whether a
   job ended is a fact the cleaner never removes, and every verdict that rests on it
   (``terminal_job``, ``job_live``) is the same in a compacted log; such a record carries no
   copy of the graph or checkpoints (the fold keeps its own; for a job it does not know,
   none). An end written under the job's key (by a jobreg before ends had keys of their
   own) carries a copy of them; the fold takes its own when it knows the job and the
   record's when it does not (the cleaner removed the submit, as it does once a cancel
   follows it on the job's key). A record whose copy differs from the
   fold's (a raw write, or a copy taken before a concurrent write) is
   accepted, and its key is unsettled until the leader restates the result; and its
   end is due to be restated under an end key (the leader does it, with a reassertion
   there; until then ``unsettled`` holds ``<ns>/job/<id>/end/``). An end under an end key
   for a job whose end is due (not under an end key, or junk over the one that held it) is
   accepted if it states that end, and changes nothing: it never settles the end, only the
   leader's restatement does (a late first copy of the end read as the end would leave the
   records refused against it unrestated); another
   is refused ``terminal_job`` and its key is unsettled until the leader
   removes it (an ABSENT reassertion there removes the record it supersedes, never the end
   the key holds). A restatement under its own birth key of a job the fold knows restates
   the birth alone (graph and limits) and holds the birth from then on; none makes a clean
   result dirty (a restatement is re-sent as a fresh event, and the later copy must not undo
   what the term wrote since), and one that a clean result made so does not hold the end. A
   record on the end key holding a job's end that is not that end (junk, a tombstone, a
   misplaced event; not a duplicate) supersedes it: the end is due again, as above; so does
   one on the birth key of a dirty result (its graph lay there), and so is the end of a job
   whose birth was due when it ended (its graph lay under no birth key the cleaner keeps).
   No removal under a birth key makes an ended job unknown: where the record it supersedes
   reads as the birth, the birth is gone, and a dirty result's end is due.
   Records written before results (schema version 1) leave a clean result
   with no graph, as they always did. ``JobCleanedUp`` makes a terminal
   job's result clean (no graph, no checkpoints; a second one changes
   nothing); it restates the status and reason. It refuses a live job
   (``job_live``), and, written with ``end_event_id`` (schema version 2), a job the fold
   does not know (``unknown_job``: its end, under a key of its own, would be known); one
   of version 1 is accepted for an unknown job, since it superseded the cancel on the
   job's key. Adopt sets the owner to the current
   term, release clears it; neither applies to unknown (``unknown_job``) or
   terminal jobs.
   A reassertion restates what its own key holds. On the job's own key it sets the job's
   whole state, except that it can never make a terminal job live again; only there or
   under an end key is a job brought into existence (under an end key it restates an end,
   so only a terminal status), and only there is one removed (``ABSENT``). On its lock or
   checkpoints key it restates a job the fold knows (``unknown_job`` otherwise, since the
   cleaner may have removed a later cancel from the job key and left the reassertion
   standing) and sets only that key's part: the lock (status, owner, error) or the
   checkpoint state; one that would remove the job (``job_exists``) or end it
   (``bad_state``) is refused, the rest of what it carries is not taken. No reassertion
   takes checkpoint ids back or undoes a checkpoint record: its checkpoint state is taken
   unless it is older than the fold's in ``seq``, and then the fold keeps its own and the
   key is restated; the leader's restatement carries a ``seq`` at least that of every record
   of the job the fold did not take (``Image.checkpoint_floors``: after the cleaner such a
   record can be read as carrying the state, rule 6's jump). A failed recovery marks a live job
   ``RECOVERY_FAILED`` (no owner, the error kept); only an adopt (a retry)
   or a cancel moves it on; it cannot be released.
6. Checkpoints (Flink's ``CheckpointFailureManager``; :func:`checkpoint_step`):
   ids of triggers increase per job; a failure of a checkpoint that was
   discarded, completed, or is not newer than the last completed one, that
   was already counted, or that is not pending, is ignored (outcome
   ``IGNORED``, with why); so is a failure whose ``failure_reason`` does not
   count (it still ends the pending checkpoint). Whether a reason counts is
   decided once, by the writer, with Flink's table of the release it follows,
   and carried in the record (``reason_counts``); the fold follows it, and
   judges a record without one (written before it was recorded) by the table
   of its time (:func:`recorded_counts`). Other failures
   count once per checkpoint id, a failure in the trigger phase (checkpoint
   id -1) each time; a completion resets the count and keeps the newest
   :func:`checkpoints_retained` (its own ``retained``, else the job's
   ``retained_checkpoints``); a ``JobRestarted`` resets the count, discards
   the pending checkpoints and keeps the retained ones; a ``JobRescaled`` sets the state's
   ``requirements`` (the job's resource requirements, :func:`requirements_error` says what is
   refused ``bad_requirements``, also of a state taken whole) and nothing else, and every
   other record keeps them. Each record carries the job's
   checkpoint state after it and its sequence number ``seq``: the fold
   computes the state itself and refuses a record whose state differs
   (``checkpoint_state_mismatch``) or whose ``seq`` is not the next one
   (``stale_checkpoint_seq``), unless ``seq`` jumps ahead, which only
   compaction causes (the earlier records of the key are gone): then the
   carried state is the state, unless it takes the job's checkpoint ids back or triggers an
   id not above the newest (``checkpoint_id_not_increasing``: the fold's state comes from
   records before it, which its writer had seen), once a grant of schema version 3 was
   accepted (before, the older rule's states below let ids go back). A state as the rule
   before ids were kept computes it (a jobreg before issue 42's finding 5) is accepted too,
   until a grant of schema version 3 (a jobreg that keeps them) is accepted: from then on
   it is ``checkpoint_state_mismatch``.
   Each checkpoint record lies under a key of its own (``<ns>/job/<id>/checkpoint/<event_id>``,
   :func:`~registry.keys.checkpoint_key`; a jobreg before layout 2 wrote them all under the
   job's one checkpoints key, where a refused record superseded the one its refusal rested
   on), so none supersedes another. ``Image.checkpoint_records`` holds, per job, the keys the
   log still has and the one the job's state stands on (the newest record whose carried
   state the fold took); a tombstone under such a key is the leader's collection
   (``COLLECTED``, :func:`registry.fold.plan_collection`: the records no state stands on
   first, then the superseded ones), unless it is over the record the state stands on: then,
   as for any other junk there, the state is due, restated under a new key. Once a grant of
   layout 2 (:data:`CHECKPOINTS_KEYED_LAYOUT`) is accepted, a checkpoint record (or a
   restatement of the checkpoint state) under the one checkpoints key is refused
   ``wrong_key``, every job whose state lay there is due (``unsettled`` holds
   ``<ns>/job/<id>/checkpoint/``), and a known job's checkpoint state stands on those records
   alone (a reassertion under its job, birth or end key carries one the fold does not read).
7. ``LeaseRenewed`` is fenced like any write (and only that: its verdict never depends
   on its ordinal) and counts in the term's ``TermInfo`` (``renewal``: the highest
   ordinal accepted, for rule 3); no clock is read by the fold.
8. Calls (KRaft's metadata transactions, ZooKeeper's ``multi``): a call of
   several records (``submit_many``, ``adopt(a, b)``, a recovery batch; only
   :data:`~registry.events.MEMBER_TYPES`) writes each record with
   ``call_id`` set and ends with a ``CallCommitted`` of ``size`` records
   under a key of its own. A record with a ``call_id`` is fenced when it
   arrives (a fenced one is refused at once) and otherwise waits (outcome
   ``PENDING``, no effect). At the commit, itself fenced like any write, the
   waiting records are applied in log order, all or none: the first one a
   rule refuses sinks the call (it keeps its own reason; every other record
   and the commit are refused as ``call_aborted``, naming it). A record
   refused as ``unknown_job`` does not sink its call (after compaction an
   unknown job cannot be told from one whose records were compacted away).
   A commit that finds fewer than ``size`` records (only compaction removes
   them: the others were superseded on their keys) decides the present ones all or none,
   once a grant of layout 1 was accepted (every refusal that sinks a call then rests on
   births, ends and grants, and the sinking record is never removed: a refused submit stands
   under its birth key, and an ended job's lock key is never restated); before, each
   present one on its own. An accepted grant ends the calls its predecessor left open
   (``call_not_committed``). A refused record of a call on the key of a job
   that does not exist is unsettled like any other: the leader reasserts
   that the job is ``ABSENT`` on that key (under a birth key such a reassertion removes the
   job only if the key holds its birth), so no record of a refused call outlives the
   cleaner. An accepted member stands on its call's commit: a record over the commit's key
   that is not the commit (junk, a tombstone, a misplaced event) makes every part of a job
   an accepted member still holds due, exactly as that record would on the member's own
   key (``Image.call_members``): in a log cleaned past it the members wait for a commit
   that is gone, and the leader's restatements hold the jobs.

9. ``LeaderInformationPublished`` (Flink's leader information of one component) is
   fenced like any write (rule 4: a deposed leader's publication is refused as
   ``stale_epoch``, with both epochs). Then a component that is not an id, or a session
   or address that is too long or not printable (:func:`leader_information_error`), is
   refused (``bad_leader_information``). An accepted one sets its component's
   ``LeaderInfo`` in ``Image.leaders`` (``address`` ``None``: removes it), which holds the
   current term's publications only: an accepted grant or revoke empties it (a new leader
   has published nothing yet). Each record is keyed by its epoch, writer and component,
   so no refused publication of another term or writer lands on the current term's
   keys; a record the fold does not accept on one of them (a late copy of an older
   publication, a malformed one) leaves the key unsettled until the leader restates the
   component (:func:`registry.fold.plan_reassertions`).

Every event type has exactly one rule (``_RULES``); a type without one is
quarantined (``no_rule``), never guessed at.

After each record the fold notes whether the newest record of a known job's
key was accepted (or, rule 8, of an unknown job's key a refused call
record landed on; rule 9, of a key of the current term's leader information);
keys where it was not are ``unsettled`` until the leader reasserts them
(:func:`registry.fold.plan_reassertions`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import immutables

from .errors import CodecError, ConfigError
from .events import (
    CHECKPOINT_FAILURE_REASONS,
    COUNTED_BEFORE_RECORDED,
    COUNTED_FAILURE_REASONS,
    EMPTY_CHECKPOINTS,
    FLINK_RELEASE,
    MAX_PARALLELISM,
    MAX_REQUIREMENTS,
    UNKNOWN_CHECKPOINT,
    CallCommitted,
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
    JobCleanedUp,
    JobEvent,
    JobLockReleased,
    JobReasserted,
    JobRecoveryFailed,
    JobRescaled,
    JobRestarted,
    JobStatus,
    JobSubmitted,
    JobTerminated,
    LeaderInformationPublished,
    LeadershipGranted,
    LeadershipRevoked,
    LeaseRenewed,
    VertexParallelism,
)
from .image import (
    CheckpointRecords,
    Decision,
    Image,
    JobView,
    LeaderInfo,
    LogRecord,
    Outcome,
    Provenance,
    TermInfo,
)
from .keys import (
    allowed_keys,
    birth_key,
    check_id,
    checkpoint_key,
    checkpoints_key,
    end_key,
    is_birth_key,
    is_end_key,
    job_key,
    lock_key,
    parse_key,
    record_key,
)

__all__ = [
    "DUPLICATE_WINDOW_MS",
    "HISTORY_KEPT",
    "MAX_ADDRESS_LENGTH",
    "MAX_SESSION_LENGTH",
    "CheckpointRuleViolation",
    "Delta",
    "checkpoint_step",
    "requirements_error",
    "failure_reason_counts",
    "recorded_counts",
    "fencing_detail",
    "fencing_reason",
    "leader_information_error",
]


ENDS_KEYED_GRANT = 3
"""The schema version of :class:`~registry.events.LeadershipGranted` that a jobreg whose
ends have keys of their own writes (rule 5: once one is accepted, a cleanup of schema
version 1 is refused for a job the fold does not know, as a newer one is)."""

BIRTHS_KEYED_LAYOUT = 1
"""The :attr:`~registry.events.LeadershipGranted.layout` of a jobreg whose submits have
keys of their own (rule 5: once a grant of it is accepted, a submit or an end under the
job's key is refused ``wrong_key``, and only a birth or an end key brings a job into
existence)."""

CHECKPOINTS_KEYED_LAYOUT = 2
"""The :attr:`~registry.events.LeadershipGranted.layout` of a jobreg whose checkpoint
records have keys of their own (rule 6: once a grant of it is accepted, a checkpoint record
under the job's one checkpoints key is refused ``wrong_key``, and the job's checkpoint state
stands only on checkpoint records under keys of their own)."""

DUPLICATE_WINDOW_MS = 60_000
"""Rule 1's window: every copy of an event is assumed to land within this many
milliseconds (broker time) of the first; ids are remembered for one to two windows."""

HISTORY_KEPT = 1_000
"""How many of the newest refused, ignored and quarantined records an image keeps
(the image is bounded by live state; forensics replays the log for all of them)."""


MAX_SESSION_LENGTH = 200
"""Rule 9: the longest leader session id (Flink's is a UUID: 36 characters)."""

MAX_ADDRESS_LENGTH = 2048
"""Rule 9: the longest leader address (Flink's are RPC or REST URLs)."""


def leader_information_error(component: object, session: object,
                             address: object) -> str | None:
    """Rule 9: why leader information is malformed, or ``None`` if it is well formed.

    ``component`` must be an id (:func:`~registry.keys.check_id`: it is part of the
    record's key); ``session`` a printable string of at most :data:`MAX_SESSION_LENGTH`
    characters, not empty when an ``address`` is given; ``address`` ``None`` (delete) or a
    printable string of 1 to :data:`MAX_ADDRESS_LENGTH` characters. The client refuses
    such input before writing, the fold a record that holds it.
    """
    try:
        check_id("leader component", component)
    except ConfigError as e:
        return str(e)
    if not isinstance(session, str) or len(session) > MAX_SESSION_LENGTH \
            or not session.isprintable():
        return (f"leader session {session!r:.80}: use a printable string of at most "
                f"{MAX_SESSION_LENGTH} characters")
    if address is None:
        return None
    if not session:
        return f"leader information of {component!r} with an address needs a session"
    if not isinstance(address, str) or not 0 < len(address) <= MAX_ADDRESS_LENGTH \
            or not address.isprintable():
        return (f"leader address {address!r:.80}: use None (delete) or a printable string "
                f"of 1 to {MAX_ADDRESS_LENGTH} characters")
    return None


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


_FENCED = frozenset({"no_leader", "stale_epoch", "future_epoch", "not_leader", "term_revoked"})
"""Every reason :func:`fencing_reason` gives."""


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


def failure_reason_counts(failure_reason: str) -> bool:
    """Whether a failure for ``failure_reason`` counts, by this jobreg's table
    (:data:`~registry.events.COUNTED_FAILURE_REASONS`, Flink
    :data:`~registry.events.FLINK_RELEASE`'s): the writer's decision, which its record
    carries. A name the table does not have is refused with
    :class:`~registry.errors.ConfigError` (Flink's ``checkFailureCounter`` throws on a reason
    it does not know): never guessed at."""
    if failure_reason not in CHECKPOINT_FAILURE_REASONS:
        raise ConfigError(
            f"unknown checkpoint failure reason {failure_reason!r}: not one of Flink "
            f"{FLINK_RELEASE}'s CheckpointFailureReason names, an earlier release's, or "
            "UNSPECIFIED (jobreg refuses a name it does not know, as Flink does): "
            + ", ".join(CHECKPOINT_FAILURE_REASONS))
    return failure_reason in COUNTED_FAILURE_REASONS


def recorded_counts(event: CheckpointFailed) -> bool:
    """Whether the fold counts ``event``'s reason: the decision its writer recorded
    (``reason_counts``), or, for a record without one (written before the writer recorded
    it), the table of its time (:data:`~registry.events.COUNTED_BEFORE_RECORDED`). The fold
    never judges a name by its own table, so a log folds to the answer it had whichever
    jobreg reads it, one older than the writer (which reads a name it does not know as
    ``UNSPECIFIED``) included."""
    if event.reason_counts is not None:
        return event.reason_counts
    return event.failure_reason in COUNTED_BEFORE_RECORDED


def checkpoints_retained(own: object, job_retained: int) -> int:
    """How many completed checkpoints a job keeps after a checkpoint record (rule 6): a
    completion's ``own`` ``retained`` (the count Flink's checkpoint store was built with,
    which a job may change between runs), else the job's ``retained_checkpoints`` from its
    submit. The fold and the writer both ask this, so the state a record carries is the one
    the fold computes."""
    return own if type(own) is int and own > 0 else job_retained


def checkpoint_step(state: CheckpointState, kind: type[CheckpointEvent], checkpoint_id: int,
                    *, location: str = "", retained: int = 1,
                    failure_reason: str = "UNSPECIFIED", counts: bool | None = None,
                    legacy: bool = False, keep_ids: bool = True,
                    requirements: tuple[VertexParallelism, ...] = (),
                    ) -> tuple[CheckpointState, str | None]:
    """Rule 6: the checkpoint state after one event, and why it was ignored (``None``: it counted).

    Pure; the fold applies it, and the client calls it to compute the state
    its records carry. Raises :class:`CheckpointRuleViolation` for an event
    the fold refuses. Follows Flink's ``CheckpointFailureManager``: a failure counts only
    if its reason does (``counts``: the writer's decision, which the fold takes from the
    record, :func:`recorded_counts`; ``None``: decide now with
    :func:`failure_reason_counts`, as a writer does), each checkpoint
    id once, a failure in the trigger phase (:data:`~registry.events.UNKNOWN_CHECKPOINT`)
    every time; a failure of a checkpoint that is not pending is dropped, as
    Flink's coordinator drops a decline of a checkpoint it does not know; a
    completion or a restart (:class:`~registry.events.JobRestarted`, Flink's
    ``clearCount`` when it fails the job) starts the count again. ``legacy``: a
    failure written before reasons existed (``CheckpointFailed`` schema version 1)
    is judged by the rule of its time, under which the state it carries was
    computed: it counts whether or not the checkpoint is pending.

    Ids only increase per job: every id triggered stays in ``pending``, ``counted`` or
    ``discarded`` until a newer one completes (a failure that does not count, a completion
    passing counted failures and a restart move ids to ``discarded``), so
    :attr:`~registry.events.CheckpointState.newest_id` never goes back and no id can be
    triggered twice (issue 42, finding 5). ``keep_ids=False`` is the rule before that, under
    which records of an older jobreg carried their states: the fold accepts a state either
    rule gives.

    A :class:`~registry.events.JobRescaled` sets the state's ``requirements`` and nothing
    else (its ``checkpoint_id`` must be :data:`~registry.events.UNKNOWN_CHECKPOINT`, the
    requirements pass :func:`requirements_error`); every other event keeps them.
    """
    cp = checkpoint_id
    if kind is JobRescaled:
        error = rescale_error(cp, requirements)
        if error is not None:
            raise CheckpointRuleViolation("bad_requirements", error)
        return dataclasses.replace(state, seq=state.seq + 1,
                                   requirements=tuple(requirements)), None
    if kind is CheckpointFailed and counts is None:
        counts = failure_reason_counts(failure_reason)
    last = state.last_completed
    pending, discarded, counted = set(state.pending), set(state.discarded), set(state.counted)
    unknown = state.unknown_failures
    seq = state.seq + 1
    if kind is JobRestarted:
        if cp != last:
            raise CheckpointRuleViolation(
                "restart_checkpoint_mismatch",
                f"a restart names checkpoint {cp}, but the newest completed checkpoint is {last}")
        # Flink aborts the pending checkpoints when it fails the job over: discarded here
        # (and the counted ones, no longer counted, stay known as ended).
        ended = discarded | pending | (counted if keep_ids else set())
        return CheckpointState(seq, last, state.retained, (), tuple(sorted(ended)), (), 0,
                               state.requirements), None
    if kind is CheckpointFailed and cp == UNKNOWN_CHECKPOINT:
        if counts:
            unknown += 1
            why = None
        else:
            why = f"a trigger failure for {failure_reason} does not count"
        return dataclasses.replace(state, seq=seq, unknown_failures=unknown), why
    if kind is CheckpointTriggered:
        newest = state.newest_id
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
        ended = discarded | (counted if keep_ids else set())  # no longer counted: ended
        return CheckpointState(
            seq, cp, retained_cps[-max(retained, 1):], tuple(sorted(p for p in pending if p > cp)),
            tuple(sorted(d for d in ended if d > cp)), (), 0, state.requirements), None
    elif kind is CheckpointFailed:
        if cp in counted:
            why = f"a failure of checkpoint {cp} was already counted"
        elif cp not in pending and not legacy:
            why = f"checkpoint {cp} is not pending (never triggered, or already failed)"
        else:
            pending.discard(cp)  # Flink aborts the pending checkpoint, whatever the reason
            if counts:
                counted.add(cp)
                why = None
            else:
                if keep_ids and cp not in counted:
                    discarded.add(cp)  # ended, not counted: its id stays known
                why = f"a failure for {failure_reason} does not count"
    else:  # CheckpointDiscarded
        if cp in discarded:
            why = f"checkpoint {cp} was already discarded"
        else:
            discarded.add(cp)
            pending.discard(cp)
            why = None
    return CheckpointState(seq, last, state.retained, tuple(sorted(pending)),
                           tuple(sorted(discarded)), tuple(sorted(counted)), unknown,
                           state.requirements), why


def rescale_error(checkpoint_id: int, requirements: object) -> str | None:
    """Why a ``JobRescaled`` naming ``checkpoint_id`` with ``requirements`` is refused
    (``bad_requirements``; ``None``: it is not): it names no checkpoint, and its
    requirements pass :func:`requirements_error`."""
    if checkpoint_id != UNKNOWN_CHECKPOINT:
        return f"a rescale names checkpoint {checkpoint_id}; it names none (-1)"
    return requirements_error(requirements)


def requirements_error(requirements: object) -> str | None:
    """Why ``requirements`` are not a job's resource requirements (``None``: they are): a
    tuple of at most :data:`~registry.events.MAX_REQUIREMENTS`
    :class:`~registry.events.VertexParallelism`, sorted by vertex id and each vertex once,
    every id 32 lower-case hex digits (a Flink ``JobVertexID``), every bound -1 (left to the
    scheduler) or 1 to :data:`~registry.events.MAX_PARALLELISM`, a lower bound never above
    its upper bound. Flink's ``JobResourceRequirements.validate`` checks the same bounds
    against the graph (and each bound against the vertex's maximum parallelism, which only
    the graph knows). The fold refuses a rescale that fails it (``bad_requirements``), and
    the writer refuses it before it is written; one statement for both."""
    if not isinstance(requirements, tuple):
        return f"requirements are a tuple of VertexParallelism, not {type(requirements).__name__}"
    if len(requirements) > MAX_REQUIREMENTS:
        return (f"requirements name {len(requirements)} vertices; at most "
                f"{MAX_REQUIREMENTS} are carried")
    previous = None
    for r in requirements:
        if not isinstance(r, VertexParallelism):
            return f"requirements hold VertexParallelism, not {type(r).__name__}"
        v = r.vertex_id
        if type(v) is not str or len(v) != 32 or v.strip("0123456789abcdef"):
            return f"vertex id {v!r} is not 32 lower-case hex digits (a Flink JobVertexID)"
        if previous is not None and v <= previous:
            return (f"vertex {v} comes after {previous}: requirements are sorted by vertex, "
                    "each vertex once")
        previous = v
        for name, bound in (("lower", r.lower_bound), ("upper", r.upper_bound)):
            if type(bound) is not int or not (bound == -1 or 1 <= bound <= MAX_PARALLELISM):
                return (f"the {name} bound {bound!r} of vertex {v} is neither -1 (left to the "
                        f"scheduler) nor 1 to {MAX_PARALLELISM}")
        if r.lower_bound != -1 and r.upper_bound != -1 and r.lower_bound > r.upper_bound:
            return (f"the lower bound {r.lower_bound} of vertex {v} is above its upper bound "
                    f"{r.upper_bound}")
    return None


def _rested_on(keys: Sequence[tuple[str, bool]], at: int) -> bool:
    """Whether a refusal rests on the record of ``keys[at]`` (rule 6's bookkeeping, in log
    order): a record no state stands on lies after it before the next record whose state the
    fold took (the newest record taken before a refused one is what its verdict rests on)."""
    return at + 1 < len(keys) and not keys[at + 1][1]


def _taken_whole(state: CheckpointState) -> CheckpointState:
    """A checkpoint state a record carries whole (a reassertion's, a legacy end's), as the
    fold takes it: refused ``bad_requirements`` if its requirements are ones no rescale could
    write (rule 6; the twentieth adversarial read's L1: a terminal restatement's were taken
    unchecked)."""
    error = requirements_error(state.requirements)
    if error is not None:
        raise _Verdict("bad_requirements", error)
    return state


def _newest(kept: tuple[Decision, ...], new: list[Decision]) -> tuple[Decision, ...]:
    if not new:
        return kept
    both = kept + tuple(new)
    return both[-HISTORY_KEPT:] if len(both) > HISTORY_KEPT else both


class Delta:
    """Accumulates the effect of records on an image (KRaft's ``MetadataDelta``).

    ``Delta(image).replay(r1) ... .apply()`` gives the same image as replaying
    the records one by one; it exists so a batch costs one copy of each
    touched collection instead of one per record.
    """

    def __init__(self, image: Image, decode: Callable[[bytes], Event],
                 on_term: Callable[[TermInfo], None] | None = None,
                 known: Mapping[int, Event] | None = None,
                 members: dict[int, Event] | None = None) -> None:
        """``decode``: a record's value -> its event, raising :class:`CodecError` for one
        that is not an event (:mod:`registry.fold` binds the codec's). ``known``: offset ->
        the event a record at that offset holds, when the caller has it already (a writer
        folding what it just wrote); those are not decoded. ``members``: where the delta
        keeps the events of call members that wait (rule 8), by offset; pass the same dict
        to the deltas of successive batches of one partition so that a call spanning
        batches is not decoded twice (a member it lacks is decoded again)."""
        self._base = image
        self._known: Mapping[int, Event] = known or {}
        # a waiting call member's event, by offset
        self._members: dict[int, Event] = {} if members is None else members
        self._on_term = on_term
        self._decode = decode
        self._ns = image.provenance.namespace
        self._prefix = self._ns + "/"
        self.epoch = image.epoch
        self.leader = image.leader
        self.revoked = image.revoked
        self._jobs = image.jobs.mutate()
        self._term = image.term
        self._unsettled = image.unsettled.mutate()
        self._floors = image.checkpoint_floors.mutate()
        self._cp_records = image.checkpoint_records.mutate()
        self._call_members = image.call_members.mutate()
        self._checkpoints_keyed = image.checkpoints_keyed
        self._windows = {w: ids.mutate() for w, ids in image.recent_ids.items()}
        self._newest: int | None = max(self._windows, default=None)
        self._calls: dict[str, tuple[LogRecord, ...]] = dict(image.calls.items())
        self._leaders = image.leaders.mutate()
        self._ends_keyed = image.ends_keyed
        self._births_keyed = image.births_keyed
        self._record_key: bytes | None = None  # the key of the job record being applied
        self._rejected: list[Decision] = []
        self._ignored: list[Decision] = []
        self._quarantined: list[Decision] = []
        self._duplicates = image.duplicates
        self._restate = False  # rule 5: the record just accepted must be restated
        self._not_a_copy = False  # rule 1: the record has a folded id and is no copy of it
        self._on_end_key = False  # rule 5: the reassertion being decided is under an end key
        self._aspect = "job"  # rule 5: the key it is under: job, lock, checkpoints or end
        self._last_offset = image.provenance.last_offset
        self._log_time = image.provenance.log_time
        self.last_event: Event | None = None
        self.resolved: list[tuple[LogRecord, Decision, Event]] = []
        """The records of calls the last :meth:`replay` decided (rule 8): each record, its
        final decision and its event, in log order. Empty for most records."""

    # -- the one entry point -------------------------------------------------

    def replay(self, record: LogRecord) -> Decision:
        """Fold one record; return the verdict. Never raises for record content.

        :attr:`last_event` is then the record's decoded event (``None`` if it did
        not decode), for consumers that need more of it than the verdict says;
        :attr:`resolved` the earlier records of a call this record decided.
        """
        self.last_event = None
        if self.resolved:
            self.resolved = []
        self._last_offset = record.offset
        stamp = record.timestamp
        # The newest stamp so far: a stamp earlier than one before it (a clock stepping
        # back: the embedded broker keeps each writer's) does not take the log's time back.
        if stamp is not None and (self._log_time is None or stamp > self._log_time):
            self._log_time = stamp
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
            if parsed is not None and parsed.kind == "checkpoint" and key is not None \
                    and parsed.job_id is not None:
                return self._collected(record, key, parsed.job_id)
            return self._quarantine(record, key, "tombstone",
                                    "a record without a value (tombstone): jobreg writes one "
                                    "only under a checkpoint record's key")
        event = self._known.get(record.offset)
        if event is None:
            try:
                event = self._decode(record.value)
            except CodecError as e:
                return self._quarantine(record, key, "undecodable", str(e))
        if parsed is None and event.namespace != self._ns:
            return Decision(record.offset, Outcome.SKIPPED, record.timestamp, key)
        if type(event) not in _RULES:
            return self._quarantine(record, key, "no_rule",
                                    f"the fold has no rule for {event.TYPE} events")
        self.last_event = event
        self._restate = False
        self._not_a_copy = False
        decision = self._decide(record, key, event)
        if parsed is not None and key is not None:
            # A record that is no copy of its event's first copy is junk to its key; and so
            # is a verbatim copy under a key that holds one record (a birth, an end, a
            # checkpoint record, a commit): the cleaner keeps the later copy, which moves
            # the fact later in the log, past records that rest on it (refused against an
            # end, accepted after a birth or a commit: the thirteenth read's E8, E9, E11),
            # so the part it holds is due, restated under a new key, as after junk there.
            seen = decision._replace(event_id=None, outcome=Outcome.QUARANTINED) \
                if self._not_a_copy or (decision.outcome == Outcome.DUPLICATE and parsed.kind
                                        in ("birth", "end", "checkpoint", "call")) \
                else decision
            if parsed.job_id is not None:
                self._note_floor(parsed.job_id, event, decision)
                if parsed.kind == "checkpoint":
                    self._note_checkpoint_record(key, parsed.job_id, event, seen)
                else:
                    self._note_settlement(key, parsed.job_id, seen)
            elif parsed.kind == "leader":
                self._note_leader_settlement(key, seen)
            if parsed.kind == "call" or key in self._call_members:
                self._note_call_keys(key, parsed.kind, seen)
        return decision

    def job(self, job_id: str) -> JobView | None:
        """The job as the records replayed so far leave it (``None``: unknown); for
        consumers that record the state after each record, such as the audit stream."""
        return self._jobs.get(job_id)

    def term(self, epoch: int) -> TermInfo | None:
        """The term ``epoch`` as the records replayed so far leave it, if it is the current
        one (``None`` otherwise: the image keeps only the current term; pass ``on_term``
        to see every term as it changes)."""
        term = self._term
        return term if term is not None and term.epoch == epoch else None

    def apply(self) -> Image:
        """The image with every replayed record applied."""
        base = self._base
        return Image(
            provenance=Provenance(self._ns, self._last_offset, self.epoch, self._log_time),
            epoch=self.epoch,
            leader=self.leader,
            revoked=self.revoked,
            jobs=self._jobs.finish(),
            term=self._term,
            rejected=_newest(base.rejected, self._rejected),
            ignored=_newest(base.ignored, self._ignored),
            quarantined=_newest(base.quarantined, self._quarantined),
            unsettled=self._unsettled.finish(),
            recent_ids=immutables.Map({w: ids.finish() for w, ids in self._windows.items()}),
            duplicates=self._duplicates,
            calls=(base.calls if not self._calls and not base.calls
                   else immutables.Map(self._calls)),
            leaders=self._leaders.finish(),
            ends_keyed=self._ends_keyed,
            births_keyed=self._births_keyed,
            checkpoint_floors=self._floors.finish(),
            checkpoints_keyed=self._checkpoints_keyed,
            checkpoint_records=self._cp_records.finish(),
            call_members=self._call_members.finish(),
        )

    # -- internals -----------------------------------------------------------

    def _quarantine(self, record: LogRecord, key: str | None, reason: str, detail: str) -> Decision:
        d = Decision(record.offset, Outcome.QUARANTINED, record.timestamp, key,
                     reason=reason, detail=detail)
        self._quarantined.append(d)
        parsed = parse_key(key) if key is not None else None
        if parsed is not None and parsed.kind == "checkpoint" and key is not None \
                and parsed.job_id is not None:
            self._note_checkpoint_record(key, parsed.job_id, None, d)
        elif parsed is not None and parsed.job_id is not None and key is not None:
            self._note_settlement(key, parsed.job_id, d)
        elif parsed is not None and parsed.kind == "leader" and key is not None:
            self._note_leader_settlement(key, d)
        if parsed is not None and key is not None and (
                parsed.kind == "call" or key in self._call_members):
            self._note_call_keys(key, parsed.kind, d)
        return d

    def _note_leader_settlement(self, key: str, decision: Decision) -> None:
        # Rule 9: ``key`` is a leader key of this namespace. A record the fold did not
        # accept (a duplicate of an older publication, a malformed one) on a key of the
        # current term's leader would be all the cleaner leaves of the key: unsettled until
        # the leader restates the component. Other terms' keys hold nothing the fold needs.
        if decision.outcome == Outcome.ACCEPTED:
            if key in self._unsettled:
                del self._unsettled[key]
            return
        _, epoch, writer, component = key[len(self._prefix):].split("/")
        # (A key whose component is no id never holds an accepted record: nothing to keep.)
        if not self.revoked and writer == self.leader and epoch == str(self.epoch) \
                and leader_information_error(component, "", None) is None \
                and key not in self._unsettled:  # since the first: the lag runs from it
            self._unsettled[key] = decision.offset

    def _forget_leader_keys(self) -> None:
        # Rule 9: a grant or revoke empties the leader information; no unsettled leader
        # key of the term that ended needs restating any more.
        unsettled = self._unsettled.finish()
        prefix = self._prefix + "leader/"
        if any(k.startswith(prefix) for k in unsettled):
            unsettled = immutables.Map({k: v for k, v in unsettled.items()
                                        if not k.startswith(prefix)})
        self._unsettled = unsettled.mutate()

    def _note_floor(self, job_id: str, event: Event, decision: Decision) -> None:
        """Rule 6: a record of the job carrying a checkpoint ``seq`` the fold did not take
        (refused, ignored, a duplicate, accepted and to be restated) may, once the cleaner
        removed the records before it, be read as carrying the state (the jump); the
        leader's restatement must then win on ``seq``, so it carries at least the highest
        such one (``Image.checkpoint_floors``), kept while it is above the job's own. Not a
        fenced one (rule 4: a stale or future epoch, another writer, no or a revoked term):
        grants and revokes are never compacted, so it is refused in every compacted log, and
        a floor from it would only raise the restatement above the records the leader plans
        from the same view (after a failover, a deposed leader's late records are ordinary:
        the twentieth adversarial read's M1 and M2)."""
        state = event.checkpoints if isinstance(event, JobReasserted) \
            else getattr(event, "state", None)
        floor = self._floors.get(job_id)
        if isinstance(state, CheckpointState) and (
                decision.outcome != Outcome.ACCEPTED or self._restate) and (
                decision.reason not in _FENCED) and (
                floor is None or state.seq > floor):
            floor = self._floors[job_id] = state.seq
        if floor is not None:
            job = self._jobs.get(job_id)
            if job is None or job.checkpoints.seq >= floor:
                del self._floors[job_id]

    def _note_settlement(self, key: str, job_id: str, decision: Decision, *,
                         member: bool = False) -> None:
        # ``key`` is a job key of this namespace (``parse_key`` said so). An accepted
        # record whose copy of the job's state the fold did not take (rule 5) is
        # restated like a refused one. An end key (``<ns>/job/<id>/end/<event_id>``) holds
        # one record and supersedes nothing: never unsettled. But a record there that is
        # not the end (junk, a tombstone, a misplaced event) supersedes the end it holds:
        # the job's end is no longer under a key the cleaner keeps, and is due to be
        # restated under a new one (rule 5). A duplicate is a copy of what the key held.
        self._note_birth(job_id)
        self._note_checkpoints_due(job_id)
        if is_end_key(key):
            if decision.outcome == Outcome.ACCEPTED:
                if key in self._unsettled:  # the leader's removal landed
                    del self._unsettled[key]
            elif decision.outcome != Outcome.DUPLICATE:
                job = self._jobs.get(job_id)
                if job is not None and job.ended_by is not None \
                        and key == end_key(self._ns, job_id, job.ended_by):
                    self._end(job_id, job._replace(ended_by=None))
                elif job is not None and not job.live and job.ended_by is None \
                        and key not in self._unsettled:
                    # A refused record under an end key of a job whose end lies under its
                    # job key: that refusal rests on a record the cleaner may remove, so
                    # the leader removes this one (an ABSENT reassertion there).
                    self._unsettled[key] = decision.offset
            return
        if is_birth_key(key):
            # A birth key holds one record (a submit, or a reassertion restating a birth)
            # and supersedes nothing; a refused submit of a live job there is removed by
            # the leader (below). But a record there that is not the birth it
            # holds supersedes it: the birth is due again (restated under a new birth key).
            # And a refused call's submit of a job that does not exist is removed (ABSENT),
            # so that no commit the cleaner left fewer records of decides it alone (rule 8).
            if decision.outcome == Outcome.ACCEPTED:
                if key in self._unsettled:
                    del self._unsettled[key]
            elif decision.outcome != Outcome.DUPLICATE:
                # (A duplicate is a copy of the birth: the client never re-sends a record
                # under a key of its own verbatim, so only a copy that is no client's, or a
                # late one, lands here, README assumption 3.)
                job = self._jobs.get(job_id)
                if job is not None and job.born_by is not None \
                        and decision.event_id != job.born_by \
                        and key == birth_key(self._ns, job_id, job.born_by):
                    job = job._replace(born_by=None)
                    if job.live or not job.dirty:
                        self._jobs[job_id] = job
                        if job.live:
                            # its lock and checkpoint records lie after the birth that is
                            # gone: due from here, restated after the new birth
                            self._parts_due(job)
                    else:
                        # A dirty result's graph lay under that birth key: its end is due,
                        # restated whole under a new end key (graph and checkpoints; once
                        # checkpoint records have keys of their own, the checkpoints under
                        # one of those, after it).
                        self._end(job_id, job._replace(ended_by=None))
                        if self._checkpoints_keyed:
                            self._checkpoints_due(job_id)
                elif key not in self._unsettled and decision.event_id != (
                        job.born_by if job is not None else None) and (
                        (job is None and member and decision.outcome == Outcome.REJECTED)
                        or (job is not None and job.live and (
                            job.born_by is None
                            or (not member and decision.reason == "job_exists")))):
                    # A refused call's submit of a job that does not exist, or a refused
                    # submit of a live job (it rests on the job's birth, which a record on
                    # its key, or on the job key for a birth not yet under a birth key, may
                    # supersede before the cleaner runs; it would then read as the birth):
                    # removed (ABSENT) by the leader. Not a call's member of a job born
                    # under a birth key: it is what sinks its call, and must stand (rule 8).
                    # Never a copy of the birth itself (its event id is the birth's: a
                    # verbatim copy past the duplicate window is refused job_exists, and the
                    # key's newest record is still the birth).
                    self._unsettled[key] = decision.offset
            self._note_birth(job_id)
            return
        if decision.outcome == Outcome.ACCEPTED and not self._restate:
            if key in self._unsettled:
                del self._unsettled[key]
            return
        job = self._jobs.get(job_id)
        if key not in self._unsettled and (  # since the first: the lag runs from it
                (job is None and member and decision.outcome == Outcome.REJECTED)
                or (job is not None and self._holds(job, key))):
            self._unsettled[key] = decision.offset

    def _holds(self, job: JobView, key: str) -> bool:
        """Whether the job's key ``key`` (its job, lock or checkpoints key) holds a part of
        the job the fold must keep there: every key of a live job; of a result its job key,
        and its checkpoints key while it is dirty (its end carries no copy of them). A
        result's lock key holds nothing, so a refused record there (a call's sinking adopt
        of an ended job, rule 8) is never restated away."""
        if key.endswith("/checkpoints") and self._checkpoints_keyed:
            # (rule 6: the job's checkpoint state stands on records under keys of their own
            # since a grant of layout 2; this key holds nothing the fold needs)
            return False
        if job.live:
            return True
        if key.endswith("/lock"):
            return False
        return job.dirty or not key.endswith("/checkpoints")

    # -- rule 6: checkpoint records under keys of their own ------------------------

    def _note_checkpoint_record(self, key: str, job_id: str, event: Event | None,
                                decision: Decision) -> None:
        """A record under a checkpoint record's key (``<ns>/job/<id>/checkpoint/<event_id>``):
        it supersedes nothing but what that key held. It holds the job's checkpoint state
        if the fold took the state it carries; one that supersedes the holder without
        holding the state (junk, a tombstone, a misplaced event) makes the state due, to be
        restated under a new key (:meth:`_note_checkpoints_due`). A duplicate is a copy of
        what the key held."""
        rec = self._cp_records.get(job_id) or CheckpointRecords()
        keys = list(rec.keys)
        at = next((i for i, (k, _) in enumerate(keys) if k == key), None)
        if decision.outcome == Outcome.DUPLICATE and at is not None:
            return
        holder, state = rec.holder, rec.state
        # A record over one that a refusal rests on (the newest record the fold took before
        # a refused one, which may be a holder since superseded): in a log cleaned past it
        # that refused record reads as accepted, and the ones after it as refused. The state
        # is due: the leader collects the refused records, then restates it, and the
        # restatement wins on seq in every such log (the twenty-first read's F2: junk over a
        # former holder, with nothing due, lost the completion that had superseded it).
        if at is not None and key != holder and keys[at][1] and _rested_on(keys, at):
            holder, state = None, None
        # (A call's member under a checkpoint key, a raw writer's, is junk like any misplaced
        # record: refused wrong_key as it lands, it never joins its call, so nothing of rule 8
        # rests on it, and the leader collects it. Until the twenty-first read's F1 it was
        # passed over, so over the holder it made nothing due, and a log cleaned past it lost
        # the job's checkpoints; the twenty-second's L1-L2: and it was never collected.)
        job = self._jobs.get(job_id)
        carried = event.checkpoints if isinstance(event, JobReasserted) \
            else getattr(event, "state", None)
        holds = decision.accepted and job is not None and isinstance(carried, CheckpointState) \
            and carried == job.checkpoints
        if at is not None:
            del keys[at]
        keys.append((key, holds))
        # While the state is due (junk superseded its holder, or it lay under the old one
        # checkpoints key) and the log holds records of the job no state stands on, no record
        # becomes the holder: the stretch goes on until the leader, having collected them,
        # restates the state. A refusal rests on the record the state stood on when it
        # landed, which the junk may have superseded: in a log cleaned past the junk the
        # refused record reads as accepted and the records after it as refused, so a record
        # taken after it must not end the stretch (the lag would no longer hold the cut back
        # before the restatement, which wins there on seq; the twentieth adversarial read's
        # H1: junk, a refused record, then the leader's next write, undone in the cleaned
        # log and, once a new leader settled from that log, in every log).
        blocked = self._checkpoints_keyed \
            and f"{self._prefix}job/{job_id}/checkpoint/" in self._unsettled \
            and any(not held for _, held in keys)
        if holds and not blocked:
            holder, state = key, carried
        elif holder == key:
            holder, state = None, None
        self._cp_records[job_id] = CheckpointRecords(holder, state, tuple(keys))
        self._note_checkpoints_due(job_id)

    def _collected(self, record: LogRecord, key: str, job_id: str) -> Decision:
        """A tombstone under a checkpoint record's key: the leader's collection of a record
        no state stands on (:func:`registry.fold.plan_collection`), or junk over the one
        that holds the job's checkpoint state, which is then due."""
        rec = self._cp_records.get(job_id)
        if rec is not None and rec.holder == key and self._needs_checkpoints(job_id):
            return self._quarantine(record, key, "tombstone", "a record without a value "
                                    "(tombstone) over the record that holds the checkpoint "
                                    f"state of job {job_id!r}: due to be restated")
        if rec is not None:
            at = next((i for i, (k, _) in enumerate(rec.keys) if k == key), None)
            # (the leader removes the refused records before the one they rest on: a
            # tombstone over that one first is junk to them, and the state is due, F2)
            rested = at is not None and rec.keys[at][1] and _rested_on(rec.keys, at) \
                and self._needs_checkpoints(job_id)
            keys = tuple(e for e in rec.keys if e[0] != key)
            if not keys and rec.holder in (None, key):
                del self._cp_records[job_id]
            else:
                self._cp_records[job_id] = rec._replace(keys=keys) \
                    if rec.holder != key and not rested else CheckpointRecords(None, None, keys)
        self._note_checkpoints_due(job_id)
        return Decision(record.offset, Outcome.COLLECTED, record.timestamp, key, None, None,
                        job_id, None, None, "collected", "a tombstone of a checkpoint record "
                        "no state stands on (the leader's collection)")

    def _needs_checkpoints(self, job_id: str) -> bool:
        """Whether the job has a checkpoint state the fold must keep: a live job's or a
        dirty result's that is not the empty one."""
        job = self._jobs.get(job_id)
        return job is not None and (job.live or job.dirty) \
            and job.checkpoints != EMPTY_CHECKPOINTS

    def _note_checkpoints_due(self, job_id: str) -> None:
        """Rule 6: once a grant of layout 2 was accepted, a job whose checkpoint state no
        record under a checkpoint record's key holds (a job whose state lay under its one
        checkpoints key before, or whose holder junk superseded) is due to have it restated
        under one: the key ``<ns>/job/<id>/checkpoint/`` stands for that in
        ``unsettled``."""
        if not self._checkpoints_keyed:
            return
        due = f"{self._prefix}job/{job_id}/checkpoint/"
        rec = self._cp_records.get(job_id)
        if self._needs_checkpoints(job_id) and (
                rec is None or rec.holder is None
                or rec.state != self._jobs[job_id].checkpoints):
            if due not in self._unsettled:
                self._unsettled[due] = self._last_offset
        elif due in self._unsettled:
            del self._unsettled[due]

    def _parts_due(self, job: JobView) -> None:
        """Rule 5: the record that holds a live job's birth is now a later one (a
        restatement of it, or a fresh copy of that). In a log cleaned past what removed the
        earlier one (junk over its key), the lock and checkpoint records written before the
        new one are refused ``unknown_job``, and the job exists from this record or from an
        earlier one that read as the birth there (a refused re-send of the submit): so the
        leader restates the job's lock and its checkpoint state after it, whatever the
        restatement carried. (Until this rule a lock record or a completed checkpoint between
        the two births was lost in such a log: the sixth adversarial read's open case and
        the seventh's G1.)"""
        # The stretch runs from where the birth became due (the junk over the birth that is
        # gone), if it did: the records the new birth comes after lie since then.
        since = self._unsettled.get(f"{self._prefix}job/{job.job_id}/birth/",
                                    self._last_offset)
        key = lock_key(self._ns, job.job_id)
        self._unsettled[key] = min(self._unsettled.get(key, since), since)
        if job.checkpoints == EMPTY_CHECKPOINTS:
            return
        if self._checkpoints_keyed:
            self._checkpoints_due(job.job_id, since)
        else:
            key = checkpoints_key(self._ns, job.job_id)
            self._unsettled[key] = min(self._unsettled.get(key, since), since)

    def _checkpoints_due(self, job_id: str, since: int | None = None) -> None:
        """Rule 6: the job's checkpoint state is to be restated under a new checkpoint
        record's key, after the record that now brings the job into existence in a log
        cleaned past junk over its birth (the records it stands on lie before that record,
        and are refused ``unknown_job`` there)."""
        rec = self._cp_records.get(job_id)
        if rec is not None and rec.holder is not None:
            self._cp_records[job_id] = rec._replace(holder=None, state=None)
        due = f"{self._prefix}job/{job_id}/checkpoint/"
        if since is not None and self._needs_checkpoints(job_id):
            self._unsettled[due] = min(self._unsettled.get(due, since), since)
        self._note_checkpoints_due(job_id)

    def _note_birth(self, job_id: str) -> None:
        """Rule 5: a live job whose birth is under no birth key (born under its job key by a
        jobreg before births had keys of their own, or its birth superseded) is due to have
        it restated under one, once a grant of layout 1 was accepted: the key
        ``<ns>/job/<id>/birth/`` stands for that in ``unsettled``."""
        if not self._births_keyed:
            return
        job = self._jobs.get(job_id)
        due = f"{self._prefix}job/{job_id}/birth/"
        if job is not None and job.live and job.born_by is None:
            if due not in self._unsettled:
                self._unsettled[due] = self._last_offset
        elif due in self._unsettled:
            del self._unsettled[due]

    def _decide(self, record: LogRecord, key: str | None, event: Event) -> Decision:
        # Decisions are built positionally: this is the hot path of every replay.
        job_id = getattr(event, "job_id", None)
        event_id = event.event_id
        windows = self._windows
        stamp = record.timestamp
        if stamp is not None and self._newest is not None \
                and stamp // DUPLICATE_WINDOW_MS > self._newest:
            # Rule 1: a new window; forget the ids of all but the previous one. (A record
            # stamped earlier than the newest window, the broker's clock stepped back, is
            # remembered in the newest.)
            newest = self._newest = stamp // DUPLICATE_WINDOW_MS
            for old in [w for w in windows if w < newest - 1]:
                del windows[old]
            windows[newest] = immutables.Map().mutate()
        # (what a copy must match: its key and its bytes; a record without a value never
        # gets here)
        # Rule 1 keeps, per event id and key, the CRC-32 of the bytes of the first record
        # of that id under that key (a record without a value never gets here).
        seen_as = f"{event_id}\x00{key}"
        crc = zlib.crc32(record.value or b"")
        first = None
        for ids in windows.values():
            first = ids.get(seen_as)
            if first is not None:
                break
        if first == crc:
            self._duplicates += 1
            return Decision(record.offset, Outcome.DUPLICATE, record.timestamp, key,
                            event.TYPE, event_id, job_id, event.epoch, event.writer,
                            "duplicate",
                            f"event {event_id} was already folded; no second effect")
        # Any other record (a folded id under another key, or under the same key with other
        # bytes: a foreign writer's copy of a record over another record's key, a forged
        # record reusing an id) is decided by the rules like any record, never by an
        # earlier record of its id under another key, which the cleaner may remove
        # (superseded on its own key): the twelfth read's D1b-D2 and D9, and the
        # thirteenth's E5 (a verbatim re-send of a record whose id another key's record
        # had first: a duplicate once the cleaner removed that one, decided anew before).
        # One under the same key with other bytes supersedes the first without being it:
        # its key's bookkeeping takes it for junk over the key's holder (rules 5, 6, 8),
        # whatever its own verdict (D1c: a forged commit under the commit's key).
        self._not_a_copy = first is not None
        noted = None  # the window this record's id is remembered in (until it is refused)
        if first is None:
            current = self._newest
            if current is None:  # the first id (no broker timestamp: window 0, for ever)
                current = self._newest = 0 if stamp is None else stamp // DUPLICATE_WINDOW_MS
                windows[current] = immutables.Map().mutate()
            noted = windows[current]
            noted[seen_as] = crc
        try:
            if event.namespace != self._ns:
                raise _Verdict("namespace_mismatch",
                               f"event names namespace {event.namespace!r}, its key {key!r}")
            if key != record_key(event) and key not in allowed_keys(event) \
                    and not _removes_a_record(event, key):
                raise _Verdict("wrong_key", f"a {event.TYPE} must be keyed "
                               f"{' or '.join(allowed_keys(event))}, not {key!r}")
            ignored = _RULES[type(event)](self, event, record)
        except _Verdict as v:
            d = Decision(record.offset, Outcome.REJECTED, record.timestamp, key, event.TYPE,
                         event.event_id, job_id, event.epoch, event.writer, v.reason, v.detail,
                         v.expected, v.actual, self.leader)
            self._rejected.append(d)
            if noted is not None:
                # A refused record is not remembered: a verbatim copy of it is decided by
                # the rules at its own position, as every log the cleaner passed decides it
                # (the copy supersedes the first under their key: the fourteenth read's F3,
                # a copy refused first that the job's change made acceptable was a
                # duplicate in the full log and accepted in a compacted one).
                del noted[seen_as]
            if isinstance(event, LeadershipGranted) and self._term is not None:
                # Rule 3: a refused grant attempt against the current term (its renewer
                # keys the renewals it plans after folding this one apart).
                self._set_term(self._term._replace(
                    refused_grants=self._term.refused_grants + 1))
            if isinstance(event, CallCommitted) and event.event_id in self._calls:
                self._end_call(event.event_id, v.reason, f"the call's commit at offset "
                               f"{record.offset} was refused: {v.detail}", v)
            return d
        if isinstance(ignored, Decision):
            if noted is not None and ignored.outcome == Outcome.REJECTED:
                del noted[seen_as]  # (as above)
            return ignored
        if ignored is _PENDING:
            return Decision(record.offset, Outcome.PENDING, record.timestamp, key, event.TYPE,
                            event.event_id, job_id, event.epoch, event.writer, "pending",
                            f"record of call {event.call_id}; decided at its commit",  # type: ignore[attr-defined]
                            None, None, self.leader)
        if ignored is not None:
            d = Decision(record.offset, Outcome.IGNORED, record.timestamp, key, event.TYPE,
                         event.event_id, job_id, event.epoch, event.writer, "ignored", ignored,
                         None, None, self.leader)
            self._ignored.append(d)
            return d
        return Decision(record.offset, Outcome.ACCEPTED, record.timestamp, key, event.TYPE,
                        event.event_id, job_id, event.epoch, event.writer, None, _said(event),
                        None, None, self.leader)

    # -- the rules: one per event type (see _RULES) ----------------------------

    def _grant(self, e: LeadershipGranted, record: LogRecord) -> None:
        if e.prev_epoch != self.epoch:
            raise _Verdict("cas_failed",
                           f"grant to {e.writer!r} expected epoch {e.prev_epoch} to be current, "
                           f"but epoch {self.epoch} is (leader {self.leader!r})",
                           expected=self.epoch, actual=e.prev_epoch)
        if e.epoch != e.prev_epoch + 1:
            raise _Verdict("bad_epoch", f"a grant after epoch {e.prev_epoch} must claim epoch "
                           f"{e.prev_epoch + 1}, not {e.epoch}",
                           expected=e.prev_epoch + 1, actual=e.epoch)
        info = self._term
        if e.saw_renewal is not None and info is not None and info.epoch == self.epoch \
                and info.renewal > e.saw_renewal:
            raise _Verdict("renewed_since",
                           f"grant to {e.writer!r} saw renewal {e.saw_renewal} of term "
                           f"{self.epoch}, but {self.leader!r} renewed since (renewal "
                           f"{info.renewal} was accepted before the grant)",
                           expected=info.renewal, actual=e.saw_renewal)
        # Rule 8: the old term's open calls end here, in log order (the image keeps them in
        # a hash map, whose order is no order: a replay must refuse them in the same order
        # whatever the batch splits).
        for call_id in sorted(self._calls, key=lambda c: self._calls[c][0].offset):
            self._end_call(call_id, "call_not_committed",
                           f"term {self.epoch} ended (epoch {e.epoch} granted at offset "
                           f"{record.offset}) before the call was committed")
        self.epoch, self.leader, self.revoked = e.epoch, e.writer, False
        if e.schema_version >= ENDS_KEYED_GRANT:
            self._ends_keyed = True  # rule 5: a jobreg whose ends have keys of their own
        if e.layout >= BIRTHS_KEYED_LAYOUT and not self._births_keyed:
            # rule 5: from here on a live job's birth lies under a birth key; the jobs born
            # before (under their job keys) are due to have theirs restated there
            self._births_keyed = True
            jobs = self._jobs.finish()
            self._jobs = jobs.mutate()
            for job_id in sorted(jobs.keys()):
                self._note_birth(job_id)
        if e.layout >= CHECKPOINTS_KEYED_LAYOUT and not self._checkpoints_keyed:
            # rule 6: from here on a job's checkpoint state stands on records under keys of
            # their own; the jobs whose state lay under their one checkpoints key are due to
            # have it restated there (and that key is never restated again)
            self._checkpoints_keyed = True
            unsettled = self._unsettled.finish()
            # (an unsettled checkpoints key's stretch goes on as its job's due state: the
            # lag runs from the refused record that began it)
            self._unsettled = immutables.Map(
                {(k[:-len("checkpoints")] + "checkpoint/" if k.endswith("/checkpoints")
                  else k): v for k, v in unsettled.items()}).mutate()
            jobs = self._jobs.finish()
            self._jobs = jobs.mutate()
            for job_id in sorted(jobs.keys()):
                self._note_checkpoints_due(job_id)
        self._leaders = immutables.Map().mutate()  # rule 9: the new leader published nothing
        self._forget_leader_keys()
        self._set_term(TermInfo(e.epoch, e.writer, record.offset, lease_ms=e.lease_ms))

    def _set_term(self, info: TermInfo) -> None:
        self._term = info
        if self._on_term is not None:
            self._on_term(info)

    def _fence(self, e: Event) -> None:
        reason = fencing_reason(self.epoch, self.leader, self.revoked, e.epoch, e.writer)
        if reason is not None:
            raise _Verdict(reason, fencing_detail(reason, self.epoch, self.leader, e.epoch,
                                                  e.writer), expected=self.epoch, actual=e.epoch)

    def _revoked(self, e: LeadershipRevoked, record: LogRecord) -> None:
        self._fence(e)
        self.revoked = True
        self._leaders = immutables.Map().mutate()  # rule 9: the current term's only
        self._forget_leader_keys()
        info = self._term
        if info is not None:
            self._set_term(info._replace(revoked_offset=record.offset))

    def _renewed(self, e: LeaseRenewed, record: LogRecord) -> None:
        self._fence(e)
        info = self._term
        if info is not None:
            self._set_term(info._replace(renewals=info.renewals + 1,
                                         last_renewal_offset=record.offset,
                                         renewal=max(info.renewal, e.renewal or 0)))

    def _published(self, e: LeaderInformationPublished, record: LogRecord) -> None:
        """Rule 9: fenced, then well formed; sets or removes the component's information."""
        self._fence(e)
        error = leader_information_error(e.component, e.session, e.address)
        if error is not None:
            raise _Verdict("bad_leader_information", error)
        if e.address is None:
            if e.component in self._leaders:
                del self._leaders[e.component]
        else:
            self._leaders[e.component] = LeaderInfo(e.session, e.address)

    def _reassertion(self, e: JobReasserted, record: LogRecord) -> str | None:
        """Rules 4 and 5 for a reassertion: fenced; it restates what its own key holds
        (:meth:`_reasserted`), and on the job's lock or checkpoints key it restates a job
        the fold knows and never brings one into existence (only records of the job's own
        key do), since the cleaner may have removed a later cancel there."""
        self._fence(e)
        self._record_key = record.key
        self._on_end_key = record.key == end_key(self._ns, e.job_id, e.event_id).encode()
        on_birth_key = record.key == birth_key(self._ns, e.job_id, e.event_id).encode()
        parsed = parse_key(_key(record) or "")
        self._aspect = "end" if self._on_end_key else (
            parsed.kind if parsed is not None else "job")
        if self._aspect == "checkpoint" and record.key != checkpoint_key(
                self._ns, e.job_id, e.event_id).encode("utf-8"):
            raise _Verdict("wrong_key", f"a reassertion under a checkpoint record's key "
                           f"restates the checkpoint state under its own, "
                           f"{checkpoint_key(self._ns, e.job_id, e.event_id)!r}, not "
                           f"{_key(record)!r}")
        if self._aspect == "checkpoints" and self._checkpoints_keyed:
            raise _Verdict("wrong_key", f"a grant of layout {CHECKPOINTS_KEYED_LAYOUT} was "
                           "accepted: the checkpoint state is restated under a checkpoint "
                           f"record's key, not {_key(record)!r}")
        if self._aspect == "birth" and (e.status == JobStatus.ABSENT or not on_birth_key):
            # Rule 8's removal of a refused call's submit, under that submit's key: it
            # removes the record it supersedes, and the job only if that record is its
            # birth (a reader that decided a call the cleaner left fewer records of took
            # it), never a job born under another key since (a late copy of the removal).
            # The removal of a refused submit of a job the leader knows to be live (reason
            # ``job_exists``) never removes the job: where the record it supersedes reads as
            # the birth (a log cleaned past the birth before it), the birth is due again.
            # Nor does any removal make an ended job unknown (rule 5: terminal for ever):
            # where the record reads as its birth, the birth is gone, and a dirty result's
            # end is due, restated whole (its graph lay there; the eleventh read's A2: a
            # refused re-sent submit read as the birth of a job cancelled since, and its
            # removal deleted the job, its id submittable again).
            job = self._jobs.get(e.job_id)
            held = (record.key or b"").rsplit(b"/", 1)[-1].decode("utf-8", "replace")
            if job is not None and job.born_by == held:
                if not job.live:
                    job = job._replace(born_by=None)
                    if job.dirty:
                        self._end(e.job_id, job._replace(ended_by=None))
                        if self._checkpoints_keyed:
                            self._checkpoints_due(e.job_id)
                    else:
                        self._jobs[e.job_id] = job
                elif e.reason == "job_exists":
                    self._jobs[e.job_id] = job._replace(born_by=None)
                else:
                    del self._jobs[e.job_id]
            return None
        if self._aspect == "end" and not self._on_end_key and e.status == JobStatus.ABSENT:
            # The leader's removal of a refused end under that key (rule 5: one of a job
            # whose end lay under its job key, which the cleaner may remove first): it
            # removes the record it supersedes, never the job's end.
            job = self._jobs.get(e.job_id)
            held = (record.key or b"").rsplit(b"/", 1)[-1].decode("utf-8", "replace")
            if job is not None and job.ended_by == held:
                raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}: its end "
                               "lies under this key, which a removal cannot supersede")
            return None
        if self._on_end_key and e.status not in JobStatus.TERMINAL:
            raise _Verdict("bad_state", f"a reassertion under an end key restates an end, "
                           f"not status {e.status!r}")
        if on_birth_key and e.status in JobStatus.TERMINAL:
            raise _Verdict("bad_state", f"a reassertion under a birth key restates a live "
                           f"job's birth, not status {e.status!r}")
        creates = self._on_end_key or on_birth_key or (
            not self._births_keyed
            and record.key == job_key(self._ns, e.job_id).encode("utf-8"))
        if e.status != JobStatus.ABSENT and e.job_id not in self._jobs and not creates:
            raise _Verdict("unknown_job", f"job {e.job_id!r} is not known: a reassertion "
                           "restates a job there, only one under a birth or an end key "
                           "brings one into existence")
        return self._apply(e)

    def _job_write(self, e: JobEvent, record: LogRecord) -> str | object | None:
        """Rules 4, 5, 6 and 8 for a job event: fenced, then waiting for its call's commit
        or applied now."""
        self._fence(e)
        if self._births_keyed and isinstance(e, (JobSubmitted, JobCancelled, JobTerminated)) \
                and record.key != record_key(e).encode("utf-8"):
            raise _Verdict("wrong_key", f"a {e.TYPE} must be keyed {record_key(e)!r} (a grant "
                           f"of layout {BIRTHS_KEYED_LAYOUT} was accepted: the job's key "
                           f"holds no submit or end any more), not {_key(record)!r}")
        if self._checkpoints_keyed and isinstance(e, CheckpointEvent) \
                and record.key != record_key(e).encode("utf-8"):
            raise _Verdict("wrong_key", f"a {e.TYPE} must be keyed {record_key(e)!r} (a grant "
                           f"of layout {CHECKPOINTS_KEYED_LAYOUT} was accepted: checkpoint "
                           f"records have keys of their own), not {_key(record)!r}")
        self._record_key = record.key
        self._on_end_key = record.key is not None and is_end_key(record.key)
        call_id = getattr(e, "call_id", None)
        if call_id is not None:
            self._calls[call_id] = self._calls.get(call_id, ()) + (record,)
            self._members[record.offset] = e
            return _PENDING
        return self._apply(e)

    def _apply(self, e: JobEvent) -> str | None:
        """Apply a fenced job event; return why it was ignored, if it was."""
        return _EFFECTS[type(e)](self, e, self._jobs.get(e.job_id))

    def _submitted(self, e: JobSubmitted, job: JobView | None) -> None:
        if job is not None:
            if not job.live:
                raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}; a "
                               "terminal id can never be submitted again")
            raise _Verdict("job_exists", f"job {e.job_id!r} already exists")
        born = self._record_key == birth_key(self._ns, e.job_id, e.event_id).encode("utf-8")
        self._jobs[e.job_id] = JobView(e.job_id, JobStatus.ACTIVE, e.epoch, e.graph, None,
                                       e.max_checkpoint_failures, e.retained_checkpoints,
                                       born_by=e.event_id if born else None)

    def _ended(self, e: JobCancelled | JobTerminated, job: JobView | None) -> None:
        status = JobStatus.CANCELLED if isinstance(e, JobCancelled) else e.state
        if status not in JobStatus.TERMINAL:
            raise _Verdict("bad_state", f"a job can terminate as FINISHED or FAILED, "
                           f"not {status!r}")
        if job is not None and not job.live:
            if self._on_end_key and job.ended_by is None \
                    and (status, e.reason or None) == (job.status, job.reason):
                # The job's end is due (it lies under the job key, written by a jobreg
                # before ends had keys of their own, or junk lies over the end key that
                # held it): a record under an end key that states that end is accepted, and
                # changes nothing. It never becomes the end, nor settles it: only the
                # leader's restatement does, whole. Read as the end, a late first copy of
                # the end (the client re-sends an end as a fresh event) would leave the
                # records refused against the end the junk destroyed unrestated, and a log
                # cleaned past the junk reads them as accepted: a refused second end as
                # the end, a refused completion in the result, a restated checkpoint state
                # lost (issue 42, the tenth read's J1-J3). One that states another end is
                # refused, and removed by the leader: once the cleaner removed the end
                # under the job key, it would read as the end.
                return
            raise _Verdict("terminal_job", f"job {e.job_id!r} is already {job.status}")
        if self._on_end_key:
            # Under a key of its own: the job's records keep its graph and checkpoints
            # (a copy the record carries is not read).
            # The result's graph stays where the birth key holds it: ``born_by`` is kept,
            # so that junk over that key makes the end due (restated whole, graph and all).
            # A job whose birth is due (junk superseded it, or it lies under the job key)
            # holds its graph under no birth key the cleaner keeps: its end is due from
            # here, restated whole under a new end key (the eleventh read's A1: else a log
            # cleaned past the junk read the result without its graph).
            birth_due = self._births_keyed and job is not None and job.live \
                and job.born_by is None and job.graph is not None
            self._end(e.job_id, JobView(
                e.job_id, status, None, job.graph if job is not None else None,
                checkpoints=job.checkpoints if job is not None else EMPTY_CHECKPOINTS,
                reason=e.reason or None, dirty=True,
                ended_by=None if birth_due else e.event_id,
                born_by=job.born_by if job is not None else None))
            return
        if e.schema_version < 2:  # written before results: clean, no graph (as always)
            self._end(e.job_id, JobView(e.job_id, status, None, None,
                                        reason=e.reason or None))
            return
        graph, checkpoints = e.graph, e.checkpoints
        if job is not None:  # the fold's own copy; a differing record's is restated
            if (graph, checkpoints) != (job.graph, job.checkpoints):
                self._restate = True
            graph, checkpoints = job.graph, job.checkpoints
        else:  # taken whole
            checkpoints = _taken_whole(checkpoints)
        self._end(e.job_id, JobView(e.job_id, status, None, graph, checkpoints=checkpoints,
                                    reason=e.reason or None, dirty=True))

    def _end(self, job_id: str, view: JobView) -> None:
        """Set a terminal job's result. One whose end is not under an end key (written by a
        jobreg before ends had keys of their own, on the job key a later record can
        supersede) is due to be restated under one: the key ``<ns>/job/<id>/end/`` stands
        for that in ``unsettled`` until the leader's restatement lands."""
        self._jobs[job_id] = view
        # (rule 8: an ended job's lock key holds nothing, so no commit holds a part there)
        lock = f"{self._prefix}job/{job_id}/lock"
        if lock in self._call_members:
            del self._call_members[lock]
        due = f"{self._prefix}job/{job_id}/end/"
        if view.ended_by is None:
            if due not in self._unsettled:
                self._unsettled[due] = self._last_offset
        elif due in self._unsettled:
            del self._unsettled[due]

    def _cleaned_up(self, e: JobCleanedUp, job: JobView | None) -> None:
        if e.status not in JobStatus.TERMINAL:
            raise _Verdict("bad_state", f"only a terminal job has a result to clean up, "
                           f"and {e.status!r} is not a terminal status")
        if job is not None and job.live:
            raise _Verdict("job_live", f"job {e.job_id!r} is {job.status}: a live job has no "
                           "result to clean up")
        if job is None and (e.schema_version >= 2 or self._ends_keyed):
            # Ends have keys of their own, which the cleaner never empties: a job the fold
            # does not know as ended has no result, whatever the cleaner removed before.
            raise _Verdict("unknown_job", f"job {e.job_id!r} has no recorded end: only an "
                           "ended job has a result to clean up")
        status, reason = e.status, e.reason
        if job is not None:  # the fold's own copy; a differing record's is restated
            if (status, reason) != (job.status, job.reason):
                self._restate = True
            status, reason = job.status, job.reason
        self._end(e.job_id, JobView(e.job_id, status, None, None, reason=reason,
                                    ended_by=job.ended_by if job is not None else None))

    def _reasserted(self, e: JobReasserted, job: JobView | None) -> None:
        aspect = self._aspect
        if aspect in ("lock", "checkpoints", "checkpoint") and job is not None:
            # Off the job's own key a reassertion restates that key's part of a job the
            # fold knows and nothing else: it cannot remove the job, end it or change what
            # the job is (the cleaner keeps each key's newest record, so every other part
            # stands where its own key holds it).
            self._restated_part(e, job, aspect)
            return
        if e.status == JobStatus.ABSENT:  # rule 8: the job does not exist
            if job is not None and not job.live:
                raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}; a "
                               "reassertion cannot make a terminal id unknown")
            if job is not None:
                del self._jobs[e.job_id]
            return
        if e.status not in JobStatus.ALL:
            raise _Verdict("bad_state", f"unknown job status {e.status!r}")
        if job is not None and not job.live and e.status not in JobStatus.TERMINAL:
            raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}; a "
                           "reassertion cannot make it live again")
        if job is not None and job.live and self._aspect == "birth" \
                and e.status not in JobStatus.TERMINAL:
            # Under its own birth key, of a job the fold knows: the birth alone (its graph
            # and limits, which never change; the key now holds it); the lock and the
            # checkpoints stand where their keys hold them. A restatement re-sent as a
            # fresh event has two copies the fold accepts, and the later one, planned
            # before what the term wrote since, must not undo it (only one that brings the
            # job into existence, the cleaner having removed the rest, carries it whole).
            # The key holds the birth now, whichever held it before: so every compacted log
            # names the same birth, also one where a submit the full fold refused reads as
            # the birth (junk over the birth's key, the cleaner past it) until this lands.
            self._jobs[e.job_id] = job._replace(
                graph=e.graph, max_checkpoint_failures=e.max_checkpoint_failures,
                retained_checkpoints=e.retained_checkpoints, born_by=e.event_id)
            if job.born_by != e.event_id:
                self._parts_due(job)
            return
        keyed = self._checkpoints_keyed and job is not None
        # (rule 6: once checkpoint records have keys of their own, a known job's checkpoint
        # state stands on them alone; a restatement elsewhere carries it and is not read)
        checkpoints = job.checkpoints if keyed and job is not None \
            else self._restated_checkpoints(e, job)
        if e.status in JobStatus.TERMINAL:
            # A result's checkpoints are the job's when it ended and never grow after (every
            # checkpoint record of an ended job is refused): a reassertion restating a result
            # carries them as its writer's fold has them, and they are taken. (After the
            # cleaner removed an end under the job's key, a refused checkpoint record there
            # read as accepted; the restatement undoes it.)
            # (So also once checkpoint records have keys of their own: a result's state
            # never changes, so every honest restatement carries the fold's, and where junk
            # removed the end in a log cleaned past it, a checkpoint record the full fold
            # refused terminal_job may have been taken for a live job: this undoes it. The
            # eighth adversarial read, H2.)
            checkpoints = _taken_whole(e.checkpoints)
            # A clean result never becomes dirty again (its graph and checkpoints were
            # deleted): a restatement planned before the cleanup restates it clean.
            dirty = e.dirty and (job is None or job.live or job.dirty)
            # Under an end key it is the job's end (rule 5: a restated one, or a job ended
            # before ends had keys of their own), if read alone it gives the result the fold
            # has (not a dirty one made clean since: junk over the end that holds the clean
            # result must make the end due); elsewhere it keeps the end the fold knows.
            ended_by = e.event_id if self._on_end_key and dirty == e.dirty else (
                job.ended_by if job is not None else None)
            self._end(e.job_id, (
                JobView(e.job_id, e.status, None, e.graph, checkpoints=checkpoints,
                        reason=e.reason, dirty=True, ended_by=ended_by) if dirty
                else JobView(e.job_id, e.status, None, None, reason=e.reason,
                             ended_by=ended_by)))
        else:
            # Under its own birth key it is the job's birth (a restated one); elsewhere it
            # keeps the birth the fold knows.
            born_by = e.event_id if self._aspect == "birth" else (
                job.born_by if job is not None else None)
            self._jobs[e.job_id] = JobView(e.job_id, e.status, e.owner_epoch, e.graph,
                                           e.error, e.max_checkpoint_failures,
                                           e.retained_checkpoints, checkpoints,
                                           born_by=born_by)

    def _restated_checkpoints(self, e: JobReasserted, job: JobView | None) -> CheckpointState:
        """The checkpoint state after a reassertion: the one it carries, unless it is older
        in ``seq`` than the fold's: a reassertion planned before a checkpoint record that
        landed first, a late copy of one, a raw one. Then the fold's, and the key is
        restated: a stale reassertion never undoes an accepted checkpoint record, not even
        a failure or a discard that adds no id (rule 6). After the cleaner a refused record
        whose earlier records are gone is taken with the ``seq`` its writer gave it (the
        jump); the leader's restatement carries a ``seq`` at least that high
        (``Image.checkpoint_floors``, :func:`registry.fold.plan_reassertions`), so it wins
        in every compacted log as in the full one. (Until this rule a state older in
        ``seq`` whose ids were not older was taken: tests/unit/test_stale_restatement_issue42.)"""
        carried, cur = e.checkpoints, job.checkpoints if job is not None else None
        if cur is None or carried.seq >= cur.seq:
            return _taken_whole(carried)
        self._restate = True
        return cur

    def _restated_part(self, e: JobReasserted, job: JobView, aspect: str) -> None:
        """A reassertion on a known job's lock key (status, owner, error) or checkpoints key
        (the checkpoint state). A record that would remove, end or revive the job there is
        refused; what it carries of the job's other parts is not taken (so, after the
        cleaner, that key's record alone gives what it gave before)."""
        if e.status == JobStatus.ABSENT:
            raise _Verdict("job_exists", f"job {e.job_id!r} exists: a reassertion on its "
                           f"{aspect} key cannot remove it (only one on its own key can)")
        if e.status not in JobStatus.ALL:
            raise _Verdict("bad_state", f"unknown job status {e.status!r}")
        if not job.live:
            if e.status not in JobStatus.TERMINAL:
                raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}; a "
                               "reassertion cannot make it live again")
            if aspect == "checkpoints" and job.dirty:
                # A dirty result's checkpoints are the job's when it ended, which its end
                # (under an end key) carries no copy of: they stand where the checkpoints
                # key holds them, restated there when a refused record lands on it.
                self._jobs[e.job_id] = job._replace(checkpoints=_taken_whole(e.checkpoints))
            elif aspect == "checkpoint" and job.dirty:
                # (the same under a checkpoint record's key: restated there when the record
                # that held them is gone; never older than the fold's)
                self._jobs[e.job_id] = job._replace(
                    checkpoints=self._restated_checkpoints(e, job))
            return  # the rest of a terminal job's result lies under its end and birth keys
        if e.status in JobStatus.TERMINAL:
            raise _Verdict("bad_state", f"job {e.job_id!r} is {job.status}: a reassertion on "
                           f"its {aspect} key cannot end it (an end lies under an end key)")
        self._jobs[e.job_id] = (
            job._replace(status=e.status, owner_epoch=e.owner_epoch, error=e.error)
            if aspect == "lock" else job._replace(checkpoints=self._restated_checkpoints(e, job)))

    @staticmethod
    def _live(e: JobEvent, job: JobView | None) -> JobView:
        if job is None:
            raise _Verdict("unknown_job", f"job {e.job_id!r} was never submitted")
        if not job.live:
            raise _Verdict("terminal_job", f"job {e.job_id!r} is {job.status}")
        return job

    # The lock records (adopt, release, recovery failed) each set the whole lock
    # aspect of the job, and none checks who holds the lock now: fencing
    # already limits them to the current leader, and a precondition on the
    # lock key's earlier records would flip once the cleaner removed them.
    def _adopted(self, e: JobAdopted, job: JobView | None) -> None:
        job = self._live(e, job)
        self._jobs[e.job_id] = job._replace(status=JobStatus.ACTIVE, owner_epoch=e.epoch,
                                            error=None)

    def _recovery_failed(self, e: JobRecoveryFailed, job: JobView | None) -> None:
        job = self._live(e, job)
        self._jobs[e.job_id] = job._replace(status=JobStatus.RECOVERY_FAILED, owner_epoch=None,
                                            error=e.error)

    def _released(self, e: JobLockReleased, job: JobView | None) -> None:
        # Unowned and ACTIVE, whatever the lock held: of a job whose recovery failed, a
        # release hands it to the next recovery. (It was refused there once, on the lock
        # key's earlier record, which the cleaner removes: issue 42.)
        job = self._live(e, job)
        self._jobs[e.job_id] = job._replace(status=JobStatus.ACTIVE, owner_epoch=None,
                                            error=None)

    def _checkpoint(self, e: CheckpointEvent, job: JobView | None) -> str | None:
        job = self._live(e, job)
        cur = job.checkpoints
        seq = e.state.seq
        if seq > cur.seq + 1:
            # The key's earlier records were compacted away: the record carries the state.
            # Its writer's view held everything the fold has of the job (the fold's state
            # comes from records before it), so an honest one never takes ids back and
            # triggers only a newer id: a record that does is refused, compacted or not.
            # (Only in a log a jobreg that keeps ids leads: the older rule's states, which a
            # log before it holds, let ids go back.)
            if self._ends_keyed and (
                    e.state.newest_id < cur.newest_id
                    or e.state.last_completed < cur.last_completed
                    or (isinstance(e, CheckpointTriggered) and e.checkpoint_id <= cur.newest_id)):
                raise _Verdict("checkpoint_id_not_increasing", f"checkpoint record {seq} of "
                               f"job {e.job_id!r} carries state {e.state}, which takes the "
                               f"job's checkpoint ids back from {cur}")
            error = rescale_error(e.checkpoint_id, e.state.requirements) \
                if isinstance(e, JobRescaled) else requirements_error(e.state.requirements)
            if error is not None:
                raise _Verdict("bad_requirements", error)
            self._jobs[e.job_id] = job._replace(checkpoints=e.state)
            return None
        if seq <= cur.seq:
            raise _Verdict("stale_checkpoint_seq", f"checkpoint record {seq} of job "
                           f"{e.job_id!r} follows record {cur.seq}; expected {cur.seq + 1}")
        try:
            failed = e if isinstance(e, CheckpointFailed) else None
            step = functools.partial(
                checkpoint_step, cur, type(e), e.checkpoint_id,
                location=getattr(e, "location", ""),
                retained=checkpoints_retained(getattr(e, "retained", 0),
                                             job.retained_checkpoints),
                failure_reason=getattr(e, "failure_reason", "UNSPECIFIED"),
                counts=recorded_counts(failed) if failed else None,
                legacy=failed is not None and e.schema_version < 2,
                requirements=e.state.requirements)
            new, why = step()
            if new != e.state and not self._ends_keyed:
                # A state as a jobreg before ids were kept computed it; never once a grant
                # of a jobreg that keeps them was accepted (grants are never compacted away,
                # so that point is the same in every compacted log): the old rule lets an
                # id go back and be triggered twice.
                with contextlib.suppress(CheckpointRuleViolation):
                    older, older_why = step(keep_ids=False)
                    if older == e.state:
                        new, why = older, older_why
        except CheckpointRuleViolation as v:
            raise _Verdict(v.reason, v.detail) from None
        if new != e.state:
            raise _Verdict("checkpoint_state_mismatch", f"the record carries checkpoint state "
                           f"{e.state}, the fold computes {new}")
        self._jobs[e.job_id] = job._replace(checkpoints=new)
        return why

    # -- rule 8: calls -----------------------------------------------------------

    def _commit(self, e: CallCommitted, record: LogRecord) -> Decision:
        self._fence(e)
        members = [(r, self._member(r)) for r in self._calls.pop(e.event_id, ())]
        # A call the cleaner left fewer records of is decided all or none over the present
        # ones once every refusal that sinks a call rests on facts under keys of their own
        # (births and ends: a grant of layout 1); before, each present record alone.
        complete = len(members) >= e.size
        whole = complete or self._births_keyed
        saved: dict[str, JobView | None] = {}
        verdicts: list[_Verdict | None] = []
        sink: int | None = None
        for i, (_, m) in enumerate(members):
            saved.setdefault(m.job_id, self._jobs.get(m.job_id))
            self._record_key = members[i][0].key
            try:
                if i >= e.size:
                    raise _Verdict("call_size_mismatch", f"call {e.event_id} has more records "
                                   f"than the {e.size} its commit names")
                self._apply(m)
                verdicts.append(None)
            except _Verdict as v:
                verdicts.append(v)
                if whole and v.reason != "unknown_job":
                    sink = i
                    break
        if sink is not None:  # all or none: undo what the records before the sink did
            for job_id, view in saved.items():
                if view is None:
                    if job_id in self._jobs:
                        del self._jobs[job_id]
                else:
                    self._jobs[job_id] = view
            r, m = members[sink]
            refused = verdicts[sink]
            assert refused is not None
            why = (f"call {e.event_id} is refused as a whole: its record at offset {r.offset} "
                   f"({m.TYPE} of job {m.job_id!r}) was refused: {refused.reason}: "
                   f"{refused.detail}")
            for i, (r, m) in enumerate(members):
                own = verdicts[sink] if i == sink else _Verdict("call_aborted", why)
                self._resolve(r, m, own)
            d = Decision(record.offset, Outcome.REJECTED, record.timestamp, _key(record),
                         e.TYPE, e.event_id, None, e.epoch, e.writer, "call_aborted", why,
                         None, None, self.leader)
            self._rejected.append(d)
            return d
        for (r, m), verdict in zip(members, verdicts, strict=True):
            self._resolve(r, m, verdict)
            member_key = _key(r)
            if verdict is None and member_key is not None and _key(record) is not None:
                # the member's key holds a part of its job while this commit stands
                self._call_members[member_key] = _key(record)  # type: ignore[assignment]
        detail = "" if complete else (
            f"{len(members)} of the call's {e.size} records are in the log (the cleaner "
            f"removed the others): {'all or none' if whole else 'each decided alone'}")
        return Decision(record.offset, Outcome.ACCEPTED, record.timestamp, _key(record), e.TYPE,
                        e.event_id, None, e.epoch, e.writer, None, detail, None, None,
                        self.leader)

    def _note_call_keys(self, key: str, kind: str, decision: Decision) -> None:
        """Rule 8 under compaction: a record over a member's key (a birth or a lock key)
        supersedes the member, and nothing stands on its call's commit there any more. A
        record over a commit's key that is not the commit (junk, a tombstone, a misplaced
        event) supersedes the commit: in a log cleaned past it the call's members wait for
        a commit that is gone and are never applied, so every part of a job an accepted
        member holds is due, exactly as if that record had landed on the member's own key
        (a birth due, restated under a new birth key, with the lock and checkpoints after
        it; a dirty result's end due; a live job's lock restated). Without this, junk over
        a committed ``submit_many``'s commit lost both acknowledged jobs (issue 42, the
        eleventh read's A3). A duplicate is a copy of what the key held."""
        if decision.outcome == Outcome.DUPLICATE:
            return
        if key in self._call_members:
            del self._call_members[key]
        if kind != "call" or decision.outcome == Outcome.ACCEPTED:
            return
        members = self._call_members.finish()
        held = sorted(k for k, c in members.items() if c == key)
        self._call_members = members.mutate()
        # as junk on the member's key: no event (a misplaced copy of the member itself on
        # the commit's key is no copy of what the member's key holds)
        junk = decision._replace(event_id=None, outcome=Outcome.QUARANTINED)
        for member_key in held:
            del self._call_members[member_key]
            parsed = parse_key(member_key)
            if parsed is not None and parsed.job_id is not None:
                self._note_settlement(member_key, parsed.job_id, junk)

    def _forget(self, event_id: str, key: str | None, value: bytes | None) -> None:
        """Rule 1: forget a record refused after it was remembered (a call's member, refused
        at its commit or at the next grant), so that a verbatim copy of it is decided by the
        rules at its own position, as every log the cleaner passed decides it. Only if it
        is the record remembered: one with the id and key of an earlier record but other
        bytes was never remembered, and the earlier one stays (the fifteenth read's G3)."""
        seen_as = f"{event_id}\x00{key}"
        crc = zlib.crc32(value or b"")
        for ids in self._windows.values():
            if ids.get(seen_as) == crc:
                del ids[seen_as]

    def _end_call(self, call_id: str, reason: str, detail: str,
                  verdict: _Verdict | None = None) -> None:
        """Refuse every waiting record of a call that can no longer be committed."""
        for r in self._calls.pop(call_id, ()):
            m = self._member(r)
            self._resolve(r, m, _Verdict(reason, detail, verdict.expected if verdict else None,
                                         verdict.actual if verdict else None))

    def _member(self, r: LogRecord) -> JobEvent:
        """A call member's event: kept from its replay in this delta, else decoded again
        (it waited in the image across batches, which keeps records, not events)."""
        e = self._members.pop(r.offset, None)
        return e if e is not None else self._decode(r.value)  # type: ignore[arg-type,return-value]

    def _resolve(self, r: LogRecord, m: JobEvent, v: _Verdict | None) -> None:
        key = _key(r)
        if v is None:
            d = Decision(r.offset, Outcome.ACCEPTED, r.timestamp, key, m.TYPE, m.event_id,
                         m.job_id, m.epoch, m.writer, None, _said(m), None, None, self.leader)
        else:
            d = Decision(r.offset, Outcome.REJECTED, r.timestamp, key, m.TYPE, m.event_id,
                         m.job_id, m.epoch, m.writer, v.reason, v.detail, v.expected, v.actual,
                         self.leader)
            self._rejected.append(d)
            self._forget(m.event_id, key, r.value)  # rule 1: a refused record is not remembered
        if key is not None:
            self._note_settlement(key, m.job_id, d, member=True)
        self.resolved.append((r, d, m))


_PENDING = object()  # a rule's answer for a record that waits for its call's commit

_SAYS: dict[type[Event], str] = {
    LeadershipRevoked: "reason", JobCancelled: "reason", JobTerminated: "reason",
    JobRestarted: "reason", CheckpointDiscarded: "reason", JobRecoveryFailed: "error",
}


def _said(event: Event) -> str:
    """The ``detail`` of an accepted record: what its writer said about it, for people (the
    reason given to a cancel, a terminate, a revoke, a restart, a discard; a recovery's
    error; a checkpoint failure's reason; the leader information published), or ``""``."""
    if isinstance(event, CheckpointFailed):
        return f"{event.failure_reason}: {event.reason}" if event.reason \
            else event.failure_reason
    if isinstance(event, LeaderInformationPublished):
        return (f"{event.component}: deleted" if event.address is None
                else f"{event.component}: session {event.session} at {event.address}")
    field = _SAYS.get(type(event))
    said = getattr(event, field) if field is not None else None
    return f"{field}: {said}" if said else ""


def _removes_a_record(event: Event, key: str | None) -> bool:
    """Whether ``key`` is a birth or an end key of a reassertion's job with status
    ``ABSENT``: the leader's removal of the record that key holds (rule 8's refused call's
    submit, rule 5's refused end of a job whose end lay under its job key)."""
    if not isinstance(event, JobReasserted) or event.status != JobStatus.ABSENT or key is None:
        return False
    parsed = parse_key(key)
    return (parsed is not None and parsed.kind in ("birth", "end")
            and parsed.namespace == event.namespace and parsed.job_id == event.job_id)


def _key(record: LogRecord) -> str | None:
    return record.key.decode("utf-8") if record.key is not None else None


_RULES: dict[type[Event], Callable[[Delta, Any, LogRecord], Any]] = {
    LeadershipGranted: Delta._grant,
    LeadershipRevoked: Delta._revoked,
    LeaseRenewed: Delta._renewed,
    LeaderInformationPublished: Delta._published,
    CallCommitted: Delta._commit,
    JobSubmitted: Delta._job_write,
    JobAdopted: Delta._job_write,
    JobRecoveryFailed: Delta._job_write,
    JobLockReleased: Delta._job_write,
    JobCancelled: Delta._job_write,
    JobTerminated: Delta._job_write,
    JobReasserted: Delta._reassertion,
    JobCleanedUp: Delta._job_write,
    CheckpointTriggered: Delta._job_write,
    CheckpointCompleted: Delta._job_write,
    CheckpointFailed: Delta._job_write,
    CheckpointDiscarded: Delta._job_write,
    JobRestarted: Delta._job_write,
    JobRescaled: Delta._job_write,
}
"""Event type -> its rule: the one statement of what a record of that type does."""

_EFFECTS: dict[type[Event], Callable[[Delta, Any, JobView | None], str | None]] = {
    JobSubmitted: Delta._submitted,
    JobAdopted: Delta._adopted,
    JobRecoveryFailed: Delta._recovery_failed,
    JobLockReleased: Delta._released,
    JobCancelled: Delta._ended,
    JobTerminated: Delta._ended,
    JobReasserted: Delta._reasserted,
    JobCleanedUp: Delta._cleaned_up,
    CheckpointTriggered: Delta._checkpoint,
    CheckpointCompleted: Delta._checkpoint,
    CheckpointFailed: Delta._checkpoint,
    CheckpointDiscarded: Delta._checkpoint,
    JobRestarted: Delta._checkpoint,
    JobRescaled: Delta._checkpoint,
}
"""Job event type -> the effect of an accepted (fenced) record on the job."""
