"""Flink's checkpoint failure cases, translated one by one (fold rule 6).

Each test names the Flink test it mirrors: ``CheckpointFailureManagerTest`` (flink-runtime,
``org.apache.flink.runtime.checkpoint``) and the decline cases of ``CheckpointCoordinatorTest``.
How Flink's calls map to jobreg's:

* ``new CheckpointFailureManager(tolerable, callback)`` -> a job submitted with
  ``max_checkpoint_failures=tolerable``;
* ``handleJobLevelCheckpointException(new CheckpointException(REASON), id)`` -> the
  coordinator had triggered ``id`` (Flink's coordinator only hands the manager failures of
  checkpoints it has pending) and writes ``checkpoint_failed(id, failure_reason=REASON)``;
  with id -1 (``UNKNOWN_CHECKPOINT_ID``, the trigger phase) ``checkpoint_trigger_failed``;
* ``handleCheckpointSuccess(id)`` -> ``checkpoint_completed(id)``;
* the ``FailJobCallback`` being invoked -> the job's ``over_budget`` turning on; the
  coordinator then restarts the job (``job_restarted``), which, like Flink's ``clearCount()``
  before it fails the job, starts the count again. ``callback.getInvokeCounter()`` is the
  number of restarts.

The records go through the fold as a :class:`~registry.Term` writes them (the state each
carries computed with the fold's own :func:`~registry.fold.checkpoint_step`).
"""

from __future__ import annotations

from support.model import encode_with

from registry.codec import default_codec, encode
from registry.events import (
    CHECKPOINT_FAILURE_REASONS,
    COUNTED_FAILURE_REASONS,
    UNKNOWN_CHECKPOINT,
    CheckpointCompleted,
    CheckpointFailed,
    CheckpointTriggered,
    InlineGraph,
    JobRestarted,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import Delta, checkpoint_step, fold
from registry.image import Decision, Image, LogRecord, Outcome
from registry.keys import record_key

NS = "flink"
FLINK_REASONS = [r for r in CHECKPOINT_FAILURE_REASONS if r != "UNSPECIFIED"]


def _env() -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm", created_at=0)


class Coordinator:
    """One job under a leader, written to as a Term writes; restarts it when over budget."""

    restart_over_budget = True

    def __init__(self, tolerable: int) -> None:
        self.records: list[LogRecord] = []
        self.image = Image.empty(NS)
        self.restarts = 0
        self._append(LeadershipGranted(prev_epoch=0, **_env()))
        self._append(JobSubmitted(job_id="job", graph=InlineGraph(b"g"),
                                  max_checkpoint_failures=tolerable, **_env()))

    def _append(self, event, data: bytes | None = None) -> Decision:
        record = LogRecord(len(self.records), record_key(event).encode(),
                           data if data is not None else encode(event))
        self.records.append(record)
        delta = Delta(self.image)
        decision = delta.replay(record)
        self.image = delta.apply()
        return decision

    @property
    def job(self):
        return self.image.jobs["job"]

    def _write(self, kind, cp: int, **extra) -> Decision:
        view = self.job
        state, _ = checkpoint_step(view.checkpoints, kind, cp, location=extra.get("location", ""),
                                   retained=view.retained_checkpoints,
                                   failure_reason=extra.get("failure_reason", "UNSPECIFIED"))
        d = self._append(kind(job_id="job", checkpoint_id=cp, state=state, **extra, **_env()))
        assert d.outcome in (Outcome.ACCEPTED, Outcome.IGNORED), d
        if self.job.over_budget and self.restart_over_budget:  # Flink's FailJobCallback
            self.restarts += 1
            self._append_restart()
        return d

    def _append_restart(self) -> None:
        view = self.job
        cp = view.checkpoints.last_completed
        state, _ = checkpoint_step(view.checkpoints, JobRestarted, cp)
        d = self._append(JobRestarted(job_id="job", checkpoint_id=cp, state=state,
                                      reason="over budget", **_env()))
        assert d.outcome == Outcome.ACCEPTED, d

    def trigger(self, cp: int) -> Decision:
        return self._write(CheckpointTriggered, cp)

    def fail(self, cp: int, reason: str, *, trigger: bool = True) -> Decision:
        """handleJobLevelCheckpointException(reason, cp): the coordinator had it pending."""
        if cp == UNKNOWN_CHECKPOINT:
            return self._write(CheckpointFailed, cp, reason="", failure_reason=reason)
        if trigger and cp not in self.job.checkpoints.pending and \
                cp > max([self.job.checkpoints.last_completed, *self.job.checkpoints.pending,
                          *self.job.checkpoints.discarded, *self.job.checkpoints.counted]):
            self.trigger(cp)
        return self._write(CheckpointFailed, cp, reason="", failure_reason=reason)

    def succeed(self, cp: int) -> Decision:
        return self._write(CheckpointCompleted, cp, location=f"s3://cp/{cp}")


def test_ignores_past_checkpoints() -> None:
    """CheckpointFailureManagerTest#testIgnoresPastCheckpoints."""
    c = Coordinator(2)
    c.fail(1, "CHECKPOINT_EXPIRED")
    c.fail(2, "CHECKPOINT_EXPIRED")
    c.succeed(2)
    late = c.fail(1, "CHECKPOINT_EXPIRED", trigger=False)
    assert late.outcome == Outcome.IGNORED and "not newer" in late.detail
    c.fail(3, "CHECKPOINT_EXPIRED")
    c.fail(4, "CHECKPOINT_EXPIRED")
    assert c.restarts == 0 and c.job.checkpoints.consecutive_failures == 2


def test_continuous_failure() -> None:
    """CheckpointFailureManagerTest#testContinuousFailure: JOB_FAILOVER_REGION does not count."""
    c = Coordinator(2)
    c.fail(1, "CHECKPOINT_DECLINED")
    c.fail(2, "CHECKPOINT_DECLINED")
    ignored = c.fail(3, "JOB_FAILOVER_REGION")
    assert ignored.outcome == Outcome.IGNORED and "JOB_FAILOVER_REGION" in ignored.detail
    c.fail(4, "CHECKPOINT_DECLINED")
    assert c.restarts == 1


def test_break_continuous_failure() -> None:
    """CheckpointFailureManagerTest#testBreakContinuousFailure (Flink's EXCEPTION reason of
    older versions is CHECKPOINT_ASYNC_EXCEPTION's place in the table jobreg follows)."""
    c = Coordinator(2)
    c.fail(1, "CHECKPOINT_ASYNC_EXCEPTION")
    c.fail(2, "CHECKPOINT_DECLINED")
    c.fail(3, "JOB_FAILOVER_REGION")
    c.trigger(4)
    c.succeed(4)  # reset
    c.fail(5, "CHECKPOINT_EXPIRED")
    assert c.restarts == 0 and c.job.checkpoints.consecutive_failures == 1


def test_total_count_value() -> None:
    """CheckpointFailureManagerTest#testTotalCountValue: tolerable 0, one trigger-phase failure
    (id -1) of every reason; each counted one fails the job, and the count starts again each
    time. Flink's assertion is the number of counted reasons of its version's table; jobreg
    follows the table of ``CheckpointFailureManager.checkFailureCounter`` with IO_EXCEPTION,
    CHECKPOINT_ASYNC_EXCEPTION, CHECKPOINT_DECLINED and CHECKPOINT_EXPIRED counted: 4."""
    c = Coordinator(0)
    for reason in FLINK_REASONS:
        c.fail(UNKNOWN_CHECKPOINT, reason)
    counted = [r for r in FLINK_REASONS if r in COUNTED_FAILURE_REASONS]
    assert len(counted) == 4 and c.restarts == 4
    assert c.job.checkpoints.consecutive_failures == 0


def test_ignore_one_checkpoint_repeatedly_count_multi_times() -> None:
    """CheckpointFailureManagerTest#testIgnoreOneCheckpointRepeatedlyCountMultiTimes."""
    c = Coordinator(2)
    c.fail(1, "CHECKPOINT_DECLINED")
    c.fail(2, "CHECKPOINT_DECLINED")
    c.fail(3, "JOB_FAILOVER_REGION")
    again = c.fail(2, "CHECKPOINT_DECLINED", trigger=False)
    assert again.outcome == Outcome.IGNORED and "already counted" in again.detail
    assert c.restarts == 0


def test_a_decline_of_a_checkpoint_never_triggered_is_ignored() -> None:
    """CheckpointCoordinatorTest: a decline for an unknown (never pending) checkpoint is
    dropped (``receiveDeclineMessage`` finds no pending checkpoint), and a second decline of
    a checkpoint already failed finds it no longer pending."""
    c = Coordinator(0)
    unknown = c.fail(7, "CHECKPOINT_DECLINED", trigger=False)
    assert unknown.outcome == Outcome.IGNORED and "not pending" in unknown.detail
    c.trigger(8)
    c.fail(8, "JOB_FAILOVER_REGION")  # ends checkpoint 8 without counting
    late = c.fail(8, "CHECKPOINT_DECLINED", trigger=False)
    assert late.outcome == Outcome.IGNORED and "not pending" in late.detail
    assert c.restarts == 0


def test_a_restart_keeps_the_retained_checkpoints_and_aborts_the_pending_ones() -> None:
    """Flink restores the latest completed checkpoint when it fails a job over and aborts
    the checkpoints in flight; their late failures no longer count."""
    c = Coordinator(1)
    c.trigger(1)
    c.succeed(1)
    c.trigger(2)
    c.trigger(3)
    c.fail(2, "CHECKPOINT_DECLINED")
    c.fail(3, "CHECKPOINT_EXPIRED")  # 2 > 1: restart
    assert c.restarts == 1
    cps = c.job.checkpoints
    assert cps.consecutive_failures == 0 and [r.checkpoint_id for r in cps.retained] == [1]
    c2 = Coordinator(1)
    c2.trigger(1)
    c2.succeed(1)
    c2.trigger(2)
    c2._append_restart()  # restarted while checkpoint 2 was in flight
    assert c2.job.checkpoints.pending == () and 2 in c2.job.checkpoints.discarded
    late = c2.fail(2, "CHECKPOINT_DECLINED", trigger=False)
    assert late.outcome == Outcome.IGNORED and "discarded" in late.detail


# -- schema evolution: a log written before failure reasons folds as it did ---------------

def test_a_log_written_with_the_schemas_before_failure_reasons_folds_to_the_same_answer() -> None:
    """Checkpoint records of schema version 1 (ids 12-15 of the catalog) carry states the
    rule of their time computed: a failure counted whether or not its checkpoint was pending,
    and every failure counted. The fold judges them by that rule, so none is refused as a
    state mismatch and the count is what it was."""
    codec = default_codec()
    ids = {t: next(e.id for e in codec.catalog.entries() if e.type == t and e.version == 1)
           for t in ("CheckpointTriggered", "CheckpointFailed", "CheckpointCompleted")}
    c = Coordinator(5)
    steps = [(CheckpointTriggered, 1), (CheckpointFailed, 1), (CheckpointFailed, 2),
             (CheckpointCompleted, 3), (CheckpointFailed, 4), (CheckpointFailed, 6)]
    for kind, cp in steps:  # 2, 4 and 6 were never triggered
        view = c.job
        state, _ = checkpoint_step(view.checkpoints, kind, cp, location="s3://x",
                                   retained=view.retained_checkpoints, legacy=True)
        extra = {CheckpointCompleted: {"location": "s3://x"},
                 CheckpointFailed: {"reason": "DECLINED"}}.get(kind, {})
        event = kind(job_id="job", checkpoint_id=cp, state=state, **extra, **_env())
        d = c._append(event, encode_with(event, ids[kind.TYPE]))
        assert d.outcome == Outcome.ACCEPTED, d
    assert c.job.checkpoints.counted == (4, 6)
    assert fold(c.records, NS).answer() == c.image.answer()



def test_explain_tells_restarts_and_an_exhausted_budget() -> None:
    """Issue 15 item 11: explain says a job is over its checkpoint failure budget, which
    failures counted (with Flink's reason), what Flink would do, and that it was restarted."""
    from support.incidents import Records

    from registry.forensics import Forensics

    c = Coordinator(1)
    c.restart_over_budget = False
    c.fail(1, "CHECKPOINT_DECLINED")
    c.fail(2, "JOB_FAILOVER_REGION")  # ignored: does not count
    c.fail(3, "CHECKPOINT_EXPIRED")
    assert c.job.over_budget
    text = Forensics(Records(c.records), NS).explain("job")
    assert "over budget: 2 counted since the last completed checkpoint or restart, 1 " \
        "tolerated" in text
    assert "CHECKPOINT_DECLINED" in text and "CHECKPOINT_EXPIRED" in text
    assert "JOB_FAILOVER_REGION" not in text.split("The counted failures:")[1].split("\n")[0]
    assert "restarted" not in text.split("over budget")[0]
    c._append_restart()
    text = Forensics(Records(c.records), NS).explain("job")
    assert "It was restarted 1 time(s)" in text and "(reason: over budget)" in text
    assert "over budget:" not in text
