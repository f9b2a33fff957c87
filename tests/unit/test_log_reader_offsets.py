"""The log reader when the Kafka client gives an end-of-partition event without an offset.

confluent-kafka's ``Message.offset()`` is ``None`` where librdkafka's offset is negative
(invalid); ``LogReader.poll`` compared it with 0 (``m.offset() >= 0``), which raises
``TypeError`` on ``None`` (mypy found it). The event is a real ``confluent_kafka.Message``;
the consumer that hands it out is a stand-in (no broker is involved: this is the reader's
own bookkeeping).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message, TopicPartition

from registry.log import LogReader


class _Handing:
    """A consumer that hands out ``messages`` once, then nothing."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        out, self.messages = self.messages, []
        return out

    def poll(self, timeout: float = -1) -> Message | None:
        return None

    def resume(self, partitions: list[TopicPartition]) -> None:
        pass

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass

    def seek(self, partition: TopicPartition) -> None:
        pass

    def close(self) -> None:
        pass


def test_an_end_of_partition_without_an_offset_moves_no_end() -> None:
    reader = LogReader("127.0.0.1:9", "events", 0)  # a client that never connects here
    real, reader._consumer = reader._consumer, _Handing([  # type: ignore[assignment]
        Message(topic="events", partition=0, offset=-1001,
                error=KafkaError(KafkaError._PARTITION_EOF))])
    try:
        assert reader.poll(0) == []
        assert reader.stable_end is None
    finally:
        reader.close()
        real.close()
