"""Runs a fault campaign: a broker, N coordinator processes, the nemesis, then the checker.

One run (:func:`run_once`), in this order:

1. start an embedded broker (Tansu, in memory, 127.0.0.1) behind the fault proxy; or, with
   ``broker="kafka"``, take Apache Kafka's three nodes
   (:class:`~registry.dev.torture.cluster.CampaignCluster`, one per parallel slot of a
   campaign, reused by its runs and made whole before each); or, given a ``bootstrap``,
   that Kafka (then no broker or network faults: only client-side ones);
2. create a fresh topic ``torture-<seed>-<random>`` (replication factor 3 on the three
   nodes) and write ``run.json``;
3. start the workers (:mod:`registry.dev.torture.worker`) and the nemesis
   (:mod:`registry.dev.torture.nemesis`); write a snapshot of each namespace midway;
4. at the time bound: stop the nemesis (everything paused resumes, the network heals),
   SIGTERM the workers, SIGKILL the ones still running after a grace;
5. read the log: ``log.jsonl`` (every raw record of the namespaces' partitions, base64),
   and, from the library, each namespace's final state from a fresh client and from
   every snapshot (``final/<ns>.json``), the fold's verdict per record
   (``decisions/<ns>.jsonl``) and a dump (``dump/<ns>.avro``: ``jobreg --from-file``);
6. stop the broker, run :func:`registry.dev.torture.checker.check`, write
   ``violations.json`` and ``summary.json``.

The run folder also holds ``history/<process>.jsonl`` (the workers' histories),
``nemesis.jsonl``, ``procs.jsonl`` (every worker incarnation and how it ended),
``blobs/`` (the shared blob store), ``snapshots/`` and ``logs/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from registry.dev.torture.model import b64

__all__ = ["NAMESPACES", "CampaignConfig", "campaign", "format_summary", "gc_grace", "run_once"]

NAMESPACES = ("ns-c", "ns-h", "ns-a", "ns-b", "ns-d", "ns-e", "ns-f", "ns-g")
"""Namespace names in use order; the first two share a partition of an 8-partition topic."""


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign runs; the defaults are the CLI's."""

    seed: int = 1
    runs: int = 1
    seconds: float = 30.0
    processes: int = 3
    writers: int = 4
    namespaces: int = 2
    lease: float = 2.0
    out: Path = field(default=Path("jobreg-torture"))
    bootstrap: str | None = None
    proxy: bool = True
    inline_limit: int = 1024
    fault_interval: tuple[float, float] = (0.3, 1.2)
    parallel: int = 1
    broker: str = "embedded"
    """``embedded`` (Tansu behind the fault proxy) or ``kafka`` (three Apache Kafka nodes,
    node faults); ignored when ``bootstrap`` is given."""
    stalls: float = 0.05
    """The chance that a worker's thread is held (up to 0.2 s) at each stall point of the
    write path and the election it reaches (:mod:`registry.stalls`); 0: none."""
    mutate: str | None = None
    """A fixed defect the workers put back (:data:`~registry.dev.torture.worker.MUTATIONS`),
    to show that the campaign catches it; ``None``: the real code."""


BROKERS = ("embedded", "kafka")


def gc_grace(lease: float, timeout: float, *, broker: str) -> float:
    """The blob GC grace the workers use: longer than a blob's put can precede its submit's
    record landing here (README "Job graphs": ``grace`` must exceed it), and no longer.

    That time is the longest pause the nemesis gives a worker (2.5 leases), plus how long
    the broker side may hold a record it was sent: on the embedded broker a pause and a
    network fault (1.2 leases each); on Kafka's three nodes the longest node fault (a cut
    of 3 leases) plus the broker session timeout (3 s: then a new leader or transaction
    coordinator takes over and ends what the struck node held); on a given bootstrap
    nothing. Plus a submit's own time (up to four sends of two timeouts each, with
    backoff), plus a second.
    """
    hold = {"embedded": 2.4 * lease, "kafka": 3.0 * lease + 3.0}.get(broker, 0.0)
    return 2.5 * lease + hold + 4 * (2 * timeout + 0.25) + 1.0


class _Workers:
    """The worker processes: spawn, restart after a kill, stop; ``procs.jsonl`` says how
    each incarnation ended."""

    def __init__(self, run_dir: Path, names: list[str], rng: random.Random) -> None:
        self.run_dir = run_dir
        self.rng = rng
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._incarnation: dict[str, int] = dict.fromkeys(names, -1)
        self._started: dict[str, float] = {}
        self._killed: set[int] = set()
        self._stopping = threading.Event()
        self._log = (run_dir / "procs.jsonl").open("a", buffering=1)
        # The nemesis thread (kill) and the run's loop (reap, stop) both write procs.jsonl:
        # one lock around each whole line (a text stream keeps no two threads' lines apart).
        self._log_lock = threading.Lock()

    def spawn(self, name: str) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._incarnation[name] += 1
            inc = self._incarnation[name]
            err = (self.run_dir / "logs" / f"{name}.{inc}.err").open("ab")
            try:
                self._procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "registry.dev.torture.worker", str(self.run_dir), name,
                     str(inc)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err, start_new_session=True)
            finally:
                err.close()
            self._started[name] = time.time()

    def running(self) -> dict[str, int]:
        with self._lock:
            return {n: p.pid for n, p in self._procs.items() if p.poll() is None}

    def kill(self, name: str, pid: int) -> bool:
        """SIGKILL ``name`` if ``pid`` is its running incarnation; restart it later.

        Marked as killed before the signal, under the lock :meth:`reap` takes, so a
        kill is never also taken for a crash (which would restart the worker twice and
        leave an incarnation nobody stops)."""
        with self._lock:
            proc = self._procs.get(name)
            if proc is None or proc.pid != pid or proc.poll() is not None \
                    or pid in self._killed:
                return False
            self._killed.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it died on its own just now: reap restarts it
                self._killed.discard(pid)
                return False
        self._ended(name, proc, "nemesis_kill")
        t = threading.Timer(self.rng.uniform(0.2, 1.5), self.spawn, args=(name,))
        t.daemon = True
        t.start()
        return True

    def reap(self) -> None:
        """Restart workers that ended on their own (a crash is on record, the load goes on)."""
        with self._lock:
            ended = [(n, p) for n, p in self._procs.items()
                     if p.poll() is not None and p.pid not in self._killed]
            for _n, p in ended:
                self._killed.add(p.pid)
        for name, proc in ended:
            self._ended(name, proc, "exited")
            self.spawn(name)

    def _ended(self, name: str, proc: subprocess.Popen[bytes], how: str) -> None:
        try:
            code = proc.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        line = json.dumps({
            "process": name, "incarnation": self._incarnation[name], "pid": proc.pid,
            "start": self._started.get(name), "end": time.time(), "how": how,
            "returncode": code}) + "\n"
        with self._log_lock:
            if not self._log.closed:
                self._log.write(line)

    def stop(self, grace: float) -> None:
        """SIGTERM every worker, SIGKILL those still running after ``grace`` seconds."""
        self._stopping.set()
        with self._lock:
            procs = {n: p for n, p in self._procs.items() if p.pid not in self._killed}
        for p in procs.values():
            if p.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, sig)
        deadline = time.monotonic() + grace
        for name, p in procs.items():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
                how = "stopped"
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # its threads' stacks first
                    os.kill(p.pid, signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(1.0)
                p.kill()
                how = "end_kill"
            # SIGTERM before the worker's handler is in (a fresh restart) ends it by signal.
            self._ended(name, p, how if p.returncode in (0, -signal.SIGTERM, None)
                        or how == "end_kill" else "exited")
        with self._log_lock:
            self._log.close()


def _free_run_dir(base: Path, index: int, seed: int) -> Path:
    path = base / f"run-{index:03d}-seed-{seed}"
    if path.exists():
        path = base / f"run-{index:03d}-seed-{seed}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    return path


def run_once(config: CampaignConfig, index: int, seed: int,
             progress: Callable[[str], None] | None = None,
             cluster: Any = None) -> dict[str, Any]:
    """One run of the campaign (see the module docstring); returns its summary.

    ``cluster``: with ``config.broker == "kafka"``, a started
    :class:`~registry.dev.torture.cluster.CampaignCluster` to use (made whole first, left
    running); ``None`` starts one for this run and stops it after."""
    from registry.dev.broker import EmbeddedBroker
    from registry.dev.torture.checker import check
    from registry.dev.torture.nemesis import Nemesis
    from registry.dev.torture.proxy import FaultProxy
    from registry.keys import partition_for
    from registry.log import TopicConfig, ensure_topic

    say = progress or (lambda _m: None)
    began = time.monotonic()
    run_dir = _free_run_dir(Path(config.out), index, seed)
    for sub in ("history", "snapshots", "final", "decisions", "dump", "blobs", "logs"):
        (run_dir / sub).mkdir()
    rng = random.Random(seed)
    kind = "external" if config.bootstrap is not None else config.broker
    embedded = kind == "embedded"
    timeout = config.lease / 2
    broker = proxy = None
    own_cluster = None
    nemesis = workers = None
    observers: dict[str, Any] = {}
    topic_config = TopicConfig()
    try:
        if kind == "kafka":
            from registry.dev.torture.cluster import CampaignCluster

            if cluster is None:
                cluster = own_cluster = CampaignCluster().start()
            else:
                cluster.heal()
            bootstrap = cluster.bootstrap
            topic_config = TopicConfig(replication_factor=3)
        elif embedded:
            if config.proxy:
                proxy = FaultProxy(None).start()
                broker = EmbeddedBroker(advertised_port=proxy.port,
                                        log_file=run_dir / "logs" / "broker.log").start()
                proxy.target = ("127.0.0.1", broker.listen_port)
            else:
                broker = EmbeddedBroker(log_file=run_dir / "logs" / "broker.log").start()
            bootstrap = broker.bootstrap
        else:
            cluster = None
            assert config.bootstrap is not None  # not embedded: a bootstrap was given
            bootstrap = config.bootstrap
        topic = f"torture-{seed}-{uuid.uuid4().hex[:8]}"
        info = ensure_topic(bootstrap, topic, topic_config, timeout=10.0)
        names = list(NAMESPACES[:config.namespaces])
        partitions = {ns: partition_for(ns, info.partitions) for ns in names}
        startup = time.monotonic() - began
        cfg: dict[str, Any] = {
            "seed": seed, "run": index, "bootstrap": bootstrap, "embedded": embedded,
            "broker": kind, "replication_factor": topic_config.replication_factor,
            "node_cut": bool(cluster is not None and cluster.can_cut),
            "proxy": proxy is not None, "topic": topic, "namespaces": names,
            "partitions": partitions, "processes": config.processes,
            "writers": config.writers, "lease": config.lease,
            "timeout": timeout, "inline_limit": config.inline_limit,
            "gc_grace": gc_grace(config.lease, timeout, broker=kind),
            "blob_dir": str((run_dir / "blobs").resolve()), "seconds": config.seconds,
            "started": time.time(), "deadline": time.time() + config.seconds,
            "op_pause": [0.01, 0.06],
            "stalls": config.stalls,
            "mutate": config.mutate,
            "code": code_fingerprint(),
        }
        (run_dir / "run.json").write_text(json.dumps(cfg, indent=2))
        procs = [f"w{i + 1}" for i in range(config.processes)]
        workers = _Workers(run_dir, procs, random.Random(f"{seed}/restarts"))
        for name in procs:
            workers.spawn(name)
        nemesis = Nemesis(random.Random(f"{seed}/nemesis"), workers=workers,
                          bootstrap=bootstrap, topic=topic, namespaces=partitions,
                          lease=config.lease, log_path=run_dir / "nemesis.jsonl",
                          broker=broker, proxy=proxy, interval=config.fault_interval,
                          timeout=timeout, writers=config.writers,
                          cluster=cluster).start()
        snapshot_at = time.time() + config.seconds * rng.uniform(0.4, 0.7)
        snapped = False
        while time.time() < cfg["deadline"]:
            time.sleep(0.2)
            workers.reap()
            if not snapped and time.time() >= snapshot_at:
                snapped = True
                _runner_snapshots(bootstrap, topic, names, run_dir, observers, timeout)
        nemesis.stop()
        nemesis_counts = dict(nemesis.counts)
        nemesis_skipped = dict(nemesis.skipped)
        nemesis = None
        workers.stop(grace=config.lease + 4 * timeout + 3)
        workers = None
        for reg in observers.values():
            reg.close()
        observers.clear()
        if cluster is not None:
            # Heal the last fault first, and wait until every node names the same partition
            # leaders: a node cut or paused at the end may still believe it leads and serve
            # its stale log to a reader whose metadata names it (README "What it
            # guarantees"), and the log read here is what every verdict is checked against
            # (campaign seed 8033: read right after the heal, it ended five records short).
            say("healing the cluster before collecting the log")
            cluster.heal([topic])
            _until_nodes_agree(cluster, topic)
        say("collecting the log")
        _collect(bootstrap, topic, names, partitions, run_dir, embedded=embedded)
    finally:
        if nemesis is not None:
            nemesis.stop()
        if workers is not None:
            workers.stop(grace=2)
        for reg in observers.values():
            with contextlib.suppress(Exception):
                reg.close()
        if broker is not None:
            broker.stop()
        if proxy is not None:
            proxy.stop()
        if own_cluster is not None:
            own_cluster.stop()
    if not embedded and own_cluster is None:
        _delete_topic(bootstrap, topic)
    say("checking")
    report = check(run_dir)
    (run_dir / "violations.json").write_text(json.dumps(report.as_dict(), indent=2,
                                                        default=str))
    summary = {
        "seed": seed, "run": index, "dir": str(run_dir), "topic": topic,
        "bootstrap": "embedded" if embedded else bootstrap, "broker": kind,
        "seconds": config.seconds,
        "processes": config.processes, "writers": config.writers, "namespaces": names,
        "lease": config.lease,
        "gc_grace": cfg["gc_grace"], "startup_seconds": round(startup, 2),
        "wall_seconds": round(time.monotonic() - began, 2),
        "nemesis": nemesis_counts, "nemesis_skipped": nemesis_skipped,
        "ops": report.stats.get("ops", {}), "ops_by_f": report.stats.get("ops_by_f", {}),
        "records": report.stats.get("records", 0),
        "concurrency": report.stats.get("concurrency", {}),
        "deposed": report.stats.get("deposed", {}),
        "violations": dict(Counter(v.rule for v in report.violations)),
        "stalls": _stall_counts(run_dir),
        "violation_count": len(report.violations), "notes": report.notes,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _runner_snapshots(bootstrap: str, topic: str, names: list[str], run_dir: Path,
                      observers: dict[str, Any], timeout: float) -> None:
    from registry.client import Registry
    from registry.errors import RegistryError

    for ns in names:
        try:
            reg = observers.get(ns) or Registry.connect(bootstrap, ns, topic=topic,
                                                        timeout=timeout)
            observers[ns] = reg
            reg.write_snapshot(run_dir / "snapshots" / f"{ns}.runner.snap")
        except RegistryError:
            pass  # the broker is paused or cut now: the workers' snapshots remain


def _until_nodes_agree(cluster: Any, topic: str, timeout: float = 60.0) -> None:
    """Wait (up to ``timeout``) until every node of ``cluster`` names the same leader and
    leader epoch for every partition of ``topic`` (:meth:`CampaignCluster.agrees`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(cluster.agrees(node, topic) for node in cluster.node_ids()):
            return
        time.sleep(0.1)


def _collect(bootstrap: str, topic: str, names: list[str], partitions: dict[str, int],
             run_dir: Path, *, embedded: bool) -> None:
    """Step 5: the raw log, then the library's answers about it."""
    from registry.client import Registry
    from registry.log import LogReader
    from registry.render import decision_json, state_json

    with (run_dir / "log.jsonl").open("w") as out:
        for part in sorted(set(partitions.values())):
            reader = LogReader(bootstrap, topic, part)
            try:
                for batch in reader.read_to_end(10.0):
                    for r in batch:
                        out.write(json.dumps({"p": part, "o": r.offset, "t": r.timestamp,
                                              "k": b64(r.key), "v": b64(r.value)}) + "\n")
            finally:
                reader.close()
    _uncommitted_view(bootstrap, topic, sorted(set(partitions.values())), run_dir)
    for ns in names:
        result: dict[str, Any] = {"namespace": ns}
        with Registry.connect(bootstrap, ns, topic=topic, timeout=10.0) as reg:
            result["fresh"] = state_json(reg.sync())
            with (run_dir / "decisions" / f"{ns}.jsonl").open("w") as out:
                for d in reg.forensics().decisions():
                    out.write(json.dumps(decision_json(d), default=str) + "\n")
            reg.dump(run_dir / "dump" / f"{ns}.avro")
        snaps = sorted((run_dir / "snapshots").glob(f"{ns}.*.snap"),
                       key=lambda p: p.stat().st_mtime)
        chosen = [p for p in snaps if ".runner." in p.name] + \
            [p for p in snaps if ".runner." not in p.name][-2:]
        result["snapshots"] = []
        for path in chosen:
            try:
                with Registry.connect(bootstrap, ns, topic=topic, timeout=10.0,
                                      snapshot=path) as reg:
                    result["snapshots"].append({"path": path.name,
                                                "started_from": reg.started_from,
                                                "state": state_json(reg.sync())})
            except Exception as e:
                result["snapshots"].append({"path": path.name,
                                            "error": f"{type(e).__name__}: {e}",
                                            "diagnosis": _diagnose_start(bootstrap, topic,
                                                                         partitions[ns], path)})
        (run_dir / "final" / f"{ns}.json").write_text(json.dumps(result, indent=1))


def _uncommitted_view(bootstrap: str, topic: str, parts: list[int], run_dir: Path) -> None:
    """What a read_committed reader cannot tell apart, kept for diagnosis (issue 10's open
    finding: acknowledged records beyond the end of the readable log): every record as a
    read_uncommitted reader sees it (``log_uncommitted.jsonl``), and each partition's high
    watermark and last stable offset as the broker reports them (``watermarks.json``). A gap
    between the two views is records of transactions not (yet) committed, or an open
    transaction holding the last stable offset back."""
    from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    marks: dict[str, Any] = {}
    with (run_dir / "log_uncommitted.jsonl").open("w") as out:
        for part in parts:
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"torture-{part}",
                                 "isolation.level": "read_uncommitted",
                                 "enable.partition.eof": True, "enable.auto.commit": False,
                                 "auto.offset.reset": "earliest"})
            try:
                consumer.assign([TopicPartition(topic, part, 0)])
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    m = consumer.poll(1.0)
                    if m is None:
                        continue
                    err = m.error()
                    if err:
                        if err.code() == KafkaError._PARTITION_EOF:
                            break
                        continue
                    out.write(json.dumps({"p": part, "o": m.offset(), "t": m.timestamp()[1],
                                          "k": b64(m.key()), "v": b64(m.value())}) + "\n")
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, part),
                                                           timeout=10, cached=False)
                marks[str(part)] = {"low": low, "high": high}
            except Exception as e:  # diagnosis only: never fails the run
                marks[str(part)] = {"error": f"{type(e).__name__}: {e}"}
            finally:
                consumer.close()
    with contextlib.suppress(Exception):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for level, name in ((IsolationLevel.READ_COMMITTED, "last_stable"),
                            (IsolationLevel.READ_UNCOMMITTED, "latest")):
            # confluent_kafka leaves OffsetSpec.latest() unannotated
            asked = {TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
                     for p in parts}
            for tp, fut in admin.list_offsets(asked, isolation_level=level,
                                              request_timeout=10).items():
                with contextlib.suppress(Exception):
                    marks.setdefault(str(tp.partition), {})[name] = fut.result(10).offset
    (run_dir / "watermarks.json").write_text(json.dumps(marks, indent=1))


def _diagnose_start(bootstrap: str, topic: str, partition: int, path: Path) -> dict[str, Any]:
    """What the log looks like from a snapshot whose start failed (a rare finding of the
    campaign, not yet explained): the snapshot's position, the broker's end offset, and how
    far a plain read from that position gets in 30 s."""
    from registry.log import LogReader
    from registry.snapshot import read_snapshot

    out: dict[str, Any] = {}
    try:
        position = read_snapshot(path).image.provenance.last_offset + 1
        out["position"] = position
        reader = LogReader(bootstrap, topic, partition, start_offset=position)
        try:
            out["end_offset"] = reader.end_offset(10.0)
            last = None
            try:
                for batch in reader.read_to_end(30.0):
                    last = batch[-1].offset
                out["read"] = f"reached the end after offset {last}"
            except Exception as e:  # noqa: BLE001 - a diagnosis records whatever happens
                out["read"] = f"{type(e).__name__}: {e} (last offset read: {last})"
        finally:
            reader.close()
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    # The client is held until the answer: a temporary one was destroyed before it sent
    # the request, and every run's topic stayed (found on Kafka's three nodes, where 30
    # runs' topics made each failover move hundreds of partitions).
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.delete_topics([topic], operation_timeout=10)[topic].result(15)
    except Exception:
        pass  # the run's topic stays; its name says what it is
    finally:
        del admin


def campaign(config: CampaignConfig, progress: Callable[[str], None] | None = None
             ) -> list[dict[str, Any]]:
    """``config.runs`` runs with seeds ``seed, seed + 1, ...``, ``config.parallel`` at a
    time (each with its own broker and folder); a progress line as each ends."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    say = progress or (lambda _m: None)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    done: list[int] = [0, 0]  # runs ended, violations so far
    kafka = config.bootstrap is None and config.broker == "kafka"
    slot = threading.local()  # on Kafka: each parallel slot's cluster, reused by its runs
    clusters: list[Any] = []

    def cluster_of_slot() -> Any:
        from registry.dev.torture.cluster import CampaignCluster

        if getattr(slot, "cluster", None) is None:
            say("starting Apache Kafka (3 nodes) for "
                f"{threading.current_thread().name}")
            slot.cluster = CampaignCluster().start()
            with lock:
                clusters.append(slot.cluster)
        return slot.cluster

    def one(i: int) -> dict[str, Any]:
        seed = config.seed + i
        say(f"run {i + 1}/{config.runs} seed {seed}: {config.processes} processes of "
            f"{config.writers} writer thread(s), {config.namespaces} namespaces, "
            f"{config.seconds:g} s ...")
        if kafka:
            from registry.errors import BrokerError

            cluster = cluster_of_slot()
            try:
                cluster.heal()
            except BrokerError as e:  # a cluster that cannot be made whole is replaced
                say(f"run {i + 1} seed {seed}: {e}; a fresh cluster")
                slot.cluster = None
                cluster.stop()
                cluster = cluster_of_slot()
            try:
                s = run_once(config, i, seed, cluster=cluster)
            except Exception as e:  # noqa: BLE001 - on record, the campaign goes on
                # A run that could not finish (a cluster that would not come back, a read
                # that failed) judges nothing: it is counted apart, never as a clean run.
                say(f"run {i + 1}/{config.runs} seed {seed}: RUNNER ERROR "
                    f"{type(e).__name__}: {e}")
                slot.cluster = None
                cluster.stop()
                return {"seed": seed, "run": i, "dir": "", "runner_error":
                        f"{type(e).__name__}: {e}"[:500], "nemesis": {}, "ops": {},
                        "violations": {}, "violation_count": 0, "wall_seconds": 0.0,
                        "startup_seconds": 0.0, "notes": []}
        else:
            s = run_once(config, i, seed)
        ops = s["ops"]
        with lock:
            done[0] += 1
            done[1] += s["violation_count"]
            say(f"run {i + 1}/{config.runs} seed {seed} ({done[0]} ended): "
                f"{sum(ops.values())} ops (ok {ops.get('ok', 0)}, fail {ops.get('fail', 0)}, "
                f"info {ops.get('info', 0)}), {sum(s['nemesis'].values())} faults, "
                f"{s['violation_count']} violations ({done[1]} so far), "
                f"{s['wall_seconds']:.1f} s -> {s['dir']}")
        return s

    try:
        if config.parallel <= 1:
            summaries = [one(i) for i in range(config.runs)]
        else:
            with ThreadPoolExecutor(config.parallel, thread_name_prefix="torture-run") as pool:
                summaries = list(pool.map(one, range(config.runs)))
    finally:
        for c in clusters:
            c.stop()
    (Path(config.out) / "campaign.json").write_text(json.dumps(
        {"config": {**asdict(config), "out": str(config.out)}, "runs": summaries}, indent=2,
        default=str))
    return summaries


def format_summary(summaries: list[dict[str, Any]]) -> str:
    """The campaign's table: violations by rule, faults by kind, operations by outcome."""
    from registry.render import table

    failed = [s for s in summaries if s.get("runner_error")]
    summaries = [s for s in summaries if not s.get("runner_error")]
    rules: Counter[str] = Counter()
    runs_with: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    overlap: Counter[str] = Counter()
    in_flight = 0
    for s in summaries:
        rules.update(s["violations"])
        runs_with.update(s["violations"].keys())
        faults.update(s["nemesis"])
        ops.update(s["ops"])
        conc = dict(s.get("concurrency") or {})
        in_flight = max(in_flight, conc.pop("max_in_flight", 0))
        overlap.update(conc)
    lines = [f"{len(summaries)} run(s), seeds {', '.join(str(s['seed']) for s in summaries)}; "
             f"{sum(rules.values())} violation(s)", ""]
    if rules:
        lines.append(table(["rule", "violations", "runs"],
                           ([r, n, runs_with[r]] for r, n in sorted(rules.items()))))
    else:
        lines.append("no violations")
    lines += ["", table(["fault", "count"], sorted(faults.items())), "",
              table(["operations", "count"], [[k, ops.get(k, 0)]
                                              for k in ("ok", "fail", "info", "unfinished")])]
    writers = sorted({s.get("writers", 1) for s in summaries})
    held: Counter[str] = Counter()
    for summary in summaries:
        held.update(summary.get("stalls") or {})
    lines += ["", "threads held at stall points: " + (
        ", ".join(f"{name} {n}" for name, n in sorted(held.items())) if held else "none")]
    lines += ["", f"writer threads per process: {', '.join(map(str, writers))}; write calls "
              f"that overlapped another of their term in their process: "
              f"{overlap['overlapping']} (ok {overlap['ok']}, refused {overlap['refused']} of which "
              f"fenced {overlap['fenced']}, "
              f"unknown {overlap['unknown']}, cut by a kill {overlap['cut']}; revokes "
              f"{overlap['revokes']}); at most {in_flight} in flight at once"]
    windows = sum((s.get("deposed") or {}).get("windows", 0) for s in summaries)
    if windows:
        pairs = sum((s.get("deposed") or {}).get("pairs_not_compared", 0) for s in summaries)
        lines += ["", f"deposed-leader windows (Kafka: a leader cut off or paused until a "
                  f"follower led, up to when it learned): {windows}; read/acknowledgement "
                  f"pairs inside one, not compared: {pairs}"]
    errors = [n for s in summaries for n in s.get("notes", []) if n.startswith("CHECKER ERROR")]
    if errors:
        lines += ["", *errors]
    if failed:
        lines += ["", f"{len(failed)} run(s) did not finish (not judged, not counted above):",
                  *(f"  seed {s['seed']}: {s['runner_error']}" for s in failed)]
    walls = [s["wall_seconds"] for s in summaries]
    if walls:
        brokers = sorted({s.get("broker", "embedded") for s in summaries})
        lines += ["", f"broker: {', '.join(brokers)}; wall time per run: {min(walls):.1f}-"
                  f"{max(walls):.1f} s, mean {sum(walls) / len(walls):.1f} s (start-up "
                  f"{max(s['startup_seconds'] for s in summaries):.1f} s at most)"]
    return "\n".join(lines)


def check_folder(path: str | Path, progress: Callable[[str], None] | None = None
                 ) -> list[dict[str, Any]]:
    """Re-check finished runs: ``path`` is one run folder (it holds ``run.json``) or a
    campaign folder of them. Rewrites each ``violations.json``; returns the summaries."""
    from registry.dev.torture.checker import check

    say = progress or (lambda _m: None)
    path = Path(path)
    runs = [path] if (path / "run.json").exists() else sorted(
        p for p in path.iterdir() if (p / "run.json").exists())
    out = []
    total = 0
    for i, run_dir in enumerate(runs):
        report = check(run_dir)
        (run_dir / "violations.json").write_text(json.dumps(report.as_dict(), indent=2,
                                                            default=str))
        old = run_dir / "summary.json"
        cfg = json.loads((run_dir / "run.json").read_text())
        summary = json.loads(old.read_text()) if old.exists() else {
            "seed": cfg.get("seed"), "run": cfg.get("run"), "dir": str(run_dir),
            "nemesis": report.stats.get("faults", {}), "wall_seconds": 0.0,
            "startup_seconds": 0.0}
        summary.update(ops=report.stats.get("ops", {}), notes=report.notes,
                       concurrency=report.stats.get("concurrency", {}),
                       deposed=report.stats.get("deposed", {}),
                       violations=dict(Counter(v.rule for v in report.violations)),
                       violation_count=len(report.violations))
        total += len(report.violations)
        say(f"check {i + 1}/{len(runs)} {run_dir}: {len(report.violations)} violations "
            f"({total} so far)")
        out.append(summary)
    return out


def first_examples(summaries: list[dict[str, Any]], limit: int = 1) -> list[str]:
    """One line per rule (its first violation): where to start reading."""
    seen: Counter[str] = Counter()
    lines = []
    for s in summaries:
        path = Path(s["dir"]) / "violations.json"
        if not path.exists():
            continue
        for v in json.loads(path.read_text())["violations"]:
            if seen[v["rule"]] < limit:
                seen[v["rule"]] += 1
                where = f" offsets {v['offsets'][:4]}" if v.get("offsets") else ""
                lines.append(f"{v['rule']}: {v['detail'][:300]} [{v.get('ns') or '-'}{where}; "
                             f"{path}]")
    return lines


def _stall_counts(run_dir: Path) -> dict[str, int]:
    """How often the workers' threads were held at each stall point (``stalls/*.json``)."""
    total: Counter[str] = Counter()
    for f in sorted((run_dir / "stalls").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            total.update(json.loads(f.read_text()))
    return dict(total)


def code_fingerprint() -> str:
    """A digest of the jobreg code and schemas this process imported.

    The runner writes it in ``run.json`` and every worker refuses to run with other code
    (an editable install reads the files anew in each process: a campaign left running
    while the code changes would judge a mix of versions).
    """
    import hashlib

    import registry
    import registry.schemas

    digest = hashlib.sha256()
    for root in (Path(registry.__file__).parent, Path(registry.schemas.__file__).parent):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".avsc", ".json") and "__pycache__" not in path.parts:
                digest.update(path.relative_to(root).as_posix().encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
