"""The topic's settings the guarantees rest on, checked on one Apache Kafka node (issue 42,
finding 6; the replicated cases are in ``test_kafka_replicated_topic.py``).

A topic an operator created with only ``cleanup.policy=compact`` and
``message.timestamp.type=LogAppendTime`` has the broker's ``min.compaction.lag.ms``, 0: the
cleaner may remove a key's records the moment they leave the active segment, although the
compaction argument (README "Compaction", assumption 1) gives a leader that long to reassert a
refused record's key. Such a topic, and one whose retention deletes records or that allows
unclean leader elections, is refused in one line that names the setting, its value, what
jobreg needs and the command that fixes it; ``TopicConfig(check="warn")`` (or
``$JOBREG_TOPIC_CHECK=warn``) lets a test cluster through with a warning instead.
"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from registry import ConfigError, Registry
from registry.dev.kafka import KafkaCluster
from registry.log import TopicConfig

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

_LAG_7_DAYS = str(7 * 24 * 3600 * 1000)


def _create(kafka: KafkaCluster, topic: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1,
                                  config=config)])[topic].result(30)


def _refusal(kafka: KafkaCluster, topic: str, tmp_path) -> str:
    with pytest.raises(ConfigError) as caught:
        Registry.connect(kafka.bootstrap, "prod", topic=topic, blob_store=tmp_path).close()
    said = str(caught.value)
    assert "\n" not in said, said
    return said


def test_a_topic_with_the_brokers_default_compaction_lag_is_refused(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    """As a new operator would create it: compacted, LogAppendTime, nothing else."""
    _create(kafka, topic, **{"cleanup.policy": "compact",
                             "message.timestamp.type": "LogAppendTime"})
    said = _refusal(kafka, topic, tmp_path)
    assert f"topic {topic!r} has min.compaction.lag.ms=0" in said
    assert f"at least {_LAG_7_DAYS}" in said
    assert (f"kafka-configs --bootstrap-server {kafka.bootstrap} --alter --entity-type topics "
            f"--entity-name {topic} --add-config min.compaction.lag.ms={_LAG_7_DAYS}") in said


def test_a_compacted_topic_whose_retention_deletes_is_refused(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    """``compact,delete`` deletes whole segments past ``retention.ms`` (7 days by default):
    grants, commits and a job's only record go with them."""
    _create(kafka, topic, **{"cleanup.policy": "compact,delete",
                             "message.timestamp.type": "LogAppendTime",
                             "min.compaction.lag.ms": _LAG_7_DAYS})
    said = _refusal(kafka, topic, tmp_path)
    assert f"topic {topic!r} has cleanup.policy=compact,delete" in said
    assert "retention.ms=604800000" in said
    assert "--add-config cleanup.policy=compact" in said


def test_a_topic_that_allows_unclean_leader_elections_is_refused(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    _create(kafka, topic, **{"cleanup.policy": "compact",
                             "message.timestamp.type": "LogAppendTime",
                             "min.compaction.lag.ms": _LAG_7_DAYS,
                             "unclean.leader.election.enable": "true"})
    said = _refusal(kafka, topic, tmp_path)
    assert f"topic {topic!r} has unclean.leader.election.enable=true" in said
    assert "--add-config unclean.leader.election.enable=false" in said


def test_the_check_is_a_warning_where_a_test_cluster_says_so(
        kafka: KafkaCluster, topic: str, tmp_path, monkeypatch, caplog) -> None:
    """The explicit opt-out: ``TopicConfig(check="warn")``, or ``$JOBREG_TOPIC_CHECK=warn``
    for whatever makes its own ``TopicConfig()`` (the CLI's Flink bridge)."""
    _create(kafka, topic, **{"cleanup.policy": "compact",
                             "message.timestamp.type": "LogAppendTime"})
    with caplog.at_level(logging.WARNING, logger="registry"), \
            Registry.connect(kafka.bootstrap, "prod", topic=topic, blob_store=tmp_path,
                             topic_config=TopicConfig(check="warn")) as reg:
        reg.claim_leadership("jm-1").submit("job-a", b"g")
    warned = [r.getMessage() for r in caplog.records if "min.compaction.lag.ms=0" in
              r.getMessage()]
    assert len(warned) == 1 and "check='warn'" in warned[0], warned
    monkeypatch.setenv("JOBREG_TOPIC_CHECK", "warn")
    with Registry.connect(kafka.bootstrap, "prod", topic=topic, blob_store=tmp_path) as reg:
        assert set(reg.jobs()) == {"job-a"}
    monkeypatch.setenv("JOBREG_TOPIC_CHECK", "refuse")
    _refusal(kafka, topic, tmp_path)


def test_the_topic_jobreg_creates_on_one_node_passes_its_own_check(
        kafka: KafkaCluster, topic: str, tmp_path) -> None:
    """One broker: replication 1 and ``min.insync.replicas`` 1, where nothing better
    exists (the topic says so on itself, so a broker added later does not change it)."""
    from confluent_kafka.admin import ConfigResource

    with Registry.connect(kafka.bootstrap, "prod", topic=topic, blob_store=tmp_path) as reg:
        reg.claim_leadership("jm-1")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    assert {len(p.replicas) for p in meta.partitions.values()} == {1}
    config = next(iter(admin.describe_configs([ConfigResource("topic", topic)])
                       .values())).result(30)
    assert config["min.insync.replicas"].value == "1"
    with Registry.connect(kafka.bootstrap, "prod", topic=topic, blob_store=tmp_path) as again:
        assert again.leader() is not None
