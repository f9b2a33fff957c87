"""Fourth adversarial pass against issue 42: the re-sends of ``registry/writes.py``
(``_renewed_calls``, ``_own_key``), births under keys of their own (``keys.birth_key``, grant
layout 1, the due-birth restatement, the ABSENT reassertion on a birth key) and today's
``rules._released``.

The write path is driven as the client drives it: :class:`registry.writes.TermWrites` over a
:class:`registry.folded.FoldedLog`, with an in-memory partition behind a fake reader and a fake
producer whose first write "times out" while the broker still holds the request (README "How
late a copy can land": a request the network held lands when it is delivered, however late;
``tests/integration/test_late_copy.py`` shows it on a real broker). Nothing else is faked:
the fold, the planning of reassertions and the re-send logic are the shipped code.

One root, three tests: ``writes._own_key`` re-sends a ``JobReasserted`` under its own birth
or end key (the due restatement of a legacy job's birth or end) as a fresh event under a fresh
key, like a submit or an end; but where a late first copy of a submit or an end is refused
(job_exists, terminal_job), either copy of a restatement is accepted whenever it lands in the
term and restates the job whole, undoing what the term acknowledged in between. Fixed in
the fold (rule 5), where the copies are decided: under its own birth key, of a job the fold
knows, a restatement restates the birth alone; under an end key of a job whose end lies under
one already, nothing; and no restatement makes a clean result dirty again.

Held (tried, no test): a ``submit_many`` held while its fresh call lands, delivered after it
whole, in part (first record only, the rest only) or just before the re-send, with and
without a following grant and settling: both jobs live, the answer accepted, nothing
unsettled, the same answer and no refusal accepted at every legal cut.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from support.model import NS, checkpoint_event

from registry.events import (
    CheckpointFailed,
    CheckpointTriggered,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobCleanedUp,
    JobLockReleased,
    JobRecoveryFailed,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold, plan_reassertions
from registry.folded import FoldedLog
from registry.image import LogRecord
from registry.keys import job_key, record_key
from registry.log import WriteFailed
from registry.wire import default_codec
from registry.writes import TermWrites

CODEC = default_codec()
STAMP = 1_000_000  # one duplicate window for the whole history: no id is forgotten


class Partition:
    """The namespace's partition: records in log order, dense offsets."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []

    def append(self, key: str | bytes, value: bytes) -> LogRecord:
        if isinstance(key, str):
            key = key.encode()
        r = LogRecord(len(self.records), key, value, STAMP)
        self.records.append(r)
        return r

    def put(self, event, key: str | None = None) -> LogRecord:
        return self.append(key if key is not None else record_key(event), CODEC.encode(event))


class Reader:
    """A read_committed reader of :class:`Partition` (every record readable at once)."""

    def __init__(self, part: Partition) -> None:
        self.part, self.position, self.stable_end = part, 0, None

    def _next(self) -> Iterable[list[LogRecord]]:
        batch = self.part.records[self.position:]
        self.position = len(self.part.records)
        return [batch] if batch else []

    def sync(self, timeout: float) -> Iterable[list[LogRecord]]:
        return self._next()

    def read_to_end(self, timeout: float) -> Iterable[list[LogRecord]]:
        return self._next()

    def read_until(self, offset: int, timeout: float) -> Iterable[list[LogRecord]]:
        return self._next()

    def take_own(self, records: list[LogRecord]) -> bool:
        return False  # always read them back

    def lag(self) -> int:
        return 0

    def seek(self, offset: int) -> None:
        self.position = offset

    def close(self) -> None:
        pass


class Producer:
    """A term's producer. ``plan``: per write, ``"ok"`` (appended and acknowledged),
    ``"held"`` (the request left the client, the client's wait timed out, the network holds
    it: :meth:`deliver` appends it later) or ``"after_held"`` (the held request is delivered
    just before this write's records, then they are appended and acknowledged)."""

    def __init__(self, part: Partition, plan: list[str]) -> None:
        self.part, self.plan, self.held = part, plan, []

    def start(self, records: list[tuple[str, bytes]]):
        return list(records)

    def wait(self, sending) -> list[LogRecord]:
        mode = self.plan.pop(0) if self.plan else "ok"
        if mode == "after_held":  # the held request reaches the broker just before this one
            self.deliver()
            mode = "ok"
        if mode == "held":
            self.held.append(sending)
            raise WriteFailed("message timed out", fatal=False, in_doubt=len(sending))
        return [self.part.append(k, v) for k, v in sending]

    def deliver(self) -> None:
        """The held request reaches the broker now, and is appended."""
        for sending in self.held:
            for k, v in sending:
                self.part.append(k, v)
        self.held = []

    def close(self) -> None:
        pass


def _grant(epoch: int, writer: str, layout: int) -> LeadershipGranted:
    return LeadershipGranted(event_id=new_event_id(), namespace=NS, epoch=epoch, writer=writer,
                             created_at=0, prev_epoch=epoch - 1, saw_renewal=None,
                             layout=layout)


def _common(epoch: int, writer: str) -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=epoch, writer=writer,
                created_at=0)


def _term(part: Partition, epoch: int, writer: str, plan: list[str]):
    """A term's write protocol over ``part`` (as :class:`registry.client.Term` makes it)."""
    log = FoldedLog(Reader(part), NS, CODEC)  # type: ignore[arg-type]
    log.sync(1.0)
    writes = TermWrites(log, None, "jobreg", NS, 0, 1.0, epoch,  # type: ignore[arg-type]
                        lambda: None)
    producer = Producer(part, plan)
    writes.writer = producer  # type: ignore[assignment]
    writes.MAX_RESENDS = 3
    return log, writes, producer


def _legacy_log(part: Partition, checkpoints: bool = False) -> None:
    """A jobreg of layout 0 (grant epoch 1) submitted job a under its job key (and, with
    ``checkpoints``, triggered checkpoints 1 and 2: seq 2, pending (1, 2)); then this
    jobreg's grant (epoch 2, layout 1): a's birth is due under a birth key."""
    part.put(_grant(1, "jm-1", 0))
    legacy = JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **_common(1, "jm-1"))
    part.put(legacy, job_key(NS, "a"))
    for cp in (1, 2) if checkpoints else ():
        view = fold(part.records, NS).jobs["a"]
        part.put(checkpoint_event(view, CheckpointTriggered, cp, _common(1, "jm-1")))
    part.put(_grant(2, "jm-2", 1))


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["release", "adopt", "recovery_failed", "counted_failure"])
def test_a_late_first_copy_of_a_restated_birth_undoes_an_acknowledged_write(
        command: str) -> None:
    """History (honest: the client's own writes; one request the network held, as
    ``test_late_copy.py`` shows a real broker appends when it is delivered):

    1. A jobreg of layout 0 leads (grant epoch 1) and submits job a under a's job key (the
       submit sets a's owner to term 1; for ``counted_failure`` it also triggers checkpoints
       1 and 2).
    2. This jobreg claims (grant epoch 2, layout 1). a's birth is due (``unsettled`` holds
       ``prod/job/a/birth/``); the term's first write (``Term._start``'s settling) is the
       restatement R of a's whole state (ACTIVE, owner 1, checkpoints seq 2 pending (1, 2))
       under a fresh birth key ``birth/R``.
    3. R's write times out on the client; the request is held by the network. The sync shows
       nothing; ``TermWrites.send`` re-sends R, a record under a key of its own, as a FRESH
       event R' under a fresh birth key ``birth/R'`` (``_own_key``). R' lands: accepted.
    4. The term releases a / adopts a (its ``recover()``) / records a's recovery as failed /
       records a counted failure of checkpoint 2: acknowledged, accepted (a unowned / owned
       by term 2 / RECOVERY_FAILED with its error / counted (2,), pending (1,)).
    5. The held request is delivered: R lands. Its id was never folded (R' has another), so it
       is no duplicate; it lies under its own birth key, where a reassertion restates a's
       whole state (``_reasserted``: status, owner, error, graph, and checkpoints unless
       older in both seq and ids): it is ACCEPTED and restates a as it was at step 2. Its
       key is settled (accepted), so the leader plans nothing that restates it back.

    Broken: the acknowledged write is undone in the fold itself, no compaction needed: a is
    ACTIVE and owned by term 1 again (the release undone; term 2's adoption undone while
    term 2 runs the job, so ``recovery.candidates`` offers it to term 2's next recovery
    again; the recovery failure and its error gone), or checkpoint 2's counted failure is
    gone (pending again, the failure budget reset). A verbatim re-send (the case the README's "re-sent copies carry the same event
    id: rule 1 drops the duplicate" covers) would have been a duplicate; the fresh copy under
    a fresh key makes the late first copy a new event. Root: ``writes._own_key`` treats a
    ``JobReasserted`` under its own birth key like a submit or an end, whose late first copy
    is refused (job_exists / terminal_job); but a reassertion there restates the job and is
    accepted whenever it lands in the term (``rules._reassertion``/``_reasserted``, the birth
    key branch; ``_restated_checkpoints`` takes a state older in seq whose ids are not
    older)."""
    part = Partition()
    _legacy_log(part, checkpoints=command == "counted_failure")
    log, writes, producer = _term(part, 2, "jm-2", ["held", "ok", "ok"])
    assert f"{NS}/job/a/birth/" in log.image.unsettled
    restate = plan_reassertions(log.image, 2, "jm-2")
    assert [type(e).__name__ for _, e in restate] == ["JobReasserted"]
    decisions = writes.send(restate)
    assert decisions[0].accepted  # R' (the fresh copy) answered the settling
    assert producer.held  # R is still on its way
    assert log.image.jobs["a"].owner_epoch == 1
    if command == "release":
        ev = JobLockReleased(job_id="a", **_common(2, "jm-2"))
    elif command == "adopt":  # Term.recover() / retry(): term 2 takes a over
        ev = JobAdopted(job_id="a", **_common(2, "jm-2"))
    elif command == "recovery_failed":
        ev = JobRecoveryFailed(job_id="a", error="graph missing", **_common(2, "jm-2"))
    else:
        ev = checkpoint_event(log.image.jobs["a"], CheckpointFailed, 2, _common(2, "jm-2"))
    (d,) = writes.send([(record_key(ev), ev)])
    assert d.accepted and d.outcome == "ACCEPTED"  # acknowledged to the caller
    acknowledged = log.image.jobs["a"]
    producer.deliver()  # the held request lands now (same term, seconds later)
    log.sync(1.0)
    # The late copy holds the birth now (a later record than R'): the leader restates the
    # lock and the checkpoint state after it (rule 5, ``Delta._parts_due``) as they stand,
    # which undoes nothing; no restatement of the birth itself.
    repairs = plan_reassertions(log.image, 2, "jm-2")
    assert {k.rsplit("/", 1)[-1] for k, _ in repairs} <= {"lock", "checkpoints"}, repairs
    assert all((e.status, e.owner_epoch, e.error) == (
        log.image.jobs["a"].status, log.image.jobs["a"].owner_epoch, log.image.jobs["a"].error)
        for _, e in repairs)
    now = fold(part.records, NS).jobs["a"]
    assert (now.status, now.owner_epoch, now.error, now.checkpoints) == (
        acknowledged.status, acknowledged.owner_epoch, acknowledged.error,
        acknowledged.checkpoints), (
        f"the acknowledged {command} was undone by the late first copy of the restated "
        f"birth: {acknowledged} -> {now}")


def test_a_late_first_copy_of_a_restated_end_undoes_an_acknowledged_cleanup() -> None:
    """History (honest, as above): a jobreg of layout 0 (grant epoch 1) submits job a and
    cancels it under a's job key (an end as it wrote them: with a copy of the result, dirty,
    graph kept). This jobreg claims (grant epoch 2): a's end is due under an end key
    (``unsettled`` holds ``prod/job/a/end/``); the term's first write restates it: R_end, a
    ``JobReasserted`` (CANCELLED, dirty, the graph) under ``end/R_end``. Its write times
    out, the request held by the network; the client re-sends it as a fresh event R_end'
    under a fresh end key (``_own_key``): accepted, a's end now under an end key. The term
    then cleans a up (``mark_clean``: ``JobCleanedUp``): acknowledged, a's result is clean
    (no graph: blob collection may free it). The held request is delivered: R_end lands,
    under its own end key, where a reassertion restates the end: accepted (``_reasserted``:
    a terminal status takes the result it carries), and a's result is DIRTY again, holding
    the graph its cleanup deleted; the key is settled, nothing restates it back.

    Broken: the acknowledged cleanup is undone (the next ``cleanup()`` runs the hook again
    on deleted data, and the result that Flink's JobResultStore marked clean is dirty).
    Root: ``writes._own_key`` re-sends a reassertion under its own end key as a fresh event,
    and the late first copy is a new restatement of the end that the fold takes whole
    (``rules._reasserted``, terminal branch)."""
    part = Partition()
    part.put(_grant(1, "jm-1", 0))
    sub = JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **_common(1, "jm-1"))
    part.put(sub, job_key(NS, "a"))
    view = fold(part.records, NS).jobs["a"]
    cancel = JobCancelled(job_id="a", reason="by user", graph=view.graph,
                          checkpoints=view.checkpoints, **_common(1, "jm-1"))
    part.put(cancel, job_key(NS, "a"))
    part.put(_grant(2, "jm-2", 1))
    log, writes, producer = _term(part, 2, "jm-2", ["held", "ok", "ok"])
    assert f"{NS}/job/a/end/" in log.image.unsettled
    restate = plan_reassertions(log.image, 2, "jm-2")
    assert [type(e).__name__ for _, e in restate] == ["JobReasserted"]
    assert writes.send(restate)[0].accepted  # R_end' answered
    assert producer.held
    ended = log.image.jobs["a"]
    assert ended.dirty and ended.ended_by is not None
    clean = JobCleanedUp(job_id="a", status=ended.status, reason=ended.reason,
                         end_event_id=ended.ended_by, **_common(2, "jm-2"))
    (d,) = writes.send([(record_key(clean), clean)])
    assert d.accepted  # acknowledged: the result is clean
    assert not log.image.jobs["a"].dirty and log.image.jobs["a"].graph is None
    producer.deliver()
    log.sync(1.0)
    assert not plan_reassertions(log.image, 2, "jm-2"), "nothing for the leader to repair"
    now = fold(part.records, NS).jobs["a"]
    assert not now.dirty and now.graph is None, (
        f"the acknowledged cleanup was undone by the late first copy of the restated end: "
        f"{now}")


def test_a_fresh_copy_of_a_restated_birth_undoes_the_release_sent_with_it() -> None:
    """History (honest; no late delivery beyond the write's own re-send): the legacy log of
    the test above (job a born under its job key by a jobreg of layout 0, owner 1; grant
    epoch 2 of layout 1, a's birth due). The term's first command is ``release(a)``; its
    group plans the due restatement first (``Term._run_group``: reassertions, then the
    call): one write [R (a's whole state: ACTIVE, owner 1, under ``birth/R``), L (the
    release, a's lock key)].

    The write times out on the client while the network still holds it; the client's sync
    sees nothing; 50 ms later it re-sends: R as a FRESH event R' under ``birth/R'``
    (``_own_key``), L verbatim. The held request reaches the broker just before the
    re-send: the log is R, L, R', L-copy. R is accepted (a restated), L accepted (a
    unowned: the release's answer, acknowledged), R' is accepted too, a new event under its
    own birth key restating a's whole state as R planned it: owner 1 again; the L copy is a
    duplicate, which leaves a's lock key unsettled, and the leader's settling restates it
    from the fold: owner 1.

    Broken: the acknowledged release is undone (a is owned by term 1, which is over: no
    recovery of term 2 takes it, since it is not released), in the full fold, with the log's
    every copy inside one duplicate window. Had R been re-sent verbatim, R' would have been a
    duplicate. Root: ``writes._own_key`` (a ``JobReasserted`` under its own birth key re-sent
    fresh) and ``rules._reasserted`` taking a birth-key restatement whole whenever it lands."""
    part = Partition()
    _legacy_log(part)
    log, writes, producer = _term(part, 2, "jm-2", ["held", "after_held", "ok", "ok"])
    release = JobLockReleased(job_id="a", **_common(2, "jm-2"))
    pairs = plan_reassertions(log.image, 2, "jm-2") + [(record_key(release), release)]
    assert [type(e).__name__ for _, e in pairs] == ["JobReasserted", "JobLockReleased"]
    decisions = writes.send(pairs)
    assert decisions[1].accepted  # the release: acknowledged
    assert decisions[1].event_id == release.event_id
    # the leader settles what the log leaves unsettled (Term._settle, its next write)
    for _ in range(3):
        planned = plan_reassertions(log.image, 2, "jm-2")
        if not planned:
            break
        writes.send(planned)
    now = fold(part.records, NS).jobs["a"]
    assert now.owner_epoch is None, (
        f"the acknowledged release of a was undone by the fresh copy of its restated birth: "
        f"{now}")
