"""The ``jobreg-kafka`` Spark source against the embedded broker.

What is proven here (one SparkSession for the module, a fresh topic per test):

* ``Trigger.AvailableNow`` reads every record exactly once, in per-partition order, with
  Spark's Kafka schema, across partitions whose ranges contain transaction markers (offset
  gaps, also at the very end of a range); what it reads equals what a plain read_committed
  confluent-kafka consumer reads from the same broker (so the test holds whether or not
  the broker hides aborted records: Apache Kafka does, the embedded Tansu does not).
* ``maxOffsetsPerTrigger`` splits the backlog into batches of at most N offsets.
* A restarted query resumes from its checkpoint and reads only what is new.
* A ``processingTime`` trigger picks up records produced while the query runs.
* Bad options fail with messages naming the option; an unreachable broker fails the query
  (driver) or the read (executor) within a bounded time; ``failOnDataLoss`` fails or skips.
* Batch reads honour ``startingOffsets``/``endingOffsets`` and ``includeHeaders``.
* ``read_stream(source="kafka")`` without the connector names the package to add.
"""

from __future__ import annotations

import json
import random
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from support.sparkfixture import STARTUP, spark  # noqa: F401

from consumers.kafka_source import (
    KafkaInputGroup,
    KafkaInputPartition,
    KafkaOptionError,
    KafkaSource,
    KafkaUnavailableError,
    SourceOptions,
    group_ranges,
    rate_limit,
    read_partition,
)
from consumers.spark import (
    KafkaConnectorMissing,
    kafka_format_available,
    read_stream,
)
from registry.log import TopicConfig, ensure_topic

pytestmark = pytest.mark.integration

#: The output schema, written out as Spark's Kafka source documents it.
SPEC = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
])

Record = tuple[int, bytes, bytes]  # partition, key, value


# -- writing and reading the topic without Spark -------------------------------------------


def _delivered(offsets: list[tuple[int, int]]):
    def callback(err, msg) -> None:
        assert err is None, err
        offsets.append((msg.partition(), msg.offset()))
    return callback


def produce(bootstrap: str, topic: str, records: Iterable[Record], *, linger_ms: int = 20,
            headers: list[tuple[str, bytes | None]] | None = None) -> list[tuple[int, int]]:
    """Plain records; a linger lets several share one batch. Returns (partition, offset)s."""
    offsets: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms})
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition, headers=headers,
                         on_delivery=_delivered(offsets))
    assert producer.flush(15) == 0
    return offsets


def produce_txn(bootstrap: str, topic: str, records: Iterable[Record], *, commit: bool
                ) -> list[tuple[int, int]]:
    """One transaction, committed or aborted; each leaves a control record (an offset gap)."""
    offsets: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "transactional.id": f"jobreg-test-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(15)
    producer.begin_transaction()
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition,
                         on_delivery=_delivered(offsets))
    assert producer.flush(15) == 0
    if commit:
        producer.commit_transaction(15)
    else:
        producer.abort_transaction(15)
    return offsets


def committed_view(bootstrap: str, topic: str, partitions: int, ends: dict[int, int] | None = None
                   ) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
    """What a read_committed consumer reads from the beginning to the end: the oracle.

    ``ends`` (if given) receives each partition's end-of-partition offset.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oracle-{uuid.uuid4()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
    done: set[int] = set()
    deadline = time.monotonic() + 20
    try:
        while len(done) < partitions:
            assert time.monotonic() < deadline, "oracle did not reach the end of the topic"
            m = consumer.poll(0.1)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    done.add(m.partition())
                    if ends is not None:
                        ends[m.partition()] = m.offset()
                continue
            out[(m.partition(), m.offset())] = (m.key(), m.value())
    finally:
        consumer.close()
    return out


# -- running queries ---------------------------------------------------------------------


class Collect:
    """A ``foreachBatch`` function that keeps every batch's rows, in order."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list]] = []

    def __call__(self, df, batch_id: int) -> None:
        self.batches.append((batch_id, df.collect()))

    @property
    def rows(self) -> list:
        return [row for _bid, rows in self.batches for row in rows]

    def records(self) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
        rows = self.rows
        out = {(r.partition, r.offset): (r.key, r.value) for r in rows}
        assert len(out) == len(rows), "a record was delivered twice"
        return out


def stream(session, bootstrap: str, topic: str, **options):
    reader = (session.readStream.format("jobreg-kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df, checkpoint=None, timeout: float = 120) -> Collect:
    collect = Collect()
    writer = df.writeStream.foreachBatch(collect).trigger(availableNow=True)
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", str(checkpoint))
    query = writer.start()
    try:
        assert query.awaitTermination(timeout), f"query still running after {timeout} s"
    finally:
        query.stop()
    return collect


def assert_partition_order(collect: Collect) -> None:
    by_partition: dict[int, list[int]] = defaultdict(list)
    for row in collect.rows:
        by_partition[row.partition].append(row.offset)
    for partition, offsets in by_partition.items():
        assert offsets == sorted(set(offsets)), f"partition {partition} out of order: {offsets}"


def assert_partitions_whole(collect: Collect) -> None:
    """Within each batch, each partition's rows come together (Spark keeps a task's rows in
    order within one collect): what the audit job's fold tasks rely on."""
    for _bid, rows in collect.batches:
        seen: list[int] = []
        for row in rows:
            if not seen or seen[-1] != row.partition:
                assert row.partition not in seen, [r.partition for r in rows]
                seen.append(row.partition)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_topic(bootstrap: str, name: str, partitions: int) -> str:
    ensure_topic(bootstrap, name, TopicConfig(partitions=partitions))
    return name


# -- streaming -----------------------------------------------------------------------------


@pytest.mark.parametrize("grouped", [{}, {"maxPartitions": "2"}], ids=["one-per-partition",
                                                                       "maxPartitions=2"])
def test_available_now_reads_every_record_once(spark, broker, topic, grouped):  # noqa: F811
    """Also with ``maxPartitions``: three partitions in two tasks, one of which reads two
    partitions with one consumer, each range ending in a transaction marker."""
    bootstrap = broker.bootstrap
    new_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, [(i % 3, b"k%d" % i, b"v%d" % i) for i in range(15)])
    produce_txn(bootstrap, topic, [(1, b"a0", b"aborted-0"), (1, b"a1", b"aborted-1")],
                commit=False)
    produce_txn(bootstrap, topic, [(0, b"c0", b"committed-0"), (0, b"c1", b"committed-1"),
                                   (2, b"c2", b"committed-2")], commit=True)
    ends: dict[int, int] = {}
    expected = committed_view(bootstrap, topic, 3, ends)

    df = stream(spark, bootstrap, topic, **grouped)
    assert df.schema == SPEC
    started = time.monotonic()
    collect = run_available_now(df)
    print(f"availableNow query: {time.monotonic() - started:.1f} s, "
          f"session start {STARTUP.get('seconds', 0):.1f} s")

    got = collect.records()
    assert got == expected
    values = {v for _k, v in got.values()}
    assert {b"committed-0", b"committed-1", b"committed-2"} <= values
    aborted = {b"aborted-0", b"aborted-1"} & values
    assert aborted in (set(), {b"aborted-0", b"aborted-1"})  # the broker's read_committed view
    assert_partition_order(collect)
    assert_partitions_whole(collect)
    for partition in range(3):  # every partition ends in a transaction marker: an offset gap
        assert max(o for p, o in got if p == partition) + 1 < ends[partition]
    row = collect.rows[0]
    assert row.topic == topic and row.timestamp is not None and row.timestampType in (0, 1)


def test_max_offsets_per_trigger_splits_the_backlog(spark, broker, topic):  # noqa: F811
    bootstrap = broker.bootstrap
    new_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [(0, b"k%d" % i, b"v%d" % i) for i in range(15)])
    produce(bootstrap, topic, [(1, b"k%d" % i, b"v%d" % i) for i in range(8)])
    produce_txn(bootstrap, topic, [(1, b"t", b"txn")], commit=True)
    expected = committed_view(bootstrap, topic, 2)

    collect = run_available_now(stream(spark, bootstrap, topic, maxOffsetsPerTrigger=6))
    sizes = [len(rows) for _bid, rows in collect.batches]
    assert max(sizes) <= 6, sizes
    assert len(sizes) >= 4, sizes  # 25 offsets, 6 per batch
    assert collect.records() == expected
    assert_partition_order(collect)


def test_restart_reads_only_new_records(spark, broker, topic, tmp_path):  # noqa: F811
    bootstrap = broker.bootstrap
    new_topic(bootstrap, topic, 2)
    checkpoint = tmp_path / "checkpoint"
    produce(bootstrap, topic, [(i % 2, b"old%d" % i, b"old") for i in range(6)])
    first = committed_view(bootstrap, topic, 2)
    assert run_available_now(stream(spark, bootstrap, topic), checkpoint).records() == first

    produce(bootstrap, topic, [(i % 2, b"new%d" % i, b"new") for i in range(5)])
    produce_txn(bootstrap, topic, [(0, b"new-t", b"new")], commit=True)
    both = committed_view(bootstrap, topic, 2)
    second = run_available_now(stream(spark, bootstrap, topic), checkpoint)
    assert second.records() == {k: v for k, v in both.items() if k not in first}
    assert {v for _k, v in second.records().values()} == {b"new"}

    third = run_available_now(stream(spark, bootstrap, topic), checkpoint)
    assert third.rows == []


def test_processing_time_trigger_sees_records_produced_while_running(
        spark, broker, topic, tmp_path):  # noqa: F811
    bootstrap = broker.bootstrap
    new_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [(0, b"before", b"before")])
    collect = Collect()
    query = (stream(spark, bootstrap, topic).writeStream.foreachBatch(collect)
             .trigger(processingTime="1 second")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        deadline = time.monotonic() + 60
        while not collect.rows:
            assert time.monotonic() < deadline, "the first record never arrived"
            assert query.isActive, query.exception()
            time.sleep(0.2)
        produce(bootstrap, topic, [(i % 2, b"while%d" % i, b"while") for i in range(6)])
        produce_txn(bootstrap, topic, [(1, b"while-t", b"while")], commit=True)
        expected = committed_view(bootstrap, topic, 2)
        while len(collect.rows) < len(expected):
            assert time.monotonic() < deadline, f"got {len(collect.rows)} of {len(expected)}"
            assert query.isActive, query.exception()
            time.sleep(0.2)
    finally:
        query.stop()
    assert collect.records() == expected
    assert len(collect.batches) >= 2
    assert_partition_order(collect)


# -- options and failures ------------------------------------------------------------------


BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


@pytest.mark.parametrize(("options", "message"), [
    ({"subscribe": "t"}, "'kafka.bootstrap.servers' is required"),
    ({"kafka.bootstrap.servers": "127.0.0.1:9092"}, "'subscribe' is required"),
    ({**BASE, "subscribe": "a,b"}, "must name one topic"),
    ({**BASE, "assign": '{"t": [0]}'}, "'assign' is not supported"),
    ({**BASE, "startingOffsets": "newest"}, "'startingOffsets' must be 'earliest' or 'latest'"),
    ({**BASE, "startingOffsets": '{"other": {"0": 1}}'}, "exactly the subscribed topic"),
    ({**BASE, "startingOffsets": '{"t": {"0": -3}}'}, "must be an integer >= 0"),
    ({**BASE, "startingOffsets": '{"t": {"0": '}, "not valid JSON"),
    ({**BASE, "maxOffsetsPerTrigger": "-5"}, "'maxOffsetsPerTrigger' must be >= 1"),
    ({**BASE, "maxOffsetsPerTrigger": "ten"}, "'maxOffsetsPerTrigger' must be an integer"),
    ({**BASE, "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be 'true' or 'false'"),
    ({**BASE, "maxPartitions": "0"}, "'maxPartitions' must be >= 1"),
    ({**BASE, "kafka.auto.offset.reset": "latest"}, "use 'startingOffsets'"),
    ({**BASE, "startingOffset": "earliest"}, "unknown option 'startingoffset'"),
])
def test_bad_options_are_refused_clearly(options, message):
    with pytest.raises(KafkaOptionError, match=message):
        KafkaSource(options)


def test_option_case_and_kafka_passthrough():
    opts = SourceOptions.parse({**BASE, "STARTINGOFFSETS": '{"t": {"1": 5, "0": -2}}',
                                "kafka.fetch.wait.max.ms": "20", "maxOffsetsPerTrigger": "7"})
    assert opts.starting == {0: -2, 1: 5}
    assert opts.max_offsets_per_trigger == 7
    conf = opts.consumer_config("test")
    assert conf["fetch.wait.max.ms"] == "20" and conf["isolation.level"] == "read_committed"
    assert conf["enable.auto.commit"] is False and conf["auto.offset.reset"] == "error"
    with pytest.raises(KafkaOptionError, match="only for batch queries"):
        SourceOptions.parse({**BASE, "endingOffsets": "latest"}).check_streaming()
    with pytest.raises(KafkaOptionError, match="cannot be 'latest' for a batch"):
        SourceOptions.parse({**BASE, "startingOffsets": "latest"}).check_batch()


def test_bad_options_surface_through_spark(spark):  # noqa: F811
    with pytest.raises(Exception, match="kafka.bootstrap.servers' is required"):
        spark.readStream.format("jobreg-kafka").option("subscribe", "t").load()
    with pytest.raises(Exception, match="'maxOffsetsPerTrigger' must be >= 1"):
        (spark.readStream.format("jobreg-kafka").options(**BASE)
         .option("maxOffsetsPerTrigger", "0").load())
    # checked when the query starts (streaming or batch is known only then)
    query = (spark.readStream.format("jobreg-kafka").options(**BASE)
             .option("endingOffsets", "latest").load()
             .writeStream.foreachBatch(Collect()).trigger(availableNow=True).start())
    try:
        with pytest.raises(Exception) as failed:
            query.awaitTermination(60)
    finally:
        query.stop()
    assert "option 'endingOffsets' is only for batch queries" in str(failed.value)
    assert "UnboundLocalError" not in str(failed.value)


def test_unreachable_broker_fails_the_query_quickly(spark):  # noqa: F811
    bootstrap = f"127.0.0.1:{closed_port()}"
    df = stream(spark, bootstrap, "nowhere", **{"fetchOffset.timeoutMs": "1500",
                                                "fetchOffset.numRetries": "1"})
    started = time.monotonic()
    query = df.writeStream.foreachBatch(Collect()).trigger(availableNow=True).start()
    try:
        with pytest.raises(Exception) as failed:
            query.awaitTermination(60)
    finally:
        query.stop()
    elapsed = time.monotonic() - started
    assert elapsed < 30, elapsed
    assert f"no Kafka broker at {bootstrap} answered" in str(failed.value)


def test_unreachable_broker_fails_an_executor_read_quickly():
    bootstrap = f"127.0.0.1:{closed_port()}"
    opts = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": "t",
                                "kafkaConsumer.pollTimeoutMs": "1500"})
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="nothing arrived for 1500 ms"):
        list(read_partition(opts, SPEC, KafkaInputPartition("t", 0, 0, 10)))
    assert time.monotonic() - started < 10


def test_a_group_reads_its_ranges_whole_one_after_the_other(broker, topic):
    """One consumer reads a group's ranges in turn, each whole, in offset order, in the
    group's order; a range that stops before its partition's end (the consumer fetched
    ahead) or at a transaction marker hands over cleanly to the next."""
    bootstrap = broker.bootstrap
    new_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, [(i % 3, b"k%d" % i, b"v%d" % i) for i in range(300)])
    produce_txn(bootstrap, topic, [(2, b"t", b"txn")], commit=True)  # p2 ends in a marker
    opts = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    group = KafkaInputGroup((KafkaInputPartition(topic, 0, 10, 20),
                             KafkaInputPartition(topic, 1, 0, 100),
                             KafkaInputPartition(topic, 2, 95, 102)))
    rows = [(p, o) for batch in read_partition(opts, SPEC, group)
            for p, o in zip(batch.column("partition").to_pylist(),
                            batch.column("offset").to_pylist(), strict=True)]
    assert rows == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(100)] + \
        [(2, o) for o in range(95, 101)]


def test_group_ranges_keeps_each_partition_whole_and_balances_the_groups():
    rng = random.Random(11)
    for _ in range(300):
        ranges = [KafkaInputPartition("t", p, b, b + rng.choice([1, 5, 100, 1000]))
                  for p, b in enumerate(rng.sample(range(10_000), rng.randint(1, 12)))]
        most = rng.randint(1, 6)
        planned = group_ranges(ranges, most)
        if len(ranges) <= most:
            assert planned == ranges  # Spark's plan: one input partition per Kafka partition
            continue
        assert len(planned) == most and all(isinstance(g, KafkaInputGroup) for g in planned)
        members = [r for g in planned for r in g.ranges]
        assert sorted(members, key=lambda r: r.partition) == ranges  # each once, whole
        for g in planned:
            assert [r.partition for r in g.ranges] == sorted(r.partition for r in g.ranges)
        sizes = [sum(r.end - r.start for r in g.ranges) for g in planned]
        assert max(sizes) - min(sizes) <= max(r.end - r.start for r in ranges)
    assert group_ranges([], 2) == []
    assert group_ranges([KafkaInputPartition("t", 0, 0, 5)], None) == \
        [KafkaInputPartition("t", 0, 0, 5)]


def test_fail_on_data_loss(spark, broker, topic):  # noqa: F811
    """A start offset past the partition's end (as after a topic was re-created) is data
    loss: the query fails, or with failOnDataLoss=false skips that partition's range."""
    bootstrap = broker.bootstrap
    new_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(6)])
    starting = json.dumps({topic: {"0": 100, "1": -2}})
    query = (stream(spark, bootstrap, topic, startingOffsets=starting).writeStream
             .foreachBatch(Collect()).trigger(availableNow=True).start())
    try:
        with pytest.raises(Exception, match=r"offset was changed from 100 to 3.*failOnDataLoss"):
            query.awaitTermination(60)
    finally:
        query.stop()
    skipped = run_available_now(stream(spark, bootstrap, topic, startingOffsets=starting,
                                       failOnDataLoss="false"))
    assert sorted((r.partition, r.offset) for r in skipped.rows) == [(1, 0), (1, 1), (1, 2)]


# -- batch ---------------------------------------------------------------------------------


def test_batch_read_with_offsets_and_headers(spark, broker, topic):  # noqa: F811
    bootstrap = broker.bootstrap
    new_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(8)],
            headers=[("h", b"1"), ("empty", None)])
    produce_txn(bootstrap, topic, [(0, b"t", b"txn")], commit=True)
    expected = committed_view(bootstrap, topic, 2)

    everything = (spark.read.format("jobreg-kafka").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic).option("includeHeaders", "true").load())
    assert everything.schema == StructType([*SPEC.fields, StructField("headers", ArrayType(
        StructType([StructField("key", StringType()), StructField("value", BinaryType())])))])
    rows = everything.collect()
    assert {(r.partition, r.offset): (r.key, r.value) for r in rows} == expected
    plain = next(r for r in rows if r.key == b"k0")
    assert [(h.key, h.value) for h in plain.headers] == [("h", b"1"), ("empty", None)]
    assert next(r for r in rows if r.key == b"t").headers is None

    window = (spark.read.format("jobreg-kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", json.dumps({topic: {"0": 1, "1": -2}}))
              .option("endingOffsets", json.dumps({topic: {"0": 3, "1": 2}})).load())
    assert sorted((r.partition, r.offset) for r in window.collect()) == \
        [(0, 1), (0, 2), (1, 0), (1, 1)]


# -- the session helper --------------------------------------------------------------------


def test_read_stream_picks_the_python_source_and_names_the_missing_connector(
        spark, broker, topic):  # noqa: F811
    if kafka_format_available(spark):
        pytest.skip("Spark's kafka connector is on the classpath here")
    with pytest.raises(KafkaConnectorMissing,
                       match=r"org\.apache\.spark:spark-sql-kafka-0-10_2\.13:4\.\d+\.\d+"):
        read_stream(spark, broker.bootstrap, topic, source="kafka")
    new_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [(0, b"k", b"v")])
    df = read_stream(spark, broker.bootstrap, topic, fetch_wait_max_ms=10,
                     options={"failOnDataLoss": False})
    assert df.schema == SPEC
    assert [(r.key, r.value) for r in run_available_now(df).rows] == [(b"k", b"v")]


# -- admission control, without Spark ------------------------------------------------------


def test_rate_limit_never_exceeds_the_limit_and_starves_no_partition():
    rng = random.Random(7)
    for _ in range(500):
        parts = rng.randint(1, 6)
        begins = {p: rng.randint(0, 50) for p in range(parts)}
        ends = {p: begins[p] + rng.choice([0, 0, 1, 2, 10, 1000]) for p in range(parts)}
        limit = rng.randint(1, 40)
        capped = rate_limit(limit, begins, ends)
        taken = {p: capped[p] - begins[p] for p in range(parts)}
        backlog = {p: ends[p] - begins[p] for p in range(parts)}
        assert all(0 <= taken[p] <= backlog[p] for p in range(parts))
        total = sum(backlog.values())
        assert sum(taken.values()) == min(limit, total)
        waiting = [p for p in range(parts) if backlog[p] > 0]
        if limit >= len(waiting):
            assert all(taken[p] >= 1 for p in waiting)
    assert rate_limit(10, {0: 0, 1: 0}, {0: 90, 1: 10}) == {0: 9, 1: 1}
    assert rate_limit(10, {0: 5}, {0: 3}) == {0: 3}  # moved backwards: left to partitions()


def test_timestamp_type_ids_follow_kafka():
    from consumers.kafka_source import _TS_TYPES
    assert _TS_TYPES == {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}
