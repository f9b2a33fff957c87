"""Tenth adversarial read against issue 42: junk over a job's END key, then a late first copy
of the acknowledged end (the client re-sends an end as a fresh event under a fresh key, so the
stalled first copy may land after its re-send, within the duplicate window: README assumption
5). Until this fix, in the full fold the late copy *became the end* (``Delta._ended``: on an end
key, the job's ``ended_by`` gone with the junk, same status and reason), which settled the due
end, so the leader restated nothing. A log cleaned past the junk read whatever was refused
between the end and the late copy as if the job had no end yet, and nothing was ever restated:

J1 (ANSWER): a refused second end (terminate FAILED after cancel, refused terminal_job) reads
   as the end: an acknowledged CANCELLED job reads FAILED/'boom' for ever.
J2 (ANSWER): the leader's restatement of a dirty result's checkpoint state on a checkpoint key
   (after junk over the record the state stood on) is refused bad_state in the compacted log
   (the job is live there), and the late copy of the end then ends the job with the empty
   state: the result's pending/retained checkpoints are lost.
J3 (ANSWER): a checkpoint record refused terminal_job (the leader's completion landing after
   the cancel) is accepted for a live job in the compacted log and the late copy ends the job
   with it: the result holds a completed checkpoint the full fold never accepted.

Fixed at the root: a copy of a due end is accepted and changes nothing; it never settles the
end, only the leader's restatement does, whole (``Delta._ended``), so every refused record
between is restated over in every compacted log. Each test checks every legal cut.
"""

from __future__ import annotations

import dataclasses

from support.model import NS
from test_attack6_issue42 import Log, _common, _compacted, _legal_cuts, _start

from registry.events import (
    CheckpointCompleted,
    CheckpointTriggered,
    JobCancelled,
    JobStatus,
    JobTerminated,
    new_event_id,
)
from registry.fold import fold
from registry.keys import end_key
from registry.rules import checkpoint_step

GARBAGE = b"\x00\x00\x00\x00\x63not avro at all"


def _cancel_with_a_late_first_copy(log: Log) -> tuple[JobCancelled, JobCancelled]:
    img = fold(log.records, NS).jobs["a"]
    first = JobCancelled(job_id="a", reason="cancelled", graph=img.graph,
                         checkpoints=img.checkpoints, **_common())
    resent = dataclasses.replace(first, event_id=new_event_id())  # registry.writes: fresh
    log.put(resent)  # the re-send lands first and is acknowledged
    return first, resent


def _wrong_cuts(log: Log) -> list[tuple[int, object, object]]:
    full = fold(log.records, NS)
    out = []
    for c in _legal_cuts(log.records):
        comp = fold(_compacted(log.records, c), NS)
        if comp.answer() != full.answer():
            out.append((c, full.jobs["a"], comp.jobs["a"]))
    return out


def _trigger(log: Log, cp: int) -> None:
    before = fold(log.records, NS).jobs["a"].checkpoints
    after, _ = checkpoint_step(before, CheckpointTriggered, cp)
    log.put(CheckpointTriggered(job_id="a", checkpoint_id=cp, state=after, **_common()))


def test_j1_a_refused_second_end_becomes_the_end_after_junk_and_a_late_first_copy() -> None:
    log, _ = _start()
    first, resent = _cancel_with_a_late_first_copy(log)
    img = fold(log.records, NS).jobs["a"]
    # Flink reports the job FAILED meanwhile: refused terminal_job (the client sends it)
    log.put(JobTerminated(job_id="a", state=JobStatus.FAILED, reason="boom", graph=img.graph,
                          checkpoints=img.checkpoints, **_common()))
    log.raw(end_key(NS, "a", resent.event_id), GARBAGE)  # a foreign writer's junk
    log.put(first)  # the stalled first copy of the cancel lands (within the window)
    assert fold(log.records, NS).jobs["a"].ended_by is None  # accepted; the end still due
    log.settle()  # the end is still due: the leader restates it whole
    full = fold(log.records, NS)
    assert full.jobs["a"].status == JobStatus.CANCELLED and not full.unsettled
    wrong = _wrong_cuts(log)
    assert not wrong, [(c, comp.status, comp.reason) for c, _, comp in wrong]


def test_j2_a_dirty_results_restated_checkpoints_are_lost_after_junk_over_its_end() -> None:
    log, _ = _start()
    _trigger(log, 1)
    holder = log.records[-1].key
    first, resent = _cancel_with_a_late_first_copy(log)
    log.raw(holder, GARBAGE)  # junk over the record the state stands on
    log.settle()  # the leader restates the result's checkpoint state under a new key
    log.raw(end_key(NS, "a", resent.event_id), GARBAGE)  # junk over the end
    log.put(first)  # the stalled first copy of the cancel
    log.settle()  # the end is still due: the leader restates it whole
    full = fold(log.records, NS)
    assert full.jobs["a"].checkpoints.pending == (1,)
    wrong = _wrong_cuts(log)
    assert not wrong, [(c, comp.checkpoints) for c, _, comp in wrong]


def test_j3_a_refused_completion_is_in_the_result_after_junk_and_a_late_first_copy() -> None:
    log, _ = _start()
    _trigger(log, 1)
    before = fold(log.records, NS).jobs["a"].checkpoints
    first, resent = _cancel_with_a_late_first_copy(log)
    after, _ = checkpoint_step(before, CheckpointCompleted, 1, location="loc-1", retained=1)
    # the leader's completion, planned before the cancel, lands after it: terminal_job
    log.put(CheckpointCompleted(job_id="a", checkpoint_id=1, location="loc-1", state=after,
                                **_common()))
    log.raw(end_key(NS, "a", resent.event_id), GARBAGE)
    log.put(first)
    log.settle()
    full = fold(log.records, NS)
    assert full.jobs["a"].checkpoints.last_completed == -1
    wrong = _wrong_cuts(log)
    assert not wrong, [(c, comp.checkpoints) for c, _, comp in wrong]
