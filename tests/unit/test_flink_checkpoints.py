"""Flink's checkpoint failure cases, translated one by one (fold rule 6).

Each test names the Flink test it mirrors: ``CheckpointFailureManagerTest`` (flink-runtime,
``org.apache.flink.runtime.checkpoint``; its JUnit 5 version, whose calls have the signatures
of Flink 2.3.0's ``CheckpointFailureManager``) and the decline cases of
``CheckpointCoordinatorTest``. The reason table is Flink 2.3.0's
(:data:`FLINK_2_3_0`, copied here from its ``CheckpointFailureReason`` and
``CheckpointFailureManager.checkFailureCounter``, not from jobreg). How Flink's calls map to
jobreg's:

* ``new CheckpointFailureManager(tolerable, callback)`` -> a job submitted with
  ``max_checkpoint_failures=tolerable``;
* ``handleJobLevelCheckpointException(props, new CheckpointException(REASON), id)`` -> the
  coordinator had triggered ``id`` (Flink's coordinator only hands the manager failures of
  checkpoints it has pending) and writes ``checkpoint_failed(id, failure_reason=REASON)``;
  with a negative id (the trigger phase, before an id existed) ``checkpoint_trigger_failed``
  (id -1, Flink's ``UNKNOWN_CHECKPOINT_ID``; Flink 2.3.0's ``testTotalCountValue`` passes
  -2, which it counts the same way because every counted failure there clears the count);
* ``handleCheckpointSuccess(id)`` -> ``checkpoint_completed(id)``;
* the ``FailJobCallback`` being invoked -> the job's ``over_budget`` turning on; the
  coordinator then restarts the job (``job_restarted``), which, like Flink's ``clearCount()``
  before it fails the job, starts the count again. ``callback.getInvokeCounter()`` is the
  number of restarts.

The records go through the fold as a :class:`~registry.Term` writes them (the state each
carries computed with the fold's own :func:`~registry.fold.checkpoint_step`, and whether the
reason counts decided by the writer's table, :func:`~registry.fold.failure_reason_counts`).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import struct
from pathlib import Path

import fastavro
import pytest
from support.incidents import Records
from support.model import encode_with

from registry.codec import Catalog, Codec, default_codec, encode
from registry.errors import ConfigError
from registry.events import (
    CHECKPOINT_FAILURE_REASONS,
    COUNTED_FAILURE_REASONS,
    FLINK_FAILURE_REASONS,
    FLINK_RELEASE,
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
from registry.fold import Delta, checkpoint_step, failure_reason_counts, fold
from registry.forensics import DumpSource, Forensics
from registry.image import Decision, Image, LogRecord, Outcome
from registry.keys import record_key

NS = "flink"
CASES = Path(__file__).parents[1] / "support" / "cases"

FLINK_2_3_0 = [
    # Flink 2.3.0's CheckpointFailureReason, in its declaration order (what values() walks):
    # (name, preFlight, counted by CheckpointFailureManager.checkFailureCounter), as the
    # 2.3.0 release's classes have it (flink-dist-2.3.0.jar: the enum's constructor arguments,
    # the switch's cases; not copied from jobreg).
    ("PERIODIC_SCHEDULER_SHUTDOWN", True, False),
    ("TOO_MANY_CHECKPOINT_REQUESTS", True, False),
    ("MINIMUM_TIME_BETWEEN_CHECKPOINTS", True, False),
    ("NOT_ALL_REQUIRED_TASKS_RUNNING", True, False),
    ("IO_EXCEPTION", True, True),
    ("BLOCKING_OUTPUT_EXIST", True, False),
    ("CHECKPOINT_ASYNC_EXCEPTION", False, True),
    ("CHANNEL_STATE_SHARED_STREAM_EXCEPTION", False, False),
    ("CHECKPOINT_EXPIRED", False, True),
    ("CHECKPOINT_SUBSUMED", False, False),
    ("CHECKPOINT_DECLINED", False, True),
    ("CHECKPOINT_DECLINED_TASK_NOT_READY", False, False),
    ("CHECKPOINT_DECLINED_TASK_CLOSING", False, False),
    ("CHECKPOINT_DECLINED_SUBSUMED", False, False),
    ("CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER", False, False),
    ("CHECKPOINT_DECLINED_INPUT_END_OF_STREAM", False, False),
    ("CHECKPOINT_COORDINATOR_SHUTDOWN", False, False),
    ("CHECKPOINT_COORDINATOR_SUSPEND", False, False),
    ("JOB_FAILOVER_REGION", False, False),
    ("TASK_FAILURE", False, False),
    ("TASK_CHECKPOINT_FAILURE", False, False),
    ("UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE", False, False),
    ("FINALIZE_CHECKPOINT_FAILURE", False, True),
    ("TRIGGER_CHECKPOINT_FAILURE", False, False),
]
FLINK_REASONS = [name for name, _, _ in FLINK_2_3_0]


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
        if kind is CheckpointFailed:  # what a Term writes: its table's decision
            extra["reason_counts"] = failure_reason_counts(extra["failure_reason"])
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
    """CheckpointFailureManagerTest#testBreakContinuousFailure."""
    c = Coordinator(2)
    c.fail(1, "IO_EXCEPTION")
    c.fail(2, "CHECKPOINT_DECLINED")
    c.fail(3, "JOB_FAILOVER_REGION")
    c.trigger(4)
    c.succeed(4)  # reset
    c.fail(5, "CHECKPOINT_EXPIRED")
    assert c.restarts == 0 and c.job.checkpoints.consecutive_failures == 1


def test_total_count_value() -> None:
    """CheckpointFailureManagerTest#testTotalCountValue: tolerable 0, one trigger-phase failure
    of every reason of Flink 2.3.0; each counted one fails the job, and the count starts again
    each time. Flink asserts 5 (IO_EXCEPTION, CHECKPOINT_DECLINED, FINALIZE_CHECKPOINT_FAILURE,
    CHECKPOINT_EXPIRED and CHECKPOINT_ASYNC_EXCEPTION)."""
    c = Coordinator(0)
    for reason in FLINK_REASONS:
        c.fail(UNKNOWN_CHECKPOINT, reason)
    assert c.restarts == 5
    assert c.job.checkpoints.consecutive_failures == 0


def test_the_reason_table_is_flink_2_3_0s() -> None:
    """jobreg's table is Flink 2.3.0's, reason by reason (name, preFlight, counted), plus
    jobreg's UNSPECIFIED (counted) and the names of earlier releases (never counted)."""
    assert FLINK_RELEASE == "2.3.0"
    assert [(n, r.pre_flight, r.counted) for n, r in FLINK_FAILURE_REASONS.items()] == FLINK_2_3_0
    assert {"UNSPECIFIED"} | {n for n, _, c in FLINK_2_3_0 if c} == COUNTED_FAILURE_REASONS
    assert set(FLINK_REASONS) <= set(CHECKPOINT_FAILURE_REASONS)
    for name in CHECKPOINT_FAILURE_REASONS:
        assert failure_reason_counts(name) == (name in COUNTED_FAILURE_REASONS)


def test_a_name_this_jobreg_does_not_know_is_refused_by_the_writer() -> None:
    """One rule: the writer decides whether a failure counts, by its table; a name its table
    does not have is refused (Flink's checkFailureCounter throws on a reason it does not
    know), never guessed at."""
    for name in ("DECLINED", "EXCEPTION", "", "checkpoint_declined"):
        with pytest.raises(ConfigError, match="unknown checkpoint failure reason"):
            failure_reason_counts(name)


def test_the_fold_follows_the_decision_the_record_carries() -> None:
    """The fold never judges a reason by its own table: a record carries its writer's
    decision (``reason_counts``), and the fold follows it, so a reader older than the writer
    (to which a newer name reads as UNSPECIFIED) folds as the writer did."""
    for counts in (True, False):
        c = Coordinator(0)
        c.restart_over_budget = False
        view = c.job
        state, why = checkpoint_step(view.checkpoints, CheckpointFailed, UNKNOWN_CHECKPOINT,
                                     failure_reason="UNSPECIFIED", counts=counts)
        d = c._append(CheckpointFailed(job_id="job", checkpoint_id=UNKNOWN_CHECKPOINT,
                                       state=state, reason="", failure_reason="UNSPECIFIED",
                                       reason_counts=counts, **_env()))
        assert d.outcome == (Outcome.ACCEPTED if counts else Outcome.IGNORED), d
        assert c.job.over_budget is counts


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
    a checkpoint already failed finds it no longer pending (it ended: kept among the ended
    ids, so its id is never triggered again)."""
    c = Coordinator(0)
    unknown = c.fail(7, "CHECKPOINT_DECLINED", trigger=False)
    assert unknown.outcome == Outcome.IGNORED and "not pending" in unknown.detail
    c.trigger(8)
    c.fail(8, "JOB_FAILOVER_REGION")  # ends checkpoint 8 without counting
    late = c.fail(8, "CHECKPOINT_DECLINED", trigger=False)
    assert late.outcome == Outcome.IGNORED and "checkpoint 8 was discarded" in late.detail
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


def _newer_writer_entry() -> dict:
    """A CheckpointFailed schema of a newer jobreg, whose Flink has a reason this one lacks."""
    catalog = default_codec().catalog
    schema = copy.deepcopy(catalog.current("CheckpointFailed").schema)
    field = next(f for f in schema["fields"] if f["name"] == "failure_reason")
    field["type"]["symbols"].append("SOME_FUTURE_REASON")
    return {"id": max(e.id for e in catalog.entries()) + 1, "type": "CheckpointFailed",
            "version": catalog.current_version("CheckpointFailed") + 1, "schema": schema}


@pytest.mark.parametrize("counts", [True, False])
def test_a_reason_only_a_newer_writer_knows_folds_as_the_writer_decided(counts: bool) -> None:
    """A newer jobreg (a newer Flink) writes a reason this one does not know. Read with the
    writer's schema (a dump carries it) the name survives; read by this jobreg's own schema
    (through a schema registry) it reads as UNSPECIFIED. Either way the fold follows the
    decision the record carries, as the writer's own fold did."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    entry = _newer_writer_entry()
    c = Coordinator(0)
    c.restart_over_budget = False
    state, _ = checkpoint_step(c.job.checkpoints, CheckpointFailed, UNKNOWN_CHECKPOINT,
                               counts=counts)
    event = CheckpointFailed(job_id="job", checkpoint_id=UNKNOWN_CHECKPOINT, state=state,
                             reason="new", failure_reason="SOME_FUTURE_REASON",
                             reason_counts=counts, **_env())
    record = {"envelope": {**{k: getattr(event, k) for k in ("event_id", "namespace", "epoch",
                                                             "writer", "created_at")},
                           "schema_version": entry["version"]},
              "job_id": "job", "checkpoint_id": -1, "state": dataclasses.asdict(state),
              "reason": "new", "task": None, "failure_reason": "SOME_FUTURE_REASON",
              "reason_counts": counts}

    def body(schema_id: int) -> bytes:
        buf = io.BytesIO()
        buf.write(struct.pack(">bI", 0, schema_id))
        fastavro.schemaless_writer(buf, fastavro.parse_schema(entry["schema"]), record)
        return buf.getvalue()

    dump_reader = Codec(Catalog.from_dict(
        {"schemas": [*default_codec().catalog.to_dict()["schemas"], entry]}))
    assert dump_reader.decode(body(entry["id"])).failure_reason == "SOME_FUTURE_REASON"
    registry = SchemaRegistryClient.new_client({"url": "mock://issue-29"})
    writer_id = registry.register_schema("jobreg.CheckpointFailed",
                                         Schema(json.dumps(entry["schema"]), "AVRO"))
    old_reader = Codec(default_codec().catalog, schema_registry=registry)
    assert old_reader.decode(body(writer_id)).failure_reason == "UNSPECIFIED"
    for codec, data in ((dump_reader, body(entry["id"])), (old_reader, body(writer_id))):
        delta = Delta(c.image, codec)
        decision = delta.replay(LogRecord(len(c.records), record_key(event).encode(), data))
        assert decision.outcome == (Outcome.ACCEPTED if counts else Outcome.IGNORED), decision
        job = delta.apply().jobs["job"]
        assert job.over_budget is counts and job.checkpoints.unknown_failures == int(counts)


# -- schema evolution: old logs fold as they did --------------------------------------------

def test_a_log_written_before_flink_2_3_folds_to_the_same_answer() -> None:
    """A dump written through the client by jobreg before its table became Flink 2.3.0's
    (``support/cases/make_checkpoint_reasons_before_2_3.py``, run at commit dd79e61): then
    FINALIZE_CHECKPOINT_FAILURE did not count. Its records carry no decision, so the fold
    judges them by the table of their time, and every job, verdict and reason is what it was:
    job-within stays within budget, job-total was restarted 5 times, not 6."""
    expected = json.loads((CASES / "checkpoint_reasons_before_2_3.json").read_text())
    scan = Forensics(DumpSource(CASES / "checkpoint_reasons_before_2_3.avro"), "flink").scan()
    jobs = {j: {"over_budget": v.over_budget,
                "consecutive_failures": v.checkpoints.consecutive_failures,
                "counted": list(v.checkpoints.counted),
                "unknown_failures": v.checkpoints.unknown_failures,
                "last_completed": v.checkpoints.last_completed,
                "pending": list(v.checkpoints.pending)}
            for j, v in sorted(scan.image.jobs.items())}
    assert jobs == expected["jobs"]
    assert [[d.offset, d.event_type, str(d.outcome), d.reason, d.detail]
            for d in scan.decisions] == expected["decisions"]
    restarts = [d for d in scan.decisions if d.event_type == "JobRestarted"]
    assert len(restarts) == 5
    # The same history written today: FINALIZE_CHECKPOINT_FAILURE counts, job-within is over.
    c = Coordinator(1)
    c.restart_over_budget = False
    c.trigger(1)
    c.succeed(1)
    c.fail(2, "FINALIZE_CHECKPOINT_FAILURE")
    c.fail(3, "CHECKPOINT_EXPIRED")
    assert c.job.over_budget


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


def _step(state, kind, cp, **kw):
    from registry.rules import checkpoint_step
    return checkpoint_step(state, kind, cp, **kw)[0]


@pytest.mark.parametrize("history", [
    # trigger 1, complete 1, trigger 2, fail 2 for a reason Flink does not count
    [("trigger", 1), ("complete", 1), ("trigger", 2), ("fail", 2, "JOB_FAILOVER_REGION")],
    # trigger 1, trigger 2, fail 2 (counted), complete 1
    [("trigger", 1), ("trigger", 2), ("fail", 2, "CHECKPOINT_DECLINED"), ("complete", 1)],
    # trigger 1, trigger 2, fail 2 (counted), restart
    [("trigger", 1), ("complete", 1), ("trigger", 2), ("fail", 2, "CHECKPOINT_DECLINED"),
     ("restart", 1)],
])
def test_a_checkpoint_id_is_never_triggered_twice(history) -> None:
    """Issue 42, finding 5: each of these let id 2 be triggered again (the next id fell
    back), so a late failure of the first attempt would count against the second and both
    wrote under one chk-2. Every id triggered stays known until a newer one completes."""
    from registry.events import (
        EMPTY_CHECKPOINTS,
        CheckpointCompleted,
        CheckpointFailed,
        CheckpointTriggered,
        JobRestarted,
    )
    from registry.rules import CheckpointRuleViolation
    kinds = {"trigger": CheckpointTriggered, "complete": CheckpointCompleted,
             "fail": CheckpointFailed, "restart": JobRestarted}
    state, newest = EMPTY_CHECKPOINTS, -1
    for kind, cp, *reason in history:
        kw = {"failure_reason": reason[0]} if reason else {}
        state = _step(state, kinds[kind], cp, **kw)
        assert state.newest_id >= newest  # ids never go back
        newest = state.newest_id
    assert state.newest_id == 2
    with pytest.raises(CheckpointRuleViolation, match="ids increase"):
        _step(state, CheckpointTriggered, 2)
