"""Resource requirements as a fenced record of their own (issue 43, item 1; fold rule 6).

Flink's adaptive scheduler rescales a job through ``ExecutionPlanWriter
.putJobResourceRequirements`` (``PUT /jobs/<id>/resource-requirements``, the Kubernetes
operator's autoscaler). Flink's own store writes the requirements into the plan and replaces
the plan in place; jobreg writes a :class:`~registry.events.JobRescaled` whose checkpoint state
holds them, so every later checkpoint record of the job carries them on and the record the job's
state stands on keeps them through every cleaning. These tests hold the fold to that: a rescale
survives later checkpoint records, restarts and every compaction cut; a deposed leader's
rescale is refused and undoes nothing; bad requirements are refused by the fold and by the
writer, with one statement of what is bad.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_retained_checkpoints import Log, _common, _submitted

from registry.errors import ConfigError
from registry.events import (
    MAX_PARALLELISM,
    MAX_REQUIREMENTS,
    UNKNOWN_CHECKPOINT,
    CheckpointCompleted,
    CheckpointFailed,
    CheckpointTriggered,
    JobCancelled,
    JobRescaled,
    JobRestarted,
    LeadershipGranted,
    VertexParallelism,
)
from registry.fold import checkpoint_step, fold, requirements_error
from registry.keys import end_key

NS = "prod"
V1, V2 = "0" * 31 + "1", "a" * 32


def _reqs(*bounds: tuple[str, int, int]) -> tuple[VertexParallelism, ...]:
    return tuple(VertexParallelism(*b) for b in bounds)


def _rescale(log: Log, requirements, *, epoch: int = 1, writer: str = "jm-1",
             checkpoint_id: int = UNKNOWN_CHECKPOINT, job: str = "a") -> None:
    """A rescale as its writer computes it from the fold it read."""
    before = fold(log.records, NS).jobs[job].checkpoints
    state = dataclasses.replace(before, seq=before.seq + 1, requirements=requirements)
    log.put(JobRescaled(job_id=job, checkpoint_id=checkpoint_id, state=state,
                        **{**_common(epoch), "writer": writer}))


def _requirements(records, job: str = "a"):
    return fold(records, NS).jobs[job].checkpoints.requirements


def test_a_rescale_outlives_later_checkpoint_records_restarts_and_every_cut() -> None:
    log = _submitted(retained=2)
    log.write(CheckpointTriggered, 1)
    log.write(CheckpointCompleted, 1, location="l1")
    wanted = _reqs((V1, 2, 4), (V2, -1, 8))
    _rescale(log, wanted)
    assert not fold(log.records, NS).rejected
    for cp in (2, 3, 4):
        log.write(CheckpointTriggered, cp)
        log.write(CheckpointCompleted, cp, location=f"l{cp}")
    log.write(CheckpointTriggered, 5)
    log.write(CheckpointFailed, 5, reason="declined", failure_reason="CHECKPOINT_DECLINED")
    log.write(JobRestarted, 4)
    image = fold(log.records, NS)
    assert not image.rejected and image.jobs["a"].checkpoints.requirements == wanted
    log.settle()
    full = fold(log.records, NS).answer()
    for compacted in log.cuts():
        assert fold(compacted, NS).answer() == full
        assert _requirements(compacted) == wanted


def test_a_second_rescale_replaces_the_first_and_an_empty_one_clears_them() -> None:
    log = _submitted()
    _rescale(log, _reqs((V1, 1, 1)))
    _rescale(log, _reqs((V1, 3, 3), (V2, 2, 2)))
    assert _requirements(log.records) == _reqs((V1, 3, 3), (V2, 2, 2))
    _rescale(log, ())
    image = fold(log.records, NS)
    assert not image.rejected and image.jobs["a"].checkpoints.requirements == ()


def test_a_deposed_leaders_rescale_is_refused_and_undoes_nothing_at_every_cut() -> None:
    log = _submitted()
    _rescale(log, _reqs((V1, 2, 2)))
    log.put(LeadershipGranted(prev_epoch=1, saw_renewal=None, **{**_common(2),
                                                                 "writer": "jm-2"}))
    _rescale(log, _reqs((V1, 7, 7)), epoch=1)  # the old leader, late
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["stale_epoch"]
    assert image.jobs["a"].checkpoints.requirements == _reqs((V1, 2, 2))
    log.settle(epoch=2)
    for compacted in log.cuts():
        assert _requirements(compacted) == _reqs((V1, 2, 2))


def test_an_ended_jobs_rescale_is_refused() -> None:
    log = _submitted()
    cancel = JobCancelled(job_id="a", reason="user", **_common())
    log.put(cancel, end_key(NS, "a", cancel.event_id))
    _rescale(log, _reqs((V1, 2, 2)))
    assert [d.reason for d in fold(log.records, NS).rejected] == ["terminal_job"]


_BAD = {
    "unsorted": _reqs((V2, 1, 1), (V1, 1, 1)),
    "twice": _reqs((V1, 1, 1), (V1, 2, 2)),
    "short id": _reqs(("abc", 1, 1),),
    "upper-case id": _reqs((V2.upper(), 1, 1),),
    "zero bound": _reqs((V1, 0, 2),),
    "bound past the maximum": _reqs((V1, 1, MAX_PARALLELISM + 1),),
    "lower above upper": _reqs((V1, 4, 2),),
    "too many vertices": tuple(VertexParallelism(f"{i:032x}", 1, 1)
                               for i in range(MAX_REQUIREMENTS + 1)),
}


@pytest.mark.parametrize("name", sorted(_BAD))
def test_bad_requirements_are_refused_by_the_fold_and_by_the_writer(name: str) -> None:
    bad = _BAD[name]
    assert requirements_error(bad) is not None
    log = _submitted()
    _rescale(log, bad)
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["bad_requirements"]
    assert image.jobs["a"].checkpoints.requirements == ()
    from registry.client import Term

    probe = _Probe()
    if name == "unsorted":  # the writer sorts what it is given
        Term.rescale(probe, "a", bad)  # type: ignore[arg-type]
        assert probe.seen["requirements"] == bad[::-1]
        return
    with pytest.raises(ConfigError, match="cannot rescale"):
        Term.rescale(probe, "a", bad)  # type: ignore[arg-type]
    assert not probe.seen


def test_a_rescale_that_names_a_checkpoint_is_refused() -> None:
    log = _submitted()
    _rescale(log, _reqs((V1, 2, 2)), checkpoint_id=3)
    assert [d.reason for d in fold(log.records, NS).rejected] == ["bad_requirements"]
    with pytest.raises(Exception, match="names none"):
        checkpoint_step(fold(log.records, NS).jobs["a"].checkpoints, JobRescaled, 3,
                        requirements=_reqs((V1, 2, 2)))


def test_a_checkpoint_record_that_drops_the_requirements_is_refused() -> None:
    """Every record after a rescale carries its requirements: one planned from the state
    before it (a writer that missed the rescale) is refused, the requirements stand."""
    log = _submitted()
    log.write(CheckpointTriggered, 1)
    stale_state = fold(log.records, NS).jobs["a"].checkpoints
    _rescale(log, _reqs((V1, 2, 2)))
    done, _ = checkpoint_step(stale_state, CheckpointCompleted, 1, location="l1")
    done = dataclasses.replace(done, seq=done.seq + 1)
    log.put(CheckpointCompleted(job_id="a", checkpoint_id=1, location="l1", state=done,
                                **_common()))
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["checkpoint_state_mismatch"]
    assert image.jobs["a"].checkpoints.requirements == _reqs((V1, 2, 2))


class _Probe:
    """Stands for a term: what ``Term.rescale`` would write."""

    def __init__(self) -> None:
        self.seen: dict = {}

    def _checkpoint(self, kind, job_id, checkpoint_id, **payload):
        self.seen.update(kind=kind, checkpoint_id=checkpoint_id, **payload)


def test_the_writer_takes_a_mapping_in_any_order() -> None:
    from registry.client import Term

    probe = _Probe()
    Term.rescale(probe, "a", {V2: (2, 4), V1: (-1, 3)}, reason="autoscaler")  # type: ignore[arg-type]
    seen = probe.seen
    assert seen["kind"] is JobRescaled and seen["checkpoint_id"] == UNKNOWN_CHECKPOINT
    assert seen["requirements"] == _reqs((V1, -1, 3), (V2, 2, 4))
    assert seen["reason"] == "autoscaler"
    with pytest.raises(ConfigError, match="lower, upper"):
        Term.rescale(_Probe(), "a", {V1: (1,)})  # type: ignore[arg-type, dict-item]


_REQS = st.lists(st.tuples(st.sampled_from([V1, V2]), st.integers(1, 4)), max_size=2).map(
    lambda xs: tuple(VertexParallelism(v, p, p) for v, p in sorted(dict(xs).items())))
_OPS = st.lists(st.one_of(st.tuples(st.just("complete"), st.none()),
                          st.tuples(st.just("fail"), st.none()),
                          st.tuples(st.just("restart"), st.none()),
                          st.tuples(st.just("rescale"), _REQS),
                          st.tuples(st.just("stale"), _REQS)), max_size=10)


@given(ops=_OPS)
def test_any_history_keeps_the_newest_accepted_rescale(ops) -> None:
    """Checkpoints, failures, restarts, rescales by the leader and by a deposed one, in any
    order: the job's requirements are the leader's newest rescale's, at the end and in every
    compacted log."""
    log = _submitted()
    log.put(LeadershipGranted(prev_epoch=1, saw_renewal=None, **_common(2)))
    wanted: tuple = ()
    cp = 0

    def write(kind, cp, **payload):
        view = fold(log.records, NS).jobs["a"]
        state, _ = checkpoint_step(view.checkpoints, kind, cp, retained=1,
                                   location=payload.get("location", ""),
                                   failure_reason=payload.get("failure_reason",
                                                              "UNSPECIFIED"))
        log.put(kind(job_id="a", checkpoint_id=cp, state=state, **payload, **_common(2)))

    for op, arg in ops:
        if op == "rescale":
            _rescale(log, arg, epoch=2)
            wanted = arg
        elif op == "stale":
            _rescale(log, arg, epoch=1)
        elif op == "restart":
            write(JobRestarted, fold(log.records, NS).jobs["a"].checkpoints.last_completed)
        else:
            cp += 1
            write(CheckpointTriggered, cp)
            if op == "fail":
                write(CheckpointFailed, cp, reason="declined",
                      failure_reason="CHECKPOINT_DECLINED")
            else:
                write(CheckpointCompleted, cp, location=f"l{cp}")
        assert _requirements(log.records) == wanted
    log.settle(epoch=2)
    image = fold(log.records, NS)
    assert {d.reason for d in image.rejected} <= {"stale_epoch"}
    for compacted in log.cuts():
        assert fold(compacted, NS).answer() == image.answer()
        assert _requirements(compacted) == wanted
