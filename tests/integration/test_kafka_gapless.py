"""Gaps in a producer's series, on Apache Kafka (issue 42, finding 7).

Without ``enable.gapless.guarantee``, librdkafka meets a batch the broker refuses for good by
bumping the idempotent producer's epoch and renumbering what follows, so later batches of the
same producer land while the refused one never does. A call of several records split across
batches then lands torn: its commit and some of its records without the others, and fold rule
8 applies the present records alone (after compaction it cannot tell a record that never
landed from one compacted away). With the guarantee the refusal is a fatal error of the
producer: nothing after it lands, and the write fails (``WriteFailed``; the call
``OutcomeUnknown``), the producer retired as after any failed write.

The refusal here is the broker's ``MESSAGE_TOO_LARGE`` for a batch over the topic's
``max.message.bytes`` (an operator may lower it; a revoked ACL or a corrupt batch does the
same); ``batch.num.messages=1`` puts each record in a batch of its own, as a call larger than
``batch.size`` is split.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from registry import Registry
from registry.dev.kafka import KafkaCluster
from registry.errors import RegistryError
from registry.kafka_config import Kafka
from registry.log import LeaderWriter, LogReader, TopicConfig, WriteFailed

pytestmark = [pytest.mark.kafka, pytest.mark.integration, pytest.mark.timeout(180)]

BIG = b"x" * 4000  # over the topic's max.message.bytes
LIMIT = "2048"


def _small_message_topic(kafka: KafkaCluster) -> str:
    topic = f"gapless-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config={
        **TopicConfig().kafka_config(1), "max.message.bytes": LIMIT})])[topic].result(30)
    return topic


def _keys(kafka: KafkaCluster, topic: str) -> list[str]:
    reader = LogReader(kafka.bootstrap, topic, 0)
    try:
        return [r.key for batch in reader.read_to_end(30.0) for r in batch]
    finally:
        reader.close()


def test_a_refused_batch_is_not_skipped_by_the_batches_after_it(kafka: KafkaCluster) -> None:
    topic = _small_message_topic(kafka)
    writer = LeaderWriter(Kafka(kafka.bootstrap, {"batch.num.messages": "1"}), topic, 0,
                          timeout=20.0)
    try:
        with pytest.raises(WriteFailed):
            writer.write([("ns/job/big", BIG), ("ns/job/small", b"s"), ("ns/call/c", b"c")])
        assert not writer.usable  # retired: a new producer for the next write
    finally:
        writer.close()
    assert _keys(kafka, topic) == [], "records after the refused one landed: a gap"


def test_nothing_after_a_refused_batch_lands_once_the_producer_has_written(
        kafka: KafkaCluster) -> None:
    """The gap-less guarantee itself: the partition's leader holds the producer's sequence
    (it wrote before), refuses the batch after the refused one as out of order, and
    librdkafka stops the producer instead of renumbering that batch (it landed without the
    guarantee: keys a, b, small, c)."""
    topic = _small_message_topic(kafka)
    writer = LeaderWriter(Kafka(kafka.bootstrap, {"batch.num.messages": "1"}), topic, 0,
                          timeout=20.0)
    try:
        writer.write([("ns/job/a", b"a")])
        with pytest.raises(WriteFailed, match="the producer stopped: _GAPLESS_GUARANTEE"):
            writer.write([("ns/job/b", b"b"), ("ns/job/big", BIG), ("ns/job/small", b"s"),
                          ("ns/call/c", b"c")])
        assert not writer.usable
    finally:
        writer.close()
    # b, before the refused batch, is a call's record without its commit: never applied
    assert _keys(kafka, topic) == [b"ns/job/a", b"ns/job/b"]


def test_a_call_split_across_batches_never_lands_torn(kafka: KafkaCluster, tmp_path) -> None:
    """The call: two submits and its commit, one batch each; the first is refused. Without the
    guarantee the second submit and the commit landed, and every reader had job-small alone,
    from a call that failed."""
    topic = _small_message_topic(kafka)
    with Registry.connect(kafka.bootstrap, "prod", topic=topic, blob_store=tmp_path,
                          client_config={"batch.num.messages": "1"}, timeout=5.0) as reg:
        term = reg.claim_leadership("jm-1")
        with pytest.raises(RegistryError):
            term.submit_many([("job-big", BIG), ("job-small", b"g")])
    with Registry.connect(kafka.bootstrap, "prod", topic=topic, blob_store=tmp_path) as fresh:
        assert set(fresh.jobs()) == set(), "a torn call applied"
