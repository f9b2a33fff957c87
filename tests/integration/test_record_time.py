"""Issue 26, section 5: time on the embedded broker, against a real broker.

The topic says ``LogAppendTime``; the embedded broker keeps the producer's stamp (CreateTime),
so a writer whose clock is skewed sets the stamps readers see. The writers here pass explicit
stamps (``write_raw(..., timestamp=)``), as a producer whose clock said so would: no test
waits for time to pass. What the fold does with such stamps without a broker is in
``tests/unit/test_fold_time.py``.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from registry import ConfigError, Registry
from registry.events import JobCancelled, now_ms
from registry.keys import record_key
from registry.log import LogReader, TopicConfig, ensure_topic, write_raw
from registry.wire import encode

YEAR = 365 * 24 * 3600 * 1000


@pytest.mark.embedded_only("tests Tansu's CreateTime stamps on a LogAppendTime topic")
@pytest.mark.integration
def test_the_embedded_broker_keeps_the_producers_stamp_on_a_log_append_time_topic(
        broker, topic) -> None:
    """What differs from Kafka (README "What differs"): Kafka would answer with its own
    clock's stamp, as LogAppendTime."""
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=1))
    write_raw(broker.bootstrap, topic, 0, "ns/job/a", b"x", timestamp=1000)
    reader = LogReader(broker.bootstrap, topic, 0)
    try:
        assert [r.timestamp for b in reader.read_to_end(10.0) for r in b] == [1000]
    finally:
        reader.close()


@pytest.mark.embedded_only("needs Tansu's CreateTime stamps on a LogAppendTime topic")
@pytest.mark.integration
def test_a_writer_stamping_far_ahead_or_behind_changes_no_verdict_and_cuts_state_at_time(
        connect) -> None:
    reg = connect("prod")
    term = reg.claim_leadership("jm-1")
    term.submit("job-a", graph=b"g")
    start = now_ms()
    # a zombie of term 0 whose clock is a year behind, then one a year ahead
    for offset_ms in (-YEAR, YEAR):
        late = JobCancelled(event_id=f"z{offset_ms}", namespace="prod", epoch=0,
                            writer="jm-0", created_at=1, job_id="job-a")
        write_raw(reg.kafka, reg.topic, reg.partition, record_key(late), encode(late),
                  timestamp=start + offset_ms)
    ahead = reg.sync().provenance.last_offset
    term.submit("job-b", graph=b"g")  # the leader's clock is right
    image = reg.sync()
    assert set(reg.jobs()) == {"job-a", "job-b"}
    assert [(d.reason, d.writer) for d in image.rejected] == [("stale_epoch", "jm-0")] * 2
    assert image.provenance.log_time >= start + YEAR  # the newest stamp folded
    # "the state at T" is the longest prefix stamped at or before T: the record stamped a
    # year ahead ends it until T reaches that stamp
    now = reg.state_at(time=now_ms())
    assert now.provenance.last_offset == ahead - 1 and set(now.live_jobs()) == {"job-a"}
    assert reg.state_at(time=start + YEAR).provenance.last_offset >= ahead + 1


@pytest.mark.integration
def test_a_snapshot_is_as_old_as_its_writing_whatever_its_records_say(
        connect, broker, topic, tmp_path, monkeypatch) -> None:
    """A record stamped a year ahead (the embedded broker keeps a writer's clock) made a
    snapshot written two days ago look young, and it was trusted past the topic's
    delete.retention.ms (one day). Its age is now the older of its log time and its
    writing. On Kafka the record gets the broker's stamp; the answer is the same."""
    import registry.snapshot

    reg = connect("prod")
    reg.claim_leadership("jm-1").submit("job-a", graph=b"g")
    zombie = JobCancelled(event_id="z1", namespace="prod", epoch=0, writer="jm-0",
                          created_at=1, job_id="job-a")
    write_raw(reg.kafka, reg.topic, reg.partition, record_key(zombie), encode(zombie),
              timestamp=now_ms() + YEAR)
    two_days_ago = now_ms() - 2 * 24 * 3600 * 1000
    monkeypatch.setattr(registry.snapshot, "now_ms", lambda: two_days_ago)
    reg.write_snapshot(tmp_path / "s.snap")
    monkeypatch.undo()
    again = connect("prod", snapshot=tmp_path / "s.snap")
    assert again.started_from.startswith("scratch (snapshot"), again.started_from
    assert "older than the topic's delete.retention.ms" in again.started_from
    assert set(again.jobs()) == {"job-a"}


@pytest.mark.integration
def test_a_topic_stamped_by_its_writers_is_refused_with_the_command_that_fixes_it(
        broker, topic) -> None:
    """On Kafka a CreateTime topic makes every writer's clock the record's time: fold rule 1
    and the cleaner's lag would read it. jobreg creates its topics LogAppendTime and refuses
    one that is not."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, config={
        "cleanup.policy": "compact", "message.timestamp.type": "CreateTime",
        "min.compaction.lag.ms": str(7 * 24 * 3600 * 1000)})])[topic].result(10)
    with pytest.raises(ConfigError) as caught:
        Registry.connect(broker.bootstrap, "prod", topic=topic)
    assert str(caught.value) == (
        f"topic {topic!r} has message.timestamp.type=CreateTime; jobreg needs LogAppendTime "
        f"(the broker's stamps): kafka-configs --bootstrap-server {broker.bootstrap} --alter "
        f"--entity-type topics --entity-name {topic} --add-config "
        "message.timestamp.type=LogAppendTime (on a test cluster: TopicConfig(check='warn') or "
        "$JOBREG_TOPIC_CHECK=warn)")
