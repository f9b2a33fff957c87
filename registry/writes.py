"""Steps 2 and 3 of a term's write (:mod:`registry.client`'s module docstring): one
produce of the term's idempotent producer (``acks=all``, no transaction: README "The write
path"), then reading until the fold decided every record sent, re-sending what the log does
not hold while the term is current; and group commit, which lets concurrent calls of one
term share that produce.

:class:`TermWrites` holds the term's producer and talks to the log only through a
:class:`~registry.folded.FoldedLog` (it never sees the :class:`~registry.client.Registry`);
the term asks it to :meth:`~TermWrites.send` the records steps 1 and 4 planned.

:class:`GroupCommit` is the queue concurrent calls of one term join (README "Group
commit"): the first caller to find no group in flight leads one, taking every call queued
by then (in arrival order, up to :data:`MAX_GROUP_RECORDS` records and
:data:`MAX_GROUP_BYTES` bytes; a call is never split), and hands the lead to the first
call left waiting when its group is decided. A lone caller leads at once: nothing waits
on a timer. As MySQL's binlog group commit and PostgreSQL's ``XLogFlush``, batching
comes only from calls arriving while a group is in flight.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from . import stalls
from .errors import BrokerError, Fenced, NotAuthorized, OutcomeUnknown, RegistryError
from .events import CallCommitted, Event, LeaseRenewed, new_event_id
from .fold import DUPLICATE_WINDOW_MS
from .folded import FoldedLog
from .image import Decision
from .kafka_config import Kafka
from .log import LeaderWriter, WriteFailed

__all__ = ["MAX_GROUP_BYTES", "MAX_GROUP_RECORDS", "MAX_IN_FLIGHT", "GroupCommit",
           "PendingCall", "Restate", "TermWrites"]

MAX_GROUP_RECORDS = 10_000
"""At most this many records in one group's write (a lone call may have more)."""

MAX_IN_FLIGHT = 1
"""At most this many groups between the start of their write and their answers (up to 5:
the idempotent producer keeps up to 5 requests in flight, in order). 1 by default, so groups
do not overlap: measured on this 2-core machine, 8 writers of one term wrote 1,300-1,440
jobs/s on the embedded broker and 1,770-3,540 on one Kafka node with 1, against 650-700 and
860-1,070 with 4 (one term whose group queue was made with each in turn, three rounds
of each alternated in one process, 400 calls a round). The bound is the client's CPU per
group, its confirmation above all; overlapping groups are smaller, so there are more of
them, and a group whose predecessor is not yet taken as read reads its records back."""

MAX_GROUP_BYTES = 1_000_000
"""At most this many encoded bytes in one group's write, librdkafka's default
``message.max.bytes`` (a lone call may have more; it then fails or succeeds alone)."""

Encoded = tuple[bytes, Event]
"""A record as :meth:`registry.wire.Codec.encode_as_read` gives it: its bytes, and the
event as a reader decodes them."""


class TermWrites:
    """The write protocol of one term of one namespace.

    ``fenced``: the term's own answer to "would a write of this term be fenced, as far as
    the log was read" (:meth:`registry.client.Term.fenced`).
    """

    MAX_RESENDS = 3

    def __init__(self, log: FoldedLog, kafka: Kafka, topic: str, namespace: str,
                 partition: int, timeout: float, epoch: int,
                 fenced: Callable[[], Fenced | None]) -> None:
        self._log = log
        self._kafka = kafka
        self._topic = topic
        self._namespace = namespace
        self._partition = partition
        self.timeout = timeout
        self.epoch = epoch
        self._fenced = fenced
        self.writer: LeaderWriter | None = None
        """The term's producer, once made (:meth:`open`)."""
        self._opening = threading.Lock()

    def open(self) -> None:
        """Make the term's producer, if it has none (once, however many groups re-send at
        once)."""
        with self._opening:
            if self.writer is None:
                self.writer = LeaderWriter(self._kafka, self._topic, self._partition,
                                           self.timeout)

    def close(self) -> None:
        """Drop the producer (the term goes on until fenced or revoked)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def send(self, pairs: list[tuple[str, Event]], *,
             encoded: dict[str, Encoded] | None = None,
             verdicts: list[tuple[Decision | None, tuple[str, ...]]] | None = None,
             produced: Callable[[], None] | None = None) -> list[Decision]:
        """Steps 2 and 3: one write, then read until the fold decided every record.

        Returns one decision per pair. A record the log does not hold after a
        failed write is re-sent while this term is current: a job
        record verbatim (a copy that lands after all is a duplicate on a key
        the next write reasserts), a record under a key of its own (a grant, a revoke, a
        job's end, a lone submit) as a fresh event under a fresh key (so no such key is ever
        written twice: the cleaner would keep the later copy, moving the fact later in the
        log), and a call of submits as a fresh call (fresh records, keys and commit); a
        lease renewal never (its call raises ``OutcomeUnknown``; the renewer plans a new one
        on keys of its own, fold rule 3).

        ``encoded``: event id -> the record already encoded (the callers of a group
        encode their own records, so that one that cannot be encoded fails alone).
        ``verdicts``, if given, receives per pair, also when this raises, the fold's
        decision on it (``None``: undecided) and the ids of every copy of it sent (none
        if nothing was sent): what a group tells each of its calls.
        ``produced``, if given, is called once, when the records are handed to the producer
        (or nothing will be): the next group may then start its own write while this one
        waits for its acknowledgement and confirmation (writes of one producer land in the
        order they were started). Several sends may run at once, each from its own thread.
        """
        log = self._log
        encoded = encoded or {}
        codec = log.codec
        slots = [[(key, event)] for key, event in pairs]  # every copy sent per record
        waiting = log.waiting
        failure: Exception | None = None
        sent, first_sent = False, 0.0
        appended: list[int] = []  # offsets the broker gave our records, committed or not
        in_doubt = 0  # records of failed writes that may sit at offsets nobody said
        sends: dict[str, int] = {}  # event id -> how many copies of it were handed on
        unsent = False  # a lease renewal was left undecided rather than re-sent

        def fenced_now(fenced: Fenced) -> RegistryError:
            # The log holds a newer grant (or the revoke) and none of the undecided records.
            # On Kafka that settles it: a read that reached the grant read every record
            # before it (below the high watermark, and no transaction of ours holds the
            # last stable offset), so a record of ours still in flight, if it lands at all,
            # lands after the grant and is refused: not accepted. That rests on the
            # broker's offsets and visibility alone; where it cannot be shown (a record the
            # broker said it placed before the term ended and no reader sees, or one in
            # flight with no report of where it went: campaign seed 150081, on the
            # embedded broker's transactions), the answer is unknown, which is true
            # whatever the broker does. Records reported refused or never sent do not
            # count: they were not appended anywhere.
            end = self.term_end()
            early = sorted(o for o in appended if end is None or o < end)
            if early:
                return unknown(f"the term ended (offset {end}) after the broker had placed "
                               f"record(s) of the call at offset(s) {early[:5]} that no "
                               "reader sees now", failure)
            if in_doubt:
                return unknown(f"the term ended (offset {end}); the broker may have placed "
                               f"{in_doubt} record(s) of the call before that, at offsets "
                               "it never reported (their write failed)", failure)
            fenced.event_ids = ids()
            return fenced

        def ids() -> tuple[str, ...]:
            return tuple(e.event_id for copies in slots for _, e in copies) if sent else ()

        def held() -> str:
            # Why a healthy write may stay unconfirmed: read_committed readers read only up to
            # the last stable offset, and a transaction the broker counts as open before our
            # records holds them there, another namespace's on a shared partition included.
            end, first = log.reader.stable_end, min(appended, default=None)
            if end is None or first is None or end > first:
                return ""
            return (f"; readers see the partition end at offset {end} (its last stable "
                    f"offset), at or before the call's records (from offset {first}): the "
                    f"broker counts a transaction open from offset {end}, which keeps every "
                    "later record unreadable to read_committed readers")

        def unknown(why: str, cause: Exception | None) -> OutcomeUnknown:
            error = OutcomeUnknown(f"records of term {self.epoch} may or may not be in the "
                                   f"log: {why}", ids())
            error.__cause__ = cause
            return error

        try:
            for attempt in range(self.MAX_RESENDS + 1):
                unsent = False
                todo: list[tuple[str, bytes | None]] = []
                events: list[Event] = []
                renewed = _renewed_calls(slots, waiting) if attempt else {}
                for copies in slots:
                    key, event = copies[-1]
                    call = event.event_id if isinstance(event, CallCommitted) \
                        else getattr(event, "call_id", None)
                    if call is not None and call in renewed:
                        # A call with a record under a key of its own (a submit's birth) is
                        # re-sent as a fresh call: fresh ids and keys for its records, a
                        # fresh commit naming them; whichever copy is decided answers.
                        fresh = renewed[call] if isinstance(event, CallCommitted) \
                            else new_event_id()
                        event = replace(event, event_id=fresh) \
                            if isinstance(event, CallCommitted) \
                            else replace(event, event_id=fresh,
                                         call_id=renewed[call])  # type: ignore[call-arg]
                        key = key.replace(copies[-1][1].event_id, fresh)
                        copies.append((key, event))
                    elif any(waiting.get(e.event_id) is not None for _, e in copies):
                        continue
                    elif attempt and _own_key(key, event):
                        # Under a key of its own (a grant, a revoke, a job's end, a lone
                        # submit): a fresh event under a fresh key, so that no such key is
                        # written twice (a copy would supersede the first and move it later
                        # in the log).
                        fresh = new_event_id()
                        key, event = key.replace(event.event_id, fresh), replace(
                            event, event_id=fresh)
                        copies.append((key, event))
                    if attempt and isinstance(event, LeaseRenewed):
                        # Never re-sent (fold rule 3): a copy that lands before a grant and
                        # one after it would share a key, and the cleaner would remove the
                        # renewal the grant's refusal rests on. The renewer plans a new one.
                        unsent = True
                        continue
                    waiting.setdefault(event.event_id, None)
                    data, as_read = (encoded.get(event.event_id)
                                     or codec.encode_as_read(event))
                    todo.append((key, data))
                    events.append(as_read)
                if not todo:
                    if unsent:
                        raise unknown(f"a lease renewal is not re-sent{held()}", failure)
                    break
                if sent and time.monotonic() - first_sent > DUPLICATE_WINDOW_MS / 2000:
                    # Rule 1 forgets an id a window after its record landed: a copy sent
                    # later could be folded as a new event.
                    raise unknown(f"not confirmed within half the duplicate window "
                                  f"({DUPLICATE_WINDOW_MS / 2000:g} s); not re-sent{held()}",
                                  failure)
                try:
                    # A term known to be over sends nothing (as far as the log was read;
                    # a term without a producer reads it first: its last write failed).
                    if self.writer is None:
                        log.sync(self.timeout)
                    fenced = self._fenced()
                    if fenced is not None:
                        raise fenced_now(fenced)
                    self.open()
                    if sent and time.monotonic() - first_sent > DUPLICATE_WINDOW_MS / 2000:
                        # Asked again just before the copy leaves: the read and the new
                        # producer above may each have taken the timeout.
                        raise unknown(f"not confirmed within half the duplicate window "
                                      f"({DUPLICATE_WINDOW_MS / 2000:g} s); not re-sent"
                                      f"{held()}", failure)
                    if not sent:
                        sent, first_sent = True, time.monotonic()
                    writer = self.writer
                    assert writer is not None  # self.open() above made it if there was none
                    for e in events:
                        sends[e.event_id] = sends.get(e.event_id, 0) + 1
                    sending = writer.start(todo)
                    if produced is not None:
                        hand_on: Callable[[], None] = produced
                        produced = None  # once
                        hand_on()
                    stalls.point("write.sent", epoch=self.epoch, records=len(todo))
                    try:
                        written = writer.wait(sending)
                    except WriteFailed as failed:
                        if failed.fatal and self.writer is writer:
                            self.writer = None  # retired: the next attempt makes a new one
                            writer.close()
                        raise
                    appended.extend(r.offset for r in written)
                    known = {r.offset: e for r, e in zip(written, events, strict=True)}
                    log.read_back(written, known, self.timeout)
                    failure = None
                except BrokerError as e:  # WriteFailed included
                    failure = e
                    if isinstance(e, WriteFailed):
                        appended.extend(e.appended)
                        in_doubt += e.in_doubt
                    if isinstance(e, NotAuthorized):
                        # The broker's authorizer refused it: nothing of this attempt was
                        # appended, and no retry can help. Not accepted, unless an earlier
                        # attempt left records placed or in doubt.
                        if appended or in_doubt:
                            raise unknown(str(e), e) from e
                        e.event_ids = ids()
                        raise e from None
                    try:
                        log.sync(self.timeout)  # read, don't guess
                    except BrokerError as lost:
                        if not sent:
                            raise e from None  # nothing left this process: not accepted
                        raise unknown(str(e), lost) from lost
                if all(self.decided(copies) for copies in slots):
                    doubt = [d for copies in slots
                             if (d := self.decided(copies)) is not None
                             and not d.accepted and d.reason not in _FOR_EVER
                             and any(log.copies.get(e.event_id, 0) < sends.get(e.event_id, 0)
                                     for _, e in copies)]
                    if doubt:
                        # Refused, but a copy sent earlier is nowhere in the log: it may
                        # still land (a request held on its way), and fold rule 1 decides a
                        # copy of a refused record by the rules at its own position, where
                        # it may be accepted. Only a refusal no later record can turn
                        # (fenced by its term, a terminal job) is an answer then.
                        d = doubt[0]
                        raise unknown(f"the record at offset {d.offset} ({d.event_type} "
                                      f"{d.event_id}) was refused {d.reason}, but a copy of "
                                      "it sent earlier is not in the log and may still land "
                                      "and be accepted", failure)
                    break
                fenced = self._fenced()
                if fenced is not None:
                    raise fenced_now(fenced) from failure
                if failure is None:
                    raise unknown("they were written but the fold did not see them", None)
                time.sleep(0.05 * (attempt + 1))
            else:
                if not sent and failure is not None:
                    raise failure  # no producer could be made: nothing left this process
                raise unknown(f"not confirmed after {self.MAX_RESENDS} re-sends{held()}",
                              failure)
            return [self.decided(copies) for copies in slots]  # type: ignore[misc]
        finally:
            if produced is not None:  # nothing was handed to the producer
                produced()
            if verdicts is not None:
                verdicts[:] = [(self.decided(copies),
                                tuple(e.event_id for _, e in copies) if sent else ())
                               for copies in slots]
            for copies in slots:
                for _, sent_event in copies:
                    waiting.pop(sent_event.event_id, None)
                    log.copies.pop(sent_event.event_id, None)

    def collect(self, keys: list[str]) -> int:
        """Fold rule 6's collection: one write of a tombstone per key (in that order, as
        :func:`registry.fold.plan_collection` planned them), then fold them. Best effort:
        a tombstone that never lands leaves a record no state stands on in the log, and
        the next collection plans it again; one that lands removes a record no verdict
        needs, whoever wrote it and whenever (a tombstone has no epoch: nothing of a term
        to fence). Returns how many were written (0 on any failure, also a term known to
        be over: it leaves them to the next leader)."""
        if not keys or self._fenced() is not None:
            return 0
        try:
            self.open()
            writer = self.writer
            if writer is None:
                return 0
            written = writer.write([(key, None) for key in keys])
            self._log.read_back(written, {}, self.timeout)
        except BrokerError:
            return 0
        return len(written)

    def term_end(self) -> int | None:
        """The offset of the record that ended this term in the image (the newer grant, or
        this term's revoke); ``None`` if the image does not say."""
        info = self._log.image.term
        if info is None:
            return None
        if info.epoch > self.epoch:
            return info.granted_offset
        if info.epoch == self.epoch and info.revoked_offset is not None:
            return info.revoked_offset
        return None

    def decided(self, copies: list[tuple[str, Event]]) -> Decision | None:
        # The verdict on a record: an accepted copy if any, else the first decided one.
        found = [d for _, e in copies if (d := self._log.waiting.get(e.event_id))]
        return next((d for d in found if d.accepted), found[0] if found else None)


_FOR_EVER = frozenset({"stale_epoch", "term_revoked", "not_leader", "terminal_job",
                       "wrong_key", "namespace_mismatch", "bad_leader_information"})
"""Refusals that every later copy of the record gets too: its term is over, or was never
its writer's, an ended job stays ended, and the record itself is wrong (its key, its
namespace, the leader information it carries)."""


Restate = Callable[[Event, dict[str, object]], Event]
"""A call's records computed again when its group is assembled: given a record as the call
made it and a scratch dict the group's calls share (in order), the record to send. A
checkpoint call computes its state there (README "Group commit")."""


@dataclass(eq=False)
class PendingCall:
    """One call waiting in a :class:`GroupCommit`: its records (``pairs``, already
    ``encoded``), and, once its group is decided, its own answer: ``decisions`` (one per
    record) or ``error`` (what this call raises)."""

    pairs: list[tuple[str, Event]]
    encoded: list[Encoded]
    guard: bool = True
    """Whether the term's write guard applies to it (a lease renewal passes it)."""
    restate: Restate | None = None
    """Its records computed again at group assembly, if they depend on the image."""
    decisions: list[Decision] | None = None
    error: BaseException | None = None
    size: int = field(init=False)
    _leads: bool = field(default=False, init=False)
    _done: bool = field(default=False, init=False)
    _wake: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        self.size = sum(len(key) + len(data) for (key, _), (data, _)
                        in zip(self.pairs, self.encoded, strict=True))


class GroupCommit:
    """Concurrent calls of one term share one write and one confirming read, and groups may
    overlap: with ``max_in_flight`` above 1, the next group's write starts while this one
    waits for its confirmation (:data:`MAX_IN_FLIGHT` says why it is 1 by default).

    ``run(group, produced)`` writes a group (a list of :class:`PendingCall`, in arrival
    order) and sets every call's ``decisions`` or ``error``, in the thread of the group's
    first call; it calls ``produced()`` once the group's records are handed to the producer
    (or nothing will be), and from then on the next group may be led, by the first call
    waiting, while this one is confirmed: up to ``max_in_flight`` groups run at once, and
    groups hand their records to the producer one after another, in the order they were
    formed. Whatever ``run`` raises becomes the answer of every call it left without one.
    """

    def __init__(self, run: Callable[[list[PendingCall], Callable[[], None]], None], *,
                 max_records: int = MAX_GROUP_RECORDS,
                 max_bytes: int = MAX_GROUP_BYTES,
                 max_in_flight: int | None = None) -> None:
        self._run = run
        self.max_records = max_records
        self.max_bytes = max_bytes
        # Read when the queue is made (a test or a campaign may set the module's value).
        self._in_flight = threading.BoundedSemaphore(
            MAX_IN_FLIGHT if max_in_flight is None else max_in_flight)
        self._lock = threading.Lock()
        self._queue: deque[PendingCall] = deque()  # arrival order; a leader's call is first
        self._busy = False  # a group is being formed or handed to the producer

    def commit(self, call: PendingCall) -> list[Decision]:
        """Join the next group; return this call's decisions or raise its error."""
        with self._lock:
            self._queue.append(call)
            if not self._busy:
                self._busy = call._leads = True
        if not call._leads:
            try:
                call._wake.wait()
            except BaseException:  # interrupted while waiting (KeyboardInterrupt)
                self._leave(call)
                raise
        if not call._done:
            self._lead(call)
        if call.error is not None:
            raise call.error
        assert call.decisions is not None
        return call.decisions

    def _take(self) -> list[PendingCall]:
        # The leader's call first, then every call that fits, in arrival order.
        group: list[PendingCall] = []
        records = size = 0
        with self._lock:
            while self._queue:
                nxt = self._queue[0]
                if group and (records + len(nxt.pairs) > self.max_records
                              or size + nxt.size > self.max_bytes):
                    break
                group.append(self._queue.popleft())
                records += len(nxt.pairs)
                size += nxt.size
        return group

    def _lead(self, call: PendingCall) -> None:
        time.sleep(0)  # let callers the last group woke queue up (a yield, not a timer)
        handed = False

        def produced() -> None:  # the next group may start its write now
            nonlocal handed
            with self._lock:
                if not handed:
                    handed = True
                    self._hand_on()

        self._in_flight.acquire()  # calls queue meanwhile: the next group is larger
        group = self._take()
        assert group and group[0] is call
        try:
            self._run(group, produced)
        except BaseException as e:
            for c in group:
                if c.decisions is None and c.error is None:
                    c.error = e if isinstance(e, Exception) or c is call else OutcomeUnknown(
                        f"records of this call may or may not be in the log: the call "
                        f"leading its group was interrupted ({type(e).__name__})",
                        tuple(event.event_id for _, event in c.pairs))
            if not isinstance(e, Exception):
                raise
        finally:
            self._in_flight.release()
            with self._lock:
                for c in group:
                    c._done = True
                    if c is not call:
                        c._wake.set()
                if not handed:
                    handed = True
                    self._hand_on()

    def _hand_on(self) -> None:
        # Under the lock: the first waiting call leads the next group, else nobody.
        if self._queue:
            self._queue[0]._leads = True
            self._queue[0]._wake.set()
        else:
            self._busy = False

    def _leave(self, call: PendingCall) -> None:
        with self._lock:
            if call in self._queue:  # not taken into a group: it never left this process
                self._queue.remove(call)
                if call._leads:
                    self._hand_on()
                return
        # Taken into a group in flight: its leader answers it; nobody waits for the answer.


def _renewed_calls(slots: list[list[tuple[str, Event]]],
                   waiting: dict[str, Decision | None]) -> dict[str, str]:
    """The calls of a write to re-send as fresh calls (call id -> the fresh call id): those
    whose commit is undecided and that hold a record under a key of its own (a submit under
    its birth key), which a verbatim copy would supersede and move later in the log."""
    undecided = {copies[-1][1].event_id for copies in slots
                 if isinstance(copies[-1][1], CallCommitted)
                 and not any(waiting.get(c.event_id) is not None for _, c in copies)}
    out: dict[str, str] = {}
    for copies in slots:
        key, e = copies[-1]
        call = getattr(e, "call_id", None)
        if call is not None and call in undecided and e.event_id in key and call not in out:
            out[call] = new_event_id()
    return out


def _own_key(key: str, event: Event) -> bool:
    """Whether ``event``'s key is its own (it names the event's id), as a grant's, a
    revoke's, a job's end's or a lone submit's is; not a call's commit, whose id its records
    name, nor a call's record (a submit of ``submit_many``): a call with such a record is
    re-sent whole as a fresh call (:func:`_renewed_calls`; a fresh record with the old call
    id would be a record the first commit never saw, and a compacted log's only commit, a
    verbatim copy of the first, would find more records than it names), one without
    verbatim."""
    return (event.event_id in key and not isinstance(event, CallCommitted)
            and getattr(event, "call_id", None) is None)


def error_for_call(error: RegistryError, event_ids: tuple[str, ...]) -> RegistryError:
    """A group's error as one of its calls raises it: the same class, message and
    attributes, carrying that call's own ``event_ids`` (a copy: each caller raises its
    own, so no two threads add to one traceback)."""
    copy = type(error).__new__(type(error))
    copy.args = error.args
    copy.__dict__.update(vars(error))
    copy.event_ids = event_ids
    copy.__cause__, copy.__context__ = error.__cause__, error.__context__
    copy.__suppress_context__ = error.__suppress_context__
    return copy
