"""Group commit's queue (:class:`registry.writes.GroupCommit`), without a broker: who leads,
who joins which group, the bounds, and that every call gets exactly its own answer.

The ``run`` here stands in for a term's group write: it records the groups and answers
each call. Threads are ordered with events and the queue's own state, never with sleeps.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.errors import OutcomeUnknown
from registry.events import JobCancelled, new_event_id
from registry.image import Decision, Outcome
from registry.writes import GroupCommit, PendingCall

WAIT = 30.0  # only a failing test waits this long


def _call(records: int = 1, size: int = 10, tag: str = "") -> PendingCall:
    events = [JobCancelled(event_id=new_event_id(), namespace="ns", epoch=1, writer="a",
                           created_at=0, job_id=f"job-{tag}-{i}") for i in range(records)]
    pairs = [(f"k{tag}", e) for e in events]
    encoded = [(b"x" * max(0, size // records - 2), e) for e in events]
    return PendingCall(pairs, encoded)


def _decide(call: PendingCall) -> None:
    call.decisions = [Decision(offset=0, outcome=Outcome.ACCEPTED, event_id=e.event_id)
                      for _, e in call.pairs]


class Recorder:
    """A group write that records each group, and can hold the first until told."""

    def __init__(self, hold_first: bool = False) -> None:
        self.groups: list[list[PendingCall]] = []
        self.running = 0
        self.overlapped = False
        self.held = threading.Event()   # set once the first group is running
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def __call__(self, group: list[PendingCall], produced=None) -> None:
        self.running += 1
        self.overlapped |= self.running > 1
        self.groups.append(list(group))
        if len(self.groups) == 1:
            self.held.set()
            assert self.release.wait(WAIT)
        for c in group:
            _decide(c)
        self.running -= 1


def _queued(gc: GroupCommit, n: int) -> None:
    # Wait until n calls wait in the queue (they joined while a group is in flight).
    done = threading.Event()
    for _ in range(int(WAIT * 1000)):
        with gc._lock:
            if len(gc._queue) >= n:
                done.set()
                break
        done.wait(0.001)
    assert done.is_set(), f"{n} calls never queued"


def _start(gc: GroupCommit, call: PendingCall, answers: dict) -> threading.Thread:
    def go() -> None:
        try:
            answers[id(call)] = gc.commit(call)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            answers[id(call)] = e
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_a_lone_caller_leads_at_once_and_gets_its_decisions() -> None:
    run = Recorder()
    gc = GroupCommit(run)
    call = _call(records=2)
    decisions = gc.commit(call)
    assert [d.event_id for d in decisions] == [e.event_id for _, e in call.pairs]
    assert run.groups == [[call]]
    assert not gc._busy and not gc._queue


def test_calls_arriving_during_a_group_share_the_next_one_in_arrival_order() -> None:
    run = Recorder(hold_first=True)
    gc = GroupCommit(run)
    answers: dict = {}
    first = _call(tag="first")
    threads = [_start(gc, first, answers)]
    assert run.held.wait(WAIT)
    later = [_call(tag=str(i)) for i in range(5)]
    for i, c in enumerate(later):
        threads.append(_start(gc, c, answers))
        _queued(gc, i + 1)  # so the arrival order is known
    run.release.set()
    for t in threads:
        t.join(WAIT)
    assert run.groups == [[first], later]
    assert not run.overlapped
    for c in [first, *later]:
        assert [d.event_id for d in answers[id(c)]] == [e.event_id for _, e in c.pairs]


def test_a_group_is_bounded_by_records_and_bytes_and_never_splits_a_call() -> None:
    run = Recorder(hold_first=True)
    gc = GroupCommit(run, max_records=5, max_bytes=1000)
    answers: dict = {}
    threads = [_start(gc, _call(tag="first"), answers)]
    assert run.held.wait(WAIT)
    waiting = [_call(records=3, tag="a"), _call(records=3, tag="b"),   # 6 > 5 records
               _call(size=900, tag="c"), _call(size=200, tag="d"),     # 1100 > 1000 bytes
               _call(records=7, size=50, tag="e")]                     # alone over the bound
    for i, c in enumerate(waiting):
        threads.append(_start(gc, c, answers))
        _queued(gc, i + 1)
    run.release.set()
    for t in threads:
        t.join(WAIT)
    tags = [[c.pairs[0][0] for c in g] for g in run.groups[1:]]
    assert tags == [["ka"], ["kb", "kc"], ["kd"], ["ke"]]
    assert all(not isinstance(answers[id(c)], BaseException) for c in waiting)


def test_a_failed_group_answers_each_of_its_calls_and_the_next_group_goes_on() -> None:
    groups: list[list[PendingCall]] = []
    held, release = threading.Event(), threading.Event()

    def run(group: list[PendingCall], produced=None) -> None:
        groups.append(group)
        if len(groups) == 1:
            held.set()
            assert release.wait(WAIT)
            _decide(group[0])
        elif len(groups) == 2:
            raise RuntimeError("the group's write failed")
        else:
            for c in group:
                _decide(c)

    gc = GroupCommit(run, max_records=2)
    answers: dict = {}
    calls = [_call(tag=str(i)) for i in range(5)]
    threads = [_start(gc, calls[0], answers)]
    assert held.wait(WAIT)
    for i, c in enumerate(calls[1:]):
        threads.append(_start(gc, c, answers))
        _queued(gc, i + 1)
    release.set()
    for t in threads:
        t.join(WAIT)
    assert [len(g) for g in groups] == [1, 2, 2]
    failed = [answers[id(c)] for c in calls[1:3]]
    assert all(isinstance(e, RuntimeError) for e in failed)
    assert all(isinstance(answers[id(c)], list) for c in (calls[0], *calls[3:]))
    assert not gc._busy


def test_an_interrupted_leader_leaves_its_group_unknown_not_interrupted() -> None:
    held, release = threading.Event(), threading.Event()

    def run(group: list[PendingCall], produced=None) -> None:
        if len(group) == 1 and not release.is_set():
            held.set()
            assert release.wait(WAIT)
            _decide(group[0])
            return
        raise KeyboardInterrupt  # the leader's thread is interrupted mid-write

    gc = GroupCommit(run)
    answers: dict = {}
    first, lead, other = _call(tag="first"), _call(tag="lead"), _call(tag="other")
    threads = [_start(gc, first, answers)]
    assert held.wait(WAIT)
    for i, c in enumerate((lead, other)):
        threads.append(_start(gc, c, answers))
        _queued(gc, i + 1)
    release.set()
    for t in threads:
        t.join(WAIT)
    assert isinstance(answers[id(lead)], KeyboardInterrupt)
    unknown = answers[id(other)]
    assert isinstance(unknown, OutcomeUnknown) and "interrupted" in str(unknown)
    assert unknown.event_ids == (other.pairs[0][1].event_id,)
    assert not gc._busy and not gc._queue


def test_a_call_that_leaves_the_queue_before_its_group_hands_the_lead_on() -> None:
    run = Recorder()
    gc = GroupCommit(run)
    gone, stays = _call(tag="gone"), _call(tag="stays")
    with gc._lock:  # as if a group were in flight and both waited
        gc._busy = True
        gc._queue += [gone, stays]
        gone._leads = True  # the lead was handed to it just as it was interrupted
    gc._leave(gone)
    assert list(gc._queue) == [stays] and stays._leads and stays._wake.is_set()
    gc._lead(stays)  # what its commit() does once woken as the leader
    assert run.groups == [[stays]] and stays.decisions and gone.decisions is None
    assert not gc._busy and not gc._queue


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 400)), min_size=1, max_size=12),
       st.integers(1, 6), st.integers(100, 900))
def test_every_call_is_answered_once_by_groups_in_order_within_the_bounds(
        shapes: list[tuple[int, int]], max_records: int, max_bytes: int) -> None:
    run = Recorder()
    gc = GroupCommit(run, max_records=max_records, max_bytes=max_bytes)
    calls = [_call(records=r, size=s, tag=str(i)) for i, (r, s) in enumerate(shapes)]
    answers: dict = {}
    barrier = threading.Barrier(len(calls))

    def go(c: PendingCall) -> None:
        barrier.wait(WAIT)
        answers[id(c)] = gc.commit(c)

    threads = [threading.Thread(target=go, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not run.overlapped
    seen = [c for g in run.groups for c in g]
    assert sorted(map(id, seen)) == sorted(map(id, calls))  # each call in exactly one group
    for g in run.groups:
        if len(g) > 1:  # a call alone may exceed the bounds; a group of several may not
            assert sum(len(c.pairs) for c in g) <= max_records
            assert sum(c.size for c in g) <= max_bytes
    for c in calls:
        assert [d.event_id for d in answers[id(c)]] == [e.event_id for _, e in c.pairs]
    assert not gc._busy and not gc._queue


def test_a_pending_call_counts_its_encoded_bytes() -> None:
    call = _call(records=2, size=100, tag="z")
    assert call.size == sum(len(k) + len(d) for (k, _), (d, _) in zip(call.pairs, call.encoded,
                                                                   strict=True))
    with pytest.raises(ValueError):
        PendingCall(call.pairs, call.encoded[:1])


def _until(condition, what: str) -> None:
    pause = threading.Event()
    for _ in range(int(WAIT * 200)):
        if condition():
            return
        pause.wait(0.005)
    raise AssertionError(f"never: {what}")


def test_groups_overlap_once_produced_and_at_most_max_in_flight() -> None:
    """A group that has handed its records to the producer (``produced()``) lets the next
    group be formed and written while it waits for its confirmation; at most
    ``max_in_flight`` groups are between their write and their answers, and calls that
    arrive meanwhile wait for a slot and then form one group, in arrival order."""
    release, lock = threading.Event(), threading.Lock()
    groups: list[list[PendingCall]] = []
    running, peak = [0], [0]

    def run(group: list[PendingCall], produced) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            groups.append(list(group))
        produced()
        assert release.wait(WAIT)
        for c in group:
            _decide(c)
        with lock:
            running[0] -= 1

    gc = GroupCommit(run, max_in_flight=2)
    calls = [_call(tag=str(i)) for i in range(5)]
    threads = [threading.Thread(target=gc.commit, args=(c,), daemon=True) for c in calls]
    for i in (0, 1):  # each leads a group of its own, and both are in flight at once
        threads[i].start()
        _until(lambda i=i: len(groups) == i + 1, f"group {i} running")
    threads[2].start()  # it leads, and waits for a slot
    _until(lambda: calls[2]._leads, "call 2 leading")
    for i in (3, 4):
        threads[i].start()
        _until(lambda i=i: len(gc._queue) == i - 1, f"calls 2-{i} queued")
    release.set()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert peak[0] == 2
    assert [[calls.index(c) for c in g] for g in groups] == [[0], [1], [2, 3, 4]]
    assert all(c.decisions and c.error is None for c in calls)
    assert not gc._busy and not gc._queue
