"""Group commit on a real broker: concurrent calls of one :class:`~registry.client.Term`
share one write, and each still gets exactly its own answer (README "Group commit",
registry/errors.py).

Each test holds the term's first group in flight until the calls under test have queued
behind it (the queue's own state, not a sleep), so they form the next group together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from registry import OutcomeUnknown
from registry.errors import BrokerError, CodecError, Fenced, WriteRejected
from registry.folded import FoldedLog
from registry.image import Outcome
from registry.log import LeaderWriter, Sending, WriteFailed, _Delivery

pytestmark = pytest.mark.integration

WAIT = 60.0  # only a failing test waits this long


class Held:
    """Holds the term's next group in flight until ``queued`` calls wait behind it, and
    records every group (each call's first record's job id) and every write."""

    def __init__(self, term, monkeypatch) -> None:
        self.term = term
        self.groups: list[list[str | None]] = []
        self.writes = 0
        self._want = 0
        self._queued = threading.Condition()
        run = term._groups._run

        def held_run(group, produced) -> None:
            self.groups.append([getattr(c.pairs[0][1], "job_id", None) if c.pairs else None
                                for c in group])
            if len(self.groups) == 1:
                self._wait_for_queue()
            run(group, produced)

        monkeypatch.setattr(term._groups, "_run", held_run)
        start = LeaderWriter.start

        def counted(writer, records):
            self.writes += 1
            return start(writer, records)

        monkeypatch.setattr(LeaderWriter, "start", counted)

    def _wait_for_queue(self) -> None:
        gc = self.term._groups
        ready = threading.Event()
        for _ in range(int(WAIT * 200)):
            with gc._lock:
                if len(gc._queue) >= self._want:
                    return
            ready.wait(0.005)
        raise AssertionError(f"{self._want} calls never queued")

    def run(self, first: Callable[[], Any], *calls: Callable[[], Any],
            joining: int | None = None) -> list[Any]:
        """Run ``first`` (it leads the held group), then ``calls`` concurrently behind it
        (``joining`` of them reach the queue: all by default); each one's return value or
        exception, in order."""
        self._want = len(calls) if joining is None else joining
        out: list[Any] = [None] * (len(calls) + 1)

        def go(i: int, fn: Callable[[], Any]) -> None:
            try:
                out[i] = fn()
            except Exception as e:  # noqa: BLE001 - the test looks at it
                out[i] = e

        threads = [threading.Thread(target=go, args=(0, first), daemon=True)]
        threads[0].start()
        while not self.groups:  # the first call leads its group before the others come
            threads[0].join(0.005)
        gc, pause = self.term._groups, threading.Event()
        for i, fn in enumerate(calls, 1):
            with gc._lock:
                before = len(gc._queue)
            threads.append(threading.Thread(target=go, args=(i, fn), daemon=True))
            threads[-1].start()
            for _ in range(int(WAIT * 200)):  # queued (or failed before it joined): in order
                with gc._lock:
                    if len(gc._queue) > before or not threads[-1].is_alive():
                        break
                pause.wait(0.005)
        for t in threads:
            t.join(WAIT)
            assert not t.is_alive(), "a call never returned"
        return out


def _decisions(reg) -> dict[str, str]:
    reg.sync()
    return {d.event_id: d.outcome for d in reg.forensics().decisions() if d.event_id}


def test_concurrent_calls_share_one_write_and_each_gets_its_own_receipts(
        connect, monkeypatch) -> None:
    collector = CollectorRegistry()
    reg = connect(metrics=collector)
    term = reg.claim_leadership("jm-1")
    held = Held(term, monkeypatch)
    out = held.run(lambda: term.submit("job-0", b"g"),
                   *[lambda i=i: term.submit(f"job-{i}", b"g") for i in range(1, 5)],
                   lambda: term.submit_many([("many-a", b"a"), ("many-b", b"b")]))
    assert held.groups == [["job-0"], ["job-1", "job-2", "job-3", "job-4", "many-a"]]
    assert held.writes == 2  # one per group
    labels = {"topic": reg.topic, "namespace": reg.namespace}
    sample = collector.get_sample_value
    assert sample("jobreg_write_group_calls_count", labels) == 2  # the groups, as metrics
    assert sample("jobreg_write_group_calls_sum", labels) == 6
    assert sample("jobreg_write_group_records_sum", labels) == 1 + 4 + 3  # many-a, -b, commit
    decided = _decisions(reg)
    for receipt in out[:5]:
        assert decided[receipt.event_id] == Outcome.ACCEPTED and receipt.epoch == term.epoch
    many = out[5]
    assert len(many) == 2 and all(decided[r.event_id] == Outcome.ACCEPTED for r in many)
    assert len({r.offset for r in [*out[:5], *many]}) == 7
    assert set(reg.jobs()) == {f"job-{i}" for i in range(5)} | {"many-a", "many-b"}


def test_a_refused_call_does_not_sink_the_others_of_its_group(connect, monkeypatch) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit("known", b"k")
    held = Held(term, monkeypatch)
    out = held.run(lambda: term.submit("first", b"g"),
                   lambda: term.submit("known", b"again"),               # refused alone
                   lambda: term.submit("fine-1", b"g"),
                   lambda: term.submit_many([("atomic-a", b"a"), ("known", b"k")]),  # all or none
                   lambda: term.submit("fine-2", b"g"))
    # Two groups, then one settling of the key the refused records landed on (step 4): calls
    # of no records (each caller asks for one; they join one group or more, and only the
    # first finds anything to write).
    assert len(held.groups) >= 3 and held.writes == 3
    assert all(set(g) == {None} for g in held.groups[2:])
    assert not reg.image.unsettled
    assert isinstance(out[1], WriteRejected) and out[1].reason == "job_exists"
    assert isinstance(out[3], WriteRejected)
    assert set(out[1].event_ids).isdisjoint(out[3].event_ids)
    decided = _decisions(reg)
    assert decided[out[2].event_id] == decided[out[4].event_id] == Outcome.ACCEPTED
    assert all(decided[i] != Outcome.ACCEPTED for i in out[3].event_ids)
    assert set(reg.jobs()) == {"known", "first", "fine-1", "fine-2"}  # no atomic-a


def test_a_group_whose_write_fails_is_resent_and_every_call_answered(
        connect, monkeypatch) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    held = Held(term, monkeypatch)
    counted = LeaderWriter.start
    failed: list[int] = []

    def fail_once(writer, records):
        if len(held.groups) == 2 and not failed:  # the shared group's first write
            failed.append(len(records))  # refused as a whole: nothing appended
            return Sending(writer._producer, _Delivery(), records, 0,
                           WriteFailed("planted: the broker refused the batch"))
        return counted(writer, records)

    monkeypatch.setattr(LeaderWriter, "start", fail_once)
    out = held.run(lambda: term.submit("job-0", b"g"),
                   *[lambda i=i: term.submit(f"job-{i}", b"g") for i in range(1, 4)])
    assert failed == [3]  # the whole group failed once...
    decided = _decisions(reg)
    assert all(decided[r.event_id] == Outcome.ACCEPTED for r in out)  # ...and was resent
    assert set(reg.jobs()) == {"job-0", "job-1", "job-2", "job-3"}


def test_a_group_fenced_by_a_newer_term_answers_each_call_fenced_with_its_own_ids(
        connect, monkeypatch) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    other = connect()
    held = Held(term, monkeypatch)
    run = held.term._groups._run

    def claim_then_run(group, produced) -> None:
        if len(held.groups) == 1 and len(group) > 1:  # the shared group: a newer term first
            other.claim_leadership("jm-2")
        run(group, produced)

    monkeypatch.setattr(term._groups, "_run", claim_then_run)
    out = held.run(lambda: term.submit("job-0", b"g"),
                   *[lambda i=i: term.submit(f"job-{i}", b"g") for i in range(1, 4)])
    assert not isinstance(out[0], Exception)
    errors = out[1:]
    assert all(isinstance(e, Fenced) and e.reason == "stale_epoch" for e in errors), errors
    assert all(e.expected_epoch == 2 and e.actual_epoch == 1 for e in errors)
    ids = [set(e.event_ids) for e in errors]
    assert all(len(i) <= 1 for i in ids) and all(a.isdisjoint(b) for a, b in
                                                zip(ids, ids[1:], strict=False))
    decided = _decisions(other)
    assert not any(decided.get(i) == Outcome.ACCEPTED for s in ids for i in s)
    assert set(other.jobs()) == {"job-0"}


def test_a_group_whose_fate_is_unknown_answers_each_call_unknown_with_its_own_ids(
        connect, monkeypatch) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    held = Held(term, monkeypatch)
    read_back, sync = FoldedLog.read_back, FoldedLog.sync

    def lost(*_args, **_kw):
        raise BrokerError("planted: the broker stopped answering")

    def maybe_lost(method):
        def call(log, *args, **kw):
            if len(held.groups) == 2:  # the shared group: committed, then nothing read
                lost()
            return method(log, *args, **kw)
        return call

    monkeypatch.setattr(FoldedLog, "read_back", maybe_lost(read_back))
    monkeypatch.setattr(FoldedLog, "sync", maybe_lost(sync))
    out = held.run(lambda: term.submit("job-0", b"g"),
                   *[lambda i=i: term.submit(f"job-{i}", b"g") for i in range(1, 4)])
    errors = out[1:]
    assert all(isinstance(e, OutcomeUnknown) for e in errors), errors
    assert all(len(e.event_ids) == 1 for e in errors)
    assert len({e.event_ids[0] for e in errors}) == 3
    monkeypatch.setattr(FoldedLog, "read_back", read_back)
    monkeypatch.setattr(FoldedLog, "sync", sync)
    decided = _decisions(reg)  # the log is the truth: the write had landed
    assert all(decided[e.event_ids[0]] == Outcome.ACCEPTED for e in errors)


def test_a_call_that_cannot_be_encoded_fails_alone_before_it_joins(connect,
                                                                   monkeypatch) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit_many([("a", b"a"), ("b", b"b")])
    held = Held(term, monkeypatch)
    out = held.run(lambda: term.submit("job-0", b"g"),
                   lambda: term.submit("job-1", b"g"),
                   lambda: term.cancel("a", reason=123),  # type: ignore[arg-type]
                   lambda: term.cancel("b", reason="fine"),
                   joining=2)
    assert isinstance(out[2], CodecError) and out[2].event_ids == ()
    assert not any(isinstance(o, Exception) for o in (out[0], out[1], out[3]))
    assert held.groups == [["job-0"], ["job-1", "b"]]
    assert reg.sync().jobs["a"].status == "ACTIVE"
    assert reg.job("b").status == "CANCELLED"


def test_two_checkpoint_calls_of_one_job_in_one_group_are_both_accepted(
        connect, monkeypatch) -> None:
    """A checkpoint record carries the job's checkpoint state after it, which the fold
    recomputes. Computed when the call was made, two calls of one job that share a group
    both started from the same state, and the fold refused the second; computed when the
    group is assembled, each starts from the state the one before it leaves."""
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit("job", b"g")
    held = Held(term, monkeypatch)
    out = held.run(lambda: term.submit("other", b"g"),
                   lambda: term.checkpoint_triggered("job", 1),
                   lambda: term.checkpoint_completed("job", 1, "s3://cp/1"))
    assert held.groups == [["other"], ["job", "job"]]  # the two calls shared a group
    assert not [r for r in out if isinstance(r, Exception)], out
    decided = _decisions(reg)
    assert all(decided[r.event_id] == Outcome.ACCEPTED for r in out)
    assert reg.job("job").checkpoints.last_completed == 1


def test_a_lease_that_runs_out_while_calls_wait_for_their_group_refuses_them_unsent(
        connect, monkeypatch) -> None:
    """The write guard is asked when a call is made and again when its group is sent: calls
    that passed it and then waited behind a group while the lease ran out raise
    LeaseExpired, with no event ids (nothing of them was sent); a lease renewal, which
    passes the guard, is still sent."""
    from registry.errors import LeaseExpired

    reg = connect()
    term = reg.claim_leadership("jm-1")
    expired: list[bool] = []

    def guard() -> None:
        if expired:
            raise LeaseExpired("planted: the lease ran out")

    term.guard_writes(guard)
    held = Held(term, monkeypatch)
    wait = held._wait_for_queue

    def wait_then_expire() -> None:
        wait()
        expired.append(True)  # every call below has passed the guard and now waits

    monkeypatch.setattr(held, "_wait_for_queue", wait_then_expire)
    out = held.run(lambda: term.submit("job-0", b"g"),
                   lambda: term.submit("job-1", b"g"),
                   term.renew_lease)
    assert isinstance(out[0], LeaseExpired) and isinstance(out[1], LeaseExpired), out
    assert out[0].event_ids == out[1].event_ids == ()
    assert out[2].epoch == term.epoch  # the renewal's receipt
    reg.sync()
    assert not reg.jobs() and reg.image.term.renewals == 1  # type: ignore[union-attr]
