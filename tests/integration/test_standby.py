"""A hot standby: a contender waiting in ``elect`` keeps its fold current and its producers
made, fences nobody while it waits, and takes over with the tail of the log, not a replay.

No test times anything: "only the tail" is counted in records folded, and every wait is on a
condition with a generous deadline.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import pytest

from registry import Fenced, Registry
from registry.client import Term
from registry.codec import encode
from registry.events import JobCancelled, new_event_id
from registry.keys import job_key
from registry.log import write_raw

pytestmark = pytest.mark.integration

LEASE = 2.0
JOBS = 120


def connect_fast(broker, topic: str, namespace: str) -> Registry:
    return Registry.connect(broker.bootstrap, namespace, topic=topic, timeout=LEASE / 2)


def wait_until(what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def count_folded(reg: Registry) -> list[int]:
    """Count the records ``reg``'s fold reads from now on (the list's one item)."""
    folded = [0]
    fold = reg._log.fold

    def counting(batches, known=None):  # type: ignore[no-untyped-def]
        def counted():  # type: ignore[no-untyped-def]
            for batch in batches:
                folded[0] += len(batch)
                yield batch
        return fold(counted(), known)

    reg._log.fold = counting  # type: ignore[method-assign]
    return folded


class Standby:
    """A contender waiting in ``acquire`` in a thread of its own."""

    def __init__(self, reg: Registry, contender: str) -> None:
        self.election = reg.elect(contender, lease=LEASE)
        self.term: Term | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.term = self.election.acquire(timeout=LEASE * 30)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def join(self) -> Term:
        self._thread.join(LEASE * 30)
        if self.term is None:
            self.election.cancel()
            raise AssertionError(f"the standby did not take over: {self.error!r}")
        return self.term


def test_a_waiting_standby_folds_the_log_and_takes_over_with_its_tail(broker, topic) -> None:
    a, b = connect_fast(broker, topic, "hot"), connect_fast(broker, topic, "hot")
    lead = a.elect("jm-a", lease=LEASE)
    term = lead.acquire(timeout=LEASE * 10)
    standby = Standby(b, "jm-b")
    # Written while the standby waits: no call on b reads them, its election's rounds do.
    last = term.submit_many([(f"job-{i}", b"g") for i in range(JOBS)])[-1]
    wait_until("the standby folded the leader's writes",
               lambda: b.image.provenance.last_offset >= last.offset)
    assert set(b.image.live_jobs()) == {f"job-{i}" for i in range(JOBS)}
    folded = count_folded(b)
    lead._cancelled.set()  # the leader dies silently: renewals stop, no revoke
    new = standby.join()
    # The claim read the tail: the leader's last renewals, its grant, commit markers.
    assert new.epoch == 2 and folded[0] < 20, folded[0]
    results = new.recover()
    assert len(results) == JOBS and all(r.ok for r in results)
    # recover read its own adoptions back (one call of JOBS records and its commit), and
    # the tail before them: not the jobs' records again.
    assert folded[0] < JOBS + 1 + 20, folded[0]
    assert {v.owner_epoch for v in b.jobs().values()} == {2}
    standby.election.cancel(revoke=True)
    for r in (a, b):
        r.close()


def test_a_standby_makes_its_producers_while_it_waits_and_its_term_writes_with_them(
        broker, topic) -> None:
    a, b = connect_fast(broker, topic, "warm"), connect_fast(broker, topic, "warm")
    lead = a.elect("jm-a", lease=LEASE)
    term = lead.acquire(timeout=LEASE * 10)
    standby = Standby(b, "jm-b")
    wait_until("the standby made its producers", lambda: b._spare is not None
               and b._plain is not None)
    spare = b._spare
    # The leader goes on writing: the standby's producers wrote nothing and fenced nobody.
    for i in range(3):
        assert term.submit(f"job-{i}", b"g").epoch == 1
    assert lead.is_leader
    lead._cancelled.set()
    new = standby.join()
    assert new._writes.writer is spare and b._spare is None  # the term writes with it
    assert new.submit("after", b"g").epoch == 2
    # The old leader's writes are refused by the fold, past its lease guard too.
    term.guard_writes(None)
    with pytest.raises(Fenced):
        term.submit("zombie", b"g")
    assert "zombie" not in b.jobs()
    standby.election.cancel(revoke=True)
    for r in (a, b):
        r.close()


def test_a_registry_closed_with_prepared_producers_closes_them(broker, topic) -> None:
    a = connect_fast(broker, topic, "spare")
    a.prepare_claim()
    a.prepare_claim()  # made once: a second call changes nothing
    spare, plain = a._spare, a._plain
    assert spare is not None and plain is not None
    term = a.claim_leadership("jm-a")
    assert term._writes.writer is spare and a._spare is None and a._plain is plain
    assert term.submit("one", b"g").epoch == 1
    a.prepare_claim()  # for a later claim
    assert a._spare is not None and a._spare is not spare
    a.close()
    assert a._spare is None and a._plain is None


def test_a_claim_from_a_standby_settles_refused_keys_without_reading_again(
        broker, topic) -> None:
    """The claim's first step (settling keys a refused record is the newest record of) works
    from the image the claim read, with no read after it."""
    a, b = connect_fast(broker, topic, "settle"), connect_fast(broker, topic, "settle")
    t1 = a.claim_leadership("jm-a")
    t1.submit("job", b"g")
    t2 = b.claim_leadership("jm-b")
    zombie = JobCancelled(event_id=new_event_id(), namespace="settle", epoch=1, writer="jm-a",
                          created_at=0, job_id="job")
    write_raw(broker.bootstrap, topic, a.partition, job_key("settle", "job"), encode(zombie))
    c = connect_fast(broker, topic, "settle")
    assert c.image.unsettled
    syncs = [0]
    sync = c.sync

    def counting(timeout=None):  # type: ignore[no-untyped-def]
        syncs[0] += 1
        return sync(timeout)

    c.sync = counting  # type: ignore[method-assign]
    t3 = c.claim_leadership("jm-c")
    assert syncs[0] == 1  # the claim's own read, none after its grant
    assert not c.image.unsettled and t3.epoch == 3
    assert c.job("job").status == "ACTIVE"
    for r in (a, b, c):
        r.close()
    assert t2.epoch == 2


def test_recover_collects_no_garbage_while_writing_but_its_hooks_run_with_the_collector(
        broker, topic) -> None:
    a = connect_fast(broker, topic, "gc")
    a.claim_leadership("jm-a").submit_many([(f"job-{i}", b"g") for i in range(5)])
    b = connect_fast(broker, topic, "gc")
    term = b.claim_leadership("jm-b")
    during: list[bool] = []
    results = term.recover(lambda job: during.append(gc.isenabled()), batch_size=2)
    assert during == [True] * 5 and gc.isenabled()
    assert [r.status for r in results] == ["ADOPTED"] * 5
    c = connect_fast(broker, topic, "gc")
    c.claim_leadership("jm-c").submit("job-c", b"g")  # a job term 2 would adopt
    b.sync()
    with pytest.raises(Fenced):  # the term is over: recover raises, the collector is back
        term.recover()
    assert gc.isenabled()
    for r in (a, b, c):
        r.close()
