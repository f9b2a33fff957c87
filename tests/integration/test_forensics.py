"""Forensics on incident 000's timeline: state at any point, timelines, terms, offline dumps."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.incidents import Records, incident_000

from registry import ConfigError, EmbeddedBroker, JobStatus, Registry, WriteRejected
from registry.codec import encode
from registry.events import InlineGraph, JobSubmitted, new_event_id
from registry.forensics import Forensics
from registry.keys import record_key
from registry.log import write_raw

pytestmark = pytest.mark.integration




def _answers(f, marks: dict) -> dict:
    """The questions an operator asks, answered by a Registry or an open dump alike."""
    return {
        "before": f.state_at(offset=marks["submitted"] - 1).jobs.get("job-a"),
        "submitted": f.state_at(offset=marks["submitted"]).jobs["job-a"],
        "during": (f.state_at(offset=marks["grant2"]).epoch,
                   f.state_at(offset=marks["grant2"]).jobs["job-a"].owner_epoch),
        "adopted": f.state_at(offset=marks["adopted"]).jobs["job-a"].owner_epoch,
        "after": f.state_at(offset=marks["cancelled"]).jobs["job-a"].status,
        "timeline": [(d.offset, d.event_type, d.outcome, d.reason) for d in f.timeline("job-a")],
        "explain": f.explain("job-a"),
        "terms": f.terms(),
    }


def test_state_timeline_explain_and_terms_of_incident_000(connect) -> None:
    marks = incident_000(lambda: connect("forensics"))
    reg = marks["reg"]
    a = _answers(reg, marks)
    assert a["before"] is None
    assert a["submitted"].status == JobStatus.ACTIVE and a["submitted"].owner_epoch == 1
    assert a["during"] == (2, 1)  # the new term exists; the job is not yet adopted
    assert a["adopted"] == 2
    assert a["after"] == JobStatus.CANCELLED
    kinds = [(t, o) for _, t, o, _ in a["timeline"]]
    assert kinds[:2] == [("JobSubmitted", "ACCEPTED"), ("JobAdopted", "ACCEPTED")]
    assert ("JobLockReleased", "REJECTED") in kinds and ("JobCancelled", "ACCEPTED") in kinds
    refused = [t for t in a["timeline"] if t[2] == "REJECTED"]
    assert refused == [(marks["late"], "JobLockReleased", "REJECTED", "stale_epoch")]
    assert "CANCELLED (reason: user cancel)" in a["explain"] and f"Refused at offset {marks['late']}" in a["explain"]
    assert "stale_epoch" in a["explain"] and "jm-1" in a["explain"]
    terms = a["terms"]
    assert [(t.epoch, t.leader) for t in terms] == [(1, "jm-1"), (2, "jm-2"), (3, "jm-3")]
    assert terms[0].ended.startswith("superseded by epoch 2") and terms[2].ended == "current"
    assert terms[0].rejected == 1 and terms[1].accepted >= 2
    # by time: everything up to the cancel's stamp includes the cancel
    stamp = next(d.timestamp for d in reg.timeline("job-a") if d.offset == marks["cancelled"])
    assert reg.state_at(time=stamp).jobs["job-a"].status == JobStatus.CANCELLED
    assert reg.state_at(time=0).epoch == 0
    with pytest.raises(ConfigError, match="exactly one"):
        reg.state_at(offset=1, time=1)


@pytest.mark.embedded_only("stops an EmbeddedBroker of its own, then reads the dump with no broker")
def test_the_same_answers_from_a_dump_with_no_broker(topic, tmp_path) -> None:
    path = tmp_path / "incident-000.jobreg.avro"
    made: list[Registry] = []

    def factory() -> Registry:
        made.append(Registry.connect(broker.bootstrap, "dumped", topic=topic))
        return made[-1]

    with EmbeddedBroker() as broker:
        marks = incident_000(factory)
        live = _answers(marks["reg"], marks)
        written = marks["reg"].dump(path)
        live_image = marks["reg"].sync()
        for r in made:
            r.close()
    # the broker is gone: the dump answers alone
    offline = Registry.open_dump(path)
    assert written == len(offline.decisions()) > 0
    assert _answers(offline, marks) == live
    assert offline.replay() == live_image
    assert offline.namespace == "dumped"
    assert [d.reason for d in offline.rejected()] == ["stale_epoch"]
    assert offline.quarantined() == []


def test_a_file_that_is_not_a_dump_is_a_clear_error(tmp_path) -> None:
    bad = tmp_path / "x.avro"
    for content in (b"not avro", b"", b"Obj\x01" + bytes(40)):  # not even a header; empty
        bad.write_bytes(content)
        with pytest.raises(ConfigError) as e:
            Registry.open_dump(bad)
        assert str(e.value) == f"{bad}: not a jobreg dump (not an Avro object container file)"
    with pytest.raises(ConfigError, match="cannot read it"):
        Registry.open_dump(tmp_path)  # a directory




@pytest.mark.parametrize("where", ["missing/x.avro", "/proc/version"])
def test_a_dump_or_report_that_cannot_be_written_is_one_clear_error(tmp_path, where) -> None:
    """Issue 15 item 1: the error names the path asked for, not a temporary file."""
    from registry.files import atomic_write
    from registry.report import write_report

    target = tmp_path / where if not where.startswith("/") else Path(where)
    f = Forensics(Records([]), "dumped")
    # force: /proc/version exists and is no jobreg output, which is refused before any
    # write without it (test_damaged_input.py); with it, the write itself fails
    for what, write in (("dump", lambda: f.dump(target, force=True)),
                        ("report", lambda: write_report(f, target, force=True)),
                        ("snapshot", lambda: atomic_write(target, "snapshot").__enter__())):
        with pytest.raises(ConfigError) as e:
            write()
        assert str(e.value).startswith(f"cannot write {what} {str(target)!r}: "), e.value
        assert ".tmp" not in str(e.value)


def _incident_001(reg_factory) -> dict:
    """001: a job finished a month ago; a needless failover; the new leader (and a zombie of
    the old one) try to bring it back from its left-behind graph."""
    jm1 = reg_factory()
    t1 = jm1.claim_leadership("jm-1")
    t1.submit_many([("job-old", b"old"), ("job-run", b"run")])
    finished = t1.terminate("job-old", "FINISHED")
    jm2 = reg_factory()
    t2 = jm2.claim_leadership("jm-2")
    grant2 = jm2.sync().term.granted_offset
    adopted = t2.adopt("job-run")[0]
    with pytest.raises(WriteRejected):
        t2.submit("job-old", b"old")  # the left-behind graph, resubmitted
    stale = JobSubmitted(event_id=new_event_id(), namespace=jm1.namespace, epoch=1,
                         writer="jm-1", created_at=0, job_id="job-old", graph=InlineGraph(b"old"))
    zombie = write_raw(jm1.bootstrap, jm1.topic, jm1.partition, record_key(stale), encode(stale))
    t2.reassert()
    return dict(finished=finished.offset, grant2=grant2, adopted=adopted.offset, zombie=zombie,
                reg=jm2)


def test_incident_001_the_finished_job_that_flink_brought_back(connect) -> None:
    marks = _incident_001(lambda: connect("forensics-001"))
    reg = marks["reg"]
    assert reg.state_at(offset=marks["finished"] - 1).jobs["job-old"].status == JobStatus.ACTIVE
    at_finish = reg.state_at(offset=marks["finished"])
    assert at_finish.jobs["job-old"].status == JobStatus.FINISHED and at_finish.epoch == 1
    during = reg.state_at(offset=marks["grant2"])
    assert (during.epoch, during.leader) == (2, "jm-2")
    assert during.jobs["job-run"].owner_epoch == 1  # granted, not yet adopted
    after = reg.state_at(offset=marks["zombie"])
    assert after.jobs["job-old"].status == JobStatus.FINISHED
    assert after.jobs["job-run"].owner_epoch == 2
    assert reg.state_at(offset=marks["adopted"]).live_jobs().keys() == {"job-run"}
    stamp = next(d.timestamp for d in reg.timeline("job-old") if d.offset == marks["finished"])
    assert reg.state_at(time=stamp).jobs["job-old"].status == JobStatus.FINISHED

    steps = [(d.event_type, d.outcome, d.reason, d.writer) for d in reg.timeline("job-old")]
    assert steps[:2] == [("JobSubmitted", "ACCEPTED", None, "jm-1"),
                         ("JobTerminated", "ACCEPTED", None, "jm-1")]
    refused = [(t, r, w) for t, o, r, w in steps if o == "REJECTED"]
    assert ("JobSubmitted", "terminal_job", "jm-2") in refused
    assert refused[-1][2] == "jm-1" and refused[-1][1] in ("stale_epoch", "terminal_job")
    # (the zombie's resubmission lies under its own birth key and supersedes nothing: the
    # leader has nothing to restate after it)
    assert steps[-1][:2] == ("JobSubmitted", "REJECTED")
    text = reg.explain("job-old")
    assert text.startswith("job 'job-old' is FINISHED")
    assert "terminal_job" in text and "jm-2" in text and f"offset {marks['zombie']}" in text
    terms = reg.terms()
    assert [(t.epoch, t.leader, t.ended.split(" at")[0]) for t in terms] == [
        (1, "jm-1", "superseded by epoch 2"), (2, "jm-2", "current")]
    assert terms[0].rejected == 1 and terms[1].rejected == 1
