"""Seventh adversarial read against issue 42 (a helper who did not write the change; the
fuzzer is ``tests/unit/attack7_fuzz.py``). Each test is a reproducer on the pure fold (the
leader's settling is ``plan_reassertions``, as the client calls it; the cleaner is
``registry.dev.exhaustive.compacted_indices`` at every cut README assumption 1 allows).

G1 (fixed): the fold watches only the birth key that holds a job's birth now (``born_by``).
A birth restatement re-sent as a fresh event lands twice; the later copy holds the birth, and
junk over the earlier copy's key went unnoticed. In a log cleaned past it, the later copy
(planned before the lock and checkpoint records written since, which precede it in the log)
is the job's first record, and those records are refused ``unknown_job``: an acknowledged
completed checkpoint and a failed recovery were lost, with nothing unsettled in either fold.
Now a birth that moves to a later record makes the job's lock and checkpoint state due, and
the leader restates them after it (``Delta._parts_due``; it also closed the sixth read's
open case).

G2 (fixed): the leader's birth restatement carried the checkpoint floor (``_floored``) though
the fold, of a job it knows, takes the birth alone. In a log cleaned past the junk that made
the birth due, that restatement is the job's first record and its floored ``seq`` was the
job's: every acknowledged checkpoint record written after it was refused
``stale_checkpoint_seq``. Now a birth restatement carries the job's own state.

G3 (open, a verdict; the answer is right: a strict expected failure): a late copy of a cancel (the fresh re-send of one in
doubt) that adopts the end once junk superseded the first copy's end key moves the job's
end later in every log cleaned past the junk, and a lock record between the two copies,
refused ``terminal_job`` (a row the README's table of refusals marks "the same in every
compacted log"), reads as accepted there.
"""

from __future__ import annotations

import dataclasses

import pytest
from support.model import NS
from test_attack6_issue42 import Log, _common, _compacted, _legal_cuts, _start

from registry.events import (
    EMPTY_CHECKPOINTS,
    CheckpointCompleted,
    CheckpointTriggered,
    JobAdopted,
    JobCancelled,
    JobRecoveryFailed,
    new_event_id,
)
from registry.fold import fold, plan_reassertions
from registry.image import JobView
from registry.keys import end_key, lock_key
from registry.rules import checkpoint_step

GARBAGE = b"\x00\x00\x00\x00\x63not avro at all"


def _complete_checkpoint_1(log: Log) -> None:
    """The term triggers and completes checkpoint 1 of job a (acknowledged writes)."""
    state, _ = checkpoint_step(fold(log.records, NS).jobs["a"].checkpoints,
                               CheckpointTriggered, 1)
    log.put(CheckpointTriggered(job_id="a", checkpoint_id=1, state=state, **_common()))
    state, _ = checkpoint_step(state, CheckpointCompleted, 1, location="loc-1", retained=1)
    log.put(CheckpointCompleted(job_id="a", checkpoint_id=1, location="loc-1", state=state,
                                **_common()))


def _wrong_cuts(records) -> dict[int, JobView | None]:
    full = fold(records, NS).answer()
    out = {}
    for cut in _legal_cuts(records):
        image = fold(_compacted(records, cut), NS)
        if image.answer() != full:
            out[cut] = image.jobs.get("a")
    return out


def test_g1_junk_over_an_earlier_copy_of_a_birth_restatement_keeps_the_job() -> None:
    """History (term 1 of jm-1, layout 1):

    0. grant; 1. B: submit a under ``birth/B``;
    2. junk (a tombstone) over ``birth/B``: a's birth is due;
    3. the leader settles: R, a ``JobReasserted`` of a's whole state under ``birth/R``
       (the fold takes the birth alone; ``born_by`` = R). Its request is in doubt;
    4-6. the term's next groups are acknowledged: trigger and complete checkpoint 1, a
       failed recovery (``RECOVERY_FAILED``, error ``x``);
    7. R', R's fresh re-send (``registry.writes``: a record under a key of its own is re-sent
       as a fresh event under a fresh key), lands: it carries R's state (planned at 3),
       the fold takes the birth alone and ``born_by`` = R';
    8. garbage over ``birth/R`` (a raw writer; the same junk as step 2, on another key).

    The fold: a is RECOVERY_FAILED with checkpoint 1 completed, and nothing is unsettled
    (the garbage is on a birth key the fold no longer watches), so the leader writes
    nothing. Compacted at any cut past record 8 (every cut is legal): ``birth/B`` and
    ``birth/R`` are gone, the checkpoint and lock records come first and are refused
    ``unknown_job``, and R' creates a whole: ACTIVE, owned by term 1, no checkpoint.

    Right answer: the full fold's. Every reader that starts after the cleaner (a new
    leader's recovery) restores a from no checkpoint (the acknowledged completion of
    checkpoint 1 lost) and retries a recovery the term declared failed; and nothing is
    unsettled in the compacted fold either, so no leader repairs it."""
    log, _ = _start()
    log.raw(log.records[1].key, None)  # 2: junk over birth/B
    # the birth restated (and, since the lock is due with it, the lock after it)
    ((key, restated), *_) = plan_reassertions(fold(log.records, NS), 1, "jm-1")
    assert "/birth/" in key
    log.put(restated, key)  # 3: R
    _complete_checkpoint_1(log)  # 4, 5
    log.put(JobRecoveryFailed(job_id="a", error="x", **_common()))  # 6
    resent = dataclasses.replace(restated, event_id=new_event_id())
    log.put(resent, key.replace(restated.event_id, resent.event_id))  # 7: R'
    log.raw(key, GARBAGE)  # 8: junk over birth/R
    full = fold(log.records, NS)
    assert full.jobs["a"].born_by == resent.event_id
    assert full.jobs["a"].status == "RECOVERY_FAILED"
    assert full.jobs["a"].checkpoints.last_completed == 1
    # R' holds the birth now: the lock and the checkpoint state are due after it (rule 5,
    # Delta._parts_due; until then nothing was unsettled and the leader wrote nothing)
    assert set(full.unsettled) == {f"{NS}/job/a/lock", f"{NS}/job/a/checkpoint/"}
    log.settle()
    full = fold(log.records, NS)
    assert not full.unsettled and full.jobs["a"].status == "RECOVERY_FAILED"
    assert full.jobs["a"].checkpoints.last_completed == 1
    assert not _wrong_cuts(log.records)  # failed: cut 9 gave ACTIVE, no checkpoint


def test_g2_a_floored_birth_restatement_never_undoes_later_checkpoints() -> None:
    """History (term 1 of jm-1, layout 1):

    0. grant; 1. B: submit a under ``birth/B`` (checkpoint seq 0);
    2. a raw ``CheckpointTriggered`` of a with ``seq`` 5 on a's lock key (a raw writer, the
       checker's "wrong key"; refused ``wrong_key``): ``Image.checkpoint_floors`` a = 5,
       the lock key unsettled;
    3. the leader settles the lock key (a lock restatement carrying the floored seq 5, of
       which the fold takes the lock alone): a's seq stays 0, its floor stays 5;
    4. junk (a tombstone) over ``birth/B``: a's birth is due;
    5. the leader settles: R under ``birth/R``, carrying checkpoints with ``seq`` 5
       (``fold._floored``); the fold takes the birth alone (seq stays 0);
    6, 7. the term triggers checkpoint 1 (seq 1) and completes it (seq 2): accepted,
       acknowledged. Nothing is unsettled.

    Compacted at any cut past record 4 (cuts 5 to 8): B and the raw record are gone, the
    lock restatement is refused ``unknown_job`` (no birth yet), R creates a whole with
    checkpoint seq 5, and the trigger and the completion are refused
    ``stale_checkpoint_seq``: a has no checkpoint.

    Right answer: checkpoint 1 completed (``loc-1``), as the full fold says. A recovery from
    the compacted log restores from no state; accepted records (the acknowledgement the
    term returned) become refusals. The floor exists for restatements the fold takes the
    checkpoints of; a birth restatement of a known job is not one, but it is the creating
    record in a log cleaned past the junk."""
    log, _ = _start()
    raw = dataclasses.replace(EMPTY_CHECKPOINTS, seq=5, pending=(1,))
    log.put(CheckpointTriggered(job_id="a", checkpoint_id=1, state=raw, **_common()),
            lock_key(NS, "a"))  # 2
    log.settle()  # 3
    assert fold(log.records, NS).checkpoint_floors.get("a") == 5
    log.raw(log.records[1].key, None)  # 4: junk over birth/B
    ((key, restated), *_) = log.settle()  # 5: R (and the lock after it)
    assert "/birth/" in key
    # (it carried seq 5, the floor, until the fix: now the job's own, seq 0)
    assert restated.checkpoints == fold(log.records, NS).jobs["a"].checkpoints
    _complete_checkpoint_1(log)  # 6, 7
    full = fold(log.records, NS)
    assert full.jobs["a"].checkpoints.last_completed == 1 and not full.unsettled
    assert not _wrong_cuts(log.records)  # fails: cuts 5-8 give a with no checkpoint


@pytest.mark.xfail(strict=True, reason="G3: a lock record refused terminal_job between an end "
                   "and its late fresh copy, which holds the end once junk superseded the "
                   "first, is accepted in a log cleaned past the junk")
def test_g3_a_lock_record_refused_terminal_job_stays_refused_after_compaction() -> None:
    """History (term 1 of jm-1, layout 1):

    0. grant; 1. submit a;
    2. C: cancel a under ``end/C``; the write is in doubt (its answer not read back);
    3. an adopt of a (the term's, or a raw one at its epoch): refused ``terminal_job``; a's
       lock key holds nothing of a result, so it is not restated;
    4. junk over ``end/C`` (a raw writer): a's end is due;
    5. C', C's fresh re-send (a record under a key of its own is re-sent as a fresh event
       under a fresh key), lands before the leader settled: it states the end and read alone
       gives the dirty result, so it holds the end (``ended_by`` = C'). Nothing is unsettled,
       the leader writes nothing.

    Compacted at a cut past record 4 (cuts 5 and 6, both legal): ``end/C`` is gone, so a is
    live when the adopt is folded: ACCEPTED; C' then ends a. The answer is the fold's (the
    end resets the lock), but the verdict of record 3 is not: the README's table says
    ``terminal_job`` of a lock record rests on the job's ends "each under a key of its own"
    and is the same in every compacted log. A consumer of verdicts (the audit tables'
    resurrections view, ``jobreg rejected``, a writer waiting on its record's verdict that
    re-reads a cleaned log) sees an adopt of an ended job accepted."""
    log, _ = _start()
    first = JobCancelled(job_id="a", reason="r", **_common())
    log.put(first)  # 2: C
    adopt = log.put(JobAdopted(job_id="a", **_common()))  # 3
    log.raw(end_key(NS, "a", first.event_id), GARBAGE)  # 4: junk over end/C
    resent = dataclasses.replace(first, event_id=new_event_id())
    log.put(resent)  # 5: C'
    full = fold(log.records, NS)
    assert [(d.offset, d.reason) for d in full.rejected] == [(adopt.offset, "terminal_job")]
    assert full.jobs["a"].ended_by == resent.event_id
    assert not full.unsettled and not log.settle(full)
    accepted = []
    for cut in _legal_cuts(log.records):
        delta_records = _compacted(log.records, cut)
        image = fold(delta_records, NS)
        assert image.answer() == full.answer(), cut
        if adopt in delta_records and all(d.offset != adopt.offset for d in image.rejected):
            accepted.append(cut)
    assert not accepted  # fails: [5, 6], the adopt accepted
