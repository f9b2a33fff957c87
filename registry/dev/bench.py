"""Benchmarks that print figures (no test times anything).

``jobreg bench recovery``: failover time from ``claim_leadership`` to every
live job adopted (1,000 and 10,000 jobs), and client start-up from scratch
versus from a snapshot for a 100,000-event log.

``jobreg bench core``: on a fresh embedded broker,

1. fenced submit latency: ``Term.submit`` one at a time, each confirmed by the fold;
2. batched submit throughput: ``Term.submit_many`` in batches;
3. replay throughput: a fresh client folding the whole log from the broker, next to the raw
   limit measured in the same run on the same records (confluent-kafka consume + Avro decode,
   no fold).

``jobreg bench replay``: forensics on a 1,000,000-record log (two terms, submits,
adoptions, cancels, 1% refused late writes): ``state_at`` from the broker at the end and
at the middle, ``dump`` to an Avro file, and ``open_dump`` + ``state_at`` from that file.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from registry.client import Registry
from registry.dev.broker import EmbeddedBroker
from registry.fold import fold_batches
from registry.forensics import DumpSource
from registry.image import Image, LogRecord
from registry.log import LogReader
from registry.render import table
from registry.wire import default_codec

__all__ = ["CoreResult", "RecoveryFigures", "ReplayFigures", "bench_core", "bench_recovery",
           "bench_replay", "format_recovery", "format_replay", "format_table"]


@dataclass
class CoreResult:
    """Figures of one ``bench core`` run."""

    submits: int
    submit_p50_ms: float
    submit_p99_ms: float
    batch_jobs: int
    batch_size: int
    batch_jobs_per_s: float
    replay_records: int
    replay_per_s: float
    raw_per_s: float

    @property
    def replay_ratio(self) -> float:
        """Fold replay throughput as a fraction of the raw limit."""
        return self.replay_per_s / self.raw_per_s if self.raw_per_s else 0.0


def figures_table(rows: list[tuple[str, str, str]],
                  headers: tuple[str, str, str] = ("measure", "figure", "target")) -> str:
    """A benchmark's rows as a plain-text table: name, figure (right-aligned), note."""
    return table(headers, rows, right={1})


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _raw_pass(reg: Registry) -> tuple[int, float]:
    reader = LogReader(reg.bootstrap, reg.topic, reg.partition)
    decode = default_codec().decode
    n = 0
    start = time.perf_counter()
    for batch in reader.sync(600):
        for record in batch:
            if record.value is not None:
                decode(record.value)
            n += 1
    elapsed = time.perf_counter() - start
    reader.close()
    return n, elapsed


def _fold_pass(reg: Registry) -> tuple[int, float, Image]:
    reader = LogReader(reg.bootstrap, reg.topic, reg.partition)
    counted: list[int] = []

    def batches() -> Iterator[list[LogRecord]]:
        for batch in reader.sync(600):
            counted.append(len(batch))
            yield batch

    start = time.perf_counter()
    image = fold_batches(batches(), Image.empty(reg.namespace))
    elapsed = time.perf_counter() - start
    reader.close()
    return sum(counted), elapsed, image


def bench_core(*, submits: int = 1000, batch_jobs: int = 100_000, batch_size: int = 1000,
               graph_bytes: int = 200, rounds: int = 3,
               progress: Callable[[str], None] = lambda _: None) -> CoreResult:
    """Run the core benchmark on a fresh embedded broker and return its figures."""
    graph = b"g" * graph_bytes
    with EmbeddedBroker() as broker:
        reg = Registry.connect(broker.bootstrap, "bench")
        term = reg.claim_leadership("bench-leader")
        progress(f"fenced submits, one at a time ({submits})")
        for i in range(50):  # warm-up: connections, transaction coordinator
            term.submit(f"warm-{i}", graph)
        lat: list[float] = []
        for i in range(submits):
            t0 = time.perf_counter()
            term.submit(f"single-{i}", graph)
            lat.append((time.perf_counter() - t0) * 1000)
        progress(f"batched submits ({batch_jobs} in batches of {batch_size})")
        t0 = time.perf_counter()
        for start in range(0, batch_jobs, batch_size):
            term.submit_many([(f"batch-{j}", graph)
                              for j in range(start, min(batch_jobs, start + batch_size))])
        batch_s = time.perf_counter() - t0
        progress("replay vs raw consume+decode")
        raw_best = fold_best = float("inf")
        n_raw = n_fold = 0
        for _ in range(rounds):
            n_raw, s = _raw_pass(reg)
            raw_best = min(raw_best, s)
            n_fold, s, image = _fold_pass(reg)
            fold_best = min(fold_best, s)
        assert image.answer() == reg.sync().answer()  # the bench folded what the client sees
        reg.close()
    return CoreResult(
        submits=submits, submit_p50_ms=statistics.median(lat),
        submit_p99_ms=_percentile(lat, 0.99), batch_jobs=batch_jobs, batch_size=batch_size,
        batch_jobs_per_s=batch_jobs / batch_s, replay_records=n_fold,
        replay_per_s=n_fold / fold_best, raw_per_s=n_raw / raw_best)


def format_table(r: CoreResult) -> str:
    """The figures as a plain-text table with the targets."""
    rows = [
        ("fenced submit p50 (one at a time)", f"{r.submit_p50_ms:.2f} ms", ""),
        ("fenced submit p99 (one at a time)", f"{r.submit_p99_ms:.2f} ms", "< 10 ms"),
        (f"batched submit ({r.batch_size}/txn)", f"{r.batch_jobs_per_s:,.0f} jobs/s", ""),
        (f"fold replay from broker ({r.replay_records:,} records)",
         f"{r.replay_per_s:,.0f} rec/s", ""),
        ("raw limit: consume + decode", f"{r.raw_per_s:,.0f} rec/s", ""),
        ("replay / raw", f"{r.replay_ratio:.0%}", ">= 50%"),
    ]
    return figures_table(rows)


@dataclass
class RecoveryFigures:
    """Figures of ``bench recovery``: failover time per job count, start-up times."""

    failover: list[tuple[int, float, float]]  # (live jobs, claim s, claim -> all adopted s)
    log_events: int = 0
    start_scratch_s: float = 0.0
    start_snapshot_s: float = 0.0
    snapshot_tail: int = 0


def bench_recovery(*, job_counts: tuple[int, ...] = (1000, 10_000), log_events: int = 100_000,
                   tail: int = 1000, snapshot_dir: str | None = None,
                   progress: Callable[[str], None] = lambda _: None) -> RecoveryFigures:
    """Failover (claim -> every live job adopted) and client start-up, on a fresh embedded broker."""
    import tempfile

    from registry.snapshot import write_snapshot

    figures = RecoveryFigures(failover=[])
    graph = b"g" * 200
    with EmbeddedBroker() as broker:
        for n in job_counts:
            progress(f"{n} live jobs: submit, then fail over")
            ns = f"recovery-{n}"
            old = Registry.connect(broker.bootstrap, ns)
            term = old.claim_leadership("old-leader")
            for start in range(0, n, 1000):
                term.submit_many([(f"job-{j}", graph) for j in range(start, min(n, start + 1000))])
            new = Registry.connect(broker.bootstrap, ns)
            t0 = time.perf_counter()
            successor = new.claim_leadership("new-leader")
            t1 = time.perf_counter()
            results = successor.recover()
            t2 = time.perf_counter()
            assert len(results) == n and all(r.ok for r in results)
            figures.failover.append((n, t1 - t0, t2 - t0))
            old.close()
            new.close()
        progress(f"a log of {log_events} events; start-up from scratch and from a snapshot")
        ns = "startup"
        reg = Registry.connect(broker.bootstrap, ns)
        term = reg.claim_leadership("leader")
        body = log_events - tail
        for start in range(0, body, 1000):
            term.submit_many([(f"job-{j}", graph) for j in range(start, min(body, start + 1000))])
        with tempfile.TemporaryDirectory(dir=snapshot_dir) as tmp:
            path = write_snapshot(f"{tmp}/startup.snapshot", reg.sync(), topic=reg.topic,
                                  partition=reg.partition)
            for start in range(body, log_events, 1000):
                term.submit_many([(f"job-{j}", graph)
                                  for j in range(start, min(log_events, start + 1000))])
            figures.log_events = reg.sync().provenance.last_offset + 1
            figures.snapshot_tail = tail
            t0 = time.perf_counter()
            scratch = Registry.connect(broker.bootstrap, ns)
            figures.start_scratch_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            warm = Registry.connect(broker.bootstrap, ns, snapshot=path)
            figures.start_snapshot_s = time.perf_counter() - t0
            assert warm.image == scratch.image  # fold(snapshot, tail) == fold(all)
            for r in (scratch, warm, reg):
                r.close()
    return figures


def format_recovery(f: RecoveryFigures) -> str:
    """The recovery figures as a plain-text table with the target."""
    rows: list[tuple[str, str, str]] = []
    for n, claim, total in f.failover:
        rows.append((f"failover, {n:,} live jobs: claim", f"{claim:.3f} s", ""))
        rows.append((f"failover, {n:,} live jobs: claim -> all adopted", f"{total:.3f} s",
                     "< 2 s" if n == 10_000 else ""))
    if f.log_events:
        rows.append((f"start-up from scratch ({f.log_events:,} offsets)",
                     f"{f.start_scratch_s:.3f} s", ""))
        rows.append((f"start-up from a snapshot (+{f.snapshot_tail:,} tail)",
                     f"{f.start_snapshot_s:.3f} s", ""))
    return figures_table(rows)


@dataclass
class ReplayFigures:
    """Figures of ``bench replay`` on one log: seconds for each read, and the dump's size."""

    records: int
    produce_s: float
    state_at_end_s: float
    state_at_middle_s: float
    dump_s: float
    dump_bytes: int
    open_dump_state_s: float
    peak_rss_mib: float
    accepted: int
    rejected: int


def produce_all(producer: Any, topic: str, partition: int,
                records: Iterable[tuple[str, bytes]],
                every_100k: Callable[[int], object] | None = None) -> None:
    """Queue every ``(key, value)`` on ``partition``, waiting while librdkafka's queue is
    full; ``every_100k(n)`` is called after each 100,000th record (the caller flushes)."""
    for n, (key, value) in enumerate(records, 1):
        while True:
            try:
                producer.produce(topic, value, key, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 100_000 == 0:
            producer.poll(0)
            if every_100k is not None:
                every_100k(n)


def _replay_log(records: int, namespace: str = "replay") -> Iterator[tuple[str, bytes]]:
    """A realistic registry history of ``records`` records of ``namespace``: two terms,
    submits, a failover with adoptions, cancels, and 1% late writes of the old term
    (refused)."""
    from registry.events import (
        InlineGraph,
        JobAdopted,
        JobCancelled,
        JobLockReleased,
        JobSubmitted,
        LeadershipGranted,
        new_event_id,
    )
    from registry.keys import record_key
    from registry.wire import encode

    ns, graph = namespace, InlineGraph(b"g" * 200)
    body = records - 2
    submits, adopts = body // 2, body * 2 // 5
    late = body // 100
    cancels = body - submits - adopts - late

    def event(cls: Any, epoch: int, writer: str, **kw: Any) -> tuple[str, bytes]:
        e = cls(event_id=new_event_id(), namespace=ns, epoch=epoch, writer=writer,
                created_at=0, **kw)
        return record_key(e), encode(e)

    yield event(LeadershipGranted, 1, "jm-1", prev_epoch=0)
    for i in range(submits):
        yield event(JobSubmitted, 1, "jm-1", job_id=f"job-{i}", graph=graph)
    yield event(LeadershipGranted, 2, "jm-2", prev_epoch=1)
    for i in range(adopts):
        yield event(JobAdopted, 2, "jm-2", job_id=f"job-{i}")
        if i < late:
            yield event(JobLockReleased, 1, "jm-1", job_id=f"job-{i}")  # refused: stale
    for i in range(cancels):
        yield event(JobCancelled, 2, "jm-2", job_id=f"job-{adopts + i}", reason="bench")


def bench_replay(*, records: int = 1_000_000, work_dir: str | None = None,
                 progress: Callable[[str], None] = lambda _: None) -> ReplayFigures:
    """``state_at`` and ``dump``/``open_dump`` throughput on a log of ``records`` records,
    on a fresh embedded broker."""
    import os
    import resource
    import tempfile

    from confluent_kafka import Producer

    from registry.forensics import BrokerSource, Forensics
    from registry.keys import partition_for
    from registry.log import TopicConfig, ensure_topic

    topic = "jobreg-bench-replay"
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        info = ensure_topic(broker.bootstrap, topic, TopicConfig())
        partition = partition_for("replay", info.partitions)
        progress(f"producing {records:,} records")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                             "linger.ms": 20, "batch.num.messages": 10_000,
                             "queue.buffering.max.messages": 500_000,
                             "queue.buffering.max.kbytes": 1_048_576})
        t0 = time.perf_counter()
        produce_all(producer, topic, partition, _replay_log(records),
                    lambda n: progress(f"  {n:,} produced"))
        left = producer.flush(120)
        produce_s = time.perf_counter() - t0
        del producer  # leave the broker before it stops
        if left:
            raise RuntimeError("the embedded broker did not take every benchmark record")

        f = Forensics(BrokerSource(broker.bootstrap, topic, partition, timeout=60), "replay")
        progress("state_at(end) from the broker")
        t0 = time.perf_counter()
        end_image = f.state_at(offset=records + 10)
        state_end = time.perf_counter() - t0
        last = end_image.provenance.last_offset
        progress("state_at(middle) from the broker")
        t0 = time.perf_counter()
        f.state_at(offset=last // 2)
        state_middle = time.perf_counter() - t0
        progress("dump")
        path = os.path.join(tmp, "replay.jobreg.avro")
        t0 = time.perf_counter()
        dumped = f.dump(path, topic=topic)
        dump_s = time.perf_counter() - t0
        progress("open_dump + state_at(end)")
        t0 = time.perf_counter()
        offline = Forensics(DumpSource(path), "replay").state_at(offset=last)
        open_dump_s = time.perf_counter() - t0
        if offline != end_image or dumped != records:
            raise RuntimeError("the dump did not replay to the broker's image")
        return ReplayFigures(
            records=dumped, produce_s=produce_s, state_at_end_s=state_end,
            state_at_middle_s=state_middle, dump_s=dump_s, dump_bytes=os.path.getsize(path),
            open_dump_state_s=open_dump_s,
            peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            accepted=sum(1 for _ in end_image.jobs), rejected=len(end_image.rejected))


def format_replay(f: ReplayFigures) -> str:
    """The replay figures as a plain-text table."""
    n = f.records
    rows = [
        (f"log built (produce {n:,} records)", f"{f.produce_s:.1f} s",
         f"{n / f.produce_s:,.0f} rec/s"),
        ("state_at(end) from the broker", f"{f.state_at_end_s:.1f} s",
         f"{n / f.state_at_end_s:,.0f} rec/s"),
        ("state_at(middle) from the broker", f"{f.state_at_middle_s:.1f} s",
         f"{n / 2 / f.state_at_middle_s:,.0f} rec/s"),
        ("dump to an Avro file", f"{f.dump_s:.1f} s", f"{n / f.dump_s:,.0f} rec/s"),
        ("dump file size", f"{f.dump_bytes / 2**20:.1f} MiB",
         f"{f.dump_bytes / n:.0f} B/rec"),
        ("open_dump + state_at(end)", f"{f.open_dump_state_s:.1f} s",
         f"{n / f.open_dump_state_s:,.0f} rec/s"),
        ("peak RSS of this process", f"{f.peak_rss_mib:,.0f} MiB", ""),
        ("jobs / refused records in the final image", f"{f.accepted:,} / {f.rejected:,}", ""),
    ]
    return figures_table(rows, ("measure", "time", "throughput"))
