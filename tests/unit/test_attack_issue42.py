"""Adversarial reproducers against issue 42's changes (ends under keys of their own, the
group queue, checkpoint ids that only increase). Each test marked xfail(strict=True) shows
a defect still present: it fails today, and will XPASS (and so fail the suite) once fixed,
when the mark is to be removed."""

from __future__ import annotations

import pytest
import support.model
from support.histories import DAY, build
from support.model import NS, compact, visible

from registry.codec import default_codec, encode
from registry.events import (
    CheckpointCompleted,
    CheckpointFailed,
    CheckpointTriggered,
    JobCancelled,
    JobTerminated,
    new_event_id,
)
from registry.fold import checkpoint_step, failure_reason_counts, fold
from registry.keys import checkpoints_key, end_key, job_key


def _every_cut(log):
    """(cut, compacted image) for every cut the cleaner may make once the whole log is
    older than the lag and nothing in fold(log) is unsettled (asserted)."""
    full = fold(visible(log), NS)
    bound = min((i for i, r in enumerate(log) if r.offset in set(full.unsettled.values())),
                default=len(log))
    for c in range(bound + 1):
        yield c, fold(visible(compact(log, log[-1].timestamp + 40 * DAY, upto=c)), NS)


@pytest.mark.parametrize("what", ["garbage", "tombstone", "wrong_key"])
def test_a_record_on_an_end_key_never_removes_the_end(what) -> None:
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False),
                 ("write", "jm-1", "cancel", "a", False)], settle=False)
    (end,) = [r.key for r in sim.log if r.key is not None and b"/end/" in r.key]
    if what == "garbage":
        sim.append(end, b"\x00\x00\x00\x00\x63not avro at all")
    elif what == "tombstone":
        sim.append(end, None)
    else:  # any decodable event that does not belong there (refused wrong_key)
        other = JobCancelled(event_id=new_event_id(), namespace=NS, epoch=0, writer="zombie",
                             created_at=0, job_id="b")
        sim.append(end, encode(other))
    sim.settle()  # a leader catches up and settles whatever the fold says is unsettled
    full = fold(visible(sim.log), NS)
    assert full.jobs["a"].status == "CANCELLED"
    for c, image in _every_cut(sim.log):
        assert image.answer() == full.answer(), c
        assert not image.jobs["a"].live, c


@pytest.mark.parametrize("upgraded", [False, True])
def test_an_end_key_record_adopted_as_a_legacy_jobs_end_keeps_its_status_after_compaction(
        monkeypatch, upgraded: bool) -> None:
    """D2: an end under an end key for a job whose end lies under its job key (ended_by
    None) was taken as its end with the fold's status, and once the legacy end on the job
    key was cleaned the compacted fold read the record's own status (FAILED, not
    CANCELLED). Now only a record stating that end becomes it; another is refused
    ``terminal_job`` and removed by the leader (an ABSENT reassertion under its key).
    (The log is a jobreg's before births had keys of their own, grant layout 0: after a
    layout-1 grant an end under the job key is refused ``wrong_key``; ``upgraded``: a
    leader of today's jobreg claims after the legacy end and before the raw end.)"""
    monkeypatch.setattr(support.model, "LAYOUT", 0)
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False)], settle=False)
    common = dict(namespace=NS, epoch=1, writer="jm-1", created_at=0)
    # an end as a jobreg before ends had keys of their own wrote it: under the job key
    legacy = JobCancelled(job_id="a", reason="legacy", event_id=new_event_id(), **common)
    sim.append(job_key(NS, "a"), encode(legacy))
    assert fold(visible(sim.log), NS).jobs["a"].status == "CANCELLED"
    leader = "jm-1"
    if upgraded:
        monkeypatch.setattr(support.model, "LAYOUT", 1)
        sim.sync("jm-2")
        sim.claim("jm-2")  # it settles: the legacy end is restated under an end key
        leader, common["epoch"], common["writer"] = "jm-2", 2, "jm-2"
    # a (raw, current-term) end under an end key with another status: "becomes its end"
    other = JobTerminated(job_id="a", state="FAILED", reason="boom", event_id=new_event_id(),
                          **common)
    sim.append(end_key(NS, "a", other.event_id), encode(other))
    [refused] = [d for d in fold(visible(sim.log), NS).rejected if d.event_id == other.event_id]
    assert refused.reason == "terminal_job"
    sim.sync(leader)
    sim.write(leader, "clean", "a")  # the leader cleans the result up (a v2 JobCleanedUp)
    sim.settle()
    full = fold(visible(sim.log), NS)
    assert (full.jobs["a"].status, full.jobs["a"].reason) == ("CANCELLED", "legacy")
    assert not full.unsettled
    for c, image in _every_cut(sim.log):
        assert image.answer() == full.answer(), c


def test_the_old_rule_cannot_take_a_checkpoint_id_back() -> None:
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False)], settle=False, layout=1)
    common = dict(namespace=NS, epoch=1, writer="jm-1", created_at=0)
    key = checkpoints_key(NS, "a")

    written = []  # the states the writer's records carried: its own view (an old rule's)

    def write(kind, cp, keep_ids=True, **extra):
        view = fold(visible(sim.log), NS).jobs["a"]
        state, _ = checkpoint_step(written[-1] if written else view.checkpoints, kind, cp,
                                   location=extra.get("location", ""),
                                   retained=view.retained_checkpoints,
                                   failure_reason=extra.get("failure_reason", "UNSPECIFIED"),
                                   keep_ids=keep_ids)
        written.append(state)
        ev = kind(job_id="a", checkpoint_id=cp, state=state, event_id=new_event_id(),
                  **extra, **common)
        sim.append(key, encode(ev))

    write(CheckpointTriggered, 1)
    write(CheckpointTriggered, 2)
    write(CheckpointFailed, 2, failure_reason="CHECKPOINT_DECLINED", reason="declined",
          task="t", reason_counts=failure_reason_counts("CHECKPOINT_DECLINED"))
    before = fold(visible(sim.log), NS).jobs["a"].checkpoints.newest_id
    assert before == 2
    # the completion of 1 carrying the state a jobreg before finding 5 computed
    write(CheckpointCompleted, 1, keep_ids=False, location="loc-1")
    after = fold(visible(sim.log), NS)
    newest = after.jobs["a"].checkpoints.newest_id
    write(CheckpointTriggered, 2, keep_ids=False)  # a second trigger of checkpoint 2
    last = fold(visible(sim.log), NS)
    twice = [d for d in last.rejected if d.event_type == "CheckpointTriggered"]
    assert newest >= before, f"newest_id went back from {before} to {newest}"
    assert twice, "checkpoint 2 was triggered twice"


def test_the_old_rule_gives_a_lower_newest_id() -> None:
    """(What the xfail above rests on: the two rules' states after trigger 1, trigger 2,
    a counted failure of 2 and the completion of 1.)"""
    from registry.events import EMPTY_CHECKPOINTS
    st = EMPTY_CHECKPOINTS
    for kind, cp, kw in [(CheckpointTriggered, 1, {}), (CheckpointTriggered, 2, {}),
                         (CheckpointFailed, 2, {"failure_reason": "CHECKPOINT_DECLINED"})]:
        st, _ = checkpoint_step(st, kind, cp, **kw)
    old, _ = checkpoint_step(st, CheckpointCompleted, 1, location="l", keep_ids=False)
    new, _ = checkpoint_step(st, CheckpointCompleted, 1, location="l")
    assert (st.newest_id, new.newest_id, old.newest_id) == (2, 2, 1)


def test_the_unsettled_offset_bounds_every_refused_record_since_the_key_was_settled() -> None:
    # submit a; a zombie's cancel of an old epoch on the job key (refused: stale_epoch, the
    # key is unsettled at it); a second submit of a on the job key, as a jobreg before births
    # had keys of their own wrote it (refused: wrong_key); no leader yet
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1),
                 ("raw", "cancel", 0, "jm-1", "a", 3), ("raw", "submit", 1, "jm-1", "a", 3)],
                settle=False)
    full = fold(visible(sim.log), NS)
    refused = [i for i, r in enumerate(sim.log) if r.key == job_key(NS, "a").encode()]
    assert len(refused) == 2
    bound = min(i for i, r in enumerate(sim.log) if r.offset in set(full.unsettled.values()))
    # the image's bound is the later refused record (refused[1]); the key has been
    # unsettled since the earlier one, and the cleaner may clean up to the bound
    image = fold(visible(compact(sim.log, sim.now + 40 * DAY, upto=bound)), NS)
    assert image.answer() == full.answer()


def test_a_refused_call_never_creates_its_jobs_before_its_absent_reassertions_land() -> None:
    """(Was an xfail: the leader restated a refused call's sinking key before the ABSENT
    reassertions of its other members; a reader in between, with the cleaner past the
    sinking key's submit, saw the call committed.) The leader writes removals first: at
    every prefix of the log, at every cut the lag allows there (each key unsettled since
    the first prefix it was), no job of the refused call exists."""
    # submit a; a second submit of a (refused, under its own birth key); then a call
    # submitting a, b, c: a sinks it (job_exists); the leader reasserts b and c ABSENT under
    # their submits' birth keys (a's refused submits stand: a's birth refuses them in every
    # compacted log)
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1),
                 ("write", "jm-1", "submit", "a", False, 1),
                 ("write", "jm-1", "submit_many", "a", False, 1)], settle=False)
    assert set(fold(visible(sim.log), NS).jobs) == {"a"}
    keys = [r.key for r in sim.log]
    assert any(k.startswith(f"{NS}/job/b/birth/".encode()) and
               default_codec().decode(r.value).TYPE == "JobReasserted"
               for k, r in zip(keys, sim.log, strict=True))
    first: dict = {}  # since when each key is unsettled, over the prefixes
    for p in range(len(sim.log) + 1):
        prefix = sim.log[:p]
        unsettled = fold(visible(prefix), NS).unsettled
        first = {k: first.get(k, o) for k, o in unsettled.items()}
        bound = min((i for i, r in enumerate(prefix) if r.offset in set(first.values())),
                    default=p)
        for c in range(bound + 1):
            image = fold(visible(compact(prefix, sim.now + 40 * DAY, upto=c)), NS)
            assert set(image.jobs) <= {"a"}, (p, c, sorted(image.jobs))



def _verdicts(records):
    from registry.fold import Delta
    from registry.image import Image
    delta, out = Delta(Image.empty(NS)), {}
    for r in records:
        d = delta.replay(r)
        out.update((x.offset, x) for _, x, _ in delta.resolved)
        out[r.offset] = d
    return out


def test_terminal_job_rests_only_on_ends_under_end_keys() -> None:
    """(Was an xfail: a terminal JobReasserted on the lock key ended a live job with no end
    under an end key, and a terminal_job refusal resting on it became an acceptance in a
    compacted log.) Off the job's own key a reassertion cannot end a job: refused."""
    from registry.events import JobReasserted
    from registry.keys import lock_key
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1)], settle=False, layout=1)
    for key in (lock_key(NS, "a"), checkpoints_key(NS, "a")):
        ended = JobReasserted(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1",
                              created_at=0, job_id="a", status="CANCELLED", owner_epoch=None,
                              graph=None)
        sim.append(key, encode(ended))  # a raw write of the current term
    sim.raw("submit", 1, "jm-1", "a", 0)  # a resubmission (raw): refused, job_exists
    sim.settle()  # the leader restates the keys the refused records landed on
    verdicts = _verdicts(visible(sim.log))
    refused = sorted({d.reason for d in verdicts.values() if d.outcome == "REJECTED"})
    assert refused == ["bad_state", "job_exists"], refused
    assert fold(visible(sim.log), NS).jobs["a"].live
    for c, image in _every_cut(sim.log):
        assert image.jobs["a"].live, c



def test_a_refused_v1_cleanup_of_a_live_job_never_ends_it_after_compaction() -> None:
    from support.model import encode_with

    from registry.events import JobCleanedUp
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1)], settle=False)
    clean = JobCleanedUp(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1",
                         created_at=0, job_id="a", status="FINISHED")
    sim.append(job_key(NS, "a"), encode_with(clean, 31))  # schema 31: JobCleanedUp v1
    sim.settle()  # refused (job_live), the key unsettled; the leader reasserts the job
    full = fold(visible(sim.log), NS)
    assert full.jobs["a"].live
    for c, image in _every_cut(sim.log):
        assert image.jobs["a"].live, (c, image.jobs["a"])


def test_a_late_copy_of_an_absent_reassertion_never_deletes_a_job_submitted_since() -> None:
    from registry.codec import default_codec
    # a zombie's torn call (submits b, c, adopts d) ends with its term: the new leader
    # reasserts b, c and d's lock key ABSENT; then it submits d
    sim = build([("claim", "jm-1"), ("raw", "torn", 1, "jm-1", "b", 0), ("claim", "jm-1"),
                 ("write", "jm-1", "submit", "d", False, 1)], settle=False)
    lock = b"prod/job/d/lock"
    (absent,) = [r for r in sim.log if r.key == lock
                 and default_codec().decode(r.value).TYPE == "JobReasserted"]
    sim.append(absent.key, absent.value)  # a copy a stalled request delivers late (< 60 s)
    sim.settle()  # the leader settles the key the duplicate landed on
    full = fold(visible(sim.log), NS)
    assert full.jobs["d"].live
    for c, image in _every_cut(sim.log):
        assert "d" in image.jobs and image.jobs["d"].live, (c, sorted(image.jobs))


def test_a_reassertion_on_the_checkpoints_key_keeps_its_effect_after_compaction() -> None:
    """(Was an xfail: a JobReasserted on the checkpoints key that changed the job's graph
    was taken, then superseded by the next checkpoint record and cleaned away.) Off the
    job's own key a reassertion restates only its key's part: the graph stays the
    submitted one, in the fold and in every compacted log."""
    from registry.events import InlineGraph, JobReasserted
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1)], settle=False)
    graph = fold(visible(sim.log), NS).jobs["a"].graph
    other = JobReasserted(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1",
                          created_at=0, job_id="a", status="ACTIVE", owner_epoch=None,
                          graph=InlineGraph(b"restated"))
    sim.append(checkpoints_key(NS, "a"), encode(other))  # a raw write of the current term
    sim.sync("jm-1")
    sim.write("jm-1", "trigger", "a", False, 1)  # the leader's next checkpoint record
    sim.settle()
    full = fold(visible(sim.log), NS)
    assert full.jobs["a"].graph == graph
    for c, image in _every_cut(sim.log):
        assert image.answer() == full.answer(), (c, image.jobs["a"].graph)



def test_a_late_copy_of_a_reassertion_never_undoes_an_acknowledged_checkpoint() -> None:
    from registry.codec import default_codec
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1),
                 ("write", "jm-1", "trigger", "a", False, 1),
                 # a failure of a checkpoint that is not pending: IGNORED, the key unsettled,
                 # and the leader's write reasserts the checkpoints key
                 ("write", "jm-1", "cpfail", "a", False, 5),
                 ("write", "jm-1", "trigger", "a", False, 2),
                 ("write", "jm-1", "complete", "a", False, 2)], settle=False, layout=1)
    assert fold(visible(sim.log), NS).jobs["a"].checkpoints.last_completed == 2  # acknowledged
    key = checkpoints_key(NS, "a").encode()
    (reassertion,) = [r for r in sim.log if r.key == key
                      and default_codec().decode(r.value).TYPE == "JobReasserted"]
    sim.append(reassertion.key, reassertion.value)  # a copy a stalled request delivers (< 60 s)
    assert fold(visible(sim.log), NS).jobs["a"].checkpoints.last_completed == 2  # a duplicate
    # the cleaner cleans up to the copy (a segment boundary there), before the leader settles
    sim.log = compact(sim.log, sim.now + 40 * DAY, upto=len(sim.log) - 1)
    sim.now += 40 * DAY
    sim.sync("jm-2")
    sim.claim("jm-2")  # a standby takes over from the log as it now is, and settles it
    job = fold(visible(sim.log), NS).jobs["a"]
    assert job.checkpoints.last_completed == 2, job.checkpoints


def test_a_reassertion_never_takes_checkpoint_ids_back() -> None:
    from registry.events import JobReasserted
    from registry.keys import lock_key
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1),
                 ("write", "jm-1", "trigger", "a", False, 2)], settle=False)
    view = fold(visible(sim.log), NS).jobs["a"]
    assert view.checkpoints.newest_id == 2
    stale = JobReasserted(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1",
                          created_at=0, job_id="a", status="ACTIVE", owner_epoch=1,
                          graph=view.graph)  # the job as it was before the trigger
    sim.append(lock_key(NS, "a"), encode(stale))
    after = fold(visible(sim.log), NS).jobs["a"].checkpoints
    assert after.newest_id >= 2, after


def test_an_absent_reassertion_off_the_job_key_never_hides_a_job_from_the_cleaner() -> None:
    """(Was an xfail: an ABSENT reassertion on the checkpoints key deleted a live job whose
    submit was still on the job key; a later record there, refused unknown_job and never
    unsettled, superseded it, and the compacted fold accepted it.) Off the job's own key a
    reassertion can neither remove nor end a job: both are refused and the key restated."""
    from registry.events import JobReasserted
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit", "a", False, 1)], settle=False, layout=1)
    common = dict(namespace=NS, epoch=1, writer="jm-1", created_at=0, job_id="a",
                  owner_epoch=None, graph=None)
    for status in ("ABSENT", "CANCELLED"):  # raw writes of the current term
        ev = JobReasserted(event_id=new_event_id(), status=status, **common)
        sim.append(checkpoints_key(NS, "a"), encode(ev))
    sim.settle()
    full = fold(visible(sim.log), NS)
    assert full.jobs["a"].live
    assert [d.reason for d in full.rejected] == ["job_exists", "bad_state"]
    for c, image in _every_cut(sim.log):
        assert image.answer() == full.answer(), (c, image.jobs.get("a"))

