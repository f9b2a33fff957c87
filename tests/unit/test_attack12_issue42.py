"""The twelfth adversarial read of issue 42 (a helper who did not write the code, of the
eleventh read's fixes), its findings in the fold, each a failing test first:

- **D1b, a copy over a commit key.** A foreign writer's verbatim copy of its own record
  written under a committed call's commit key, within the duplicate window, was folded
  ``DUPLICATE`` (rule 1 decides on the event id alone), and a duplicate was taken for a copy
  of what its key held: nothing became due, yet the record superseded the commit, and a log
  cleaned past it lost both acknowledged jobs of the ``submit_many``.
- **D2, the same over a birth or an end key** (older than the eleventh read's fix): such a
  copy over a live job's birth key lost the job, over a cancelled job's end key made it live
  again.

(The read's D1, a copy of a call's member, another writer's record, is outside README
assumption 3; so is a copy of the leader's ABSENT removal over the job's key, which the
checker found while these tests were written: the cleaner can remove the first copy and let
the misplaced one act first.)

- **D1c, a forged commit** (the commit's event id, other bytes, under the commit's key):
  a duplicate by id; a log cleaned past it read the forged commit, which sank the call.
- **D9, a copy first misplaced**: a raw writer's record first under a wrong key (refused),
  then under its own key (a duplicate, no effect); once the cleaner removed the first (junk
  over its key, or the leader's restatement of it) the second was read alone and accepted:
  a job the full log never had, a live job CANCELLED.

Now rule 1 keeps the key and the CRC-32 of the bytes of each recent id's first copy: only a
copy with both is a duplicate; any other record with that id is decided by the rules, never
by its first copy (which the cleaner may remove), and one under the first copy's key is junk
to that key's bookkeeping whatever its verdict (``Delta._decide``, ``Delta.replay``). The
checker writes such copies (the ``copy`` raw type: the raw writer's own newest record over
the keys that hold a job's parts, or again under its own key, ``home``: the ``calls`` and
``copies`` alphabets). D4 (``Image.call_members`` kept an ended job's lock key) and D5 (a
snapshot of older rules resumed without ``call_members``) are in ``Delta._end`` and
``registry.snapshot.RULES`` (``tests/unit/test_snapshot.py``).
"""

from __future__ import annotations

import pytest

from registry.dev.exhaustive import (
    NS,
    check_history,
    compacted_indices,
    explore,
    format_report,
    only_junk_classes,
    replay_history,
)
from registry.fold import fold

C = ("claim", "jm-1", "current", False)


def _copy(where: str, settle: bool = True) -> tuple:
    return ("raw", "copy", "-", "-", "a", where, settle)


CASES = {
    "D1b-commit": ("calls", [C, ("write", "submit_many", "a", 1),
                             ("raw", "JobAdopted", "current", "leader", "a", "own", True),
                             _copy("call")]),
    "D2-birth": ("copies", [C, ("write", "submit", "a", 1),
                            ("raw", "CheckpointCompleted", "current", "leader", "a", "own",
                             True), _copy("birth")]),
    "D2-end": ("copies", [C, ("write", "submit", "a", 1), ("write", "cancel", "a", 1),
                          ("raw", "JobCancelled", "current", "leader", "a", "own", True),
                          _copy("end")]),
    # D9: the raw writer's submit first under a wrong key, then under its own birth key, then
    # junk over the wrong key: a job the full log never had, in a compacted log
    "D9-submit": ("copies", [C, ("raw", "JobSubmitted", "current", "leader", "a", "wrong",
                                 True), _copy("home"),
                             ("raw", "garbage", "-", "-", "a", "wrong", True)]),
    # D9b: a cancel first under the live job's lock key (the leader's restatement of the lock
    # supersedes it), then under its own end key: the live job CANCELLED in a compacted log
    "D9b-cancel": ("copies", [C, ("write", "submit", "a", 1),
                              ("raw", "JobCancelled", "current", "leader", "a", "wrong",
                               False), _copy("home")]),
    # The thirteenth read's E8, E9, E11: the raw writer's verbatim re-send of its own
    # accepted end, birth, checkpoint record (a duplicate under its own key, which the
    # cleaner keeps: the fact moves later, past records that rest on it)
    "E8-end": ("copies", [C, ("write", "submit", "a", 1),
                          ("raw", "JobCancelled", "current", "leader", "a", "own", True),
                          ("raw", "JobTerminated", "current", "leader", "a", "own", True),
                          _copy("same")]),
    "E9-birth": ("copies", [C, ("raw", "JobSubmitted", "current", "leader", "a", "own", True),
                            ("write", "release", "a", 1), _copy("same")]),
    "E11-checkpoint": ("copies", [C, ("write", "submit", "a", 1), ("write", "trigger", "a", 1),
                                  ("raw", "CheckpointCompleted", "current", "leader", "a",
                                   "own", True), ("write", "cancel", "a", 1), _copy("same")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_copy_over_a_key_that_holds_a_part_never_loses_it(case) -> None:
    alphabet, ops = CASES[case]
    log = replay_history(ops, alphabet)
    full = fold(log, NS)
    assert not full.unsettled, full.unsettled  # the leader settled: every cut is legal
    keys, dead = [r.key for r in log], [r.value is None for r in log]
    for cut in range(len(log) + 1):
        kept = [log[i] for i in compacted_indices(keys, dead, cut, len(log))]
        assert dict(fold(kept, NS).jobs) == dict(full.jobs), (case, cut)
    report = check_history(ops, alphabet)
    assert not {k for k in report.failures if k[0] in ("answer", "batch")}, \
        format_report(report)


@pytest.mark.parametrize("depth, below", [
    (4, [C]),
    (4, [C, ("write", "submit", "a", 1)]),
    (5, [C, ("write", "submit", "a", 1), ("write", "cancel", "a", 1)]),
    (6, [C, ("write", "submit", "a", 1),
         ("raw", "JobCleanedUp", "current", "leader", "a", "own", True)]),
], ids=["claimed-4", "live-4", "cancelled-5", "refused-cleanup-6"])
def test_below_a_job_with_copies_no_answer_class(depth, below) -> None:
    """Every history of the ``copies`` alphabet of up to 4 ops below a claim and below a live
    job, of up to 5 below a cancelled one, and of up to 6 below a refused cleanup of a live
    job: no answer or batch class, every verdict or path class has junk in it (garbage, a
    tombstone or a copy). The live and cancelled ones fail on the rules before the twelfth
    read's fix, the claimed and refused-cleanup ones on those before the fourteenth's (F3:
    a refused record re-sent verbatim once the job's submit or cancel made it acceptable)."""
    report = explore(depth, "copies", below=[list(o) for o in below])
    print(format_report(report))
    assert report.histories > 1_000
    failed = only_junk_classes(report)
    assert failed is None, failed


def test_an_ended_jobs_lock_key_leaves_call_members() -> None:
    """D4: an ended job's lock key holds nothing, so no entry of ``Image.call_members`` is
    kept for it (the births stay: a dirty result's graph lies there)."""
    ops = [C, ("write", "submit_many", "a", 1), ("write", "adopt_many", "a", 1),
           ("write", "cancel", "a", 1)]
    image = fold(replay_history(ops, "calls"), NS)
    assert f"{NS}/job/a/lock" not in image.call_members
    assert f"{NS}/job/b/lock" in image.call_members


def test_d1c_a_forged_commit_under_the_commits_key_never_loses_its_jobs() -> None:
    """D1c: a record under a committed call's key that reuses the commit's event id with
    other bytes (``size`` 1) was a duplicate by id; a log cleaned past it read the forged
    commit, which sank the call (``call_size_mismatch``): both jobs lost. Now only a copy
    with the same key and bytes is a duplicate, and one under the same key with other
    bytes is junk to it: the members' parts are due, and the leader restates them."""
    import dataclasses

    import registry.dev.exhaustive as ex

    world = ex._World.empty()
    for op in [C, ("write", "submit_many", "a", 1)]:
        ex._apply(world, op, ex.ALPHABETS["calls"])
    commit = world.log[-1]
    assert commit.event is not None
    value, read = ex._CODEC.encode_as_read(dataclasses.replace(commit.event, size=1))
    world.append(commit.key, value, read, False)
    ex._settle_after(world)
    log = [r.log_record() for r in world.log]
    full = fold(log, NS)
    assert set(full.jobs) == {"a", "b"} and not full.unsettled
    keys, dead = [r.key for r in log], [r.value is None for r in log]
    for cut in range(len(log) + 1):
        kept = [log[i] for i in compacted_indices(keys, dead, cut, len(log))]
        assert dict(fold(kept, NS).jobs) == dict(full.jobs), cut


def test_e5_a_re_send_is_a_copy_whatever_another_keys_record_of_its_id() -> None:
    """The thirteenth read's E5: a foreign writer's cancel of ``a`` (id X), its cancel of
    ``b`` reusing X under ``b``'s end key (decided anew: another key), junk over ``a``'s end,
    then the writer's verbatim re-send of the cancel of ``b``. Rule 1 took X's first record
    (``a``'s) for the one to copy, so the re-send was decided anew in the full log and, its
    refusal superseding ``b``'s end, made it due, while a log cleaned past the junk (``a``'s
    cancel gone) took it for a duplicate: before the leader settled, the two answers differed
    (``ended_by``). Now a copy is matched per id and key."""
    import dataclasses

    import registry.dev.exhaustive as ex
    from registry.keys import end_key

    alpha = ex.ALPHABETS["copies"].with_jobs(2)
    world = ex._World.empty()
    for op in [C, ("write", "submit", "a", 1), ("write", "submit", "b", 1)]:
        ex._apply(world, op, alpha)
    ex._apply(world, ("raw", "JobCancelled", "current", "leader", "a", "own"), alpha)
    ex._settle_after(world)
    first = next(r for r in world.log if r.key.startswith(f"{NS}/job/a/end/".encode()))
    assert first.event is not None
    x = first.event.event_id
    value, read = ex._CODEC.encode_as_read(dataclasses.replace(first.event, job_id="b"))
    world.append(end_key(NS, "b", x), value, read, False)
    ex._settle_after(world)
    world.append(first.key, b"\x00\x00\x00\x00\x63not avro at all", None, False)
    before = len(world.log)  # the re-send next, then the leader's settling
    world.append(end_key(NS, "b", x), value, read, False)
    ex._settle_after(world)
    log = [r.log_record() for r in world.log]
    keys, dead = [r.key for r in log], [r.value is None for r in log]
    index_of = {r.offset: i for i, r in enumerate(log)}
    for prefix in range(before, len(log) + 1):
        full = fold(log[:prefix], NS)
        # the lag bound (README assumption 1): no cut passes a record since which a key is
        # unsettled
        bound = min([prefix, *(index_of[o] for o in full.unsettled.values())])
        for cut in range(first.index + 2, bound + 1):  # past the junk's supersession of a's end
            kept = [log[i] for i in compacted_indices(keys[:prefix], dead[:prefix], cut, prefix)]
            compacted = fold(kept, NS)
            assert dict(compacted.jobs)["b"] == dict(full.jobs)["b"], (prefix, cut)
    assert not fold(log, NS).unsettled


def _with_verbatim_copy(ops, index: int) -> list:
    """The log of ``ops`` (the checker's), then a verbatim copy of its record ``index`` under
    its key, within the duplicate window, and the leader's settling."""
    import registry.dev.exhaustive as ex

    alpha = ex.ALPHABETS["copies"]
    world = ex._World.empty()
    for op in ops:
        base, settle = (op, False) if op[0] == "write" else (op[:-1], bool(op[-1]))
        ex._apply(world, tuple(base), alpha)
        if settle:
            ex._settle_after(world)
    rec = world.log[index]
    world.append(rec.key, rec.value, rec.event, False)
    ex._settle_after(world)
    return [r.log_record() for r in world.log]


F3 = {  # the fourteenth read's F3: a refused raw record re-sent verbatim after the job changed
    "F3a-completed-before-submit": ([C, ("raw", "CheckpointCompleted", "current", "leader",
                                         "a", "own", True), ("write", "submit", "a", 1)], 1),
    "F3b-restart-before-submit": ([C, ("raw", "JobRestarted", "current", "leader", "a", "own",
                                       True), ("write", "submit", "a", 1)], 1),
    "F3c-cleanup-of-live-job": ([C, ("write", "submit", "a", 1),
                                 ("raw", "JobCleanedUp", "current", "leader", "a", "own", True),
                                 ("write", "cancel", "a", 1)], 2),
}


@pytest.mark.parametrize("case", sorted(F3))
def test_f3_a_refused_records_verbatim_copy_never_takes_effect_after_compaction(case) -> None:
    ops, index = F3[case]
    log = _with_verbatim_copy(ops, index)
    full = fold(log, NS)
    assert not full.unsettled
    keys, dead = [r.key for r in log], [r.value is None for r in log]
    for cut in range(len(log) + 1):
        kept = [log[i] for i in compacted_indices(keys, dead, cut, len(log))]
        assert dict(fold(kept, NS).jobs) == dict(full.jobs), (case, cut)
