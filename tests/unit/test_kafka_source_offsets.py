"""The Spark source's reads when the Kafka client gives an event without an offset.

confluent-kafka's ``Message.offset()`` is ``None`` where librdkafka's offset is negative
(invalid); the reads compared it with ints (``0 <= eof``, ``eof > offset``), which raises
``TypeError`` on ``None`` (mypy found it). The events are real ``confluent_kafka.Message``
objects; the consumer that hands them out is a stand-in (no broker is involved: this is
the reads' own logic).
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaError, Message, TopicPartition

from consumers.kafka_source import (
    KafkaInputPartition,
    SourceOptions,
    _read_range,
    _TopicOffsets,
)

TOPIC = "events"
OPTS = SourceOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": TOPIC,
                            "fetchOffset.timeoutMs": "1"})


def _eof_without_offset() -> Message:
    # What the binding makes of an end-of-partition event whose offset is invalid (-1001).
    return Message(topic=TOPIC, partition=0, offset=-1001,
                   error=KafkaError(KafkaError._PARTITION_EOF))


class _Handing:
    """A consumer that hands out ``messages`` once, then nothing."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = list(messages)

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        out, self.messages = self.messages, []
        return out

    def poll(self, timeout: float = -1) -> Message | None:
        return None


def test_a_range_read_ends_at_an_end_of_partition_without_an_offset() -> None:
    part = KafkaInputPartition(TOPIC, 0, 0, 5)
    consumer = _Handing([_eof_without_offset()])
    assert list(_read_range(OPTS, consumer, part, False)) == []  # type: ignore[arg-type]


def test_holds_is_false_on_an_end_of_partition_without_an_offset() -> None:
    offsets = _TopicOffsets(OPTS)
    offsets._consumer = _Handing([_eof_without_offset()])  # type: ignore[assignment]
    assert offsets.holds(0, 3) is False


def test_the_end_probe_keeps_the_listed_end_on_an_end_of_partition_without_an_offset() -> None:
    offsets = _TopicOffsets(OPTS)
    offsets._consumer = _Handing([_eof_without_offset()])  # type: ignore[assignment]
    assert offsets._probe({0: (0, 4)}) == {0: 4}
