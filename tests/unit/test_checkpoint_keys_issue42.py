"""Checkpoint records under keys of their own (layout 2, fold rule 6) and the leader's
collection (``plan_collection``), on the pure fold: the stale records the bounded checker's 8
checkpoint classes were made of stay refused at every cut, the collection removes refused
records before the accepted ones they rest on, junk over the record a job's state stands on
makes the state due, and a log of layout 1 moves over without losing a stretch's lag.
"""

from __future__ import annotations

from registry.dev.exhaustive import check_history, compacted_indices, replay_history
from registry.events import (
    LAYOUT,
    CheckpointCompleted,
    CheckpointTriggered,
    InlineGraph,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold, plan_collection, plan_reassertions
from registry.image import LogRecord
from registry.keys import checkpoint_key, checkpoints_key, is_checkpoint_key, record_key
from registry.rules import checkpoint_step
from registry.wire import default_codec

NS = "prod"
CODEC = default_codec()
STALE = ("raw", "CheckpointTriggered", "current", "leader", "a", "stale")


def _common(epoch: int = 1) -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=epoch, writer="jm-1",
                created_at=0)


class Log:
    def __init__(self) -> None:
        self.records: list[LogRecord] = []

    def put(self, event, key: str | None = None) -> LogRecord:
        r = LogRecord(2 * len(self.records), (key or record_key(event)).encode(),
                      CODEC.encode(event), 1_000_000 + len(self.records))
        self.records.append(r)
        return r

    def tomb(self, key: str) -> None:
        self.records.append(LogRecord(2 * len(self.records), key.encode(), None,
                                      1_000_000 + len(self.records)))

    def settle(self, epoch: int = 1) -> None:
        for key in plan_collection(fold(self.records, NS), first=True):
            self.tomb(key)
        image = fold(self.records, NS)
        for key, event in plan_reassertions(image, epoch, "jm-1"):
            self.put(event, key)
        for key in plan_collection(fold(self.records, NS)):
            self.tomb(key)

    def cuts(self) -> list[list[LogRecord]]:
        """The compacted log at every cut README assumption 1 allows (the whole log old)."""
        unsettled = set(fold(self.records, NS).unsettled.values())
        bound = min([i for i, r in enumerate(self.records) if r.offset in unsettled],
                    default=len(self.records))
        keys = [r.key for r in self.records]
        tombs = [r.value is None for r in self.records]
        return [[self.records[i] for i in compacted_indices(keys, tombs, c, len(keys))]
                for c in range(bound + 1)]


def _trigger(log: Log, job: str, cp: int, key: str | None = None, **common) -> LogRecord:
    state, _ = checkpoint_step(fold(log.records, NS).jobs[job].checkpoints,
                               CheckpointTriggered, cp)
    return log.put(CheckpointTriggered(job_id=job, checkpoint_id=cp, state=state,
                                       **(common or _common())), key)


def test_a_stale_checkpoint_record_stays_refused_at_every_cut() -> None:
    """The checker's former classes (``stale_checkpoint_seq`` and the compacted fold's ids
    going back), on one history: a trigger, then a raw trigger from a view without the job's
    checkpoint records (seq 1 again), the leader settling or not. Under its own key the stale
    record supersedes nothing; the checker finds no counterexample at any prefix or cut."""
    for settle in (False, True):
        ops = [("claim", "jm-1", "current", False), ("write", "submit", "a", 1),
               ("write", "trigger", "a", 1), (*STALE, settle), ("write", "trigger", "a", 1)]
        report = check_history(ops)
        assert not report.failures, sorted(report.failures)
        log = replay_history(ops)
        image = fold(log, NS)
        assert all(is_checkpoint_key(r.key) for r in log if r.value is not None
                   and type(CODEC.decode(r.value)).__name__ == "CheckpointTriggered")
        assert [d.reason for d in image.rejected].count("stale_checkpoint_seq") == 1


def test_the_collection_removes_refused_records_before_the_accepted_ones() -> None:
    log = Log()
    log.put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=LAYOUT, **_common()))
    log.put(JobSubmitted(job_id="a", graph=InlineGraph(b"g"), **_common()))
    first = _trigger(log, "a", 1)
    # a stale copy of the trigger's write (same seq, from the submit's view): refused
    stale_state, _ = checkpoint_step(fold(log.records[:2], NS).jobs["a"].checkpoints,
                                     CheckpointTriggered, 1)
    stale = CheckpointTriggered(job_id="a", checkpoint_id=1, state=stale_state, **_common())
    log.put(stale)
    state, _ = checkpoint_step(fold(log.records, NS).jobs["a"].checkpoints,
                               CheckpointCompleted, 1, location="loc-1", retained=1)
    done = log.put(CheckpointCompleted(job_id="a", checkpoint_id=1, location="loc-1",
                                       state=state, **_common()))
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["stale_checkpoint_seq"]
    rec = image.checkpoint_records["a"]
    assert rec.holder == done.key.decode()
    # phase one: the refused record only (it rests on the trigger)
    assert plan_collection(image) == [record_key(stale)]
    log.tomb(record_key(stale))
    image = fold(log.records, NS)
    # phase two: the superseded trigger, once no refused record lies before the holder
    assert plan_collection(image) == [first.key.decode()]
    log.tomb(first.key.decode())
    full = fold(log.records, NS)
    assert [k for k, _ in full.checkpoint_records["a"].keys] == [done.key.decode()]
    assert not plan_collection(full) and not full.quarantined
    for compacted in log.cuts():
        image = fold(compacted, NS)
        assert image.answer() == full.answer()
        if any(r.key == record_key(stale).encode() and r.value is not None
               for r in compacted):  # where it is still there, it is still refused
            assert stale.event_id in {d.event_id for d in image.rejected}


def test_junk_over_the_record_the_state_stands_on_makes_it_due() -> None:
    log = Log()
    log.put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=LAYOUT, **_common()))
    log.put(JobSubmitted(job_id="a", graph=InlineGraph(b"g"), **_common()))
    holder = _trigger(log, "a", 1)
    log.tomb(holder.key.decode())  # a stranger's tombstone over it
    image = fold(log.records, NS)
    assert image.quarantined[-1].reason == "tombstone"
    assert f"{NS}/job/a/checkpoint/" in image.unsettled
    log.settle()  # the junk's key collected first, then the state restated
    ((key, restated),) = [(r.key.decode(), CODEC.decode(r.value)) for r in log.records
                          if r.value is not None and type(CODEC.decode(r.value)).__name__
                          == "JobReasserted"]
    assert key == checkpoint_key(NS, "a", restated.event_id)
    assert restated.checkpoints == image.jobs["a"].checkpoints
    full = fold(log.records, NS)
    assert not full.unsettled and full.checkpoint_records["a"].holder == key
    for compacted in log.cuts():
        assert fold(compacted, NS).answer() == full.answer()


def test_a_layout_1_log_moves_over_and_keeps_its_stretch() -> None:
    """A log of layout 1 (checkpoint records under the one checkpoints key) with a refused
    record there, unsettled; then a grant of layout 2: the stretch goes on as the job's due
    state from the refused record's offset (no cut passes it until the restatement), the
    leader restates the state under a key of its own, and a record under the old key is
    refused ``wrong_key`` from then on."""
    log = Log()
    legacy = checkpoints_key(NS, "a")
    log.put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=1, **_common()))
    log.put(JobSubmitted(job_id="a", graph=InlineGraph(b"g"), **_common()))
    _trigger(log, "a", 1, legacy)
    stale_state, _ = checkpoint_step(fold(log.records[:2], NS).jobs["a"].checkpoints,
                                     CheckpointTriggered, 1)
    refused = log.put(CheckpointTriggered(job_id="a", checkpoint_id=1, state=stale_state,
                                          **_common()), legacy)
    image = fold(log.records, NS)
    assert image.unsettled[legacy] == refused.offset
    log.put(LeadershipGranted(prev_epoch=1, saw_renewal=None, layout=LAYOUT,
                              **{**_common(2), "writer": "jm-1"}))
    image = fold(log.records, NS)
    assert image.checkpoints_keyed and legacy not in image.unsettled
    assert image.unsettled[f"{NS}/job/a/checkpoint/"] == refused.offset
    log.settle(epoch=2)
    full = fold(log.records, NS)
    assert not full.unsettled
    assert full.jobs["a"].checkpoints == image.jobs["a"].checkpoints
    for compacted in log.cuts():
        assert fold(compacted, NS).answer() == full.answer()
    after = _trigger(log, "a", 2, legacy, **_common(2))
    refusal = fold(log.records, NS).rejected[-1]
    assert (refusal.offset, refusal.reason) == (after.offset, "wrong_key")
    assert fold(log.records, NS).jobs["a"] == full.jobs["a"]  # refused: no effect


def test_a_checkpoint_record_while_the_birth_is_due_is_restated_after_the_new_birth() -> None:
    """Junk over a live job's birth (its birth due), then a checkpoint record of it (accepted:
    the fold knows the job), then the client's fresh re-send of the submit and the leader's
    settling: in a log cleaned past the junk the job exists only from a later record and the
    checkpoint record is refused ``unknown_job`` there. The job's checkpoint state is due from
    the junk on (where the birth's stretch began), so no cut passes the junk until the leader
    restated it after the new birth (found by the eighth read's narrow alphabet at depth 5:
    the cut fell after the birth's restatement, before the state's)."""
    from registry.dev.exhaustive import Alphabet

    alphabet = Alphabet("narrow", jobs=1, commands=("submit", "discard"), zombie_commands=(),
                        raw_types=("CheckpointDiscarded", "garbage"), raw_epochs=("current",),
                        raw_writers=("leader",), raw_keys=("own",), max_raw=2, max_claims=1)
    ops = [("claim", "jm-1", "current", False), ("write", "submit", "a", 1),
           ("raw", "garbage", "-", "-", "a", "birth", False),
           ("raw", "CheckpointDiscarded", "current", "leader", "a", "own", False),
           ("dup", 0, True)]
    report = check_history(ops, alphabet)
    assert not [k for k in report.failures if k[0] in ("answer", "monotone")], \
        sorted(report.failures)
