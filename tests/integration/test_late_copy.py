"""When a copy of a record can still land after the client gave up (issue 42, finding 7).

librdkafka itself gives a leader's record up within the write's patience
(``leader_producer_settings``: ``message.timeout.ms`` at most the timeout, a produce request's
own timeout the first record's remaining message timeout, its connection taken down when it
times out), and the write purges and retires the producer on failure: librdkafka never sends
it again. What no client setting can recall is a request that already left: here the network
holds it (a stalled path, the fault proxy's blackhole keeps the bytes in its socket buffers)
until well after the write failed and its producer was destroyed, then delivers it, and the
broker appends it then, stamped then. A paused broker that reads its socket buffer when it is
continued does the same. README "Compaction", assumption 5, says what the fold does with such
a copy.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from registry import EmbeddedBroker
from registry.dev.torture.proxy import FaultProxy
from registry.log import LeaderWriter, LogReader, TopicConfig, WriteFailed, ensure_topic

pytestmark = [pytest.mark.integration,
              pytest.mark.embedded_only("puts a fault proxy in front of a broker of its own")]

TIMEOUT = 1.0


@pytest.fixture
def proxied() -> Iterator[tuple[EmbeddedBroker, FaultProxy]]:
    proxy = FaultProxy(None).start()
    broker = None
    try:
        broker = EmbeddedBroker(advertised_port=proxy.port).start()
        proxy.target = ("127.0.0.1", broker.listen_port)
        yield broker, proxy
    finally:
        try:
            proxy.stop()
        finally:
            if broker is not None:
                broker.stop()


def _read(bootstrap: str, topic: str) -> list[tuple[bytes | None, int | None]]:
    reader = LogReader(bootstrap, topic, 0)
    try:
        return [(r.key, r.timestamp) for b in reader.read_to_end(10.0) for r in b]
    finally:
        reader.close()


def test_a_request_the_network_held_lands_when_it_is_delivered_not_before(proxied) -> None:
    broker, proxy = proxied
    topic = f"late-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=1))
    writer = LeaderWriter(broker.bootstrap, topic, 0, timeout=TIMEOUT)
    writer.write([("ns/job/first", b"v")])  # the producer has its id: the next write leaves
    proxy.blackhole()
    sent = time.time()
    with pytest.raises(WriteFailed):  # not confirmed, or timed out in librdkafka first
        writer.write([("ns/job/late", b"v")])
    writer.close()  # the producer is destroyed: librdkafka holds nothing of the write
    time.sleep(3 * TIMEOUT)
    healed = time.time()
    proxy.heal()  # the network delivers what it held
    landed: list[tuple[bytes | None, int | None]] = []
    deadline = time.monotonic() + 20
    while len(landed) < 2 and time.monotonic() < deadline:
        landed = _read(broker.bootstrap, topic)
    assert [k for k, _ in landed] == [b"ns/job/first", b"ns/job/late"]
    _, (_, stamp) = landed
    # Tansu stamps with the producer's clock (README "Record time"); Kafka would stamp it at
    # its append, after the heal. Either way it was appended only once delivered.
    assert stamp is not None and stamp >= int(sent * 1000) - 1000
    assert healed - sent > 3 * TIMEOUT


def test_a_request_the_network_lost_never_lands_later(proxied) -> None:
    """librdkafka does not send a given-up record again once the path is back: the write
    purged it and retired the producer."""
    broker, proxy = proxied
    topic = f"late-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=1))
    writer = LeaderWriter(broker.bootstrap, topic, 0, timeout=TIMEOUT)
    writer.write([("ns/job/first", b"v")])
    proxy.blackhole()
    with pytest.raises(WriteFailed):
        writer.write([("ns/job/lost", b"v")])
    proxy.cut()  # what the network held is lost
    time.sleep(TIMEOUT)
    proxy.heal()
    time.sleep(3 * TIMEOUT)  # librdkafka's retry back-off is at most 1 s
    assert [k for k, _ in _read(broker.bootstrap, topic)] == [b"ns/job/first"]
    writer.close()


def test_a_new_producers_first_record_alone_holds_back_the_rest(proxied) -> None:
    """A new producer's first write of several records sends its first record alone
    (``LeaderWriter.start``, README "No gaps in a producer's series"); if that is not
    confirmed within the timeout, the write fails then, and nothing more of it is ever sent."""
    broker, proxy = proxied
    topic = f"late-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=1))
    writer = LeaderWriter(broker.bootstrap, topic, 0, timeout=TIMEOUT)
    proxy.blackhole()
    began = time.monotonic()
    with pytest.raises(WriteFailed):
        writer.write([("ns/job/a", b"a"), ("ns/call/c", b"c")])
    assert time.monotonic() - began < 2 * TIMEOUT  # waited once, not twice
    writer.close()
    proxy.heal()
    time.sleep(3 * TIMEOUT)
    assert b"ns/call/c" not in [k for k, _ in _read(broker.bootstrap, topic)]
