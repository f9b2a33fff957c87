"""Sixth adversarial read against issue 42 (a helper who did not write the change, with a
random-history fuzzer over held first copies, fresh re-sends, junk over any birth or end key
and leaders settling from compacted images): four defects in the fifth read's fix and around
it, and one the exhaustive checker could not write. Each test is the reproducer, on the pure
fold (the leader's settling is ``plan_reassertions``, as the client calls it).

F1, F2: the leader's removal of a refused lone submit (an ABSENT reassertion under its birth
key) deleted the live job where that key held the birth: a copy of the birth itself past the
duplicate window (its event id is the birth's), or, in a compacted log, a refused re-send
that read as the birth. Now a copy of the birth is never removed, and a removal of a refused
submit of a job the leader knows to be live names it (reason ``job_exists``) and never
removes the job: where the record it supersedes holds the birth, the birth is due again.

F3, F4: a late first copy of an end (a cancel, or the leader's end restatement) landing after
a cleanup became the key holding the result, although read alone it gives a dirty one: junk
over the end that held the clean result was then no longer noticed, and in a log cleaned past
it the cleanup was refused ``job_live`` and the copy ended the job dirty, graph back. Now an
end-key record holds the result only if read alone it gives it.

F5: an ended job forgot its birth key (``born_by``), which holds a dirty result's graph: junk
over it went unnoticed, and in a log cleaned past it the result had no graph and no
checkpoints. Now a dirty result keeps it, and junk there makes the end due (restated whole).

Open (strict expected failure, the last test): junk over a live job's birth with a lock
record before the births that stand: in a log cleaned past the junk the job is born after its
lock record, which is refused ``unknown_job``, and the birth's restatement restates the birth
alone, not the lock.
"""

from __future__ import annotations

import dataclasses

from support.model import NS

from registry.dev.exhaustive import compacted_indices
from registry.events import (
    LAYOUT,
    InlineGraph,
    JobCancelled,
    JobCleanedUp,
    JobLockReleased,
    JobRecoveryFailed,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import DUPLICATE_WINDOW_MS, fold, plan_collection, plan_reassertions
from registry.image import Image, LogRecord
from registry.keys import end_key, record_key
from registry.wire import default_codec

CODEC = default_codec()
T0 = 1_000_000


class Log:
    """A partition: records in log order (a raw writer may put anything on any key)."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self.stamp = T0

    def raw(self, key: str | bytes, value: bytes | None, stamp: int | None = None) -> LogRecord:
        if isinstance(key, str):
            key = key.encode()
        if stamp is not None:
            self.stamp = stamp
        r = LogRecord(len(self.records), key, value, self.stamp)
        self.stamp += 1
        self.records.append(r)
        return r

    def put(self, event, key: str | None = None) -> LogRecord:
        return self.raw(key if key is not None else record_key(event), CODEC.encode(event))

    def settle(self, image: Image | None = None) -> list:
        """The leader's settling (term 1, jm-1) from ``image`` (default: the full fold): the
        checkpoint records no state stands on of the jobs it restates first (fold rule 6's
        collection, ``plan_collection(first=True)``), then the restatements. Returns those."""
        image = image if image is not None else fold(self.records, NS)
        first = plan_collection(image, first=True)
        for key in first:
            self.raw(key, None)
        if first:
            image = fold(self.records, NS)
        pairs = plan_reassertions(image, 1, "jm-1")
        for key, event in pairs:
            self.put(event, key)
        return pairs


def _common() -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1", created_at=0)


def _start() -> tuple[Log, JobSubmitted]:
    log = Log()
    log.put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=LAYOUT, **_common()))
    birth = JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **_common())
    log.put(birth)
    return log, birth


def _legal_cuts(records: list[LogRecord]) -> range:
    """Every cut up to the first record of a key the full fold leaves unsettled
    (README assumption 1), the whole log being old."""
    unsettled = set(fold(records, NS).unsettled.values())
    bound = min([i for i, r in enumerate(records) if r.offset in unsettled],
                default=len(records))
    return range(bound + 1)


def _compacted(records: list[LogRecord], cut: int) -> list[LogRecord]:
    kept = compacted_indices([r.key for r in records], [r.value is None for r in records],
                             cut, len(records))
    return [records[i] for i in kept]


def _differing_cuts(records: list[LogRecord]) -> list[int]:
    full = fold(records, NS).answer()
    return [c for c in _legal_cuts(records)
            if fold(_compacted(records, c), NS).answer() != full]


def test_f1_the_removal_never_removes_a_copy_of_the_birth() -> None:
    log, birth = _start()
    first = log.records[-1]
    log.put(JobLockReleased(job_id="a", **_common()))
    # the same record again (same key, same bytes), three duplicate windows later
    log.raw(first.key, first.value, stamp=T0 + 3 * DUPLICATE_WINDOW_MS)
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["job_exists"]
    assert not log.settle(image), "a copy of the birth is not the leader's to remove"
    assert fold(log.records, NS).jobs["a"].born_by == birth.event_id


def test_f2_a_removal_of_a_refused_submit_never_removes_a_live_job() -> None:
    log, birth = _start()
    first = log.records[-1]
    log.put(JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **_common()))  # re-send
    log.raw(first.key, first.value)  # a verbatim copy of the birth (a duplicate)
    # (the copy moves the birth later in a cleaned log, so the birth is due too and is
    # restated under a new key: fold rule 1, the thirteenth read's E9)
    pairs = log.settle()
    removals = [e for _, e in pairs if e.status == "ABSENT"]
    assert [e.reason for e in removals] == ["job_exists"], pairs
    full = fold(log.records, NS)
    assert full.jobs["a"].live and not full.unsettled
    for cut in _legal_cuts(log.records):
        compacted = fold(_compacted(log.records, cut), NS)
        assert compacted.jobs["a"].live, cut  # was: deleted by the removal
        # a leader that starts on the compacted log settles from it: the job stays
        more = Log()
        more.records, more.stamp = list(log.records), log.stamp
        more.settle(compacted)
        assert fold(more.records, NS).jobs["a"].live, cut


def test_f3_a_late_first_copy_of_an_end_never_holds_a_clean_result() -> None:
    log, birth = _start()
    held = JobCancelled(job_id="a", reason="r", **_common())
    resent = dataclasses.replace(held, event_id=new_event_id())
    log.put(resent)  # the held request's fresh re-send lands first
    log.put(JobCleanedUp(job_id="a", status="CANCELLED", reason="r", **_common()))
    log.raw(end_key(NS, "a", resent.event_id), None)  # junk over the end holding the result
    log.put(held)  # the held first copy lands
    assert fold(log.records, NS).jobs["a"].ended_by is None  # still due
    log.settle()
    full = fold(log.records, NS)
    assert not full.jobs["a"].dirty and not full.unsettled
    assert not _differing_cuts(log.records)


def test_f4_a_late_copy_of_an_end_restatement_never_holds_a_clean_result() -> None:
    log, birth = _start()
    first_end = JobCancelled(job_id="a", reason="r", **_common())
    log.put(first_end)
    log.raw(end_key(NS, "a", first_end.event_id), None)  # junk: a's end due
    ((key, held),) = plan_reassertions(fold(log.records, NS), 1, "jm-1")
    resent = dataclasses.replace(held, event_id=new_event_id())
    log.put(resent, key.replace(held.event_id, resent.event_id))  # the fresh re-send lands
    log.put(JobCleanedUp(job_id="a", status="CANCELLED", reason="r", **_common()))
    log.put(held, key)  # the held first copy lands: dirty, planned before the cleanup
    assert fold(log.records, NS).jobs["a"].ended_by == resent.event_id
    log.raw(end_key(NS, "a", resent.event_id), None)  # junk over the end holding the result
    log.settle()
    full = fold(log.records, NS)
    assert not full.jobs["a"].dirty and not full.unsettled
    assert not _differing_cuts(log.records)


def test_f5_junk_over_a_dirty_results_birth_makes_its_end_due() -> None:
    from registry.events import CheckpointCompleted, CheckpointTriggered
    from registry.rules import checkpoint_step

    log, birth = _start()
    state, _ = checkpoint_step(fold(log.records, NS).jobs["a"].checkpoints,
                               CheckpointTriggered, 1)
    log.put(CheckpointTriggered(job_id="a", checkpoint_id=1, state=state, **_common()))
    state, _ = checkpoint_step(state, CheckpointCompleted, 1, location="loc-1", retained=1)
    log.put(CheckpointCompleted(job_id="a", checkpoint_id=1, location="loc-1", state=state,
                                **_common()))
    log.put(JobCancelled(job_id="a", reason="r", **_common()))
    assert fold(log.records, NS).jobs["a"].born_by == birth.event_id
    log.raw(log.records[1].key, None)  # junk (a tombstone) over the birth key
    assert f"{NS}/job/a/end/" in fold(log.records, NS).unsettled  # the end is due
    log.settle()  # restated whole: graph and checkpoints
    full = fold(log.records, NS)
    assert full.jobs["a"].dirty and full.jobs["a"].graph == birth.graph
    assert full.jobs["a"].checkpoints.last_completed == 1 and not full.unsettled
    assert not _differing_cuts(log.records)


def test_junk_over_a_live_birth_keeps_the_lock_in_every_compacted_log() -> None:
    """Junk over a live job's birth with a lock record before the births that stand: in a
    log cleaned past the junk the job is born after its lock record, which is refused
    ``unknown_job`` there. Open until the birth's restatement made the lock due (rule 5,
    ``Delta._parts_due``): the leader's next settling restates it after the birth."""
    log, birth = _start()
    log.put(JobRecoveryFailed(job_id="a", error="x", **_common()))
    for _ in range(2):  # two re-sends of the submit, each refused and removed
        log.put(JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **_common()))
        log.settle()
    log.records.pop()  # the second removal not yet written
    log.raw(log.records[1].key, b"\x00\x00\x00\x00\x63junk")  # junk over the birth key
    # the lock is due from the junk on; the leader restates it after the new birth
    assert f"{NS}/job/a/lock" in fold(log.records, NS).unsettled
    log.settle()  # the second removal, the birth restated, the lock after it
    log.settle()  # (Term._settle_once settles twice: nothing left)
    full = fold(log.records, NS)
    assert full.jobs["a"].status == "RECOVERY_FAILED" and not full.unsettled
    assert not _differing_cuts(log.records)
