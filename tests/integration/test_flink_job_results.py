"""Flink's job result store (FLIP-194), translated case by case (fold rule 5).

Each contract test names the test of Flink's ``JobResultStoreContractTest``
(flink-runtime, ``org.apache.flink.runtime.highavailability``) it mirrors. How Flink's
calls map to jobreg's:

* ``createDirtyResult(entry)`` -> the job reaching a terminal state: ``Term.cancel`` or
  ``Term.terminate`` (the fold makes the result, dirty, holding the graph and checkpoint
  state the job ended with); a second one for the same id is refused (``terminal_job``:
  Flink's ``IllegalStateException``), also once the result is clean;
* ``markResultAsClean(id)`` -> ``Term.mark_clean(id)``; an unknown id raises
  :class:`~registry.UnknownJob` (Flink's ``NoSuchElementException``); marking a clean
  result again changes nothing and raises nothing;
* ``hasDirtyJobResultEntry`` / ``hasCleanJobResultEntry`` / ``hasJobResultEntry`` ->
  ``id in Registry.results(dirty=True)`` / ``(dirty=False)`` / ``()``;
* ``getDirtyResults()`` -> ``Registry.results(dirty=True)``.

Then what Flink's dispatcher does with the store on failover (a new leader cleans up every
dirty result, retrying what fails), compaction, and logs written before results.
"""

from __future__ import annotations

import pytest
from support.model import NS, compact, encode_with, visible

from registry import ConfigError, Fenced, GraphRef, JobView, UnknownJob, WriteRejected
from registry.codec import default_codec, encode
from registry.events import (
    EMPTY_CHECKPOINTS,
    CheckpointState,
    CompletedCheckpoint,
    InlineGraph,
    JobCancelled,
    JobCleanedUp,
    JobReasserted,
    JobSubmitted,
    JobTerminated,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold, plan_reassertions
from registry.image import LogRecord, Outcome
from registry.keys import job_key, record_key

# -- JobResultStoreContractTest -----------------------------------------------------------


@pytest.fixture
def term(connect):
    """A leader with two live jobs, "job" and "other" (Flink's DUMMY_JOB_RESULT_ENTRY's job
    and a second one), on a fresh namespace."""
    t = connect("results").claim_leadership("jm-1")
    t.submit("job", b"graph of job")
    t.submit("other", b"graph of other")
    return t


def test_store_job_results_with_duplicate_ids_throws_exception(term) -> None:
    """testStoreJobResultsWithDuplicateIDsThrowsException"""
    term.cancel("job")
    with pytest.raises(WriteRejected) as e:
        term.terminate("job", "FINISHED")  # a second result for the same id
    assert e.value.reason == "terminal_job"
    assert term.registry.job("job").status == "CANCELLED"


def test_store_dirty_entry_for_already_cleaned_job_result_throws_exception(term) -> None:
    """testStoreDirtyEntryForAlreadyCleanedJobResultThrowsException"""
    term.cancel("job")
    term.mark_clean("job")
    with pytest.raises(WriteRejected) as e:
        term.cancel("job")
    assert e.value.reason == "terminal_job"
    assert not term.registry.job("job").dirty


def test_cleaning_duplicate_entry_throws_no_exception(term) -> None:
    """testCleaningDuplicateEntryThrowsNoException"""
    term.terminate("job", "FINISHED", "done")
    first = term.mark_clean("job")
    second = term.mark_clean("job")  # no exception, no change
    assert second.offset > first.offset and second.ignored is None
    view = term.registry.job("job")
    assert (view.status, view.reason, view.dirty) == ("FINISHED", "done", False)


def test_cleaning_non_existent_entry_throws_exception(term) -> None:
    """testCleaningNonExistentEntryThrowsException; and (jobreg's own) a live job has no
    result to clean."""
    with pytest.raises(UnknownJob):
        term.mark_clean("never-submitted")
    with pytest.raises(ConfigError, match="live|ACTIVE"):
        term.mark_clean("job")
    assert term.registry.results() == {}


def test_has_job_result_entry_with_dirty_entry(term) -> None:
    """testHasJobResultEntryWithDirtyEntry"""
    term.cancel("job")
    reg = term.registry
    assert "job" in reg.results(dirty=True)
    assert "job" not in reg.results(dirty=False)
    assert "job" in reg.results()


def test_has_job_result_entry_with_clean_entry(term) -> None:
    """testHasJobResultEntryWithCleanEntry"""
    term.cancel("job")
    term.mark_clean("job")
    reg = term.registry
    assert "job" not in reg.results(dirty=True)
    assert "job" in reg.results(dirty=False)
    assert "job" in reg.results()


def test_has_job_result_entry_with_empty_store(term) -> None:
    """testHasJobResultEntryWithEmptyStore: live jobs have no result."""
    reg = term.registry
    assert reg.results(dirty=True) == reg.results(dirty=False) == reg.results() == {}


def test_get_dirty_results_with_no_entry(term) -> None:
    """testGetDirtyResultsWithNoEntry"""
    assert term.registry.results(dirty=True) == {}


def test_get_dirty_results_with_dirty_entry(term) -> None:
    """testGetDirtyResultsWithDirtyEntry"""
    term.cancel("job")
    assert list(term.registry.results(dirty=True)) == ["job"]


def test_get_dirty_results_with_dirty_and_clean_entry(term) -> None:
    """testGetDirtyResultsWithDirtyAndCleanEntry"""
    term.cancel("job")
    term.mark_clean("job")
    term.terminate("other", "FINISHED")
    assert list(term.registry.results(dirty=True)) == ["other"]


# -- failover: the new leader cleans up what the old one left -------------------------------


def test_a_new_leader_is_handed_every_dirty_result_and_retries_what_failed(connect) -> None:
    """Flink's dispatcher, on gaining leadership, runs cleanup for every dirty result in the
    store and retries a cleanup that fails. Here jm-1 ends two jobs and dies before cleaning
    up; jm-2's recovery hands both to its cleanup hook with what they left (graph,
    retained checkpoint locations, reason); one cleanup fails and stays dirty until a later
    cleanup; the old leader can no longer mark anything clean."""
    reg = connect("failover", inline_limit=16)
    t1 = reg.claim_leadership("jm-1")
    t1.submit("a", b"A" * 100, retained_checkpoints=2)
    t1.submit("b", b"b")
    t1.submit("c", b"c")
    for cp in (1, 2, 3):
        t1.checkpoint_triggered("a", cp)
        t1.checkpoint_completed("a", cp, f"s3://cp/a/{cp}")
    graph_a = reg.job("a").graph
    assert isinstance(graph_a, GraphRef)
    t1.cancel("a", "user asked")
    t1.terminate("b", "FAILED", "out of memory")

    t2 = connect("failover", inline_limit=16).claim_leadership("jm-2")
    handed: list[JobView] = []

    def cleanup(view: JobView) -> None:
        handed.append(view)
        if view.job_id == "b":
            raise OSError("checkpoint storage unreachable")

    results = t2.recover(on_cleanup=cleanup)
    assert [(r.job_id, r.status, r.ok) for r in results] == [
        ("c", "ADOPTED", True), ("a", "CLEANED", True), ("b", "CLEANUP_FAILED", False)]
    assert "OSError: checkpoint storage unreachable" in results[2].error
    a = next(v for v in handed if v.job_id == "a")
    assert (a.status, a.reason, a.graph) == ("CANCELLED", "user asked", graph_a)
    assert [c.location for c in a.checkpoints.retained] == ["s3://cp/a/2", "s3://cp/a/3"]
    b = next(v for v in handed if v.job_id == "b")
    assert (b.status, b.reason, b.graph) == ("FAILED", "out of memory", InlineGraph(b"b"))
    assert list(t2.registry.results(dirty=True)) == ["b"]
    # The old leader is fenced: it cannot mark b clean behind jm-2's back.
    with pytest.raises(Fenced):
        t1.mark_clean("b")
    with pytest.raises(Fenced) as fenced:
        t1.cleanup(lambda view: None)
    assert fenced.value.cleaned == ()  # nothing was marked clean before the refusal
    # A later cleanup (the retry) succeeds.
    assert [(c.job_id, c.cleaned) for c in t2.cleanup(lambda view: None)] == [("b", True)]
    assert t2.registry.results(dirty=True) == {}
    fresh = connect("failover").image
    assert {j: (v.status, v.dirty, v.graph) for j, v in fresh.results().items()} == {
        "a": ("CANCELLED", False, None), "b": ("FAILED", False, None)}


# -- the log: compaction and the copy a cancel carries (pure) -------------------------------

GRAPH = InlineGraph(b"the graph")
CPS = CheckpointState(seq=2, last_completed=7,
                      retained=(CompletedCheckpoint(7, "s3://cp/7"),))


def _env(**kw) -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm", created_at=0) | kw


def _log(*events, encoder=encode, legacy: bool = False) -> list[LogRecord]:
    """The records of ``events``, each under its key; ``legacy``: submits and ends under the
    job's key, as a jobreg before births and ends had keys of their own wrote them."""
    def key(e) -> str:
        if legacy and isinstance(e, (JobCancelled, JobTerminated, JobSubmitted)):
            return job_key(NS, e.job_id)
        return record_key(e)
    return [LogRecord(i * 2, key(e).encode(), encoder(e), 1_000 + i)
            for i, e in enumerate(events)]


def test_a_result_survives_the_cleaner_removing_the_submit() -> None:
    """The cleaner keeps only a key's newest record: once a cancel follows the submit on the
    job's key, the submit (and its graph) are gone; the cancel's own copy is the result."""
    from support.model import Rec
    events = [LeadershipGranted(prev_epoch=0, **_env()),
              JobSubmitted(job_id="j", graph=GRAPH, **_env()),
              JobCancelled(job_id="j", reason="r", graph=GRAPH, checkpoints=EMPTY_CHECKPOINTS,
                           **_env())]
    # As a jobreg before ends had keys of their own wrote it: the cancel on the job's key, its
    # grant of the schema that jobreg wrote (a grant of this jobreg's schema says the log's
    # ends have keys of their own, and a cleanup of version 1 then no longer stands for one).
    grant_v2 = next(e.id for e in default_codec().catalog.entries()
                    if e.type == "LeadershipGranted" and e.version == 2)

    def older(e) -> bytes:
        return encode_with(e, grant_v2) if isinstance(e, LeadershipGranted) else encode(e)
    log = [Rec(r.offset, r.key, r.value, r.timestamp)
           for r in _log(*events, legacy=True, encoder=older)]
    compacted = compact(log, now=10**12)
    assert len(compacted) == 2  # the submit is gone
    full, after = fold(visible(log), NS), fold(visible(compacted), NS)
    assert after.answer() == full.answer()
    assert after.jobs["j"] == JobView("j", "CANCELLED", None, GRAPH, reason="r", dirty=True)
    assert f"{NS}/job/j/end/" in full.unsettled  # due to be restated under an end key
    # Then the clean record (as that jobreg wrote it) supersedes the cancel; alone it keeps
    # the job terminal.
    clean_v1 = next(e.id for e in default_codec().catalog.entries()
                    if e.type == "JobCleanedUp" and e.version == 1)
    log.append(Rec(10, log[-1].key, encode_with(JobCleanedUp(
        job_id="j", status="CANCELLED", reason="r", **_env()), clean_v1), 2_000))
    compacted = compact(log, now=10**12)
    assert len(compacted) == 2
    assert fold(visible(compacted), NS).answer() == fold(visible(log), NS).answer()
    assert fold(visible(compacted), NS).jobs["j"] == JobView("j", "CANCELLED", None, None,
                                                              reason="r")


def test_a_cancel_whose_copy_is_stale_is_accepted_and_its_result_restated() -> None:
    """A cancel that carries a copy of the job that is not the fold's (a raw write, or a copy
    taken before a concurrent checkpoint record) is accepted, with the fold's own copy; its
    key stays unsettled until the leader restates the whole result on it, so the cleaner
    never leaves the stale copy as the key's newest record."""
    log = _log(LeadershipGranted(prev_epoch=0, **_env()),
               JobSubmitted(job_id="j", graph=GRAPH, **_env()),
               JobCancelled(job_id="j", graph=None, checkpoints=EMPTY_CHECKPOINTS, **_env()),
               legacy=True)  # a cancel under the job's key, which carried a copy
    image = fold(log, NS)
    assert image.jobs["j"] == JobView("j", "CANCELLED", None, GRAPH, dirty=True)
    assert sorted(image.unsettled) == [f"{NS}/job/j", f"{NS}/job/j/end/"]
    (key, restated), (end, ended) = plan_reassertions(image, 1, "jm")
    assert key == f"{NS}/job/j" and isinstance(restated, JobReasserted)
    assert (restated.status, restated.graph, restated.dirty) == ("CANCELLED", GRAPH, True)
    assert end == f"{NS}/job/j/end/{ended.event_id}" and ended.status == "CANCELLED"
    log.append(LogRecord(100, key.encode(), encode(restated), 5_000))
    log.append(LogRecord(102, end.encode(), encode(ended), 5_001))
    settled = fold(log, NS)
    assert not settled.unsettled
    assert dict(settled.jobs) == {"j": image.jobs["j"]._replace(ended_by=ended.event_id)}
    # Compacted, only the restatement is left on the job key: the same answer.
    only = [r for r in log if r.key != key.encode()][:-1] + log[-2:]
    assert fold(only, NS).answer() == settled.answer()


def test_cleaning_up_a_live_job_is_refused_by_the_fold() -> None:
    log = _log(LeadershipGranted(prev_epoch=0, **_env()),
               JobSubmitted(job_id="j", graph=GRAPH, **_env()),
               JobCleanedUp(job_id="j", status="CANCELLED", **_env()),
               JobCleanedUp(job_id="k", status="ACTIVE", **_env()))
    image = fold(log, NS)
    assert [(d.job_id, d.reason) for d in image.rejected] == [("j", "job_live"),
                                                             ("k", "bad_state")]
    assert image.jobs["j"].live


def test_a_log_written_before_job_results_folds_to_the_same_answer() -> None:
    """Cancels and terminates of schema version 1 and terminal reassertions of version 4 were
    written before results: the jobs they ended are terminal with their reason and no graph,
    as they always were, and their results clean (nothing to clean up, and blob collection
    frees their graphs as it always did)."""
    codec = default_codec()

    def version(type_name: str, v: int) -> int:
        return next(e.id for e in codec.catalog.entries()
                    if e.type == type_name and e.version == v)

    old = {JobCancelled: version("JobCancelled", 1), JobTerminated: version("JobTerminated", 1),
           JobReasserted: version("JobReasserted", 4)}

    def encoder(e) -> bytes:
        return encode_with(e, old[type(e)]) if type(e) in old else encode(e)

    log = _log(LeadershipGranted(prev_epoch=0, **_env()),
               *[JobSubmitted(job_id=j, graph=GRAPH, **_env()) for j in "abc"],
               JobCancelled(job_id="a", reason="by hand", **_env()),
               JobTerminated(job_id="b", state="FINISHED", **_env()),
               JobReasserted(job_id="c", status="FAILED", owner_epoch=None, graph=None,
                             reason="boom", **_env()),
               encoder=encoder, legacy=True)
    image = fold(log, NS)
    assert all(d.outcome == Outcome.ACCEPTED for d in _decisions(log))
    assert dict(image.jobs) == {
        "a": JobView("a", "CANCELLED", None, None, reason="by hand"),
        "b": JobView("b", "FINISHED", None, None),
        "c": JobView("c", "FAILED", None, None, reason="boom")}
    assert image.results(dirty=True) == {} and image.referenced_blobs() == set()


def _decisions(log: list[LogRecord]):
    from registry.fold import Delta
    from registry.image import Image
    delta = Delta(Image.empty(NS))
    return [delta.replay(r) for r in log]
