"""``jobreg bench flink-ha``'s report and its reading of the registry's timeline (no Flink:
the bench itself needs a JDK and minutes; its figures are in the README)."""

from __future__ import annotations

from registry.dev.bench_flink import FailoverRun
from registry.dev.bench_flink_ha import HaRun, format_flink_ha, timeline_terms
from registry.forensics import TermSummary
from registry.image import Decision, Outcome


def _d(offset: int, kind: str, epoch: int, outcome: Outcome = Outcome.ACCEPTED) -> Decision:
    return Decision(offset, outcome, 0, "k", kind, "e", "job", epoch)


class _Term:
    def __init__(self, epoch: int, leader: str) -> None:
        self.epoch, self.leader = epoch, leader


def test_the_timeline_by_term_counts_only_what_each_term_had_accepted() -> None:
    decisions = [_d(0, "JobSubmitted", 1), _d(2, "CheckpointTriggered", 1),
                 _d(4, "CheckpointTriggered", 1, Outcome.REJECTED),
                 _d(6, "CheckpointTriggered", 2), _d(8, "CheckpointCompleted", 2)]
    terms: list[TermSummary] = [_Term(1, "jm-a"), _Term(2, "jm-b")]  # type: ignore[list-item]
    assert timeline_terms(decisions, terms) == [
        "epoch 1 (jm-a): JobSubmitted x1, CheckpointTriggered x1",
        "epoch 2 (jm-b): CheckpointTriggered x1, CheckpointCompleted x1"]


def _run(**over: object) -> HaRun:
    run = HaRun("default", "jobreg (embedded)", job_id="j", task_failures=[0.6],
                kills=[FailoverRun("jm1", "jm2", 0.4, 1.1, 1.6, 6, None, 6)],
                verified=250, checkpoints_after=12, final_state="RUNNING",
                terms=["epoch 1 (a): JobSubmitted x1", "epoch 2 (b): CheckpointCompleted x3"])
    for k, v in over.items():
        setattr(run, k, v)
    return run


def test_a_run_passes_only_with_no_violation_a_running_job_and_a_term_per_failover() -> None:
    assert _run().passed
    assert not _run(violations=["HAVERIFY VIOLATION key 3: 5 after 5 (a duplicate)"]).passed
    assert not _run(final_state="RESTARTING").passed
    assert not _run(terms=["epoch 1 (a): JobSubmitted x1"]).passed  # the failover untold
    assert not _run(error="timed out").passed


def test_the_report_has_a_row_per_run_and_each_runs_timeline() -> None:
    text = format_flink_ha([_run(), _run(scheduler="adaptive", control=True,
                                         violations=["HAVERIFY VIOLATION x"])])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["scheduler", "backend", "kills"]
    assert lines[2].split()[0] == "default" and lines[2].split()[-1] == "yes"
    assert "adaptive (control)" in lines[3] and lines[3].split()[-1] == "NO"
    assert "  epoch 2 (b): CheckpointCompleted x3" in lines
    assert "  HAVERIFY VIOLATION x" in lines
