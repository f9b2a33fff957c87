"""Calls of several records are all or nothing in the fold (fold rule 8).

Pure tests build logs by hand; the client tests run on the embedded broker.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.histories import SETTINGS, build, op
from support.model import NS, Sim, visible

from registry import WriteRejected
from registry.codec import encode
from registry.events import (
    EVENT_TYPES,
    CallCommitted,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobEvent,
    JobReasserted,
    JobStatus,
    JobSubmitted,
    LeadershipGranted,
    as_call,
    new_event_id,
)
from registry.fold import Delta, fold, fold_batches, plan_reassertions
from registry.image import Image, LogRecord, Outcome
from registry.keys import record_key
from registry.rules import _EFFECTS, _RULES


class Log:
    """A hand-built log of one namespace."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []

    def add(self, *events) -> list[int]:
        offsets = []
        for e in events:
            off = len(self.records) * 2
            self.records.append(LogRecord(off, record_key(e).encode(), encode(e), off))
            offsets.append(off)
        return offsets

    def fold(self) -> tuple[Image, dict[int, object]]:
        final: dict[int, object] = {}
        image = fold_batches([self.records], Image.empty(NS), None,
                             lambda d: final.__setitem__(d.offset, d))
        return image, final


def env(epoch: int = 1, writer: str = "jm-1") -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=epoch, writer=writer, created_at=0)


def grant(epoch: int, writer: str) -> LeadershipGranted:
    return LeadershipGranted(**env(epoch, writer), prev_epoch=epoch - 1)


def submit(job: str, epoch: int = 1, writer: str = "jm-1") -> JobSubmitted:
    return JobSubmitted(**env(epoch, writer), job_id=job, graph=InlineGraph(job.encode()))


def adopt(job: str, epoch: int = 1, writer: str = "jm-1") -> JobAdopted:
    return JobAdopted(**env(epoch, writer), job_id=job)


def test_every_event_type_has_exactly_one_rule() -> None:
    from registry.codec import default_codec

    catalog_types = {EVENT_TYPES[name] for name in default_codec().catalog.types()}
    assert set(_RULES) == set(EVENT_TYPES.values()) == catalog_types
    job_types = {t for t in EVENT_TYPES.values() if issubclass(t, JobEvent)}
    assert set(_EFFECTS) == job_types


def test_an_event_type_without_a_rule_is_quarantined(monkeypatch) -> None:
    log = Log()
    log.add(grant(1, "jm-1"))
    (off,) = log.add(JobCancelled(**env(), job_id="a"))
    monkeypatch.delitem(_RULES, JobCancelled)
    image, final = log.fold()
    assert final[off].outcome == Outcome.QUARANTINED and final[off].reason == "no_rule"
    assert "a" not in image.jobs


def test_a_whole_call_is_applied_at_its_commit() -> None:
    log = Log()
    log.add(grant(1, "jm-1"))
    records = as_call([submit("a"), submit("b")])
    offs = log.add(*records)
    delta = Delta(Image.empty(NS))
    for r in log.records[:-1]:
        d = delta.replay(r)
    assert d.outcome == Outcome.PENDING and delta.job("a") is None  # nothing before the commit
    image, final = log.fold()
    assert [final[o].outcome for o in offs] == [Outcome.ACCEPTED] * 3
    assert set(image.jobs) == {"a", "b"} and not image.calls


def test_one_refused_record_sinks_the_whole_call_and_is_named() -> None:
    log = Log()
    log.add(grant(1, "jm-1"), submit("known"))
    offs = log.add(*as_call([submit("a"), submit("known"), submit("c")]))
    image, final = log.fold()
    assert set(image.jobs) == {"known"}
    assert [final[o].reason for o in offs] == ["call_aborted", "job_exists", "call_aborted",
                                               "call_aborted"]
    assert f"offset {offs[1]}" in final[offs[0]].detail and "job_exists" in final[offs[0]].detail
    # the unknown ids a refused call named are unsettled: the leader reasserts them ABSENT
    absent = {e.job_id: e.status for _, e in plan_reassertions(image, 1, "jm-1")
              if isinstance(e, JobReasserted)}
    # (the refused submit of "known" lies under its own birth key, which supersedes no birth
    # and stays refused in every compacted log: nothing of "known" is restated)
    assert absent == {"a": JobStatus.ABSENT, "c": JobStatus.ABSENT}


def test_adopting_a_terminal_job_sinks_the_call() -> None:
    log = Log()
    log.add(grant(1, "jm-1"), submit("x"), submit("y"), submit("z"),
            JobCancelled(**env(), job_id="z"), grant(2, "jm-2"))
    offs = log.add(*as_call([adopt("x", 2, "jm-2"), adopt("y", 2, "jm-2"),
                             adopt("z", 2, "jm-2")]))
    image, final = log.fold()
    assert image.jobs["x"].owner_epoch == 1 and image.jobs["y"].owner_epoch == 1
    assert final[offs[2]].reason == "terminal_job"
    assert final[offs[3]].outcome == Outcome.REJECTED


def test_a_grant_between_the_records_and_the_commit_refuses_the_call() -> None:
    log = Log()
    log.add(grant(1, "jm-1"))
    a, b, commit = as_call([submit("a"), submit("b")])
    offs = log.add(a)
    log.add(grant(2, "jm-2"))
    offs += log.add(b, commit)
    image, final = log.fold()
    assert "a" not in image.jobs and "b" not in image.jobs
    assert final[offs[0]].reason == "call_not_committed"
    assert final[offs[1]].reason == "stale_epoch" and final[offs[2]].reason == "stale_epoch"


def test_a_call_without_its_commit_never_applies() -> None:
    log = Log()
    log.add(grant(1, "jm-1"))
    records = as_call([submit("a"), submit("b")])
    log.add(*records[:-1])
    image, final = log.fold()
    assert not image.jobs and len(image.calls) == 1  # waits; a later grant ends it
    log.add(grant(2, "jm-2"))
    image, final = log.fold()
    assert not image.calls and final[0 + 2].reason == "call_not_committed"


def test_a_commit_missing_compacted_records_decides_the_rest_alone() -> None:
    log = Log()
    log.add(grant(1, "jm-1"))
    a, b, commit = as_call([submit("a"), submit("b")])
    log.add(b, commit)  # a's record was superseded on its key and cleaned
    image, final = log.fold()
    assert set(image.jobs) == {"b"}
    assert "1 of the call's 2 records" in final[4].detail


def test_an_absent_reassertion_forgets_a_live_job_but_never_a_terminal_one() -> None:
    log = Log()
    log.add(grant(1, "jm-1"), submit("a"), submit("b"), JobCancelled(**env(), job_id="b"))
    absent = [JobReasserted(**env(), job_id=j, status=JobStatus.ABSENT, owner_epoch=None,
                            graph=None) for j in ("a", "b", "never")]
    offs = log.add(*absent)
    image, final = log.fold()
    assert "a" not in image.jobs and image.jobs["b"].status == "CANCELLED"
    assert [final[o].outcome for o in offs] == [Outcome.ACCEPTED, Outcome.REJECTED,
                                                Outcome.ACCEPTED]


calls_heavy = st.lists(
    st.one_of(op, st.tuples(st.just("write"), st.just("leader"),
                            st.sampled_from(["submit_many", "adopt_many", "cancel"]),
                            st.sampled_from(["a", "b", "c", "d"]), st.just(False),
                            st.integers(1, 6))),
    min_size=5, max_size=60).map(build)


@SETTINGS
@given(calls_heavy)
def test_a_call_is_all_or_none(sim: Sim) -> None:
    members: dict[str, list] = {}
    commits: dict[str, object] = {}
    final: dict[int, object] = {}

    def note(d) -> None:
        final[d.offset] = d

    records = visible(sim.log)
    fold_batches([records], Image.empty(NS), None, note)
    delta = Delta(Image.empty(NS))
    for r in records:
        delta.replay(r)
        e = delta.last_event
        if getattr(e, "call_id", None):
            members.setdefault(e.call_id, []).append(r.offset)
        if isinstance(e, CallCommitted):
            commits[e.event_id] = final[r.offset]
    for call_id, offsets in members.items():
        outcomes = {final[o].accepted for o in offsets
                    if final[o].outcome != Outcome.DUPLICATE and final[o].reason != "unknown_job"}
        assert len(outcomes) <= 1, f"call {call_id} half-applied"
        if call_id in commits and outcomes == {True}:
            assert commits[call_id].accepted


# -- through the client, on the embedded broker --------------------------------------


def test_submit_many_with_a_known_id_submits_nothing(connect) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit("known", b"k")
    with pytest.raises(WriteRejected) as caught:
        term.submit_many([("a", b"a"), ("b", b"b"), ("known", b"x"), ("c", b"c")])
    assert caught.value.reason == "job_exists"
    assert len(caught.value.event_ids) == 4
    assert set(reg.jobs()) == {"known"}
    timeline = reg.timeline("a")
    assert [d.reason for d in timeline if d.event_type == "JobSubmitted"] == ["call_aborted"]
    assert "job_exists" in timeline[0].detail
    # the refused call's unknown ids were settled ABSENT by the client's follow-up
    assert not reg.sync().unsettled
    receipts = term.submit_many([("a", b"a"), ("b", b"b")])  # the ids are free
    assert [r.offset for r in receipts] == sorted(r.offset for r in receipts)
    assert set(reg.jobs()) == {"known", "a", "b"}


def test_adopt_with_a_terminal_id_adopts_nothing(connect) -> None:
    reg = connect()
    t1 = reg.claim_leadership("jm-1")
    t1.submit_many([("x", b"x"), ("y", b"y"), ("z", b"z")])
    t1.cancel("z")
    t2 = connect().claim_leadership("jm-2")
    with pytest.raises(WriteRejected) as caught:
        t2.adopt("x", "y", "z")
    assert caught.value.reason == "terminal_job"
    assert {j: v.owner_epoch for j, v in reg.jobs().items()} == {"x": 1, "y": 1}
    assert [r.offset for r in t2.adopt("x", "y")]
    assert {j: v.owner_epoch for j, v in reg.jobs().items()} == {"x": 2, "y": 2}


def test_a_fresh_client_and_a_dump_agree_about_calls(connect, tmp_path) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit("known", b"k")
    with pytest.raises(WriteRejected):
        term.submit_many([("a", b"a"), ("known", b"x")])
    term.submit_many([("b", b"b"), ("c", b"c")])
    live = reg.sync().answer()
    assert connect().sync().answer() == live
    reg.dump(tmp_path / "d.avro")
    assert reg.open_dump(tmp_path / "d.avro").replay().answer() == live
    assert fold([], reg.sync()).answer() == live
