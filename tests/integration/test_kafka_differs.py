"""What differs from Apache Kafka (README, "The embedded broker"), checked on Apache Kafka.

Each test here is the Kafka side of a bullet of that list; the embedded broker's side is in
the test the bullet names. On one Kafka node for the session (the ``kafka`` fixture), each
test on topics of its own:

* adding partitions (CreatePartitions, which the embedded broker refuses) moves a namespace,
  and every path refuses it (``NamespaceMoved``);
* a ``LogAppendTime`` topic: Kafka stamps the record (a record produced with timestamp 1000
  reads back stamped by the broker's clock), and a ``CreateTime`` topic is refused;
* the compacted topic as ``ensure_topic`` creates it (describe_configs);
* read_committed end offsets while a transaction is open: the last stable offset, never 0,
  never going back while a leader writes;
* Kafka's own tools read jobreg's topic: ``DumpLogSegments`` shows its records (no
  transaction markers but a zombie's aborted one), and the console consumer reads it
  read_committed.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import uuid

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

from registry import ConfigError, NamespaceMoved, Registry
from registry.dev.kafka import KafkaCluster, java_binary, kafka_tools_classpath
from registry.events import JobCancelled, now_ms
from registry.forensics import Forensics
from registry.kafka_config import Kafka
from registry.keys import partition_for, record_key
from registry.log import LogReader, TopicConfig, ensure_topic, transactional_id, write_raw
from registry.wire import encode

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

def _moved() -> str:
    """A namespace that 4 partitions and 8 map to different partitions."""
    return next(ns for ns in (f"ns{i}" for i in range(1000))
                if partition_for(ns, 4) != partition_for(ns, 8))

def test_adding_partitions_moves_a_namespace_and_every_path_refuses_it(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    """README "Scaling the topic", for real: the embedded broker refuses CreatePartitions, so
    tests/integration/test_placement.py writes what an alteration would leave; here Kafka
    adds the partitions."""
    ns = _moved()
    reg = Registry.connect(kafka.bootstrap, ns, topic=topic, topic_config=TopicConfig(
        partitions=4), blob_store=tmp_path)
    try:
        term = reg.claim_leadership("jm-1")
        term.submit("job-a", b"g")
        old = reg.partition
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.create_partitions([NewPartitions(topic, 8)])[topic].result(30)
        now = partition_for(ns, 8)
        said = (f"namespace {ns!r} was written under 4 partitions of topic {topic!r} "
                f"(partition {old}); the topic now has 8, which maps it to partition {now}")
        with pytest.raises(NamespaceMoved) as caught:
            Registry.connect(kafka.bootstrap, ns, topic=topic, blob_store=tmp_path)
        assert str(caught.value).startswith(said)
        with pytest.raises(NamespaceMoved, match="was written under 4 partitions"):
            Forensics.from_broker(Kafka(kafka.bootstrap), topic, ns, 10.0)
        # the running client: its next claim asks for the count again and refuses
        with pytest.raises(ConfigError, match=r"has 8 partitions now, not the 4"):
            reg.claim_leadership("jm-2")
        # what the refusal says to do works
        pinned = Registry.connect(kafka.bootstrap, ns, topic=topic, partitions=4,
                                  blob_store=tmp_path)
        try:
            assert pinned.partition == old and set(pinned.jobs()) == {"job-a"}
            assert pinned.claim_leadership("jm-2").epoch == 2
        finally:
            pinned.close()
    finally:
        reg.close()

def test_kafka_stamps_records_of_a_log_append_time_topic(kafka: KafkaCluster, topic: str
                                                          ) -> None:
    """The embedded broker keeps the producer's stamp (test_record_time.py); Kafka replaces
    it with its own clock's (the broker runs on this machine: its clock is ours)."""
    ensure_topic(kafka.bootstrap, topic, TopicConfig(partitions=1))
    before = now_ms()
    write_raw(kafka.bootstrap, topic, 0, "ns/job/a", b"x", timestamp=1000)
    after = now_ms()
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": str(uuid.uuid4()),
                         "enable.partition.eof": True, "log_level": 0})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        m = consumer.poll(60)
        assert m is not None and m.error() is None, m and m.error()
        kind, stamp = m.timestamp()
    finally:
        consumer.close()

    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert before - 1000 <= stamp <= after + 1000, (before, stamp, after)  # not 1000
    reader = LogReader(kafka.bootstrap, topic, 0)  # jobreg's reader sees the same stamp
    try:
        assert [r.timestamp for b in reader.read_to_end(30.0) for r in b] == [stamp]
    finally:
        reader.close()

def test_a_create_time_topic_is_refused_on_kafka(kafka: KafkaCluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, config={
        "cleanup.policy": "compact", "message.timestamp.type": "CreateTime"})])[topic].result(30)
    with pytest.raises(ConfigError, match="has message.timestamp.type=CreateTime; jobreg "
                                          "needs LogAppendTime"):
        Registry.connect(kafka.bootstrap, "prod", topic=topic)

def test_a_topic_just_created_is_described_at_once(kafka: KafkaCluster) -> None:
    """Kafka answers CreateTopics before every broker's metadata lists the topic (KRaft
    propagates it afterwards); ensure_topic then read the partition count of a topic the
    metadata did not list yet and raised KeyError (29 of 30 fresh topics on one node here).
    It now waits, within its timeout, until the metadata lists it."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    names = [f"jobreg-test-new-{uuid.uuid4().hex[:12]}" for _ in range(10)]
    try:
        for name in names:
            assert ensure_topic(kafka.bootstrap, name, TopicConfig(partitions=8)).partitions == 8
    finally:
        for future in admin.delete_topics(names).values():
            with contextlib.suppress(Exception):  # a topic the failure left uncreated
                future.result(30)


def test_the_topic_jobreg_creates_is_compacted_as_the_compaction_argument_needs(
        kafka: KafkaCluster, topic: str) -> None:
    """README "Compaction": the settings the argument rests on, as Kafka describes the topic
    ``ensure_topic`` created (set on the topic itself, not inherited from broker defaults)."""
    info = ensure_topic(kafka.bootstrap, topic, TopicConfig(partitions=3))
    assert (info.partitions, info.delete_retention_ms) == (3, 24 * 3600 * 1000)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    entries = admin.describe_configs([ConfigResource("topic", topic)])
    config = next(iter(entries.values())).result(30)
    wanted = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(7 * 24 * 3600 * 1000),
              "delete.retention.ms": str(24 * 3600 * 1000),
              "message.timestamp.type": "LogAppendTime"}
    assert {k: config[k].value for k in wanted} == wanted
    assert {config[k].source for k in wanted} == {ConfigSource.DYNAMIC_TOPIC_CONFIG.value}

def _end(consumer: Consumer, topic: str, partition: int) -> int:
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30,
                                                cached=False)
    return int(high)

def test_read_committed_end_offsets_are_the_last_stable_offset_never_0(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    """While a transaction is open on a partition, Kafka's read_committed ListOffsets answers
    the last stable offset (the open transaction's first record), where the embedded broker
    answers 0 (README "End offsets and time look-ups", "End offsets that go back"); and
    while a leader writes through the client, the answers never go back."""
    reg = Registry.connect(kafka.bootstrap, "ns-a", topic=topic, blob_store=tmp_path)
    committed = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": str(uuid.uuid4()),
                          "isolation.level": "read_committed", "log_level": 0})
    uncommitted = Consumer({"bootstrap.servers": kafka.bootstrap,
                            "group.id": str(uuid.uuid4()),
                            "isolation.level": "read_uncommitted", "log_level": 0})
    holder = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0, "log_level": 0,
                       "transactional.id": transactional_id(topic, "other")})
    try:
        term = reg.claim_leadership("jm-1")
        for i in range(3):
            term.submit(f"job-{i}", b"g")
        p = reg.partition
        holder.init_transactions(30)
        holder.begin_transaction()
        held: list[int] = []
        holder.produce(topic, b"held", b"other/job/held", partition=p,
                       on_delivery=lambda err, msg: held.append(msg.offset()))
        assert holder.flush(30) == 0 and held
        term_records = _end(uncommitted, topic, p)
        assert _end(committed, topic, p) == held[0] > 0  # the last stable offset
        assert term_records == held[0] + 1  # the high watermark counts the open record
        holder.commit_transaction(30)
        # A leader writes; the read_committed end asked meanwhile never goes back.
        done = threading.Event()
        errors: list[BaseException] = []

        def lead() -> None:
            try:
                for i in range(100):
                    term.submit(f"more-{i}", b"g")
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
            finally:
                done.set()

        writer = threading.Thread(target=lead)
        writer.start()
        answers = []
        while not done.is_set():
            answers.append(_end(committed, topic, p))
        writer.join()
        assert errors == []
        answers.append(_end(committed, topic, p))
        # (the holder's commit marker may land after its commit returned: >=, not >)
        assert answers[0] >= held[0] and answers == sorted(answers), answers
        assert answers[-1] > held[0]
        assert answers[-1] == _end(uncommitted, topic, p)  # nothing open: LSO = high mark
    finally:
        holder.close()
        committed.close()
        uncommitted.close()
        reg.close()

def _records_and_an_aborted_transaction(bootstrap: str, topic: str, tmp_path) -> tuple[
        Registry, int, int]:
    """A namespace written through the client (a grant, a call of two submits, a submit) with a
    zombie's cancel in between, in a transaction that was aborted. Returns the registry, its
    partition and the aborted record's offset."""
    reg = Registry.connect(bootstrap, "prod", topic=topic,
                           topic_config=TopicConfig(partitions=1), blob_store=tmp_path)
    term = reg.claim_leadership("jm-1")
    term.submit_many([("job-a", b"a"), ("job-b", b"b")])
    zombie = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log_level": 0,
                       "transactional.id": f"zombie-{uuid.uuid4()}"})
    try:
        zombie.init_transactions(30)
        zombie.begin_transaction()
        cancel = JobCancelled(event_id="zombie-cancel", namespace="prod", epoch=1,
                              writer="jm-1", created_at=now_ms(), job_id="job-a")
        aborted: list[int] = []
        zombie.produce(topic, encode(cancel), record_key(cancel).encode(), partition=0,
                       on_delivery=lambda err, msg: aborted.append(msg.offset()))
        assert zombie.flush(30) == 0 and aborted
        zombie.abort_transaction(30)
    finally:
        zombie.close()
    term.submit("job-c", b"c")  # committed after the abort marker
    return reg, reg.partition, aborted[0]

def _tool(main: str, *args: str) -> str:
    """Run one of Kafka's own tools (kafka-tools' ``main`` class) on the broker's jars."""
    classpath = ":".join(str(j) for j in kafka_tools_classpath())
    return subprocess.run([java_binary(), "-Xmx128m", "-cp", classpath, main, *args],
                          capture_output=True, text=True, timeout=180, check=True).stdout

def test_kafkas_dump_log_segments_shows_jobregs_records_and_transaction_markers(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    """Kafka's own segment dumper (``kafka-dump-log``: org.apache.kafka.tools.DumpLogSegments,
    in kafka-tools since Kafka 4.4, no longer kafka.tools in kafka_2.13) reads the partition
    jobreg wrote: idempotent, non-transactional batches with jobreg's keys (leaders write
    without transactions: README "The write path"), and the aborted zombie's transactional
    record followed by its ABORT marker."""
    reg, partition, aborted = _records_and_an_aborted_transaction(kafka.bootstrap, topic,
                                                                  tmp_path)
    reg.close()
    (node,) = kafka.nodes
    segments = sorted((node.log_dir / f"{topic}-{partition}").glob("*.log"))
    assert segments
    out = _tool("org.apache.kafka.tools.DumpLogSegments", "--files", str(segments[0]),
                "--print-data-log")
    records = [line for line in out.splitlines() if line.startswith("| offset:")]
    keys = [line.split(" key: ")[1].split(" payload: ")[0] for line in records
            if " key: " in line]
    for job in ("job-a", "job-b", "job-c"):  # each submit under its own birth key
        assert any(k.startswith(f"prod/job/{job}/birth/") for k in keys), out[-3000:]
    assert any(k.startswith("prod/term/1/") for k in keys)  # the grant
    assert any(k.startswith("prod/call/") for k in keys)  # submit_many's CallCommitted
    markers = [line for line in records if "endTxnMarker:" in line]
    assert not any("endTxnMarker: COMMIT" in m for m in markers), out[-3000:]
    abort = next(m for m in markers if "endTxnMarker: ABORT" in m)
    assert int(abort.split("offset: ")[1].split()[0]) > aborted
    assert f"| offset: {aborted} " in out and "isTransactional: true" in out
    assert "LogAppendTime:" in out

def test_kafkas_console_consumer_reads_the_topic_read_committed(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    """Kafka's console consumer (``kafka-console-consumer``), read_committed, reads exactly the
    records jobreg's reader reads, stamped LogAppendTime, and never the aborted one."""
    reg, partition, aborted = _records_and_an_aborted_transaction(kafka.bootstrap, topic,
                                                                  tmp_path)
    reader = LogReader(kafka.bootstrap, topic, partition)
    try:  # what jobreg's own reader reads
        ours = [(r.offset, r.key.decode()) for b in reader.read_to_end(30.0) for r in b]
        assert set(reg.jobs()) == {"job-a", "job-b", "job-c"}
    finally:
        reader.close()
        reg.close()
    out = _tool("org.apache.kafka.tools.consumer.ConsoleConsumer",
                "--bootstrap-server", kafka.bootstrap, "--topic", topic,
                "--partition", str(partition), "--offset", "earliest",
                "--isolation-level", "read_committed", "--max-messages", str(len(ours)),
                "--timeout-ms", "120000", "--formatter-property", "print.timestamp=true",
                "--formatter-property", "print.offset=true", "--formatter-property",
                "print.key=true", "--formatter-property", "print.value=false")
    lines = [line.split("\t") for line in out.splitlines() if line.strip()]
    assert {stamp.split(":")[0] for stamp, _o, _k in lines} == {"LogAppendTime"}, out
    theirs = [(int(offset.removeprefix("Offset:")), key) for _s, offset, key in lines]
    assert theirs == ours
    assert aborted not in {o for o, _k in theirs}
