"""``jobreg bench soak``: does the registry hold up at size? (issue 11)

One leader writes ``writes`` fenced calls on one namespace of a fresh topic, one at a time,
or from ``writers`` threads at once on its one ``Term`` (``--writers N``: concurrent calls,
which group commit shares round trips between), keeping about ``jobs`` live jobs, in a Flink-like mix (:data:`MIX`): checkpoints triggered,
completed and failed; jobs cancelled, their results marked clean (their cleanup done), and
new ones submitted (the churn keeps the live count);
live jobs adopted again. Every ``window`` writes it records the window's rate (successful
writes per second of the window's time, failed calls' time included), the p50/p99
latency of its successful writes (each call's own time, from its start to its return:
with several writers, the time a call waits for the others is in it), its failures, this process's (the client's) resident set
size and the size of the client's image. At the end it writes a snapshot and times a fresh
client's start-up from scratch and from that snapshot.

**Image size.** Measured deterministically as the length of the snapshot body before
compression: ``gzip.decompress(registry.snapshot.encode_image(image))``, i.e. the image's
column-wise JSON plus its raw inline graphs (each job carries a 200-byte inline graph). The
gzip'd length (what a snapshot file holds) is reported next to it. Divided by the number of
live jobs, it is the figure the target "at most 1 KiB per live job" is read against; it also
counts what the image keeps for ever (terminal job ids) and the duplicate window's ids
(fold rule 1: the write rate times one to two minutes). ``jobreg bench image`` measures the
same figure after a million records, without a broker.

**Failures never end the run by themselves.** A write that raises (``OutcomeUnknown``,
``BrokerError``, a refusal, anything) is counted by kind and the run goes on with the next
write, except that it stops early, and says why, when

* ``MAX_CONSECUTIVE_FAILURES`` writes in a row failed;
* fewer than ``STALL_RATE`` writes/s succeeded over the last ``STALL_SECONDS`` seconds;
* ``STALL_WINDOWS`` windows in a row ran under ``STALL_RATE`` writes/s;
* the term was fenced (another writer claimed the namespace: every later write would fail).

Targets (printed next to the figures): the last window's rate at least 2/3 of the first's,
no write failing, over 100,000 writes; the image at most 1 KiB per live job.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import os
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from registry.errors import Fenced

if TYPE_CHECKING:
    from registry.client import Registry, Term
    from registry.dev.brokers import BrokerChoice
    from registry.events import CheckpointEvent, Event
    from registry.image import Image, JobView

__all__ = ["MIX", "ImageFigures", "SoakFigures", "SoakWindow", "bench_image", "bench_soak",
           "format_image", "format_soak"]

NAMESPACE = "soak"
GRAPH_BYTES = 200
TARGET_WRITES = 100_000
TARGET_RATE_RATIO = 2 / 3
TARGET_IMAGE_PER_JOB = 1024
MAX_CONSECUTIVE_FAILURES = 20
STALL_RATE = 1.0  # writes/s
STALL_SECONDS = 60.0
STALL_WINDOWS = 3
HEARTBEAT_SECONDS = 30.0

#: The write mix, in percent. ``churn`` marks the result of the job it cancelled last clean
#: (as a coordinator does once its cleanup is done), else cancels a random live job when the
#: namespace holds ``jobs`` live jobs or more, and submits a new one otherwise (so about a
#: third each).
#: A trigger picks a job with no checkpoint in flight; completions and failures end one.
MIX: tuple[tuple[str, int], ...] = (
    ("trigger", 42),
    ("complete", 34),
    ("fail", 6),
    ("churn", 12),
    ("adopt", 6),
)


@dataclass
class SoakWindow:
    """One window of writes."""

    index: int
    first: int  # number of its first write, from 1
    writes: int  # calls made (failed ones included)
    failures: int
    seconds: float
    p50_ms: float | None  # of its successful writes
    p99_ms: float | None
    rss_mib: float
    image_bytes: int | None  # uncompressed snapshot body; None if it could not be encoded
    image_gzip_bytes: int | None
    live_jobs: int

    @property
    def rate(self) -> float:
        """Successful writes per second (a failed call's time counts, the call does not)."""
        return (self.writes - self.failures) / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_live_job(self) -> float | None:
        if self.image_bytes is None or not self.live_jobs:
            return None
        return self.image_bytes / self.live_jobs


@dataclass
class SoakFigures:
    """What ``bench soak`` measured."""

    writes_asked: int
    window: int
    writers: int
    jobs: int
    seed: int
    bootstrap: str
    embedded: bool
    topic: str
    broker: str = ""  # the broker this run started (BrokerChoice.describe); "" on --bootstrap
    setup_s: float = 0.0
    windows: list[SoakWindow] = field(default_factory=list)
    ops: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    first_failures: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the run stopped early
    log_offsets: int | None = None
    start_scratch_s: float | None = None
    start_scratch_error: str | None = None
    start_snapshot_s: float | None = None
    start_snapshot_error: str | None = None
    started_from: str | None = None
    snapshot_agrees: bool | None = None

    @property
    def writes_done(self) -> int:
        return sum(w.writes for w in self.windows)

    @property
    def failed(self) -> int:
        return sum(w.failures for w in self.windows)


class _Bag:
    """A set with O(1) add, remove and uniform random choice."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.where: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: str) -> None:
        self.where[item] = len(self.items)
        self.items.append(item)

    def discard(self, item: str) -> None:
        i = self.where.pop(item, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.where[last] = i

    def choice(self, rng: random.Random) -> str:
        return self.items[rng.randrange(len(self.items))]


class _Workload:
    """The writer's own model of its jobs: which are idle, which have a checkpoint in flight.

    After a failed write whose outcome is unknown it never touches what that write may
    have changed in a way the fold would refuse (a possibly cancelled job is dropped; a
    checkpoint id is never reused).

    Safe for several writer threads: :meth:`pick` and :meth:`run` are called under
    :attr:`lock`, and a job a call is about is out of both bags until the call returns (a
    checkpoint record carries the job's state after it, computed from the writer's view:
    two calls on one job at once would have the second refused, as a Flink coordinator never
    does).
    """

    def __init__(self, term: Term, jobs: int, rng: random.Random) -> None:
        self.term = term
        self.target = jobs
        self.rng = rng
        self.idle = _Bag()
        self.pending = _Bag()
        self.in_flight: dict[str, int] = {}  # job -> checkpoint id triggered
        self.next_cp: dict[str, int] = {}
        self.dirty: list[str] = []  # cancelled jobs whose results are not yet clean
        self.submitted = 0
        self.graph = b"g" * GRAPH_BYTES
        kinds, weights = zip(*MIX, strict=True)
        self.kinds, self.cum = kinds, list(_accumulate(weights))
        self.lock = threading.Lock()

    def new_id(self) -> str:
        self.submitted += 1
        return f"job-{self.submitted}"

    def fill(self, batch: int = 500) -> None:
        """Submit the live jobs the run starts with (``submit_many``, not timed)."""
        while len(self.idle) < self.target:
            ids = [self.new_id() for _ in range(min(batch, self.target - len(self.idle)))]
            self.term.submit_many([(j, self.graph) for j in ids], max_checkpoint_failures=3)
            for j in ids:
                self.idle.add(j)
                self.next_cp[j] = 1

    def pick(self) -> str:
        kind: str = self.rng.choices(self.kinds, cum_weights=self.cum)[0]
        live = len(self.idle) + len(self.pending)
        if kind == "churn":
            return "clean" if self.dirty else "cancel" if live >= self.target else "submit"
        if kind in ("complete", "fail") and not self.pending:
            kind = "trigger"
        if kind == "trigger" and not self.idle:
            kind = "complete" if self.pending else "submit"
        if kind == "adopt" and not live:
            kind = "submit"
        return kind

    def _any_live(self) -> str:
        n = self.rng.randrange(len(self.idle) + len(self.pending))
        return self.idle.items[n] if n < len(self.idle) else self.pending.items[n - len(self.idle)]

    def run(self, kind: str) -> Callable[[], object]:
        """The write of ``kind`` as a call, and the model's update when it succeeds or fails
        (the call takes :attr:`lock` for it)."""
        term, rng = self.term, self.rng
        if kind == "submit":
            job = self.new_id()

            def call() -> None:
                term.submit(job, self.graph, max_checkpoint_failures=3)
                with self.lock:
                    self.idle.add(job)
                    self.next_cp[job] = 1
            return call
        if kind == "cancel":
            job = self._any_live()
            # Whatever happens, the job leaves the model: a cancel of unknown outcome may
            # have made it terminal, and a write to a terminal job is refused.
            self.idle.discard(job)
            self.pending.discard(job)
            self.in_flight.pop(job, None)
            self.next_cp.pop(job, None)

            def cancel() -> None:
                term.cancel(job, reason="soak")
                with self.lock:
                    self.dirty.append(job)
            return cancel
        if kind == "clean":
            job = self.dirty.pop()  # done or in doubt, not tried again
            return lambda: term.mark_clean(job)
        if kind == "adopt":
            job = self._any_live()
            bag = self.idle if job in self.idle.where else self.pending
            bag.discard(job)  # out of the bags while the call is in flight

            def adopt() -> None:
                try:
                    term.adopt(job)
                finally:
                    with self.lock:
                        bag.add(job)
            return adopt
        if kind == "trigger":
            job = self.idle.choice(rng)
            cp = self.next_cp[job]
            self.next_cp[job] = cp + 1  # never reused, whatever the outcome
            self.idle.discard(job)

            def call() -> None:
                done = False
                try:
                    term.checkpoint_triggered(job, cp)
                    done = True
                finally:
                    with self.lock:
                        if done:
                            self.pending.add(job)
                            self.in_flight[job] = cp
                        else:
                            self.idle.add(job)
            return call
        job = self.pending.choice(rng)
        cp = self.in_flight.pop(job)
        # Done or in doubt, the checkpoint is no longer in flight for the model; the job is
        # idle again once the call returns.
        self.pending.discard(job)

        def end() -> None:
            try:
                if kind == "complete":
                    term.checkpoint_completed(job, cp,
                                              f"file:///soak/checkpoints/{job}/chk-{cp}")
                else:
                    term.checkpoint_failed(job, cp, "declined by a task", task="task-3")
            finally:
                with self.lock:
                    self.idle.add(job)
        return end


def _accumulate(weights: tuple[int, ...]) -> list[int]:
    out, total = [], 0
    for w in weights:
        total += w
        out.append(total)
    return out


def _rss_mib() -> float:
    """This process's resident set size now (``/proc/self/statm``), else its peak."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _image_size(image: Image) -> tuple[int | None, int | None]:
    """(uncompressed, gzip'd) length of the snapshot body of ``image``."""
    from registry.snapshot import encode_image

    try:
        body = encode_image(image)
    except Exception:  # the figure is missing, the run goes on
        return None, None
    return len(gzip.decompress(body)), len(body)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _describe(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:300]


def bench_soak(*, writes: int = TARGET_WRITES, window: int = 10_000, jobs: int = 1000,
               seed: int = 1, bootstrap: str | None = None, timeout: float = 10.0,
               work_dir: str | None = None, writers: int = 1,
               broker: BrokerChoice | None = None,
               progress: Callable[[str], None] = lambda _: None) -> SoakFigures:
    """Run the soak on ``bootstrap``, or when ``None`` on a broker started for the run
    (``broker``: the embedded one by default, or Apache Kafka), with ``writers`` threads
    calling the one ``Term`` at once.

    The run uses a fresh topic ``jobreg-soak-<random>``; on a broker of one's own its
    deletion is asked for at the end. Raises only if the run cannot start (no broker, the
    claim or the initial submits fail); every later failure is counted in the figures.
    """
    import tempfile

    from registry.client import Registry
    from registry.dev.brokers import BrokerChoice, start_broker
    from registry.log import TopicConfig

    rng = random.Random(seed)
    topic = f"jobreg-soak-{uuid.uuid4().hex[:10]}"
    with contextlib.ExitStack() as stack:
        choice = broker or BrokerChoice.embedded()
        started = ""
        topic_config = TopicConfig()
        if bootstrap is None:
            running = stack.enter_context(start_broker(choice, progress=progress))
            bootstrap, started, topic_config = (running.bootstrap, choice.describe(),
                                                running.topic_config())
        else:
            stack.callback(_delete_topic, bootstrap, topic)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(dir=work_dir))
        figures = SoakFigures(writes_asked=writes, window=window, writers=writers, jobs=jobs,
                              seed=seed, bootstrap=bootstrap,
                              embedded=bool(started) and not choice.is_kafka, topic=topic,
                              broker=started)
        reg = Registry.connect(bootstrap, NAMESPACE, topic=topic, timeout=timeout,
                               topic_config=topic_config, blob_store=os.path.join(tmp, "blobs"))
        stack.callback(reg.close)
        term = reg.claim_leadership("soak-leader")
        work = _Workload(term, jobs, rng)
        progress(f"topic {topic} on {bootstrap}: submitting {jobs:,} live jobs")
        t0 = time.perf_counter()
        work.fill()
        figures.setup_s = time.perf_counter() - t0
        progress(f"{writes:,} fenced writes in windows of {window:,}, "
                 f"{writers} writer thread(s)")
        _soak(figures, reg, work, progress)
        _startup(figures, reg, bootstrap, topic, timeout, tmp, progress)
    return figures


class _Window:
    """One window's calls as the writer threads make them (everything under :attr:`lock`)."""

    def __init__(self, size: int, first: int) -> None:
        self.lock = threading.Lock()
        self.size = size
        self.first = first  # number of the window's first write, from 1
        self.taken = 0  # calls begun
        self.made = 0  # calls returned (or raised)
        self.lat: list[float] = []
        self.failures = 0
        self.start = self.last_beat = time.perf_counter()


class _Soak:
    """What the writer threads share across windows: the figures, the stop conditions."""

    def __init__(self, figures: SoakFigures, work: _Workload,
                 progress: Callable[[str], None]) -> None:
        self.figures = figures
        self.work = work
        self.progress = progress
        self.successes: collections.deque[float] = collections.deque()  # completion times,
        self.consecutive = 0                                              # last minute
        self.run_start = time.perf_counter()

    def writer(self, w: _Window) -> None:
        """Make calls of window ``w`` until its calls are all begun or the run stops."""
        figures, work = self.figures, self.work
        while True:
            with w.lock:
                if w.taken >= w.size or figures.stopped is not None:
                    return
                w.taken += 1
                number = w.first + w.taken - 1
                with work.lock:
                    kind = work.pick()
                    call = work.run(kind)
            t0 = time.perf_counter()
            try:
                call()
            except Exception as e:  # every failure is counted; none ends the run by itself
                now = time.perf_counter()
                with w.lock:
                    self._failed(w, e, kind, number, now - t0)
            else:
                now = time.perf_counter()
                with w.lock:
                    w.lat.append((now - t0) * 1000)
                    self.consecutive = 0
                    self.successes.append(now)
                    figures.ops[kind] += 1
            with w.lock:
                w.made += 1
                self._watch(w, now)

    def _failed(self, w: _Window, e: Exception, kind: str, number: int, took: float) -> None:
        figures = self.figures
        w.failures += 1
        self.consecutive += 1
        figures.failures[type(e).__name__] += 1
        if len(figures.first_failures) < 5:
            figures.first_failures.append(f"write {number:,} ({kind}), after {took:.1f} s: "
                                          f"{_describe(e)}")
        if figures.stopped is not None:
            return
        if isinstance(e, Fenced):
            figures.stopped = f"the term was fenced at write {number:,}: {e}"
        elif self.consecutive >= MAX_CONSECUTIVE_FAILURES:
            figures.stopped = (f"{self.consecutive} writes in a row failed (last: "
                               f"{_describe(e)})")

    def _watch(self, w: _Window, now: float) -> None:
        figures, successes = self.figures, self.successes
        while successes and successes[0] < now - STALL_SECONDS:
            successes.popleft()
        if (figures.stopped is None and now - self.run_start >= STALL_SECONDS
                and len(successes) < STALL_RATE * STALL_SECONDS):
            figures.stopped = (f"fewer than {STALL_RATE:g} write/s succeeded over the "
                               f"last {STALL_SECONDS:.0f} s ({len(successes)} writes)")
        if now - w.last_beat >= HEARTBEAT_SECONDS:
            w.last_beat = now
            self.progress(f"  window {len(figures.windows) + 1}: {w.made:,}/{w.size:,} writes, "
                          f"{len(w.lat) / (now - w.start):,.1f} ok/s so far, "
                          f"{w.failures} failed")


def _soak(figures: SoakFigures, reg: Registry, work: _Workload,
          progress: Callable[[str], None]) -> None:
    """The timed writes, window by window; each window's calls come from ``figures.writers``
    threads at once (the calling thread itself when there is one), and the window ends once
    every call of it has returned."""
    writes, window = figures.writes_asked, figures.window
    soak = _Soak(figures, work, progress)
    slow_windows = 0
    done = 0
    while done < writes and figures.stopped is None:
        size = min(window, writes - done)
        w = _Window(size, done + 1)
        if figures.writers == 1:
            soak.writer(w)
        else:
            threads = [threading.Thread(target=soak.writer, args=(w,), daemon=True,
                                        name=f"soak-writer-{k + 1}")
                       for k in range(figures.writers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        seconds = time.perf_counter() - w.start
        n, lat, failures = w.made, w.lat, w.failures
        image = reg.image
        image_bytes, image_gzip = _image_size(image)
        win = SoakWindow(
            index=len(figures.windows) + 1, first=done + 1, writes=n, failures=failures,
            seconds=seconds, p50_ms=statistics.median(lat) if lat else None,
            p99_ms=_percentile(lat, 0.99) if lat else None, rss_mib=_rss_mib(),
            image_bytes=image_bytes, image_gzip_bytes=image_gzip,
            live_jobs=sum(1 for v in image.jobs.values() if v.live))
        figures.windows.append(win)
        done += n
        progress(_window_line(win, partial=n < size))
        slow_windows = slow_windows + 1 if win.rate < STALL_RATE else 0
        if figures.stopped is None and slow_windows >= STALL_WINDOWS and done < writes:
            figures.stopped = f"{slow_windows} windows in a row under {STALL_RATE:g} write/s"
    if figures.stopped:
        progress(f"stopped early after {done:,} writes: {figures.stopped}")


def _window_line(w: SoakWindow, *, partial: bool = False) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    per_job = w.bytes_per_live_job
    return (f"window {w.index}{' (partial)' if partial else ''}: writes "
            f"{w.first:,}-{w.first + w.writes - 1:,}: {w.rate:,.1f}/s, p50 {ms(w.p50_ms)} ms, "
            f"p99 {ms(w.p99_ms)} ms, {w.failures} failed, RSS {w.rss_mib:,.0f} MiB, image "
            f"{'-' if w.image_bytes is None else f'{w.image_bytes:,} B'}"
            f"{'' if per_job is None else f' ({per_job:,.0f} B per live job)'}")


def _startup(figures: SoakFigures, reg: Registry, bootstrap: str, topic: str,
             timeout: float, tmp: str, progress: Callable[[str], None]) -> None:
    from registry.client import Registry

    figures.log_offsets = reg.image.provenance.last_offset + 1
    path = os.path.join(tmp, "soak.snapshot")
    progress("snapshot, then a fresh client's start-up from scratch and from it")
    try:
        reg.write_snapshot(path)
        figures.log_offsets = reg.image.provenance.last_offset + 1
    except Exception as e:
        figures.start_snapshot_error = f"no snapshot: {_describe(e)}"
        path = ""
    scratch = warm = None
    try:
        t0 = time.perf_counter()
        scratch = Registry.connect(bootstrap, NAMESPACE, topic=topic, timeout=timeout,
                                   blob_store=os.path.join(tmp, "blobs"))
        figures.start_scratch_s = time.perf_counter() - t0
    except Exception as e:
        figures.start_scratch_error = _describe(e)
    if path:
        try:
            t0 = time.perf_counter()
            warm = Registry.connect(bootstrap, NAMESPACE, topic=topic, timeout=timeout,
                                    blob_store=os.path.join(tmp, "blobs"), snapshot=path)
            figures.start_snapshot_s = time.perf_counter() - t0
            figures.started_from = warm.started_from
        except Exception as e:
            figures.start_snapshot_error = _describe(e)
    if scratch is not None and warm is not None:
        figures.snapshot_agrees = scratch.image == warm.image
    for r in (scratch, warm):
        if r is not None:
            r.close()


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    with contextlib.suppress(Exception):  # else the topic stays; its name says what it is
        AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])[topic].result(10)


def format_soak(f: SoakFigures) -> str:
    """The soak's windows, then its figures next to the targets, as plain text."""
    from registry.dev.bench import figures_table
    from registry.render import table

    where = "an embedded broker" if f.embedded else (f.broker or f.bootstrap)
    who = "one call at a time" if f.writers == 1 else \
        f"{f.writers} writer threads at once on one Term"
    head = (f"soak: {f.writes_asked:,} fenced writes asked, {who}, one namespace "
            f"({NAMESPACE!r}) of topic {f.topic} on {where}; {f.jobs:,} live jobs kept ({GRAPH_BYTES} B inline "
            f"graphs, submitted in {f.setup_s:.1f} s beforehand); seed {f.seed}")

    def num(v: float | None, fmt: str) -> str | None:
        return None if v is None else format(v, fmt)

    windows = table(
        ["window", "writes", "writes/s", "p50 ms", "p99 ms", "failed", "RSS MiB", "image B",
         "image gz B", "live jobs", "B/live job"],
        ([w.index, f"{w.first:,}-{w.first + w.writes - 1:,}"
          + (" (partial)" if f.stopped and w is f.windows[-1] else ""), f"{w.rate:,.1f}",
          num(w.p50_ms, ".1f"), num(w.p99_ms, ".1f"), w.failures, f"{w.rss_mib:,.0f}",
          num(w.image_bytes, ",d"), num(w.image_gzip_bytes, ",d"), f"{w.live_jobs:,}",
          num(w.bytes_per_live_job, ",.0f")] for w in f.windows))

    def verdict(ok: bool | None, target: str) -> str:
        return f"{target}: {'met' if ok else 'NOT met' if ok is not None else 'not measured'}"

    done, failed = f.writes_done, f.failed
    first = f.windows[0] if f.windows else None
    last = f.windows[-1] if f.windows else None
    ratio = last.rate / first.rate if first and last and first.rate else None
    enough = done >= TARGET_WRITES and f.stopped is None
    rows = [
        ("writes done", f"{done:,} of {f.writes_asked:,}",
         verdict(enough, f">= {TARGET_WRITES:,} with none failing")
         + ("" if f.writes_asked >= TARGET_WRITES else f" (this run asked {f.writes_asked:,})")),
        ("failed writes", f"{failed:,}", verdict(failed == 0, "0")),
    ]
    if len(f.windows) > 1:
        rows.append(("last window's rate / first's", f"{ratio:.0%}" if ratio is not None else "-",
                     verdict(None if ratio is None else ratio >= TARGET_RATE_RATIO, ">= 67%")))
    per_job = last.bytes_per_live_job if last else None
    rows.append(("image per live job (uncompressed body)",
                 "-" if per_job is None else f"{per_job:,.0f} B",
                 verdict(None if per_job is None else per_job <= TARGET_IMAGE_PER_JOB,
                         "<= 1 KiB")))
    if last and last.image_gzip_bytes is not None and last.live_jobs:
        rows.append(("image per live job (gzip'd, as in a snapshot)",
                     f"{last.image_gzip_bytes / last.live_jobs:,.0f} B", ""))
    offsets = f"{f.log_offsets:,} offsets" if f.log_offsets is not None else "the log"
    rows.append((f"fresh client start-up from scratch ({offsets})",
                 "-" if f.start_scratch_s is None else f"{f.start_scratch_s:.2f} s",
                 f.start_scratch_error or ""))
    rows.append(("fresh client start-up from a snapshot at the end",
                 "-" if f.start_snapshot_s is None else f"{f.start_snapshot_s:.2f} s",
                 f.start_snapshot_error or (
                     "" if f.snapshot_agrees is None else
                     "same image as from scratch" if f.snapshot_agrees else
                     "DIFFERS from the image from scratch")
                 + ("" if not f.started_from or f.started_from.startswith("snapshot")
                    else f"; {f.started_from}")))
    lines = [head, "", windows, "", figures_table(rows)]
    if f.ops:
        lines += ["", "writes that succeeded, by kind: " + ", ".join(
            f"{k} {v:,}" for k, v in sorted(f.ops.items(), key=lambda kv: -kv[1]))]
    if f.failures:
        lines += ["failed writes, by error: " + ", ".join(
            f"{k} {v:,}" for k, v in f.failures.most_common())]
        lines += ["first failures:"] + [f"  {x}" for x in f.first_failures]
    if f.stopped:
        lines += [f"STOPPED EARLY after {done:,} of {f.writes_asked:,} writes: {f.stopped}"]
    return "\n".join(lines)


# -- the image at size, without a broker (``jobreg bench image``) ----------------------------


@dataclass
class ImageFigures:
    """The image after folding ``events`` synthetic records of the soak's mix."""

    events: int
    live_jobs: int
    terminal_jobs: int
    rate: int  # records per second of broker time
    fold_s: float
    image_bytes: int
    image_gzip_bytes: int
    recent_ids: int
    window_bytes: int  # what the duplicate window's ids add to the image
    terminal_bytes: int  # what the terminal jobs add

    @property
    def per_live_job(self) -> float:
        return self.image_bytes / max(1, self.live_jobs)


class _FoldingTerm:
    """What :class:`_Workload` drives, writing nothing: each call becomes the event a
    :class:`~registry.client.Term` would write, folded at once, stamped by a clock that
    advances ``1/rate`` s per record (so the duplicate window holds ``rate`` x 60 s of ids)."""

    def __init__(self, rate: int) -> None:
        from registry.events import LeadershipGranted, new_event_id
        from registry.fold import Delta
        from registry.image import Image
        from registry.wire import default_codec

        self.codec = default_codec()
        self.rate = rate
        self.offset = 0
        self.env: dict[str, Any] = dict(namespace=NAMESPACE, epoch=1, writer="soak",
                                        created_at=0)
        self.image = Image.empty(NAMESPACE)
        self.delta = Delta(self.image, self.codec)
        self._new_id = new_event_id
        self._write(LeadershipGranted(event_id=new_event_id(), prev_epoch=0, **self.env))

    def _write(self, event: Event) -> None:
        from registry.image import LogRecord
        from registry.keys import record_key

        stamp = 1_700_000_000_000 + self.offset * 1000 // self.rate
        d = self.delta.replay(LogRecord(self.offset, record_key(event).encode(),
                                        self.codec.encode(event), stamp))
        if not d.accepted:
            raise RuntimeError(f"the fold refused a soak record: {d.reason} {d.detail}")
        self.offset += 1
        if self.offset % 10_000 == 0:  # a batch, as a reader would fold
            self.image = self.delta.apply()
            from registry.fold import Delta
            self.delta = Delta(self.image, self.codec)

    def finish(self) -> Image:
        self.image = self.delta.apply()
        return self.image

    def _e(self) -> dict[str, Any]:
        return {**self.env, "event_id": self._new_id()}

    def _view(self, job: str) -> JobView:
        view = self.delta.job(job)
        if view is None:
            raise RuntimeError(f"the soak wrote to job {job!r}, which the fold does not know")
        return view

    def submit(self, job: str, graph: bytes, max_checkpoint_failures: int = 0) -> None:
        from registry.events import InlineGraph, JobSubmitted

        self._write(JobSubmitted(job_id=job, graph=InlineGraph(graph),
                                 max_checkpoint_failures=max_checkpoint_failures, **self._e()))

    def submit_many(self, jobs: list[tuple[str, bytes]], max_checkpoint_failures: int = 0) -> None:
        for job, graph in jobs:
            self.submit(job, graph, max_checkpoint_failures)

    def cancel(self, job: str, reason: str = "") -> None:
        from registry.events import JobCancelled

        view = self._view(job)
        self._write(JobCancelled(job_id=job, reason=reason, graph=view.graph,
                                 checkpoints=view.checkpoints, **self._e()))

    def mark_clean(self, job: str) -> None:
        from registry.events import JobCleanedUp

        view = self._view(job)
        self._write(JobCleanedUp(job_id=job, status=view.status, reason=view.reason,
                                 **self._e()))

    def adopt(self, job: str) -> None:
        from registry.events import JobAdopted

        self._write(JobAdopted(job_id=job, **self._e()))

    def _checkpoint(self, kind: type[CheckpointEvent], job: str, cp: int, **extra: Any) -> None:
        from registry.fold import checkpoint_step

        view = self._view(job)
        state, _ = checkpoint_step(view.checkpoints, kind, cp, location=extra.get("location", ""),
                                   retained=view.retained_checkpoints)
        self._write(kind(job_id=job, checkpoint_id=cp, state=state, **extra, **self._e()))

    def checkpoint_triggered(self, job: str, cp: int) -> None:
        from registry.events import CheckpointTriggered

        self._checkpoint(CheckpointTriggered, job, cp)

    def checkpoint_completed(self, job: str, cp: int, location: str) -> None:
        from registry.events import CheckpointCompleted

        self._checkpoint(CheckpointCompleted, job, cp, location=location)

    def checkpoint_failed(self, job: str, cp: int, reason: str, task: str | None = None) -> None:
        from registry.events import CheckpointFailed

        # A Term records its decision: UNSPECIFIED counts.
        self._checkpoint(CheckpointFailed, job, cp, reason=reason, task=task, reason_counts=True)


def bench_image(*, events: int = 1_000_000, jobs: int = 1000, rate: int = 200, seed: int = 1,
                progress: Callable[[str], None] | None = None) -> ImageFigures:
    """Fold ``events`` records of the soak's mix on ``jobs`` live jobs, ``rate`` records per
    second of broker time (1,000 jobs checkpointing every 10 s write about 200/s), and
    measure the image: is it bounded by live state?"""
    import dataclasses

    import immutables

    say = progress or (lambda msg: None)
    term = _FoldingTerm(rate)
    load = _Workload(term, jobs, random.Random(seed))  # type: ignore[arg-type]
    start = time.perf_counter()
    load.fill()
    while term.offset < events:
        load.run(load.pick())()
        if term.offset % 100_000 == 0:
            say(f"{term.offset:,} of {events:,} records folded")
    image = term.finish()
    fold_s = time.perf_counter() - start
    size, gz = _image_size(image)
    assert size is not None and gz is not None
    no_window = dataclasses.replace(image, recent_ids=immutables.Map())
    live = immutables.Map({k: v for k, v in image.jobs.items() if v.live})
    no_terminal = dataclasses.replace(no_window, jobs=live)
    without_window = _image_size(no_window)[0] or 0
    return ImageFigures(
        events=term.offset, live_jobs=len(live), terminal_jobs=len(image.jobs) - len(live),
        rate=rate, fold_s=fold_s, image_bytes=size, image_gzip_bytes=gz,
        recent_ids=sum(len(ids) for ids in image.recent_ids.values()),
        window_bytes=size - without_window,
        terminal_bytes=without_window - (_image_size(no_terminal)[0] or 0))


def format_image(f: ImageFigures) -> str:
    """The image figures next to the target, as plain text."""
    from registry.dev.bench import figures_table

    head = f"The image after {f.events:,} records ({f.rate}/s of broker time, no broker)"
    return head + "\n" + figures_table([
            ("records folded (generated, encoded and folded)",
             f"{f.events:,} in {f.fold_s:.1f} s ({f.events / f.fold_s:,.0f}/s)", ""),
            ("live / terminal jobs", f"{f.live_jobs:,} / {f.terminal_jobs:,}", ""),
            ("image (snapshot body, uncompressed / gzip'd)",
             f"{f.image_bytes:,} B / {f.image_gzip_bytes:,} B", ""),
            ("image per live job", f"{f.per_live_job:,.0f} B",
             f"<= {TARGET_IMAGE_PER_JOB:,} B: "
             + ("met" if f.per_live_job <= TARGET_IMAGE_PER_JOB else "missed")),
            ("of which the duplicate window", f"{f.recent_ids:,} ids, {f.window_bytes:,} B",
             "rate x 60-120 s: grows with the rate, not the log"),
            ("of which terminal job ids", f"{f.terminal_bytes:,} B",
             "one per job ever ended: the no-resurrection rule needs them"),
        ])
