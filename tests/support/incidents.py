"""Incident set-ups that several tests replay (from the reports in ``../shared/seeds/``)."""

from __future__ import annotations

from registry.codec import default_codec, encode
from registry.events import JobLockReleased, new_event_id
from registry.image import LogRecord
from registry.keys import lock_key
from registry.log import write_raw


def incident_000(reg_factory) -> dict:
    jm1 = reg_factory()
    t1 = jm1.claim_leadership("jm-1")
    submitted = t1.submit("job-a", b"graph-a")
    t1.submit("job-b", b"graph-b")
    jm2 = reg_factory()
    t2 = jm2.claim_leadership("jm-2")
    grant2 = jm2.sync().term.granted_offset
    adopted = t2.adopt("job-a")[0]
    late = write_raw(jm1.bootstrap, jm1.topic, jm1.partition, lock_key(jm1.namespace, "job-a"),
                     encode(JobLockReleased(event_id=new_event_id(), namespace=jm1.namespace,
                                            epoch=1, writer="jm-1", created_at=0,
                                            job_id="job-a")))
    cancelled = t2.cancel("job-a", "user cancel")
    reg_factory().claim_leadership("jm-3")  # the restart
    return dict(submitted=submitted.offset, grant2=grant2, adopted=adopted.offset, late=late,
                cancelled=cancelled.offset, reg=jm2)


class Records:
    """A log source of records in memory (no broker)."""

    def __init__(self, records: list[LogRecord]) -> None:
        self.records = records

    def batches(self):
        yield self.records

    def codec(self):
        return default_codec()

    def fraction_read(self) -> float:
        return 1.0


def incident_002(connect) -> None:
    """002: the old leader removes a job after the new leader resubmitted it."""
    old = connect("ns-002")
    t1 = old.claim_leadership("jm-old")
    t1.submit("job-x", b"x")
    t2 = connect("ns-002").claim_leadership("jm-new")
    t2.adopt("job-x")
    write_raw(old.bootstrap, old.topic, old.partition, lock_key("ns-002", "job-x"),
              encode(JobLockReleased(event_id=new_event_id(), namespace="ns-002", epoch=1,
                                     writer="jm-old", created_at=0, job_id="job-x")))
    t2.reassert()
