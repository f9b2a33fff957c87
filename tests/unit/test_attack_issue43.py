"""The adversarial read of issue 43's rescaling (a helper who did not write it), its findings
each a failing test first (the helper's reproducers, ``/work/review-out``, moved into the tree):

- **H1, junk, a refused record, then the leader's next write.** Junk over the record a job's
  checkpoint state stands on, a record of the job rule 6 refuses (a raw current-epoch
  trigger of the pending id again, or a rescale planned from a view before the job's newest
  record), then the leader's ordinary completion, which the fold took as the new holder: the
  stretch ended, no lag held the cleaner back, and in a log cleaned past the junk the refused
  record read as accepted and the completion as refused. A new leader settling from that log
  made it permanent: an acknowledged completion undone, a refused rescale's requirements the
  job's. Now no record becomes the holder while the state is due and the log holds records
  of the job no state stands on (``Delta._note_checkpoint_record``): the leader collects
  them and restates the state, and the stretch ends there.
- **L1, a state taken whole without the requirements' check.** A terminal restatement (under
  an end key, or of a dirty result on its old checkpoints key) and a legacy end of a job the
  fold does not know took the checkpoint state they carry without ``requirements_error``: a
  result could hold requirements no rescale could write. Now every state taken whole is
  checked where it is taken (``rules._taken_whole``).
- **M2, the leader's own write refused beside its restatement.** After a failover a deposed
  leader's late record raised the job's checkpoint floor; junk over the holder made the
  state due; the leader's restatement, floored, and its next checkpoint record (a rescale, a
  completion), planned from the image, went in one write, and the restatement's raised seq
  refused the record ``stale_checkpoint_seq``. Now a fenced record raises no floor (it is
  refused in every compacted log: ``Delta._note_floor``), and a group's calls start from
  the states its restatements leave (``fold.restated_states``, ``Term._assemble``; also the
  calls of the groups formed while it is in flight).
- **M1, a restatement planned before a rescale undid it.** The floor raised the
  restatement's seq to the rescale's, and an equal seq is taken. With fenced records raising
  no floor, the read's history (a deposed leader's late record) holds; two writers of the
  current term planning from one view still meet it (a strict expected failure below).
"""

from __future__ import annotations

import pytest
from test_checkpoint_keys_issue42 import Log
from test_retained_checkpoints import _common, _submitted

from registry.dev.exhaustive import (
    ALPHABETS,
    NS,
    _apply,
    _settle_after,
    _World,
    check_history,
    compacted_indices,
    replay_history,
)
from registry.dev.exhaustive import _common as ex_common
from registry.events import (
    LAYOUT,
    UNKNOWN_CHECKPOINT,
    CallCommitted,
    CheckpointState,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobReasserted,
    JobRescaled,
    JobStatus,
    LeadershipGranted,
    VertexParallelism,
)
from registry.fold import (
    checkpoint_step,
    fold,
    plan_collection,
    plan_reassertions,
    requirements_error,
    restated_states,
)
from registry.image import LogRecord, Outcome
from registry.keys import call_key, end_key, job_key, lock_key, record_key
from registry.wire import default_codec

C = ("claim", "jm-1", "current", False)
BEFORE = [C, ("write", "submit", "a", 1), ("write", "trigger", "a", 1),
          ("raw", "garbage", "-", "-", "a", "checkpoint", False)]
REFUSED = {
    "trigger-again": ("raw", "CheckpointTriggered", "current", "leader", "a", "own", False),
    "stale-rescale": ("raw", "JobRescaled", "current", "leader", "a", "stale", False),
}


def _history(refused: str) -> list[tuple]:
    return [*BEFORE, REFUSED[refused], ("write", "complete", "a", 1)]


def _new_leader_settles(seen: list[LogRecord], *also: list[LogRecord]) -> None:
    """A new leader (epoch 2, ``jm-2``) claims from ``seen`` (the log as it read it) and
    settles as ``Term._start`` and then ``Term.reassert()`` do; each record it writes goes
    to ``also`` (the full log) too."""
    codec = default_codec()

    def add(key: str, value: bytes | None) -> None:
        for recs in (seen, *also):
            recs.append(LogRecord(recs[-1].offset + 2, key.encode(), value,
                                  2_000_000 + len(recs)))

    grant = LeadershipGranted(event_id="g2", namespace=NS, epoch=2, writer="jm-2",
                              created_at=0, prev_epoch=1, layout=LAYOUT)
    add(record_key(grant), codec.encode(grant))
    for _ in range(2):
        for k in plan_collection(fold(seen, NS), first=True):
            add(k, None)
        for k, e in plan_reassertions(fold(seen, NS), 2, "jm-2"):
            add(k, codec.encode(e))
        for k in plan_collection(fold(seen, NS)):
            add(k, None)


@pytest.mark.parametrize("refused", sorted(REFUSED))
def test_h1_every_compacted_log_keeps_the_leaders_write(refused: str) -> None:
    report = check_history(_history(refused), "full")
    answers = sorted(k for k in report.failures if k[0] == "answer")
    assert not answers, [report.failures[k].detail for k in answers]


@pytest.mark.parametrize("refused", sorted(REFUSED))
def test_h1_a_new_leader_settling_from_a_cleaned_log_loses_nothing(refused: str) -> None:
    """The old leader wrote the completion and settled; the cleaner ran to every cut it may
    make; a new leader claims and settles from what it read (as ``Term._start`` and the
    settling of its next write do). The full log keeps checkpoint 1 and no requirements."""
    log = replay_history(_history(refused), "full")
    before = fold(log, NS)
    assert before.jobs["a"].checkpoints.last_completed == 1
    assert before.jobs["a"].checkpoints.requirements == ()
    # the cuts the checker allows: none past the start of an unsettled stretch
    bound = min((next(i for i, r in enumerate(log) if r.offset == o)
                 for o in before.unsettled.values()), default=len(log))
    for cut in range(bound + 1):
        idx = compacted_indices([r.key for r in log], [r.value is None for r in log], cut,
                                len(log))
        full, seen = list(log), [log[i] for i in idx]
        _new_leader_settles(seen, full)
        after = fold(full, NS).jobs["a"].checkpoints
        assert after.last_completed == 1 and after.requirements == (), (cut, after)


# -- L1: a state taken whole is checked like a rescale's ------------------------------------

BAD = (VertexParallelism("A" * 32, 0, 99999),)


def test_l1_a_terminal_restatement_with_bad_requirements_is_refused() -> None:
    """A raw JobReasserted under an end key of a known job, terminal, with requirements no
    rescale could write: refused ``bad_requirements``, the result holds none of them."""
    assert requirements_error(BAD) is not None
    log = _submitted()
    e = JobReasserted(job_id="a", status=JobStatus.CANCELLED, owner_epoch=None, graph=None,
                      checkpoints=CheckpointState(seq=1, requirements=BAD), dirty=True,
                      reason="raw", **_common())
    log.put(e, end_key(NS, "a", e.event_id))
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["bad_requirements"]
    assert image.jobs["a"].live and image.jobs["a"].checkpoints.requirements == ()


def test_l1_a_legacy_end_of_an_unknown_job_with_bad_requirements_is_refused() -> None:
    """An end under the job's key (a jobreg before ends had keys of their own) of a job the
    fold does not know (the cleaner removed its birth) carries its checkpoints whole."""
    log = Log()
    log.put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=0, **_common()))
    e = JobCancelled(job_id="b", graph=InlineGraph(b"g"),
                     checkpoints=CheckpointState(seq=1, requirements=BAD), **_common())
    log.put(e, job_key(NS, "b"))
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["bad_requirements"], image.rejected
    assert "b" not in image.jobs


# -- M2: the leader's own checkpoint record grouped with a floored restatement ---------------

V1 = "0" * 31 + "1"
R1 = (VertexParallelism(V1, 2, 2),)


def _due_world(floor_from: tuple) -> _World:
    """A job whose checkpoint state is due (junk over its holder) after a record of it the
    fold did not take carried a ``seq`` above the job's (``floor_from``)."""
    world = _World.empty()
    for op, settle in [(("claim", "jm-1", "current"), True), (("write", "submit", "a", 1), False),
                       (("write", "trigger", "a", 1), False), (("claim", "jm-2", "current"), True),
                       (floor_from, True), (("raw", "garbage", "-", "-", "a", "checkpoint"), False)]:
        _apply(world, op, ALPHABETS["full"])
        if settle:
            _settle_after(world)
    world.collect(plan_collection(world.image, first=True))
    return world


def _rescale(image, before) -> JobRescaled:
    state, _ = checkpoint_step(before, JobRescaled, UNKNOWN_CHECKPOINT, requirements=R1)
    return JobRescaled(job_id="a", checkpoint_id=UNKNOWN_CHECKPOINT, state=state,
                       reason="putJobResourceRequirements", **ex_common(image.epoch, "jm-2"))


def test_m2_a_deposed_leaders_late_record_raises_no_floor() -> None:
    """The read's history: the deposed leader's trigger (``stale_epoch``, from its own view,
    seq 2) is refused in every compacted log too (grants are never compacted), so it raises
    no floor: the restatement carries the job's own seq, and the new leader's rescale in the
    same write, planned from the image, is accepted."""
    world = _due_world(("zombie", "trigger", "a", 2))
    img = world.image
    assert any(d.reason == "stale_epoch" for made in world.made for d in made)
    assert "a" not in img.checkpoint_floors
    pairs = plan_reassertions(img, img.epoch, "jm-2")
    assert pairs and restated_states(img, pairs) == {}
    rescale = _rescale(img, img.jobs["a"].checkpoints)
    world.write([*pairs, (record_key(rescale), rescale)])
    assert world.made[-1][-1].outcome == Outcome.ACCEPTED, world.made[-1][-1]
    assert world.image.jobs["a"].checkpoints.requirements == R1


def test_m2_a_call_grouped_with_a_floored_restatement_starts_from_it() -> None:
    """A current-epoch record the fold refused (a trigger of the pending id again) carries
    seq 2 and may be read as carrying the state in a log cleaned past what its refusal
    rests on, so the floor is 2 and the restatement carries seq 2. A rescale planned from the
    image (seq 1 -> 2) in the same write is refused ``stale_checkpoint_seq``; the client
    starts it from the state the restatement leaves (``restated_states``: seq 2 -> 3)."""
    world = _due_world(("raw", "CheckpointTriggered", "current", "leader", "a", "own"))
    img = world.image
    assert img.checkpoint_floors.get("a", 0) > img.jobs["a"].checkpoints.seq
    pairs = plan_reassertions(img, img.epoch, "jm-2")
    restated = restated_states(img, pairs)
    assert restated["a"].seq == img.checkpoint_floors["a"]
    stale, fresh = world.copy(), world
    naive = _rescale(img, img.jobs["a"].checkpoints)
    stale.write([*pairs, (record_key(naive), naive)])
    assert stale.made[-1][-1].reason == "stale_checkpoint_seq"  # the read's M2, as it was
    rescale = _rescale(img, restated["a"])
    fresh.write([*pairs, (record_key(rescale), rescale)])
    assert fresh.made[-1][-1].outcome == Outcome.ACCEPTED, fresh.made[-1][-1]
    assert fresh.image.jobs["a"].checkpoints.requirements == R1


# -- M1: a restatement planned before a rescale, landing after it ----------------------------


def _restatement_after_rescale(floor_from: tuple) -> _World:
    world = _due_world(floor_from)
    planned_from = world.image
    restatement = [(k, e) for k, e in plan_reassertions(planned_from, planned_from.epoch, "jm-2")
                   if isinstance(e, JobReasserted)]
    assert restatement
    # a rescale computed from the same image lands first, and is accepted
    rescale = _rescale(planned_from, planned_from.jobs["a"].checkpoints)
    world.write([(record_key(rescale), rescale)])
    assert world.made[-1][-1].accepted
    world.write(restatement)  # then the restatement planned before it
    return world


def test_m1_a_restatement_planned_before_a_rescale_does_not_undo_it() -> None:
    """The read's history: the floor came from the deposed leader's late record, which now
    raises none, so the restatement carries the seq it was planned at and loses to the
    rescale (rule 6: a state older in seq is not taken; the key is restated again)."""
    world = _restatement_after_rescale(("zombie", "trigger", "a", 2))
    assert world.image.jobs["a"].checkpoints.requirements == R1


@pytest.mark.xfail(strict=True, reason="open: two writers of the current term planning from one "
                   "view (a raw or foreign writer under the leader's name); the client never "
                   "does (its restatement goes first in the write of every call of the job, or "
                   "the job is busy), README Open")
def test_m1_a_floored_restatement_of_a_current_term_writer_still_undoes_a_rescale() -> None:
    """What is left of M1: a record of the current term the fold refused (a raw writer's
    trigger again) raises the floor, and a second writer of the same term plans a rescale
    from the view the leader's restatement was planned from. Both carry seq 2; the rescale
    lands first; the restatement, equal in seq, is taken. Seq alone cannot tell this
    restatement from one that must win over the refused record where the cleaner made it
    read as accepted (the floor's reason), and the restatement carries nothing else."""
    world = _restatement_after_rescale(
        ("raw", "CheckpointTriggered", "current", "leader", "a", "own"))
    assert world.image.jobs["a"].checkpoints.requirements == R1


# -- the twenty-first read (of the fixes above), F2 and F1 ------------------------------------

F2 = {
    # the leader's client alone, and one garbage: Flink asks for trigger 1 again, the client
    # writes it with the next seq, the fold refuses it checkpoint_id_not_increasing
    "client-trigger-again": [C, ("write", "submit", "a", 1), ("write", "trigger", "a", 1),
                             ("write", "trigger", "a", 1), ("write", "complete", "a", 1),
                             ("raw", "garbage", "-", "-", "a", "former", False)],
    # a rescale planned from a view before the trigger (raw, current epoch): refused
    # stale_checkpoint_seq, its requirements must never become the job's
    "stale-rescale": [C, ("write", "submit", "a", 1), ("write", "trigger", "a", 1),
                      ("raw", "JobRescaled", "current", "leader", "a", "stale", False),
                      ("write", "complete", "a", 1),
                      ("raw", "garbage", "-", "-", "a", "former", False)],
}


@pytest.mark.parametrize("case", sorted(F2))
def test_f2_junk_over_a_former_holder_a_refusal_rests_on_makes_the_state_due(case: str) -> None:
    """Junk over the record that held the state when a refused record landed, once a later
    record became the holder: in a log cleaned past it the refused record read as accepted
    and the completion as refused, and nothing was due (the client collects a refused record
    at its next full collection only, every COLLECT_BATCH records). Now the state is due
    (``rules._rested_on``): the leader collects the refused record, then restates. Also the
    checker's model: its writes settle as ``Term._settle`` does (no full collection), and its
    junk falls on a former holder too (``former``)."""
    report = check_history(F2[case], "checkpoints")
    answers = sorted(k for k in report.failures if k[0] in ("answer", "batch"))
    assert not answers, [report.failures[k].detail for k in answers]
    log = replay_history(F2[case], "checkpoints")
    image = fold(log[:-1], NS)  # before the junk: nothing due
    assert f"{NS}/job/a/checkpoint/" not in image.unsettled
    assert f"{NS}/job/a/checkpoint/" in fold(log, NS).unsettled


def test_f2_a_new_leader_settling_from_any_legal_cut_keeps_the_completion() -> None:
    log = replay_history(F2["client-trigger-again"], "checkpoints")
    before = fold(log, NS)
    assert before.jobs["a"].checkpoints.last_completed == 1
    bound = min((next(i for i, r in enumerate(log) if r.offset == o)
                 for o in before.unsettled.values()), default=len(log))
    for cut in range(bound + 1):
        idx = compacted_indices([r.key for r in log], [r.value is None for r in log], cut,
                                len(log))
        seen = [log[i] for i in idx]
        _new_leader_settles(seen)
        idx = compacted_indices([r.key for r in seen], [r.value is None for r in seen],
                                len(seen), len(seen))  # and the cleaner past all of it
        after = fold([seen[i] for i in idx], NS).jobs["a"].checkpoints
        assert after.last_completed == 1, (cut, after)


def _member_over_the_holder() -> _World:
    """claim, submit, trigger 1, complete 1, then a call's member (a JobAdopted with a
    ``call_id``: under a checkpoint key always misplaced, refused ``wrong_key``) over the
    record the state stands on."""
    world = _World.empty()
    for op in [("claim", "jm-1", "current"), ("write", "submit", "a", 1),
               ("write", "trigger", "a", 1), ("write", "complete", "a", 1)]:
        _apply(world, op, ALPHABETS["full"])
    img = world.image
    holder = img.checkpoint_records["a"].holder
    member = JobAdopted(job_id="a", call_id="c-1", **ex_common(img.epoch, img.leader))
    world.write([(holder, member)], client=False)
    return world


def test_f1_a_call_member_over_the_holder_is_junk_there_and_collected() -> None:
    """It supersedes the holder for the cleaner like any junk: the state is due, the leader
    collects the member (refused wrong_key as it lands, it never joins its call: nothing of
    rule 8 rests on it) and restates the state (the twenty-second read's L1: it was kept for
    ever, even after the job's cleanup)."""
    world = _member_over_the_holder()
    img = world.image
    assert [d.reason for d in world.made[-1]] == ["wrong_key"]
    assert f"{NS}/job/a/checkpoint/" in img.unsettled
    holder_key = world.log[-1].key.decode()
    assert holder_key in plan_collection(img, first=True)
    _settle_after(world)
    after = world.image
    assert not after.unsettled and after.jobs["a"].checkpoints.last_completed == 1
    assert after.checkpoint_records["a"].holder not in (None, holder_key)
    for op in [("write", "cancel", "a", 1), ("write", "clean", "a", 1)]:
        _apply(world, op, ALPHABETS["full"])
    _settle_after(world)  # Term.reassert(): every tombstone plan_collection plans
    log = [r.log_record() for r in world.log]
    idx = compacted_indices([r.key for r in log], [r.value is None for r in log], len(log),
                            len(log))
    assert not fold(log, NS).jobs["a"].dirty
    assert [log[i].key for i in idx if b"/checkpoint/" in log[i].key] == []


def test_f1_a_member_under_a_checkpoint_key_does_not_sink_its_call() -> None:
    """Why collecting it is safe: refused wrong_key as it lands, it never joins its call,
    which is decided over its other members (here the adopt on the lock key, accepted)."""
    world = _World.empty()
    for op in [("claim", "jm-1", "current"), ("write", "submit", "a", 1),
               ("write", "trigger", "a", 1), ("write", "complete", "a", 1)]:
        _apply(world, op, ALPHABETS["full"])
    img = world.image
    common = ex_common(img.epoch, img.leader)
    world.write([(img.checkpoint_records["a"].holder,
                  JobAdopted(job_id="a", call_id="c-1", **common)),
                 (lock_key(NS, "a"), JobAdopted(job_id="a", call_id="c-1",
                                                **dict(common, event_id="y"))),
                 (call_key(NS, "c-1"), CallCommitted(size=2, **dict(common, event_id="c-1")))],
                client=False)
    made = [d for ds in world.made[-3:] for d in ds]
    assert [d.reason for d in made if d.key == img.checkpoint_records["a"].holder] == \
        ["wrong_key"]
    assert [d.outcome for d in made if d.key == lock_key(NS, "a")][-1] == Outcome.ACCEPTED


def test_f1_no_log_cleaned_past_the_member_loses_the_checkpoint() -> None:
    world = _member_over_the_holder()
    _settle_after(world)
    log = [r.log_record() for r in world.log]
    full = fold(log, NS)
    for cut in range(len(log) + 1):
        idx = compacted_indices([r.key for r in log], [r.value is None for r in log], cut,
                                len(log))
        got = fold([log[i] for i in idx], NS).jobs["a"].checkpoints
        assert got == full.jobs["a"].checkpoints, (cut, got)
