"""The log reader against a real broker: it reads a long partition to its end from any offset."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from registry import ConfigError, Registry
from registry.log import LogReader, TopicConfig, check_bootstrap, ensure_topic

TRANSACTIONS = 1500  # one record each: 3,000 stored batches (record + commit marker)


@pytest.fixture(scope="module")
def long_partition(broker) -> str:
    topic = f"jobreg-test-long-{uuid.uuid4().hex[:12]}"
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=1), 10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0,
                         "transactional.id": f"{topic}-writer", "linger.ms": 0})
    producer.init_transactions(10)
    for i in range(TRANSACTIONS):
        producer.begin_transaction()
        producer.produce(topic, b"v%d" % i, b"k", partition=0)
        producer.commit_transaction(10)
    return topic


@pytest.mark.parametrize("start", [0, TRANSACTIONS])
def test_a_long_partition_reads_to_its_end_even_where_fetches_come_back_empty(
        broker, long_partition: str, start: int) -> None:
    """The embedded broker lists every stored batch of the partition on each fetch with data
    and, when that outlasts the fetch's wait, answers with no records although the high
    watermark says there are some (a loaded machine gets there sooner; this reader waits
    1 ms). A catch-up read notices that it makes no progress below the high watermark and
    waits longer per fetch until it ends. On Kafka a fetch with data returns at once,
    whatever its wait."""
    reader = LogReader(broker.bootstrap, long_partition, 0, start_offset=start,
                       fetch_wait_ms=1)
    try:
        values = [r.value for batch in reader.read_to_end(20.0) for r in batch]
        # Caught up, the reader waits 1 ms per fetch again, so syncs of a registry whose
        # timeout is short are not held for the lengthened wait at the end of the
        # partition (a torture campaign caught a leader that could not sync for good).
        assert reader.fetch_wait_ms == 1
    finally:
        reader.close()
    first = start // 2
    assert values == [b"v%d" % i for i in range(first, TRANSACTIONS)]


def test_a_sync_just_before_a_commit_marker_of_a_long_partition_reaches_the_end(
        broker, long_partition: str) -> None:
    """The same on a sync (what every read command and a write's catch-up do): a client whose
    position is the last transaction's commit marker asks for a fetch with data, which the
    embedded broker answers with nothing while it lists the partition for longer than the
    wait. A sync that never lengthened its wait timed out there for good (a fresh client
    started from a snapshot at the end of a 24,000-offset soak did)."""
    reader = LogReader(broker.bootstrap, long_partition, 0, start_offset=2 * TRANSACTIONS - 1,
                       fetch_wait_ms=1)
    try:
        assert [r for batch in reader.sync(20.0) for r in batch] == []
        assert reader.position == 2 * TRANSACTIONS - 1  # a marker is no record
        assert reader.fetch_wait_ms == 1  # and syncs at the end stay prompt
    finally:
        reader.close()


@pytest.mark.parametrize("good", ["h:1", "127.0.0.1:9092", "[::1]:9092", "a:1, b:2",
                                  "kafka-0.kafka.svc:9093"])
def test_well_formed_bootstraps_pass(good: str) -> None:
    assert check_bootstrap(good) == good.replace(" ", "")


@pytest.mark.parametrize("bad", ["", "foo", "foo:", ":1", "h:0", "h:65536", "h:x", "a b:1",
                                 "h:1,", "PLAINTEXT://h:1", None, 9092])
def test_a_malformed_bootstrap_is_refused_before_anything_waits(bad) -> None:
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        check_bootstrap(bad)
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        Registry(bad, "ns", partitions=1)  # type: ignore[arg-type]



def test_a_closed_reader_releases_its_client_at_once_even_in_a_cycle() -> None:
    """confluent-kafka frees a client's thread-local key (1,024 per process) only when the
    client object is freed. A reader whose owner sits in a reference cycle (a Registry and
    its terms) is freed only when the garbage collector gets to it: a fault campaign ran
    out of keys after ~1,000 clients ("Failed to initialize thread local storage"). With
    the collector held off, as it is for long-lived cycles, 1,100 readers opened and
    closed must not run out."""
    import gc

    gc.collect()
    gc.disable()
    try:
        for _ in range(1100):
            reader = LogReader("127.0.0.1:9", "no-broker-needed", 0)
            reader.cycle = reader  # type: ignore[attr-defined]
            reader.close()
    finally:
        gc.enable()
        gc.collect()
    with pytest.raises(RuntimeError, match="this reader is closed"):
        reader.poll(0)


@pytest.mark.integration
def test_closed_writers_release_their_producers(broker) -> None:
    import sys

    from registry.log import PlainWriter, TransactionalWriter

    topic = f"release-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=1))
    for writer in (PlainWriter(broker.bootstrap, 10.0, topic),
                   TransactionalWriter(broker.bootstrap, topic, "ns", 0)):
        producer = writer._producer
        writer.close()
        writer.close()  # twice is fine
        assert sys.getrefcount(producer) == 2  # ours and the call's: the writer let go


def test_writes_take_their_own_records_again_after_one_was_read_back(broker) -> None:
    """On a long partition the embedded broker answers fetches with data only when they wait
    long enough (here: 3,000 stored batches and a 1 ms wait, as at ~190,000 with the default
    5 ms). A write that must read its records back (another writer appended before it)
    lengthens its wait like any read, instead of timing out; and once it has read them, the
    writes after it take their own records again. Before, read-backs never lengthened their
    wait, and the reader forgot where the partition ended whenever it restored its wait, so
    from the first read-back on every write read back, timed out and synced: a
    100,000-write soak stalled at 13 s a write after 92,833. On Kafka fetches with data
    return at once whatever their wait, and the same holds."""
    topic, ns = f"jobreg-test-own-{uuid.uuid4().hex[:12]}", "own"
    first = Registry.connect(broker.bootstrap, ns, topic=topic)
    partition = first.partition
    first.close()
    filler = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0,
                       "transactional.id": f"{topic}-filler", "linger.ms": 0})
    filler.init_transactions(10)
    for _ in range(TRANSACTIONS):  # another namespace's records: the fold skips them
        filler.begin_transaction()
        filler.produce(topic, b"x", b"another-namespace/x", partition=partition)
        filler.commit_transaction(10)
    reg = Registry.connect(broker.bootstrap, ns, topic=topic, fetch_wait_ms=1, timeout=20)
    reader = reg._log.reader
    took: list[bool] = []
    timed_out: list[Exception] = []
    take_own, read_until = reader.take_own, reader.read_until

    def counting_take_own(records):
        took.append(take_own(records))
        return took[-1]

    def watched_read_until(offset, timeout):
        try:
            yield from read_until(offset, timeout)
        except Exception as e:
            timed_out.append(e)
            raise

    reader.take_own, reader.read_until = counting_take_own, watched_read_until
    try:
        term = reg.claim_leadership("w")
        term.submit("a", b"g")
        filler.begin_transaction()
        filler.produce(topic, b"x", b"another-namespace/x", partition=partition)
        filler.commit_transaction(10)
        took.clear()
        for i in range(1, 4):
            term.checkpoint_triggered("a", i)
        assert timed_out == []
        assert took == [False, True, True]  # read back once, then taken again
        image = reg.sync()
        assert list(image.rejected) == []
        assert image.jobs["a"].checkpoints.pending == (1, 2, 3)
    finally:
        reg.close()
