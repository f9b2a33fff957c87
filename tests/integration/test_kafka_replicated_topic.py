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
