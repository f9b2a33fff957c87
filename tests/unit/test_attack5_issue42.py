"""Fifth adversarial pass against issue 42 (3842012..HEAD): a release sets the whole lock,
D2 (an end under an end key of a legacy-ended job only if it states that end, the leader's
ABSENT removal under an end key) and restatements re-sent fresh (under its own birth key, of
a known job, the birth alone; under an end key of a job whose end lies under one already,
nothing).

One root, two tests. A refused record under a key of its own (a second submit under its own
birth key, refused ``job_exists``; a second end under its own end key, refused
``terminal_job``) is never unsettled: the README's table says its refusal rests on the job's
birth (its end) "under a key of its own", which no later record supersedes. But the fold
itself admits that a later record can supersede a birth or an end there (junk, a tombstone, a
misplaced event: rule 5, D1), and then restates the birth (the end) under a fresh key; the
refused record resting on it stays, not unsettled. In a log the cleaner cleaned past the
junk (a cut ``_every_cut`` allows: nothing is unsettled once the leader restated), the birth
(end) is gone and the refused record is the job's first birth (end): accepted. And with
today's change 3 the leader's restatement, folded after it, restates the birth alone (does
nothing, for an end), so the compacted fold keeps what the refused record said.

Both tests pass on fcf2ac1 (the rules before change 3: the restatement restated the job whole
and repaired the answer, though the refused record still read as accepted there); they fail
on 9650bae: a regression of change 3 on top of the refused records never being removed.

Held (tried, no test): D2's ABSENT removal under an end key with a junk record on the legacy
job key before the leader's settling (every cut: the answer is the fold's, layout 0 and an
upgraded leader alike); a release of a RECOVERY_FAILED job (every lock record sets the whole
lock). Reasoned through, not run: a refused submit under its own birth key of a legacy-ended job before its end is
restated (accepted in a compacted log, the answer repaired by the end's restatement: the
README's table admits it until the end is restated).
"""

from __future__ import annotations

import pytest
from support.histories import DAY, build
from support.model import NS, compact, visible

from registry.codec import encode
from registry.events import JobCancelled, new_event_id
from registry.fold import fold
from registry.keys import birth_key, end_key
from registry.recovery import candidates


def _every_cut(log):
    """(cut, compacted image) for every cut the cleaner may make once the whole log is
    older than the lag and nothing in fold(log) is unsettled (as test_attack_issue42.py)."""
    full = fold(visible(log), NS)
    bound = min((i for i, r in enumerate(log) if r.offset in set(full.unsettled.values())),
                default=len(log))
    for c in range(bound + 1):
        yield c, fold(visible(compact(log, log[-1].timestamp + 40 * DAY, upto=c)), NS)


def _junk(sim, key: str, what: str) -> None:
    """A record on ``key`` that is not what it holds (the three of test_attack_issue42.py's
    D1 test): undecodable bytes, a tombstone, or a decodable event refused ``wrong_key``."""
    if what == "garbage":
        sim.append(key, b"\x00\x00\x00\x00\x63not avro at all")
    elif what == "tombstone":
        sim.append(key, None)
    else:
        other = JobCancelled(event_id=new_event_id(), namespace=NS, epoch=0, writer="zombie",
                             created_at=0, job_id="b")
        sim.append(key, encode(other))


@pytest.mark.parametrize("what", ["garbage", "tombstone", "wrong_key"])
@pytest.mark.parametrize("command", ["release", "recfail", "complete", "newterm"])
def test_a_refused_resubmission_becomes_the_birth_once_junk_superseded_the_birth(
        command: str, what: str) -> None:
    """History (the model's client writes, one record of junk as in the D1 test):

    1. jm-1 claims (epoch 1, layout 1) and submits a: its birth B under ``birth/B`` (owner
       1, graph-a, limits (1, 2)).
    2. The term writes an acknowledged lock or checkpoint record: ``release`` (a unowned,
       for the next recovery), ``recfail`` (RECOVERY_FAILED, error "boom") or ``complete``
       (trigger 1, complete 1: checkpoint 1 retained, ``loc-1``); or (``newterm``) jm-2
       claims (epoch 2), so a, owned by the dead term 1, is one of term 2's recovery
       candidates, and jm-2 is the term that writes steps 3 and 5.
    3. The term submits a again: S2 under its own birth key ``birth/S2`` (limits (2, 1)),
       refused ``job_exists``. Not unsettled: "a refused submit under its own birth key
       stands and is refused in every compacted log".
    4. Junk lands on ``birth/B`` (undecodable / a tombstone / another job's event,
       ``wrong_key``). It supersedes the birth: born_by cleared, a's birth is due.
    5. The leader settles: R, a ``JobReasserted`` of a's whole state under ``birth/R``;
       the fold (a known, live) takes the birth alone. Nothing is unsettled.

    Compacted at any cut past the junk (``_every_cut`` allows every cut: nothing is
    unsettled): B is gone (superseded on its key; a tombstone itself removed after
    delete.retention.ms). The step-2 records come first and are refused ``unknown_job``
    (no birth yet: not unsettled, a is unknown); S2 is then a's first birth: ACCEPTED,
    a ACTIVE owned by term 1 with empty checkpoints; R, of a job the fold now knows,
    restates the birth alone (change 3), so S2's lock and checkpoints stand.

    Broken: a refusal (``job_exists``, which the README's table says is "the same in every
    compacted log") became an acceptance, and the answer differs: the acknowledged release
    is undone (a owned by the current term again, so its recovery never takes it), the
    failed recovery is undone (ACTIVE, the error gone), or the completed checkpoint 1 is
    lost (empty checkpoints: the job would restart from no state); ``newterm``: a reads as
    owned by term 2 itself (S2's epoch), so ``recovery.candidates(image, 2)`` leaves it out
    and no term ever runs the live job. Nothing is unsettled
    in the compacted fold, so no leader repairs it. Root: ``Delta._note_settlement``'s
    birth-key branch clears ``born_by`` when a record supersedes a birth but leaves the
    refused submits that rested on that birth standing (never unsettled, never removed),
    and ``_reasserted``'s birth-alone branch (change 3) lets the first record that brings
    the job into existence in the compacted log, here the refused S2, keep its lock and
    checkpoints against the restatement R that carries the true ones."""
    ops = [("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1)]
    leader = "jm-2" if command == "newterm" else "jm-1"
    if command == "complete":
        ops += [("write", "jm-1", "trigger", "a", False, 1),
                ("write", "jm-1", "complete", "a", False, 1)]
    elif command == "newterm":
        ops += [("sync", "jm-2"), ("claim", "jm-2")]
    else:
        ops += [("write", "jm-1", command, "a", False, 1)]
    ops += [("write", leader, "submit", "a", False, 2)]
    sim = build(ops, settle=False)
    before = fold(visible(sim.log), NS)
    assert [(d.event_type, d.reason) for d in before.rejected] == [
        ("JobSubmitted", "job_exists")]
    assert not before.unsettled
    _junk(sim, birth_key(NS, "a", before.jobs["a"].born_by), what)
    sim.write(leader, None, None)  # the leader settles (Term._settle): restates a's birth
    full = fold(visible(sim.log), NS)
    assert not full.unsettled
    want = full.jobs["a"]
    assert (want.status, want.owner_epoch, want.error, want.checkpoints.last_completed) == {
        "release": ("ACTIVE", None, None, -1), "recfail": ("RECOVERY_FAILED", None, "boom", -1),
        "complete": ("ACTIVE", 1, None, 1), "newterm": ("ACTIVE", 1, None, -1)}[command]
    epoch = full.epoch
    wanted = [v.job_id for v in candidates(full, epoch)]
    for c, image in _every_cut(sim.log):
        got = image.jobs["a"]
        assert (got.status, got.owner_epoch, got.error, got.checkpoints) == (
            want.status, want.owner_epoch, want.error, want.checkpoints), (
            f"cut {c}: the refused resubmission read as a's birth: {want} -> {got}")
        assert [v.job_id for v in candidates(image, epoch)] == wanted, c
        assert image.answer() == full.answer(), c


@pytest.mark.parametrize("what", ["garbage", "tombstone", "wrong_key"])
def test_a_refused_second_end_becomes_the_end_once_junk_superseded_the_end(what) -> None:
    """History (the model's client writes; junk as in the D1 test):

    1. jm-1 claims (epoch 1, layout 1), submits a and cancels it: E1, ``JobCancelled``
       (reason "r1") under ``end/E1``: a CANCELLED, dirty.
    2. The term fails a (the model's client writes an end of a job it knows as ended):
       X, ``JobTerminated`` FAILED "boom 2" under its own ``end/X``, refused
       ``terminal_job``. Not unsettled (a's end lies under an end key: the refusal "rests
       on the job's ends, each under a key of its own").
    3. Junk lands on ``end/E1``: it supersedes the end (D1): ended_by cleared, a's end due.
    4. The leader settles: R, a ``JobReasserted`` CANCELLED "r1" under ``end/R``, a's end.
       Nothing unsettled.

    Compacted at any cut past the junk: E1 is gone. X is the first end of a live job:
    ACCEPTED, a FAILED "boom 2", ended_by X. R then lands under an end key of a job whose
    end lies under one already: change 3's branch "a copy of an end ... the result stands
    as it is" does nothing.

    Broken: the refused end became an acceptance (``terminal_job``, "the same in every
    compacted log") and the job's result differs: FAILED "boom 2" instead of CANCELLED
    "r1" (Flink's job result store reports a cancelled job as failed). Nothing is
    unsettled, so nothing repairs it. Root: as for births: ``_note_settlement``'s end-key
    branch clears ``ended_by`` when junk supersedes the end but leaves the refused ends that
    rested on it standing; and ``_reasserted``'s "nothing" branch for an end key of a job
    whose end lies under one already (change 3) cannot tell a late copy of its own
    restatement from a restatement that must override the end an earlier refused record
    made in a compacted log. (Before change 3, R restated the end whole and the answer was
    the full fold's.)"""
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1),
                 ("write", "jm-1", "cancel", "a", False, 1),
                 ("write", "jm-1", "fail", "a", False, 2)], settle=False)
    before = fold(visible(sim.log), NS)
    assert [(d.event_type, d.reason) for d in before.rejected] == [
        ("JobTerminated", "terminal_job")]
    assert not before.unsettled
    _junk(sim, end_key(NS, "a", before.jobs["a"].ended_by), what)
    sim.write("jm-1", None, None)  # the leader settles: restates a's end under an end key
    full = fold(visible(sim.log), NS)
    assert not full.unsettled
    assert (full.jobs["a"].status, full.jobs["a"].reason) == ("CANCELLED", "r1")
    for c, image in _every_cut(sim.log):
        got = image.jobs["a"]
        assert (got.status, got.reason) == ("CANCELLED", "r1"), (
            f"cut {c}: the refused second end read as a's end: {got}")
        assert image.answer() == full.answer(), c
