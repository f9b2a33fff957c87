"""Failover that cannot hurt: incidents 003, 000 (blob part) and 004 on the embedded broker."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry import ConfigError, GraphRef, JobStatus, JobView
from registry.blobs import FileBlobStore
from registry.codec import encode
from registry.events import InlineGraph, JobCancelled, JobSubmitted, JobTerminated, new_event_id
from registry.fold import fold
from registry.image import LogRecord
from registry.keys import record_key

pytestmark = pytest.mark.integration


def test_incident_003_one_bad_job_fails_alone(connect) -> None:
    """50 live jobs; the recovery hook raises for one; the leader and the other 49 carry on."""
    old = connect("ns3")
    t1 = old.claim_leadership("jm-1")
    t1.submit_many([(f"job-{i:02d}", f"graph {i}".encode()) for i in range(50)])

    def hook(job) -> None:
        if job.job_id == "job-13":
            raise RuntimeError("cannot deserialize the job graph")

    new = connect("ns3")
    t2 = new.claim_leadership("jm-2")
    results = t2.recover(hook)  # must not raise
    assert len(results) == 50
    failed = [r for r in results if not r.ok]
    assert [(r.job_id, r.status) for r in failed] == [("job-13", JobStatus.RECOVERY_FAILED)]
    assert "RuntimeError: cannot deserialize the job graph" in failed[0].error
    jobs = new.jobs()
    assert sum(v.owner_epoch == 2 for v in jobs.values()) == 49
    assert jobs["job-13"].status == JobStatus.RECOVERY_FAILED and jobs["job-13"].error

    # A second failover recovers the 49 again and leaves the failed job alone.
    calls: list[str] = []
    third = connect("ns3")
    t3 = third.claim_leadership("jm-3")
    results = t3.recover(lambda job: calls.append(job.job_id))
    assert len(results) == 49 and "job-13" not in calls and all(r.ok for r in results)
    assert third.job("job-13").status == JobStatus.RECOVERY_FAILED

    # retry: still failing keeps the error; once the hook works the job is adopted.
    again = t3.retry("job-13", hook)
    assert again.status == JobStatus.RECOVERY_FAILED and "RuntimeError" in again.error
    fixed = t3.retry("job-13", lambda job: None)
    assert fixed.ok and third.job("job-13").owner_epoch == 3
    with pytest.raises(ConfigError, match="only a job that failed recovery"):
        t3.retry("job-13")


def test_a_release_of_a_failed_job_hands_it_to_the_next_recovery_and_cancel_ends_it(connect) -> None:
    """A release sets the whole lock (ACTIVE, no owner, no error) whatever the lock key held
    before: it was refused ``recovery_failed`` once, a refusal that rested on the lock key's
    earlier record and so became an acceptance once the cleaner removed it (issue 42)."""
    reg = connect("rf")
    t1 = reg.claim_leadership("jm-1")
    t1.submit("bad", b"g")
    t2 = connect("rf").claim_leadership("jm-2")
    t2.recover(lambda job: 1 / 0)
    assert reg.sync().jobs["bad"].status == JobStatus.RECOVERY_FAILED
    assert t2.release("bad").ignored is None
    view = reg.sync().jobs["bad"]
    assert (view.status, view.owner_epoch, view.error) == (JobStatus.ACTIVE, None, None)
    t3 = connect("rf").claim_leadership("jm-3")
    [again] = t3.recover(lambda job: 1 / 0)
    assert again.status == JobStatus.RECOVERY_FAILED  # the next recovery tried it again
    t3.cancel("bad")
    assert reg.jobs(include_terminal=True)["bad"].status == JobStatus.CANCELLED


def test_incident_000_blob_of_a_cancelled_job_is_collected_and_never_loaded(connect, tmp_path) -> None:
    """Large graphs live in the blob store; a cancelled job's blob goes once its result is
    clean (here: cleaned up by the next leader), a live job's never."""
    reg = connect("ns0", inline_limit=64)
    t1 = reg.claim_leadership("jm-1")
    t1.submit("job-a", b"A" * 1000)
    t1.submit("job-b", b"B" * 1000)
    ref_a, ref_b = reg.job("job-a").graph, reg.job("job-b").graph
    assert isinstance(ref_a, GraphRef) and isinstance(ref_b, GraphRef)
    t1.cancel("job-a")
    past = time.time() - 7200
    for ref in (ref_a, ref_b):  # both blobs are two hours old
        os.utime(ref.uri.removeprefix("file://"), (past, past))
    # jm-1 dies before cleaning up: the dirty result still holds job-a's graph.
    assert reg.job("job-a").dirty and reg.job("job-a").graph == ref_a
    assert not reg.collect_garbage(grace=3600).deleted
    # A restart: recovery only ever loads live jobs' graphs, and they are all there; the
    # new leader is handed the dirty result to clean up.
    loaded: list[bytes] = []
    cleaned: list[JobView] = []
    t2 = connect("ns0", inline_limit=64).claim_leadership("jm-2")
    results = t2.recover(lambda job: loaded.append(job.graph), on_cleanup=cleaned.append)
    assert [(r.job_id, r.status) for r in results] == [("job-b", "ADOPTED"),
                                                        ("job-a", "CLEANED")]
    assert all(r.ok for r in results) and loaded == [b"B" * 1000]
    assert [(v.job_id, v.status, v.graph) for v in cleaned] == [("job-a", "CANCELLED", ref_a)]
    assert not reg.job("job-a").dirty and reg.job("job-a").graph is None
    report = reg.collect_garbage(grace=3600)
    assert [b.uri for b in report.deleted] == [ref_a.uri]
    assert reg.blob_store.exists(ref_b) and not reg.blob_store.exists(ref_a)
    # A blob that went missing behind our back fails that job alone, with the reason.
    os.remove(ref_b.uri.removeprefix("file://"))
    results = connect("ns0", inline_limit=64).claim_leadership("jm-3").recover()
    assert results[0].status == JobStatus.RECOVERY_FAILED and "BlobMissing" in results[0].error


def test_incident_004_checkpoint_failures_through_the_client(connect) -> None:
    reg = connect("ns4")
    t = reg.claim_leadership("jm-1")
    t.submit("job", b"g", max_checkpoint_failures=2, retained_checkpoints=2)
    t.checkpoint_triggered("job", 4)
    t.checkpoint_completed("job", 4, "s3://cp/4")
    t.checkpoint_triggered("job", 5)
    assert t.checkpoint_failed("job", 5, "DECLINED", task="map-1").ignored is None
    t.checkpoint_discarded("job", 5, "declined by map-1")
    late = t.checkpoint_failed("job", 5, "DECLINED", task="map-2")  # the late decline
    assert late.ignored is not None and "discarded" in late.ignored
    assert reg.job("job").checkpoints.consecutive_failures == 1
    for cp in (6, 7):
        t.checkpoint_triggered("job", cp)
        t.checkpoint_failed("job", cp, "EXPIRED")
    assert reg.job("job").over_budget  # 3 consecutive failures > 2 tolerable
    t.checkpoint_triggered("job", 8)
    t.checkpoint_completed("job", 8, "s3://cp/8")
    view = reg.job("job")
    assert not view.over_budget and view.checkpoints.consecutive_failures == 0
    assert [c.checkpoint_id for c in view.latest_checkpoints] == [4, 8]
    # recovery hands the retained checkpoints to the hook
    seen = []
    connect("ns4").claim_leadership("jm-2").recover(lambda job: seen.append(job.checkpoints))
    assert [c.location for c in seen[0]] == ["s3://cp/4", "s3://cp/8"]
    ignored = reg.sync().ignored
    assert [(d.event_type, d.job_id) for d in ignored] == [("CheckpointFailed", "job")]


def test_failure_reasons_trigger_failures_and_restarts_through_the_client(connect) -> None:
    """Issue 12 through the client: Flink's reasons (an uncounted one, a bad name refused
    before anything is written), a trigger-phase failure, and a restart when over budget."""
    reg = connect("ns12")
    t = reg.claim_leadership("jm-1")
    t.submit("job", b"g", max_checkpoint_failures=1)
    t.checkpoint_triggered("job", 1)
    t.checkpoint_completed("job", 1, "s3://cp/1")
    t.checkpoint_triggered("job", 2)
    skipped = t.checkpoint_failed("job", 2, "region restart", failure_reason="JOB_FAILOVER_REGION")
    assert skipped.ignored is not None and "JOB_FAILOVER_REGION" in skipped.ignored
    never = t.checkpoint_failed("job", 9, "late decline", failure_reason="CHECKPOINT_DECLINED")
    assert never.ignored is not None and "not pending" in never.ignored
    with pytest.raises(ConfigError, match="unknown checkpoint failure reason 'DECLINED'"):
        t.checkpoint_failed("job", 3, "x", failure_reason="DECLINED")
    assert t.checkpoint_trigger_failed("job", "CHECKPOINT_EXPIRED").ignored is None
    t.checkpoint_triggered("job", 3)
    t.checkpoint_failed("job", 3, "io", failure_reason="IO_EXCEPTION")
    assert reg.job("job").over_budget  # 2 > 1: one trigger-phase failure and checkpoint 3
    t.checkpoint_triggered("job", 4)
    restart = t.job_restarted("job", "over budget")
    assert restart.ignored is None
    view = reg.job("job")
    assert not view.over_budget and view.checkpoints.pending == ()
    assert 4 in view.checkpoints.discarded
    assert [c.checkpoint_id for c in view.latest_checkpoints] == [1]
    assert connect("ns12").sync().jobs["job"] == view  # a fresh client folds the same


def test_flink_2_3_0_reasons_through_the_client(connect) -> None:
    """Issue 29 through the client: Flink 2.3.0's table. FINALIZE_CHECKPOINT_FAILURE counts
    (it answered "does not count"); CHANNEL_STATE_SHARED_STREAM_EXCEPTION and
    BLOCKING_OUTPUT_EXIST are taken and do not count (they were refused as unknown, while
    the fold counted them); a name jobreg does not know is refused before anything is
    written, and each record carries the writer's decision, which a fresh reader follows."""
    reg = connect("ns29")
    t = reg.claim_leadership("jm-1")
    t.submit("job", b"g", max_checkpoint_failures=1)
    t.checkpoint_triggered("job", 1)
    assert t.checkpoint_failed("job", 1, "finalize",
                               failure_reason="FINALIZE_CHECKPOINT_FAILURE").ignored is None
    for name in ("CHANNEL_STATE_SHARED_STREAM_EXCEPTION", "BLOCKING_OUTPUT_EXIST"):
        receipt = t.checkpoint_trigger_failed("job", name)
        assert receipt.ignored == f"a trigger failure for {name} does not count"
    end = reg.sync().provenance.last_offset
    with pytest.raises(ConfigError, match="unknown checkpoint failure reason 'SOME_NEW_REASON'"):
        t.checkpoint_trigger_failed("job", "SOME_NEW_REASON")
    assert reg.sync().provenance.last_offset == end
    assert not reg.job("job").over_budget
    assert t.checkpoint_trigger_failed("job", "FINALIZE_CHECKPOINT_FAILURE").ignored is None
    assert reg.job("job").over_budget  # 2 > 1
    fresh = connect("ns29").sync().jobs["job"]
    assert fresh == reg.job("job") and fresh.checkpoints.consecutive_failures == 2


# -- GC never deletes a blob a live job references (property, no broker) ---------------

gc_op = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 5), st.integers(0, 3)),  # job, content
    st.tuples(st.just("cancel"), st.integers(0, 5)),
    st.tuples(st.just("finish"), st.integers(0, 5)),
    st.tuples(st.just("gc"), st.sampled_from([0, 10, 3600])),
    st.tuples(st.just("age"), st.integers(0, 7200)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(gc_op, max_size=30))
def test_gc_never_deletes_a_blob_a_live_job_references(tmp_path_factory, ops) -> None:
    """Random histories of large submits (shared contents too), ends and collections."""
    from registry.blobs import collect

    store = FileBlobStore(tmp_path_factory.mktemp("blobs"))
    records: list[LogRecord] = []

    def write(event) -> None:
        records.append(LogRecord(len(records), record_key(event).encode(), encode(event)))

    env = dict(namespace="gc", epoch=1, writer="jm", created_at=0)
    from registry.events import LeadershipGranted

    write(LeadershipGranted(event_id=new_event_id(), prev_epoch=0, **env))
    clock = time.time()
    for op in ops:
        image = fold(records, "gc")
        if op[0] == "submit":
            ref = store.put(bytes([op[2]]) * 500)  # the blob first, then the event
            os.utime(ref.uri.removeprefix("file://"), (clock, clock))
            write(JobSubmitted(event_id=new_event_id(), job_id=f"j{op[1]}", graph=ref, **env))
        elif op[0] in ("cancel", "finish") and f"j{op[1]}" in image.jobs:
            cls = JobCancelled if op[0] == "cancel" else JobTerminated
            extra = {} if op[0] == "cancel" else {"state": "FINISHED"}
            write(cls(event_id=new_event_id(), job_id=f"j{op[1]}", **extra, **env))
        elif op[0] == "gc":
            live = {v.graph.uri for v in image.jobs.values()
                    if v.live and isinstance(v.graph, GraphRef)}
            collect(store, live, grace_s=op[1], now=clock)
        elif op[0] == "age":
            clock += op[1]
        for view in fold(records, "gc").jobs.values():
            if view.live and isinstance(view.graph, GraphRef):
                assert store.get(view.graph)  # present and intact
    assert all(isinstance(v.graph, (GraphRef, type(None), InlineGraph))
               for v in fold(records, "gc").jobs.values())
