"""``jobreg bench peers``: jobreg next to etcd and ZooKeeper, one workload on every store.

The two peers are what coordinators use for the same job today, started from Debian's packages
(``etcd-server``, ``zookeeper``) as child processes on loopback, each with its data in a fresh
temporary directory, and stopped by pid at the end (also on an error or Ctrl-C):

* **ZooKeeper, Flink-style** (kazoo): a submit creates the graph znode, then one ``multi`` of:
  check the leader znode's version (the fence), create the job's pointer znode, its ``locks``
  child and an ephemeral lock znode in the leader's session.
* **etcd, Kubernetes-HA-style** (aetcd, etcd's gRPC API): a submit is one transaction that
  compares the leader key's ``mod_revision`` with the one the leader's CAS wrote (the fence)
  and puts the job key (owner and graph key) and the graph key.
* **jobreg**: ``Term.submit`` on the embedded broker, as ``jobreg bench core`` does, and the
  same on Apache Kafka (:mod:`registry.dev.brokers`, :class:`~registry.dev.kafka.KafkaCluster`):
  ``kafka`` one node, ``kafka3`` three nodes (topics of replication 3,
  ``min.insync.replicas=2``), ``kafka-fsync`` one node with ``log.flush.interval.messages=1``
  (every append fsynced before the ack, as etcd and ZooKeeper do).

The workload, the same on each store, one job per call unless said otherwise:

1. one writer: ``submits`` submits one at a time, p50/p99 (and its rate, which is one
   namespace's rate for row 5);
2. ``writers`` concurrent writers of one leader (8 and 64 by default), ``calls`` submits in all
   per level: throughput and p50/p99 of a call. jobreg: that many threads calling
   ``term.submit`` on one :class:`~registry.client.Term` from ``claim_leadership``; etcd:
   asyncio tasks on one gRPC channel; ZooKeeper: threads on one session;
3. each store's native batch of 1,000 jobs in one atomic call (jobreg ``submit_many``, one etcd
   transaction, one ZooKeeper ``multi``), which also creates the live jobs of the failover;
4. failover of those ``jobs`` live jobs, from the new leader's claim until every job's graph
   has been read and every lock is the new leader's:

   * jobreg: the jobs' leader is elected (``elect``, a :data:`FAILOVER_LEASE` lease) and a
     standby waits in ``elect`` meanwhile, folding the log in its rounds (hot); the leader
     stops renewing after its last write, the standby claims once the lease ran out, writes
     one job, and ``recover()`` hands every job to a hook and adopts it. Figures: its claim,
     claim -> every job handed to the hook, claim -> all adopted, and (jobreg only) the old
     leader's last write -> the new leader's first write, with and without the lease wait.
     Then once more from a cold start (``Registry.connect`` inside the clock);
   * etcd: read the leader key and CAS it (txn on its ``mod_revision``), one range read of the
     job keys and one of the graphs, then transactions of 1,000 lock rewrites each (fenced by
     the new leader's revision);
   * ZooKeeper: the old leader's session is closed first (its ephemeral locks go, as when it
     expires); then read and CAS the leader znode (``set`` with its version), ``getChildren``
     of the jobs, a pipelined ``get`` of every pointer and every graph, then ``multi``s of
     1,000 lock creations, each fenced by a check of the leader znode's version;

5. jobreg only: ``namespaces`` namespaces with a leader each, ``calls`` submits in all, as
   users run them, a leader process each (:mod:`registry.dev.bench_leader`, all released at
   once), then as registries, terms and threads of one process; on a topic of their own, one
   partition per namespace unless ``namespace_partitions`` says otherwise
   (:class:`NamespaceLayout`): the aggregate rate next to one namespace's (row 1) in the same
   run, and the CPU a call costs the clients and the broker (what bounds the aggregate).

Durability differs and the output says how: the embedded broker (Tansu, ``memory://``) never
writes to disk; Kafka acknowledges (acks=all) once its in-sync replicas have appended the
batch, and fsyncs only with the flush setting (its defaults never flush on the write path);
etcd fsyncs its WAL and ZooKeeper its transaction log (``forceSync=yes``) before they
acknowledge, and the run reads each of those two servers' own fsync counter to show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.dev.brokers import (
    FSYNC_EVERY_APPEND,
    BrokerChoice,
    filesystem,
    kafka_missing,
    start_broker,
)
from registry.extras import require

__all__ = ["JOBREG_STORES", "KAFKA_STORES", "PEERS", "STORES", "WRITERS", "Concurrent", "PeerStartError", "PeersError", "PeersFigures",
           "StoreFigures", "bench_peers", "format_peers", "missing_peers"]

STORES = ("jobreg", "kafka", "kafka3", "kafka-fsync", "etcd", "zookeeper")
#: The stores that are jobreg, and the broker each runs on.
JOBREG_STORES: dict[str, BrokerChoice] = {
    "jobreg": BrokerChoice.embedded(),
    "kafka": BrokerChoice.kafka(1),
    "kafka3": BrokerChoice.kafka(3),
    "kafka-fsync": BrokerChoice.kafka(1, FSYNC_EVERY_APPEND),
}
KAFKA_STORES = tuple(s for s, c in JOBREG_STORES.items() if c.is_kafka)
PEERS = ("etcd", "zookeeper")
#: Each store's name in the progress lines and the notes; the table's columns are
#: :data:`HEADERS`.
TITLES = {"jobreg": "jobreg", "kafka": "jobreg on Kafka", "kafka3": "jobreg on Kafka x3",
          "kafka-fsync": "jobreg on Kafka (fsync)", "etcd": "etcd", "zookeeper": "ZooKeeper"}
HEADERS = {"jobreg": "jobreg", "kafka": "kafka", "kafka3": "kafka3",
           "kafka-fsync": "kafka-fsync", "etcd": "etcd", "zookeeper": "ZooKeeper"}
GRAPH_BYTES = 2048
BATCH = 1000  # jobs per native batch (submit_many, txn, multi) and per failover lock batch
WRITERS = (8, 64)  # concurrent writers of one leader, one job per call
WARM_UP = 50  # untimed submits first, as in bench core
FAILOVER_LEASE = 2.0  # seconds: the lease of jobreg's elected leader and standby (row 4)
ETCD_MAX_TXN_OPS = 2048  # so that a batch of 1,000 jobs (two puts each) fits one transaction
# A batch of 1,000 jobs with their 2 KiB graphs is ~2.2 MB: above etcd's default request limit
# (1.5 MiB) and ZooKeeper's jute.maxbuffer (1 MiB); both servers are started with room for it.
BATCH_REQUEST_BYTES = 8 * 2**20
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"  # Debian's zookeeper package
INSTALL_HINT = "pip install 'jobreg[peers]'"

_Progress = Callable[[str], None]


# -- what is installed --------------------------------------------------------------------------


def _etcd_binary() -> str | None:
    override = os.environ.get("JOBREG_ETCD_BIN")
    if override:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("etcd") or (
        "/usr/sbin/etcd" if os.access("/usr/sbin/etcd", os.X_OK) else None)


def _zookeeper_jar() -> str | None:
    jar = os.environ.get("JOBREG_ZOOKEEPER_JAR", ZOOKEEPER_JAR)
    return jar if os.path.isfile(jar) else None


def _java() -> str | None:
    return os.environ.get("JOBREG_JAVA") or shutil.which("java")


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_peers(stores: tuple[str, ...] = PEERS) -> dict[str, str]:
    """For each store of ``stores`` that cannot run here (a peer, or jobreg on Apache Kafka),
    one line saying why and how to install it."""
    missing: dict[str, str] = {}
    kafka = [s for s in stores if s in KAFKA_STORES]
    why = kafka_missing() if kafka else None
    if why is not None:
        missing.update({s: f"{s} skipped: {why}" for s in kafka})
    if "etcd" in stores:
        if _etcd_binary() is None:
            missing["etcd"] = ("etcd skipped: the etcd server is not installed (Debian package "
                               "etcd-server: apt-get install etcd-server, or make peers)")
        elif not _importable("aetcd"):
            missing["etcd"] = (f"etcd skipped: its Python client aetcd is missing "
                               f"({INSTALL_HINT})")
    if "zookeeper" in stores:
        if _zookeeper_jar() is None:
            missing["zookeeper"] = ("ZooKeeper skipped: the ZooKeeper server is not installed "
                                    "(Debian package zookeeper: apt-get install zookeeper, or "
                                    "make peers)")
        elif _java() is None:
            missing["zookeeper"] = ("ZooKeeper skipped: java is not installed (ZooKeeper needs "
                                    "Java 17: apt-get install default-jre-headless)")
        elif not _importable("kazoo"):
            missing["zookeeper"] = (f"ZooKeeper skipped: its Python client kazoo is missing "
                                    f"({INSTALL_HINT})")
    return missing


# -- figures -------------------------------------------------------------------------------------


@dataclass
class Concurrent:
    """One level of concurrent single-job submits: the rate and each call's latency."""

    writers: int
    calls: int  # calls answered (failed ones excluded)
    jobs_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int = 0  # calls that raised one of the counted errors (the writer then stopped)
    failure: str = ""  # the first of them: how long it took and what it said


@dataclass
class Namespaces(Concurrent):
    """The namespaces row: ``writers`` namespaces with a leader each, one writer each, in one
    process (threads) or a process each; the rate is the aggregate. Where the time went:
    ``client_cpu_s`` (the leaders' processes, librdkafka's threads included;
    ``client_rdkafka_cpu_s`` those threads alone) and ``broker_cpu_s`` (the broker's
    processes, from ``/proc/<pid>/stat``) over the timed phase, ``elapsed_s`` long
    (``None``: not measured here); ``partitions`` the topic's, ``shared`` the most
    namespaces on one partition."""

    processes: bool = False
    elapsed_s: float = 0.0
    client_cpu_s: float | None = None
    client_rdkafka_cpu_s: float | None = None  # of client_cpu_s: librdkafka's threads
    broker_cpu_s: float | None = None
    partitions: int = 0
    shared: int = 1

    def per_call_ms(self, cpu_s: float | None) -> float | None:
        """CPU seconds over the timed phase per answered call, in ms."""
        return cpu_s / self.calls * 1000 if cpu_s is not None and self.calls else None

    def ceiling(self, cores: int) -> float | None:
        """The rate ``cores`` cores could give at this run's client and broker CPU per call,
        were they spent on nothing else (the CPU bound of the aggregate)."""
        cpu = (self.client_cpu_s or 0.0) + (self.broker_cpu_s or 0.0)
        if self.client_cpu_s is None or self.broker_cpu_s is None or not cpu:
            return None
        return cores * self.calls / cpu


@dataclass
class StoreFigures:
    """One store's figures and how it was run."""

    store: str
    version: str = ""
    command: str = ""  # the server's command line (or the broker's storage flags)
    durability: str = ""
    fsyncs: int | None = None  # the server's own fsync counter over the run
    submit_p50_ms: float = 0.0
    submit_p99_ms: float = 0.0
    single_jobs_per_s: float = 0.0  # the one writer's rate: one namespace's
    concurrent: dict[int, Concurrent] = field(default_factory=dict)  # by writers
    batch_jobs_per_s: float = 0.0  # native batches of BATCH jobs, one atomic call each
    failover_claim_s: float = 0.0
    failover_s: float = 0.0  # from the claim until every job is taken over
    failover_cold_s: float | None = None  # jobreg only: a standby that starts cold
    # jobreg only (row 4): the hot standby's figures beside failover_s, the cold one's share
    # of connecting (folding the log), and the failover with the election's lease wait.
    failover_handed_s: float | None = None  # from the claim until every job was handed
    failover_cold_connect_s: float | None = None
    failover_elected_s: float | None = None  # the old leader's last write -> the new one's first
    failover_elected_claim_s: float | None = None  # the same from the claim
    namespaces: Namespaces | None = None  # jobreg only: a leader thread per namespace
    namespace_processes: Namespaces | None = None  # jobreg only: a leader process each


@dataclass
class PeersFigures:
    """Figures of one ``bench peers`` run."""

    submits: int
    jobs: int
    calls: int = 2000
    writers: tuple[int, ...] = WRITERS
    namespaces: int = 16
    namespace_partitions: int = 0  # the namespaces' topic's partitions (0: one per namespace)
    stores: dict[str, StoreFigures] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def _percentile(samples: list[float], q: float) -> float:
    """The same nearest-rank percentile as ``jobreg bench core``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _one_at_a_time(submit: Callable[[str, bytes], object], submits: int,
                   f: StoreFigures) -> None:
    """``submits`` submits, one at a time, after a warm-up: p50/p99 and the rate."""
    for i in range(WARM_UP):
        submit(f"warm-{i}", _graph(i))
    lat = []
    t0 = time.perf_counter()
    for i in range(submits):
        graph = _graph(i)
        t1 = time.perf_counter()
        submit(f"single-{i}", graph)
        lat.append((time.perf_counter() - t1) * 1000)
    _latency(lat, f, time.perf_counter() - t0)


def _latency(lat_ms: list[float], f: StoreFigures, elapsed_s: float) -> None:
    f.submit_p50_ms = statistics.median(lat_ms)
    f.submit_p99_ms = _percentile(lat_ms, 0.99)
    f.single_jobs_per_s = len(lat_ms) / elapsed_s


def _summary(writers: int, lat_ms: list[float], elapsed_s: float) -> Concurrent:
    if not lat_ms:
        return Concurrent(writers, 0, 0.0, 0.0, 0.0)
    return Concurrent(writers, len(lat_ms), len(lat_ms) / elapsed_s,
                      statistics.median(lat_ms), _percentile(lat_ms, 0.99))


def _threads(submits: list[Callable[[str, bytes], object]], calls: int, prefix: str,
             counted: tuple[type[BaseException], ...] = ()) -> Concurrent:
    """``calls`` single-job submits by one thread per entry of ``submits`` (the job ``j`` by
    the thread ``j % len(submits)``), all started together; the rate and each call's
    latency. A call that raises one of ``counted`` is counted, with the first one's message,
    and its writer stops; any other failure is raised once the others ended."""
    writers = len(submits)
    lat: list[list[float]] = [[] for _ in range(writers)]
    failures: list[tuple[float, str]] = []
    start = threading.Barrier(writers + 1)

    def writer(k: int) -> None:
        submit, mine = submits[k], lat[k]
        start.wait()
        for j in range(k, calls, writers):
            graph = _graph(j)
            t0 = time.perf_counter()
            try:
                submit(f"{prefix}-{j}", graph)
            except counted as e:
                failures.append((time.perf_counter() - t0, f"{type(e).__name__}: {e}"))
                return
            mine.append((time.perf_counter() - t0) * 1000)

    with ThreadPoolExecutor(writers) as pool:
        futures = [pool.submit(writer, k) for k in range(writers)]
        start.wait()
        t0 = time.perf_counter()
        for fut in futures:
            fut.result()
        elapsed = time.perf_counter() - t0
    figures = _summary(writers, [ms for mine in lat for ms in mine], elapsed)
    if failures:
        took, what = min(failures)
        figures.failed, figures.failure = len(failures), f"after {took:.1f} s: {what}"
    return figures


def _graph(i: int) -> bytes:
    head = f"graph-{i}:".encode()
    return head + b"g" * (GRAPH_BYTES - len(head))


class PeersError(RuntimeError):
    """The peers benchmark could not go on (the message says why)."""


class _Fenced(PeersError):
    """A peer store refused a leader's fenced write (it should not, in this benchmark)."""


# -- child servers -------------------------------------------------------------------------------


class PeerStartError(PeersError):
    """A peer server did not start or did not answer in time (the message has its log tail)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent_hook() -> Callable[[], None] | None:
    """Linux: a hook for between fork and exec that makes the child get SIGTERM if this process
    dies without stopping it (SIGKILL). libc is loaded here, in the parent, so the child only
    makes one system call (no import, no lock)."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):
        return None

    def hook() -> None:  # pragma: no cover - runs in the child
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG

    return hook


class _Server:
    """One peer server as a child process: started, probed until it answers, stopped by pid."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name, self.argv, self.log_path = name, argv, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child keeps writing to it
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us, and we stop it
                preexec_fn=_die_with_parent_hook())
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise PeerStartError(f"{self.name} exited with {self.proc.returncode} at start:"
                                     f"\n{self.log_tail()}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise PeerStartError(f"{self.name} did not answer within {timeout:.0f} s:"
                                     f"\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # by its pid
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# -- jobreg --------------------------------------------------------------------------------------


def _run_jobreg(store: str, choice: BrokerChoice, work: Path, submits: int, calls: int,
                writer_levels: tuple[int, ...], jobs: int, namespaces: int,
                progress: _Progress, namespace_partitions: int = 0) -> StoreFigures:
    """The workload on jobreg, on the broker ``choice`` names (started here, stopped at the
    end); ``store`` is its name in the figures and the progress lines."""
    from registry.client import Registry
    from registry.errors import RegistryError

    f = StoreFigures(store)
    say = TITLES[store]
    with start_broker(choice, directory=work if choice.is_kafka else None,
                      progress=lambda line: progress(f"{say}: {line}")) as broker:
        f.version, f.command, f.durability = broker.version, broker.command, broker.durability
        topic_config = broker.topic_config()
        regs: list[Registry] = []

        def connect(namespace: str, topic: str, timeout: float = 10.0) -> Registry:
            reg = Registry.connect(broker.bootstrap, namespace, topic=topic,
                                   topic_config=topic_config, timeout=timeout)
            regs.append(reg)
            return reg

        try:
            # A topic per workload, so that each starts on an empty partition (Tansu lists a
            # partition's batches on each fetch with data; see DESIGN.md).
            term = connect("peers", "jobreg-peers-latency").claim_leadership("leader-1")
            progress(f"{say}: {submits} fenced submits, one at a time")
            _one_at_a_time(term.submit, submits, f)

            for writers in writer_levels:
                progress(f"{say}: {calls} submits by {writers} threads on one term")
                term = connect("peers", f"jobreg-peers-w{writers}").claim_leadership("leader-1")
                f.concurrent[writers] = _threads([term.submit] * writers, calls, "job",
                                                 (RegistryError,))

            if namespaces:
                layout = NamespaceLayout.spread(namespaces, namespace_partitions or namespaces)
                config = broker.topic_config(partitions=layout.partitions)
                progress(f"{say}: {calls} submits in {namespaces} namespaces on "
                         f"{layout.partitions} partitions, a leader process each")
                f.namespace_processes = _namespace_processes(
                    broker.bootstrap, "jobreg-peers-ns-processes", config, layout, calls,
                    broker.pids)
                progress(f"{say}: {calls} submits in {namespaces} namespaces on "
                         f"{layout.partitions} partitions, a leader thread each, one process")
                terms = [Registry.connect(broker.bootstrap, ns, topic="jobreg-peers-ns-threads",
                                          topic_config=config) for ns in layout.names]
                regs += terms
                f.namespaces = _namespace_threads(
                    [r.claim_leadership("leader-1") for r in terms], layout, calls,
                    broker.pids, (RegistryError,))

            _jobreg_failover(connect, jobs, f, lambda line: progress(f"{say}: {line}"))
        finally:
            for r in regs:
                with contextlib.suppress(Exception):
                    r.close()
    return f


def _jobreg_failover(connect: Callable[..., Any], jobs: int, f: StoreFigures,
                     progress: _Progress) -> None:
    """Row 3 and row 4 on jobreg: ``jobs`` live jobs written by a leader elected with a
    :data:`FAILOVER_LEASE` lease while a standby waits in ``elect`` (hot: its rounds fold the
    log); the leader stops renewing after its last write (killed), the standby claims once
    the lease ran out, writes, and recovers every job; then a registry that connects only
    now (cold) claims and recovers them again."""
    from registry.errors import RegistryError

    topic = "jobreg-peers-failover"
    timeout = FAILOVER_LEASE / 2  # an elected leader's registry answers within half its lease
    old, hot = connect("peers", topic, timeout), connect("peers", topic, timeout)
    leading = old.elect("leader-1", lease=FAILOVER_LEASE)
    term = leading.acquire(timeout=60)
    standby = hot.elect("leader-2", lease=FAILOVER_LEASE)
    won: list[Any] = []

    def wait() -> None:
        with contextlib.suppress(RegistryError):  # reported below: nothing won
            won.append(standby.acquire(timeout=120))

    waiting = threading.Thread(target=wait, name="jobreg-peers-standby", daemon=True)
    waiting.start()
    progress(f"{jobs} jobs in submit_many calls of {BATCH}, by a leader elected with a "
             f"{FAILOVER_LEASE:g} s lease, a standby waiting in elect")
    batched = jobs - 1  # the last job is the old leader's last write
    t0 = time.perf_counter()
    end = -1
    for start in range(0, batched, BATCH):
        end = term.submit_many([(f"job-{j}", _graph(j))
                                for j in range(start, min(batched, start + BATCH))])[-1].offset
    f.batch_jobs_per_s = batched / (time.perf_counter() - t0)
    deadline = time.monotonic() + 60
    while hot.image.provenance.last_offset < end:  # its rounds fold what the leader wrote
        if time.monotonic() > deadline:
            raise PeersError("jobreg: the standby did not fold the leader's writes in 60 s")
        time.sleep(0.01)

    progress(f"failover of {jobs} live jobs: the leader stops renewing, the standby takes "
             "over (hot), then a registry that connects only now (cold)")
    leading.cancel()  # renewals stop, no revoke: as if killed after its last write
    term.submit(f"job-{batched}", _graph(batched))
    last_write = time.monotonic()
    waiting.join(180)
    if not won or standby.claim_started is None:
        standby.cancel()
        raise PeersError("jobreg: the standby did not take over")
    new = won[0]
    won_at = time.monotonic()
    new.submit("first-write", _graph(0))
    first_write = time.monotonic()
    handed: list[float] = []
    t0 = time.monotonic()
    results = new.recover(lambda _job: handed.append(time.monotonic()))
    recovered = time.monotonic()
    if len(results) != jobs or not all(r.ok for r in results):
        raise PeersError("jobreg: recover() did not adopt every job (hot)")
    claim = won_at - standby.claim_started
    f.failover_claim_s = claim
    f.failover_handed_s = claim + (handed[-1] - t0)
    f.failover_s = claim + (recovered - t0)
    f.failover_elected_s = first_write - last_write
    f.failover_elected_claim_s = first_write - standby.claim_started

    standby.cancel()  # this leader dies too: renewals stop
    t0 = time.perf_counter()
    cold = connect("peers", topic)
    connected = time.perf_counter()
    results = cold.claim_leadership("leader-3").recover()
    f.failover_cold_s = time.perf_counter() - t0
    f.failover_cold_connect_s = connected - t0
    if len(results) != jobs + 1 or not all(r.ok for r in results):  # the first write's too
        raise PeersError("jobreg: recover() did not adopt every job (cold)")


# -- jobreg's namespaces, a leader each ------------------------------------------------------------

NAMESPACE_WARM_UP = 5  # untimed submits of each namespace's leader before the start
NAMESPACES_START_S = 600.0  # how long the leader processes may take to connect and claim
NAMESPACES_PROFILE = "JOBREG_BENCH_PROFILE"
"""An environment variable: a directory where each leader process of the namespaces row writes
its cProfile of the timed phase's CPU in Python's thread (``<namespace>.prof``; ``python -m
pstats`` reads it; :mod:`registry.dev.bench_leader`)."""


@dataclass(frozen=True)
class NamespaceLayout:
    """The namespaces of the row and the topic's partition count. Namespaces live on
    ``crc32(namespace) % partitions`` (:func:`registry.keys.partition_for`), so names taken
    as they come share partitions unevenly (``ns-0`` to ``ns-15`` on 8 partitions: up to 3 on
    one, on 16 still 2 on two): :meth:`spread` picks each name so that namespace ``i`` lands on
    partition ``i % partitions``, every partition holding as many as the next."""

    names: tuple[str, ...]
    partitions: int

    @classmethod
    def spread(cls, count: int, partitions: int) -> NamespaceLayout:
        from registry.keys import partition_for

        names = []
        for i in range(count):
            k = 0
            while partition_for(f"ns-{i}-{k}", partitions) != i % partitions:
                k += 1
            names.append(f"ns-{i}-{k}")
        return cls(tuple(names), partitions)

    @property
    def shared(self) -> int:
        """The most namespaces on one partition."""
        return -(-len(self.names) // self.partitions)


def _cpu_seconds(pids: list[int]) -> float | None:
    """The CPU time (user + system) the processes ``pids`` have used so far, from
    ``/proc/<pid>/stat``; ``None`` where there is no ``/proc`` or a process is gone."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return None
    return total / tick if pids else None


def _namespace_processes(bootstrap: str, topic: str, topic_config: Any,
                         layout: NamespaceLayout, calls: int,
                         broker_pids: Callable[[], list[int]],
                         timeout: float = 10.0) -> Namespaces:
    """The namespaces row as users run it: a leader process per namespace
    (``python -m registry.dev.bench_leader``: a fresh interpreter with its own librdkafka),
    each connecting, claiming and warming up, then all released at once. The rate is every
    call over the time from the first leader's start to the last one's end."""
    import dataclasses
    import queue

    import registry

    count = len(layout.names)
    # The registry package this process runs, first on the children's path.
    root = str(Path(registry.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    lines: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
    procs: list[subprocess.Popen[str]] = []

    def listen(k: int, stream: Any) -> None:
        for line in stream:
            lines.put((k, line))
        lines.put((k, ""))  # its stdout closed: it ended

    def answer(what: str, patience: float | None) -> dict[int, dict[str, Any]]:
        """One JSON line from every leader, or a PeersError naming the first that failed
        (``patience``: for them all, in seconds; ``None``: their calls' own timeouts)."""
        got: dict[int, dict[str, Any]] = {}
        deadline = None if patience is None else time.monotonic() + patience
        while len(got) < count:
            try:
                k, line = lines.get(timeout=None if deadline is None
                                    else max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise PeersError(f"namespaces, a leader process each: {count - len(got)} "
                                 f"leader(s) not {what} within {patience:.0f} s") from None
            if k in got:
                continue  # a leader that answered already, ending
            try:
                doc = json.loads(line) if line else {"error": (
                    f"{layout.names[k]}: exited with {procs[k].wait(10)} before it was {what}")}
            except json.JSONDecodeError:
                continue  # not ours (a library's print)
            if "error" in doc:
                raise PeersError(f"namespaces, a leader process each: {doc['error']}")
            got[k] = doc
        return got

    task = {"bootstrap": bootstrap, "topic": topic,
            "topic_config": dataclasses.asdict(topic_config), "count": count, "calls": calls,
            "warm_up": NAMESPACE_WARM_UP, "graph_bytes": GRAPH_BYTES,
            "profile": os.environ.get(NAMESPACES_PROFILE) or None, "timeout": timeout}
    try:
        for k, ns in enumerate(layout.names):
            proc = subprocess.Popen([sys.executable, "-m", "registry.dev.bench_leader"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    env=env, preexec_fn=_die_with_parent_hook())
            procs.append(proc)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({**task, "namespace": ns, "k": k}) + "\n")
            proc.stdin.flush()
            threading.Thread(target=listen, args=(k, proc.stdout), daemon=True).start()
        answer("ready", NAMESPACES_START_S)
        broker0 = _cpu_seconds(broker_pids())
        for proc in procs:  # the start: one line each, as close together as it gets
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = answer("done", None)
        broker1 = _cpu_seconds(broker_pids())
        for proc in procs:  # each has said its last line and is closing its registry
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
    finally:
        for proc in procs:  # only ours, by their pids
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
    done = list(results.values())
    elapsed = max(r["end"] for r in done) - min(r["start"] for r in done)
    figures = _summary(count, [ms for r in done for ms in r["latencies_ms"]], elapsed)
    rdk = [r["rdkafka_cpu_s"] for r in done]
    out = Namespaces(**vars(figures), processes=True, elapsed_s=elapsed,
                     client_cpu_s=sum(r["cpu_s"] for r in done),
                     client_rdkafka_cpu_s=None if None in rdk else sum(rdk),
                     broker_cpu_s=None if broker0 is None or broker1 is None
                     else broker1 - broker0,
                     partitions=layout.partitions, shared=layout.shared)
    failures = [r["failure"] for r in done if r["failure"]]
    if failures:
        out.failed, out.failure = len(failures), min(failures)
    return out


def _namespace_threads(terms: list[Any], layout: NamespaceLayout, calls: int,
                       broker_pids: Callable[[], list[int]],
                       counted: tuple[type[BaseException], ...]) -> Namespaces:
    """The namespaces row in one process: a term and a thread per namespace."""
    from registry.dev.bench_leader import rdkafka_cpu_seconds

    for k, term in enumerate(terms):
        for i in range(NAMESPACE_WARM_UP):
            term.submit(f"warm-{k}-{i}", _graph(i))
    broker0, rdk0 = _cpu_seconds(broker_pids()), rdkafka_cpu_seconds()
    cpu0 = time.process_time()
    figures = _threads([t.submit for t in terms], calls, "job", counted)
    cpu, rdk1 = time.process_time() - cpu0, rdkafka_cpu_seconds()
    broker1 = _cpu_seconds(broker_pids())
    elapsed = figures.calls / figures.jobs_per_s if figures.jobs_per_s else 0.0
    return Namespaces(**vars(figures), processes=False, elapsed_s=elapsed, client_cpu_s=cpu,
                      client_rdkafka_cpu_s=None if rdk0 is None or rdk1 is None
                      else rdk1 - rdk0,
                      broker_cpu_s=None if broker0 is None or broker1 is None
                      else broker1 - broker0,
                      partitions=layout.partitions, shared=layout.shared)


# -- etcd, Kubernetes-HA-style --------------------------------------------------------------------


def _start_etcd(work: Path, progress: _Progress) -> tuple[_Server, int, StoreFigures]:
    httpx = require("httpx", "peers", "jobreg bench peers")

    binary = _etcd_binary()
    assert binary is not None
    client, peer = _free_port(), _free_port()
    data = work / "etcd"
    argv = [binary, "--name", "jobreg-bench", "--data-dir", str(data),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"jobreg-bench=http://127.0.0.1:{peer}",
            "--initial-cluster-state", "new", "--max-txn-ops", str(ETCD_MAX_TXN_OPS),
            "--max-request-bytes", str(BATCH_REQUEST_BYTES),
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"]
    server = _Server("etcd", argv, work / "etcd.log")
    progress(f"etcd: starting on 127.0.0.1:{client}")

    def ready() -> bool:
        r = httpx.get(f"http://127.0.0.1:{client}/health", timeout=2)
        return r.status_code == 200 and bool(r.json().get("health") == "true")

    server.start(ready)
    f = StoreFigures("etcd")
    with contextlib.suppress(Exception):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        f.version = out.stdout.split("\n")[0].split(":")[-1].strip()
    f.command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))
    f.durability = (f"fsyncs its WAL before it acknowledges a write (etcd {f.version or '3.4'} "
                    f"has no switch to turn that off); data dir on {filesystem(str(work))}")
    return server, client, f


def _etcd_fsyncs(port: int) -> int | None:
    httpx = require("httpx", "peers", "jobreg bench peers")

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^etcd_disk_wal_fsync_duration_seconds_count (\d+)", text, re.M)
    return int(m.group(1)) if m else None


class _EtcdLeader:
    """A Kubernetes-HA-style leader on etcd: the leader key's CAS, fenced transactions."""

    def __init__(self, client: Any, root: bytes, name: str) -> None:
        self.c, self.root, self.name = client, root, name
        self.leader_key = root + b"/leader"
        self.revision = 0  # the leader key's mod_revision our CAS wrote

    async def claim(self) -> None:
        current = await self.c.get(self.leader_key)
        seen = current.mod_revision if current is not None else 0  # 0: the key is absent
        ok, responses = await self.c.transaction(
            compare=[self.c.transactions.mod(self.leader_key) == seen],
            success=[self.c.transactions.put(self.leader_key, self.name.encode())], failure=[])
        if not ok:
            raise _Fenced(f"etcd: {self.name}'s leader CAS failed")
        self.revision = responses[0].response_put.header.revision

    def job_record(self, job_id: str) -> bytes:
        return json.dumps({"owner": self.name, "graph": f"graphs/{job_id}"}).encode()

    async def submit(self, job_id: str, graph: bytes) -> None:
        t = self.c.transactions
        ok, _ = await self.c.transaction(
            compare=[t.mod(self.leader_key) == self.revision],
            success=[t.put(self.root + b"/jobs/" + job_id.encode(), self.job_record(job_id)),
                     t.put(self.root + b"/graphs/" + job_id.encode(), graph)], failure=[])
        if not ok:
            raise _Fenced(f"etcd: {self.name} was fenced submitting {job_id}")

    async def submit_many(self, jobs: list[tuple[str, bytes]]) -> None:
        """One transaction: the fence, then the job key and the graph of every job."""
        t = self.c.transactions
        puts = []
        for job_id, graph in jobs:
            puts += [t.put(self.root + b"/jobs/" + job_id.encode(), self.job_record(job_id)),
                     t.put(self.root + b"/graphs/" + job_id.encode(), graph)]
        ok, _ = await self.c.transaction(
            compare=[t.mod(self.leader_key) == self.revision], success=puts, failure=[])
        if not ok:
            raise _Fenced(f"etcd: {self.name} was fenced submitting {len(jobs)} jobs")

    async def take_over(self, jobs: int) -> None:
        """Read every job key and graph, then rewrite every lock, fenced, in batches."""
        job_keys = await self.c.get_prefix(self.root + b"/jobs/")
        graphs = await self.c.get_prefix(self.root + b"/graphs/")
        if len(job_keys.kvs) != jobs or len(graphs.kvs) != jobs:
            raise PeersError(f"etcd: read {len(job_keys.kvs)} jobs and {len(graphs.kvs)} "
                               f"graphs, expected {jobs}")
        ids = [kv.key.rsplit(b"/", 1)[1].decode() for kv in job_keys.kvs]
        t = self.c.transactions
        for start in range(0, len(ids), BATCH):
            ok, _ = await self.c.transaction(
                compare=[t.mod(self.leader_key) == self.revision],
                success=[t.put(self.root + b"/jobs/" + i.encode(), self.job_record(i))
                         for i in ids[start:start + BATCH]], failure=[])
            if not ok:
                raise _Fenced(f"etcd: {self.name} was fenced taking jobs over")


async def _etcd_concurrent(leader: _EtcdLeader, writers: int, calls: int) -> Concurrent:
    lat: list[float] = []

    async def writer(k: int) -> None:
        for j in range(k, calls, writers):
            graph = _graph(j)
            t0 = time.perf_counter()
            await leader.submit(f"job-{j}", graph)
            lat.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(k) for k in range(writers)))
    return _summary(writers, lat, time.perf_counter() - t0)


async def _etcd_workload(port: int, submits: int, calls: int, writer_levels: tuple[int, ...],
                         jobs: int, f: StoreFigures, progress: _Progress) -> None:
    aetcd = require("aetcd", "peers", "jobreg bench peers")

    options = {"grpc.max_receive_message_length": 512 * 2**20,  # one range read of all graphs
               "grpc.max_send_message_length": 2 * BATCH_REQUEST_BYTES}
    async with aetcd.Client(host="127.0.0.1", port=port, timeout=60, options=options) as c:
        progress(f"etcd: {submits} fenced submits, one at a time")
        leader = _EtcdLeader(c, b"/jobreg-bench/latency", "leader-1")
        await leader.claim()
        for i in range(WARM_UP):
            await leader.submit(f"warm-{i}", _graph(i))
        lat = []
        t0 = time.perf_counter()
        for i in range(submits):
            graph = _graph(i)
            t1 = time.perf_counter()
            await leader.submit(f"single-{i}", graph)
            lat.append((time.perf_counter() - t1) * 1000)
        _latency(lat, f, time.perf_counter() - t0)

        for writers in writer_levels:
            progress(f"etcd: {calls} submits by {writers} concurrent submitters")
            leader = _EtcdLeader(c, f"/jobreg-bench/w{writers}".encode(), "leader-1")
            await leader.claim()
            f.concurrent[writers] = await _etcd_concurrent(leader, writers, calls)

        progress(f"etcd: {jobs} jobs in transactions of {BATCH}")
        root = b"/jobreg-bench/failover"
        leader = _EtcdLeader(c, root, "leader-1")
        await leader.claim()
        t0 = time.perf_counter()
        for start in range(0, jobs, BATCH):
            await leader.submit_many([(f"job-{j}", _graph(j))
                                      for j in range(start, min(jobs, start + BATCH))])
        f.batch_jobs_per_s = jobs / (time.perf_counter() - t0)

    progress(f"etcd: failover of {jobs} live jobs")
    async with aetcd.Client(host="127.0.0.1", port=port, timeout=60, options=options) as c:
        await c.get(b"/jobreg-bench/warm-up")  # the standby is connected before the clock
        successor = _EtcdLeader(c, root, "leader-2")
        t0 = time.perf_counter()
        await successor.claim()
        f.failover_claim_s = time.perf_counter() - t0
        await successor.take_over(jobs)
        f.failover_s = time.perf_counter() - t0


def _run_etcd(work: Path, submits: int, calls: int, writer_levels: tuple[int, ...], jobs: int,
              progress: _Progress) -> StoreFigures:
    server, port, f = _start_etcd(work, progress)
    try:
        before = _etcd_fsyncs(port)
        asyncio.run(_etcd_workload(port, submits, calls, writer_levels, jobs, f, progress))
        after = _etcd_fsyncs(port)
        if before is not None and after is not None:
            f.fsyncs = after - before
    finally:
        server.stop()
    return f


# -- ZooKeeper, Flink-style ----------------------------------------------------------------------


def _four_letter(port: int, word: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(word.encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _start_zookeeper(work: Path, progress: _Progress) -> tuple[_Server, int, StoreFigures]:
    java, jar = _java(), _zookeeper_jar()
    assert java is not None and jar is not None
    port = _free_port()
    data = work / "zookeeper"
    data.mkdir()
    cfg = work / "zoo.cfg"
    cfg.write_text("\n".join([
        "tickTime=2000", f"dataDir={data}", f"clientPort={port}", "clientPortAddress=127.0.0.1",
        "admin.enableServer=false", "maxClientCnxns=0", "4lw.commands.whitelist=srvr,mntr",
        ""]))
    argv = [java, "-Xmx1g", "-Dzookeeper.forceSync=yes", "-Dzookeeper.jmx.log4j.disable=true",
            f"-Djute.maxbuffer={BATCH_REQUEST_BYTES}",
            "-cp", jar, "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)]
    server = _Server("ZooKeeper", argv, work / "zookeeper.log")
    progress(f"ZooKeeper: starting on 127.0.0.1:{port}")
    # "ruok" answers before the server serves; "srvr" only once it does.
    server.start(lambda: "Zookeeper version" in _four_letter(port, "srvr"))
    f = StoreFigures("zookeeper")
    with contextlib.suppress(Exception):
        m = re.search(r"version: ([0-9.]+)", _four_letter(port, "srvr"))
        f.version = m.group(1) if m else ""
    f.command = (" ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))
                 + " (zoo.cfg: " + ", ".join(
                     line for line in cfg.read_text().splitlines()
                     if line and not line.startswith(("dataDir", "clientPort="))) + ")")
    f.durability = ("forceSync=yes: fsyncs its transaction log before it acknowledges a write "
                    f"(group commit); data dir on {filesystem(str(work))}")
    return server, port, f


def _zookeeper_fsyncs(port: int) -> int | None:
    try:
        m = re.search(r"^zk_cnt_fsynctime\s+(\d+)", _four_letter(port, "mntr"), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


class _ZkLeader:
    """A Flink-style leader on ZooKeeper: a leader znode CAS, graph znodes, pointer + lock."""

    def __init__(self, zk: Any, root: str, name: str) -> None:
        self.zk, self.root, self.name = zk, root, name
        self.leader = f"{root}/leader"
        self.version = -1  # the leader znode's version our CAS wrote

    def claim(self) -> None:
        self.zk.ensure_path(f"{self.root}/graphs")
        self.zk.ensure_path(f"{self.root}/jobgraphs")
        if self.zk.exists(self.leader) is None:
            with contextlib.suppress(Exception):  # NodeExistsError: another created it
                self.zk.create(self.leader, b"")
        _, stat = self.zk.get(self.leader)
        self.version = self.zk.set(self.leader, self.name.encode(), version=stat.version).version

    def _commit(self, tx: Any, what: str) -> None:
        results = tx.commit()
        bad = [r for r in results if isinstance(r, Exception)]
        if bad:
            raise _Fenced(f"ZooKeeper: {self.name}'s multi for {what} failed: {bad[0]!r}")

    def submit(self, job_id: str, graph: bytes) -> None:
        # The graph first (Flink: the job graph file), then one multi: fence, pointer, lock.
        self.zk.create(f"{self.root}/graphs/{job_id}", graph)
        job = f"{self.root}/jobgraphs/{job_id}"
        tx = self.zk.transaction()
        tx.check(self.leader, self.version)
        tx.create(job, f"{self.root}/graphs/{job_id}".encode())
        tx.create(f"{job}/locks", b"")
        tx.create(f"{job}/locks/{self.name}", b"", ephemeral=True)
        self._commit(tx, job_id)

    def submit_many(self, jobs: list[tuple[str, bytes]]) -> None:
        """One multi: the fence, then every job's graph, pointer, locks node and lock."""
        tx = self.zk.transaction()
        tx.check(self.leader, self.version)
        for job_id, graph in jobs:
            job = f"{self.root}/jobgraphs/{job_id}"
            tx.create(f"{self.root}/graphs/{job_id}", graph)
            tx.create(job, f"{self.root}/graphs/{job_id}".encode())
            tx.create(f"{job}/locks", b"")
            tx.create(f"{job}/locks/{self.name}", b"", ephemeral=True)
        self._commit(tx, f"{len(jobs)} jobs")

    def take_over(self, jobs: int) -> None:
        """getChildren, read every pointer and graph (pipelined), then multis of lock creations."""
        ids = self.zk.get_children(f"{self.root}/jobgraphs")
        if len(ids) != jobs:
            raise PeersError(f"ZooKeeper: {len(ids)} jobs, expected {jobs}")
        for start in range(0, len(ids), BATCH):
            batch = ids[start:start + BATCH]
            pending = [self.zk.get_async(f"{self.root}/jobgraphs/{i}") for i in batch]
            pending += [self.zk.get_async(f"{self.root}/graphs/{i}") for i in batch]
            for p in pending:
                p.get(timeout=60)
            tx = self.zk.transaction()
            tx.check(self.leader, self.version)
            for i in batch:
                tx.create(f"{self.root}/jobgraphs/{i}/locks/{self.name}", b"", ephemeral=True)
            self._commit(tx, f"{len(batch)} locks")


def _kazoo(port: int) -> Any:
    KazooClient = require("kazoo.client", "peers", "jobreg bench peers").KazooClient  # noqa: N806

    zk = KazooClient(hosts=f"127.0.0.1:{port}", timeout=15.0)
    zk.start(timeout=30)
    return zk


def _close_kazoo(zk: Any) -> None:
    with contextlib.suppress(Exception):
        zk.stop()
    with contextlib.suppress(Exception):
        zk.close()


def _run_zookeeper(work: Path, submits: int, calls: int, writer_levels: tuple[int, ...],
                   jobs: int, progress: _Progress) -> StoreFigures:
    import logging

    logging.getLogger("kazoo").setLevel(logging.ERROR)  # its connection chatter
    server, port, f = _start_zookeeper(work, progress)
    clients: list[Any] = []
    try:
        before = _zookeeper_fsyncs(port)
        zk = _kazoo(port)
        clients.append(zk)
        progress(f"ZooKeeper: {submits} fenced submits, one at a time")
        leader = _ZkLeader(zk, "/jobreg-bench/latency", "leader-1")
        leader.claim()
        _one_at_a_time(leader.submit, submits, f)

        for writers in writer_levels:
            progress(f"ZooKeeper: {calls} submits by {writers} threads on one session")
            leader = _ZkLeader(zk, f"/jobreg-bench/w{writers}", "leader-1")
            leader.claim()
            f.concurrent[writers] = _threads([leader.submit] * writers, calls, "job")

        progress(f"ZooKeeper: {jobs} jobs in multis of {BATCH}")
        root = "/jobreg-bench/failover"
        leader = _ZkLeader(zk, root, "leader-1")
        leader.claim()
        t0 = time.perf_counter()
        for start in range(0, jobs, BATCH):
            leader.submit_many([(f"job-{j}", _graph(j))
                                for j in range(start, min(jobs, start + BATCH))])
        f.batch_jobs_per_s = jobs / (time.perf_counter() - t0)

        progress(f"ZooKeeper: failover of {jobs} live jobs")
        standby = _kazoo(port)  # connected before the clock
        clients.append(standby)
        _close_kazoo(zk)  # the old leader's session ends: its ephemeral locks go
        clients.remove(zk)
        successor = _ZkLeader(standby, root, "leader-2")
        t0 = time.perf_counter()
        successor.claim()
        f.failover_claim_s = time.perf_counter() - t0
        successor.take_over(jobs)
        f.failover_s = time.perf_counter() - t0
        after = _zookeeper_fsyncs(port)
        if before is not None and after is not None:
            f.fsyncs = after - before
    finally:
        for c in clients:
            _close_kazoo(c)
        server.stop()
    return f


# -- the run -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _work_dir(parent: str | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="jobreg-peers-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def bench_peers(*, submits: int = 1000, calls: int = 2000,
                writers: tuple[int, ...] = WRITERS, jobs: int = 10_000, namespaces: int = 16,
                only: tuple[str, ...] = STORES, work_dir: str | None = None,
                progress: _Progress = lambda _: None,
                namespace_partitions: int = 0) -> PeersFigures:
    """Run the workload (the module docstring) on each store of ``only`` that can run here;
    the others are skipped with the reason in ``figures.skipped``. ``namespaces`` 0 leaves
    out jobreg's rows of namespaces with a leader each; ``namespace_partitions``: their
    topic's partitions (0: one per namespace), the namespaces spread evenly over them."""
    figures = PeersFigures(submits=submits, jobs=jobs, calls=calls, writers=writers,
                           namespaces=namespaces,
                           namespace_partitions=namespace_partitions or namespaces)
    figures.skipped = missing_peers(tuple(s for s in only if s != "jobreg"))
    for line in figures.skipped.values():
        progress(line)
    with _work_dir(work_dir) as work:
        for store in STORES:
            if store not in only or store in figures.skipped:
                continue
            if store in JOBREG_STORES:
                (work / f"{store}-run").mkdir()
                figures.stores[store] = _run_jobreg(store, JOBREG_STORES[store],
                                                    work / f"{store}-run", submits, calls,
                                                    writers, jobs, namespaces, progress,
                                                    namespace_partitions)
            elif store == "etcd":
                (work / "etcd-run").mkdir()
                figures.stores[store] = _run_etcd(work / "etcd-run", submits, calls, writers,
                                                  jobs, progress)
            else:
                (work / "zk-run").mkdir()
                figures.stores[store] = _run_zookeeper(work / "zk-run", submits, calls,
                                                       writers, jobs, progress)
    return figures


# -- the table -----------------------------------------------------------------------------------


def _ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else (" (met)" if ok else " (missed)")


def _ratio_groups(p: PeersFigures) -> tuple[list[tuple[str, list[str]]], bool]:
    """The ratios to print, as (denominator, numerators) groups, and whether they go in the
    figures' table (a run without Kafka: jobreg over each peer, as before) or in a table of
    their own per denominator (each store of jobreg over etcd, over ZooKeeper, then each Kafka
    store over jobreg on the embedded broker)."""
    ran = [s for s in STORES if s in p.stores]
    if not any(s in KAFKA_STORES for s in ran):
        return [("etcd", ["jobreg"]), ("zookeeper", ["jobreg"])], True
    ours = [s for s in ran if s in JOBREG_STORES]
    groups = [(peer, ours) for peer in PEERS if peer in ran]
    if "jobreg" in ran:
        groups.append(("jobreg", [s for s in ours if s in KAFKA_STORES]))
    return groups, False


_Get = Callable[[StoreFigures], "float | None"]


def _of_namespaces(attr: str, what: Callable[[Namespaces, StoreFigures], float | None]) -> _Get:
    """A store's figure of one namespaces row (``attr``: ``namespace_processes`` or
    ``namespaces``), or ``None`` where the row did not run."""
    def get(f: StoreFigures) -> float | None:
        ns: Namespaces | None = getattr(f, attr)
        return None if ns is None else what(ns, f)

    return get


def _namespace_measures(p: PeersFigures, jr: StoreFigures | None
                        ) -> list[tuple[str, _Get, _Get | None, str, str]]:
    """The rows of jobreg's namespaces, a leader each: in a process each (the target's form),
    then in one process; per form the aggregate rate, its ratio to one namespace's (the lone
    writer's rate, measured on the same broker in the same run), p99, the CPU a call cost
    the clients (and of it librdkafka's threads) and the broker, and the rate this machine's
    cores could give at that cost were they spent on nothing else."""
    single = f"{jr.single_jobs_per_s:,.0f} jobs/s" if jr is not None else "not run"
    cores = os.cpu_count() or 1
    none: _Get = lambda f: None  # noqa: E731 - no peer has the row
    rows: list[tuple[str, _Get, _Get | None, str, str]] = []
    for attr, form in (("namespace_processes", "a leader process each"),
                       ("namespaces", "leader threads of one process")):
        name = f"{p.namespaces} namespaces, {form} ({p.calls:,} calls) (***)"
        target = ""
        if attr == "namespace_processes":
            ns = jr.namespace_processes if jr is not None else None
            ok = (ns.jobs_per_s >= 8 * jr.single_jobs_per_s
                  if jr is not None and ns is not None and ns.calls else None)
            target = f">= 8x one writer's ({single})" + _verdict(ok)
        rows += [
            (f"{name}: jobs/s", _of_namespaces(attr, lambda ns, f: ns.jobs_per_s), none,
             "{:,.0f} jobs/s", target),
            (f"{name}: x one writer's jobs/s", _of_namespaces(
                attr, lambda ns, f: ns.jobs_per_s / f.single_jobs_per_s
                if f.single_jobs_per_s else None), none, "{:.1f}x", ""),
            (f"{name}: p99", _of_namespaces(attr, lambda ns, f: ns.p99_ms), none,
             "{:.2f} ms", ""),
            (f"{name}: client CPU per call", _of_namespaces(
                attr, lambda ns, f: ns.per_call_ms(ns.client_cpu_s)), none, "{:.2f} ms", ""),
            (f"{name}: of it librdkafka's threads", _of_namespaces(
                attr, lambda ns, f: ns.per_call_ms(ns.client_rdkafka_cpu_s)), none,
             "{:.2f} ms", ""),
            (f"{name}: broker CPU per call", _of_namespaces(
                attr, lambda ns, f: ns.per_call_ms(ns.broker_cpu_s)), none, "{:.2f} ms", ""),
            (f"{name}: CPU bound on {cores} cores", _of_namespaces(
                attr, lambda ns, f: ns.ceiling(cores)), none, "{:,.0f} jobs/s", ""),
        ]
    return rows


def _namespaces_note(p: PeersFigures) -> str:
    """The (***) note: how the namespaces rows were run."""
    parts = p.namespace_partitions or p.namespaces
    per = -(-p.namespaces // parts)
    return (f"(***) jobreg only: {p.namespaces} namespaces on a topic of {parts} partitions, "
            f"namespace i on partition i % {parts} ({'one' if per == 1 else per} per partition"
            f"{'' if per == 1 else ' at most'}; names chosen so, since crc32 % {parts} of names "
            f"taken as they come shares partitions unevenly), a leader each: in a process each "
            f"(python -m registry.dev.bench_leader: connect, claim, {NAMESPACE_WARM_UP} "
            "untimed submits, then all released at once), then as registries, terms and "
            "threads of one process; the rate is the aggregate, from the first leader's "
            "start to the last "
            "one's end. The target compares it with one writer's rate above (one namespace's) "
            "in this run. CPU per call: the leaders' processes' CPU time over the timed phase "
            "(librdkafka's threads, named rdk:*, included and also shown alone), and the "
            "broker's processes' (/proc/<pid>/stat), each over the calls answered; the CPU "
            f"bound is this machine's {os.cpu_count()} cores over their sum, the rate if "
            "clients and broker had every core and nothing else ran (here other work shares "
            "them).")


def format_peers(p: PeersFigures) -> str:
    """The figures side by side with the ratios, the targets, what each store did and how
    durable each is."""
    import textwrap

    from registry.render import table

    present = {s: p.stores.get(s) for s in STORES}
    # The embedded jobreg, etcd and ZooKeeper always have a column (as before Kafka came);
    # the Kafka stores when they ran.
    columns = [s for s in STORES if s not in KAFKA_STORES or present[s] is not None]
    ran_kafka = [s for s in KAFKA_STORES if present[s] is not None]
    Get = Callable[[StoreFigures], float | None]

    def value(store: str, get: Get, get_peer: Get | None) -> float | None:
        fig = present[store]
        if fig is None:
            return None
        return get(fig) if store in JOBREG_STORES else (get_peer or get)(fig)

    jr, etcd = present["jobreg"], present["etcd"]

    def verdict(ok: Callable[[StoreFigures, StoreFigures | None], bool | None]) -> str:
        return _verdict(ok(jr, etcd) if jr is not None else None)

    def etcd_says(get: Get, fmt: str) -> str:
        figure = get(etcd) if etcd is not None else None
        return "not run" if figure is None else fmt.format(figure)

    def level(writers: int, what: str) -> Get:
        return lambda f: getattr(f.concurrent[writers], what) if writers in f.concurrent \
            else None

    one = f"one writer ({p.submits:,} calls)"
    failover = f"failover, {p.jobs:,} live jobs"
    lone_p99: Get = lambda f: f.submit_p99_ms  # noqa: E731
    measures: list[tuple[str, Get, Get | None, str, str]] = [
        (f"{one}: p50", lambda f: f.submit_p50_ms, None, "{:.2f} ms", ""),
        (f"{one}: p99", lone_p99, None, "{:.2f} ms",
         f"<= etcd's ({etcd_says(lone_p99, '{:.2f} ms')})"
         + verdict(lambda j, e: j.submit_p99_ms <= e.submit_p99_ms if e else None)),
        (f"{one}: jobs/s", lambda f: f.single_jobs_per_s, None, "{:,.0f} jobs/s", ""),
    ]
    for w in p.writers:
        rate, p99 = level(w, "jobs_per_s"), level(w, "p99_ms")
        name = f"{w} writers, one leader ({p.calls:,} calls)"
        rate_target = p99_target = ""
        if w == 8:
            def thrice_etcd(j: StoreFigures, e: StoreFigures | None, r: Get = rate
                            ) -> bool | None:
                return (r(j) or 0) >= 3 * (r(e) or 0) if e and r(e) else None

            def near_one(j: StoreFigures, e: StoreFigures | None, q: Get = p99) -> bool | None:
                return (q(j) or 0) <= 3 * j.submit_p99_ms if q(j) else None

            rate_target = (f">= 3x etcd's ({etcd_says(rate, '{:,.0f} jobs/s')})"
                           + verdict(thrice_etcd))
            p99_target = "<= 3x the one writer's p99" + verdict(near_one)
        elif w == 64:
            def twenty_thousand(j: StoreFigures, e: StoreFigures | None, r: Get = rate
                                ) -> bool | None:
                return (r(j) or 0) >= 20_000 if r(j) else None

            rate_target = ">= 20,000 jobs/s" + verdict(twenty_thousand)
        measures += [(f"{name}: jobs/s", rate, None, "{:,.0f} jobs/s", rate_target),
                     (f"{name}: p50", level(w, "p50_ms"), None, "{:.2f} ms", ""),
                     (f"{name}: p99", p99, None, "{:.2f} ms", p99_target)]
    taken_over: Get = lambda f: f.failover_s  # noqa: E731
    ours: Get = lambda f: None  # noqa: E731 - a jobreg-only row: no peer's figure
    elected = f"{failover}, elected ({FAILOVER_LEASE:g} s lease)"
    measures += [
        (f"native batch of {BATCH:,} jobs, one atomic call (**)",
         lambda f: f.batch_jobs_per_s, None, "{:,.0f} jobs/s", ""),
        (f"{failover}, hot standby: claim", lambda f: f.failover_claim_s, None, "{:.3f} s", ""),
        (f"{failover}, hot standby: claim -> every job to the hook",
         lambda f: f.failover_handed_s, ours, "{:.3f} s", ""),
        (f"{failover}, hot standby: claim -> all taken over", taken_over, None, "{:.3f} s",
         f"<= etcd's ({etcd_says(taken_over, '{:.3f} s')})"
         + verdict(lambda j, e: j.failover_s <= e.failover_s if e else None)),
        (f"{failover}, cold standby (*): connect -> all taken over",
         lambda f: f.failover_cold_s, lambda f: f.failover_s, "{:.3f} s", ""),
        (f"{failover}, cold standby: of which connect", lambda f: f.failover_cold_connect_s,
         ours, "{:.3f} s", ""),
        (f"{elected}: last write -> first write (****)", lambda f: f.failover_elected_s, ours,
         "{:.3f} s", ""),
        (f"{elected}: claim -> first write", lambda f: f.failover_elected_claim_s, ours,
         "{:.3f} s", ""),
    ]
    if p.namespaces:
        measures += _namespace_measures(p, jr)
    groups, inline = _ratio_groups(p)
    pairs = [(a, b) for b, numerators in groups for a in numerators]
    headers = (["measure"] + [HEADERS[s] for s in columns]
               + ([f"{HEADERS[a]}/{HEADERS[b]}" for a, b in pairs] if inline else [])
               + ["target (jobreg)"])
    rows: list[list[str]] = []
    ratio_rows: dict[str, list[list[str]]] = {b: [] for b, _ in groups}
    for name, get, get_peer, fmt, target in measures:
        v = {s: value(s, get, get_peer) for s in STORES}
        rows.append([name] + ["-" if v[s] is None else fmt.format(v[s]) for s in columns]
                    + ([_ratio(v[a], v[b]) for a, b in pairs] if inline else []) + [target])
        for b, numerators in groups:
            ratio_rows[b].append([name] + [_ratio(v[a], v[b]) for a in numerators])

    def para(text: str, indent: str = "", hang: str = "") -> list[str]:
        return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=hang or indent,
                             break_on_hyphens=False, break_long_words=False)

    out = table(headers, rows, right=range(1, len(headers) - 1)).split("\n")
    for b, numerators in ([] if inline else groups):
        whose = ("jobreg on the embedded broker" if b == "jobreg" else HEADERS[b]) + "'s"
        out += ["", f"Each store's figure over {whose} (ratios from this run):"]
        out += table(["measure", *(f"{HEADERS[a]}/{HEADERS[b]}" for a in numerators)],
                     ratio_rows[b], right=range(1, len(numerators) + 1)).split("\n")
    out.append("")
    for store in STORES:
        fig = present[store]
        levels = [] if fig is None else [
            (f"{c.writers} writers", c) for c in fig.concurrent.values()]
        if fig is not None and fig.namespace_processes is not None:
            levels.append((f"{p.namespaces} namespaces, a process each",
                           fig.namespace_processes))
        if fig is not None and fig.namespaces is not None:
            levels.append((f"{p.namespaces} namespaces, one process", fig.namespaces))
        for what, c in levels:
            if c.failed:
                out += para(f"FAILED: {TITLES[store]}, {what}: {c.failed} call(s) raised and "
                            f"their writers stopped (the figures count the answered calls "
                            f"only); the first {c.failure}")
    if ran_kafka:
        out += para("Columns: jobreg on the embedded broker; "
                    + "; ".join(f"{HEADERS[s]}: jobreg on {JOBREG_STORES[s].describe()}"
                                for s in ran_kafka)
                    + "; etcd and ZooKeeper as below.")
    out += para("(*) jobreg: a registry that connects once the leader is gone: "
                "Registry.connect (folding the whole log) inside the clock, then claim and "
                "recover(); the peers' figure is their failover above, which reads everything "
                "anyway. Hot: the standby that waited in elect, its rounds folding the log as "
                "it grew; from its claim (the wait for the lease is not counted).")
    out += para("(**) jobreg: submit_many; etcd: one txn (the fence, then the job key and the "
                "graph of each job); ZooKeeper: one multi (the fence, then each job's graph, "
                "pointer, locks node and lock). These batches create the failover's live "
                "jobs.")
    out += para(f"(****) jobreg only: the leader, elected with a {FAILOVER_LEASE:g} s lease, "
                "stops renewing after its last write (as if killed); the standby waiting in "
                "elect claims once it has seen no renewal for a lease on its own clock, and "
                "writes at once: the lease wait is most of the figure (it is up to a lease "
                "after the last renewal the standby saw, and a renewal can precede the last "
                "write by a quarter lease); the next row is the same from the claim.")
    if p.namespaces:
        out += para(_namespaces_note(p))
    out += para("Writers: jobreg threads calling Term.submit on one term; etcd asyncio tasks on "
                "one gRPC channel; ZooKeeper threads on one session. A call's latency is from "
                "its start to its answer.")
    replicated = ("every server on 127.0.0.1 of this machine; only kafka3 is replicated (its "
                  "three nodes share this machine and its disk)" if present["kafka3"]
                  else "every server on 127.0.0.1 of this machine, none replicated")
    out += para("Ratios are the first store's figure over the second's (jobreg/etcd: jobreg on "
                "the embedded broker over etcd; kafka/jobreg: jobreg on Kafka over jobreg on "
                "the embedded broker): below 1 is better for the first in times, above 1 in "
                f"throughput. Every graph is {GRAPH_BYTES:,} bytes; {WARM_UP} untimed submits "
                f"come first on each store; {replicated}.")
    out += ["", "What each store does:"]
    shapes = {
        "jobreg": "submit: Term.submit (one fenced transaction; returns once the fold accepted "
                  "it); concurrent calls on one term wait for each other. Failover: a "
                  "standby waiting in elect (its rounds fold the log and make its producers, "
                  "which fence nobody until it claims) claims once the elected leader stopped "
                  "renewing, then recover() (reads the tail of the log, hands every job and "
                  f"its graph to the hook, adopts every job in calls of {BATCH:,}) (hot); then "
                  "a registry connected inside the clock claims and recovers (cold)"
                  + ("; the same on every broker (jobreg and the kafka columns)." if ran_kafka
                     else "."),
        "etcd": "submit: one txn: compare the leader key's mod_revision (the fence); put the job "
                "key (owner, graph key) and the graph. Concurrency: asyncio tasks on one gRPC "
                "channel. Failover: get + CAS txn on the leader key, one range read of the job "
                f"keys and one of the graphs, then txns of {BATCH:,} lock rewrites, each fenced "
                "by the new leader's revision.",
        "zookeeper": "submit: create the graph znode, then one multi: check the leader znode's "
                     "version (the fence), create the job's pointer, its locks node and an "
                     "ephemeral lock. Concurrency: threads on one session. Failover (once the old "
                     "leader's session closed and its locks went): get + versioned set of the "
                     "leader znode, getChildren, a pipelined get of every pointer and graph, "
                     f"multis of {BATCH:,} lock creations, each with the leader's version "
                     "check.",
    }
    if any(present[s] is not None for s in JOBREG_STORES):
        out += para(shapes["jobreg"], f"  {'jobreg':<12}", " " * 14)
    for store in PEERS:
        if present[store] is not None:
            out += para(shapes[store], f"  {HEADERS[store]:<12}", " " * 14)
    out += ["", "Durability differs; read the figures with it:"]
    for store in STORES:
        fig = present[store]
        if fig is None:
            continue
        if fig.fsyncs is not None:
            counted = f"; the server counted {fig.fsyncs:,} fsyncs during the run"
        elif store in KAFKA_STORES and JOBREG_STORES[store].fsyncs:
            counted = ("; its fsyncs are not counted here (Kafka reports its flushes as a JMX "
                       "metric only, kafka.log:type=LogFlushStats)")
        else:
            counted = ""
        out += para(f"{fig.version}: {fig.durability}{counted}.", f"  {HEADERS[store]:<12}",
                    " " * 14)
        out += para(f"command: {fig.command}", " " * 14)
    peers_ran = any(present[s] is not None for s in PEERS)
    if ran_kafka:
        out += [""]
        out += para("Like with like: jobreg vs kafka (one node each, neither fsyncs: what "
                    "Kafka's log and transaction coordinator cost over the embedded broker's "
                    "memory); kafka-fsync vs etcd and ZooKeeper (one node each, each fsyncing "
                    "before it acknowledges); kafka3 has no like here (it replicates to 3 nodes "
                    "instead of fsyncing; etcd and ZooKeeper run one node).", "  ")
    elif jr is not None and peers_ran:
        out += para("jobreg's figures here are of a memory log; etcd's and ZooKeeper's include "
                    "a disk fsync per commit (shared by concurrent commits). Apache Kafka, "
                    "jobreg's production log, does not fsync per write by default either: "
                    "acks=all answers once the in-sync replicas have the record.", "  ")
    if p.skipped:
        out.append("")
        out += list(p.skipped.values())
    return "\n".join(out)
