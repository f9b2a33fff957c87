"""The registry topic on Apache Kafka's three nodes (replication 3, ``min.insync.replicas=2``).

Found by the fault campaign on Kafka (issue 34): ``ensure_topic`` read the metadata once
right after CreateTopics; the broker that answered often did not know the new topic yet
(CreateTopics returns once the controller has it; each broker learns it from the metadata
log a moment later), and the call failed with a ``KeyError`` (29 of 40 fresh topics on an
idle cluster).
"""

from __future__ import annotations

import uuid

import pytest

from registry.client import Registry
from registry.dev.kafka import KafkaCluster
from registry.log import TopicConfig, ensure_topic

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


def test_ensure_topic_returns_a_new_replicated_topic_once_the_metadata_lists_it(
        kafka3: KafkaCluster) -> None:
    for _ in range(12):
        topic = f"replicated-{uuid.uuid4().hex[:8]}"
        info = ensure_topic(kafka3.bootstrap, topic, TopicConfig(replication_factor=3),
                            timeout=30.0)
        assert info.partitions == 8


def test_a_client_connects_to_a_topic_it_creates_on_three_nodes(kafka3: KafkaCluster) -> None:
    for _ in range(4):
        topic = f"replicated-{uuid.uuid4().hex[:8]}"
        with Registry.connect(kafka3.bootstrap, "prod", topic=topic,
                              topic_config=TopicConfig(replication_factor=3),
                              timeout=30.0) as reg:
            assert reg.sync().epoch == 0



def test_a_sync_on_three_nodes_ends_while_another_transaction_is_open(
        kafka3: KafkaCluster) -> None:
    """On several brokers a read takes an end of partition only once ListOffsets (the last
    stable offset) confirms it (a new leader can start behind the old one's high watermark:
    registry/log.py). A transaction left open by another producer holds the last stable
    offset at its first record: the read ends there at once, and reads past it once it
    commits."""
    import time

    from confluent_kafka import Producer

    from registry.keys import partition_for
    from registry.log import LogReader

    topic = f"open-txn-{uuid.uuid4().hex[:8]}"
    info = ensure_topic(kafka3.bootstrap, topic, TopicConfig(replication_factor=3),
                        timeout=30.0)
    part = partition_for("prod", info.partitions)
    with Registry.connect(kafka3.bootstrap, "prod", topic=topic, timeout=10.0) as reg:
        reg.claim_leadership("jm-1").submit("job-1", graph=b"g")
    other = Producer({"bootstrap.servers": kafka3.bootstrap, "transactional.id": topic})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(topic, b"v", key=b"other/k", partition=part)
    other.flush(30)
    reader = LogReader(kafka3.bootstrap, topic, part)
    try:
        started = time.monotonic()
        before = [r.offset for batch in reader.sync(10.0) for r in batch]
        assert time.monotonic() - started < 5, "a sync waited for another's transaction"
        other.commit_transaction(30)
        deadline = time.monotonic() + 30
        after: list[int] = []
        while not after:
            assert time.monotonic() < deadline, "the committed record never came"
            after = [r.offset for batch in reader.sync(10.0) for r in batch]
        assert before and after[0] > before[-1]
    finally:
        reader.close()


def _replication(bootstrap: str, topic: str) -> tuple[set[int], str, int]:
    """The replica counts of the topic's partitions, its ``min.insync.replicas`` and where
    that value comes from (a ``ConfigSource``)."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    config = next(iter(admin.describe_configs([ConfigResource("topic", topic)])
                       .values())).result(30)
    return ({len(p.replicas) for p in meta.partitions.values()},
            config["min.insync.replicas"].value, config["min.insync.replicas"].source)


def test_a_topic_jobreg_creates_on_three_nodes_has_three_replicas_two_in_sync(
        kafka3: KafkaCluster) -> None:
    """Issue 42, finding 6: a coordinator that connects before the operator created the topic
    made it with one replica (``TopicConfig().replication_factor`` was 1), which ``acks=all``
    acknowledges from one broker without fsync. On a cluster of several brokers the topic gets
    min(3, brokers) replicas and ``min.insync.replicas`` 2, set on the topic itself."""
    from confluent_kafka.admin import ConfigSource

    topic = f"replicated-{uuid.uuid4().hex[:8]}"
    with Registry.connect(kafka3.bootstrap, "prod", topic=topic, timeout=30.0) as reg:
        reg.claim_leadership("jm-1")
    assert _replication(kafka3.bootstrap, topic) == (
        {3}, "2", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)


def _refused(bootstrap: str, topic: str) -> str:
    from registry.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        Registry.connect(bootstrap, "prod", topic=topic, timeout=30.0).close()
    said = str(caught.value)
    assert "\n" not in said, said
    return said


def _create(bootstrap: str, topic: str, replicas: int, **config: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=replicas,
                                  config={**TopicConfig().kafka_config(), **config})]
                        )[topic].result(30)


def test_an_existing_topic_with_one_replica_on_three_nodes_is_refused(
        kafka3: KafkaCluster) -> None:
    topic = f"one-replica-{uuid.uuid4().hex[:8]}"
    _create(kafka3.bootstrap, topic, 1)
    said = _refused(kafka3.bootstrap, topic)
    assert f"topic {topic!r} has replication factor 1" in said
    assert "jobreg needs at least 3 (min(3, the 3 brokers):" in said
    assert "kafka-reassign-partitions" in said


def test_an_existing_replicated_topic_with_one_in_sync_replica_is_refused(
        kafka3: KafkaCluster) -> None:
    """``min.insync.replicas=1``: ``acks=all`` is answered by the leader alone once the others
    fell out of sync, and that leader's loss loses the acknowledged write."""
    topic = f"min-isr-1-{uuid.uuid4().hex[:8]}"
    _create(kafka3.bootstrap, topic, 3, **{"min.insync.replicas": "1"})
    said = _refused(kafka3.bootstrap, topic)
    assert f"topic {topic!r} has min.insync.replicas=1" in said
    assert "jobreg needs at least 2" in said
    assert (f"--entity-name {topic} --add-config min.insync.replicas=2") in said


def test_a_test_cluster_may_take_a_degenerate_topic_with_a_warning(
        kafka3: KafkaCluster) -> None:
    topic = f"one-replica-{uuid.uuid4().hex[:8]}"
    _create(kafka3.bootstrap, topic, 1)
    with Registry.connect(kafka3.bootstrap, "prod", topic=topic, timeout=30.0,
                          topic_config=TopicConfig(check="warn")) as reg:
        reg.claim_leadership("jm-1")
