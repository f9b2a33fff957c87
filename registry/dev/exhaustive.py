"""The bounded checker of the pure rules (issue 42, "Exhaustive, not sampled").

It enumerates *every* history up to a bound over a small, explicit alphabet of operations
(:class:`Alphabet`): claims of two contenders from a current or a stale view, the leader's
client writes (single records and calls of several), a deposed leader's (zombie's) writes,
raw records of every event type at every epoch that exists (current, stale, future) under
the leader's or another writer's name, on the type's own key or a wrong key of the same job,
garbage and tombstones (also over the key that holds a job's birth, its end, or the record its
checkpoint state stands on), verbatim re-sends of earlier client records, calls without their
commit; after each op that is not the leader's own write, the leader settles (reasserts and
collects the checkpoint records no state stands on, as ``Term.reassert()``) or does not (a
leaderless stretch). Every write is built by the same
pure code the client uses (the event classes, :func:`registry.events.as_call`,
:func:`registry.fold.checkpoint_step`, :func:`registry.fold.plan_reassertions`) and encoded
by the codec; event ids are positional (the record's index in the log), so a run is
reproducible to the byte.

For every history and every prefix of it (record by record) it tries every compaction cut
``c`` the cleaner may make: ``c`` runs up to the lag bound of README assumption 1 (a record
that is the newest of an *unsettled* key is younger than ``min.compaction.lag.ms``, so no
cut passes it; a cut legal at an earlier prefix stays legal: the cleaner ran then; a stretch
begun by a verbatim copy the fold took as a duplicate bounds the cut just past the first
copy, which it followed within the duplicate window, far below the lag). The
compacted log keeps a record before ``c`` only if it is the newest of its key there
(tombstones dropped) and everything from ``c`` on. It asserts on each:

* ``answer``: ``fold(compacted).answer() == fold(log).answer()`` (the property tests'
  comparison: jobs with every field, epoch, leader, revoked, leader information);
* ``refusal_accepted``: no record the full fold REJECTED is ACCEPTED by the compacted fold
  (call members: their decision at their commit); ``ignored_accepted`` (IGNORED by the full
  fold, ACCEPTED after compaction) is counted apart and is not a failure;
* ``monotone``: along every fold (full and compacted) the epoch never decreases, and for
  every job (while it is known and not cleaned up) neither does the highest checkpoint id
  triggered nor the last completed one;
* ``batch``: the fold in one batch equals the fold in two batches split at every position
  (through :func:`registry.fold.fold_batches`) and the fold one record at a time (the whole
  image).

Symmetric histories are generated once (job and contender names are used in order: ``b``
only after ``a``, ``jm-2`` only after ``jm-1``; writers and epochs of raw records are
relative to the leader and the epoch), an op that writes nothing is dropped (the client
refused it before writing), and a history whose prefix already broke an assertion is not
extended. The result (:class:`Report`) counts histories, prefixes, cuts (and the distinct
compacted logs among them) and batch splits, and keeps for every counterexample class
(assertion, event type, reasons) the smallest reproducer: its ops and its cut.

``jobreg exhaustive`` runs it; ``tests/unit/test_exhaustive.py`` runs the CI bound.
Hypothesis (``tests/unit/test_fold_properties.py``) stays for long histories.

The model, where it is narrower than the brokers:

* every record lands in one duplicate window (a re-send is always a duplicate), and no
  transaction aborts (read_committed readers and the cleaner never see aborted records;
  the property tests draw both);
* a prefix ends where a write ends (a Term write is one transaction: readers and the cleaner,
  which stops at the last stable offset, see all of it or nothing); the cut itself may fall
  anywhere, also inside an earlier write;
* the leader writes from an image that has read the whole log; a zombie from what it read
  last (a write planned from an older image by the leader itself, finding 2, appears only
  as raw records under the leader's name);
* tombstones before the cut are dropped at once (Kafka keeps them ``delete.retention.ms``
  longer: a state the model also reaches with a shorter cut);
* the symmetric histories left out (``b`` before ``a``, ``jm-2`` before ``jm-1``) are the same
  histories up to names, except that the leader reasserts keys in sorted order;
* ids are rewritten after the pure code made them (``as_call``, ``plan_reassertions``: random
  ids, wall-clock stamps): positional ids, stamps 0.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import immutables

from registry.events import (
    EMPTY_CHECKPOINTS,
    LAYOUT,
    UNKNOWN_CHECKPOINT,
    CallCommitted,
    CheckpointCompleted,
    CheckpointDiscarded,
    CheckpointEvent,
    CheckpointFailed,
    CheckpointState,
    CheckpointTriggered,
    Event,
    InlineGraph,
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
    as_call,
)
from registry.fold import (
    CheckpointRuleViolation,
    Delta,
    checkpoint_step,
    failure_reason_counts,
    fencing_reason,
    fold,
    fold_batches,
    plan_collection,
    plan_reassertions,
)
from registry.image import Decision, Image, LogRecord, Outcome
from registry.keys import (
    birth_key,
    checkpoint_key,
    checkpoints_key,
    end_key,
    job_key,
    lock_key,
    record_key,
)
from registry.wire import default_codec
from registry.writes import _own_key

__all__ = [
    "ALPHABETS",
    "JUNK_TYPES",
    "Alphabet",
    "Counterexample",
    "Report",
    "check_history",
    "compacted_indices",
    "explore",
    "format_report",
    "histories",
    "only_junk_classes",
    "replay_history",
]

NS = "prod"
CONTENDERS = ("jm-1", "jm-2")
JOB_NAMES = ("a", "b")
T0 = 1_000_000  # the broker stamp of the first record (ms); one more per record: one window

# -- the alphabet ---------------------------------------------------------------------------

CLIENT_COMMANDS = ("submit", "cancel", "finish", "fail", "clean", "adopt", "release",
                   "recfail", "trigger", "complete", "cpfail", "cpskip", "discard", "restart",
                   "rescale", "submit_many", "adopt_many", "revoke", "renew", "publish")
"""The leader's (and a zombie's) client writes, as :class:`registry.client.Term` makes them."""

RAW_TYPES = ("JobSubmitted", "JobCancelled", "JobTerminated", "JobCleanedUp", "JobAdopted",
             "JobLockReleased", "JobRecoveryFailed", "JobReasserted", "CheckpointTriggered",
             "CheckpointCompleted", "CheckpointFailed", "CheckpointDiscarded", "JobRestarted",
             "JobRescaled", "LeadershipGranted", "LeadershipRevoked", "LeaseRenewed",
             "LeaderInformationPublished", "CallCommitted", "garbage", "tombstone")
"""Every event type a raw writer may write, and two records that are no event."""

JUNK_TYPES = ("garbage", "tombstone", "copy")
"""The raw records written over a key that holds a part of a job (``junk_keys``): garbage,
a tombstone, and ``copy``, a verbatim copy of the raw writer's own newest record (under
another key) over this key: a record whose event id the fold has seen, which is no copy of
what this key held (the twelfth read's D1b-D2). A copy of another writer's record is outside
README assumption 3 (the cleaner can remove the first copy and let the misplaced one act
first), so the checker writes none.
``copy`` is in no alphabet's ``raw_types`` but ``calls`` and ``copies``."""


@dataclass(frozen=True)
class Alphabet:
    """What the histories are made of (the bound is ``depth`` ops of it)."""

    name: str
    jobs: int = 2
    commands: tuple[str, ...] = CLIENT_COMMANDS
    zombie_commands: tuple[str, ...] = CLIENT_COMMANDS
    checkpoint_ids: tuple[int, ...] = (1, 2)
    raw_types: tuple[str, ...] = RAW_TYPES
    raw_epochs: tuple[str, ...] = ("current", "stale", "future")
    raw_writers: tuple[str, ...] = ("leader", "other")
    raw_keys: tuple[str, ...] = ("own", "wrong")
    # garbage and tombstones also over the key that holds a job's birth, its end, its
    # checkpoint state, or the newest record that held that state before ("former")
    junk_keys: tuple[str, ...] = ("birth", "end", "checkpoint", "former")
    stale_claims: bool = True
    # raw checkpoint records also from a view without the job's checkpoint records (key
    # "stale" in the op: on the own key, seq and state as the submit left them), and a
    # restatement of a job with the checkpoint state before its newest checkpoint record
    # (on its checkpoints key)
    stale_checkpoints: bool = True
    duplicates: bool = True
    torn_calls: bool = True
    max_raw: int | None = None  # raw records per history (None: no limit)
    max_claims: int | None = None  # claims per history

    def with_jobs(self, jobs: int) -> Alphabet:
        return dataclasses.replace(self, jobs=jobs)


_CHECKPOINT_COMMANDS = ("trigger", "complete", "cpfail", "cpskip", "discard")

ALPHABETS: dict[str, Alphabet] = {
    # CI: the client commands (but fail, renew, publish), every raw type at the current
    # epoch under the leader's name (the writes the fold does not fence: where the rules
    # decide) on the own and a wrong key, one raw record per history; fenced writes come
    # from zombies (stale epochs) and from raw records before the first claim (no leader).
    "ci": Alphabet("ci", commands=("submit", "cancel", "finish", "clean", "adopt", "release",
                                   "recfail", "trigger", "complete", "cpfail", "cpskip",
                                   "discard", "restart", "rescale", "submit_many",
                                   "adopt_many", "revoke"),
                   zombie_commands=("submit", "cancel", "clean", "adopt", "trigger"),
                   checkpoint_ids=(1,), raw_epochs=("current",), raw_writers=("leader",),
                   max_raw=1, max_claims=2),
    # Everything of the brief at once: grows fast, for `jobreg exhaustive --alphabet full`.
    "full": Alphabet("full"),
    # Between the two: all raw epochs and writers, one raw record per history.
    "wide": Alphabet("wide", checkpoint_ids=(1, 2), max_raw=1, max_claims=2),
    # Narrow and deep, for the subtree below an ended job (``--below``): one job, the
    # commands that meet an end, junk over its birth, end and checkpoint keys, two raw
    # records, re-sends (late first copies). The tenth adversarial read's alphabet: a late
    # first copy of an end after junk over the end needs six ops (issue 42, J1-J3).
    "ends": Alphabet("ends", jobs=1,
                     commands=("submit", "cancel", "finish", "fail", "clean", "adopt",
                               "release", "recfail", "trigger", "complete", "cpfail",
                               "discard", "restart"),
                     zombie_commands=("cancel", "trigger", "complete", "adopt"),
                     checkpoint_ids=(1, 2),
                     raw_types=("garbage", "tombstone", "CheckpointDiscarded", "JobReasserted",
                                "JobCancelled", "JobTerminated", "CheckpointTriggered",
                                "CheckpointCompleted", "JobCleanedUp", "JobSubmitted",
                                "JobAdopted"),
                     raw_epochs=("current",), raw_writers=("leader",), raw_keys=("own", "wrong"),
                     junk_keys=("birth", "end", "checkpoint", "former"), stale_claims=True,
                     stale_checkpoints=True, duplicates=True, torn_calls=False, max_raw=2,
                     max_claims=2),
    # Calls under junk, for the subtree below a committed call (``--below``): two jobs, the
    # calls and the commands that meet their members' parts, junk over the newest call's
    # commit and over a job's birth, end and checkpoint keys, two raw records, re-sends.
    # The eleventh adversarial read's A3 (junk over a committed submit_many's commit).
    "calls": Alphabet("calls", jobs=2,
                      commands=("submit", "cancel", "finish", "clean", "adopt", "release",
                                "recfail", "trigger", "complete", "submit_many",
                                "adopt_many"),
                      zombie_commands=("cancel", "adopt", "trigger"),
                      checkpoint_ids=(1,),
                      raw_types=("garbage", "tombstone", "copy", "JobSubmitted", "JobAdopted",
                                 "CallCommitted", "JobReasserted"),
                      raw_epochs=("current",), raw_writers=("leader",), raw_keys=("own",),
                      junk_keys=("call", "birth", "end", "checkpoint"), stale_claims=True,
                      stale_checkpoints=False, duplicates=True, torn_calls=True, max_raw=2,
                      max_claims=2),
    # Checkpoint records under junk, for the subtree below a submitted job (``--below``): one
    # job, the checkpoint commands and rescales, a zombie's, junk over the record the state
    # stands on, two raw records at the current epoch (a stale rescale, a trigger again, a
    # restatement), re-sends. The twentieth adversarial read's H1 (junk, a refused record,
    # then the leader's next write) needs six ops and two raw records.
    "checkpoints": Alphabet("checkpoints", jobs=1,
                            commands=("submit", "trigger", "complete", "restart", "rescale",
                                      "cancel", "clean", "cpfail", "discard"),
                            zombie_commands=("rescale", "trigger", "complete"),
                            checkpoint_ids=(1, 2),
                            raw_types=("garbage", "tombstone", "copy", "JobRescaled",
                                       "JobReasserted", "CheckpointCompleted",
                                       "CheckpointTriggered"),
                            raw_epochs=("current",), raw_writers=("leader",), raw_keys=("own",),
                            junk_keys=("birth", "end", "checkpoint", "former"),
                            stale_claims=True, stale_checkpoints=True, duplicates=True,
                            torn_calls=False, max_raw=2, max_claims=2),
}
# The ``ends`` alphabet with verbatim copies over the keys that hold a job's parts (the
# twelfth adversarial read's D1-D2: a duplicate by event id under another record's key), and
# a raw writer's own records re-sent under their keys, accepted (the thirteenth's E8-E11) or
# refused (the fourteenth's F3: a cleanup before the cancel, a restart before the submit).
ALPHABETS["copies"] = dataclasses.replace(
    ALPHABETS["ends"], name="copies",
    junk_keys=("birth", "end", "checkpoint", "home", "same"),
    raw_types=("garbage", "copy", "JobCancelled", "JobSubmitted", "CheckpointCompleted",
               "JobReasserted", "JobCleanedUp", "JobRestarted"))
"""The named alphabets (``jobreg exhaustive --alphabet NAME``)."""

Op = tuple[Any, ...]
"""One op, a tuple of plain values (printable, JSON-able):

* ``("claim", who, "current"|"stale", settle)``
* ``("write", cmd, job, cp)``: the leader's client write (it settles, as the client does)
* ``("zombie", cmd, job, cp, settle)``: a deposed leader's write from its own view
* ``("raw", type, "current"|"stale"|"future", "leader"|"other", job, "own"|"wrong"|"stale",
  settle)`` (``stale``: a checkpoint record from a view without the job's checkpoint records,
  a ``JobReasserted`` on the checkpoints key with the state before the newest checkpoint record;
  garbage and tombstones also ``birth``|``end``: over the key that holds the job's birth, end)
* ``("dup", n, settle)``: a re-send of the n-th client record as the client makes it: a
  record under a key of its own as a fresh event under a fresh key, a call's record with its
  whole call (a call of submits as a fresh call, any other verbatim), any other verbatim
* ``("torn", cmd, job, settle)``: the leader's call without its commit
"""

# -- the log ----------------------------------------------------------------------------------

_CODEC = default_codec()


@dataclass(frozen=True, slots=True)
class Rec:
    """A record of the modelled partition, with its event as read (``None``: no event)."""

    index: int
    key: bytes
    value: bytes | None
    event: Event | None
    client: bool  # written by a client (a re-send of it is a client's retry)
    last: bool = True  # the last record of its write (a transaction, or a plain one)

    @property
    def offset(self) -> int:
        return 2 * self.index  # transaction markers: offsets are not dense

    def log_record(self) -> LogRecord:
        return LogRecord(self.offset, self.key, self.value, T0 + self.index)


def _event_id(index: int) -> str:
    return str(uuid.UUID(int=index + 1))


def _step(image: Image, rec: Rec) -> tuple[Image, list[Decision]]:
    """One record replayed: the image after it and every decision it made (rule 8: the call
    members its commit or grant decided first)."""
    delta = Delta(image, _CODEC, None, {rec.offset: rec.event} if rec.event is not None else None)
    d = delta.replay(rec.log_record())
    return delta.apply(), [r for _, r, _ in delta.resolved] + [d]


def _fold_one_batch(records: Sequence[Rec]) -> Image:
    delta = Delta(Image.empty(NS), _CODEC, None,
                  {r.offset: r.event for r in records if r.event is not None})
    for r in records:
        delta.replay(r.log_record())
    return delta.apply()


@dataclass
class _Actor:
    name: str
    seen: int = 0
    term: int | None = None


class _World:
    """The log, the contenders and the fold of every prefix (one record at a time)."""

    def __init__(self, log: list[Rec], images: list[Image], made: list[list[Decision]],
                 since: list[dict[str, int]], actors: dict[str, _Actor]) -> None:
        self.log = log
        self.images = images  # images[k]: the fold of log[:k]
        self.made = made  # made[k]: the decisions record k made
        # since[k]: each key unsettled in images[k], with the index of the record that began
        # its unsettled stretch (the record the leader has min.compaction.lag.ms to settle)
        self.since = since
        self.actors = actors

    @classmethod
    def empty(cls) -> _World:
        return cls([], [Image.empty(NS)], [], [{}], {c: _Actor(c) for c in CONTENDERS})

    def copy(self) -> _World:
        return _World(list(self.log), list(self.images), list(self.made), list(self.since),
                      {n: dataclasses.replace(a) for n, a in self.actors.items()})

    @property
    def image(self) -> Image:
        return self.images[-1]

    def append(self, key: str | bytes, value: bytes | None, event: Event | None,
               client: bool, last: bool = True) -> None:
        rec = Rec(len(self.log), key.encode() if isinstance(key, str) else key, value, event,
                  client, last)
        self.log.append(rec)
        image, made = _step(self.images[-1], rec)
        self.images.append(image)
        self.made.append(made)
        before = self.since[-1]
        self.since.append({k: before.get(k, self._stretch_start(off // 2))
                           for k, off in image.unsettled.items()})

    def _stretch_start(self, index: int) -> int:
        """Where the lag bound of an unsettled stretch begun by record ``index`` lies: the
        record itself, or, for a verbatim copy the fold took as a duplicate, just past the
        first copy. A duplicate lands within the duplicate window of its first copy
        (``DUPLICATE_WINDOW_MS``, far below the lag): a cut that removes the first copy
        (a record after it, older than the lag, superseding it) is made at least the lag
        after it, when the leader's settling of the second copy, written within moments of
        it, is in the log. So no cut before that settling separates the two copies."""
        first = self.first_copy(index)
        return index if first is None else first + 1

    def first_copy(self, index: int) -> int | None:
        """The index of the copy fold rule 1 took record ``index`` for a duplicate of, if it
        did (``None`` otherwise): the first earlier record of its key with its bytes that was
        not refused by the time ``index`` landed (rule 1 remembers no refused record, and
        forgets a call's member when it is refused at its commit; a raw verbatim copy, read
        as no event here, counts like any other)."""
        made = self.made[index]
        if not made or made[0].outcome != Outcome.DUPLICATE:
            return None
        rec = self.log[index]
        for r in self.log[:index]:
            if r.key != rec.key or r.value != rec.value:
                continue
            verdict = None
            for k in range(r.index, index):
                for d in self.made[k]:
                    if d.offset == r.offset:
                        verdict = d.outcome
            if verdict is not None and verdict not in (Outcome.REJECTED, Outcome.DUPLICATE):
                return r.index
        return None

    def write(self, pairs: list[tuple[str, Event]], client: bool = True) -> None:
        """Append events, each with the positional id of its record (a call's members name
        their commit's)."""
        base = len(self.log)
        ids = {e.event_id: _event_id(base + i) for i, (_, e) in enumerate(pairs)}
        for i, (key, e) in enumerate(pairs):
            changes: dict[str, Any] = {"event_id": _event_id(base + i), "created_at": 0}
            call_id = getattr(e, "call_id", None)
            if call_id is not None:
                changes["call_id"] = ids.get(call_id, call_id)
            renumbered = dataclasses.replace(e, **changes)
            if key == record_key(e):  # keys that hold the id (grants, commits) follow it
                key = record_key(renumbered)
            elif e.event_id in key:  # a restatement under its own birth or end key
                key = key.replace(e.event_id, renumbered.event_id)
            value, read = _CODEC.encode_as_read(renumbered)
            self.append(key, value, read, client, last=i == len(pairs) - 1)

    # -- who is who ---------------------------------------------------------------------
    def leader(self) -> _Actor | None:
        img = self.image
        for a in self.actors.values():
            if a.term is not None and fencing_reason(img.epoch, img.leader, img.revoked,
                                                     a.term, a.name) is None:
                return a
        return None

    def zombie(self) -> _Actor | None:
        lead = self.leader()
        old = [a for a in self.actors.values() if a.term is not None and a is not lead]
        return max(old, key=lambda a: (a.term, a.name)) if old else None

    # -- the client's writes ----------------------------------------------------------------
    def settle(self, who: _Actor, full: bool = True) -> None:
        """``Term.reassert()`` (``full``) and the settling after a write: plan from the
        image, send, at most twice (``Term._settle_once``), the collection (fold rule 6)
        around it: first the records no state stands on of the jobs an unsettled key names,
        then, only with ``full``, every tombstone :func:`registry.fold.plan_collection` plans,
        as ``Term.reassert()`` writes them. The settling after a write (``Term._settle``)
        does nothing while nothing is unsettled, and collects the rest only once
        ``COLLECT_BATCH`` checkpoint records were written: until then a refused record stays
        in the log (the twenty-first read's F2: a model whose every write collected it at
        once never met junk over the record its refusal rests on)."""
        img = self.image
        if who.term is None or fencing_reason(img.epoch, img.leader, img.revoked,
                                              who.term, who.name) is not None:
            return
        if not full and not img.unsettled:
            return
        self.collect(plan_collection(img, first=True))
        for _ in range(2):
            img = self.image
            if fencing_reason(img.epoch, img.leader, img.revoked, who.term,
                              who.name) is not None:
                return
            pairs = plan_reassertions(img, who.term, who.name)
            if not pairs:
                break
            self.write(list(pairs))
            who.seen = len(self.log)
        if full:
            self.collect(plan_collection(self.image))
        who.seen = len(self.log)

    def collect(self, keys: list[str]) -> None:
        """The leader's tombstones (``TermWrites.collect``: one write)."""
        for i, key in enumerate(keys):
            self.append(key, None, None, True, last=i == len(keys) - 1)

    def claim(self, who: _Actor, stale: bool) -> None:
        if not stale:
            who.seen = len(self.log)
        view = self.images[who.seen]
        grant = LeadershipGranted(event_id="g", namespace=NS, epoch=view.epoch + 1,
                                  writer=who.name, created_at=0, prev_epoch=view.epoch,
                                  layout=LAYOUT)
        self.write([(record_key(grant), grant)])
        who.seen = len(self.log)
        img = self.image
        if img.epoch == grant.epoch and img.leader == who.name:
            who.term = grant.epoch
            self.settle(who)  # Term._start()

    def client_write(self, who: _Actor, cmd: str, job: str, cp: int, *, jobs: int,
                     torn: bool = False) -> bool:
        """A Term command of ``who`` from its view (the leader reads to the end first, a
        zombie does not): the reassertions its image plans, then the command's records
        (one transaction), then the settling. False if the client refuses before writing."""
        assert who.term is not None
        view = self.images[who.seen]
        events = _command(view, cmd, job, cp, who.term, who.name, jobs)
        if events is None:
            return False
        call = as_call(events)
        if torn:
            if len(call) < 2:
                return False
            call = call[:-1]
        pairs = list(plan_reassertions(view, who.term, who.name))
        pairs += [(record_key(e), e) for e in call]
        self.write(pairs)
        who.seen = len(self.log)
        self.settle(who, full=False)  # Term._settle: the first collection only
        return True


def _common(epoch: int, writer: str) -> dict[str, Any]:
    return dict(event_id="x", namespace=NS, epoch=epoch, writer=writer, created_at=0)


def _checkpoint(view: Image, kind: str, job: str, cp: int, common: dict[str, Any],
                *, raw: bool = False) -> CheckpointEvent:
    """The checkpoint event a client writes: the state after it by the fold's own rule from
    the view's (a rule violation: the state with the next seq, as the client does). A raw
    one for a job the view does not know starts from the empty state."""
    cls: type[CheckpointEvent] = {"trigger": CheckpointTriggered, "complete": CheckpointCompleted,
                                  "cpfail": CheckpointFailed, "cpskip": CheckpointFailed,
                                  "discard": CheckpointDiscarded, "restart": JobRestarted,
                                  "rescale": JobRescaled}[kind]
    known = view.jobs.get(job)
    before = known.checkpoints if known is not None else EMPTY_CHECKPOINTS
    retained = known.retained_checkpoints if known is not None else 1
    failure_reason = "JOB_FAILOVER_REGION" if kind == "cpskip" else "CHECKPOINT_DECLINED"
    if kind == "restart":
        cp = before.last_completed
    # a rescale's requirements differ from the state's before it (so one undone shows)
    requirements = ((VertexParallelism("0" * 32, 1, 1 + before.seq % 4),)
                    if kind == "rescale" else ())
    if kind == "rescale":
        cp = UNKNOWN_CHECKPOINT
    try:
        state, _ = checkpoint_step(before, cls, cp, location=f"loc-{cp}", retained=retained,
                                   failure_reason=failure_reason, requirements=requirements)
    except CheckpointRuleViolation:
        state = dataclasses.replace(before, seq=before.seq + 1)
    extras: dict[type[CheckpointEvent], dict[str, Any]] = {
        CheckpointCompleted: {"location": f"loc-{cp}"},
        CheckpointFailed: {"reason": "declined", "task": "t", "failure_reason": failure_reason,
                           "reason_counts": failure_reason_counts(failure_reason)},
        CheckpointDiscarded: {"reason": "raw" if raw else "gave up"},
        JobRestarted: {"reason": "over budget"},
        JobRescaled: {"reason": "autoscaler"}}
    extra = extras.get(cls, {})
    return cls(job_id=job, checkpoint_id=cp, state=state, **extra, **common)


def _command(view: Image, cmd: str, job: str, cp: int, epoch: int, writer: str,
             jobs: int) -> list[Event] | None:
    """The events of one client command, or ``None`` where the client refuses before
    writing (an unknown id; a clean of a live job; a call of fewer than two records)."""
    common = _common(epoch, writer)
    names = list(JOB_NAMES[:jobs])
    if cmd == "submit":
        return [JobSubmitted(job_id=job, graph=InlineGraph(f"graph-{job}".encode()), **common)]
    if cmd == "revoke":
        return [LeadershipRevoked(**common)]
    if cmd == "renew":
        return [LeaseRenewed(**common)]
    if cmd == "publish":
        return [LeaderInformationPublished(component="dispatcher", session=f"s{epoch}",
                                           address=f"addr-{writer}", **common)]
    if cmd == "submit_many":
        if len(names) < 2:
            return None
        return [JobSubmitted(job_id=n, graph=InlineGraph(f"graph-{n}".encode()), **common)
                for n in names]
    if cmd == "adopt_many":
        if len(names) < 2 or any(n not in view.jobs for n in names):
            return None
        return [JobAdopted(job_id=n, **common) for n in names]
    known = view.jobs.get(job)
    if known is None:  # Term._known: the client refuses an unknown id
        return None
    if cmd in _CHECKPOINT_COMMANDS or cmd in ("restart", "rescale"):
        return [_checkpoint(view, cmd, job, cp, common)]
    result: dict[str, Any] = {"graph": known.graph, "checkpoints": known.checkpoints}
    if cmd == "cancel":
        return [JobCancelled(job_id=job, reason="cancelled", **result, **common)]
    if cmd == "finish":
        return [JobTerminated(job_id=job, state=JobStatus.FINISHED, **result, **common)]
    if cmd == "fail":
        return [JobTerminated(job_id=job, state=JobStatus.FAILED, reason="boom", **result,
                              **common)]
    if cmd == "clean":
        if known.live:  # Term.mark_clean: ConfigError for a live job
            return None
        return [JobCleanedUp(job_id=job, status=known.status, reason=known.reason, **common)]
    if cmd == "adopt":
        return [JobAdopted(job_id=job, **common)]
    if cmd == "release":
        return [JobLockReleased(job_id=job, **common)]
    if cmd == "recfail":
        return [JobRecoveryFailed(job_id=job, error="no graph", **common)]
    raise ValueError(f"unknown command {cmd!r}")


_LOCK_TYPES = ("JobAdopted", "JobLockReleased", "JobRecoveryFailed")
_CHECKPOINT_TYPES = {"CheckpointTriggered": "trigger", "CheckpointCompleted": "complete",
                     "CheckpointFailed": "cpfail", "CheckpointDiscarded": "discard",
                     "JobRestarted": "restart", "JobRescaled": "rescale"}


def _raw(world: _World, kind: str, epoch_rel: str, writer_rel: str, job: str,
         key_rel: str) -> bool:
    """A writer that ignores fencing and the client's checks."""
    img = world.image
    epoch = {"current": img.epoch, "stale": img.epoch - 1, "future": img.epoch + 1,
             "-": img.epoch}[epoch_rel]
    if epoch < 0:
        return False
    leader = img.leader or CONTENDERS[0]
    writer = leader if writer_rel == "leader" else next(c for c in CONTENDERS if c != leader)
    common = _common(epoch, writer)
    if kind in JUNK_TYPES:
        src: Rec | None = None
        if key_rel == "checkpoint":  # over the key that holds the job's checkpoint state
            rec = img.checkpoint_records.get(job)
            if rec is None or rec.holder is None:
                return False
            key = rec.holder
        elif key_rel == "former":  # over the newest record that held the state before the
            # holder (one no tombstone removed yet: a refusal may rest on it; the twenty-first
            # read's F2)
            rec = img.checkpoint_records.get(job)
            former = [] if rec is None else [k for k, h in rec.keys if h and k != rec.holder]
            if not former:
                return False
            key = former[-1]
        elif key_rel in ("birth", "end"):  # over the key that holds the job's birth (end)
            holder = img.jobs.get(job)
            held = None if holder is None else (holder.born_by if key_rel == "birth"
                                                else holder.ended_by)
            if held is None:
                return False
            key = (birth_key if key_rel == "birth" else end_key)(NS, job, held)
        elif key_rel == "home":  # a copy only: the raw writer's newest misplaced record,
            # again under its own key (one op, whatever ``job``; the twelfth read's D9)
            src = next((r for r in reversed(world.log) if not r.client and r.event is not None
                        and r.key.decode() != record_key(r.event)), None)
            if kind != "copy" or job != JOB_NAMES[0] or src is None or src.event is None:
                return False
            key = record_key(src.event)
        elif key_rel == "same":  # a copy only: the raw writer's newest record, again under
            # its key, verbatim: accepted, a duplicate that moves what it holds later in
            # every compacted log (the thirteenth read's E8-E11); refused, one that a change
            # since may have made acceptable (the fourteenth's F3). One op, whatever ``job``.
            src = next((r for r in reversed(world.log) if not r.client and r.event is not None
                        and world.made[r.index]), None)
            if kind != "copy" or job != JOB_NAMES[0] or src is None:
                return False
            key = src.key.decode()
        elif key_rel == "call":  # over the newest call's commit (one op, whatever ``job``)
            if job != JOB_NAMES[0]:
                return False
            commits = [r.key for r in world.log if isinstance(r.event, CallCommitted)]
            if not commits:
                return False
            key = commits[-1].decode()
        else:
            key = job_key(NS, job) if key_rel == "own" else lock_key(NS, job)
        if kind == "copy" and key_rel in ("home", "same"):
            assert src is not None
            value = src.value
        elif kind == "copy":
            # the raw writer re-sends its own newest record (README assumption 3 leaves
            # that open: it excludes re-sending another writer's) verbatim over this key:
            # within the duplicate window, a record whose id the fold has seen
            value = next((r.value for r in reversed(world.log) if not r.client
                          and r.event is not None and r.key.decode() != key), None)
            if value is None:
                return False
        else:
            value = b"\x00\x00\x00\x00\x63not avro at all" if kind == "garbage" else None
        world.append(key, value, None, False)
        return True
    ev: Event
    if kind == "JobSubmitted":
        ev = JobSubmitted(job_id=job, graph=InlineGraph(b"raw"), **common)
    elif kind == "JobCancelled":
        ev = JobCancelled(job_id=job, reason="raw", **common)
    elif kind == "JobTerminated":
        ev = JobTerminated(job_id=job, state=JobStatus.FINISHED, **common)
    elif kind == "JobCleanedUp":
        ev = JobCleanedUp(job_id=job, status=JobStatus.FINISHED, **common)
    elif kind == "JobAdopted":
        ev = JobAdopted(job_id=job, **common)
    elif kind == "JobLockReleased":
        ev = JobLockReleased(job_id=job, **common)
    elif kind == "JobRecoveryFailed":
        ev = JobRecoveryFailed(job_id=job, error="raw", **common)
    elif kind == "JobReasserted" and key_rel == "stale":
        # A restatement of the job planned before its newest checkpoint record (a group
        # planned while the one before it was in flight; a raw one), on its checkpoints key:
        # the job as the fold has it, with the checkpoint state before that record.
        known = img.jobs.get(job)
        if known is None or not known.live:
            return False
        records = [r.log_record() for r in world.log]
        before = None
        for n in range(len(records) - 1, -1, -1):
            seen = fold(records[:n], NS).jobs.get(job)
            if seen is not None and seen.checkpoints.seq < known.checkpoints.seq:
                before = seen.checkpoints
                break
        if before is None:
            return False
        ev = JobReasserted(job_id=job, status=known.status, owner_epoch=known.owner_epoch,
                           graph=known.graph, error=known.error,
                           max_checkpoint_failures=known.max_checkpoint_failures,
                           retained_checkpoints=known.retained_checkpoints,
                           checkpoints=before, **common)
        world.write([(checkpoint_key(NS, job, ev.event_id), ev)], client=False)
        return True
    elif kind == "JobReasserted":
        ev = JobReasserted(job_id=job, status=JobStatus.ACTIVE, owner_epoch=epoch,
                           graph=InlineGraph(b"raw"), **common)
    elif kind in _CHECKPOINT_TYPES:
        # key "stale": from a view that holds none of the job's checkpoint records (its state
        # the submit's), on the own key
        view = img
        known = img.jobs.get(job)
        if key_rel == "stale":
            if known is None:
                return False
            view = dataclasses.replace(img, jobs=img.jobs.set(job, known._replace(
                checkpoints=EMPTY_CHECKPOINTS)))
            key_rel = "own"
        ev = _checkpoint(view, _CHECKPOINT_TYPES[kind], job, 1, common, raw=True)
    elif kind == "LeadershipGranted":
        if epoch < 1:
            return False
        ev = LeadershipGranted(prev_epoch=epoch - 1, **common)
    elif kind == "LeadershipRevoked":
        ev = LeadershipRevoked(reason="raw", **common)
    elif kind == "LeaseRenewed":
        ev = LeaseRenewed(**common)
    elif kind == "LeaderInformationPublished":
        ev = LeaderInformationPublished(component="dispatcher", session="raw",
                                        address="raw", **common)
    elif kind == "CallCommitted":
        ev = CallCommitted(size=2, **common)
    else:
        raise ValueError(f"unknown raw type {kind!r}")
    own = record_key(ev)
    if key_rel == "own":
        key = own
    elif isinstance(ev, JobEvent):
        key = job_key(NS, job) if kind in _LOCK_TYPES or kind in _CHECKPOINT_TYPES \
            else lock_key(NS, job)
        if kind == "JobReasserted":  # any job key is its own: the wrong one is another job's
            key = checkpoints_key(NS, JOB_NAMES[1] if job == JOB_NAMES[0] else JOB_NAMES[0])
    else:
        key = job_key(NS, job)
    world.write([(key, ev)], client=False)
    return True


# -- applying ops ---------------------------------------------------------------------------


def _apply(world: _World, op: Op, alphabet: Alphabet) -> bool:
    """Apply ``op`` (without its settle flag) to ``world``; False if it writes nothing."""
    kind = op[0]
    before = len(world.log)
    if kind == "claim":
        world.claim(world.actors[op[1]], op[2] == "stale")
    elif kind == "write":
        who = world.leader()
        if who is None:
            return False
        who.seen = len(world.log)
        world.client_write(who, op[1], op[2], op[3], jobs=alphabet.jobs)
    elif kind == "zombie":
        who = world.zombie()
        if who is None:
            return False
        world.client_write(who, op[1], op[2], op[3], jobs=alphabet.jobs)
    elif kind == "torn":
        who = world.leader()
        if who is None:
            return False
        who.seen = len(world.log)
        world.client_write(who, op[1], op[2], 1, jobs=alphabet.jobs, torn=True)
    elif kind == "raw":
        _raw(world, op[1], op[2], op[3], op[4], op[5])
    elif kind == "dup":
        client = [r for r in world.log if r.client and isinstance(r.event, JobEvent)]
        if op[1] >= len(client):
            return False
        r = client[op[1]]
        call_id = getattr(r.event, "call_id", None)
        if call_id is not None:
            # A call's record is re-sent with its call (registry.writes): a call with a
            # record under a key of its own (a submit's birth) as a fresh call (fresh
            # records, keys and commit), any other verbatim, records and commit.
            calls = [c for c in world.log if c.client and c.event is not None and (
                getattr(c.event, "call_id", None) == call_id
                or (isinstance(c.event, CallCommitted) and c.event.event_id == call_id))]
            if r.event is None or r.event.event_id not in r.key.decode():
                for c in calls:
                    world.append(c.key, c.value, c.event, True)
            else:
                base = len(world.log)
                fresh_call = _event_id(base + len(calls) - 1)
                for i, c in enumerate(calls):
                    assert c.event is not None
                    fresh = fresh_call if isinstance(c.event, CallCommitted) \
                        else _event_id(base + i)
                    changes: dict[str, Any] = {"event_id": fresh}
                    if not isinstance(c.event, CallCommitted):
                        changes["call_id"] = fresh_call
                    event = dataclasses.replace(c.event, **changes)
                    value, read = _CODEC.encode_as_read(event)
                    world.append(c.key.decode().replace(c.event.event_id, fresh), value,
                                 read, True)
        elif r.event is not None and _own_key(r.key.decode(), r.event):
            # Under a key of its own (a job's birth or end): the client re-sends a fresh
            # event under a fresh key (registry.writes), so no such key is written twice.
            fresh = _event_id(len(world.log))
            event = dataclasses.replace(r.event, event_id=fresh)
            value, read = _CODEC.encode_as_read(event)
            world.append(r.key.decode().replace(r.event.event_id, fresh), value, read, True)
        else:
            world.append(r.key, r.value, r.event, True)
    else:
        raise ValueError(f"unknown op {op!r}")
    return len(world.log) > before


def _settle_after(world: _World) -> bool:
    """The leader (if any) catches up and reasserts: ``Term.reassert()``. False if it writes
    nothing."""
    who = world.leader()
    if who is None:
        return False
    before = len(world.log)
    who.seen = len(world.log)
    world.settle(who)
    return len(world.log) > before


def _candidates(world: _World, ops: Sequence[Op], alphabet: Alphabet) -> Iterator[Op]:
    """Every op (without settle flag) that may follow ``ops``, symmetric ones once."""
    used_jobs = {o[i] for o in ops for i in range(len(o)) if isinstance(o[i], str)
                 and o[i] in JOB_NAMES}
    if any(o[0] in ("write", "zombie", "torn") and o[1] in ("submit_many", "adopt_many")
           for o in ops):
        used_jobs |= set(JOB_NAMES[:alphabet.jobs])
    jobs = [j for i, j in enumerate(JOB_NAMES[:alphabet.jobs])
            if j in used_jobs or all(p in used_jobs for p in JOB_NAMES[:i])]
    jobs = jobs[:len(used_jobs) + 1]
    used_contenders = {o[1] for o in ops if o[0] == "claim"}
    claims = sum(1 for o in ops if o[0] == "claim")
    if alphabet.max_claims is None or claims < alphabet.max_claims:
        for i, c in enumerate(CONTENDERS):
            if c not in used_contenders and not all(p in used_contenders
                                                    for p in CONTENDERS[:i]):
                continue
            yield ("claim", c, "current")
            if alphabet.stale_claims and world.actors[c].seen < len(world.log):
                yield ("claim", c, "stale")
    leader = world.leader()
    if leader is not None:
        for cmd in alphabet.commands:
            for j in _jobs_of(cmd, jobs):
                for cp in (alphabet.checkpoint_ids if cmd in _CHECKPOINT_COMMANDS else (1,)):
                    yield ("write", cmd, j, cp)
        if alphabet.torn_calls and alphabet.jobs >= 2:
            for cmd in ("submit_many", "adopt_many"):
                if cmd in alphabet.commands:
                    yield ("torn", cmd, JOB_NAMES[0])
    if world.zombie() is not None:
        for cmd in alphabet.zombie_commands:
            for j in _jobs_of(cmd, jobs):
                for cp in (alphabet.checkpoint_ids if cmd in _CHECKPOINT_COMMANDS else (1,)):
                    yield ("zombie", cmd, j, cp)
    raws = sum(1 for o in ops if o[0] == "raw")
    if alphabet.max_raw is None or raws < alphabet.max_raw:
        for kind in alphabet.raw_types:
            for j in jobs:
                for key in alphabet.raw_keys + (("stale",) if (
                        kind in _CHECKPOINT_TYPES or kind == "JobReasserted")
                        and alphabet.stale_checkpoints else ()) + (
                        alphabet.junk_keys if kind in JUNK_TYPES else ()):
                    if kind in JUNK_TYPES:
                        yield ("raw", kind, "-", "-", j, key)
                        continue
                    for epoch in alphabet.raw_epochs:
                        for writer in alphabet.raw_writers:
                            yield ("raw", kind, epoch, writer, j, key)
    if alphabet.duplicates:
        n = sum(1 for r in world.log if r.client and isinstance(r.event, JobEvent))
        for i in range(n):
            yield ("dup", i)


def _jobs_of(cmd: str, jobs: list[str]) -> list[str]:
    """The job names a command is tried with (calls name every job; a revoke, a renewal and
    a publication none: ``-``)."""
    if cmd in ("submit_many", "adopt_many"):
        return [JOB_NAMES[0]]
    if cmd in ("revoke", "renew", "publish"):
        return ["-"]
    return jobs


def _children(world: _World, ops: Sequence[Op],
              alphabet: Alphabet) -> Iterator[tuple[Op, _World]]:
    """Each next op with the world after it (ops that write nothing and ops whose log is a
    sibling's are left out; a settle variant only where the settling writes)."""
    seen: set[tuple[tuple[bytes, ...], tuple[tuple[int, int | None], ...]]] = set()
    for op in _candidates(world, ops, alphabet):
        child = world.copy()
        if not _apply(child, op, alphabet):
            continue
        variants: list[tuple[Op, _World]] = []
        if op[0] == "write":
            variants.append((op, child))
        else:
            settled = child.copy()
            variants.append((op + (False,), child))
            if _settle_after(settled):
                variants.append((op + (True,), settled))
        for o, w in variants:
            sig = (tuple(r.key + b"\x00" + (r.value or b"-") for r in w.log[len(world.log):]),
                   tuple((a.seen, a.term) for a in w.actors.values()))
            if sig in seen:
                continue
            seen.add(sig)
            yield o, w


def histories(depth: int, alphabet: Alphabet | str = "ci", jobs: int | None = None
              ) -> Iterator[tuple[tuple[Op, ...], list[LogRecord]]]:
    """Every history of at most ``depth`` ops of ``alphabet`` that :func:`explore` checks,
    depth first, each with the log it writes: for other judges of the same logs (the fault
    campaign's model of the documented rules is held to the fold on them)."""
    alpha = ALPHABETS[alphabet] if isinstance(alphabet, str) else alphabet
    if jobs is not None:
        alpha = alpha.with_jobs(jobs)
    stack: list[tuple[tuple[Op, ...], _World]] = [((), _World.empty())]
    while stack:
        ops, world = stack.pop()
        if len(ops) >= depth:
            continue
        children = list(_children(world, ops, alpha))
        for op, child in reversed(children):
            path = (*ops, op)
            yield path, [r.log_record() for r in child.log]
            stack.append((path, child))


def replay_history(ops: Sequence[Op], alphabet: Alphabet | str = "full") -> list[LogRecord]:
    """The log a history writes (for a reproducer: ``fold``, ``compact`` and look)."""
    alpha = ALPHABETS[alphabet] if isinstance(alphabet, str) else alphabet
    world = _World.empty()
    for op in ops:
        op = tuple(op)
        settle = op[-1] if op[0] != "write" else False
        base = op[:-1] if op[0] != "write" else op
        _apply(world, base, alpha)
        if settle:
            _settle_after(world)
    return [r.log_record() for r in world.log]


# -- compaction -------------------------------------------------------------------------------


def compacted_indices(keys: Sequence[bytes], tombstones: Sequence[bool], cut: int,
                      length: int) -> tuple[int, ...]:
    """The indices the cleaner keeps of a log of ``length`` records cleaned up to ``cut``:
    before it the newest record of each key (tombstones dropped), from it on every one."""
    newest: dict[bytes, int] = {}
    for i in range(cut):
        newest[keys[i]] = i
    kept = [i for i in range(cut) if newest[keys[i]] == i and not tombstones[i]]
    return tuple(kept) + tuple(range(cut, length))


# -- the checks -------------------------------------------------------------------------------


def _highest(state: CheckpointState) -> int:
    return max([state.last_completed, *state.pending, *state.discarded, *state.counted])


def _monotone(prev: Image, cur: Image) -> str | None:
    """Why ``cur`` (the image one record after ``prev``) goes back, or ``None``."""
    if cur.epoch < prev.epoch:
        return "epoch"
    for job_id, view in cur.jobs.items():
        old = prev.jobs.get(job_id)
        if old is None or (not view.live and not view.dirty):
            continue  # unknown before, or cleaned up: its checkpoints are deleted
        if _highest(view.checkpoints) < _highest(old.checkpoints):
            return "highest_checkpoint_triggered"
        if view.checkpoints.last_completed < old.checkpoints.last_completed:
            return "last_completed_checkpoint"
        ended = set(old.checkpoints.discarded) | set(old.checkpoints.counted)
        if ended & set(view.checkpoints.pending):
            return "a failed or discarded checkpoint pending again"
    return None


def _same_answer(a: Image, b: Image) -> bool:
    return (a.epoch, a.leader, a.revoked) == (b.epoch, b.leader, b.revoked) \
        and a.jobs == b.jobs and a.leaders == b.leaders


def _answer_diff(full: Image, compacted: Image) -> str:
    if (full.epoch, full.leader, full.revoked) != (compacted.epoch, compacted.leader,
                                                   compacted.revoked):
        return "term"
    if full.leaders != compacted.leaders:
        return "leaders"
    fields = set()
    for job_id in set(full.jobs.keys()) | set(compacted.jobs.keys()):
        f, c = full.jobs.get(job_id), compacted.jobs.get(job_id)
        if f is None or c is None:
            fields.add("job set")
        elif f != c:
            fields |= {n for n in f._fields if getattr(f, n) != getattr(c, n)}
    return "+".join(sorted(fields))


@dataclass(frozen=True)
class Counterexample:
    """The smallest reproducer of one class: its ops, the prefix (records) it was checked
    at and the cut (``None`` for the checks of the uncompacted log)."""

    assertion: str
    klass: str
    ops: tuple[Op, ...]
    records: int
    cut: int | None
    detail: str

    def size(self) -> tuple[int, int, int, int, str]:
        """Smaller is simpler: fewer ops, fewer raw ones (a client's history convinces
        more), fewer records, an earlier cut."""
        return (len(self.ops), sum(1 for o in self.ops if o[0] == "raw"), self.records,
                self.cut or 0, repr(self.ops))

    def as_dict(self) -> dict[str, Any]:
        return {"assertion": self.assertion, "class": self.klass,
                "ops": [list(o) for o in self.ops], "records": self.records, "cut": self.cut,
                "detail": self.detail}


@dataclass
class Report:
    """What one run explored and found."""

    alphabet: str
    depth: int
    jobs: int
    histories: int = 0
    prefixes: int = 0
    cuts: int = 0
    compacted_logs: int = 0
    compacted_steps: int = 0
    batch_splits: int = 0
    pruned: int = 0
    ignored_accepted: int = 0
    seconds: float = 0.0
    by_depth: dict[int, int] = field(default_factory=dict)
    failures: dict[tuple[str, str], Counterexample] = field(default_factory=dict)
    failure_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    ignored_classes: dict[tuple[str, str], Counterexample] = field(default_factory=dict)

    def classes(self) -> set[tuple[str, str]]:
        return set(self.failures)

    def note(self, table: dict[tuple[str, str], Counterexample], cx: Counterexample) -> None:
        key = (cx.assertion, cx.klass)
        old = table.get(key)
        if old is None or cx.size() < old.size():
            table[key] = cx

    def as_dict(self) -> dict[str, Any]:
        return {
            "alphabet": self.alphabet, "depth": self.depth, "jobs": self.jobs,
            "histories": self.histories, "prefixes": self.prefixes, "cuts": self.cuts,
            "compacted_logs": self.compacted_logs, "compacted_steps": self.compacted_steps,
            "batch_splits": self.batch_splits, "pruned": self.pruned,
            "ignored_accepted": self.ignored_accepted, "seconds": round(self.seconds, 2),
            "by_depth": self.by_depth,
            "counterexamples": [dict(cx.as_dict(), count=self.failure_counts[k])
                                for k, cx in sorted(self.failures.items())],
            "ignored_accepted_classes": [cx.as_dict()
                                         for _, cx in sorted(self.ignored_classes.items())],
        }


@dataclass
class _Lineage:
    """The compacted fold of one cut, as far as the log goes."""

    cut: int
    image: Image
    decisions: immutables.Map[int, Decision]


def _decision_class(d: Decision) -> str:
    return f"{d.outcome}" + (f" {d.reason}" if d.reason else "")


class _Checker:
    def __init__(self, alphabet: Alphabet, depth: int,
                 progress: Callable[[Report], None] | None, every: float) -> None:
        self.alphabet = alphabet
        self.depth = depth
        self.report = Report(alphabet.name, depth, alphabet.jobs)
        self.progress = progress
        self.every = every
        self.last_progress = time.monotonic()
        self._path: tuple[Op, ...] = ()
        self.on_history: Callable[[tuple[Op, ...], int, int], None] | None = None
        self.frontier_depth: int | None = None
        self.frontier: list[tuple[Op, ...]] = []

    def run(self, below: Sequence[Op] = (), frontier: int | None = None) -> Report:
        """Explore the histories that start with ``below`` (its own nodes were checked by
        whoever handed it out, and are not counted again). With ``frontier``, stop at
        histories of that many ops and keep them (unpruned) in :attr:`frontier` for others
        to explore below."""
        start = time.monotonic()
        world = _World.empty()
        state = _NodeState(0, 0, immutables.Map(), {}, [Image.empty(NS)], 0)
        counted = self.report
        for op in below:  # walk down to ``below`` (checks of a scratch report)
            self.report = Report(counted.alphabet, counted.depth, counted.jobs)
            child = next((w for o, w in _children(world, self._path, self.alphabet)
                          if o == tuple(op)), None)
            if child is None:
                raise ValueError(f"after {len(self._path)} ops the enumeration of alphabet "
                                 f"{self.alphabet.name!r} does not try {list(op)!r} (not in "
                                 "its canonical form, not in the alphabet, or it writes "
                                 "nothing there)")
            self._path = (*self._path, tuple(op))
            state, _ = self._check(self._path, child, state)
            world = child
        self.report = counted
        self.frontier_depth = frontier
        self._visit(self._path, world, state)
        self.report.seconds = time.monotonic() - start
        return self.report

    # One node of the search: the history ``ops`` whose world is ``world``; ``state`` is the
    # state of the checks at its log (the compacted folds by cut, decisions, the bound).
    def _visit(self, ops: tuple[Op, ...], world: _World, state: _NodeState) -> None:
        if len(ops) >= self.depth:
            return
        if self.frontier_depth is not None and len(ops) >= self.frontier_depth:
            self.frontier.append(ops)
            return
        for op, child in _children(world, ops, self.alphabet):
            path = (*ops, op)
            r = self.report
            r.histories += 1
            r.by_depth[len(path)] = r.by_depth.get(len(path), 0) + 1
            new_state, failed = self._check(path, child, state)
            if self.on_history is not None:
                self.on_history(path, len(child.log), new_state.bound)
            if self.progress is not None and time.monotonic() - self.last_progress > self.every:
                self.last_progress = time.monotonic()
                self.progress(r)
            if failed:
                r.pruned += 1
                continue
            self._visit(path, child, new_state)

    def _fail(self, assertion: str, klass: str, ops: tuple[Op, ...], records: int,
              cut: int | None, detail: str) -> None:
        cx = Counterexample(assertion, klass, ops, records, cut, detail)
        self.report.note(self.report.failures, cx)
        key = (assertion, klass)
        self.report.failure_counts[key] = self.report.failure_counts.get(key, 0) + 1

    def _check(self, ops: tuple[Op, ...], world: _World,
               parent: _NodeState) -> tuple[_NodeState, bool]:
        r = self.report
        log = world.log
        n = len(log)
        keys = [rec.key for rec in log]
        tombs = [rec.value is None for rec in log]
        failed = False
        lineages = dict(parent.lineages)
        full_decisions = parent.full_decisions
        bound, cut_top = parent.bound, parent.cut_top
        redo = set(parent.redo)
        one_batch = list(parent.one_batch)
        # Readers (read_committed) and the cleaner (up to the last stable offset) see whole
        # writes: the prefixes are the ends of writes. The cut may fall anywhere.
        start = parent.length
        for m in range(parent.length + 1, n + 1):
            one_batch.append(_fold_one_batch(log[:m]))
        for m in range(parent.length + 1, n + 1):
            if not log[m - 1].last:
                continue
            writes = log[start:m]
            r.prefixes += 1
            changed: set[int] = set()
            for rec in writes:
                full_prev, full = world.images[rec.index], world.images[rec.index + 1]
                for d in world.made[rec.index]:
                    full_decisions = full_decisions.set(d.offset, d)
                    changed.add(d.offset)
                why = _monotone(full_prev, full)
                if why is not None:
                    self._fail("monotone", f"full fold: {why} ({_type(rec)})", ops, m, None,
                               f"record {rec.index} ({_type(rec)}) takes the {why} back")
                    failed = True
            full = world.images[m]
            # The lag bound: no cut passes the newest record of a key unsettled now; a cut
            # legal at an earlier prefix stays legal (the cleaner may have run then).
            bound = max(bound, min([m, *world.since[m].values()]))
            r.cuts += bound + 1
            # A verbatim copy the fold takes as a duplicate lands within the duplicate window
            # of its first copy (README assumption 5), long before any cut that passed the
            # first copy could be made (every record before a cut is older than the lag): no
            # such cut has been made when the copy lands, whether it removed the first copy
            # or kept it (see _World._stretch_start). A lineage keeps the least cut that
            # made it.
            for rec in writes:
                first = world.first_copy(rec.index)
                if first is not None:
                    for removed in [k for k, lin in lineages.items() if lin.cut > first]:
                        del lineages[removed]
                    # The same cuts made after the copy landed are legal once the lag bound
                    # allows them now (the copy's key settled): they are made again then.
                    redo |= set(range(first + 1, cut_top + 1))
            # every compacted fold so far, one write further
            for removed, lin in list(lineages.items()):
                image, decisions = lin.image, lin.decisions
                offsets = set(changed)
                why_back: str | None = None
                for rec in writes:
                    prev = image
                    image, made = _step(image, rec)
                    r.compacted_steps += 1
                    for d in made:
                        decisions = decisions.set(d.offset, d)
                        offsets.add(d.offset)
                    why_back = why_back or _monotone(prev, image)
                new = _Lineage(lin.cut, image, decisions)
                lineages[removed] = new
                failed |= self._compare(ops, m, new, full, full_decisions, offsets, why_back)
            # the cuts that became legal with this write, and those dropped at a copy that
            # the bound of now allows again
            now = min([m, *world.since[m].values()])
            again = sorted(c for c in redo if c <= now)
            redo.difference_update(again)
            for c in [*again, *range(cut_top + 1, bound + 1)]:
                kept = compacted_indices(keys, tombs, c, m)
                removed = tuple(sorted(set(range(c)) - set(kept)))
                if not removed or removed in lineages:
                    continue  # the cleaner removes nothing here, or what another cut did
                image = Image.empty(NS)
                decisions = immutables.Map()
                why_back = None
                offsets = set()
                for i in kept:
                    prev = image
                    image, made = _step(image, log[i])
                    r.compacted_steps += 1
                    for d in made:
                        decisions = decisions.set(d.offset, d)
                        offsets.add(d.offset)
                    why_back = why_back or _monotone(prev, image)
                lin = _Lineage(c, image, decisions)
                lineages[removed] = lin
                r.compacted_logs += 1
                failed |= self._compare(ops, m, lin, full, full_decisions, offsets, why_back)
            cut_top = max(cut_top, bound)
            start = m
        # (d) batch splits of the whole log: two batches at every position, and one record
        # at a time (the world's images), against one batch
        whole = one_batch[n]
        if world.images[n] != whole:
            self._fail("batch", "one record at a time: " + _image_diff(whole, world.images[n]),
                       ops, n, None, "replayed record by record, the image differs from one batch")
            failed = True
        events = {rec.offset: rec.event for rec in log if rec.event is not None}
        records = [rec.log_record() for rec in log]
        for k in range(1, n):
            r.batch_splits += 1
            split = fold_batches([records[k:]], one_batch[k], _CODEC, known=events)
            if split != whole:
                self._fail("batch", f"two batches: {_image_diff(whole, split)}", ops, n, None,
                           f"split at record {k}")
                failed = True
                break
        return _NodeState(n, cut_top, full_decisions, lineages, one_batch, bound,
                          frozenset(redo)), failed

    def _compare(self, ops: tuple[Op, ...], m: int, lin: _Lineage, full: Image,
                 full_decisions: immutables.Map[int, Decision], offsets: set[int],
                 why_back: str | None) -> bool:
        failed = False
        if why_back is not None:
            self._fail("monotone", f"compacted fold: {why_back}", ops, m, lin.cut,
                       f"the compacted fold takes {why_back} back")
            failed = True
        for off in sorted(offsets):
            f, c = full_decisions.get(off), lin.decisions.get(off)
            if f is None or c is None:
                continue
            if f.outcome == Outcome.REJECTED and c.outcome == Outcome.ACCEPTED:
                self._fail("refusal_accepted", _refusal_class(f), ops, m, lin.cut,
                           f"the record at offset {off} ({f.event_type}) is refused "
                           f"{f.reason} by the fold, accepted after compaction")
                failed = True
            elif f.outcome == Outcome.IGNORED and c.outcome == Outcome.ACCEPTED:
                self.report.ignored_accepted += 1
                self.report.note(self.report.ignored_classes, Counterexample(
                    "ignored_accepted", f"{f.event_type}", ops, m, lin.cut, f.detail or ""))
        if not _same_answer(full, lin.image):
            self._fail("answer", _root(full_decisions, lin.decisions), ops, m, lin.cut,
                       f"the compacted fold's answer differs in {_answer_diff(full, lin.image)}")
            failed = True
        return failed


def _refusal_class(d: Decision) -> str:
    """A refused record's class: its type and reason; a record refused because its call was
    (``call_aborted``) names the type and reason of the record that sank the call."""
    if d.reason == "call_aborted" and d.detail:
        sink = re.search(r"\((\w+) of job '[^']*'\) was refused: (\w+)", d.detail)
        if sink is not None:
            return f"{d.event_type} call_aborted (sunk by {sink.group(1)} {sink.group(2)})"
    return f"{d.event_type} {d.reason}"


def _root(full: immutables.Map[int, Decision], compacted: immutables.Map[int, Decision]) -> str:
    """Where a compacted fold's answer went another way: the first record the fold refused
    and the compacted fold accepted, else the first record decided otherwise."""
    differ = [(off, full[off], compacted[off]) for off in sorted(compacted.keys())
              if off in full and _decision_class(full[off]) != _decision_class(compacted[off])]
    for _, f, c in differ:
        if f.outcome == Outcome.REJECTED and c.outcome == Outcome.ACCEPTED:
            return f"{_refusal_class(f)} -> ACCEPTED"
    for _, f, c in differ:
        if f.reason != "call_aborted":
            return f"{f.event_type}: {_decision_class(f)} -> {_decision_class(c)}"
    if differ:
        _, f, c = differ[0]
        return f"{f.event_type}: {_decision_class(f)} -> {_decision_class(c)}"
    return "no kept record is decided otherwise"


def _type(rec: Rec) -> str:
    return rec.event.TYPE if rec.event is not None else ("tombstone" if rec.value is None
                                                         else "undecodable")


def _image_diff(a: Image, b: Image) -> str:
    names = [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]
    return "+".join(names) or "?"


@dataclass
class _NodeState:
    length: int  # records checked
    cut_top: int  # the largest cut already legal
    full_decisions: immutables.Map[int, Decision]
    lineages: dict[tuple[int, ...], _Lineage]  # by the indices the cleaner removed
    one_batch: list[Image]  # the fold of each prefix in one batch
    bound: int  # the largest legal cut
    redo: frozenset[int] = frozenset()  # cuts dropped when a copy landed, to make again


def explore(depth: int, alphabet: Alphabet | str = "ci", jobs: int | None = None,
            progress: Callable[[Report], None] | None = None,
            every: float = 10.0, processes: int = 1,
            on_history: Callable[[tuple[Op, ...], int, int], None] | None = None,
            below: Sequence[Op] = ()) -> Report:
    """Check every history of at most ``depth`` ops of ``alphabet`` (``jobs``: how many job
    names, default the alphabet's); ``progress`` is called every ``every`` seconds with the
    counts so far. ``processes`` > 1 explores the subtrees below the histories of up to three
    ops in that many processes (the counts and the reproducers are the same as in one).
    ``on_history(ops, records, bound)`` sees every history checked, its log's length and the
    largest cut the lag allowed (one process only). ``below``: only the histories that start
    with these ops (in the enumeration's canonical form; their own prefixes are not counted),
    to go deeper where a class lives: a ``ValueError`` names the first op the enumeration
    would not try there."""
    alpha = ALPHABETS[alphabet] if isinstance(alphabet, str) else alphabet
    if jobs is not None:
        alpha = alpha.with_jobs(jobs)
    below = tuple(tuple(op) for op in below)
    if len(below) >= depth:
        raise ValueError(f"--below has {len(below)} ops: the depth must be above that")
    if processes <= 1 or depth - len(below) <= 1:
        checker = _Checker(alpha, depth, progress, every)
        checker.on_history = on_history
        return checker.run(below)
    import multiprocessing

    start = time.monotonic()
    top = _Checker(alpha, depth, None, every)
    report = top.run(below, frontier=len(below) + max(1, min(3, depth - len(below) - 2)))
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        for part in pool.imap_unordered(_explore_below, [(alpha, depth, f) for f in top.frontier]):
            _merge(report, part)
            if progress is not None and time.monotonic() - top.last_progress > every:
                top.last_progress = time.monotonic()
                progress(report)
    report.seconds = time.monotonic() - start
    return report


def only_junk_classes(report: Report) -> str | None:
    """Why ``report`` fails the bar the checker's CI tests below a reproducer hold it to
    (``None``: it passes): no answer or batch class, and every verdict or path class has junk
    in it (:data:`JUNK_TYPES`: what the README's table of refusals says the leader restates,
    the answer right once it has)."""
    bad = sorted(k for k in report.failures if k[0] in ("answer", "batch"))
    not_junk = sorted(k for k, cx in report.failures.items()
                      if not any(op[0] == "raw" and op[1] in JUNK_TYPES for op in cx.ops))
    if not bad and not not_junk:
        return None
    return (f"answer or batch classes {bad}, classes without junk {not_junk}:\n"
            + format_report(report))


def check_history(ops: Sequence[Op], alphabet: Alphabet | str = "full") -> Report:
    """The checks of one history and of each of its prefixes (its ops need not be in the
    enumeration's canonical form: ``jm-2`` may claim first). For a reproducer."""
    alpha = ALPHABETS[alphabet] if isinstance(alphabet, str) else alphabet
    checker = _Checker(alpha, len(ops), None, 0)
    world = _World.empty()
    state = _NodeState(0, 0, immutables.Map(), {}, [Image.empty(NS)], 0)
    start = time.monotonic()
    for i, op in enumerate(ops):
        op = tuple(op)
        child = world.copy()
        base, settle = (op, False) if op[0] == "write" else (op[:-1], bool(op[-1]))
        _apply(child, base, alpha)
        if settle:
            _settle_after(child)
        checker.report.histories += 1
        checker.report.by_depth[i + 1] = 1
        state, _ = checker._check(tuple(tuple(o) for o in ops[:i + 1]), child, state)
        world = child
    checker.report.seconds = time.monotonic() - start
    return checker.report


def sample(depth: int, walks: int, seed: int = 0, alphabet: Alphabet | str = "full",
           jobs: int | None = None, progress: Callable[[Report], None] | None = None,
           every: float = 10.0) -> Report:
    """Beyond the exhaustive bound: ``walks`` random histories of ``depth`` ops of
    ``alphabet`` (each op drawn uniformly from the ones the enumeration would try next, so
    the same ops, held first copies and fresh re-sends, junk and settling included), every
    prefix of each checked as :func:`explore` checks it (every cut, every batch split).
    Seeded: the same ``seed`` walks the same histories. A walk stops early where no op
    writes anything; a class :func:`explore` finds, a walk reproduces with its ops."""
    import random

    alpha = ALPHABETS[alphabet] if isinstance(alphabet, str) else alphabet
    if jobs is not None:
        alpha = alpha.with_jobs(jobs)
    rng = random.Random(seed)
    checker = _Checker(alpha, depth, progress, every)
    start = time.monotonic()
    for _ in range(walks):
        world = _World.empty()
        state = _NodeState(0, 0, immutables.Map(), {}, [Image.empty(NS)], 0)
        ops: tuple[Op, ...] = ()
        for _step in range(depth):
            children = list(_children(world, ops, alpha))
            if not children:
                break
            op, child = children[rng.randrange(len(children))]
            ops = (*ops, op)
            checker.report.histories += 1
            checker.report.by_depth[len(ops)] = checker.report.by_depth.get(len(ops), 0) + 1
            state, failed = checker._check(ops, child, state)
            world = child
            if failed:
                break  # as explore: a failing prefix is not extended
        if progress is not None and time.monotonic() - checker.last_progress > every:
            checker.last_progress = time.monotonic()
            progress(checker.report)
    checker.report.seconds = time.monotonic() - start
    return checker.report


def _explore_below(job: tuple[Alphabet, int, tuple[Op, ...]]) -> Report:
    alpha, depth, below = job
    return _Checker(alpha, depth, None, 0).run(below)


def _merge(into: Report, part: Report) -> None:
    for name in ("histories", "prefixes", "cuts", "compacted_logs", "compacted_steps",
                 "batch_splits", "pruned", "ignored_accepted"):
        setattr(into, name, getattr(into, name) + getattr(part, name))
    for d, k in part.by_depth.items():
        into.by_depth[d] = into.by_depth.get(d, 0) + k
    for key, cx in part.failures.items():
        into.note(into.failures, cx)
        into.failure_counts[key] = into.failure_counts.get(key, 0) + part.failure_counts[key]
    for cx in part.ignored_classes.values():
        into.note(into.ignored_classes, cx)


def format_report(report: Report) -> str:
    """The report for people: the counts, then one reproducer per counterexample class."""
    r = report
    lines = [
        f"alphabet {r.alphabet}, depth {r.depth}, {r.jobs} job(s): {r.histories} histories "
        f"({', '.join(f'{n} of {d} ops' for d, n in sorted(r.by_depth.items()))}), "
        f"{r.prefixes} prefixes, {r.cuts} cuts ({r.compacted_logs} distinct compacted logs, "
        f"{r.compacted_steps} records folded), {r.batch_splits} batch splits, "
        f"{r.pruned} failing prefixes not extended, in {r.seconds:.1f} s",
        f"ignored -> accepted after compaction (not a failure): {r.ignored_accepted} "
        f"({len(r.ignored_classes)} classes)",
        f"{len(r.failures)} counterexample classes"
        + (":" if r.failures else ""),
    ]
    for key, cx in sorted(r.failures.items()):
        lines.append(f"  [{cx.assertion}] {cx.klass}  ({r.failure_counts[key]} times)")
        lines.append(f"    ops: {json.dumps([list(o) for o in cx.ops])}")
        lines.append(f"    at {cx.records} records, cut {cx.cut}: {cx.detail}")
    for _, cx in sorted(r.ignored_classes.items()):
        lines.append(f"  [ignored_accepted] {cx.klass}: ops {json.dumps([list(o) for o in cx.ops])}"
                     f" cut {cx.cut}: {cx.detail}")
    return "\n".join(lines)
