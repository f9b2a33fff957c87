"""``jobreg bench audit``: the audit stream's throughput and freshness, Spark next to plain
Python doing the same work (consume, fold, write) in the same run.

1. **Throughput**: a log of N events (two terms, submits, adoptions, cancels, 1% refused
   late writes) written into SQLite and into a throwaway PostgreSQL, by the Spark job
   (``availableNow``) and by plain Python (:func:`registry.audit.writer.run_plain`).
   The Spark figures exclude the session's start and the first query's warm-up (paid
   once per process; both reported).
2. **Freshness**: a producer writes events at a steady rate; a watcher polls the
   database's progress every 20 ms; freshness is the time from a record's delivery report
   (the broker has it in the log) to the first poll that sees its row committed. p50 and p95, Spark (processing-time trigger)
   next to plain Python following the log, into PostgreSQL.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from ..bench import figures_table
from ..broker import EmbeddedBroker
from ..log import TopicConfig, ensure_topic
from .db import migrate
from .models import AuditProgress
from .pgcluster import ThrowawayPostgres
from .writer import AuditWriter, follow_plain, run_plain

__all__ = ["AuditFigures", "bench_audit", "format_audit"]


@dataclass
class AuditFigures:
    """Figures of one ``bench audit`` run."""

    events: int
    throughput: dict[tuple[str, str], float] = field(default_factory=dict)  # (engine, db)
    freshness: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # p50, p95, n
    rate: int = 0
    spark_start_s: float = 0.0
    spark_warmup_s: float = 0.0


def _produce(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    from ..bench import _replay_log
    from ..keys import partition_for

    info = ensure_topic(bootstrap, topic, TopicConfig())
    partition = partition_for("replay", info.partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "enable.idempotence": True})
    for key, value in _replay_log(records):
        while True:
            try:
                producer.produce(topic, value, key, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def _steady(bootstrap: str, topic: str, rate: int, seconds: float,
            sent: dict[int, float], stop: threading.Event) -> None:
    """Submit-like events at ``rate``/s; ``sent[offset]`` = when its delivery was reported."""
    from confluent_kafka import Producer

    from ..codec import encode
    from ..events import InlineGraph, JobSubmitted, LeadershipGranted, new_event_id
    from ..keys import partition_for, record_key

    info = ensure_topic(bootstrap, topic, TopicConfig())
    partition = partition_for("fresh", info.partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def delivered(err: Any, msg: Any) -> None:
        if err is None:  # the record is in the log from now on
            sent[msg.offset()] = time.monotonic()

    def send(event: Any) -> None:
        producer.produce(topic, encode(event), record_key(event).encode(),
                         partition=partition, on_delivery=delivered)
        producer.poll(0)

    send(LeadershipGranted(event_id=new_event_id(), namespace="fresh", epoch=1, writer="jm",
                           created_at=0, prev_epoch=0))
    t0 = time.monotonic()
    i = 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        i += 1
        send(JobSubmitted(event_id=new_event_id(), namespace="fresh", epoch=1, writer="jm",
                          created_at=0, job_id=f"job-{i}", graph=InlineGraph(b"g" * 200)))
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(30)


def _steady_elsewhere(bootstrap: str, topic: str, rate: int, seconds: float) -> dict[int, float]:
    """:func:`_steady` in a process of its own (the load must not share the audit job's
    interpreter); its times are ``time.monotonic()``, one clock for every process here."""
    import json
    import subprocess
    import sys

    code = ("import json, sys, threading\n"
            "from registry.audit.bench import _steady\n"
            "sent = {}\n"
            "_steady(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sent, "
            "threading.Event())\n"
            "print(json.dumps(sent))\n")
    done = subprocess.run([sys.executable, "-c", code, bootstrap, topic, str(rate), str(seconds)],
                          capture_output=True, text=True, timeout=seconds + 120, check=True)
    return {int(k): v for k, v in json.loads(done.stdout).items()}


def _watch(url: str, topic: str, seen: dict[int, float], stop: threading.Event) -> None:
    """Poll the progress table; ``seen[offset] = first time a poll saw it committed``."""
    from .db import engine_for

    engine = engine_for(url)
    t = AuditProgress.__table__
    last = 0
    try:
        while not stop.is_set():
            with engine.connect() as conn:
                now = time.monotonic()
                ends = conn.execute(select(t.c.next_offset).where(t.c.topic == topic)).all()
            top = max((e for (e,) in ends), default=0)
            for offset in range(last, top):
                seen[offset] = now
            last = max(last, top)
            time.sleep(0.02)
    finally:
        engine.dispose()


def _freshness(sent: dict[int, float], seen: dict[int, float]) -> tuple[float, float, int]:
    lags = sorted(seen[o] - t for o, t in sent.items() if o in seen)
    if not lags:
        return float("nan"), float("nan"), 0
    p95 = lags[min(len(lags) - 1, round(0.95 * (len(lags) - 1)))]
    return statistics.median(lags), p95, len(lags)


def bench_audit(*, events: int = 100_000, rate: int = 1000, seconds: float = 20.0,
                progress: Callable[[str], None] = lambda _: None) -> AuditFigures:
    """Run the audit benchmark on a fresh embedded broker and a throwaway PostgreSQL."""
    from consumers.audit_job import run_audit
    from consumers.spark import spark_session

    figures = AuditFigures(events=events, rate=rate)
    with EmbeddedBroker() as broker, ThrowawayPostgres() as pg, \
            tempfile.TemporaryDirectory() as tmp:
        progress(f"producing {events:,} events")
        _produce(broker.bootstrap, "bench-audit", events)
        progress("starting Spark (local[2])")
        t0 = time.perf_counter()
        spark = spark_session(app_name="jobreg-bench-audit")
        figures.spark_start_s = time.perf_counter() - t0
        # The first streaming query of a JVM starts Spark's Python workers and compiles
        # its plans; pay that once, outside the figures (it is reported separately).
        warm = f"sqlite:///{tmp}/warm-up.db"
        migrate(warm)
        t0 = time.perf_counter()
        run_audit(warm, broker.bootstrap, "bench-audit", spark=spark,
                  max_offsets_per_trigger=1000, stop_after=lambda w: w.rows > 0,
                  mode="follow", interval="100 milliseconds")
        figures.spark_warmup_s = time.perf_counter() - t0
        dbs = {"sqlite": lambda name: f"sqlite:///{tmp}/{name}.db",
               "postgresql": lambda name: pg.create_database(name)}
        for db, make in dbs.items():
            for engine in ("plain", "spark"):
                url = make(f"{engine}_{db}")
                migrate(url)
                progress(f"{events:,} events into {db} with {engine}")
                t0 = time.perf_counter()
                if engine == "spark":
                    run = run_audit(url, broker.bootstrap, "bench-audit", spark=spark,
                                    max_offsets_per_trigger=50_000)
                    written = run.records
                else:
                    writer = AuditWriter(url, "bench-audit")
                    writer.catch_up(broker.bootstrap)
                    written = run_plain(writer, broker.bootstrap)
                    writer.close()
                elapsed = time.perf_counter() - t0
                if written != events:
                    raise RuntimeError(f"{engine} into {db} wrote {written} of {events} records")
                figures.throughput[(engine, db)] = events / elapsed
        for engine in ("plain", "spark"):
            topic = f"bench-fresh-{engine}"
            url = pg.create_database(f"fresh_{engine}")
            migrate(url)
            ensure_topic(broker.bootstrap, topic, TopicConfig())
            progress(f"freshness at {rate}/s for {seconds:g} s into postgresql with {engine}")
            seen: dict[int, float] = {}
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(url, topic, seen, stop))
            if engine == "spark":
                runner = threading.Thread(target=run_audit, args=(url, broker.bootstrap, topic),
                                          kwargs=dict(spark=spark, mode="follow",
                                                      interval="250 milliseconds",
                                                      stop_event=stop))
            else:
                writer = AuditWriter(url, topic)
                runner = threading.Thread(target=follow_plain,
                                          args=(writer, broker.bootstrap, stop))
            watcher.start()
            runner.start()
            time.sleep(8 if engine == "spark" else 1)  # the query's first batch, warm-up
            sent = _steady_elsewhere(broker.bootstrap, topic, rate, seconds)
            time.sleep(3)
            stop.set()
            runner.join(60)
            watcher.join(10)
            if engine == "plain":
                writer.close()
            figures.freshness[engine] = _freshness(sent, seen)
        spark.stop()
    return figures


def format_audit(f: AuditFigures) -> str:
    """The figures as a plain-text table with the targets."""
    rows: list[tuple[str, str, str]] = []
    for (engine, db), per_s in sorted(f.throughput.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        target = ">= 20,000/s" if (engine, db) == ("spark", "postgresql") else ""
        rows.append((f"{f.events:,} events into {db}, {engine}", f"{per_s:,.0f} events/s",
                     target))
    for engine, (p50, p95, n) in f.freshness.items():
        rows.append((f"freshness at {f.rate:,}/s, {engine}, p50 ({n:,} records)",
                     f"{p50 * 1000:,.0f} ms", ""))
        rows.append((f"freshness at {f.rate:,}/s, {engine}, p95", f"{p95 * 1000:,.0f} ms",
                     "< 2,000 ms" if engine == "spark" else ""))
    rows.append(("Spark session start (once per process, not in the above)",
                 f"{f.spark_start_s:.1f} s", ""))
    rows.append(("first streaming query of the JVM (warm-up, not in the above)",
                 f"{f.spark_warmup_s:.1f} s", ""))
    return figures_table(rows)
