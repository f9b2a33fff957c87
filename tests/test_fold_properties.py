"""Property tests of the fold over random interleavings of contenders and zombies (no broker)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model import CONTENDERS, JOBS, NS, TOPIC, Sim, compact, visible

from registry.events import JobStatus
from registry.fold import Delta, fold, replay
from registry.image import Image, Outcome

DAY = 24 * 3600 * 1000

contender = st.sampled_from(CONTENDERS)
job = st.sampled_from(JOBS)
sync = st.tuples(st.just("sync"), contender)
claim = st.tuples(st.just("claim"), contender)
# "leader" is resolved to whoever claimed last, so most writes come from a live term
write = st.tuples(st.just("write"), st.sampled_from(["leader"] * 3 + list(CONTENDERS)),
                  st.sampled_from(["submit", "submit", "submit", "cancel", "finish", "fail",
                                   "adopt", "release", "release", "revoke", "recfail", "renew",
                                   "trigger", "trigger", "complete", "cpfail", "cpfail",
                                   "discard", "submit_many", "submit_many", "adopt_many"]),
                  job, st.sampled_from([False] * 7 + [True]),  # True: the transaction aborted
                  st.integers(1, 6))  # checkpoint id (small, so they collide)
raw = st.tuples(st.just("raw"),
                st.sampled_from(["submit", "cancel", "release", "adopt", "revoke", "garbage",
                                 "tombstone", "call", "torn"]),
                st.integers(0, 4), contender, job, st.integers(0, 2))
dup = st.tuples(st.just("dup"), st.integers(0, 50))
tick = st.tuples(st.just("tick"), st.integers(0, 3_600_000))
# Weighted so that most histories have several terms, live and terminal jobs,
# zombies of old terms and refused writes on live keys.
op = st.sampled_from([write] * 6 + [claim] * 2 + [sync] * 2 + [raw, raw, dup, tick]).flatmap(
    lambda s: s)


def build(ops, reassert: bool = True, settle: bool = True) -> Sim:
    sim = Sim(reassert=reassert)
    for o in ops:
        kind = o[0]
        if kind == "sync":
            sim.sync(o[1])
        elif kind == "claim":
            sim.claim(o[1])
        elif kind == "write":
            who = o[1]
            if who == "leader":
                holders = [a for a in sim.actors.values() if a.term is not None]
                who = max(holders, key=lambda a: a.term).name if holders else CONTENDERS[0]
            sim.write(who, o[2], o[3], aborted=o[4], cp=o[5] if len(o) > 5 else 1)
        elif kind == "raw":
            sim.raw(*o[1:])
        elif kind == "dup":
            sim.duplicate(o[1])
        elif kind == "tick":
            sim.tick(o[1])
    if settle:
        sim.settle()
    return sim


histories = st.lists(op, min_size=5, max_size=80).map(build)
# JOBREG_PROPERTY_EXAMPLES=5000 for a deeper hunt than CI's default.
SETTINGS = settings(max_examples=int(os.environ.get("JOBREG_PROPERTY_EXAMPLES", "300")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(histories, st.data())
def test_same_image_under_every_batch_split(sim: Sim, data) -> None:
    records = visible(sim.log)
    whole = fold(records, NS)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(records)), max_size=6)))
    image = Image.empty(NS)
    prev = 0
    for cut in [*cuts, len(records)]:
        image = fold(records[prev:cut], image)
        prev = cut
    assert image == whole
    one_by_one = Image.empty(NS)
    for r in records:
        one_by_one = replay(one_by_one, r)
    assert one_by_one == whole


@SETTINGS
@given(histories, st.data())
def test_duplicates_have_no_second_effect(sim: Sim, data) -> None:
    records = visible(sim.log)
    whole = fold(records, NS)
    i = data.draw(st.integers(0, len(records) - 1))
    j = data.draw(st.integers(i + 1, len(records)))
    copy = records[i]
    with_dup = [*records[:j], copy, *records[j:]]
    assert fold(with_dup, NS).answer() == whole.answer()


@SETTINGS
@given(histories)
def test_epochs_increase_and_each_has_one_leader(sim: Sim) -> None:
    delta = Delta(Image.empty(NS))
    leaders: dict[int, str] = {}
    last = 0
    for r in visible(sim.log):
        d = delta.replay(r)
        if d.outcome != Outcome.ACCEPTED:
            continue
        if d.event_type == "LeadershipGranted":
            assert d.epoch == last + 1
            last = d.epoch
            assert d.epoch not in leaders
            leaders[d.epoch] = d.writer
        else:
            assert d.epoch == last, "an accepted write must carry the current epoch"
            assert leaders[d.epoch] == d.writer, "only the epoch's leader writes"


@SETTINGS
@given(histories)
def test_a_terminal_job_is_never_live_again(sim: Sim) -> None:
    delta = Delta(Image.empty(NS))
    terminal: dict[str, str] = {}
    for r in visible(sim.log):
        delta.replay(r)
        image = delta.apply()
        delta = Delta(image)
        for job_id, view in image.jobs.items():
            if job_id in terminal:
                assert view.status in JobStatus.TERMINAL, f"{job_id} came back"
            elif not view.live:
                terminal[job_id] = view.status


@SETTINGS
@given(histories, st.data())
def test_compaction_does_not_change_the_answer(sim: Sim, data) -> None:
    """fold(compact(log)) == fold(log) for jobs, leader and epoch, under our topic config."""
    expected = fold(visible(sim.log), NS).answer()
    log = sim.log
    now = sim.now
    for _ in range(data.draw(st.integers(1, 3), label="passes")):
        now += data.draw(st.sampled_from([0, 1000, TOPIC.min_compaction_lag_ms,
                                          TOPIC.min_compaction_lag_ms + TOPIC.delete_retention_ms,
                                          30 * DAY]), label="advance")
        upto = data.draw(st.integers(0, len(log)), label="upto")
        log = compact(log, now, upto)
    assert fold(visible(log), NS).answer() == expected


def test_full_compaction_of_a_long_history_keeps_the_answer() -> None:
    """A fixed, busy history compacted completely (everything older than the lag)."""
    ops = []
    for i in range(40):
        c = CONTENDERS[i % 3]
        ops += [("sync", c), ("claim", c), ("write", c, "submit", JOBS[i % 4], False, 1),
                ("write", c, "trigger", JOBS[i % 4], False, i + 1),
                ("write", c, "cpfail", JOBS[i % 4], False, i + 1),
                ("raw", "cancel", max(0, i // 3 - 1), CONTENDERS[(i + 1) % 3], JOBS[(i + 1) % 4], i),
                ("write", c, "release", JOBS[(i + 2) % 4], False, 1),
                ("raw", "submit", 1, "jm-2", JOBS[(i + 3) % 4], i),
                ("write", c, ["cancel", "finish", "adopt"][i % 3], JOBS[i % 4], False, 1)]
    sim = build(ops)
    expected = fold(visible(sim.log), NS).answer()
    compacted = compact(sim.log, sim.now + 40 * DAY)
    assert len(compacted) < len(sim.log)
    assert fold(visible(compacted), NS).answer() == expected


def test_without_reassertion_compaction_resurrects_a_cancelled_job() -> None:
    """The hazard the reassertions exist for: a refused resubmission becomes a key's newest record."""
    ops = [("claim", "jm-1"), ("write", "jm-1", "submit", "a", False),
           ("write", "jm-1", "cancel", "a", False),
           ("write", "jm-1", "submit", "a", False)]  # refused: terminal id
    unsafe = build(ops, reassert=False, settle=False)
    assert fold(visible(unsafe.log), NS).jobs["a"].status == JobStatus.CANCELLED
    compacted = compact(unsafe.log, unsafe.now + 30 * DAY)
    assert fold(visible(compacted), NS).jobs["a"].status == JobStatus.ACTIVE  # the hazard
    safe = build(ops, reassert=True, settle=False)
    compacted = compact(safe.log, safe.now + 30 * DAY)
    assert fold(visible(compacted), NS).jobs["a"].status == JobStatus.CANCELLED


def test_a_young_refused_record_is_not_cleaned_before_the_lag() -> None:
    """Without a leader the refused record stays unsettled, but the lag protects it."""
    ops = [("claim", "jm-1"), ("write", "jm-1", "submit", "a", False),
           ("write", "jm-1", "revoke", "a", False),
           ("raw", "cancel", 1, "jm-1", "a", 0)]  # zombie after the revoke; nobody leads
    sim = build(ops, settle=False)
    assert fold(visible(sim.log), NS).unsettled
    expected = fold(visible(sim.log), NS).answer()
    assert fold(visible(compact(sim.log, sim.now + 1000)), NS).answer() == expected


# -- checkpoints (rule 6, incident 004) ------------------------------------------

cp_op = st.tuples(st.sampled_from(["trigger", "trigger", "complete", "cpfail", "cpfail",
                                   "cpfail", "discard", "failover", "zombie"]),
                  st.integers(1, 8))


def _oracle(ops, budget: int) -> tuple[int, bool, int]:
    """Flink's CheckpointFailureManager, written out plainly: (count, over budget, last completed)."""
    last, discarded, counted = -1, set(), set()
    for kind, cp in ops:
        if kind == "complete" and cp > last and cp not in discarded:
            last, counted = cp, set()
            discarded = {d for d in discarded if d > cp}
        elif kind == "cpfail" and cp > last and cp not in discarded:
            counted.add(cp)
        elif kind == "discard" and cp > last:
            discarded.add(cp)
    return len(counted), len(counted) > budget, last


@SETTINGS
@given(st.lists(cp_op, max_size=40), st.integers(0, 3), st.data())
def test_checkpoint_failures_count_like_flink_and_survive_compaction(ops, budget, data) -> None:
    sim = Sim()
    sim.claim("jm-1")
    sim.actors["jm-1"].seen = len(sim.log)
    leader = "jm-1"
    # max_checkpoint_failures is cp % 3 in the model's submit; pick cp to get `budget`
    sim.write(leader, "submit", "a", cp=budget if budget < 3 else 3)
    budget = budget % 3
    applied = []
    for kind, cp in ops:
        if kind == "failover":
            leader = "jm-2" if leader == "jm-1" else "jm-1"
            sim.sync(leader)
            sim.claim(leader)
        elif kind == "zombie":  # the previous leader writes late, with its old epoch
            old = "jm-2" if leader == "jm-1" else "jm-1"
            if sim.actors[old].term is not None:
                sim.write(old, "cpfail", "a", cp=cp)
        else:
            sim.sync(leader)
            sim.write(leader, kind, "a", cp=cp)
            applied.append((kind, cp))
    sim.settle()
    image = fold(visible(sim.log), NS)
    job = image.jobs["a"]
    count, over, last = _oracle(applied, budget)
    assert (job.checkpoints.consecutive_failures, job.over_budget,
            job.checkpoints.last_completed) == (count, over, last)
    assert all(d.event_type.startswith("Checkpoint") for d in image.ignored)
    assert not [d for d in image.rejected if d.reason == "checkpoint_state_mismatch"]
    compacted = compact(sim.log, sim.now + data.draw(st.sampled_from([0, 30 * DAY])),
                        data.draw(st.integers(0, len(sim.log))))
    assert fold(visible(compacted), NS).answer() == image.answer()


def test_incident_004_late_failure_of_a_discarded_checkpoint_is_ignored() -> None:
    """Flink restarted a job over checkpoint 5 after discarding it; here the late failure is ignored."""
    sim = Sim()
    sim.claim("jm-1")
    sim.write("jm-1", "submit", "a", cp=2)  # budget 2
    steps = [("trigger", 4), ("complete", 4), ("trigger", 5), ("cpfail", 5), ("discard", 5),
             ("cpfail", 5)]  # a second task's decline arrives after the discard
    for kind, cp in steps:
        sim.write("jm-1", kind, "a", cp=cp)
    image = fold(visible(sim.log), NS)
    assert image.jobs["a"].checkpoints.consecutive_failures == 1
    (late,) = image.ignored
    assert late.event_type == "CheckpointFailed" and "discarded" in late.detail
    for cp in (6, 7):  # two more consecutive failures: 3 > budget 2
        sim.write("jm-1", "trigger", "a", cp=cp)
        sim.write("jm-1", "cpfail", "a", cp=cp)
    assert fold(visible(sim.log), NS).jobs["a"].over_budget
    sim.write("jm-1", "trigger", "a", cp=8)
    sim.write("jm-1", "complete", "a", cp=8)
    job = fold(visible(sim.log), NS).jobs["a"]
    assert job.checkpoints.consecutive_failures == 0 and not job.over_budget
    assert [c.checkpoint_id for c in job.latest_checkpoints] == [8]
