"""The write path on Apache Kafka (README "The write path", "What differs on Apache Kafka").

A term writes with an idempotent producer, ``acks=all``, and no transaction: nothing is fenced
at the broker, and the fold fences. The embedded broker's tests (test_outcomes.py,
test_election.py, test_group_commit.py) show the answers whatever the broker does, and run on
Kafka in the suite's Kafka pass; these show what Apache Kafka itself does with them:

* a zombie leader's write is appended after the new term's grant and refused there by the
  fold (``stale_epoch``), visibly, with its reason; the call answers ``Fenced``, and the new
  term's next write settles the key the refused record landed on;
* an acknowledged write is answered only once every read_committed reader can read it: a
  transaction of another producer left open before it on the partition (a tool's, or a
  leader of a version that wrote in transactions, SIGKILLed) holds the last stable offset,
  and the write waits, reading its records back, until Kafka aborts that transaction after
  its ``transaction.timeout.ms``.

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
from registry.errors import Fenced

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

PATIENCE = 120.0  # seconds: only a hang reaches it
DIES = Path(__file__).parent.parent / "support" / "procs" / "dies_in_a_transaction.py"


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


def test_a_zombies_write_lands_after_the_grant_and_is_refused_visibly(on_kafka) -> None:
    """The old term has not read the new grant, so it sends: its cancel is appended after the
    grant (no broker fences it), the fold refuses it as ``stale_epoch`` with both epochs, the
    call answers Fenced naming its record. The cancel lies under an end key of its own, so it
    supersedes no record of the job and leaves nothing to restate (README "Compaction")."""
    old, new = on_kafka(), on_kafka()
    term = old.claim_leadership("jm-old")
    term.submit("job-a", b"a")
    new_term = new.claim_leadership("jm-new")
    grant_at = new.sync().term.granted_offset  # type: ignore[union-attr]
    with pytest.raises(Fenced) as caught:
        term.cancel("job-a")
    assert (caught.value.expected_epoch, caught.value.actual_epoch) == (2, 1)
    assert caught.value.event_ids
    fresh = on_kafka()
    assert fresh.job("job-a").status == "ACTIVE"
    refused = [d for d in fresh.forensics().decisions()
               if d.event_id in caught.value.event_ids]
    assert refused and all(not d.accepted and d.reason == "stale_epoch" and d.offset > grant_at
                           for d in refused), refused
    keys = _uncommitted(old.bootstrap, old.topic, old.partition)
    assert sum(k.startswith(b"prod/job/job-a/birth/") for k in keys.values()) == 1  # the submit
    assert sum(k.startswith(b"prod/job/job-a/end/") for k in keys.values()) == 1  # the cancel
    assert not fresh.sync().unsettled
    new_term.submit("job-b", b"b")
    assert not fresh.sync().unsettled


class _Dying:
    """Another producer (tests/support/procs/dies_in_a_transaction.py) that appends one record
    with key ``key`` to ``partition`` in a transaction of its own, with the transaction timeout
    ``txn_ms``, and stops with it open; :meth:`kill` SIGKILLs it (by pid)."""

    def __init__(self, bootstrap: str, topic: str, partition: int, key: str,
                 txn_ms: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(DIES), bootstrap, topic, str(partition), key, str(txn_ms)],
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
            raise AssertionError("the producer did not open its transaction: "
                                 + (self.proc.stderr.read() if self.proc.stderr else "")
                                 ) from None
        assert self.open["event"] == "open" and self.open["left"] == 0, self.open
        self.offset: int = self.open["offset"]

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


@pytest.fixture(scope="module")
def quick_abort() -> Iterator[KafkaCluster]:
    """One Kafka node whose transaction coordinator looks for timed-out transactions every
    0.5 s (Kafka's default: 10 s), so that a short transaction timeout ends a hold soon."""
    with KafkaCluster(nodes=1, config={
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}) as k:
        yield k


def test_an_acknowledged_write_waits_for_another_producers_open_transaction(
        quick_abort: KafkaCluster, topic: str, tmp_path) -> None:
    """Another producer dies with its transaction open on the leader's partition (a timeout
    of 5 s here). The leader's next write is acknowledged (acks=all: below the high
    watermark) but lies above the last stable offset, so the write does not take its records
    as read: it reads them back, and answers with its receipt once the broker has aborted the
    other transaction, instead of answering before a read_committed reader could read it."""
    reg = Registry.connect(quick_abort.bootstrap, "prod", topic=topic, blob_store=tmp_path)
    try:
        term = reg.claim_leadership("jm")
        term.submit("before", b"g")
        dying = _Dying(quick_abort.bootstrap, topic, reg.partition, "foreign/x", 5_000)
        dying.kill()
        writer, reading_back, answer = _held_write(term, "behind")
        assert reading_back.wait(PATIENCE), answer
        writer.join(PATIENCE)
        assert not writer.is_alive(), "the write still waits after Kafka's abort"
        assert "error" not in answer, answer.get("error")
        assert answer["receipt"].offset > dying.offset  # it lay behind the open transaction
        fresh = Registry.connect(quick_abort.bootstrap, "prod", topic=topic,
                                 blob_store=tmp_path)
        try:
            assert set(fresh.jobs()) == {"before", "behind"}
        finally:
            fresh.close()
        held = _uncommitted(quick_abort.bootstrap, topic, reg.partition)
        assert held[dying.offset] == b"foreign/x"  # appended, then aborted
    finally:
        reg.close()
