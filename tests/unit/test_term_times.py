"""`jobreg terms` shows times (issue 35, part 4): when each term started and ended by its
records' times, and how long it lasted; what the log does not say is "unknown", never a
guess. The summary logic on hand-made verdicts, no broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from registry.forensics import Forensics, Scan, term_duration
from registry.image import Decision, Image, Outcome, TermInfo
from registry.render import UNKNOWN, format_duration, term_json, term_times


def _grant(offset: int, epoch: int, ts: int | None) -> Decision:
    return Decision(offset, Outcome.ACCEPTED, ts, "ns/leader", "LeadershipGranted",
                    epoch=epoch, writer=f"jm-{epoch}")


def _write(offset: int, epoch: int, ts: int | None, event: str = "JobSubmitted") -> Decision:
    return Decision(offset, Outcome.ACCEPTED, ts, "ns/job/a", event, epoch=epoch,
                    writer=f"jm-{epoch}")


def _terms(decisions: list[Decision], terms: list[TermInfo]):
    return Forensics.terms_from(Scan(Image.empty("ns"), decisions, terms))


def test_a_term_starts_at_its_grant_and_ends_at_the_next_grant_or_its_revoke() -> None:
    decisions = [_grant(0, 1, 1_000), _write(1, 1, 1_500), _grant(2, 2, 4_000),
                 _write(3, 2, 4_100), _write(4, 2, 9_000, "LeadershipRevoked"),
                 _grant(5, 3, 10_000)]
    terms = [TermInfo(1, "jm-1", 0), TermInfo(2, "jm-2", 2, revoked_offset=4),
             TermInfo(3, "jm-3", 5)]
    one, two, three = _terms(decisions, terms)
    assert (one.started_at, one.ended_at, one.duration_ms) == (1_000, 4_000, 3_000)
    assert (two.started_at, two.ended_at, two.duration_ms) == (4_000, 9_000, 5_000)
    assert (three.started_at, three.ended_at, three.duration_ms) == (10_000, None, None)
    assert term_times(one) == ("1970-01-01T00:00:01.000Z", "1970-01-01T00:00:04.000Z",
                               "3.000 s")
    assert term_times(three) == ("1970-01-01T00:00:10.000Z", "-", "-")  # not ended
    doc = term_json(two)
    assert (doc["started_at"], doc["ended_at"], doc["duration_ms"]) == (4_000, 9_000, 5_000)
    assert doc["started_time"] == "1970-01-01T00:00:04.000Z"


def test_records_without_a_time_say_unknown_never_a_time() -> None:
    # A source that gives no stamps (a dump of records without one), and Kafka's "no
    # timestamp" (-1): neither is a time.
    decisions = [_grant(0, 1, None), _grant(1, 2, 2_000), _grant(2, 3, -1)]
    terms = [TermInfo(1, "jm-1", 0), TermInfo(2, "jm-2", 1), TermInfo(3, "jm-3", 2)]
    one, two, three = _terms(decisions, terms)
    assert (one.started_at, one.ended_at, one.duration_ms) == (None, 2_000, None)
    assert (two.started_at, two.ended_at, two.duration_ms) == (2_000, None, None)
    assert three.started_at is None
    assert term_times(one) == (UNKNOWN, "1970-01-01T00:00:02.000Z", UNKNOWN)
    assert term_times(two)[1:] == (UNKNOWN, UNKNOWN)  # it ended; when is not known
    assert term_times(three) == (UNKNOWN, "-", "-")
    assert term_json(one)["started_time"] is None


def test_an_end_stamped_before_its_start_has_no_duration() -> None:
    """A producer whose clock is behind, on a broker that keeps the producer's stamp (the
    embedded one, README "What differs", Record time): both stamps are shown as the log has
    them, the duration is unknown rather than negative."""
    decisions = [_grant(0, 1, 5_000), _grant(1, 2, 4_000)]
    one, _ = _terms(decisions, [TermInfo(1, "jm-1", 0), TermInfo(2, "jm-2", 1)])
    assert (one.started_at, one.ended_at, one.duration_ms) == (5_000, 4_000, None)
    assert term_times(one)[2] == UNKNOWN


@given(st.one_of(st.none(), st.integers(0, 2**50)), st.one_of(st.none(), st.integers(0, 2**50)))
def test_a_duration_is_the_difference_or_unknown_never_negative(
        start: int | None, end: int | None) -> None:
    took = term_duration(start, end)
    if start is None or end is None or end < start:
        assert took is None
    else:
        assert took == end - start >= 0


def test_durations_for_people() -> None:
    assert [format_duration(ms) for ms in (0, 840, 12_304, 184_120, 7_500_000,
                                           273_600_000)] == [
        "0 ms", "840 ms", "12.304 s", "3 min 04.120 s", "2 h 05 min", "3 d 04 h"]
