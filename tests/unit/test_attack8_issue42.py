"""Eighth adversarial read against issue 42 (a helper who did not write the change): layout 2,
checkpoint records under keys of their own, and the leader's collection (fold rule 6,
``registry.fold.plan_collection``). Each test is a reproducer on the pure fold: the leader's
settling is ``plan_reassertions`` then ``plan_collection``, as ``Term.reassert()`` writes them;
the cleaner is ``registry.dev.exhaustive.compacted_indices`` at every cut README assumption 1
allows (no cut passes the first record of a key the full fold leaves unsettled).

H1 (open, strict expected failures; verdicts and the compacted fold's path, the answer right):
junk over the checkpoint record a job's state stands on (garbage, a stranger's tombstone: the
checker's junk over ``checkpoint``) removes that record without the leader's tombstone order. A
checkpoint record refused before the junk (``stale_checkpoint_seq``: a fresh re-send of the
holder as ``registry.writes`` makes it, or a raw record from a view without the holder) rests on
the removed record; a log cleaned past the junk and not yet past the refused record's tombstone
(the leader writes it before it restates the state, but a segment boundary may fall between
the junk and it) reads the refused record as accepted, and, for a stale trigger of the next id,
that id triggered twice and the pending id going back (or a discarded checkpoint pending again)
until the restatement, which wins on ``seq``. It is the class of junk over a fact under a key
of its own (as the bounded checker's 2 of junk over a birth key, and G3 of the seventh read):
no order of the leader's writes keeps a verdict resting on a fact a foreign writer destroyed.

H2 (fixed): junk over a dirty result's end key, then a raw checkpoint record refused
``terminal_job``: cleaned past the junk, the record was accepted for a live job, and the end's
restatement, whose checkpoints layout 2 no longer read for a known job, kept it in the result.
Now a terminal restatement restates the result's checkpoints again (they never change), and
the leader collects a job's records no state stands on before it restates anything of it.

H3 (fixed): junk over a live job's birth and the client's fresh re-send of the submit after a
completed checkpoint: the compacted fold lost the completed checkpoint. Now junk over a live
job's birth makes its lock and checkpoint state due from the junk on (``Delta._parts_due``),
restated after the new birth.

H2 and H3 and the discard variant of H1 were found by the checker over a narrow alphabet at
depth 5 with two raw records (``/tmp/a8_try2.py``); CI's alphabet allows one.
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
    new_event_id,
)
from registry.fold import fold, fold_batches, plan_collection
from registry.image import Image, Outcome
from registry.keys import record_key
from registry.rules import checkpoint_step

GARBAGE = b"\x00\x00\x00\x00\x63not avro at all"


def _decisions(records) -> dict[int, object]:
    out: dict[int, object] = {}
    fold_batches([list(records)], Image.empty(NS), on_decision=lambda d: out.__setitem__(
        d.offset, d))
    return out


def _collect(log: Log) -> list[str]:
    """The leader's collection (``TermWrites.collect``): a tombstone per planned key."""
    keys = plan_collection(fold(log.records, NS))
    for key in keys:
        log.raw(key, None)
    return keys


def _trigger(log: Log, cp: int, state=None) -> CheckpointTriggered:
    before = fold(log.records, NS).jobs["a"].checkpoints if state is None else state
    after, _ = checkpoint_step(before, CheckpointTriggered, cp)
    e = CheckpointTriggered(job_id="a", checkpoint_id=cp, state=after, **_common())
    log.put(e)
    return e


def _accepted_wrongly(log: Log, refused_offsets: list[int]) -> dict[int, list[int]]:
    """Per legal cut, the offsets among ``refused_offsets`` the compacted fold accepts."""
    out = {}
    for cut in _legal_cuts(log.records):
        d = _decisions(_compacted(log.records, cut))
        hit = [o for o in refused_offsets if o in d and d[o].outcome == Outcome.ACCEPTED]
        if hit:
            out[cut] = hit
    return out


@pytest.mark.xfail(strict=True, reason="H1: junk over the checkpoint holder removes it before "
                   "the leader collects a re-send refused on it; a log cleaned past the junk "
                   "reads the re-send as accepted")
def test_h1_a_refused_re_send_of_the_holder_stays_refused_after_junk_over_it() -> None:
    """History (term 1 of jm-1, layout 2):

    0. grant; 1. submit of job a (birth key);
    2. the term triggers checkpoint 1 (seq 1), under its own checkpoint key: accepted, the
       record job a's checkpoint state stands on (the holder). The write is in doubt, so the
       client re-sends it as a fresh event under a fresh key (``registry.writes._own_key``);
    3. the re-send lands too: refused ``stale_checkpoint_seq`` (its state is the job's);
    4. junk over record 2's key (garbage; a stranger's tombstone does the same): the state is
       due (``<ns>/job/a/checkpoint/`` unsettled);
    5. the leader restates the state under a new checkpoint key (``Term.reassert()``, or its
       next write's settling);
    then its collection (6, 7: tombstones of the re-send and of the junk), or, on the write
    path, nothing until ``COLLECT_BATCH`` records are due.

    Cut: the cleaner cleans past record 4 (legal once 5 settled the due key) before 6 lands:
    record 2 is gone, record 3 stays. Wrong: the compacted fold accepts record 3 (a trigger
    of checkpoint 1 from the birth's state). Right: refused, as in the full log (its verdict
    rests on record 2). Writers: the client itself (its re-send of a checkpoint record in
    doubt) and any junk the checker writes over a holder."""
    log, _ = _start()
    first = _trigger(log, 1)
    resent = dataclasses.replace(first, event_id=new_event_id())
    log.put(resent)
    refused = log.records[-1].offset
    full = _decisions(log.records)
    assert full[refused].reason == "stale_checkpoint_seq"
    log.raw(record_key(first), GARBAGE)
    (pair,) = log.settle()  # the restatement under a new checkpoint key
    assert "/checkpoint/" in pair[0]
    assert fold(log.records, NS).jobs["a"].checkpoints == first.state
    assert not fold(log.records, NS).unsettled
    # before the collection: every cut past the junk accepts the refused re-send
    assert _accepted_wrongly(log, [refused]) == {}  # fails: {5: [3], 6: [3]}


@pytest.mark.xfail(strict=True, reason="H1: a stale trigger refused on the checkpoint holder is "
                   "accepted once junk removed the holder: checkpoint 2 triggered twice, the "
                   "pending id going back in the compacted fold")
def test_h1_a_stale_trigger_is_never_accepted_nor_its_id_triggered_twice() -> None:
    """History (term 1 of jm-1, layout 2):

    0. grant; 1. submit of job a;
    2. the term triggers checkpoint 1 (seq 1): accepted, the holder;
    3. a raw CheckpointTriggered of checkpoint 2 at the current epoch under the leader's
       name, from a view without record 2 (seq 1, pending 2: the checker's raw ``stale``
       record): refused ``stale_checkpoint_seq``;
    4. garbage over record 2's key: the state is due;
    5. the leader restates it (seq 1, pending 1) under a new key;
    6, 7. the term completes checkpoint 1 (seq 2) and triggers checkpoint 2 (seq 3):
       acknowledged, accepted.
    (The leader's collection of record 3 not yet written: ``Term._settle`` collects only
    once ``COLLECT_BATCH`` are due.)

    Cut: past record 4. Wrong: the compacted fold accepts record 3, so a reader of that log
    sees checkpoint 2 triggered, then pending 1 again (the restatement), then checkpoint 2
    triggered a second time (record 7). Right: record 3 refused, checkpoint 2 triggered once.
    The final answer is the same in both folds (the restatement wins on seq)."""
    log, _ = _start()
    first = _trigger(log, 1)
    stale = _trigger(log, 2, state=EMPTY_CHECKPOINTS)  # from a view without record 2
    refused = log.records[-1].offset
    assert _decisions(log.records)[refused].reason == "stale_checkpoint_seq"
    log.raw(record_key(first), GARBAGE)
    log.settle()
    state = fold(log.records, NS).jobs["a"].checkpoints
    state, _ = checkpoint_step(state, CheckpointCompleted, 1, location="loc-1", retained=1)
    log.put(CheckpointCompleted(job_id="a", checkpoint_id=1, location="loc-1", state=state,
                                **_common()))
    _trigger(log, 2)
    full = fold(log.records, NS)
    assert not full.unsettled
    twice = {}
    for cut in _legal_cuts(log.records):
        records = _compacted(log.records, cut)
        assert fold(records, NS).answer() == full.answer()  # the answer is right
        d = _decisions(records)
        triggers = [o for o, x in d.items() if x.outcome == Outcome.ACCEPTED
                    and x.event_type == "CheckpointTriggered"]
        if refused in triggers:  # checkpoint 2 triggered at record 3 and again at record 7
            twice[cut] = triggers
    # the collection, once written, ends it: tombstones of the re-send and the junk
    assert set(_collect(log)) >= {record_key(stale)}
    assert twice == {}  # fails: at the cuts past record 4, record 3 accepted


# -- found by the checker over a narrow alphabet at depth 5 (two raw records, or junk and a
# re-send: beyond CI's bound of one raw record at depth 4). Reproducers as the checker's ops
# (``registry.dev.exhaustive.check_history``, which replays them as the client writes).

from registry.dev.exhaustive import Alphabet, check_history  # noqa: E402

NARROW = Alphabet("attack8", jobs=1, raw_epochs=("current",), raw_writers=("leader",),
                  raw_keys=("own",), checkpoint_ids=(1, 2), stale_claims=False,
                  torn_calls=False, max_raw=2, max_claims=1)
_C = ("claim", "jm-1", "current", False)
_S = ("write", "submit", "a", 1)


def test_h2_a_checkpoint_record_of_an_ended_job_never_reaches_its_result() -> None:
    """History: 0 grant; 1 submit of a; 2 cancel of a (end key E1; a dirty result with no
    checkpoints); 3 garbage over E1 (the end is due); 4 a raw CheckpointTriggered of a at the
    current epoch under the leader's name on its own checkpoint key: refused ``terminal_job``;
    5 the leader's settling: the end restated under a new end key E2 (then the collection).

    Cut: 4 (past the garbage; legal once 5 settled the end). The compacted fold has no end
    before record 4: the job is live, the trigger accepted (pending 1); E2 ends the job, and
    under layout 2 a known job's checkpoint state is not read from an end restatement
    (change 3), so the result keeps checkpoint 1 pending. Wrong: the compacted answer's
    checkpoints (pending 1, seq 1). Right: the full fold's (the empty state), the trigger
    refused. Under layout 1 the end restatement restated the result's checkpoints whole.
    Writers: junk over an end key (assumption 4's stranger, the checker's ``end`` junk) and
    any raw checkpoint record of an ended job (a late Flink JM)."""
    ops = [_C, _S, ("write", "cancel", "a", 1), ("raw", "garbage", "-", "-", "a", "end", False),
           ("raw", "CheckpointTriggered", "current", "leader", "a", "own", True)]
    report = check_history(ops, NARROW)
    assert not [k for k in report.failures if k[0] == "answer"], report.failures


@pytest.mark.xfail(strict=True, reason="H1: junk over the checkpoint holder, then a raw "
                   "discard from a stale view: the compacted fold takes a discarded "
                   "checkpoint pending again")
def test_h1_a_discarded_checkpoint_never_pending_again_in_a_compacted_fold() -> None:
    """History: 0 grant; 1 submit; 2 trigger of 1 (the holder); 3 garbage over record 2 (due);
    4 a raw CheckpointDiscarded of 1 from a view without record 2 (the state from the
    birth's, a rule violation written with the next seq); then the leader's settling
    (restatement of pending 1, collection). Cut past the garbage: the compacted fold takes
    record 4 (seq 1, checkpoint 1 discarded) and then the restatement makes checkpoint 1
    pending again (the checker's ``monotone`` check on the compacted fold). Right: the
    discard refused, checkpoint 1 pending throughout."""
    ops = [_C, _S, ("write", "trigger", "a", 1),
           ("raw", "garbage", "-", "-", "a", "checkpoint", False),
           ("raw", "CheckpointDiscarded", "current", "leader", "a", "stale", True)]
    report = check_history(ops, NARROW)
    assert not report.failures, report.failures


def test_h3_junk_over_the_birth_and_a_re_sent_submit_keep_the_checkpoints() -> None:
    """History: 0 grant; 1 submit of a (birth B1); 2 the term completes checkpoint 1 without
    triggering it (the client writes the next seq on a rule violation, as the checker's
    ``complete``); 3 garbage over B1 (the birth due); 4 the client's fresh re-send of the
    submit (``dup 0``: a new birth key), refused ``job_exists``, then the leader's settling.
    Cut 4 at 7 records: the compacted answer differs from the full one in the checkpoints:
    full ACTIVE with checkpoint 1 completed (loc-1, seq 1), compacted ACTIVE with the empty
    state: an acknowledged completed checkpoint lost (the checker's ``answer`` class ``JobSubmitted job_exists -> ACCEPTED``; KNOWN lists
    only the verdict class of this history)."""
    ops = [_C, _S, ("write", "complete", "a", 1),
           ("raw", "garbage", "-", "-", "a", "birth", False), ("dup", 0, True)]
    report = check_history(ops, NARROW)
    assert not [k for k in report.failures if k[0] == "answer"], report.failures
