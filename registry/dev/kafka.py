"""Apache Kafka from its Maven jars, on loopback, for development, tests and benchmarks.

:class:`KafkaCluster` runs a pinned Apache Kafka release (:data:`KAFKA_VERSION`) in KRaft
mode: one node, or several (each a combined broker and controller with its own log
directory and ports, a static controller quorum, replication factor ``nodes`` and
``min.insync.replicas=2`` from three nodes on, unclean leader election off)::

    with KafkaCluster(nodes=3) as kafka:
        registry = Registry.connect(kafka.bootstrap, "prod")

What it does, in order:

1. **Jars.** :func:`kafka_classpath` fetches ``org.apache.kafka:kafka_2.13`` and its
   runtime dependencies from Maven Central once, with the machine's ``mvn``, into a cache
   outside the source tree (``$JOBREG_KAFKA_CACHE``, else ``$XDG_CACHE_HOME/jobreg`` or
   ``~/.cache/jobreg``), plus the log4j binding that Kafka's POM leaves to its release
   tarball. Nothing is fetched at import time, and a cache that is complete is never asked
   about again.
2. **Format.** Each node's log directory is formatted with Kafka's ``StorageTool`` under one
   fresh cluster id (a separate JVM per node, run at once).
3. **Start.** Each node is a ``java ... kafka.Kafka server.properties`` process, started
   like the embedded broker (``setpriv --pdeathsig KILL`` on Linux, so a node dies with the
   process that started it, even one killed with SIGKILL), listening on 127.0.0.1 only.
4. **Ready.** It waits until every node answers the Kafka protocol with the cluster id it
   was formatted with and the cluster's metadata lists every node. A cluster without its
   PLAINTEXT client listener (``plaintext=False``: security on every listener, as
   ``tests/support/kafka_security.py`` runs it) is asked through its first listener with the
   administrator's ``client_config`` (DescribeCluster, then Metadata).
5. **Stop.** SIGTERM to each node it started, by its pid, then SIGKILL after a bound; the
   directories it made are deleted unless the caller gave one.

Every failure is one line (:class:`BrokerStartError`): no Java, no Maven, a port taken, a
failed fetch or format, a node that exited or did not answer (with the last lines of its
log). Single nodes can be killed, frozen, thawed and restarted for fault tests
(:meth:`KafkaCluster.kill`, :meth:`pause`, :meth:`resume`, :meth:`restart`).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from registry.dev.broker import (
    _free_port,
    _popen,
    _probe_cluster_id,
    _ProtocolError,
    _track,
    _untrack,
    _with_parent_death_signal,
)
from registry.errors import BrokerError, BrokerStartError, ConfigError

__all__ = ["CACHE_ENV", "KAFKA_VERSION", "KafkaCluster", "KafkaNode", "kafka_classpath",
           "kafka_tools_classpath", "spark_kafka_jars"]

_log = logging.getLogger(__name__)

#: The Apache Kafka release jobreg tests and benchmarks against (Maven Central's
#: ``org.apache.kafka:kafka_2.13``).
KAFKA_VERSION = "4.4.0"
#: The log4j2 release Kafka 4.4.0's POM brings (``log4j-core``); its SLF4J 1.x binding
#: (``log4j-slf4j-impl``) is only in Kafka's tarball, so it is fetched beside.
_LOG4J_VERSION = "2.25.5"
#: Environment variable naming the jar cache (default ``~/.cache/jobreg``).
CACHE_ENV = "JOBREG_KAFKA_CACHE"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>jobreg.dev</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

# Log4j2 for a node: its server log, and the cleaner's own log (the proof that it cleaned).
_LOG4J2 = """status = warn
appender.server.type = File
appender.server.name = server
appender.server.fileName = ${sys:kafka.logs.dir}/server.log
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.cleaner.type = File
appender.cleaner.name = cleaner
appender.cleaner.fileName = ${sys:kafka.logs.dir}/log-cleaner.log
appender.cleaner.layout.type = PatternLayout
appender.cleaner.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.server.ref = server
logger.cleaner.name = org.apache.kafka.storage.internals.log
logger.cleaner.level = info
logger.cleaner.additivity = false
logger.cleaner.appenderRef.cleaner.ref = cleaner
logger.cleaner2.name = kafka.log.LogCleaner
logger.cleaner2.level = info
logger.cleaner2.additivity = false
logger.cleaner2.appenderRef.cleaner.ref = cleaner
"""

_LOG_TAIL_LINES = 12
_JVM_OPTS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
             "-XX:TieredStopAtLevel=1")


def _cache_root() -> pathlib.Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return pathlib.Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jobreg"


def _need(program: str, what: str) -> str:
    found = shutil.which(program)
    if found is None:
        raise BrokerStartError(f"{program} not found on PATH: Apache Kafka needs {what}")
    return found


def java_binary() -> str:
    """The ``java`` to run Kafka with: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return _need("java", "Java 17 or newer (apt-get install openjdk-17-jre-headless)")


_fetch_lock = threading.Lock()


def kafka_classpath(progress: Callable[[str], None] | None = None) -> list[pathlib.Path]:
    """The jars of Apache Kafka :data:`KAFKA_VERSION`, fetched from Maven Central on first use.

    The jars go to ``<cache>/kafka-<version>/libs`` (see the module docstring); a finished
    fetch leaves a ``.complete`` mark, and a cache with it is used without asking Maven.
    ``progress`` is told, in one line, when a fetch starts and ends.

    :raises BrokerStartError: no ``mvn``, or Maven could not fetch the jars (the line names
        the last thing Maven said).
    """
    home = _cache_root() / f"kafka-{KAFKA_VERSION}"
    libs = home / "libs"
    mark = home / ".complete"
    with _fetch_lock:
        if not mark.exists():
            started = time.monotonic()
            with _maven_fetch(f"Apache Kafka {KAFKA_VERSION}", home, progress,
                              lambda work: ["-f", str(work / "pom.xml"),
                                            "dependency:copy-dependencies",
                                            "-DincludeScope=runtime",
                                            f"-DoutputDirectory={work / 'libs'}"],
                              pom=_POM.format(kafka=KAFKA_VERSION, log4j=_LOG4J_VERSION)
                              ) as work:
                shutil.rmtree(libs, ignore_errors=True)
                os.replace(work / "libs", libs)
                mark.write_text(f"{KAFKA_VERSION}\n")
            if progress is not None:
                progress(f"fetched {len(list(libs.glob('*.jar')))} jars in "
                         f"{time.monotonic() - started:.1f} s")
    jars = sorted(libs.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        raise BrokerStartError(f"the jar cache {libs} lacks kafka_2.13; delete {home} "
                               "and start again")
    return jars


def kafka_tools_classpath(progress: Callable[[str], None] | None = None) -> list[pathlib.Path]:
    """:func:`kafka_classpath` plus Kafka's command-line tools (``org.apache.kafka:kafka-tools``:
    ``org.apache.kafka.tools.DumpLogSegments``, ``org.apache.kafka.tools.consumer.ConsoleConsumer``
    and the rest), fetched from Maven Central on first use into ``<cache>/kafka-<version>/tools``.

    Only the one jar: its POM also brings ``connect-runtime`` and its dependencies, which the
    segment dumper and the console consumer do not load (they run on the broker's jars).
    Kept apart from the broker's ``libs`` so that a node's classpath stays as Kafka's POM
    makes it. Raises :class:`BrokerStartError` as :func:`kafka_classpath` does.
    """
    jars = kafka_classpath(progress)
    home = _cache_root() / f"kafka-{KAFKA_VERSION}" / "tools"
    jar = home / f"kafka-tools-{KAFKA_VERSION}.jar"
    with _fetch_lock:
        if not jar.exists():
            what = f"kafka-tools {KAFKA_VERSION}"
            with _maven_fetch(what, home, progress,
                              lambda work: ["dependency:copy",
                                            f"-Dartifact=org.apache.kafka:kafka-tools:"
                                            f"{KAFKA_VERSION}",
                                            f"-DoutputDirectory={work}"]) as work:
                fetched = work / jar.name
                if not fetched.exists():
                    raise BrokerStartError(f"Maven could not fetch {what}: it left no "
                                           f"{jar.name}")
                os.replace(fetched, jar)
    return [*jars, jar]


_SPARK_KAFKA_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>jobreg.dev</groupId><artifactId>spark-kafka</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_2.13</artifactId><version>{spark}</version></dependency>
  </dependencies>
</project>
"""


def spark_kafka_jars(version: str, progress: Callable[[str], None] | None = None, *,
                     download: bool = True) -> list[pathlib.Path] | None:
    """Spark's Kafka connector ``org.apache.spark:spark-sql-kafka-0-10_2.13:<version>`` and
    its runtime dependencies (``spark-token-provider-kafka-0-10``, ``kafka-clients``,
    ``commons-pool2``, and what Spark itself ships too), fetched from Maven Central on first
    use into ``<cache>/spark-kafka-<version>/libs`` as :func:`kafka_classpath` fetches
    Kafka's (a ``.complete`` mark; the cache is ``$JOBREG_KAFKA_CACHE`` or
    ``~/.cache/jobreg``). Maven is told to look again (``-U``) so that a miss it remembers
    from an earlier try does not stand in for Maven Central's answer. With
    ``download=False``, the cache only: None when it does not hold them.

    :raises BrokerStartError: no ``mvn``, or Maven could not fetch them (one line, with what
        Maven said: ``Could not find artifact ...`` when Maven Central has no such version).
    """
    what = f"Spark's Kafka connector {version}"
    home = _cache_root() / f"spark-kafka-{version}"
    libs = home / "libs"
    mark = home / ".complete"
    with _fetch_lock:
        if not mark.exists():
            if not download:
                return None
            if shutil.which("mvn") is None:
                raise BrokerStartError(f"mvn not found on PATH: Maven fetches {what} from "
                                       "Maven Central once (apt-get install maven)")
            with _maven_fetch(what, home, progress,
                              lambda work: ["-U", "-f", str(work / "pom.xml"),
                                            "dependency:copy-dependencies",
                                            "-DincludeScope=runtime",
                                            f"-DoutputDirectory={work / 'libs'}"],
                              pom=_SPARK_KAFKA_POM.format(spark=version)) as work:
                shutil.rmtree(libs, ignore_errors=True)
                os.replace(work / "libs", libs)
                mark.write_text(f"{version}\n")
    return sorted(libs.glob("*.jar"))


@contextlib.contextmanager
def _maven_fetch(what: str, home: pathlib.Path, progress: Callable[[str], None] | None,
                 goal: Callable[[pathlib.Path], list[str]],
                 pom: str | None = None) -> Iterator[pathlib.Path]:
    """Run Maven's ``goal`` (given the scratch folder) in a scratch folder under ``home``,
    with ``pom`` as its ``pom.xml`` if given, and yield the folder for the caller to take
    what Maven left there; the folder is removed afterwards. Needs ``mvn``; a failed fetch
    is one line (:func:`_run_or_say`)."""
    mvn = _need("mvn", f"Maven to fetch {what} from Maven Central once "
                       "(apt-get install maven)")
    home.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
    try:
        if pom is not None:
            (work / "pom.xml").write_text(pom)
        if progress is not None:
            progress(f"fetching {what} from Maven Central into {home} (once)")
        _run_or_say(f"Maven could not fetch {what}", [mvn, "-q", "-B", *goal(work)], cwd=work)
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_or_say(failure: str, argv: list[str], cwd: pathlib.Path | None = None) -> None:
    """Run ``argv`` to its end; if it fails, raise :class:`BrokerStartError` of one line:
    ``failure``, then Maven's first ``[ERROR]`` line if there is one (the lines after it are
    advice), else the last line the program said (Kafka's tools say why last)."""
    done = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        # Maven says why in its first [ERROR] line; the lines after it are advice on -e/-X
        plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in said]  # Maven's colours
        errors = [line[len("[ERROR] "):] for line in plain if line.startswith("[ERROR] ")]
        last = (errors[0] if errors else said[-1]).strip() if said else \
            f"exit code {done.returncode}"
        last = last.removesuffix("-> [Help 1]").strip()
        raise BrokerStartError(f"{failure}: {last[:300]}")


def _kafka_uuid() -> str:
    """A cluster id as Kafka writes one: 16 random bytes, URL-safe base64 without padding
    (never starting with '-', which its command line would take for an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _port_taken(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


@dataclass
class KafkaNode:
    """One node of a :class:`KafkaCluster`: a combined KRaft broker and controller."""

    node_id: int
    port: int
    controller_port: int
    directory: pathlib.Path
    extra_listeners: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    """The address every listener of the node binds and advertises."""
    netns: str | None = None
    """The network namespace the node runs in (``ip netns exec``), or ``None``: this one."""

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_dir(self) -> pathlib.Path:
        """Where the node keeps its partitions (Kafka's ``log.dirs``)."""
        return self.directory / "data"

    @property
    def logs(self) -> pathlib.Path:
        """Where the node's own log files go (``server.log``, ``log-cleaner.log``)."""
        return self.directory / "logs"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the node's console output and server log."""
        out = []
        for name in ("console.log", "logs/server.log"):
            path = self.directory / name
            with contextlib.suppress(OSError):
                data = path.read_bytes()[-8192:].decode("utf-8", "replace")
                out += [line for line in data.splitlines() if line.strip()]
        return "\n".join(out[-lines:])


class KafkaCluster:
    """Apache Kafka :data:`KAFKA_VERSION` in KRaft mode on 127.0.0.1, ``nodes`` combined nodes.

    :param nodes: how many nodes (1 or more; 3 for the replicated cluster).
    :param directory: where the nodes' folders go (kept after :meth:`stop`); ``None`` makes
        a temporary one, deleted on :meth:`stop`.
    :param ports: each node's client port; ``None`` picks free ones.
    :param config: extra broker settings for every node (``{"log.cleaner.backoff.ms":
        "200"}``), over jobreg's defaults (see :meth:`node_config`).
    :param heap: the JVM heap of each node (``-Xmx``).
    :param startup_timeout: seconds to wait for the whole cluster to answer.
    :param progress: told in one line what is being done (a fetch, a format, a start).
    :param scram: ``{user: password}`` SCRAM-SHA-512 credentials written at format time.
    :param listeners: extra listeners, each ``NAME`` (its security protocol is the name,
        e.g. ``SASL_SSL``) or ``NAME:PROTOCOL`` (``BROKER:SASL_SSL``); each gets a free port
        on every node (:meth:`listener_bootstrap`); their settings (``sasl.*``, ``ssl.*``,
        ``listener.name.<name>.*``, ``inter.broker.listener.name``) come with ``config``.
    :param plaintext: whether every node has a ``PLAINTEXT`` client listener (the default).
        Without it a node's :attr:`~KafkaNode.port` and :attr:`bootstrap` are those of the
        first of ``listeners``, and readiness is asked there with ``client_config``.
    :param client_config: librdkafka properties of the cluster's own clients (the readiness
        probe, :meth:`leader_of`): how an administrator logs in on ``listeners[0]``, when
        there is no ``PLAINTEXT`` listener.
    :param controller_protocol: the security protocol of the controller listener
        (``PLAINTEXT``, or ``SSL`` with its ``listener.name.controller.ssl.*`` in
        ``config``; SCRAM cannot serve it: the credentials live in the metadata the
        controllers serve).
    :param hosts: each node's address (default ``127.0.0.1``), and
    :param netns: the network namespace each node runs in (``None``: this one). A fault
        campaign puts each node in a namespace of its own, on that namespace's address, so
        that it can cut one node off from the others (:mod:`registry.dev.torture.netsplit`);
        the caller makes and removes the namespaces.
    """

    def __init__(self, nodes: int = 1, *, directory: str | os.PathLike[str] | None = None,
                 ports: Sequence[int] | None = None, config: Mapping[str, str] | None = None,
                 heap: str = "384m", startup_timeout: float = 90.0,
                 progress: Callable[[str], None] | None = None,
                 scram: Mapping[str, str] | None = None,
                 listeners: Sequence[str] = (), plaintext: bool = True,
                 client_config: Mapping[str, str] | None = None,
                 controller_protocol: str = "PLAINTEXT",
                 hosts: Sequence[str] | None = None,
                 netns: Sequence[str | None] | None = None) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ConfigError(f"nodes must be a positive int, got {nodes!r}")
        if ports is not None:
            if len(ports) != nodes:
                raise ConfigError(f"{len(ports)} ports given for {nodes} node(s)")
            for p in ports:
                if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
                    raise ConfigError(f"port must be an int in 1..65535, got {p!r}")
        for given, what in ((hosts, "hosts"), (netns, "netns")):
            if given is not None and len(given) != nodes:
                raise ConfigError(f"{len(given)} {what} given for {nodes} node(s)")
        self._hosts = list(hosts) if hosts is not None else ["127.0.0.1"] * nodes
        self._netns = list(netns) if netns is not None else [None] * nodes
        if not startup_timeout > 0:
            raise ConfigError(f"startup_timeout must be positive, got {startup_timeout!r}")
        self.size = nodes
        self._requested_ports = list(ports) if ports is not None else None
        self._directory = pathlib.Path(directory) if directory is not None else None
        self._temp: pathlib.Path | None = None
        self._config = dict(config or {})
        self._heap = heap
        self._startup_timeout = float(startup_timeout)
        self._progress = progress
        self._scram = dict(scram or {})
        self._listeners = _parse_listeners(listeners)
        if not plaintext and not self._listeners:
            raise ConfigError("a cluster without its PLAINTEXT listener needs another one "
                              "(listeners=[...]) for its clients")
        self._plaintext = plaintext
        if controller_protocol not in ("PLAINTEXT", "SSL"):
            raise ConfigError(f"controller_protocol must be PLAINTEXT or SSL, not "
                              f"{controller_protocol!r}")
        self._controller_protocol = controller_protocol
        self._client_config = dict(client_config or {})
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
        self.nodes: list[KafkaNode] = []
        #: The cluster id the nodes were formatted with (the readiness probe checks it).
        self.cluster_id: str | None = None
        self._classpath: str | None = None

    # -- addresses -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every node's plaintext address."""
        if not self.nodes:
            raise BrokerError("the Kafka cluster has no nodes yet: call start() first")
        return ",".join(n.bootstrap for n in self.nodes)

    def listener_bootstrap(self, name: str) -> str:
        """``bootstrap.servers`` of the extra listener ``name`` (e.g. ``SASL_SSL``)."""
        return ",".join(f"{n.host}:{n.extra_listeners[name]}" for n in self.nodes)

    @property
    def pids(self) -> list[int | None]:
        return [n.pid for n in self.nodes]

    def __repr__(self) -> str:
        running = sum(n.is_running() for n in self.nodes)
        where = self.bootstrap if self.nodes else "<not started>"
        return f"<KafkaCluster {KAFKA_VERSION} {where} {running}/{self.size} running>"

    def node_config(self, node: KafkaNode) -> dict[str, str]:
        """The broker settings of ``node``: jobreg's defaults, then the caller's ``config``."""
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)
        replicas = str(min(self.size, 3))
        min_isr = "2" if self.size >= 3 else "1"
        listeners = [f"CONTROLLER://{node.host}:{node.controller_port}"]
        advertised = []
        protocols = [f"CONTROLLER:{self._controller_protocol}"]
        if self._plaintext:
            listeners.insert(0, f"PLAINTEXT://{node.host}:{node.port}")
            advertised.append(f"PLAINTEXT://{node.host}:{node.port}")
            protocols.insert(0, "PLAINTEXT:PLAINTEXT")
        for name, port in node.extra_listeners.items():
            listeners.append(f"{name}://{node.host}:{port}")
            advertised.append(f"{name}://{node.host}:{port}")
            protocols.append(f"{name}:{self._listeners[name]}")
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join(protocols),
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(node.log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "unclean.leader.election.enable": "false",
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": "0",
            # A fresh cluster on 2 cores: small buffers, few threads.
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "2",
            "delete.topic.enable": "true",
        }
        settings.update(self._config)
        return settings

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        """Fetch the jars if needed, format every node, start them, wait until all answer.

        :raises BrokerStartError: see the module docstring; nothing is left running.
        """
        with self._lock:
            if any(n.is_running() for n in self.nodes):
                raise BrokerError(f"the Kafka cluster is already running on {self.bootstrap}")
            java = java_binary()
            jars = kafka_classpath(self._progress)
            self._classpath = os.pathsep.join(str(j) for j in jars)
            self._java = java
            root = self._directory
            if root is None:
                self._temp = pathlib.Path(tempfile.mkdtemp(prefix="jobreg-kafka-"))
                root = self._temp
            root.mkdir(parents=True, exist_ok=True)
            try:
                self._layout(root)
                self.cluster_id = _kafka_uuid()
                self._say(f"formatting {self.size} node(s) (Apache Kafka {KAFKA_VERSION}, "
                          "KRaft)")
                with ThreadPoolExecutor(self.size) as pool:
                    list(pool.map(self._format, self.nodes))
                self._say("starting " + ", ".join(
                    f"node {n.node_id} on {n.bootstrap}" for n in self.nodes))
                for node in self.nodes:
                    self._spawn(node)
                self._wait_ready(time.monotonic() + self._startup_timeout)
            except BaseException:  # includes KeyboardInterrupt: never leak a node
                self._kill_all()
                self._remove_temp()
                raise
            _track(self)
            return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node it started (SIGTERM, then SIGKILL after ``timeout`` s), by pid.

        Idempotent. A temporary directory is deleted."""
        with self._lock:
            live = [n for n in self.nodes if n.is_running()]
            for node in live:
                assert node.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGCONT)  # a paused node cannot stop
                    node.proc.terminate()
            deadline = time.monotonic() + timeout
            for node in live:
                assert node.proc is not None
                try:
                    node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()
            _untrack(self)
            self._remove_temp()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- faults on one node ----------------------------------------------------------------

    def node(self, node_id: int) -> KafkaNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise ConfigError(f"no node {node_id} (nodes are "
                          f"{', '.join(str(n.node_id) for n in self.nodes)})")

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (by its pid) and reap it; its directory stays for :meth:`restart`."""
        node = self.node(node_id)
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait()

    def pause(self, node_id: int) -> None:
        """SIGSTOP one node: it holds its connections and answers nothing."""
        node = self.node(node_id)
        if node.is_running():
            assert node.proc is not None
            node.proc.send_signal(signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        """SIGCONT a node frozen by :meth:`pause`."""
        node = self.node(node_id)
        if node.is_running():
            assert node.proc is not None
            node.proc.send_signal(signal.SIGCONT)

    def restart(self, node_id: int, wait: bool = True) -> None:
        """Start a stopped or killed node again on its own directory and ports."""
        node = self.node(node_id)
        with self._lock:
            if node.is_running():
                raise BrokerError(f"node {node_id} is running")
            self._spawn(node)
            if wait:
                self._wait_node(node, time.monotonic() + self._startup_timeout)

    def leader_of(self, topic: str, partition: int, timeout: float = 10.0) -> int:
        """The node id leading ``topic``'s ``partition`` now (from cluster metadata)."""
        live = ",".join(n.bootstrap for n in self.nodes if n.is_running())
        admin = self._admin_client(live)
        meta = admin.list_topics(topic, timeout=timeout)
        leader: int = meta.topics[topic].partitions[partition].leader
        return leader

    # -- internals -------------------------------------------------------------------------

    def _say(self, line: str) -> None:
        _log.info("%s", line)
        if self._progress is not None:
            self._progress(line)

    def _layout(self, root: pathlib.Path) -> None:
        taken: set[int] = set()

        def fresh() -> int:
            for _ in range(20):
                port = _free_port("127.0.0.1")
                if port not in taken:
                    taken.add(port)
                    return port
            raise BrokerStartError("cannot find free ports on 127.0.0.1")

        self.nodes = []
        for port in self._requested_ports or ():
            if _port_taken(port):
                raise BrokerStartError(f"port {port} on 127.0.0.1 is taken: choose "
                                       "another or leave the ports to jobreg")
            taken.add(port)
        for i in range(self.size):
            port = self._requested_ports[i] if self._requested_ports is not None else fresh()
            directory = root / f"node-{i + 1}"
            if directory.exists():
                shutil.rmtree(directory)
            (directory / "logs").mkdir(parents=True)
            extra = {name: fresh() for name in self._listeners}
            if not self._plaintext:  # clients bootstrap to the first listener named
                extra[next(iter(self._listeners))] = port
            node = KafkaNode(node_id=i + 1, port=port, controller_port=fresh(),
                             directory=directory, extra_listeners=extra,
                             host=self._hosts[i], netns=self._netns[i])
            self.nodes.append(node)
        for node in self.nodes:
            lines = [f"{k}={v}" for k, v in self.node_config(node).items()]
            (node.directory / "server.properties").write_text("\n".join(lines) + "\n")
            (node.directory / "log4j2.properties").write_text(
                _LOG4J2.replace("{level}", "INFO"))

    def _java_argv(self, node: KafkaNode, main: str, *args: str, heap: str) -> list[str]:
        assert self._classpath is not None
        return [self._java, f"-Xmx{heap}", *_JVM_OPTS,
                f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={node.logs}",
                "-cp", self._classpath, main, *args]

    def _format(self, node: KafkaNode) -> None:
        args = ["format", "-t", str(self.cluster_id), "-c",
                str(node.directory / "server.properties")]
        for user, password in self._scram.items():
            args += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]"]
        _run_or_say(f"formatting Kafka node {node.node_id} failed",
                    self._java_argv(node, "kafka.tools.StorageTool", *args, heap="256m"))

    def _spawn(self, node: KafkaNode) -> None:
        console = open(node.directory / "console.log", "ab")  # noqa: SIM115 - the child keeps it
        # `ip netns exec` execs the JVM in place: the pid, and the parent-death signal set
        # before it, stay the node's.
        inside = ["ip", "netns", "exec", node.netns] if node.netns is not None else []
        try:
            node.proc = _popen(
                _with_parent_death_signal([*inside, *self._java_argv(
                    node, "kafka.Kafka", str(node.directory / "server.properties"),
                    heap=self._heap)]),
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True)
        except OSError as e:
            raise BrokerStartError(f"cannot run java for Kafka node {node.node_id}: {e}") from e
        finally:
            console.close()
        self._owner_pid = os.getpid()

    def _admin_client(self, bootstrap: str, errors: list[str] | None = None) -> Any:
        """An AdminClient of the cluster's own (``client_config``) for ``bootstrap``;
        ``errors`` collects what librdkafka reports (a refused login, a failed handshake)."""
        from confluent_kafka.admin import AdminClient

        settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 0,
                                    **self._client_config}
        if errors is not None:
            settings["error_cb"] = lambda err: errors.append(err.str())
        return AdminClient(settings)

    def _wait_node(self, node: KafkaNode, deadline: float) -> None:
        assert node.proc is not None
        errors: list[str] = []
        admin = None if self._plaintext else self._admin_client(node.bootstrap, errors)
        while True:
            code = node.proc.poll()
            if code is not None:
                raise BrokerStartError(_with_tail(
                    f"Kafka node {node.node_id} (pid {node.proc.pid}) exited with code {code} "
                    f"before answering on {node.bootstrap}", node))
            if time.monotonic() > deadline:
                said = f" (its client said: {errors[-1]})" if errors else ""
                raise BrokerStartError(_with_tail(
                    f"Kafka node {node.node_id} (pid {node.proc.pid}) did not answer on "
                    f"{node.bootstrap} within {self._startup_timeout:g} s{said}", node))
            try:
                found = (_probe_cluster_id((node.host, node.port), timeout=1.0)
                         if admin is None else _described_cluster_id(admin))
            except (OSError, _ProtocolError, _NotYet):
                time.sleep(0.2)
                continue
            if found != self.cluster_id:
                raise BrokerStartError(f"another Kafka cluster ({found!r}) answers on "
                                       f"{node.bootstrap}; choose another port")
            return

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka import KafkaException

        for node in self.nodes:
            self._wait_node(node, deadline)
        admin = self._admin_client(self.bootstrap)
        try:
            while True:
                try:
                    meta = admin.list_topics(timeout=2)
                    if len(meta.brokers) == self.size:
                        break
                except KafkaException:
                    pass
                for node in self.nodes:
                    if not node.is_running():
                        self._wait_node(node, deadline)  # raises with its log
                if time.monotonic() > deadline:
                    raise BrokerStartError(
                        f"the Kafka cluster did not list its {self.size} nodes within "
                        f"{self._startup_timeout:g} s")
                time.sleep(0.2)
        finally:
            del admin
        self._say(f"Apache Kafka {KAFKA_VERSION}: {self.size} node(s) answering on "
                  f"{self.bootstrap}")

    def _kill_all(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=10)

    def _remove_temp(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None


class _NotYet(Exception):
    """A node's listener does not answer its admin client yet."""


def _described_cluster_id(admin: Any) -> str | None:
    """The cluster id ``admin``'s node reports (DescribeCluster), asked over whatever
    listener and login the client has; :class:`_NotYet` while it cannot say."""
    from confluent_kafka import KafkaException

    try:
        found: str | None = admin.describe_cluster(request_timeout=1.0).result(timeout=2.0)\
            .cluster_id
    except (KafkaException, TimeoutError) as e:
        raise _NotYet(str(e)) from e
    return found


def _parse_listeners(listeners: Sequence[str]) -> dict[str, str]:
    """``{name: security protocol}`` of ``NAME`` or ``NAME:PROTOCOL`` entries."""
    known = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
    out: dict[str, str] = {}
    for entry in listeners:
        name, _, protocol = str(entry).partition(":")
        protocol = protocol or name
        if not name.replace("_", "").isalnum() or name.upper() in ("CONTROLLER", "PLAINTEXT") \
                or protocol not in known or name in out:
            raise ConfigError(f"listener {entry!r}: give NAME or NAME:PROTOCOL with a new "
                              f"NAME (not CONTROLLER nor PLAINTEXT) and PROTOCOL one of "
                              f"{', '.join(sorted(known))}")
        out[name] = protocol
    return out


def _with_tail(message: str, node: KafkaNode) -> str:
    tail = node.log_tail()
    if not tail:
        return message
    last = tail.splitlines()[-1].strip()
    return f"{message}; its log ends: {last[:300]} (more in {node.directory})"
