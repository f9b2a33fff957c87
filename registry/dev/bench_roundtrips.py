"""``jobreg bench roundtrips``: what a write's round trips cost, and the alternatives (issues 27
and 35).

A jobreg write is today (issue 35) a produce of an idempotent acks=all producer, followed by a
confirmation that every read_committed reader can read it (``LeaderWriter``, then
``LogReader.take_own``); until issue 35 it was one Kafka transaction (v1: AddPartitionsToTxn,
Produce, EndTxn, in sequence) followed by a read_committed probe fetch. This benchmark times,
with raw confluent-kafka clients configured as :mod:`registry.log` configures them
(``_CLIENT_DEFAULTS``; ``LeaderWriter``'s, ``PlainWriter``'s and the former
``TransactionalWriter``'s producer settings; ``LogReader``'s consumers), a write of N records
(N = 1, 8, 64, 512; each a JobSubmitted with a 200-byte graph as the wire encodes it, ~290
bytes) to one partition, one write at a time:

a. ``txn``: ``begin_transaction``, produce N, ``commit_transaction`` (split: the produce calls,
   the commit, which sends everything);
b. ``txn+confirm`` (the write before issue 35): (a), then the confirmation: a read_committed
   consumer with a 1 ms fetch wait seeks to two offsets past the last record (where the
   partition ends once the commit marker follows it) and waits for an end of partition (or a
   record) past it;
c. ``idem+probe``: an idempotent producer (acks=all), no transaction: produce N and ``flush``,
   then the same probe as the only confirmation, at one offset past the last record (no
   marker);
d. ``idem``: (c) without the confirmation: the acknowledgement alone;
e. today's write, as ``LeaderWriter.start``/``wait`` and ``LogReader.take_own`` make it: the N
   records queued in one ``produce_batch`` call (``linger.ms`` 0, acks=all), acknowledged
   (polling for their delivery reports), then a read_committed ListOffsets
   (``get_watermark_offsets(cached=False)`` on a read_committed consumer assigned to the
   partition and paused, as a reader is between reads) whose last stable offset must lie past
   the last record; only when it does not, the probe fetch from the offset after the last
   record (1 ms fetch wait, within ``LogReader``'s probe patience), and if that does not show
   the end past it either, the records read back. The table counts the writes ListOffsets
   confirmed alone and the records read back. (The reader's precondition, that it had read
   the partition up to the write's first offset, holds here by construction: one writer per
   partition);
then variants, each next to the write it changes:

   * the confirmation: (b) and (c) confirmed by fetching the last record itself (``b1``,
     ``c1``: a fetch with records to return is answered at once, one at the end of the
     partition is held for the fetch wait); both on a long partition, one that already
     holds 5,000 batches (``b2``, ``b3``: the embedded broker lists a partition's batches on every fetch
     that returns records, which is why ``LogReader`` probes at the end; the read back there
     has a 20 ms fetch wait, since with 1 ms that broker never returns the records); ``c1`` with 5 ms
     idle between writes (``c2``: the probe's previous fetch is no longer in flight), and with
     ``linger.ms`` 1000 (``c3``). A probe that does not wait at all (``fetch.wait.max.ms`` 0)
     is no option here: the embedded broker then answers every fetch with nothing, from any
     offset;
   * today's confirmation: its ListOffsets asked by ``offsets_for_times`` with the latest
     offset (``e1``: one ListOffsets request, where ``get_watermark_offsets`` sends two, the
     low watermark's too; on a read_committed consumer both answer the last stable offset);
   * the transaction: the produce acknowledged before the commit (``a1``: the commit is
     EndTxn alone), Nagle's algorithm on (``a2``);
   * the idempotent producer: ``linger.ms`` 5 (librdkafka's default) and 1000 (``flush``
     sends at once whatever the linger, so a write's records leave in one request),
     ``batch.num.messages`` 16, Nagle's algorithm on (``d1`` to ``d4``).

Every (write, N) cell has a partition of its own on one fresh topic, and the cells take turns
in rounds, so that the embedded broker's costs that grow with a partition's length, or with
the transactional ids it has seen, fall on every cell alike and the ratios come from one run.

On the global ``--bootstrap``'s cluster instead, the topic is ``jobreg-roundtrips-<random>``
(``--replication`` replicas), and its deletion is asked at the end. With ``--kafka`` (one node)
or ``--kafka-nodes N``, on Apache Kafka started for the run (:mod:`registry.dev.kafka`), the
topic replicated on up to three nodes (three: ``min.insync.replicas`` 2, so a write waits for
a follower).

Then an instrumented pass (``debug=protocol,feature``: slower, so only its request counts,
versions and librdkafka's own round-trip times are kept) says which requests a write sends,
in which version, what the broker offers, and how long each took on the wire; and a last part
times a producer's start and ``init_transactions`` (a fresh id, and an id another producer
holds: a new term's fence).
"""

from __future__ import annotations

import contextlib
import logging
import re
import statistics
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from registry.errors import BrokerError
from registry.events import InlineGraph, JobSubmitted, new_event_id, now_ms
from registry.kafka_config import Kafka
from registry.log import (
    _CLIENT_DEFAULTS,
    _PROBE_S,
    TRANSACTION_TIMEOUT_MS,
    TopicConfig,
    ensure_topic,
)
from registry.render import table
from registry.wire import encode

__all__ = ["SIZES", "VARIANTS", "Cell", "InitFigures", "RequestFigures", "RoundtripFigures",
           "Variant", "bench_roundtrips", "format_roundtrips"]

SIZES = (1, 8, 64, 512)
WARM_UP = 20  # untimed writes per cell first (connections, producer ids, first batches)
_TIMEOUT = 30.0  # seconds: a write or confirmation that takes this long failed
_INSTRUMENTED_WRITES = 30
_INIT_ROUNDS = 10
_READER_WAIT_MS = 5  # LogReader's default fetch wait (its consumer is paused between reads)

_Progress = Callable[[str], None]


@dataclass(frozen=True)
class Variant:
    """One way to write: transactional or idempotent, confirmed by a read or not, and the
    producer settings changed from :mod:`registry.log`'s."""

    key: str
    label: str
    transactional: bool
    confirm: bool = False
    acked_first: bool = False  # txn: flush (every record acknowledged) before the commit
    settings: tuple[tuple[str, Any], ...] = ()
    compare: str = "b"  # the write its p50 is set against in the table
    read_back: bool = False  # confirm by fetching the last record, not the end after it
    long: bool = False  # on a partition that already holds many batches (``long_batches``)
    idle_ms: int = 0  # a pause between writes (not timed)
    fetch_wait_ms: int = 1  # the probe's fetch.wait.max.ms (LogReader's: 1)
    # LeaderWriter's write: the records queued in one produce_batch call, acknowledged by
    # polling for their reports (not flush), acks=all set as it sets it
    leader: bool = False
    # confirm as LogReader.take_own: a read_committed ListOffsets first, the probe fetch
    # only when its last stable offset is not past the write, then the read back
    list_offsets: bool = False
    # ... that ListOffsets asked by offsets_for_times(latest): one request, where
    # get_watermark_offsets sends two (the low watermark too)
    one_list_offsets: bool = False


LONG_BATCHES = 5000  # batches already on a long partition, by default
IDLE_MS = 5  # the pause between writes of the "idle" write
# The read back's fetch wait on the long partition: with 1 ms the embedded broker, which lists
# a partition's batches on every fetch that returns records (~1.2 ms per 1,000), answers with
# nothing for ever (DESIGN.md); LogReader lengthens a stalled read's wait from 20 ms.
LONG_WAIT_MS = 20

VARIANTS = (
    Variant("a", "txn v1: begin, produce N, commit", True, compare="e"),
    Variant("b", "txn v1 + read_committed confirm (before issue 35)", True, confirm=True,
            compare="e"),
    Variant("c", "idempotent acks=all + probe confirm", False, confirm=True, compare="e"),
    Variant("d", "idempotent acks=all, no confirm", False, compare="e"),
    Variant("e", "idempotent acks=all, batch + ListOffsets confirm (today)", False,
            confirm=True, leader=True, list_offsets=True, compare="b"),
    Variant("b1", "(b), confirm reads the last record back", True, confirm=True,
            read_back=True, compare="b"),
    Variant("b2", "(b), on a long partition", True, confirm=True, long=True, compare="b"),
    Variant("b3", f"(b1), on a long partition, fetch wait {LONG_WAIT_MS} ms", True,
            confirm=True, read_back=True, long=True, fetch_wait_ms=LONG_WAIT_MS,
            compare="b2"),
    Variant("e1", "(e), ListOffsets by offsets_for_times", False, confirm=True, leader=True,
            list_offsets=True, one_list_offsets=True, compare="e"),
    Variant("c1", "(c), confirm reads the last record back", False, confirm=True,
            read_back=True, compare="c"),
    Variant("c2", f"(c1), {IDLE_MS} ms idle between writes", False, confirm=True,
            read_back=True, idle_ms=IDLE_MS, compare="c1"),
    Variant("c3", "(c1), linger.ms 1000", False, confirm=True, read_back=True,
            settings=(("linger.ms", 1000),), compare="c1"),
    Variant("a1", "(a), produce acked before commit", True, acked_first=True, compare="a"),
    Variant("a2", "(a), Nagle on", True, settings=(("socket.nagle.disable", False),),
            compare="a"),
    Variant("d1", "(d), linger.ms 5", False, settings=(("linger.ms", 5),), compare="d"),
    Variant("d2", "(d), linger.ms 1000 (flush sends)", False, settings=(("linger.ms", 1000),),
            compare="d"),
    Variant("d3", "(d), batch.num.messages 16", False, settings=(("batch.num.messages", 16),),
            compare="d"),
    Variant("d4", "(d), Nagle on", False, settings=(("socket.nagle.disable", False),),
            compare="d"),
)
_BY_KEY = {v.key: v for v in VARIANTS}


@dataclass
class Cell:
    """One write at one size: each write's latency and its steps (ms)."""

    variant: Variant
    size: int
    partition: int
    latencies: list[float] = field(default_factory=list)
    steps: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    late_confirms: int = 0  # confirmations that an earlier fetch answer did not give
    probed: int = 0  # ListOffsets confirmations whose answer did not show it (probe fetch)
    read_back: int = 0  # ... and whose probe did not either (the records read back)
    seconds: float = 0.0  # the timed writes' wall time, end to end
    confirm: _Confirm | None = field(default=None, repr=False, compare=False)

    @property
    def p50(self) -> float:
        """Median latency of a write, ms."""
        return statistics.median(self.latencies)

    @property
    def p99(self) -> float:
        """99th percentile latency of a write, ms (nearest rank, as ``bench core``)."""
        return _percentile(self.latencies, 0.99)

    @property
    def records_per_s(self) -> float:
        """Records written per second, one write after the other."""
        return self.size * len(self.latencies) / self.seconds if self.seconds else 0.0

    def step(self, name: str) -> float | None:
        """The median of one step, ms (``None`` if this write has no such step)."""
        return statistics.median(self.steps[name]) if self.steps.get(name) else None


@dataclass
class RequestFigures:
    """Requests of one write as librdkafka sent and timed them (the instrumented pass)."""

    variant: Variant
    size: int
    per_write: dict[str, float]  # request name -> requests per write
    versions: dict[str, set[int]]  # request name -> versions sent
    rtt_ms: dict[str, float]  # request name -> median round trip, librdkafka's own timing


@dataclass
class InitFigures:
    """A producer's start (ms, each round): client + metadata, ``init_transactions``."""

    start: list[float] = field(default_factory=list)
    init_fresh: list[float] = field(default_factory=list)
    init_fence: list[float] = field(default_factory=list)


@dataclass
class RoundtripFigures:
    """Figures of one ``bench roundtrips`` run."""

    writes: int
    sizes: tuple[int, ...]
    record_bytes: int
    where: str
    cells: list[Cell] = field(default_factory=list)
    requests: list[RequestFigures] = field(default_factory=list)
    long_batches: int = 0
    offered: dict[str, tuple[int, int]] = field(default_factory=dict)  # broker's versions
    init: InitFigures = field(default_factory=InitFigures)
    seconds: float = 0.0

    def cell(self, key: str, size: int) -> Cell | None:
        """The cell of write ``key`` at ``size`` records, if it ran."""
        return next((c for c in self.cells if c.variant.key == key and c.size == size), None)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000


# -- clients, configured as registry.log configures them --------------------------------------


def _warm_up(producer: Producer, topic: str) -> None:
    # As registry.log._warm_up: twice, so the producer id request does not wait for a retry.
    producer.list_topics(topic=topic, timeout=_TIMEOUT)
    producer.list_topics(topic=topic, timeout=_TIMEOUT)


def _producer(kafka: Kafka, topic: str, variant: Variant, extra: dict[str, Any] | None = None,
              transactional_id: str | None = None) -> Producer:
    if variant.transactional:  # TransactionalWriter's settings (the write before issue 35)
        ours: dict[str, Any] = {"transactional.id": transactional_id or
                                f"jobreg-bench.{topic}.{variant.key}.{uuid.uuid4().hex[:8]}",
                                "linger.ms": 0, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}
    elif variant.leader:  # LeaderWriter's
        ours = {"enable.idempotence": True, "acks": "all", "linger.ms": 0,
                "message.timeout.ms": int(_TIMEOUT * 1000)}
    else:  # PlainWriter's
        ours = {"enable.idempotence": True, "linger.ms": 0,
                "message.timeout.ms": int(_TIMEOUT * 1000)}
    ours.update(dict(variant.settings))
    ours.update(extra or {})
    producer = Producer(kafka.settings(_CLIENT_DEFAULTS, ours))
    _warm_up(producer, topic)
    if variant.transactional:
        producer.init_transactions(_TIMEOUT)
    return producer


def _reader_settings(kafka: Kafka, fetch_wait_ms: int, reset: str,
                     extra: dict[str, Any] | None = None) -> dict[str, Any]:
    # LogReader._settings (the group id is required by librdkafka and never used)
    return kafka.settings(_CLIENT_DEFAULTS, {
        "group.id": f"jobreg-bench-{uuid.uuid4()}", "enable.auto.commit": False,
        "enable.auto.offset.store": False, "enable.partition.eof": True,
        "isolation.level": "read_committed", "fetch.wait.max.ms": fetch_wait_ms,
        "fetch.error.backoff.ms": 10, "auto.offset.reset": reset, **(extra or {})})


class _Confirm:
    """``LogReader``'s readability probe: a read_committed consumer that waits at most 1 ms
    per fetch at the broker, paused between confirmations, seeked to where the partition
    ends if nothing else was appended; evidence is an end of partition past the last record,
    or any record at or after it (read_committed returns only stable records).

    With ``list_offsets``, also the reader's own consumer (``LogReader``'s settings: fetch
    wait 5 ms, assigned and paused, as a reader is between reads), which asks the
    read_committed ListOffsets that ``LogReader.take_own`` asks first (:meth:`confirm_own`).
    """

    def __init__(self, kafka: Kafka, topic: str, partition: int,
                 extra: dict[str, Any] | None = None, *, list_offsets: bool = False,
                 one_list_offsets: bool = False) -> None:
        self.topic, self.partition = topic, partition
        self.one_list_offsets = one_list_offsets
        self.consumer = Consumer(_reader_settings(kafka, 1, "latest", extra))
        self._assigned = False
        self.reader: Consumer | None = None
        if list_offsets:
            debug = {k: v for k, v in (extra or {}).items() if k in ("debug", "logger")}
            self.reader = Consumer(_reader_settings(kafka, _READER_WAIT_MS, "earliest", debug))
            tp = TopicPartition(topic, partition, 0)
            self.reader.assign([tp])
            self.reader.pause([tp])

    def stable_offset(self) -> int | None:
        """``LogReader._stable_offset``: the last stable offset a read_committed ListOffsets
        answers now (``None``: no answer within ``LogReader``'s probe patience)."""
        assert self.reader is not None
        try:
            if self.one_list_offsets:  # the latest offset: for read_committed the stable one
                [tp] = self.reader.offsets_for_times(
                    [TopicPartition(self.topic, self.partition, OFFSET_END)], timeout=_PROBE_S)
                return None if tp.error is not None or tp.offset < 0 else int(tp.offset)
            _low, stable = self.reader.get_watermark_offsets(
                TopicPartition(self.topic, self.partition), timeout=_PROBE_S, cached=False)
        except KafkaException:
            return None
        return int(stable) if stable is not None else None

    def confirm_own(self, last: int, steps: dict[str, float]) -> str:
        """``LogReader.take_own``'s confirmation of a write whose last record is ``last``:
        ``"list_offsets"`` if the last stable offset already lies past it, else
        ``"probe"`` if a fetch from ``last + 1`` shows the end of the partition past it
        within ``LogReader``'s probe patience, else ``"read_back"`` (read until ``last``).
        Puts the ListOffsets' time into ``steps``."""
        t0 = time.perf_counter()
        stable = self.stable_offset()
        steps["list_offsets"] = _ms(t0, time.perf_counter())
        if stable is not None and stable > last:
            return "list_offsets"
        if self.confirm(last, last + 1, within=_PROBE_S) is not None:
            return "probe"
        self.confirm(last, last)
        return "read_back"

    def confirm(self, last: int, at: int, within: float = _TIMEOUT) -> int | None:
        """Wait until ``last`` is readable; return how many fetch answers said not yet.
        ``None`` if it was not within ``within`` seconds, if that is less than the bench's
        patience (a failed write's)."""
        tp = TopicPartition(self.topic, self.partition, at)
        if not self._assigned:
            self.consumer.assign([tp])
            self._assigned = True
        else:  # a seek wakes the fetcher at once (LogReader._resume)
            self.consumer.resume([tp])
            self.consumer.seek(tp)
        not_yet = 0
        deadline = time.monotonic() + within
        try:
            while (left := deadline - time.monotonic()) > 0:
                first = self.consumer.poll(left)
                for m in [] if first is None else [first, *self.consumer.consume(100, 0)]:
                    err, offset = m.error(), m.offset()
                    if offset is None:  # the binding's word for an invalid offset
                        continue
                    if err is None and offset >= last:
                        return not_yet
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        if offset > last:
                            return not_yet
                        not_yet += 1
        except KafkaException:
            if within >= _TIMEOUT:
                raise
            return None  # as LogReader's probe: read back instead
        finally:
            with contextlib.suppress(KafkaException):
                self.consumer.pause([tp])
        if within < _TIMEOUT:
            return None
        raise BrokerError(f"offset {last} of {self.topic}[{self.partition}] was not readable "
                          f"at read_committed within {_TIMEOUT:g} s")

    def close(self) -> None:
        """Leave the broker."""
        for consumer in (self.consumer, self.reader):
            if consumer is not None:
                with contextlib.suppress(KafkaException):
                    consumer.close()


class _Offsets:
    """Delivery reports of one write: the offsets, or the first error."""

    __slots__ = ("error", "offsets", "reports")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.error: KafkaError | None = None
        self.reports = 0

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        self.reports += 1
        if err is not None:
            self.error = err
        elif msg.offset() is not None and msg.offset() >= 0:
            self.offsets.append(msg.offset())


def _write(producer: Producer, confirm: _Confirm | None, variant: Variant, topic: str,
           partition: int, records: list[tuple[bytes, bytes]]
           ) -> tuple[float, dict[str, float], int, str]:
    """One write; its latency (ms), its steps (ms), the confirmation's "not yet" answers, and
    how a ListOffsets confirmation ended (:meth:`_Confirm.confirm_own`; else ``""``)."""
    got = _Offsets()
    steps: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        if variant.transactional:
            producer.begin_transaction()
            for key, value in records:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 on_delivery=got)
            t1 = time.perf_counter()
            steps["produce"] = _ms(t0, t1)
            if variant.acked_first:
                producer.flush(_TIMEOUT)
                t2 = time.perf_counter()
                steps["acked"] = _ms(t1, t2)
                t1 = t2
            producer.commit_transaction(_TIMEOUT)
            t2 = time.perf_counter()
            steps["commit"] = _ms(t1, t2)
            end = 2  # the commit marker follows the records
        elif variant.leader:  # LeaderWriter.start, then LeaderWriter.wait
            produced = producer.produce_batch(
                topic, [{"key": key, "value": value} for key, value in records],
                partition=partition, on_delivery=got)
            if produced < len(records):
                raise BrokerError(f"{topic}[{partition}]: {len(records) - produced} record(s) "
                                  "not queued (the producer's queue is full)")
            producer.poll(0)
            t1 = time.perf_counter()
            steps["produce"] = _ms(t0, t1)
            deadline = time.monotonic() + _TIMEOUT
            while got.error is None and got.reports < produced \
                    and (left := deadline - time.monotonic()) > 0:
                producer.poll(min(left, 0.05))
            if got.reports < produced and got.error is None:
                raise BrokerError(f"{topic}[{partition}]: records not acknowledged within "
                                  f"{_TIMEOUT:g} s")
            t2 = time.perf_counter()
            steps["flush"] = _ms(t1, t2)
            end = 1
        else:
            for key, value in records:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 on_delivery=got)
            t1 = time.perf_counter()
            steps["produce"] = _ms(t0, t1)
            if producer.flush(_TIMEOUT):
                raise BrokerError(f"{topic}[{partition}]: records not acknowledged within "
                                  f"{_TIMEOUT:g} s")
            t2 = time.perf_counter()
            steps["flush"] = _ms(t1, t2)
            end = 1
    except KafkaException as e:
        raise BrokerError(f"a write to {topic}[{partition}] failed: {e.args[0].str()}") from e
    if got.error is not None or len(got.offsets) != len(records):
        raise BrokerError(f"a write to {topic}[{partition}] failed: "
                          f"{got.error or 'delivery reports missing'}")
    not_yet, how = 0, ""
    if confirm is not None:
        last = max(got.offsets)
        if variant.list_offsets:
            how = confirm.confirm_own(last, steps)
        else:
            not_yet = confirm.confirm(last, last if variant.read_back else last + end) or 0
        t3 = time.perf_counter()
        steps["confirm"] = _ms(t2, t3)
        t2 = t3
    return _ms(t0, t2), steps, not_yet, how


def _prefill(kafka: Kafka, topic: str, partition: int, batches: int,
             record: tuple[bytes, bytes]) -> None:
    """``batches`` one-record batches on the partition (a flush after each)."""
    producer = _producer(kafka, topic, _BY_KEY["d"])
    try:
        for _ in range(batches):
            producer.produce(topic, value=record[1], key=record[0], partition=partition)
            if producer.flush(_TIMEOUT):
                raise BrokerError(f"{topic}[{partition}]: a record was not acknowledged "
                                  f"within {_TIMEOUT:g} s")
    finally:
        producer.close()


def _records(size: int, graph_bytes: int) -> list[tuple[bytes, bytes]]:
    """``size`` JobSubmitted records as the wire encodes them (the bench's namespace)."""
    out = []
    for i in range(size):
        event = JobSubmitted(event_id=new_event_id(), namespace="bench", epoch=1,
                             writer="bench-leader.1", created_at=now_ms(),
                             job_id=f"job-{i:06d}", graph=InlineGraph(b"g" * graph_bytes))
        out.append((f"bench/job/job-{i:06d}".encode(), encode(event)))
    return out


# -- the instrumented pass: librdkafka's own account of each request ---------------------------

_SENT = re.compile(r"Sent (\w+)Request \(v(\d+),")
_RECEIVED = re.compile(r"Received (\w+)Response \(v(\d+),.*rtt ([\d.]+)ms\)")
_OFFERED = re.compile(r"ApiKey (\w+) \((\d+)\) Versions (\d+)\.\.(\d+)")
_SHOWN = ("AddPartitionsToTxn", "Produce", "EndTxn", "ListOffsets", "Fetch")


class _Lines(logging.Handler):
    """Keeps the messages librdkafka logs (``debug``), for parsing afterwards."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _instrumented(kafka: Kafka, topic: str, variant: Variant, size: int, partition: int,
                  graph_bytes: int, offered: dict[str, tuple[int, int]]) -> RequestFigures:
    lines = _Lines()
    log = logging.getLogger(f"registry.bench.roundtrips.{uuid.uuid4().hex}")
    log.addHandler(lines)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    debug = {"debug": "protocol,feature", "logger": log}
    producer = _producer(kafka, topic, variant, debug)
    confirm = _Confirm(kafka, topic, partition,
                       {"fetch.wait.max.ms": variant.fetch_wait_ms, **debug},
                       list_offsets=variant.list_offsets,
                       one_list_offsets=variant.one_list_offsets) \
        if variant.confirm else None
    records = _records(size, graph_bytes)
    try:
        for _ in range(3):  # connections up, the consumer assigned
            _write(producer, confirm, variant, topic, partition, records)
        producer.poll(0)
        _serve_logs(confirm)
        for line in lines.lines:
            if m := _OFFERED.search(line):
                offered[m.group(1)] = (int(m.group(3)), int(m.group(4)))
        lines.lines.clear()
        for _ in range(_INSTRUMENTED_WRITES):
            _write(producer, confirm, variant, topic, partition, records)
            producer.poll(0)  # the logger is served on poll
        _serve_logs(confirm)
    finally:
        if confirm is not None:
            confirm.close()
        with contextlib.suppress(KafkaException):
            producer.close()
        log.removeHandler(lines)
    sent: Counter[str] = Counter()
    versions: dict[str, set[int]] = defaultdict(set)
    rtts: dict[str, list[float]] = defaultdict(list)
    for line in lines.lines:
        if m := _SENT.search(line):
            sent[m.group(1)] += 1
            versions[m.group(1)].add(int(m.group(2)))
        elif m := _RECEIVED.search(line):
            rtts[m.group(1)].append(float(m.group(3)))
    return RequestFigures(variant, size,
                          {k: sent[k] / _INSTRUMENTED_WRITES for k in _SHOWN if sent[k]},
                          {k: versions[k] for k in _SHOWN if k in versions},
                          {k: statistics.median(rtts[k]) for k in _SHOWN if rtts.get(k)})


def _serve_logs(confirm: _Confirm | None) -> None:
    # A consumer's logs are served by its poll; a paused one returns at once.
    if confirm is not None:
        confirm.consumer.poll(0)
        if confirm.reader is not None:
            confirm.reader.poll(0)


def _init_times(kafka: Kafka, topic: str, rounds: int) -> InitFigures:
    figures = InitFigures()
    settings = {"linger.ms": 0, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}
    for _ in range(rounds):
        tid = f"jobreg-bench.{topic}.init.{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        first = Producer(kafka.settings(_CLIENT_DEFAULTS, {"transactional.id": tid,
                                                            **settings}))
        _warm_up(first, topic)
        t1 = time.perf_counter()
        first.init_transactions(_TIMEOUT)
        t2 = time.perf_counter()
        # A new term: another producer of the same id while the first is still open.
        successor = Producer(kafka.settings(_CLIENT_DEFAULTS, {"transactional.id": tid,
                                                                **settings}))
        _warm_up(successor, topic)
        t3 = time.perf_counter()
        successor.init_transactions(_TIMEOUT)
        t4 = time.perf_counter()
        figures.start.append(_ms(t0, t1))
        figures.init_fresh.append(_ms(t1, t2))
        figures.init_fence.append(_ms(t3, t4))
        for p in (successor, first):  # the first is fenced: its close may say so
            with contextlib.suppress(KafkaException):
                p.close()
    return figures


# -- the run --------------------------------------------------------------------------------------


def bench_roundtrips(*, writes: int = 200, sizes: Iterable[int] = SIZES, graph_bytes: int = 200,
                     rounds: int = 10, long_batches: int = LONG_BATCHES,
                     bootstrap: str | Kafka | None = None, replication: int = 1,
                     kafka_nodes: int = 0,
                     progress: _Progress = lambda _: None) -> RoundtripFigures:
    """Run the benchmark on a fresh embedded broker (or on ``bootstrap``'s cluster, on a
    fresh topic of ``replication`` replicas whose deletion is asked afterwards; or, with
    ``kafka_nodes``, on Apache Kafka of that many nodes started for the run, the topic
    replicated on up to three) and return its figures. ``long_batches``: how many batches a
    long partition holds before its writes (0: no writes on a long partition). Raises
    :class:`BrokerError` if a write fails or is not confirmed."""
    sizes = tuple(sizes)
    started = time.perf_counter()
    if kafka_nodes or bootstrap is None:
        from registry.dev.brokers import BrokerChoice, start_broker

        choice = BrokerChoice.kafka(kafka_nodes) if kafka_nodes else BrokerChoice.embedded()
        where = (f"{choice.describe()}, started for the run" if choice.is_kafka
                 else "an embedded broker")
        with start_broker(choice, progress=progress if choice.is_kafka else None) as broker:
            figures = _run(Kafka.of(broker.bootstrap), where, writes, sizes, graph_bytes,
                           rounds, progress, topic="jobreg-roundtrips",
                           replication=choice.replicas, long_batches=long_batches)
    else:
        kafka = Kafka.of(bootstrap)
        topic = f"jobreg-roundtrips-{uuid.uuid4().hex[:8]}"
        try:
            figures = _run(kafka, str(kafka), writes, sizes, graph_bytes, rounds, progress,
                           topic=topic, replication=replication, long_batches=long_batches)
        finally:
            _delete_topic(kafka, topic)
    figures.seconds = time.perf_counter() - started
    return figures


def _delete_topic(kafka: Kafka, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    with contextlib.suppress(Exception):  # else the topic stays; its name says what it is
        admin = AdminClient(kafka.settings({}, {}))
        admin.delete_topics([topic])[topic].result(10)


def _run(kafka: Kafka, where: str, writes: int, sizes: tuple[int, ...], graph_bytes: int,
         rounds: int, progress: _Progress, *, topic: str, replication: int,
         long_batches: int) -> RoundtripFigures:
    records = {n: _records(n, graph_bytes) for n in sizes}
    figures = RoundtripFigures(writes=writes, sizes=sizes, where=where,
                               record_bytes=len(records[sizes[0]][0][1]),
                               long_batches=long_batches)
    variants = [v for v in VARIANTS if long_batches or not v.long]
    instrumented = [(v, n) for v in ("b", "b1", "c", "d", "d2", "e", "e1")
                    for n in sorted({1, 64} & set(sizes)) or sizes[:1]]
    partitions = len(variants) * len(sizes) + len(instrumented) + 1
    ensure_topic(kafka, topic, TopicConfig(partitions=partitions,
                                           replication_factor=replication))
    progress(f"{len(variants)} writes x {len(sizes)} sizes, {writes} timed writes each, on "
             f"topic {topic} ({partitions} partitions) of {where}")
    producers: dict[str, Producer] = {}
    confirms: list[_Confirm] = []
    try:
        for v in variants:
            producers[v.key] = _producer(kafka, topic, v)
        for i, (v, n) in enumerate((v, n) for v in variants for n in sizes):
            cell = Cell(v, n, partition=i)
            figures.cells.append(cell)
            confirm = None
            if v.long:
                progress(f"{v.key}, N={n}: {long_batches:,} batches on partition "
                         f"{cell.partition} first")
                _prefill(kafka, topic, cell.partition, long_batches, records[n][0])
            if v.confirm:
                confirm = _Confirm(kafka, topic, cell.partition,
                                   {"fetch.wait.max.ms": v.fetch_wait_ms},
                                   list_offsets=v.list_offsets,
                                   one_list_offsets=v.one_list_offsets)
                confirms.append(confirm)
            for _ in range(WARM_UP):
                _write(producers[v.key], confirm, v, topic, cell.partition, records[n])
            cell.confirm = confirm
        per_round = [writes // rounds + (1 if r < writes % rounds else 0) for r in range(rounds)]
        for r, count in enumerate(per_round):
            progress(f"round {r + 1} of {rounds}: {count} writes per cell")
            for cell in figures.cells:
                v = cell.variant
                t0 = time.perf_counter()
                for _ in range(count):
                    if v.idle_ms:  # not part of the write's time
                        s0 = time.perf_counter()
                        time.sleep(v.idle_ms / 1000)
                        t0 += time.perf_counter() - s0
                    latency, steps, not_yet, how = _write(producers[v.key], cell.confirm, v,
                                                          topic, cell.partition,
                                                          records[cell.size])
                    cell.latencies.append(latency)
                    for name, ms in steps.items():
                        cell.steps[name].append(ms)
                    cell.late_confirms += 1 if not_yet else 0
                    cell.probed += 1 if how in ("probe", "read_back") else 0
                    cell.read_back += 1 if how == "read_back" else 0
                cell.seconds += time.perf_counter() - t0
    finally:
        for c in confirms:
            c.close()
        for p in producers.values():
            with contextlib.suppress(KafkaException):
                p.close()
        producers.clear()
    progress("instrumented pass (debug=protocol): requests, versions, round trips")
    base = len(variants) * len(sizes)
    for i, (key, n) in enumerate(instrumented):
        figures.requests.append(_instrumented(kafka, topic, _BY_KEY[key], n, base + i,
                                              graph_bytes, figures.offered))
    progress(f"producer start and init_transactions ({_INIT_ROUNDS} rounds)")
    figures.init = _init_times(kafka, topic, _INIT_ROUNDS)
    return figures


# -- the tables -----------------------------------------------------------------------------------


def _f(v: float | None, fmt: str = ".2f") -> str | None:
    return None if v is None else format(v, fmt)


def format_roundtrips(f: RoundtripFigures) -> str:
    """The figures as plain-text tables, ratios from this run."""
    out = [f"bench roundtrips: {f.writes} timed writes per row (after {WARM_UP} untimed), one "
           f"write at a time, each to a partition of its own on {f.where}; a record is a "
           f"JobSubmitted of {f.record_bytes} B"
           + (f"; a long partition holds {f.long_batches:,} one-record batches before its "
              "first write" if f.long_batches else "")
           + f"; wall time {f.seconds:.0f} s", ""]
    rows = []
    for n in f.sizes:
        for v in VARIANTS:
            cell = f.cell(v.key, n)
            if cell is None:
                continue
            versus = f.cell(v.compare, n)
            alone = f.cell(v.key, f.sizes[0])
            rows.append((f"{v.key}. {v.label}", n, _f(cell.p50), _f(cell.p99),
                         f"{cell.records_per_s:,.0f}",
                         None if versus is None or v.key == v.compare
                         else f"{cell.p50 / versus.p50:.2f} x {v.compare}",
                         None if alone is None or n == f.sizes[0]
                         else f"{cell.p50 / alone.p50:.2f}"))
    out.append(table(("write", "N", "p50 ms", "p99 ms", "records/s", "p50 vs",
                      f"p50 vs N={f.sizes[0]}"), rows, right={1, 2, 3, 4, 5, 6}))
    out += ["", "where the time goes, p50 ms (produce: the produce() calls, e: produce_batch; "
            "acked: flush inside the transaction; commit: commit_transaction; flush: until "
            "acknowledged, e: polling for the reports as LeaderWriter.wait; confirm: the "
            "read_committed confirmation, whole; ListOffsets: e's and e1's read_committed ListOffsets; "
            "ListOffsets confirms: e's (e1's) writes whose ListOffsets answer showed them, the others "
            "confirmed by the probe fetch from last+1, or read back where that did not show "
            "them either)", ""]
    steps: list[tuple[object, ...]] = []
    for n in f.sizes:
        for v in VARIANTS:
            cell = f.cell(v.key, n)
            if cell is None:
                continue
            total = len(cell.latencies)
            steps.append((f"{v.key}. {v.label}", n, _f(cell.step("produce"), ".3f"),
                         _f(cell.step("acked")), _f(cell.step("commit")),
                         _f(cell.step("flush")), _f(cell.step("confirm")),
                         _f(cell.step("list_offsets")),
                         None if not v.confirm or v.list_offsets
                         else f"{total - cell.late_confirms}/{total}",
                         None if not v.list_offsets
                         else f"{total - cell.probed}/{total}"
                              + (f" ({cell.read_back} read back)" if cell.read_back else "")))
    out.append(table(("write", "N", "produce", "acked", "commit", "flush", "confirm",
                      "ListOffsets", "1st answer confirms", "ListOffsets confirms"), steps,
                     right={1, 2, 3, 4, 5, 6, 7, 8, 9}))
    if f.requests:
        out += ["", "requests per write as librdkafka sent and timed them (instrumented pass, "
                f"debug=protocol, {_INSTRUMENTED_WRITES} writes: the logging slows the write "
                "itself, so only counts, versions and librdkafka's rtt are kept)", ""]
        requests: list[tuple[object, ...]] = []
        for r in f.requests:
            for name in _SHOWN:
                if name not in r.per_write:
                    continue
                lo_hi = f.offered.get(name)
                requests.append((f"{r.variant.key}. {r.variant.label}", r.size, name,
                             ",".join(f"v{x}" for x in sorted(r.versions.get(name, ()))),
                             None if lo_hi is None else f"v{lo_hi[0]}..v{lo_hi[1]}",
                             f"{r.per_write[name]:.2f}", _f(r.rtt_ms.get(name), ".3f")))
        out.append(table(("write", "N", "request", "sent", "broker offers", "per write",
                          "rtt p50 ms"), requests, right={1, 5, 6}))
        out += _wire_share(f)
    i = f.init
    if i.start:
        out += ["", f"a producer's start, ms over {len(i.start)} rounds (p50 / max)", ""]
        out.append(table(("step", "p50 ms", "max ms"), [
            ("new producer + metadata (twice, as registry.log warms up)",
             _f(statistics.median(i.start)), _f(max(i.start))),
            ("init_transactions, a fresh transactional.id", _f(statistics.median(i.init_fresh)),
             _f(max(i.init_fresh))),
            ("init_transactions, an id another producer holds (a new term's fence)",
             _f(statistics.median(i.init_fence)), _f(max(i.init_fence))),
        ], right={1, 2}))
    return "\n".join(out)


def _wire_share(f: RoundtripFigures) -> list[str]:
    """For a 1-record write: how much of each step is round trips on the wire."""
    lines: list[str] = []
    b1 = f.cell("b", 1)
    req = next((r for r in f.requests if r.variant.key == "b" and r.size == 1), None)
    if b1 is not None and req is not None and b1.step("commit") is not None:
        wire = sum(req.rtt_ms.get(k, 0.0) for k in ("AddPartitionsToTxn", "Produce", "EndTxn"))
        lines.append(f"1-record transaction: commit p50 {b1.step('commit'):.2f} ms, of which "
                     f"{wire:.2f} ms are its three round trips' rtt p50 (AddPartitionsToTxn "
                     f"{req.rtt_ms.get('AddPartitionsToTxn', 0):.3f}, Produce "
                     f"{req.rtt_ms.get('Produce', 0):.3f}, EndTxn "
                     f"{req.rtt_ms.get('EndTxn', 0):.3f}); the rest is inside librdkafka")
    d1 = f.cell("d", 1)
    reqd = next((r for r in f.requests if r.variant.key == "d" and r.size == 1), None)
    if d1 is not None and reqd is not None and d1.step("flush") is not None:
        lines.append(f"1-record idempotent write: flush p50 {d1.step('flush'):.2f} ms, Produce "
                     f"rtt p50 {reqd.rtt_ms.get('Produce', 0):.3f} ms")
    e1 = f.cell("e", 1)
    reqe = next((r for r in f.requests if r.variant.key == "e" and r.size == 1), None)
    if e1 is not None and reqe is not None and e1.step("list_offsets") is not None:
        lines.append(f"1-record write of today: acknowledged p50 {e1.step('flush'):.2f} ms "
                     f"(Produce rtt p50 {reqe.rtt_ms.get('Produce', 0):.3f}), ListOffsets "
                     f"p50 {e1.step('list_offsets'):.2f} ms (rtt p50 "
                     f"{reqe.rtt_ms.get('ListOffsets', 0):.3f})")
    return ["", *lines] if lines else []
