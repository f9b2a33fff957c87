"""The broker a benchmark runs jobreg on, as its user chose: the embedded one or Apache Kafka.

One place for ``jobreg bench peers``, ``bench soak`` and ``bench audit`` to start "the broker
the user chose" and to say what it is and how durable a write on it is::

    with start_broker(BrokerChoice.kafka(3), progress=print) as broker:
        reg = Registry.connect(broker.bootstrap, "ns", topic_config=broker.topic_config())

* :meth:`BrokerChoice.embedded`: the embedded broker (Tansu, ``memory://``): never on disk.
* :meth:`BrokerChoice.kafka`: Apache Kafka (:class:`~registry.dev.kafka.KafkaCluster`), one
  node or several (from three: replication 3, ``min.insync.replicas=2``), with extra broker
  settings (``log.flush.interval.messages=1`` makes every append fsync before the ack).

A topic jobreg creates on it must have as many replicas as the cluster's
``min.insync.replicas`` needs: :meth:`BrokerChoice.topic_config` gives the
:class:`~registry.log.TopicConfig` (replication ``min(nodes, 3)``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.errors import ConfigError
from registry.log import TopicConfig

if TYPE_CHECKING:
    from registry.dev.broker import EmbeddedBroker
    from registry.dev.kafka import KafkaCluster

__all__ = ["FSYNC_EVERY_APPEND", "BrokerChoice", "StartedBroker", "filesystem", "kafka_missing",
           "start_broker"]

#: The broker setting that makes Kafka fsync a partition's log after every append, before it
#: acknowledges (``UnifiedLog.append`` flushes once the unflushed messages reach it).
FSYNC_EVERY_APPEND: Mapping[str, str] = {"log.flush.interval.messages": "1"}

# Kafka's defaults (ServerLogConfigs, 4.4.0): no flush by count nor by time on the write path.
_KAFKA_FLUSH_DEFAULTS = ("Kafka's defaults never fsync on the write path "
                         "(log.flush.interval.messages and log.flush.scheduler.interval.ms are "
                         "Long.MAX_VALUE, log.flush.interval.ms unset): the OS writes the page "
                         "cache back when it likes")


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


@dataclass(frozen=True)
class BrokerChoice:
    """Which broker to start: ``kafka_nodes`` 0 is the embedded broker, 1 or more Apache Kafka
    with ``kafka_config`` over :meth:`KafkaCluster.node_config`'s settings."""

    kafka_nodes: int = 0
    kafka_config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        nodes = self.kafka_nodes
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
            raise ConfigError(f"kafka_nodes must be 0 (embedded) or more, got {nodes!r}")
        if self.kafka_config and not nodes:
            raise ConfigError("broker settings are for Apache Kafka; the embedded broker "
                              "takes none")

    @classmethod
    def embedded(cls) -> BrokerChoice:
        """The embedded broker (Tansu, memory storage)."""
        return cls()

    @classmethod
    def kafka(cls, nodes: int = 1, config: Mapping[str, str] | None = None) -> BrokerChoice:
        """Apache Kafka, ``nodes`` nodes, with extra broker ``config``."""
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ConfigError(f"Apache Kafka needs 1 node or more, got {nodes!r}")
        return cls(nodes, dict(config or {}))

    @property
    def is_kafka(self) -> bool:
        return self.kafka_nodes > 0

    @property
    def fsyncs(self) -> bool:
        """Whether every append is fsynced before the ack (Kafka with the flush setting)."""
        return self.is_kafka and self.kafka_config.get("log.flush.interval.messages") == "1"

    @property
    def replicas(self) -> int:
        """The replication factor a jobreg topic gets on this broker."""
        return min(self.kafka_nodes, 3) if self.is_kafka else 1

    @property
    def min_insync(self) -> int:
        return 2 if self.kafka_nodes >= 3 else 1

    def topic_config(self, **settings: Any) -> TopicConfig:
        """The :class:`TopicConfig` of a jobreg topic here (``settings`` over it)."""
        return replace(TopicConfig(replication_factor=self.replicas), **settings)

    def describe(self) -> str:
        """One line: which broker, how many nodes, what is set."""
        if not self.is_kafka:
            return "the embedded broker (Tansu, memory storage)"
        from registry.dev.kafka import KAFKA_VERSION

        what = f"Apache Kafka {KAFKA_VERSION}, {_nodes(self.kafka_nodes)}"
        if self.kafka_nodes > 1:
            what += f", replication {self.replicas}, min.insync.replicas {self.min_insync}"
        if self.kafka_config:
            what += ", " + ", ".join(f"{k}={v}" for k, v in self.kafka_config.items())
        return what

    def durability(self, data_dir: str | None = None) -> str:
        """What an acknowledged write has survived by then, on this broker."""
        if not self.is_kafka:
            return ("Tansu's memory engine: the log is never written to disk, so never "
                    "fsynced; a broker restart loses it")
        where = f"; data dirs on {filesystem(data_dir)}" if data_dir else ""
        if self.kafka_nodes == 1:
            acks = ("acks=all on one node: acknowledged once its only replica, the leader, "
                    "appended the batch (the in-sync replicas are the leader alone, "
                    "min.insync.replicas 1)")
        else:
            acks = (f"acks=all on {self.kafka_nodes} nodes: acknowledged once every in-sync "
                    f"replica (of {self.replicas}; fewer than {self.min_insync} refuses the "
                    "write) has fetched the batch into its own log; it survives the loss of "
                    f"{_nodes(self.min_insync - 1)}")
        if self.fsyncs:
            flush = ("log.flush.interval.messages=1: each node fsyncs the partition's log after "
                     "every append (records, transaction markers, __transaction_state) before "
                     "that append counts, so before the ack")
        else:
            flush = (_KAFKA_FLUSH_DEFAULTS + "; a killed node loses nothing acknowledged, a "
                     "crash of the machine (all nodes here share one) can")
        return f"{acks}; {flush}{where}"


@dataclass
class StartedBroker:
    """A broker :func:`start_broker` started: where it answers and what it is."""

    choice: BrokerChoice
    bootstrap: str
    version: str  # "Tansu 0.5.1", "Apache Kafka 4.4.0"
    command: str  # how it was run (the storage flags, or the settings that matter)
    durability: str
    cluster: KafkaCluster | None = None  # Apache Kafka's nodes (kill, pause, leader_of)
    embedded: EmbeddedBroker | None = None  # the embedded broker's process

    def topic_config(self, **settings: Any) -> TopicConfig:
        """The :class:`TopicConfig` of a jobreg topic on this broker."""
        return self.choice.topic_config(**settings)

    def pids(self) -> list[int]:
        """The broker's processes now running: each Kafka node's, or the embedded broker's
        (a benchmark reads their CPU time in ``/proc/<pid>/stat``)."""
        if self.cluster is not None:
            return [n.pid for n in self.cluster.nodes if n.pid is not None]
        pid = self.embedded.pid if self.embedded is not None else None
        return [] if pid is None else [pid]


def filesystem(path: str) -> str:
    """The file system type and device a path lives on (fsync means what the disk does)."""
    real, best = os.path.realpath(path), ("", "?", "?")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > len(best[0]):
                    best = (mnt, fstype, dev)
    except OSError:
        return "unknown file system"
    return f"{best[1]} on {best[2]}"


def kafka_missing() -> str | None:
    """Why Apache Kafka cannot start here (no Java; no jars and no Maven to fetch them), or
    ``None``."""
    from registry.dev.kafka import KAFKA_VERSION, _cache_root

    home = os.environ.get("JAVA_HOME")
    if not (home and os.access(os.path.join(home, "bin", "java"), os.X_OK)) and \
            shutil.which("java") is None:
        return ("java is not installed (Apache Kafka needs Java 17 or newer: apt-get install "
                "openjdk-17-jre-headless)")
    cached = (_cache_root() / f"kafka-{KAFKA_VERSION}" / ".complete").exists()
    if not cached and shutil.which("mvn") is None:
        return (f"Apache Kafka {KAFKA_VERSION}'s jars are not cached and mvn is not installed "
                "to fetch them (apt-get install maven)")
    return None


def _tansu_version(binary: Path) -> str:
    with contextlib.suppress(Exception):
        return "Tansu " + subprocess.run([str(binary), "--version"], capture_output=True,
                                         text=True, timeout=10).stdout.split()[-1]
    return "Tansu"


@contextlib.contextmanager
def start_broker(choice: BrokerChoice, *, directory: str | os.PathLike[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> Iterator[StartedBroker]:
    """Start the chosen broker on 127.0.0.1, yield it, stop it (by pid) at the end.

    ``directory``: where Kafka's nodes keep their data (deleted with the cluster unless
    given); the embedded broker keeps nothing on disk.

    :raises BrokerStartError: it did not start (one line).
    """
    say = progress or (lambda _: None)
    if not choice.is_kafka:
        from registry.dev.broker import EmbeddedBroker, find_tansu_binary

        tansu = find_tansu_binary()
        say("starting an embedded broker")
        with EmbeddedBroker() as broker:
            yield StartedBroker(
                choice, broker.bootstrap, _tansu_version(tansu),
                f"{tansu.name} broker --storage-engine memory://tansu/ (embedded, 127.0.0.1)",
                choice.durability(), embedded=broker)
        return
    from registry.dev.kafka import KAFKA_VERSION, KafkaCluster

    say(f"starting {choice.describe()}")
    cluster = KafkaCluster(choice.kafka_nodes, config=choice.kafka_config, directory=directory,
                           progress=progress)
    with cluster:
        settings = cluster.node_config(cluster.nodes[0])
        shown = ["min.insync.replicas", "default.replication.factor",
                 "transaction.state.log.replication.factor", "log.flush.interval.messages",
                 "log.flush.interval.ms", *choice.kafka_config]
        proc = cluster.nodes[0].proc
        argv = proc.args if proc is not None and isinstance(proc.args, list) else []
        heap = [str(a) for a in argv if str(a).startswith("-Xmx")]
        command = (f"Apache Kafka {KAFKA_VERSION} (KRaft, Maven Central's jars), "
                   f"{_nodes(choice.kafka_nodes)} (combined broker and controller) on 127.0.0.1"
                   + "".join(f", {a}" for a in heap)
                   + f"; topics replication {choice.replicas}; "
                   + ", ".join(f"{k}={settings[k]}" for k in dict.fromkeys(shown)
                               if k in settings))
        yield StartedBroker(choice, cluster.bootstrap, f"Apache Kafka {KAFKA_VERSION}",
                            command, choice.durability(str(cluster.nodes[0].log_dir)), cluster)
