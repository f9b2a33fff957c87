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
