"""The verdict a writer waits for is the fold's decision on the first copy of its record, never
on a later copy (fault campaign on Kafka, seed 8024): a call of several records was written,
its write failed with part of it still in flight, and the re-sent copies interleaved with the
first ones in the log, so a copy of a member landed while the first copy still waited for the
call's commit (PENDING). The copy's DUPLICATE was taken as the record's verdict and the call
raised ``WriteRejected (duplicate)``, though the commit then applied the first copies: every
reader had the jobs adopted."""

from __future__ import annotations

from registry.events import (
    InlineGraph,
    JobAdopted,
    JobSubmitted,
    LeadershipGranted,
    as_call,
    new_event_id,
)
from registry.folded import FoldedLog
from registry.image import LogRecord, Outcome
from registry.keys import record_key
from registry.wire import default_codec

NS = "ns"


class _NoReader:
    """FoldedLog folds what it is given; it asks its reader only for metrics (none here)."""

    def lag(self) -> int:
        return 0


def _records(events) -> list[LogRecord]:
    codec = default_codec()
    return [LogRecord(offset, record_key(e).encode(), codec.encode(e), None, 0)
            for offset, e in enumerate(events)]


def test_a_copy_landing_while_the_first_waits_for_its_commit_is_not_the_verdict() -> None:
    grant = LeadershipGranted(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm",
                              created_at=0, prev_epoch=0)
    jobs = [JobSubmitted(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm",
                         created_at=0, job_id=j, graph=InlineGraph(b"g")) for j in "ab"]
    a, b, commit = as_call([JobAdopted(event_id=new_event_id(), namespace=NS, epoch=1,
                                       writer="jm", created_at=0, job_id=j) for j in "ab"])
    # The first copy of a, a re-sent copy of a, then the rest of the first copies and the
    # commit, then the re-sent rest: what seed 8024's log held.
    log = _records([grant, *jobs, a, a, b, commit, b, commit])
    folded = FoldedLog(_NoReader(), NS, default_codec())  # type: ignore[arg-type]
    for e in (a, b, commit):
        folded.waiting[e.event_id] = None
    folded.fold([log])
    verdicts = {e.event_id: folded.waiting[e.event_id] for e in (a, b, commit)}
    assert all(d is not None and d.outcome == Outcome.ACCEPTED for d in verdicts.values()), \
        verdicts
    assert folded.image.jobs["a"].owner_epoch == folded.image.jobs["b"].owner_epoch == 1
