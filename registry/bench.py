"""Benchmarks that print figures (no test times anything).

``jobreg bench core``: on a fresh embedded broker,

1. fenced submit latency: ``Term.submit`` one at a time, each confirmed by the fold;
2. batched submit throughput: ``Term.submit_many`` in batches;
3. replay throughput: a fresh client folding the whole log from the broker, next to the raw
   limit measured in the same run on the same records (confluent-kafka consume + Avro decode,
   no fold).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from .broker import EmbeddedBroker
from .client import Registry
from .codec import default_codec
from .fold import fold_batches
from .image import Image
from .log import LogReader

__all__ = ["CoreResult", "bench_core", "format_table"]


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

    def batches():
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
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines = [f"{'measure':<{w0}}  {'figure':>{w1}}  target", "-" * (w0 + w1 + 10)]
    lines += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    return "\n".join(lines)
