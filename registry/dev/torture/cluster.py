"""The campaign's Apache Kafka: three nodes, each in a network namespace of its own.

:class:`CampaignCluster` is a :class:`~registry.dev.kafka.KafkaCluster` of three nodes
(replication 3, ``min.insync.replicas=2``, unclean leader election off) whose nodes run in
the namespaces of a :class:`~registry.dev.torture.netsplit.NodeNetwork` when this machine
can make them (root and ``ip``), so that the nemesis can cut one off; else on 127.0.0.1,
without the cut. It finds who to strike: the leader of a partition
(:meth:`KafkaCluster.leader_of`) and the transaction coordinator of a transactional id
(:func:`coordinator_partition`, :meth:`CampaignCluster.coordinator_of`), and it brings the
cluster back whole between runs (:meth:`CampaignCluster.heal`).

Failure detection is shortened from Kafka's defaults (:data:`FAULT_SETTINGS`), so that a
30-second run sees leaders move: a broker that misses heartbeats for 3 s is fenced and its
partitions get new leaders; a follower 4 s behind leaves the ISR.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import struct
import time
from typing import Any

from registry.dev.kafka import KafkaCluster
from registry.dev.torture.netsplit import NodeNetwork, unavailable
from registry.errors import BrokerError

__all__ = ["FAULT_SETTINGS", "TXN_TOPIC", "CampaignCluster", "coordinator_partition",
           "java_string_hash", "node_view"]

TXN_TOPIC = "__transaction_state"

FAULT_SETTINGS: dict[str, str] = {
    # Kafka's defaults (9 s, 2 s, 30 s) are for production; a run lasts 30 s.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "4000",
    # A transaction left open by a killed coordinator's client is aborted on its timeout
    # (the writer's 60 s) or by the id's next producer; the check for timed-out ones runs
    # every 10 s by default.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "2000",
}
"""Broker settings of the campaign's cluster over jobreg's (see the module docstring)."""


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` of Java: over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(transactional_id: str, partitions: int) -> int:
    """The partition of ``__transaction_state`` that holds ``transactional_id``'s state:
    Kafka's ``Utils.abs(transactionalId.hashCode()) % partitions`` (``Utils.abs`` maps
    ``Integer.MIN_VALUE`` to 0). Its leader is the id's transaction coordinator.

    confluent-kafka's AdminClient (2.16) offers neither FindCoordinator nor
    DescribeTransactions, so the coordinator is derived; ``tests/integration/test_torture.py``
    checks the derivation against the partition where Kafka wrote the id's state.
    """
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def node_view(host: str, port: int, topic: str, timeout: float = 2.0
              ) -> dict[int, tuple[int, int]]:
    """What the broker at ``host:port`` itself says leads each partition of ``topic``:
    ``{partition: (leader, leader_epoch)}``, from a Metadata request (v8) sent to that
    broker alone. A client library cannot ask one broker: it sends metadata requests to
    whichever it likes, and a deposed leader's view is what the nemesis needs to see.

    :raises OSError: no answer; ``ValueError``: a reply that is not Metadata v8.
    """
    from registry.dev.broker import _request, _skip_string, _unpack

    name = topic.encode()
    body = struct.pack(">ih", 1, len(name)) + name + b"\x00\x00\x00"
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        try:
            reply = _request(sock, 3, 8, 7, body)
            offset = 4  # throttle_time_ms
            (brokers,) = _unpack(">i", reply, offset)
            offset += 4
            for _ in range(brokers):  # node_id, host, port, rack
                offset = _skip_string(reply, offset + 4) + 4
                offset = _skip_string(reply, offset)
            offset = _skip_string(reply, offset) + 4  # cluster_id, controller_id
            (topics,) = _unpack(">i", reply, offset)
            offset += 4
            view: dict[int, tuple[int, int]] = {}
            for _ in range(topics):
                offset = _skip_string(reply, offset + 2) + 1  # error, name, is_internal
                (parts,) = _unpack(">i", reply, offset)
                offset += 4
                for _ in range(parts):
                    _err, index, leader, epoch = _unpack(">hiii", reply, offset)
                    offset += 14
                    for _ in range(3):  # replicas, isr, offline replicas
                        (n,) = _unpack(">i", reply, offset)
                        offset += 4 + 4 * max(n, 0)
                    view[index] = (leader, epoch)
                offset += 4  # topic_authorized_operations
        except Exception as e:  # noqa: BLE001 - the protocol error is private to broker.py
            if isinstance(e, OSError):
                raise
            raise ValueError(f"not a Metadata v8 reply from {host}:{port}: {e}") from e
    return view


class CampaignCluster:
    """Three Kafka nodes for fault campaigns (module docstring); ``with`` starts and stops.

    :param partition: put each node in a network namespace of its own so that :meth:`cut`
        works (``None``: when this machine can).
    """

    def __init__(self, nodes: int = 3, *, partition: bool | None = None,
                 progress: Any = None) -> None:
        why = unavailable()
        if partition is None:
            partition = why is None
        elif partition and why is not None:
            raise BrokerError(f"cannot cut nodes off here: {why}")
        self.network = NodeNetwork(nodes) if partition else None
        self.cluster: KafkaCluster | None = None
        self._nodes = nodes
        self._progress = progress

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> CampaignCluster:
        if self.network is not None:
            self.network.start()
        try:
            net = self.network
            self.cluster = KafkaCluster(
                nodes=self._nodes, config=FAULT_SETTINGS, progress=self._progress,
                hosts=net.hosts if net is not None else None,
                netns=list(net.names) if net is not None else None).start()
        except BaseException:
            if self.network is not None:
                self.network.close()
            raise
        return self

    def stop(self) -> None:
        if self.cluster is not None:
            if self.network is not None:
                self.network.heal_all()
            self.cluster.stop()
        if self.network is not None:
            self.network.close()

    def __enter__(self) -> CampaignCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kafka(self) -> KafkaCluster:
        if self.cluster is None:
            raise BrokerError("the campaign cluster is not started")
        return self.cluster

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def can_cut(self) -> bool:
        return self.network is not None

    # -- faults ------------------------------------------------------------------------

    def node_ids(self) -> list[int]:
        return [n.node_id for n in self.kafka.nodes]

    def pid(self, node_id: int) -> int | None:
        return self.kafka.node(node_id).pid

    def running(self, node_id: int) -> bool:
        return self.kafka.node(node_id).is_running()

    def kill(self, node_id: int) -> None:
        self.kafka.kill(node_id)

    def restart(self, node_id: int) -> None:
        self.kafka.restart(node_id, wait=True)

    def pause(self, node_id: int) -> None:
        self.kafka.pause(node_id)

    def resume(self, node_id: int) -> None:
        self.kafka.resume(node_id)

    def cut(self, node_id: int) -> None:
        if self.network is None:
            raise BrokerError("this cluster's nodes share one network: no cut")
        self.network.cut(node_id - 1)

    def heal_cut(self, node_id: int) -> None:
        if self.network is not None:
            self.network.heal(node_id - 1)

    # -- who to strike -----------------------------------------------------------------

    def _metadata(self, topic: str | None, timeout: float) -> Any:
        from confluent_kafka.admin import AdminClient

        live = ",".join(n.bootstrap for n in self.kafka.nodes if n.is_running())
        admin = AdminClient({"bootstrap.servers": live, "log_level": 0})
        return admin.list_topics(topic, timeout=timeout)

    def leader_of(self, topic: str, partition: int, timeout: float = 5.0) -> int:
        """The node leading ``topic``'s ``partition`` now (-1: none)."""
        meta = self._metadata(topic, timeout)
        leader: int = meta.topics[topic].partitions[partition].leader
        return leader

    def coordinator_of(self, transactional_id: str, timeout: float = 5.0) -> int | None:
        """The node that coordinates ``transactional_id``'s transactions now: the leader of
        its ``__transaction_state`` partition (:func:`coordinator_partition`); ``None`` before
        any transactional producer made that topic, -1 while the partition has no leader."""
        meta = self._metadata(TXN_TOPIC, timeout)
        found = meta.topics.get(TXN_TOPIC)
        if found is None or found.error is not None or not found.partitions:
            return None
        part = coordinator_partition(transactional_id, len(found.partitions))
        leader: int = found.partitions[part].leader
        return leader

    def agrees(self, node_id: int, topic: str, timeout: float = 2.0) -> bool:
        """Node ``node_id`` names the same leader and leader epoch for every partition of
        ``topic`` as another running node does: a deposed leader has learned that it was."""
        mine = self.kafka.node(node_id)
        others = [n for n in self.kafka.nodes if n.node_id != node_id and n.is_running()]
        if not others or not mine.is_running():
            return False
        try:
            view = node_view(mine.host, mine.port, topic, timeout)
            theirs = node_view(others[0].host, others[0].port, topic, timeout)
        except (OSError, ValueError):
            return False
        return bool(view) and view == theirs

    def whole(self, topics: list[str], timeout: float = 5.0) -> bool:
        """Every node is running, listed in the metadata, and in the ISR of every partition
        of ``topics`` (and of ``__transaction_state``) with a leader."""
        if not all(self.running(n) for n in self.node_ids()):
            return False
        try:
            meta = self._metadata(None, timeout)
        except Exception:  # noqa: BLE001 - not whole: the metadata did not come
            return False
        if len(meta.brokers) != self._nodes:
            return False
        for name in [*topics, TXN_TOPIC]:
            t = meta.topics.get(name)
            if t is None:
                continue
            for p in t.partitions.values():
                if p.leader < 0 or len(p.isrs) != self._nodes:
                    return False
        return True

    def heal(self, topics: list[str] | None = None, timeout: float = 120.0) -> None:
        """Bring every node back: resume the paused, heal the cut, restart the dead; then
        wait until the cluster is whole (:meth:`whole`).

        :raises BrokerError: not whole within ``timeout`` s.
        """
        for node in self.kafka.nodes:
            if node.is_running():
                assert node.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGCONT)
        if self.network is not None:
            self.network.heal_all()
        for node in self.kafka.nodes:
            if not node.is_running():
                self.kafka.restart(node.node_id, wait=True)
        deadline = time.monotonic() + timeout
        while not self.whole(topics or []):
            if time.monotonic() > deadline:
                raise BrokerError(f"the Kafka cluster is not whole {timeout:g} s after healing")
            time.sleep(0.5)
