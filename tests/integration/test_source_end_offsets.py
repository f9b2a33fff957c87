"""The streaming source's end offsets while a leader writes (issue 28, item 4).

The embedded broker answers ListOffsets with 0 for a moment, under read_committed, while a
transactional writer is active on the partition; the source took that 0 as the partition's
end and reported data loss (``offset was changed from 1117 to 0``), which killed
``audit run --follow``. These tests drive the source's planning on the driver directly
(``latestOffset`` then ``partitions``, as Spark's micro-batch loop calls them), without a
SparkSession, against the real embedded broker: a leader writing through the client, and a
broker answer that goes back (the answer replaced, the log's real contents asked), next to
a log that really lost what was read (which stays data loss).
"""

from __future__ import annotations

import threading

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from consumers.kafka_source import (
    KafkaDataLossError,
    KafkaInputPartition,
    KafkaStreamReader,
    SourceOptions,
    _TopicOffsets,
    kafka_schema,
)

pytestmark = pytest.mark.integration


def reader(bootstrap: str, topic: str, **options: str) -> KafkaStreamReader:
    opts = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                **options})
    return KafkaStreamReader(opts, kafka_schema())


def plan(source: KafkaStreamReader, start: dict) -> tuple[dict, list[KafkaInputPartition]]:
    """One trigger of Spark's micro-batch loop: the end, then the batch's input partitions."""
    end = source.latestOffset(start, ReadAllAvailable())
    return end, source.partitions(start, end)


def test_planning_while_a_leader_writes_never_goes_back(broker, connect, topic) -> None:
    """A leader writes 600 jobs through the client while the source plans batch after batch
    (no retries of a smaller answer, so every passing 0 reaches the decision): no data-loss
    error, the planned ranges follow each other without a gap or overlap, and the last one
    ends at the partition's end."""
    reg = connect("ns-a")
    term = reg.claim_leadership("jm-1")
    partition = reg.partition
    done = threading.Event()
    failures: list[BaseException] = []

    def lead() -> None:
        try:
            for i in range(600):
                term.submit(f"job-{i}", b"g")
        except BaseException as e:  # reported below
            failures.append(e)
        finally:
            done.set()

    source = reader(broker.bootstrap, topic, **{"fetchOffset.numRetries": "0"})
    start = source.initialOffset()
    writer = threading.Thread(target=lead)
    writer.start()
    planned: list[tuple[int, int]] = []
    try:
        while True:
            last_round = done.is_set()
            end, parts = plan(source, start)
            planned += [(r.start, r.end) for r in parts if r.partition == partition]
            start = end
            if last_round:
                break
    finally:
        done.wait()
        writer.join()
        source.stop()
    assert failures == []
    assert planned and planned[0][0] == 0
    assert all(a[1] == b[0] for a, b in zip(planned, planned[1:], strict=False))
    assert planned[-1][1] > reg.sync().provenance.last_offset  # every record planned


class _Answers(_TopicOffsets):
    """The driver's view of the topic with the broker's end answers replaced by a script (one
    per ask; the last repeats); everything else (partitions, the log's contents) is asked of
    the real broker."""

    def __init__(self, opts: SourceOptions, partition: int, script: list[int]) -> None:
        super().__init__(opts)
        self.partition = partition
        self.script = list(script)

    def _answer(self, parts: list[int]) -> dict[int, int]:
        answer = super()._answer(parts)
        answer[self.partition] = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return answer


def test_an_end_that_goes_back_is_nothing_new_yet(broker, connect, topic) -> None:
    """The broker answers 0 (three times: the first ask and both retries) after the source
    read 12 offsets: the next batch is empty, not data loss, and the end after it is planned
    from where the last one ended."""
    reg = connect("ns-a")
    term = reg.claim_leadership("jm-1")
    for i in range(5):
        term.submit(f"job-{i}", b"g")
    end = reg.sync().provenance.last_offset + 1
    source = reader(broker.bootstrap, topic, **{"fetchOffset.numRetries": "2"})
    source._offsets = _Answers(source._opts, reg.partition, [end, 0, 0, 0, end + 3])
    start = source.initialOffset()
    start[topic] = {p: 0 for p in start[topic]}
    first, parts = plan(source, start)
    assert [(r.start, r.end) for r in parts] == [(0, end)]
    second, parts = plan(source, first)
    assert parts == [] and second == first
    third, parts = plan(source, second)
    assert [(r.start, r.end) for r in parts] == [(end, end + 3)]


def test_an_end_below_what_the_log_held_is_data_loss(broker, connect, topic) -> None:
    """The same answer for a log that no longer holds what was read (the offsets after it are
    out of range, as after a topic was re-created): data loss, named with both offsets."""
    reg = connect("ns-a")
    term = reg.claim_leadership("jm-1")
    term.submit("job-0", b"g")
    end = reg.sync().provenance.last_offset + 1
    source = reader(broker.bootstrap, topic)
    source._offsets = _Answers(source._opts, reg.partition, [2])
    start = {topic: {str(reg.partition): end + 100}}
    with pytest.raises(KafkaDataLossError, match=rf"offset was changed from {end + 100} to 2"):
        plan(source, start)
