"""EmbeddedBroker(advertised_port=...) and Kafka clients through the fault proxy.

The broker listens on its own port and advertises the proxy's, so every client
connection after bootstrap (metadata, produce, fetch, the transaction and group
coordinators) goes through :class:`FaultProxy`. The tests show that librdkafka
rides out a short interruption (shorter than any of its timeouts) of either kind:
a cut (connections reset, new ones refused) and a blackhole (a stalled network).

Every wait is bounded. Clients are closed before the proxy and the broker stop;
the proxy stops first, which drops every connection Tansu has, so Tansu then
stops at once (it waits about 5 s on SIGTERM while clients are connected).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from registry.dev import broker as broker_module
from registry.dev.broker import EmbeddedBroker, _probe_cluster_id, _ProtocolError
from registry.dev.torture.proxy import FaultProxy
from registry.errors import BrokerError, ConfigError

integration = pytest.mark.integration

INTERRUPTION = 1.0  # seconds: far below every librdkafka timeout and a leader's lease
RECOVERY_BOUND = 15.0  # librdkafka's reconnect backoff tops out at 10 s by default
CLIENT = {"socket.nagle.disable": True, "log_level": 7}


class Recorder(logging.Handler):
    """Collects librdkafka's log lines (passed as ``logger``) and error callbacks."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[float, int, str]] = []
        self.errors: list[tuple[float, KafkaError]] = []
        self.logger = logging.getLogger(f"test.rdkafka.{uuid.uuid4().hex[:8]}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.levelno, record.getMessage()))

    def on_error(self, error: KafkaError) -> None:
        self.errors.append((time.monotonic(), error))

    def config(self) -> dict:
        return {"logger": self.logger, "error_cb": self.on_error}

    def warnings(self, since: float = 0.0) -> list[str]:
        return [m for t, level, m in self.lines if t >= since and level >= logging.WARNING]


@pytest.fixture
def proxied() -> Iterator[tuple[EmbeddedBroker, FaultProxy]]:
    """A broker advertising a FaultProxy that forwards to the broker's listening port."""
    proxy = FaultProxy(None).start()  # binds a free port first: no race for it
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


def create_topic(bootstrap: str) -> str:
    topic = f"jobreg-proxy-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **CLIENT, "log_level": 0})
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(timeout=10)
    finally:
        del admin
    return topic


def read_back(bootstrap: str, topic: str, count: int, timeout: float = 20.0) -> list[bytes]:
    """The first *count* committed values of partition 0 (read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **CLIENT,
            "log_level": 0,
            "group.id": f"jobreg-proxy-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def make_producer(bootstrap: str, kind: str, recorder: Recorder | None = None) -> Producer:
    config = {"bootstrap.servers": bootstrap, **CLIENT, "linger.ms": 0}
    if recorder is not None:
        config.update(recorder.config())
    if kind == "transactional":
        config["transactional.id"] = f"jobreg-proxy-{uuid.uuid4().hex[:8]}"
    else:
        config["enable.idempotence"] = True
    producer = Producer(config)
    if kind == "transactional":
        producer.init_transactions(10)
    return producer


# -- configuration (no process) ----------------------------------------------------------


@pytest.mark.parametrize("port", [0, -1, 65536, "9092", True, 1.5])
def test_bad_advertised_port_is_refused(port: object) -> None:
    with pytest.raises(ConfigError, match="advertised_port"):
        EmbeddedBroker(advertised_port=port)  # type: ignore[arg-type]


def test_addresses_before_start() -> None:
    b = EmbeddedBroker(port=19092, advertised_port=19093)
    assert (b.listen_port, b.port, b.advertised_port) == (19092, 19093, 19093)
    assert b.bootstrap == "127.0.0.1:19093"
    assert "advertising 127.0.0.1:19093" in repr(b)

    b = EmbeddedBroker(advertised_port=19093)
    assert b.bootstrap == "127.0.0.1:19093"  # known before start: it is given
    with pytest.raises(BrokerError, match="start"):
        _ = b.listen_port

    b = EmbeddedBroker(port=19092)
    assert b.advertised_port is None
    assert b.port == b.listen_port == 19092


def test_picked_listen_port_is_never_the_advertised_one(monkeypatch) -> None:
    picks = iter([19093, 19094])
    monkeypatch.setattr(broker_module, "_free_port", lambda host: next(picks))
    assert EmbeddedBroker(advertised_port=19093)._pick_listen_port() == 19094


def test_probe_of_something_that_is_not_kafka() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer_garbage() -> None:
            server.settimeout(5)
            with server.accept()[0] as conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer_garbage, daemon=True)
        thread.start()
        try:
            with pytest.raises((_ProtocolError, OSError)):
                _probe_cluster_id(("127.0.0.1", port), timeout=2)
        finally:
            thread.join(5)


# -- the real broker -----------------------------------------------------------------------


@integration
@pytest.mark.embedded_only("starts an EmbeddedBroker of its own, advertising a closed port")
def test_starts_with_nothing_on_the_advertised_port() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        advertised = probe.getsockname()[1]  # closed again: nothing listens there
    started = time.monotonic()
    with EmbeddedBroker(advertised_port=advertised) as b:
        assert time.monotonic() - started < 5
        assert b.listen_port != advertised and b.port == advertised
        assert b.bootstrap == f"127.0.0.1:{advertised}"
        assert _probe_cluster_id(("127.0.0.1", b.listen_port), timeout=5) == b.cluster_id
        # Asked on its own port, the broker names the advertised address.
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{b.listen_port}", "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=5)
        finally:
            del admin
        assert metadata.cluster_id == b.cluster_id
        assert [(m.host, m.port) for m in metadata.brokers.values()] == [("127.0.0.1", advertised)]


@integration
@pytest.mark.embedded_only("probes the session's EmbeddedBroker on its own listening port")
def test_probe_reads_the_cluster_id_without_advertising(broker: EmbeddedBroker) -> None:
    assert broker.advertised_port is None
    assert _probe_cluster_id(("127.0.0.1", broker.listen_port), timeout=5) == broker.cluster_id


@integration
@pytest.mark.embedded_only("puts a fault proxy in front of an embedded broker of its own")
def test_transactional_roundtrip_through_the_proxy(proxied) -> None:
    broker, proxy = proxied
    assert broker.bootstrap == proxy.address
    topic = create_topic(broker.bootstrap)

    producer = make_producer(broker.bootstrap, "transactional")
    try:
        producer.begin_transaction()
        producer.produce(topic, b"through the proxy")
        producer.commit_transaction(10)
    finally:
        del producer
    assert read_back(broker.bootstrap, topic, 1) == [b"through the proxy"]
    assert proxy.accepted >= 3  # bootstrap, the advertised broker, the coordinators
    assert proxy.bytes_forwarded > 0


@integration
@pytest.mark.embedded_only("puts a fault proxy in front of an embedded broker of its own")
def test_the_transaction_coordinator_is_reached_through_the_proxy(proxied) -> None:
    """FindCoordinator answers with the advertised address too: a blackhole stalls EndTxn."""
    broker, proxy = proxied
    topic = create_topic(broker.bootstrap)
    producer = make_producer(broker.bootstrap, "transactional")
    try:
        producer.begin_transaction()
        producer.produce(topic, b"committed after the heal")
        assert producer.flush(10) == 0
        proxy.blackhole()
        try:
            with pytest.raises(KafkaException) as info:
                producer.commit_transaction(1.0)
            assert info.value.args[0].retriable(), info.value
        finally:
            proxy.heal()
        producer.commit_transaction(10)  # retrying a timed-out commit is allowed
    finally:
        del producer
    assert read_back(broker.bootstrap, topic, 1) == [b"committed after the heal"]


@integration
@pytest.mark.embedded_only("puts a fault proxy in front of an embedded broker of its own")
@pytest.mark.parametrize("kind", ["idempotent", "transactional"])
@pytest.mark.parametrize("mode", ["cut", "blackhole"])
def test_producer_delivers_after_a_short_interruption(proxied, mode: str, kind: str) -> None:
    broker, proxy = proxied
    topic = create_topic(broker.bootstrap)
    recorder = Recorder()
    producer = make_producer(broker.bootstrap, kind, recorder)
    deliveries: list[tuple[float, KafkaError | None]] = []
    try:
        if kind == "transactional":
            producer.begin_transaction()
        producer.produce(topic, b"before")
        assert producer.flush(10) == 0  # connections are up and used
        if kind == "transactional":
            producer.commit_transaction(10)
            producer.begin_transaction()

        faulted = time.monotonic()
        healer = proxy.interrupt(INTERRUPTION, mode)
        healed_no_earlier_than = faulted + INTERRUPTION
        producer.produce(
            topic, b"after", on_delivery=lambda err, msg: deliveries.append((time.monotonic(), err))
        )
        assert producer.flush(INTERRUPTION + RECOVERY_BOUND) == 0
        healer.join(5)
        assert not healer.is_alive()
        if kind == "transactional":
            producer.commit_transaction(10)
    finally:
        del producer

    [(delivered, error)] = deliveries
    assert error is None, error
    assert delivered >= healed_no_earlier_than, "delivered through a broken network?"
    recovery = delivered - healed_no_earlier_than
    warnings = recorder.warnings(since=faulted)
    print(
        f"\n{kind} producer, {INTERRUPTION:g}s {mode}: delivered {recovery:.3f}s after the heal;"
        f" {len(warnings)} warning/error log lines, error_cb: "
        f"{[e.name() for _, e in recorder.errors] or 'none'}"
    )
    for line in sorted(set(warnings))[:8]:
        print(f"    {line}")
    if mode == "cut":  # logged as "Disconnected: ..." (info) or "Connect ... failed: ..." (error)
        assert any("reset by peer" in m for t, _, m in recorder.lines if t >= faulted)
    else:
        # Shorter than every timeout: librdkafka never notices the stall.
        assert warnings == [] and recorder.errors == []
        assert recovery < 1.0
    assert recovery < RECOVERY_BOUND
    assert read_back(broker.bootstrap, topic, 2) == [b"before", b"after"]
