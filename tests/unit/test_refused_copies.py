"""Fold rule 1 takes a verbatim copy of an *accepted* record for a duplicate and decides a
copy of a refused one by the rules at its own position (the fourteenth adversarial read of
issue 42, F3: a copy of a refused record, made acceptable by the job's change since, was a
duplicate in the full fold and accepted in every log the cleaner passed, since the copy
supersedes the first under their key). So a writer's answer must follow: a later copy that
is accepted is the record's verdict, and a refusal is no answer while a copy sent earlier is
nowhere in the log (it may still land, and be accepted there), unless no later record can
turn it (a term over, an ended job).

The write loop runs here against a log in memory: the writer a test scripts (a copy held on
its way, a copy appended), the fold the client's own."""

from __future__ import annotations

import pytest

from registry.errors import OutcomeUnknown
from registry.events import (
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.folded import FoldedLog
from registry.image import LogRecord, Outcome
from registry.keys import record_key
from registry.log import WriteFailed
from registry.wire import default_codec
from registry.writes import TermWrites

NS = "ns"
CODEC = default_codec()


class _Log:
    """A partition in memory, and a reader of it (what :class:`FoldedLog` asks of one)."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self.position = 0
        self.stable_end: int | None = None

    def append(self, key: str, value: bytes) -> LogRecord:
        r = LogRecord(len(self.records), key.encode(), value, 1_000, 0)
        self.records.append(r)
        return r

    def event(self, e) -> LogRecord:
        return self.append(record_key(e), CODEC.encode(e))

    def _new(self) -> list[list[LogRecord]]:
        new, self.position = self.records[self.position:], len(self.records)
        return [new] if new else []

    def sync(self, timeout: float) -> list[list[LogRecord]]:
        return self._new()

    def read_to_end(self, timeout: float) -> list[list[LogRecord]]:
        return self._new()

    def read_until(self, offset: int, timeout: float) -> list[list[LogRecord]]:
        return self._new()

    def take_own(self, written: list[LogRecord]) -> bool:
        return False

    def lag(self) -> int:
        return 0


class _Writer:
    """The term's producer, scripted: ``plan`` says per write whether its records are held
    on their way (a failure in doubt: nothing appended now) or appended."""

    def __init__(self, log: _Log, plan: list[str]) -> None:
        self.log, self.plan = log, plan
        self.held: list[tuple[str, bytes]] = []

    def start(self, records):
        return records

    def wait(self, records):
        if self.plan.pop(0) == "held":
            self.held.extend(records)
            raise WriteFailed("held on its way", fatal=False, in_doubt=len(records))
        return [self.log.append(k, v) for k, v in records]

    def close(self) -> None:
        pass

    def deliver_held(self) -> None:
        for k, v in self.held:
            self.log.append(k, v)


def _common() -> dict:
    return dict(namespace=NS, epoch=1, writer="jm", created_at=0)


def _term(log: _Log, plan: list[str]) -> tuple[TermWrites, FoldedLog, _Writer]:
    folded = FoldedLog(log, NS, CODEC)  # type: ignore[arg-type]
    log.event(LeadershipGranted(event_id=new_event_id(), prev_epoch=0, **_common()))
    folded.sync(1.0)
    writes = TermWrites(folded, None, "t", NS, 0, 1.0, 1, lambda: None)  # type: ignore[arg-type]
    writer = _Writer(log, plan)
    writes.writer = writer  # type: ignore[assignment]
    return writes, folded, writer


def test_a_refusal_while_an_earlier_copy_may_still_land_is_no_answer() -> None:
    log = _Log()
    writes, folded, writer = _term(log, ["held", "appended"])
    adopt = JobAdopted(event_id=new_event_id(), job_id="a", **_common())
    with pytest.raises(OutcomeUnknown, match="refused unknown_job, but a copy of it sent "
                       "earlier is not in the log"):
        writes.send([(record_key(adopt), adopt)])
    # And it was not refused: the job is submitted, then the held copy lands and the fold
    # decides it at its position, as every log the cleaner passed does.
    log.event(JobSubmitted(event_id=new_event_id(), job_id="a", graph=InlineGraph(b"g"),
                           **_common()))
    writer.deliver_held()
    image = folded.sync(1.0)
    assert image.jobs["a"].owner_epoch == 1


def test_a_refusal_no_later_copy_can_turn_is_the_answer() -> None:
    log = _Log()
    writes, folded, _ = _term(log, ["appended", "held", "appended"])
    job = JobSubmitted(event_id=new_event_id(), job_id="a", graph=InlineGraph(b"g"), **_common())
    cancel = JobCancelled(event_id=new_event_id(), job_id="a", reason="r", **_common())
    writes.send([(record_key(job), job)])
    log.event(cancel)
    folded.sync(1.0)
    adopt = JobAdopted(event_id=new_event_id(), job_id="a", **_common())
    (d,) = writes.send([(record_key(adopt), adopt)])
    assert d.outcome == Outcome.REJECTED and d.reason == "terminal_job"


def test_an_accepted_later_copy_is_the_verdict_and_a_late_first_is_a_duplicate() -> None:
    log = _Log()
    writes, folded, writer = _term(log, ["appended", "held", "appended"])
    job = JobSubmitted(event_id=new_event_id(), job_id="a", graph=InlineGraph(b"g"), **_common())
    writes.send([(record_key(job), job)])
    adopt = JobAdopted(event_id=new_event_id(), job_id="a", **_common())
    (d,) = writes.send([(record_key(adopt), adopt)])
    assert d.outcome == Outcome.ACCEPTED
    writer.deliver_held()
    folded.waiting[adopt.event_id] = None
    folded.sync(1.0)
    assert folded.copies[adopt.event_id] == 1  # the late copy: a duplicate
    assert folded.waiting[adopt.event_id] is None


def test_a_copy_accepted_after_a_refused_first_is_the_records_verdict() -> None:
    log = _Log()
    folded = FoldedLog(log, NS, CODEC)  # type: ignore[arg-type]
    adopt = JobAdopted(event_id=new_event_id(), job_id="a", **_common())
    log.event(LeadershipGranted(event_id=new_event_id(), prev_epoch=0, **_common()))
    log.event(adopt)  # refused unknown_job
    log.event(JobSubmitted(event_id=new_event_id(), job_id="a", graph=InlineGraph(b"g"),
                           **_common()))
    log.event(adopt)  # the same bytes: decided by the rules, accepted
    log.event(adopt)  # a copy of the accepted one: a duplicate
    folded.waiting[adopt.event_id] = None
    image = folded.sync(1.0)
    d = folded.waiting[adopt.event_id]
    assert d is not None and d.outcome == Outcome.ACCEPTED and d.offset == 3
    assert folded.copies[adopt.event_id] == 3
    assert image.jobs["a"].owner_epoch == 1


def test_a_collection_tombstone_over_a_copy_that_became_the_holder() -> None:
    """The sixteenth read's H2: a raw trigger lands before the job's submit (refused
    ``unknown_job``); the leader plans its tombstone from that image; a held verbatim copy
    of the trigger lands first, and rule 1 decides it afresh: accepted, it holds the job's
    checkpoint state. The tombstone that lands next is junk over the holder: the state is
    due, the leader restates it, and every compacted log of the settled log folds the full
    log's answer."""
    from registry.dev import exhaustive as ex
    from registry.dev.exhaustive import _command, as_call
    from registry.fold import fold, plan_collection

    alphabet = ex.ALPHABETS["copies"]
    w = ex._World.empty()
    assert ex._apply(w, ("claim", "jm-1", "current"), alphabet)
    assert ex._apply(w, ("raw", "CheckpointTriggered", "current", "leader", "a", "own"),
                     alphabet)
    who = w.leader()
    assert who is not None
    w.write([(record_key(e), e) for e in as_call(_command(w.image, "submit", "a", 1,
                                                          who.term, who.name, 1))])
    plan = plan_collection(w.image)
    raw = next(r for r in w.log if type(r.event).__name__ == "CheckpointTriggered")
    assert plan == [raw.key.decode()]
    w.append(raw.key, raw.value, None, False)  # the held copy lands before the tombstone
    assert w.made[-1][0].outcome == Outcome.ACCEPTED
    w.collect(plan)
    assert w.made[-1][0].outcome == Outcome.QUARANTINED  # junk over the holder
    ex._settle_after(w)
    full = w.images[-1]
    assert not full.unsettled and full.jobs["a"].checkpoints.pending
    recs = [r.log_record() for r in w.log]
    keys, tombs = [r.key for r in w.log], [r.value is None for r in w.log]
    for cut in range(len(w.log) + 1):
        compacted = fold([recs[i] for i in ex.compacted_indices(keys, tombs, cut, len(w.log))],
                         ex.NS)
        assert ex._same_answer(full, compacted), (cut, ex._answer_diff(full, compacted))
