"""The property tests' histories on a real Kafka topic, for Apache Kafka's own log cleaner.

:class:`BrokerSim` is the model's :class:`~.model.Sim` that also records how each of its
writes reaches the broker (a :class:`Unit`): a ``Term`` write is one transaction (committed
or aborted, as the history says), a grant goes through the plain idempotent producer the
client's claims use, a zombie's raw write through a plain producer, and a client's re-send
is a transaction of its own. :class:`HistoryWriter` writes many histories at once, one per
partition, unit after unit, so each partition holds exactly its history's log (the
records in the history's order, the markers Kafka writes).

What the test reads back: :func:`read_partitions` (a read_committed or read_uncommitted
consumer), :func:`read_segments` (the partition's segment files on disk, markers and empty
batches included: what no consumer shows), :func:`cleaner_checkpoint` (the cleaner's
``cleaner-offset-checkpoint``) and :func:`cleaned_counts` (``log-cleaner.log``).
"""

from __future__ import annotations

import pathlib
import re
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from hypothesis import Phase, given, settings
from hypothesis.strategies import SearchStrategy

from registry.image import LogRecord

from .histories import SETTINGS, build, history_ops
from .model import Rec, Sim

#: The key of the records that close a segment (never a namespace's key; dropped on reading).
ROLL_KEY = b"jobreg-test/roll"


@dataclass
class Unit:
    """One write of a history as the broker sees it: ``kind`` is ``txn`` (one transaction,
    ``aborted`` or committed), ``idempotent`` (a grant) or ``plain`` (a zombie's raw write);
    ``records`` are indices into the history's log, in order."""

    kind: str
    aborted: bool = False
    records: list[int] = field(default_factory=list)


@dataclass
class BrokerSim(Sim):
    """:class:`Sim` that records the :class:`Unit` each record was written in."""

    units: list[Unit] = field(default_factory=list)
    _open: list[Unit] = field(default_factory=list)

    def _within(self, unit: Unit, write: Callable[[], None]) -> None:
        # A unit is listed when it opens: a write's records all come before the reassertion
        # it may nest (Sim.write settles at its very end), a grant before its term's first
        # write, so the listing order is the log's order (checked by ``checked_units``).
        self.units.append(unit)
        self._open.append(unit)
        try:
            write()
        finally:
            self._open.pop()

    def append(self, key, value, aborted: bool = False) -> int:
        offset = super().append(key, value, aborted)
        self._open[-1].records.append(len(self.log) - 1)
        return offset

    def claim(self, who: str, external: bool = False) -> None:
        self._within(Unit("idempotent"), lambda: super(BrokerSim, self).claim(who, external))

    def command(self, who, cmd, job, aborted: bool = False, cp: int = 1) -> None:
        self._within(Unit("txn", aborted),
                     lambda: super(BrokerSim, self).command(who, cmd, job, aborted, cp))

    def collect(self, who: str, keys: list[str]) -> None:
        # the leader's tombstones: a write of its idempotent producer, no transaction
        self._within(Unit("idempotent"), lambda: super(BrokerSim, self).collect(who, keys))

    def raw(self, kind, epoch, writer, job, key_choice) -> None:
        self._within(Unit("plain"),
                     lambda: super(BrokerSim, self).raw(kind, epoch, writer, job, key_choice))

    def duplicate(self, index: int) -> None:
        # the client's re-send of its own record: a retry, in a transaction of its own
        self._within(Unit("txn"), lambda: super(BrokerSim, self).duplicate(index))

    def checked_units(self) -> list[Unit]:
        """The units that wrote something, in log order (each record in exactly one)."""
        units = [u for u in self.units if u.records]
        flat = [i for u in units for i in u.records]
        assert flat == list(range(len(self.log))), "units out of the log's order"
        for u in units:
            assert all(self.log[i].aborted == u.aborted for i in u.records)
        return units


def draw_ops(count: int, strategy: SearchStrategy[list[tuple]] = history_ops
             ) -> list[list[tuple]]:
    """``count`` histories (op lists) drawn by one of the property tests' own strategies
    (:data:`.histories.history_ops`, :data:`.histories.long_history_ops`), under their
    settings (the ``ci`` profile draws the same ones on every run)."""
    drawn: list[list[tuple]] = []
    if count <= 0:
        return drawn

    @settings(SETTINGS, max_examples=count, phases=[Phase.generate], database=None)
    @given(strategy)
    def collect(ops: list[tuple]) -> None:
        drawn.append(ops)

    collect()
    return drawn


def build_on_broker(ops: list[tuple]) -> BrokerSim:
    """The history ``ops`` build (the property tests' :func:`.histories.build`)."""
    sim = build(ops, sim=BrokerSim())
    assert isinstance(sim, BrokerSim)
    return sim


class HistoryWriter:
    """Writes units to partitions of one topic: a transactional producer (each round's
    committed units in one transaction, its aborted ones in another), the idempotent
    producer of grants, and a plain producer (no idempotence, one request in flight, so a
    retry cannot reorder) for zombies."""

    def __init__(self, bootstrap: str, topic: str, transactional_id: str) -> None:
        self.topic = topic
        common = {"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3,
                  "compression.type": "none"}
        self.txn = Producer({**common, "transactional.id": transactional_id,
                             "transaction.timeout.ms": 60000})
        self.txn.init_transactions(60)
        self.idempotent = Producer({**common, "enable.idempotence": True})
        self.plain = Producer({**common, "enable.idempotence": False, "acks": "all",
                               "max.in.flight.requests.per.connection": 1})
        self.transactions = {"committed": 0, "aborted": 0}
        #: partition -> index in its history's log -> the offset Kafka gave the record
        self.offsets: dict[int, dict[int, int]] = {}

    def _send(self, producer: Producer, partition: int, log: list[Rec],
              indices: Iterable[int]) -> None:
        offsets = self.offsets.setdefault(partition, {})
        for i in indices:
            r = log[i]

            def delivered(err, msg, i: int = i) -> None:
                _raise_on_error(err, msg)
                offsets[i] = msg.offset()

            producer.produce(self.topic, key=r.key, value=r.value, partition=partition,
                             timestamp=r.timestamp, on_delivery=delivered)

    def _flush(self, producer: Producer) -> None:
        if producer.flush(60) != 0:
            raise AssertionError("records still unsent after 60 s")

    def write(self, work: dict[int, tuple[list[Rec], list[Unit]]]) -> int:
        """Write each partition's units of its log in order (round ``r`` writes every
        partition's ``r``-th unit and waits for it before round ``r + 1``); returns the
        rounds. :attr:`offsets` gets each record's offset."""
        rounds = max((len(units) for _, units in work.values()), default=0)
        for r in range(rounds):
            now = {p: (log, units[r]) for p, (log, units) in work.items() if r < len(units)}
            for aborted in (False, True):
                batch = [(p, log, u) for p, (log, u) in now.items()
                         if u.kind == "txn" and u.aborted == aborted]
                if not batch:
                    continue
                self.txn.begin_transaction()
                for p, log, u in batch:
                    self._send(self.txn, p, log, u.records)
                if aborted:
                    # an abort while a produce is in flight can fail fatally (librdkafka #4849)
                    self._flush(self.txn)
                    self.txn.abort_transaction(60)
                    self.transactions["aborted"] += 1
                else:
                    self.txn.commit_transaction(60)
                    self.transactions["committed"] += 1
            for kind, producer in (("idempotent", self.idempotent), ("plain", self.plain)):
                batch = [(p, log, u) for p, (log, u) in now.items() if u.kind == kind]
                for p, log, u in batch:
                    self._send(producer, p, log, u.records)
                if batch:
                    self._flush(producer)
        return rounds

    def roll(self, partitions: Sequence[int], timestamp: int, size: int = 4096
             ) -> dict[int, int]:
        """One record (:data:`ROLL_KEY`) per partition stamped ``timestamp``; returns each
        one's offset. Kafka rolls a segment on an append whose timestamp is more than
        ``segment.ms`` past the segment's first batch, so with ``timestamp`` that far past
        every record and marker it closes the segment holding them: the cleaner may clean
        it. Its value is ``size`` bytes, so that the segment it closes next time is dirty
        enough for ``min.cleanable.dirty.ratio`` against the clean part of any history
        here."""
        offsets: dict[int, int] = {}

        def delivered(err, msg) -> None:
            _raise_on_error(err, msg)
            offsets[msg.partition()] = msg.offset()

        for p in partitions:
            self.plain.produce(self.topic, key=ROLL_KEY, value=b"r" * size, partition=p,
                               timestamp=timestamp, on_delivery=delivered)
        self._flush(self.plain)
        assert set(offsets) == set(partitions)
        return offsets

    def close(self) -> None:
        for producer in (self.txn, self.idempotent, self.plain):
            producer.flush(10)


def _raise_on_error(err, msg) -> None:
    if err is not None:
        raise KafkaException(err)


def read_partitions(bootstrap: str, topic: str, partitions: Sequence[int], *,
                    committed: bool, timeout: float = 120.0,
                    keep_rolls: bool = False) -> dict[int, list[LogRecord]]:
    """Every record of ``partitions`` from the start to the end (the last stable offset
    for a read_committed reader), as the fold reads them; :data:`ROLL_KEY` records left
    out unless ``keep_rolls``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed" if committed
                         else "read_uncommitted", "log_level": 3})
    out: dict[int, list[LogRecord]] = {p: [] for p in partitions}
    pending = set(partitions)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(pending)} partition(s) of {topic} not read to "
                                     f"their end within {timeout:g} s")
            for msg in consumer.consume(1000, 1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise KafkaException(err)
                if msg.key() == ROLL_KEY and not keep_rolls:
                    continue
                out[msg.partition()].append(LogRecord(msg.offset(), msg.key(), msg.value(),
                                                      msg.timestamp()[1], msg.partition()))
    finally:
        consumer.close()
    return out


# -- the broker's files -------------------------------------------------------------------

def cleaner_checkpoint(log_dir: pathlib.Path, topic: str) -> dict[int, int]:
    """The cleaner's ``cleaner-offset-checkpoint``: the first dirty offset of each cleaned
    partition of ``topic`` (everything below it has been through the cleaner)."""
    path = log_dir / "cleaner-offset-checkpoint"
    if not path.exists():
        return {}
    lines = path.read_text().split("\n")
    out: dict[int, int] = {}
    for line in lines[2:]:
        parts = line.split()
        if len(parts) == 3 and parts[0] == topic:
            out[int(parts[1])] = int(parts[2])
    return out


_CLEANED = re.compile(r"cleaned log (\S+)-(\d+) \(dirty section = \[(\d+), (\d+)\]\)")


def cleaned_counts(logs: pathlib.Path, topic: str) -> dict[int, int]:
    """How many times ``log-cleaner.log`` says each partition of ``topic`` was cleaned."""
    counts: dict[int, int] = {}
    for path in logs.glob("log-cleaner.log*"):
        for m in _CLEANED.finditer(path.read_text(errors="replace")):
            if m.group(1) == topic:
                counts[int(m.group(2))] = counts.get(int(m.group(2)), 0) + 1
    return counts


def wait_cleaned(log_dir: pathlib.Path, topic: str, targets: dict[int, int],
                 timeout: float = 600.0) -> float:
    """Wait until the cleaner's checkpoint is at or past ``targets[p]`` for every partition
    (everything before it cleaned; a partition whose target is 0 has nothing to clean);
    returns the seconds waited."""
    targets = {p: t for p, t in targets.items() if t > 0}
    start = time.monotonic()
    while True:
        done = cleaner_checkpoint(log_dir, topic)
        behind = {p: (done.get(p), t) for p, t in targets.items() if done.get(p, -1) < t}
        if not behind:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            sample = dict(list(behind.items())[:5])
            raise AssertionError(f"the cleaner did not reach the roll records of "
                                 f"{len(behind)} partition(s) of {topic} within {timeout:g} s "
                                 f"(partition: (checkpoint, target)) {sample}")
        time.sleep(0.2)


@dataclass(frozen=True)
class Batch:
    """A record batch as stored (format v2): what DumpLogSegments shows."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: bool
    delete_horizon: bool
    records: tuple[tuple[int, bytes | None, bytes | None], ...]  # (offset, key, value)

    @property
    def marker(self) -> str | None:
        """``COMMIT`` or ``ABORT`` for a transaction marker, else ``None``."""
        if not self.control or not self.records:
            return None
        key = self.records[0][1] or b""
        return {0: "ABORT", 1: "COMMIT"}.get(struct.unpack(">hh", key[:4])[1], "OTHER")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _records(buf: bytes, base: int, count: int) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    pos = 0
    for _ in range(count):
        _, pos = _varint(buf, pos)  # length
        pos += 1  # attributes
        _, pos = _varint(buf, pos)  # timestamp delta
        delta, pos = _varint(buf, pos)
        fields: list[bytes | None] = []
        for _ in range(2):  # key, value
            n, pos = _varint(buf, pos)
            fields.append(None if n < 0 else buf[pos:pos + n])
            pos += max(n, 0)
        headers, pos = _varint(buf, pos)
        for _ in range(headers):
            for _ in range(2):
                n, pos = _varint(buf, pos)
                pos += max(n, 0)
        out.append((base + delta, fields[0], fields[1]))
    return out


def _segment_batches(path: pathlib.Path) -> list[Batch]:
    data = path.read_bytes()
    out: list[Batch] = []
    pos = 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        if length <= 0:
            break
        (_, magic, _, attributes, last_delta, _, _, pid, epoch, _,
         count) = struct.unpack_from(">ibIhiqqqhii", data, pos + 12)
        if magic != 2:
            raise AssertionError(f"{path}: batch at {base} has magic {magic}")
        if attributes & 0x7:
            raise AssertionError(f"{path}: compressed batch at {base}")
        body = data[pos + 61:pos + 12 + length]
        out.append(Batch(base, base + last_delta, pid, epoch, bool(attributes & 0x10),
                         bool(attributes & 0x20), bool(attributes & 0x40),
                         tuple(_records(body, base, count))))
        pos += 12 + length
    return out


def read_segments(log_dir: pathlib.Path, topic: str, partition: int,
                  attempts: int = 20) -> list[Batch]:
    """Every batch in the partition's segment files, in offset order. A cleaner swapping
    segments meanwhile (files renamed or gone) makes it read again."""
    folder = log_dir / f"{topic}-{partition}"
    for _ in range(attempts):
        try:
            batches = [b for path in sorted(folder.glob("*.log"))
                       for b in _segment_batches(path)]
        except FileNotFoundError:
            time.sleep(0.1)
            continue
        offsets = [b.base_offset for b in batches]
        if offsets == sorted(set(offsets)):
            return batches
        time.sleep(0.1)
    raise AssertionError(f"{folder}: segments kept changing while being read")
