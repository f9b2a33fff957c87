"""``jobreg bench peers``: jobreg next to etcd and ZooKeeper, the same workload shapes on each.

The two peers are what coordinators use for the same job today, started from Debian's packages
(``etcd-server``, ``zookeeper``) as child processes on loopback, each with its data in a fresh
temporary directory, and stopped by pid at the end (also on an error or Ctrl-C):

* **ZooKeeper, Flink-style** (kazoo): a submit creates the graph znode (2 KiB), then one
  ``multi`` of: check the leader znode's version (the fence), create the job's pointer znode,
  its ``locks`` child and an ephemeral lock znode in the leader's session.
* **etcd, Kubernetes-HA-style** (aetcd, etcd's gRPC API): a submit is one transaction that
  compares the leader key's ``mod_revision`` with the one the leader's CAS wrote (the fence)
  and puts the job key (owner and graph key) and the graph key (2 KiB).
* **jobreg**: ``Term.submit`` on the embedded broker, as ``jobreg bench core`` does.

Measured for each: one-at-a-time submit latency p50/p99 over ``submits``; submit throughput
(etcd and ZooKeeper: ``threads`` concurrent submitters; jobreg: ``submit_many`` calls of 1,000
jobs, one atomic call each), which also creates the live jobs of the failover; failover time
for those ``jobs`` live jobs, from the new leader's claim until every job's graph has been read
and every lock is the new leader's:

* jobreg: ``claim_leadership`` + ``recover()`` by a standby that has folded the log (hot), and
  once more from a cold start (``Registry.connect`` inside the clock);
* etcd: read the leader key and CAS it (txn on its ``mod_revision``), one range read of the job
  keys and one of the graphs, then transactions of 1,000 lock rewrites each (fenced by the
  new leader's revision);
* ZooKeeper: the old leader's session is closed first (its ephemeral locks go, as when it
  expires); then read and CAS the leader znode (``set`` with its version), ``getChildren`` of
  the jobs, a pipelined ``get`` of every pointer and every graph, then ``multi``s of 1,000
  lock creations, each fenced by a check of the leader znode's version.

Durability differs and the output says how: the embedded broker (Tansu, ``memory://``) never
writes to disk; etcd fsyncs its WAL and ZooKeeper its transaction log (``forceSync=yes``)
before they acknowledge, and the run reads each server's own fsync counter to show it.
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
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STORES", "PeerStartError", "PeersError", "PeersFigures", "StoreFigures", "bench_peers", "format_peers",
           "missing_peers"]

STORES = ("jobreg", "etcd", "zookeeper")
TITLES = {"jobreg": "jobreg", "etcd": "etcd", "zookeeper": "ZooKeeper"}
GRAPH_BYTES = 2048
BATCH = 1000  # jobs per jobreg submit_many call and per failover lock batch of the peers
WARM_UP = 50  # untimed submits first, as in bench core
ETCD_MAX_TXN_OPS = 2048  # so that a batch of 1,000 lock rewrites fits one transaction
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


def missing_peers(stores: tuple[str, ...] = ("etcd", "zookeeper")) -> dict[str, str]:
    """For each peer store that cannot run here, one line saying why and how to install it."""
    missing: dict[str, str] = {}
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
class StoreFigures:
    """One store's figures and how it was run."""

    store: str
    version: str = ""
    command: str = ""  # the server's command line (or the broker's storage flags)
    durability: str = ""
    fsyncs: int | None = None  # the server's own fsync counter over the run
    submit_p50_ms: float = 0.0
    submit_p99_ms: float = 0.0
    throughput_jobs_per_s: float = 0.0
    failover_claim_s: float = 0.0
    failover_s: float = 0.0
    failover_cold_s: float | None = None  # jobreg only: a standby that starts cold


@dataclass
class PeersFigures:
    """Figures of one ``bench peers`` run."""

    submits: int
    jobs: int
    threads: int
    stores: dict[str, StoreFigures] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def _percentile(samples: list[float], q: float) -> float:
    """The same nearest-rank percentile as ``jobreg bench core``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _one_at_a_time(submit: Callable[[str, bytes], object], submits: int) -> list[float]:
    """Milliseconds of each of ``submits`` submits, one at a time, after a warm-up."""
    for i in range(WARM_UP):
        submit(f"warm-{i}", _graph(i))
    lat = []
    for i in range(submits):
        graph = _graph(i)
        t0 = time.perf_counter()
        submit(f"single-{i}", graph)
        lat.append((time.perf_counter() - t0) * 1000)
    return lat


def _latency(lat_ms: list[float], f: StoreFigures) -> None:
    f.submit_p50_ms = statistics.median(lat_ms)
    f.submit_p99_ms = _percentile(lat_ms, 0.99)


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
        return sock.getsockname()[1]


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


def _filesystem(path: str) -> str:
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


# -- jobreg --------------------------------------------------------------------------------------


def _run_jobreg(submits: int, jobs: int, progress: _Progress) -> StoreFigures:
    from registry.client import Registry
    from registry.dev.broker import EmbeddedBroker, find_tansu_binary

    f = StoreFigures("jobreg")
    tansu = find_tansu_binary()
    with contextlib.suppress(Exception):
        f.version = "Tansu " + subprocess.run(
            [str(tansu), "--version"], capture_output=True, text=True,
            timeout=10).stdout.split()[-1]
    f.command = f"{tansu.name} broker --storage-engine memory://tansu/ (embedded, 127.0.0.1)"
    f.durability = ("Tansu's memory engine: the log is never written to disk, so never fsynced; "
                    "a broker restart loses it")
    with EmbeddedBroker() as broker:
        regs: list[Registry] = []
        try:
            # Two topics, so the one-at-a-time records (two batches per transaction) do not
            # share a partition with the failover's jobs (Tansu lists a partition's batches
            # on each fetch; see DESIGN.md).
            reg = Registry.connect(broker.bootstrap, "peers", topic="jobreg-peers-latency")
            regs.append(reg)
            term = reg.claim_leadership("leader-1")
            progress(f"jobreg: {submits} fenced submits, one at a time")
            _latency(_one_at_a_time(term.submit, submits), f)

            progress(f"jobreg: {jobs} jobs in submit_many calls of {BATCH}")
            topic = "jobreg-peers-failover"
            old = Registry.connect(broker.bootstrap, "peers", topic=topic)
            regs.append(old)
            term = old.claim_leadership("leader-1")
            t0 = time.perf_counter()
            for start in range(0, jobs, BATCH):
                term.submit_many([(f"job-{j}", _graph(j))
                                  for j in range(start, min(jobs, start + BATCH))])
            f.throughput_jobs_per_s = jobs / (time.perf_counter() - t0)

            progress(f"jobreg: failover of {jobs} live jobs (a hot standby, then a cold one)")
            standby = Registry.connect(broker.bootstrap, "peers", topic=topic)
            regs.append(standby)
            t0 = time.perf_counter()
            term2 = standby.claim_leadership("leader-2")
            f.failover_claim_s = time.perf_counter() - t0
            results = term2.recover()
            f.failover_s = time.perf_counter() - t0
            if len(results) != jobs or not all(r.ok for r in results):
                raise PeersError("jobreg: recover() did not adopt every job")

            t0 = time.perf_counter()
            cold = Registry.connect(broker.bootstrap, "peers", topic=topic)
            regs.append(cold)
            results = cold.claim_leadership("leader-3").recover()
            f.failover_cold_s = time.perf_counter() - t0
            if len(results) != jobs or not all(r.ok for r in results):
                raise PeersError("jobreg: recover() did not adopt every job (cold)")
        finally:
            for r in regs:
                with contextlib.suppress(Exception):
                    r.close()
    return f


# -- etcd, Kubernetes-HA-style --------------------------------------------------------------------


def _start_etcd(work: Path, progress: _Progress) -> tuple[_Server, int, StoreFigures]:
    import httpx

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
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"]
    server = _Server("etcd", argv, work / "etcd.log")
    progress(f"etcd: starting on 127.0.0.1:{client}")

    def ready() -> bool:
        r = httpx.get(f"http://127.0.0.1:{client}/health", timeout=2)
        return r.status_code == 200 and r.json().get("health") == "true"

    server.start(ready)
    f = StoreFigures("etcd")
    with contextlib.suppress(Exception):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        f.version = out.stdout.split("\n")[0].split(":")[-1].strip()
    f.command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))
    f.durability = (f"fsyncs its WAL before it acknowledges a write (etcd {f.version or '3.4'} "
                    f"has no switch to turn that off); data dir on {_filesystem(str(work))}")
    return server, client, f


def _etcd_fsyncs(port: int) -> int | None:
    import httpx

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


async def _etcd_workload(port: int, submits: int, jobs: int, threads: int, f: StoreFigures,
                         progress: _Progress) -> None:
    import aetcd

    options = {"grpc.max_receive_message_length": 512 * 2**20}  # one range read of all graphs
    async with aetcd.Client(host="127.0.0.1", port=port, timeout=60, options=options) as c:
        progress(f"etcd: {submits} fenced submits, one at a time")
        leader = _EtcdLeader(c, b"/jobreg-bench/latency", "leader-1")
        await leader.claim()
        for i in range(WARM_UP):
            await leader.submit(f"warm-{i}", _graph(i))
        lat = []
        for i in range(submits):
            graph = _graph(i)
            t0 = time.perf_counter()
            await leader.submit(f"single-{i}", graph)
            lat.append((time.perf_counter() - t0) * 1000)
        _latency(lat, f)

        progress(f"etcd: {jobs} jobs by {threads} concurrent submitters")
        root = b"/jobreg-bench/failover"
        leader = _EtcdLeader(c, root, "leader-1")
        await leader.claim()

        async def submitter(k: int) -> None:
            for j in range(k, jobs, threads):
                await leader.submit(f"job-{j}", _graph(j))

        t0 = time.perf_counter()
        await asyncio.gather(*(submitter(k) for k in range(threads)))
        f.throughput_jobs_per_s = jobs / (time.perf_counter() - t0)

    progress(f"etcd: failover of {jobs} live jobs")
    async with aetcd.Client(host="127.0.0.1", port=port, timeout=60, options=options) as c:
        await c.get(b"/jobreg-bench/warm-up")  # the standby is connected before the clock
        successor = _EtcdLeader(c, root, "leader-2")
        t0 = time.perf_counter()
        await successor.claim()
        f.failover_claim_s = time.perf_counter() - t0
        await successor.take_over(jobs)
        f.failover_s = time.perf_counter() - t0


def _run_etcd(work: Path, submits: int, jobs: int, threads: int,
              progress: _Progress) -> StoreFigures:
    server, port, f = _start_etcd(work, progress)
    try:
        before = _etcd_fsyncs(port)
        asyncio.run(_etcd_workload(port, submits, jobs, threads, f, progress))
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
                    f"(group commit); data dir on {_filesystem(str(work))}")
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
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=f"127.0.0.1:{port}", timeout=15.0)
    zk.start(timeout=30)
    return zk


def _close_kazoo(zk: Any) -> None:
    with contextlib.suppress(Exception):
        zk.stop()
    with contextlib.suppress(Exception):
        zk.close()


def _run_zookeeper(work: Path, submits: int, jobs: int, threads: int,
                   progress: _Progress) -> StoreFigures:
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
        _latency(_one_at_a_time(leader.submit, submits), f)

        progress(f"ZooKeeper: {jobs} jobs by {threads} threads")
        root = "/jobreg-bench/failover"
        leader = _ZkLeader(zk, root, "leader-1")
        leader.claim()

        def submitter(k: int) -> None:
            for j in range(k, jobs, threads):
                leader.submit(f"job-{j}", _graph(j))

        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            for fut in [pool.submit(submitter, k) for k in range(threads)]:
                fut.result()
            f.throughput_jobs_per_s = jobs / (time.perf_counter() - t0)

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


def bench_peers(*, submits: int = 1000, jobs: int = 10_000, threads: int = 8,
                only: tuple[str, ...] = STORES, work_dir: str | None = None,
                progress: _Progress = lambda _: None) -> PeersFigures:
    """Run the workloads on each store of ``only`` that can run here; the others are skipped
    with the reason in ``figures.skipped``."""
    figures = PeersFigures(submits=submits, jobs=jobs, threads=threads)
    figures.skipped = missing_peers(tuple(s for s in only if s != "jobreg"))
    for line in figures.skipped.values():
        progress(line)
    with _work_dir(work_dir) as work:
        for store in STORES:
            if store not in only or store in figures.skipped:
                continue
            if store == "jobreg":
                figures.stores[store] = _run_jobreg(submits, jobs, progress)
            elif store == "etcd":
                (work / "etcd-run").mkdir()
                figures.stores[store] = _run_etcd(work / "etcd-run", submits, jobs, threads,
                                                  progress)
            else:
                (work / "zk-run").mkdir()
                figures.stores[store] = _run_zookeeper(work / "zk-run", submits, jobs, threads,
                                                       progress)
    return figures


# -- the table -----------------------------------------------------------------------------------


def _ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else (" (met)" if ok else " (missed)")


def format_peers(p: PeersFigures) -> str:
    """The figures side by side with the ratios, the targets, what each store did and how
    durable each is."""
    import textwrap

    from registry.render import table

    present = {s: p.stores.get(s) for s in STORES}
    Get = Callable[[StoreFigures], float | None]

    def value(store: str, get: Get, get_peer: Get | None) -> float | None:
        fig = present[store]
        if fig is None:
            return None
        return (get_peer or get)(fig) if store != "jobreg" else get(fig)

    jr, etcd = present["jobreg"], present["etcd"]
    p99_ok = (jr.submit_p99_ms <= etcd.submit_p99_ms) if jr and etcd else None
    fo_ok = (jr.failover_s <= 0.5) if jr and p.jobs == 10_000 else None
    tp_ok = (jr.throughput_jobs_per_s >= 20_000) if jr else None
    etcd_p99 = f"{etcd.submit_p99_ms:.2f} ms" if etcd else "not run"
    failover = f"failover, {p.jobs:,} live jobs"
    measures: list[tuple[str, Get, Get | None, str, str]] = [
        (f"submit p50, one at a time ({p.submits:,})", lambda f: f.submit_p50_ms, None,
         "{:.2f} ms", ""),
        (f"submit p99, one at a time ({p.submits:,})", lambda f: f.submit_p99_ms, None,
         "{:.2f} ms", f"<= etcd's p99 in this run ({etcd_p99}){_verdict(p99_ok)}"),
        (f"{failover}: claim", lambda f: f.failover_claim_s, None, "{:.3f} s", ""),
        (f"{failover}: claim -> all taken over", lambda f: f.failover_s, None, "{:.3f} s",
         f"<= 0.5 s at 10,000 jobs{_verdict(fo_ok)}"),
        (f"{failover}, cold standby (*)", lambda f: f.failover_cold_s, lambda f: f.failover_s,
         "{:.3f} s", ""),
        (f"submit throughput ({p.jobs:,} jobs) (**)", lambda f: f.throughput_jobs_per_s, None,
         "{:,.0f} jobs/s", f">= 20,000 jobs/s{_verdict(tp_ok)}"),
    ]
    headers = ["measure", "jobreg", "etcd", "ZooKeeper", "jobreg/etcd", "jobreg/ZooKeeper",
               "target (jobreg)"]
    rows = []
    for name, get, get_peer, fmt, target in measures:
        v = {s: value(s, get, get_peer) for s in STORES}
        rows.append([name] + ["-" if v[s] is None else fmt.format(v[s]) for s in STORES]
                    + [_ratio(v["jobreg"], v["etcd"]), _ratio(v["jobreg"], v["zookeeper"]),
                       target])
    def para(text: str, indent: str = "", hang: str = "") -> list[str]:
        return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=hang or indent,
                             break_on_hyphens=False, break_long_words=False)

    out = table(headers, rows, right=range(1, 6)).split("\n")
    out.append("")
    out += para("(*) jobreg: Registry.connect (folding the log) inside the clock; the peers' "
                "figure is their failover above, which reads everything anyway.")
    out += para(f"(**) jobreg: submit_many, {BATCH:,} jobs per atomic call; etcd and ZooKeeper: "
                f"{p.threads} concurrent submitters, one job per submit.")
    out += para("Ratios are jobreg's figure over the peer's: below 1 is better for jobreg in "
                "times, above 1 in throughput. Every graph is "
                f"{GRAPH_BYTES:,} bytes; {WARM_UP} untimed submits come first on each store; "
                "every server on 127.0.0.1 of this machine, none replicated.")
    out += ["", "What each store does:"]
    shapes = {
        "jobreg": "submit: Term.submit (one fenced transaction; returns once the fold accepted "
                  f"it). Failover: claim_leadership + recover() (reads the log, every graph "
                  f"included, and adopts every job in calls of {BATCH:,}), by a standby that had "
                  "folded the log (hot), then by one started inside the clock (cold).",
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
    for store in STORES:
        if present[store] is not None:
            out += para(shapes[store], f"  {TITLES[store]:<11}", " " * 13)
    out += ["", "Durability differs; read the figures with it:"]
    for store in STORES:
        fig = present[store]
        if fig is None:
            continue
        counted = "" if fig.fsyncs is None else (
            f"; the server counted {fig.fsyncs:,} fsyncs during the run")
        out += para(f"{fig.version}: {fig.durability}{counted}.", f"  {TITLES[store]:<11}",
                    " " * 13)
        out += para(f"command: {fig.command}", " " * 13)
    if jr is not None and (etcd is not None or present["zookeeper"] is not None):
        out += para("jobreg's figures here are of a memory log; etcd's and ZooKeeper's include "
                    "a disk fsync per commit (shared by concurrent commits). Apache Kafka, "
                    "jobreg's production log, does not fsync per write by default either: "
                    "acks=all answers once the in-sync replicas have the record.", "  ")
    if p.skipped:
        out.append("")
        out += list(p.skipped.values())
    return "\n".join(out)
