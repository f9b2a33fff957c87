"""The topic check (``registry.log.topic_violations``), pure: each setting the guarantees rest
on, its refusal in one line naming the setting, its value, what jobreg needs and the command
that fixes it (issue 42, finding 6; on Apache Kafka: ``test_kafka_topic_check.py`` and
``test_kafka_replicated_topic.py``)."""

from __future__ import annotations

import pytest

from registry.errors import ConfigError
from registry.kafka_config import Kafka
from registry.log import TOPIC_CHECK_ENV, TopicConfig, topic_violations

GOOD = {"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime",
        "min.compaction.lag.ms": str(7 * 24 * 3600 * 1000), "delete.retention.ms": "86400000",
        "retention.ms": "604800000", "retention.bytes": "-1", "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false"}


def check(replicas: int = 3, brokers: int = 3, config: TopicConfig | None = None,
          **changed: str | None) -> list[str]:
    settings = {**GOOD, **{k.replace("_", "."): v for k, v in changed.items()}}
    return topic_violations("b:9092", "t", {k: v for k, v in settings.items() if v is not None},
                            replicas, brokers, config)


def test_the_topic_as_jobreg_makes_it_passes() -> None:
    assert check() == []
    assert check(replicas=1, brokers=1, min_insync_replicas="1") == []
    assert check(replicas=2, brokers=2) == []


def test_every_violation_is_one_line_with_its_fix() -> None:
    cases = {
        "min.compaction.lag.ms=0": check(min_compaction_lag_ms="0"),
        "cleanup.policy=delete": check(cleanup_policy="delete"),
        "cleanup.policy=compact,delete with retention.ms=604800000 and retention.bytes=-1":
            check(cleanup_policy="compact,delete"),
        "message.timestamp.type=CreateTime": check(message_timestamp_type="CreateTime"),
        "unclean.leader.election.enable=true": check(unclean_leader_election_enable="true"),
        "replication factor 1": check(replicas=1),
        "min.insync.replicas=1 with 3 replicas": check(min_insync_replicas="1"),
    }
    for what, found in cases.items():
        assert len(found) == 1, (what, found)
        line = found[0]
        assert line.startswith(f"topic 't' has {what}; jobreg needs "), line
        assert "\n" not in line
        assert "kafka-configs --bootstrap-server b:9092 --alter --entity-type topics " \
               "--entity-name t --add-config " in line or "kafka-reassign-partitions" in line


def test_what_jobreg_needs() -> None:
    # a lag shorter than the TopicConfig's is refused, one as long or longer is not
    assert check(min_compaction_lag_ms=str(7 * 24 * 3600 * 1000 - 1))
    assert not check(min_compaction_lag_ms=str(30 * 24 * 3600 * 1000))
    # a deployment that accepts a shorter window says so in its TopicConfig
    assert not check(min_compaction_lag_ms="3600000",
                     config=TopicConfig(min_compaction_lag_ms=3600000))
    # compact,delete deletes nothing when both retentions are unbounded
    assert not check(cleanup_policy="compact,delete", retention_ms="-1")
    assert check(cleanup_policy="delete,compact", retention_ms="-1", retention_bytes="1000")
    # replication: min(3, brokers); min ISR 2 from two replicas on
    assert check(replicas=2, brokers=3)
    assert not check(replicas=3, brokers=5)
    assert check(replicas=2, brokers=2, min_insync_replicas="1")
    assert not check(replicas=1, brokers=1, min_insync_replicas="1")
    # delete.retention.ms is not a guarantee (the client trusts a snapshot only as old)
    assert not check(delete_retention_ms="0")


def test_what_the_broker_does_not_report_is_not_checked() -> None:
    """The embedded broker reports only the settings a topic was created with."""
    assert topic_violations("b:9092", "t", {}, 1, 1) == []
    assert topic_violations("b:9092", "t", {"cleanup.policy": "compact"}, None, 3) == []


def test_a_secured_cluster_s_command_names_its_client_properties() -> None:
    found = topic_violations(Kafka("b:9093", {"security.protocol": "SSL"}), "t",
                             {**GOOD, "min.compaction.lag.ms": "0"}, 3, 3)
    assert "kafka-configs --bootstrap-server b:9093 --command-config CLIENT.properties " \
           "--alter" in found[0]


def test_new_topics_get_min_3_brokers_replicas_and_2_in_sync() -> None:
    config = TopicConfig()
    assert [config.replicas_for(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert config.kafka_config(1)["min.insync.replicas"] == "1"
    assert config.kafka_config(3)["min.insync.replicas"] == "2"
    assert "min.insync.replicas" not in config.kafka_config()  # unknown until the cluster is
    assert TopicConfig(replication_factor=3).kafka_config()["min.insync.replicas"] == "2"


def test_the_check_is_refuse_unless_said_otherwise(monkeypatch) -> None:
    monkeypatch.delenv(TOPIC_CHECK_ENV, raising=False)
    assert TopicConfig().check == "refuse"
    monkeypatch.setenv(TOPIC_CHECK_ENV, "warn")
    assert TopicConfig().check == "warn"
    assert TopicConfig(check="refuse").check == "refuse"
    monkeypatch.setenv(TOPIC_CHECK_ENV, "off")
    with pytest.raises(ConfigError, match=r"topic check 'off' \(TopicConfig.check or "
                                          r"\$JOBREG_TOPIC_CHECK\) is neither"):
        TopicConfig()
