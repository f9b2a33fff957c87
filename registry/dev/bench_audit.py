"""``jobreg bench audit``: the audit stream's throughput and freshness, and how Spark's
throughput scales with its cores, next to plain Python doing the same work (consume, fold,
write), all in one run.

The log: ``events`` records over ``namespaces`` namespaces (64) on a topic of 8 partitions,
each namespace a realistic history (two terms, submits, adoptions, cancels, 1% refused late
writes), every namespace on its own partition as the client places it, written in
transactions as jobreg's writers write.

1. **Throughput**: the log written into PostgreSQL (a throwaway cluster) by plain Python
   (:func:`registry.audit.writer.run_plain`) and by the Spark job (``availableNow``) under
   each master of ``masters`` (``local[1]``, ``local[2]``, ``local[4]``; ``cluster[N]``, a
   standalone cluster of N workers of one core each that the run starts on loopback and
   stops; or a standalone cluster's ``spark://HOST:PORT`` on this machine: one session after
   the other in this process), and into SQLite by plain Python and the last master. The
   Spark figures exclude the session's start and the first query's warm-up (paid once per
   session; both reported).
2. **Freshness**: a producer (a process of its own) writes events at a steady rate,
   round-robin over the namespaces; a watcher polls the database's progress every 20 ms;
   freshness is the time from a record's delivery report (the broker has it in the log) to
   the first poll that sees its partition's progress past it. p50 and p95 into PostgreSQL,
   plain Python following the log next to Spark (processing-time trigger) per master.
3. **Sources**: each Spark figure for each of ``sources``: ``jobreg-kafka`` (``python``)
   and Spark's own connector (``kafka``, its jars from
   :func:`consumers.audit_job.choose_source`: the cache or Maven Central, once).
4. **Memory**: the peak resident memory, sampled every 0.2 s while an engine's figures are
   taken, of the driver (this process and its JVM) and of the executors (this application's
   executor JVMs on this machine, and the Spark Python workers below them or below the
   driver's JVM); in local mode the executor is the driver's JVM, so the executors' column
   is the Python workers only.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from registry.extras import needs

with needs("audit", "jobreg bench audit"):
    from sqlalchemy import select

from registry.audit.db import migrate
from registry.audit.models import AuditProgress
from registry.audit.writer import AuditWriter, follow_plain, run_plain
from registry.dev.bench import figures_table
from registry.dev.brokers import BrokerChoice, start_broker
from registry.dev.pgcluster import ThrowawayPostgres
from registry.dev.sparkcluster import SparkCluster, cluster_workers
from registry.log import TopicConfig, ensure_topic

__all__ = ["MASTERS", "SOURCES", "AuditFigures", "bench_audit", "format_audit",
           "format_audit_summary"]

MASTERS: tuple[str, ...] = ("local[1]", "local[2]", "local[4]")
"""The Spark masters of the scaling table (``local[4]`` on a 2-core machine shows the bend).
``cluster[N]`` (:func:`registry.dev.sparkcluster.cluster_workers`) is a standalone cluster of
N one-core workers the run starts on loopback."""

#: Memory of each worker of a ``cluster[N]`` master (its one executor's heap is Spark's
#: default, 1 GiB, which fits).
WORKER_MEMORY = "1g"

Source = Literal["auto", "python", "kafka"]

SOURCES: tuple[Source, ...] = ("python", "kafka")
"""The audit job's sources the Spark figures are taken with (``--source``'s names)."""

SOURCE_NAMES = {"python": "jobreg-kafka", "kafka": "kafka"}


@dataclass
class AuditFigures:
    """Figures of one ``bench audit`` run."""

    events: int
    namespaces: int = 64
    partitions: int = 8
    throughput: dict[tuple[str, str], float] = field(default_factory=dict)  # (engine, db)
    freshness: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # p50, p95, n
    rate: int = 0
    spark_start_s: dict[str, float] = field(default_factory=dict)  # master -> seconds
    spark_warmup_s: dict[str, float] = field(default_factory=dict)
    cores: int = 0
    broker: str = ""  # BrokerChoice.describe() of the broker the log was on
    memory: dict[str, tuple[float, float]] = field(default_factory=dict)  # MiB: driver, exec
    sources: str = ""  # the one line saying where Spark's connector came from


def _names(n: int) -> list[str]:
    return [f"ns-{i:02d}" for i in range(n)]


def _produce(bootstrap: str, topic: str, records: int, namespaces: int,
             config: TopicConfig | None = None) -> None:
    from confluent_kafka import Producer

    from registry.dev.bench import _replay_log, produce_all
    from registry.keys import partition_for

    info = ensure_topic(bootstrap, topic, config or TopicConfig())
    # Transactions, as jobreg's writers leave the log (one per namespace's share). The
    # embedded broker's ListOffsets answers 1 for a partition an idempotent producer wrote
    # 1,000 records to outside a transaction, and Spark's kafka source believes it (README
    # "What differs"): its --once run would stop there.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "transactional.id": f"jobreg-bench-audit-{os.getpid()}-{time.time_ns()}"})
    producer.init_transactions(60)
    names = _names(namespaces)
    for i, ns in enumerate(names):
        partition = partition_for(ns, info.partitions)
        share = records // namespaces + (1 if i < records % namespaces else 0)
        producer.begin_transaction()
        produce_all(producer, topic, partition, _replay_log(share, ns))
        producer.commit_transaction(120)
    producer.flush(120)


def _steady(bootstrap: str, topic: str, rate: int, seconds: float, namespaces: int,
            sent: dict[str, float], stop: threading.Event) -> None:
    """Submit-like events at ``rate``/s, round-robin over the namespaces;
    ``sent["partition:offset"]`` = when its delivery was reported."""
    from confluent_kafka import Producer

    from registry.events import InlineGraph, JobSubmitted, LeadershipGranted, new_event_id
    from registry.keys import partition_for, record_key
    from registry.wire import encode

    info = ensure_topic(bootstrap, topic, TopicConfig())
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    names = _names(namespaces)

    def delivered(err: Any, msg: Any) -> None:
        if err is None:  # the record is in the log from now on
            sent[f"{msg.partition()}:{msg.offset()}"] = time.monotonic()

    def send(event: Any) -> None:
        producer.produce(topic, encode(event), record_key(event).encode(),
                         partition=partition_for(event.namespace, info.partitions),
                         on_delivery=delivered)
        producer.poll(0)

    for ns in names:
        send(LeadershipGranted(event_id=new_event_id(), namespace=ns, epoch=1, writer="jm",
                               created_at=0, prev_epoch=0))
    t0 = time.monotonic()
    i = 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        i += 1
        send(JobSubmitted(event_id=new_event_id(), namespace=names[i % len(names)], epoch=1,
                          writer="jm", created_at=0, job_id=f"job-{i}",
                          graph=InlineGraph(b"g" * 200)))
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(30)


def _steady_elsewhere(bootstrap: str, topic: str, rate: int, seconds: float,
                      namespaces: int) -> dict[tuple[int, int], float]:
    """:func:`_steady` in a process of its own (the load must not share the audit job's
    interpreter); its times are ``time.monotonic()``, one clock for every process here."""
    import json
    import subprocess
    import sys

    code = ("import json, sys, threading\n"
            "from registry.dev.bench_audit import _steady\n"
            "sent = {}\n"
            "_steady(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), "
            "int(sys.argv[5]), sent, threading.Event())\n"
            "print(json.dumps(sent))\n")
    done = subprocess.run([sys.executable, "-c", code, bootstrap, topic, str(rate), str(seconds),
                           str(namespaces)],
                          capture_output=True, text=True, timeout=seconds + 120, check=True)
    out: dict[tuple[int, int], float] = {}
    for k, v in json.loads(done.stdout).items():
        p, o = k.split(":")
        out[(int(p), int(o))] = v
    return out


def _watch(url: str, topic: str, seen: dict[tuple[int, int], float],
           stop: threading.Event) -> None:
    """Poll the progress table; ``seen[(partition, offset)]`` = first time a poll saw it
    committed."""
    from registry.audit.db import engine_for

    engine = engine_for(url)
    t = AuditProgress.__table__
    last: dict[int, int] = {}
    try:
        while not stop.is_set():
            with engine.connect() as conn:
                now = time.monotonic()
                ends = conn.execute(select(t.c.partition, t.c.next_offset).where(
                    t.c.topic == topic)).all()
            for partition, top in ends:
                for offset in range(last.get(partition, 0), top):
                    seen[(partition, offset)] = now
                last[partition] = max(last.get(partition, 0), top)
            time.sleep(0.02)
    finally:
        engine.dispose()


def _freshness(sent: dict[Any, float], seen: dict[Any, float]) -> tuple[float, float, int]:
    lags = sorted(seen[o] - t for o, t in sent.items() if o in seen)
    if not lags:
        return float("nan"), float("nan"), 0
    p95 = lags[min(len(lags) - 1, round(0.95 * (len(lags) - 1)))]
    return statistics.median(lags), p95, len(lags)


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:  # gone meanwhile
        pass
    return 0.0


def _process_tree() -> tuple[dict[int, int], dict[int, bytes]]:
    """Every process's parent and command line (Linux ``/proc``)."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, bytes] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines[pid] = f.read()
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return parents, cmdlines


def _spark_processes(driver_jvm: int | None, app_id: str) -> tuple[float, float]:
    """The resident memory (MiB) now of the driver (this process and its JVM) and of this
    application's executors: the executor JVMs whose command line names ``app_id`` (a
    standalone cluster's on this machine) and every process below them or below the
    driver's JVM (Spark's Python workers; in local mode the executor is the driver's JVM).
    Other applications' processes on a shared machine are not counted."""
    driver = _rss_mib(os.getpid()) + (_rss_mib(driver_jvm) if driver_jvm else 0.0)
    parents, cmdlines = _process_tree()
    mark = f"--app-id\0{app_id}\0".encode()
    roots = {pid for pid, cmd in cmdlines.items()
             if b"CoarseGrainedExecutorBackend" in cmd and mark in cmd + b"\0"}
    tops = roots | ({driver_jvm} if driver_jvm else set())
    executors = 0.0
    for pid in parents:
        up, seen = pid, 0
        while up not in tops and up > 1 and seen < 64:  # walk up to a root, or to init
            up, seen = parents.get(up, 0), seen + 1
        if up in tops and pid != driver_jvm:
            executors += _rss_mib(pid)
    return driver, executors


class _MemoryPeak:
    """Samples :func:`_spark_processes` every 0.2 s in a thread; :attr:`peak` the highest
    of each while it ran (on Linux; elsewhere zeros)."""

    def __init__(self, spark: Any) -> None:
        proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
        self._jvm = _jvm_pid(proc.pid) if proc is not None else None
        self._app = str(spark.sparkContext.applicationId)
        self.peak = (0.0, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            d, e = _spark_processes(self._jvm, self._app) if os.path.isdir("/proc") \
                else (0.0, 0.0)
            self.peak = (max(self.peak[0], d), max(self.peak[1], e))
            self._stop.wait(0.2)

    def __enter__(self) -> _MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _jvm_pid(launched: int) -> int:
    """The driver's JVM: the process pyspark launched (spark-submit's script, which execs
    ``java``) or, if that one forked it, its ``java`` child."""
    try:
        with open(f"/proc/{launched}/cmdline", "rb") as f:
            if b"java" in f.read().split(b"\0")[0]:
                return launched
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == launched:
                        return int(entry.name)
    except (OSError, ValueError, IndexError):
        pass
    return launched


def cluster_conf(master: str) -> dict[str, str]:
    """Settings of a ``spark://`` master on this machine (a loopback address): the driver on
    loopback too (only local masters get it by default) and the workers' Python this one,
    so the broker and the database the benchmark starts on 127.0.0.1 are theirs too."""
    host = master.removeprefix("spark://").split(":")[0]
    if not master.startswith("spark://") or not (host == "localhost" or host.startswith("127.")):
        return {}
    return {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.pyspark.python": sys.executable}


def _spark(master: str, jars: Sequence[str] = ()) -> Any:
    from consumers.audit_job import spark_session

    before = os.environ.get("JOBREG_SPARK_MASTER")
    os.environ["JOBREG_SPARK_MASTER"] = master  # the scaling table's master, whatever is set
    if cluster_conf(master):
        # pyspark names its workers' Python from PYSPARK_PYTHON when the context starts
        # (spark.pyspark.python becomes that variable only through spark-submit's launcher)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        return spark_session(app_name="jobreg-bench-audit", master=master,
                             extra_conf=cluster_conf(master), jars=jars)
    finally:
        if before is None:
            os.environ.pop("JOBREG_SPARK_MASTER", None)
        else:
            os.environ["JOBREG_SPARK_MASTER"] = before


def bench_audit(*, events: int = 100_000, rate: int = 1000, seconds: float = 20.0,
                namespaces: int = 64, masters: Sequence[str] = MASTERS,
                broker: BrokerChoice | None = None,
                sources: Sequence[Source] = SOURCES,
                progress: Callable[[str], None] = lambda _: None) -> AuditFigures:
    """Run the audit benchmark on a fresh broker (``broker``: the embedded one by default, or
    Apache Kafka) and a throwaway PostgreSQL, Spark with each of ``sources`` (``python``:
    ``jobreg-kafka``; ``kafka``: Spark's connector, fetched once if need be; a connector that
    cannot be had is a one-line error)."""
    from consumers.audit_job import choose_source, run_audit
    from registry.dev.kafka import spark_kafka_jars

    jars: tuple[str, ...] = ()
    connector = ""
    if "kafka" in sources:
        found = choose_source("kafka", "127.0.0.1:9092", fetch=lambda v, d: spark_kafka_jars(
            v, progress, download=d))
        jars, connector = found.jars, found.why

    choice = broker or BrokerChoice.embedded()
    config = choice.topic_config()
    figures = AuditFigures(events=events, rate=rate, namespaces=namespaces,
                           partitions=config.partitions, cores=os.cpu_count() or 0,
                           broker=choice.describe(), sources=connector)
    topic = "bench-audit"
    with start_broker(choice, progress=progress) as running, ThrowawayPostgres() as pg, \
            tempfile.TemporaryDirectory() as tmp:
        bootstrap = running.bootstrap
        progress(f"producing {events:,} events over {namespaces} namespaces")
        _produce(bootstrap, topic, events, namespaces, config)
        n = 0

        def fresh_db(name: str, db: str = "postgresql") -> str:
            nonlocal n
            n += 1
            url = pg.create_database(f"{name}_{n}") if db == "postgresql" else \
                f"sqlite:///{tmp}/{name}_{n}.db"
            migrate(url)
            return url

        def throughput(engine: str, db: str, spark: Any = None,
                       source: Source = "auto") -> None:
            url = fresh_db("t", db)
            progress(f"{events:,} events into {db} with {engine}")
            t0 = time.perf_counter()
            if spark is not None:
                written = run_audit(url, bootstrap, topic, spark=spark, source=source,
                                    max_offsets_per_trigger=50_000).records
            else:
                writer = AuditWriter(url, topic)
                writer.catch_up(bootstrap)
                written = run_plain(writer, bootstrap)
                writer.close()
            elapsed = time.perf_counter() - t0
            if written != events:
                raise RuntimeError(f"{engine} into {db} wrote {written} of {events} records")
            figures.throughput[(engine, db)] = events / elapsed

        def freshness(engine: str, spark: Any = None, source: Source = "auto") -> None:
            fresh_topic = f"bench-fresh-{len(figures.freshness)}"
            url = fresh_db("f")
            ensure_topic(bootstrap, fresh_topic, config)
            progress(f"freshness at {rate}/s for {seconds:g} s into postgresql with {engine}")
            seen: dict[tuple[int, int], float] = {}
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(url, fresh_topic, seen, stop))
            writer = None
            if spark is not None:
                runner = threading.Thread(target=run_audit, args=(url, bootstrap, fresh_topic),
                                          kwargs=dict(spark=spark, mode="follow",
                                                      interval="250 milliseconds",
                                                      stop_event=stop, source=source))
            else:
                writer = AuditWriter(url, fresh_topic)
                writer.catch_up(bootstrap)
                runner = threading.Thread(target=follow_plain, args=(writer, bootstrap, stop))
            watcher.start()
            runner.start()
            time.sleep(8 if spark is not None else 1)  # the query's first batch, warm-up
            sent = _steady_elsewhere(bootstrap, fresh_topic, rate, seconds, namespaces)
            time.sleep(3)
            stop.set()
            runner.join(60)
            watcher.join(10)
            if writer is not None:
                writer.close()
            figures.freshness[engine] = _freshness(sent, seen)

        def spark_figures(i: int, master: str, spark: Any) -> None:
            """Every Spark figure of one master, with each source."""
            for source in sources:
                # The first streaming query of a session (and of a source) starts Spark's
                # Python workers and compiles its plans; paid once, outside the figures
                # (reported separately).
                t0 = time.perf_counter()
                run_audit(fresh_db("warm"), bootstrap, topic, spark=spark, source=source,
                          max_offsets_per_trigger=1000, stop_after=lambda w: w.rows > 0,
                          mode="follow", interval="100 milliseconds")
                engine = f"spark {master}" + (f" {SOURCE_NAMES[source]}" if len(sources) > 1
                                              else "")
                figures.spark_warmup_s[engine] = time.perf_counter() - t0
                with _MemoryPeak(spark) as memory:
                    throughput(engine, "postgresql", spark, source)
                    if i == len(masters) - 1:
                        throughput(engine, "sqlite", spark, source)
                    freshness(engine, spark, source)
                figures.memory[engine] = memory.peak

        throughput("plain", "postgresql")
        throughput("plain", "sqlite")
        freshness("plain")
        for i, master in enumerate(masters):
            with contextlib.ExitStack() as cluster_stack:
                url = master
                workers = cluster_workers(master)
                if workers is not None:
                    progress(f"starting a standalone cluster: a master and {workers} workers "
                             "on 127.0.0.1")
                    logs = Path(tmp) / f"cluster-{i}"
                    logs.mkdir()
                    cluster = cluster_stack.enter_context(SparkCluster(logs))
                    for _ in range(workers):
                        cluster.add_worker(cores=1, memory=WORKER_MEMORY)
                    url = cluster.master_url
                progress(f"starting Spark ({master})")
                t0 = time.perf_counter()
                spark = _spark(url, jars)
                figures.spark_start_s[master] = time.perf_counter() - t0
                try:
                    spark_figures(i, master, spark)
                finally:
                    spark.stop()
    return figures


def format_audit(f: AuditFigures) -> str:
    """The figures as plain-text tables: throughput and freshness with the targets, then the
    scaling of Spark's throughput with its master (next to plain Python)."""
    rows: list[tuple[str, str, str]] = []
    what = f"{f.events:,} events ({f.namespaces} namespaces, {f.partitions} partitions)"
    for (engine, db), per_s in sorted(f.throughput.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        target = ">= 20,000/s" if db == "postgresql" and engine == "spark local[2]" else ""
        rows.append((f"{what} into {db}, {engine}", f"{per_s:,.0f} events/s", target))
    for engine, (p50, p95, n) in f.freshness.items():
        rows.append((f"freshness at {f.rate:,}/s, {engine}, p50 ({n:,} records)",
                     f"{p50 * 1000:,.0f} ms", ""))
        rows.append((f"freshness at {f.rate:,}/s, {engine}, p95", f"{p95 * 1000:,.0f} ms",
                     "< 2,000 ms" if engine.startswith("spark") else ""))
    for master, s in f.spark_start_s.items():
        rows.append((f"Spark {master} session start (not in the above)", f"{s:.1f} s", ""))
    for engine, s in f.spark_warmup_s.items():
        rows.append((f"{engine.replace('spark', 'Spark', 1)} first query (warm-up, not in "
                     "the above)", f"{s:.1f} s", ""))
    for engine, (driver, executors) in f.memory.items():
        rows.append((f"{engine}, peak memory: driver (Python + JVM) / executors (JVMs + "
                     "Python workers)", f"{driver:,.0f} / {executors:,.0f} MiB", ""))
    out = figures_table(rows)
    if f.sources:
        out = f"Spark's kafka source: {f.sources}\n{out}"
    if f.broker and not f.broker.startswith("the embedded broker"):
        out = f"the log on {f.broker}\n{out}"
    base = f.throughput.get(("plain", "postgresql"))
    spark = [(e, v) for (e, db), v in f.throughput.items()
             if db == "postgresql" and e.startswith("spark")]
    if spark:
        first = spark[0][1]
        width = max(16, *(len(e) for e, _ in spark))  # a spark://host:port master is long
        lines = ["", f"scaling into PostgreSQL on {f.cores} cores "
                 "(events/s; ratios within this run)",
                 f"{'engine':<{width}}  {'events/s':>9}  {'x first':>7}  {'x plain':>7}  "
                 f"{'p50 ms':>7}  {'p95 ms':>7}  {'driver MiB':>10}  {'exec MiB':>8}"]
        for engine, v in [("plain", base or 0.0), *spark]:
            p50, p95, _ = f.freshness.get(engine, (float("nan"), float("nan"), 0))
            driver, executors = f.memory.get(engine, (float("nan"), float("nan")))
            lines.append(f"{engine:<{width}}  {v:>9,.0f}  {v / first:>7.2f}  "
                         f"{(v / base if base else float('nan')):>7.2f}  "
                         f"{p50 * 1000:>7,.0f}  {p95 * 1000:>7,.0f}  "
                         f"{driver:>10,.0f}  {executors:>8,.0f}")
        out += "\n" + "\n".join(lines)
    return out


def format_audit_summary(runs: Sequence[tuple[str, AuditFigures]]) -> str:
    """One table over several runs (``(broker, figures)``: ``--embedded-and-kafka``): per
    broker and Spark engine (master and source), events/s into PostgreSQL, freshness p50 and
    p95, and the peak memory of the driver and of the executors."""
    header = ("broker", "engine", "events/s", "p50 ms", "p95 ms", "driver MiB", "exec MiB")
    rows: list[tuple[str, ...]] = []
    for broker, f in runs:
        for (engine, db), per_s in f.throughput.items():
            if db != "postgresql" or not engine.startswith("spark"):
                continue
            p50, p95, _ = f.freshness.get(engine, (float("nan"), float("nan"), 0))
            driver, executors = f.memory.get(engine, (float("nan"), float("nan")))
            rows.append((broker, engine.removeprefix("spark "), f"{per_s:,.0f}",
                         f"{p50 * 1000:,.0f}", f"{p95 * 1000:,.0f}", f"{driver:,.0f}",
                         f"{executors:,.0f}"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()

    return "\n".join(["Spark into PostgreSQL, every broker (ratios only within this run)",
                      line(header), line(tuple("-" * w for w in widths)),
                      *(line(r) for r in rows)])
