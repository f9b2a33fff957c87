"""Issue 26, section 5: what record stamps a writer's clock can set do to the fold.

On Apache Kafka the topic's ``LogAppendTime`` makes every stamp the broker's; the embedded
broker keeps the producer's (CreateTime), so there a writer whose clock is far ahead, far
behind or jumps back sets the stamps the fold reads. The fold reads stamps in two places
only: fold rule 1's duplicate windows and the image's provenance (``log_time``). These tests
pin what each does under such stamps (README "What differs from Apache Kafka").
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from support.histories import SETTINGS, histories
from support.model import NS, Sim, visible

from registry.codec import encode
from registry.errors import CodecError
from registry.events import (
    InlineGraph,
    JobSubmitted,
    LeadershipGranted,
    LeaseRenewed,
    new_event_id,
)
from registry.fold import DUPLICATE_WINDOW_MS, fold
from registry.image import LogRecord
from registry.keys import record_key
from registry.wire import default_codec

YEAR = 365 * 24 * 3600 * 1000
NOW = 1_795_000_000_000


def _without_copies(records: list[LogRecord]) -> list[LogRecord]:
    """The log with every later copy of an event id left out (rule 1 is the one rule that
    reads stamps; without copies it has nothing to decide)."""
    codec, seen, out = default_codec(), set(), []
    for r in records:
        try:
            event_id = codec.decode(r.value).event_id if r.value is not None else None
        except CodecError:
            event_id = None
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        out.append(r)
    return out


stamps = st.one_of(st.none(), st.integers(0, NOW + 10 * YEAR),
                   st.sampled_from([0, 1000, NOW - YEAR, NOW, NOW + YEAR]))


@SETTINGS
@given(histories, st.data())
def test_no_verdict_but_rule_1_reads_a_records_stamp(sim: Sim, data) -> None:
    """Any stamps at all (far past, far future, going backwards, none): the same verdicts,
    jobs, epoch, leader and term as under the broker's stamps. Fencing, the CAS of grants,
    leases (counted renewals; the election times them on the contender's own monotonic
    clock) and every job and checkpoint rule never read a record's time."""
    records = _without_copies(visible(sim.log))
    skewed = [r._replace(timestamp=data.draw(stamps)) for r in records]
    a, b = fold(records, NS), fold(skewed, NS)
    assert a.answer() == b.answer() and a.term == b.term
    assert [(d.offset, d.outcome, d.reason) for d in a.rejected] == \
        [(d.offset, d.outcome, d.reason) for d in b.rejected]


def _grant_and_submit(stamp: int) -> tuple[list[LogRecord], JobSubmitted]:
    env = {"namespace": NS, "epoch": 1, "writer": "jm-1", "created_at": 1}
    grant = LeadershipGranted(event_id=new_event_id(), prev_epoch=0, **env)
    submit = JobSubmitted(event_id=new_event_id(), job_id="job-a", graph=InlineGraph(b"g"), **env)
    return [LogRecord(0, record_key(grant).encode(), encode(grant), stamp),
            LogRecord(1, record_key(submit).encode(), encode(submit), stamp)], submit


def _renewal(offset: int, stamp: int | None) -> LogRecord:
    renew = LeaseRenewed(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1",
                         created_at=1)
    return LogRecord(offset, record_key(renew).encode(), encode(renew), stamp)


def test_a_copy_stamped_earlier_than_the_first_is_still_a_duplicate() -> None:
    """A clock that jumps back: rule 1's newest window never goes back, and an id folded in
    it is remembered however early the copy's stamp is."""
    records, submit = _grant_and_submit(NOW)
    copy = records[1]._replace(offset=3, timestamp=NOW - YEAR)
    image = fold([*records, _renewal(2, NOW - YEAR), copy], NS)
    assert image.duplicates == 1 and not image.rejected


def test_a_stamp_far_ahead_moves_rule_1_for_every_reader_and_a_later_copy_is_refused() -> None:
    """A record stamped a year ahead (a writer's clock on the embedded broker; a broker's
    clock on Kafka) opens a window a year ahead: the ids of the windows before are forgotten,
    so a copy landing after it is folded as a new event, which the rules refuse (here a
    known job's submit: ``job_exists``); the jobs do not change. Every later id is kept in
    that window until stamps reach it."""
    records, submit = _grant_and_submit(NOW)
    ahead = _renewal(2, NOW + YEAR)
    copy = records[1]._replace(offset=3, timestamp=NOW + 1000)
    before = fold(records, NS)
    image = fold([*records, ahead, copy], NS)
    assert image.duplicates == 0
    assert [(d.offset, d.reason) for d in image.rejected] == [(3, "job_exists")]
    assert image.jobs == before.jobs
    assert set(image.recent_ids) == {(NOW + YEAR) // DUPLICATE_WINDOW_MS}
    assert fold([*records, ahead, copy], NS).recent_ids == image.recent_ids


def test_log_time_is_the_newest_stamp_folded_never_an_earlier_one() -> None:
    """The image's provenance says how far in time the log had reached: a record stamped
    earlier than one before it (a clock stepping back) does not take it back, so a snapshot's
    age and ``state`` output do not jump back with a writer's clock."""
    records, _ = _grant_and_submit(NOW)
    image = fold([*records, _renewal(2, NOW - YEAR), _renewal(3, None)], NS)
    assert image.provenance.log_time == NOW
    assert fold([*records, _renewal(2, NOW + 5)], NS).provenance.log_time == NOW + 5
    assert fold([*records, _renewal(2, NOW - YEAR)], NS).term.renewals == 1
