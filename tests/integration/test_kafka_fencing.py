"""Fencing and transactions on Apache Kafka (README "What differs from Apache Kafka").

The embedded broker's tests (test_outcomes.py, test_election.py, test_shared_partition.py)
show what jobreg's answers are whatever the broker does; these show what Apache Kafka does:

* a zombie leader is fenced twice: at the broker (the new term's ``init_transactions`` of the
  namespace's transactional id, ``jobreg.<topic>.<namespace>``, makes the broker refuse the old
  producer's next transaction with an old-epoch error, which librdkafka raises as the fatal
  ``_FENCED``) and by the fold's epochs; its call answers
  ``Fenced`` when none of its records was appended, and ``OutcomeUnknown`` when they were
  appended before the claim aborted them (where ``Fenced`` would have been exact on Kafka:
  its records are aborted and no reader ever sees them);
* a leader SIGKILLed in the middle of a transaction holds the last stable offset of its
  partition, which other namespaces share, until the transaction ends: the next claim of its
  namespace ends it at once (a claim fences the id before its grant), else Kafka aborts it
  after the producer's ``transaction.timeout.ms`` (jobreg's: ``TRANSACTION_TIMEOUT_MS``), and
  the other namespaces' held writes then complete.

Nothing here waits on a clock: every wait is for a condition, bounded generously.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from registry import Registry
from registry.dev.kafka import KafkaCluster
from registry.errors import Fenced, OutcomeUnknown
from registry.keys import partition_for
from registry.log import TransactionFailed

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

PATIENCE = 120.0  # seconds: only a hang reaches it
DIES = Path(__file__).parent.parent / "support" / "procs" / "dies_mid_transaction.py"


@pytest.fixture
def on_kafka(kafka: KafkaCluster, topic: str, tmp_path) -> Iterator[Callable[..., Registry]]:
    """Factory: ``on_kafka(namespace)`` -> a Registry on the session's Kafka node and this
    test's topic, closed afterwards."""
    made: list[Registry] = []

    def make(namespace: str = "prod", **kwargs: Any) -> Registry:
        kwargs.setdefault("blob_store", tmp_path / "blobs")
        reg = Registry.connect(kafka.bootstrap, namespace, topic=topic, **kwargs)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


def _sharing(count: int, partitions: int = 8) -> list[str]:
    """``count`` namespaces that hash to one partition of a topic of ``partitions``."""
    by_partition: dict[int, list[str]] = {}
    for i in range(1000):
        names = by_partition.setdefault(partition_for(f"ns-{i}", partitions), [])
        names.append(f"ns-{i}")
        if len(names) == count:
            return names
    raise AssertionError("no partition got enough namespaces")


def _uncommitted(bootstrap: str, topic: str, partition: int) -> dict[int, bytes | None]:
    """Every record the partition holds, aborted and open ones included (read_uncommitted):
    offset -> key. What was appended, whatever became of its transaction."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"look-{uuid.uuid4()}",
                         "isolation.level": "read_uncommitted", "enable.partition.eof": True,
                         "enable.auto.commit": False, "log_level": 0})
    consumer.assign([TopicPartition(topic, partition, 0)])
    out: dict[int, bytes | None] = {}
    try:
        while True:
            m = consumer.poll(PATIENCE)
            assert m is not None, "no end of partition within the patience"
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out[m.offset()] = m.key()
    finally:
        consumer.close()


def _cause(error: BaseException) -> TransactionFailed:
    """The failed transaction behind a write's exception."""
    cause = error.__cause__
    assert isinstance(cause, TransactionFailed), repr(cause)
    return cause


def test_a_zombie_is_refused_by_the_broker_and_its_call_is_fenced(on_kafka) -> None:
    """The new term's producer fences the old one at the broker: the old term's next
    transaction is refused (AddPartitionsToTxn: INVALID_PRODUCER_EPOCH, raised by librdkafka
    as the fatal _FENCED), nothing of it is appended, and the call answers Fenced (exact: none
    of its records is anywhere in the log), naming its records."""
    old = on_kafka()
    term = old.claim_leadership("jm-old")
    term.submit("job-a", b"a")
    on_kafka().claim_leadership("jm-new")  # init_transactions of jobreg.<topic>.prod
    with pytest.raises(Fenced) as caught:
        term.cancel("job-a")  # the old term has not read the new grant: it sends
    failed = _cause(caught.value)
    assert failed.fatal and "_FENCED" in str(failed), failed
    assert (failed.appended, failed.in_doubt) == ((), 0)
    assert (caught.value.expected_epoch, caught.value.actual_epoch) == (2, 1)
    assert caught.value.event_ids
    # Not appended at all: no record of the partition, aborted or not, is the cancel's.
    keys = _uncommitted(old.bootstrap, old.topic, old.partition).values()
    assert sum(k == b"prod/job/job-a" for k in keys) == 1  # the submit only
    fresh = on_kafka()
    assert fresh.job("job-a").status == "ACTIVE"
    assert [d for d in fresh.forensics().decisions()
            if d.event_id in caught.value.event_ids] == []


class _LateReports:
    """Stands in for a leader's producer whose delivery reports come one poll late: a report
    librdkafka serves on a poll is handed to the writer on the next poll that may wait. As
    when librdkafka purges a fenced producer's unsent records in its own thread and the
    writer's first look at the reports comes before theirs."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._late: list[tuple[Any, Any, Any]] = []

    def produce(self, *args: Any, on_delivery: Any = None, **kwargs: Any) -> None:
        def late(err: Any, msg: Any) -> None:
            self._late.append((on_delivery, err, msg))

        self._real.produce(*args, on_delivery=late, **kwargs)

    def poll(self, timeout: float = -1) -> int:
        served = self._real.poll(timeout)
        if timeout:  # a poll that may wait: what came before is handed over now
            late, self._late = self._late, []
            for callback, err, msg in late:
                if callback is not None:
                    callback(err, msg)
        return int(served)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_zombie_whose_reports_come_late_is_still_answered_fenced(on_kafka) -> None:
    """The fenced producer's records were never sent (AddPartitionsToTxn refused), and
    librdkafka says so in their delivery reports: the writer waits for them (briefly) instead
    of counting the records in doubt, which made the answer OutcomeUnknown where Fenced is
    exact."""
    old = on_kafka()
    term = old.claim_leadership("jm-old")
    term.submit("job-a", b"a")
    assert term._writes.writer is not None
    term._writes.writer._producer = _LateReports(term._writes.writer._producer)
    on_kafka().claim_leadership("jm-new")
    with pytest.raises(Fenced) as caught:
        term.cancel("job-a")
    failed = _cause(caught.value)
    assert (failed.fatal, failed.appended, failed.in_doubt) == (True, (), 0)


class _ClaimBeforeCommit:
    """Stands in for a leader's producer: its records are sent and appended, then another
    client claims the namespace (fencing the producer's transactional id), then it commits."""

    def __init__(self, real: Any, claim: Callable[[], object]) -> None:
        self._real, self._claim = real, claim
        self.commit_error: Exception | None = None

    def commit_transaction(self, *args: Any) -> None:
        assert self._real.flush(30) == 0  # appended: the delivery reports give the offsets
        self._claim()
        try:
            self._real.commit_transaction(*args)
        except Exception as e:
            self.commit_error = e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_zombie_fenced_after_its_records_were_appended_is_aborted_and_answered_unknown(
        on_kafka) -> None:
    """The records of the old term's call are appended (their offsets reported) when the claim
    fences its producer. Kafka aborts that transaction before the claim's grant is written, and
    refuses the commit (the fatal _FENCED): the records are in the partition, aborted, and no
    read_committed reader ever sees them, the new term's later commits included. The client
    answers OutcomeUnknown (a record placed before the term ended, with no reader seeing it:
    on the embedded broker it may yet be shown there, test_outcomes.py); on Kafka Fenced would
    have been exact, and unknown is the weaker true answer."""
    old, new = on_kafka(), on_kafka()
    term = old.claim_leadership("jm-old")
    term.submit("warm", b"g")
    claimed: list[Any] = []
    assert term._writes.writer is not None
    proxy = _ClaimBeforeCommit(term._writes.writer._producer,
                               lambda: claimed.append(new.claim_leadership("jm-new")))
    term._writes.writer._producer = proxy
    with pytest.raises(OutcomeUnknown) as caught:
        term.submit("raced", b"g")
    assert claimed and proxy.commit_error is not None, "the race did not happen"
    failed = _cause(caught.value)
    assert failed.fatal and failed.appended, failed
    assert "_FENCED" in str(proxy.commit_error), proxy.commit_error
    (raced_at,) = failed.appended
    grant_at = new.sync().term.granted_offset  # type: ignore[union-attr]
    assert raced_at < grant_at  # placed inside the old term, and aborted by the claim
    claimed[0].submit("after", b"g")  # the id's new owner commits: still never shown
    held = _uncommitted(old.bootstrap, old.topic, old.partition)
    assert held[raced_at] == b"prod/job/raced"
    fresh = on_kafka()
    assert set(fresh.jobs()) == {"warm", "after"}
    assert not any(d.offset == raced_at for d in fresh.forensics().decisions())
    assert caught.value.event_ids and not any(
        d.event_id in caught.value.event_ids for d in fresh.forensics().decisions())


# -- a leader killed mid-transaction, and another namespace on its partition -----------------


class _Dying:
    """A coordinator process (tests/support/procs/dies_mid_transaction.py) leading ``namespace``
    with its producer's transaction timeout ``txn_ms``, stopped in the middle of a write with
    its transaction open; :meth:`kill` SIGKILLs it (by pid)."""

    def __init__(self, bootstrap: str, topic: str, namespace: str, txn_ms: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(DIES), bootstrap, topic, namespace, "jm-dead", str(txn_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH"))
                if p)})
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout or ()],
                         daemon=True).start()
        try:
            self.open: dict[str, Any] = json.loads(lines.get(timeout=PATIENCE))
        except queue.Empty:
            self.kill()
            raise AssertionError("the coordinator did not open its transaction: "
                                 + (self.proc.stderr.read() if self.proc.stderr else "")
                                 ) from None
        assert self.open["event"] == "open" and self.open["left"] == 0, self.open
        (self.offset,) = self.open["offsets"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(PATIENCE)
        assert self.proc.returncode == -signal.SIGKILL
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


def _held_write(term: Any, job: str) -> tuple[threading.Thread, threading.Event,
                                               dict[str, Any]]:
    """Start ``term.submit(job)`` in a thread; the event is set once the write reads its own
    records back (they are in the log, and no read_committed fetch shows them yet)."""
    reader = term.registry._log.reader
    reading_back = threading.Event()
    read_until = reader.read_until

    def watched(offset: int, timeout: float) -> Any:
        reading_back.set()
        return read_until(offset, timeout)

    reader.read_until = watched
    answer: dict[str, Any] = {}

    def write() -> None:
        try:
            answer["receipt"] = term.submit(job, b"g")
        except Exception as e:  # noqa: BLE001 - the test reports it
            answer["error"] = e

    thread = threading.Thread(target=write, name=f"write-{job}")
    thread.start()
    return thread, reading_back, answer


def test_a_leader_killed_mid_transaction_holds_a_shared_partition_until_its_namespace_is_claimed(
        kafka: KafkaCluster, topic: str, on_kafka) -> None:
    """A's leader dies with its transaction open (a transaction timeout of 5 minutes: nothing
    but a claim ends it within this test). B's leader, on the same partition, writes: its
    records lie after A's open record, so no read_committed fetch shows them and the write
    waits. A's next claim fences A's transactional id before its grant, which aborts the open
    transaction: B's write then completes, and A's record is never seen."""
    a, b = _sharing(2)
    reg_b = on_kafka(b)
    term_b = reg_b.claim_leadership("jm-b")
    term_b.submit("before", b"g")
    dying = _Dying(kafka.bootstrap, topic, a, 300_000)
    try:
        dying.kill()
        writer, reading_back, answer = _held_write(term_b, "behind")
        assert reading_back.wait(PATIENCE), answer
        term_a = on_kafka(a).claim_leadership("jm-next")  # fences, aborting A's transaction
        writer.join(PATIENCE)
        assert not writer.is_alive(), "B's write still waits after A's claim"
    finally:
        dying.kill()
    assert "error" not in answer, answer.get("error")
    assert answer["receipt"].offset > dying.offset  # behind A's open record
    assert set(reg_b.jobs()) == {"before", "behind"}
    term_a.submit("after", b"g")
    fresh_a = on_kafka(a)
    assert set(fresh_a.jobs()) == {"committed", "after"}  # never "in-flight"
    assert (fresh_a.epoch(), fresh_a.leader().contender) == (2, "jm-next")  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def quick_abort() -> Iterator[KafkaCluster]:
    """One Kafka node whose transaction coordinator looks for timed-out transactions every
    0.5 s (Kafka's default: 10 s), so that a short transaction timeout ends a hold soon."""
    with KafkaCluster(nodes=1, config={
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}) as k:
        yield k


def test_a_leader_killed_mid_transaction_holds_a_shared_partition_until_kafka_aborts_it(
        quick_abort: KafkaCluster, topic: str, tmp_path) -> None:
    """Nobody claims A: the broker aborts A's open transaction once its producer's
    transaction timeout (5 s here; jobreg's TRANSACTION_TIMEOUT_MS in production) has
    passed, and B's write, held behind it, completes with its receipt instead of ending
    OutcomeUnknown after its patience (half the duplicate window, 30 s). With Kafka's
    default of 60 s (jobreg's before), B's write was unknown after 30.4 s (measured; README
    "What differs")."""
    a, b = _sharing(2)
    reg_b = Registry.connect(quick_abort.bootstrap, b, topic=topic, blob_store=tmp_path)
    try:
        term_b = reg_b.claim_leadership("jm-b")
        term_b.submit("before", b"g")
        dying = _Dying(quick_abort.bootstrap, topic, a, 5_000)
        dying.kill()
        receipt = term_b.submit("behind", b"g")  # raises OutcomeUnknown if held 30 s
        assert receipt.offset > dying.offset  # it lay behind A's open transaction
        assert set(reg_b.jobs()) == {"before", "behind"}
        fresh_a = Registry.connect(quick_abort.bootstrap, a, topic=topic, blob_store=tmp_path)
        try:  # aborted by the broker, not by a claim: A's term 1 still leads
            assert set(fresh_a.jobs()) == {"committed"}
            assert (fresh_a.epoch(), fresh_a.leader().contender) == (1, "jm-dead")  # type: ignore[union-attr]
        finally:
            fresh_a.close()
        held = _uncommitted(quick_abort.bootstrap, topic, reg_b.partition)
        assert held[dying.offset] == f"{a}/job/in-flight".encode()  # appended, then aborted
    finally:
        reg_b.close()

