"""fold(compact(log)) == fold(log) with Apache Kafka's own log cleaner doing the compacting.

The property tests (``tests/unit/test_fold_properties.py``) check it against a model of the
cleaner (``support/model.py``). Here the same histories (drawn by the same strategies,
built by the same simulated clients) are written to a real Kafka topic, one history per
partition, with real producers: each ``Term`` write is one transaction, committed or
aborted as the history says; grants go through an idempotent producer, zombies' raw writes
(garbage, tombstones, torn calls) through a plain one. Then Kafka's cleaner compacts them,
in several passes:

1. the first part of every history (cut at a random write), cleaned;
2. the rest written after it, cleaned again (a clean section and a dirty one);
3. a pass past ``delete.retention.ms``: tombstones go;
4. another one past it: transaction markers of emptied transactions go (a marker becomes
   removable only on the pass after its transaction's records went, and goes on a later
   pass past the horizon stamped then).

After each pass, for every partition: the cleaner's checkpoint is past everything written
(it cleaned it), each key appears once, read_committed and read_uncommitted readers read the
same records (aborted ones are gone), and they are exactly the records the model's
``compact`` keeps (tombstones the model keeps may already be gone before pass 3). After
passes 3 and 4, fold(what a read_committed consumer reads) answers as fold(the history's
log) does, the comparison the property test makes. After pass 4 the segment files on disk
are read: no tombstone, no aborted record, and every marker left has a batch of its
transaction left (Kafka's rule), every empty batch is its producer's last (kept for fencing).

The records keep the history's own timestamps (``CreateTime``, moved to now by whole
duplicate windows), so fold rule 1's windows are the model's. ``min.compaction.lag.ms`` is 0
here, so what the cleaner may clean does not wait on time; ``segment.ms`` is longer than any
history, and Kafka rolls a segment when a record's timestamp is ``segment.ms`` past the
segment's first one: a roll record stamped far ahead closes the segment after each part (the
active segment is never cleaned). Two layouts run: a segment per part (nothing is cleaned
while a part is written, so it is read back whole first), and segments of 2 KiB
(``internal.segment.bytes``, Kafka's test-only setting), where the cleaner also cleans while
the parts are written, up to wherever a segment ends or a transaction is still open, and
cleans many segments in one pass.

``JOBREG_KAFKA_COMPACTION_HISTORIES`` (default 200) short histories and
``JOBREG_KAFKA_COMPACTION_LONG`` (default 4, one of them hypothesis' trivial first draw;
building one takes the model seconds) long ones (250 to 400 ops) run in each layout, at most
:data:`PER_TOPIC` per topic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from support.histories import build, long_history_ops
from support.kafka_cleaner import (
    BrokerSim,
    HistoryWriter,
    Unit,
    build_on_broker,
    cleaned_counts,
    draw_ops,
    read_partitions,
    read_segments,
    wait_cleaned,
)
from support.model import NS, Rec, compact, visible

from registry.dev.kafka import KafkaCluster
from registry.fold import DUPLICATE_WINDOW_MS, fold
from registry.image import LogRecord
from registry.log import TopicConfig

pytestmark = pytest.mark.kafka

HISTORIES = int(os.environ.get("JOBREG_KAFKA_COMPACTION_HISTORIES", "200"))
LONG = int(os.environ.get("JOBREG_KAFKA_COMPACTION_LONG", "4"))
PER_TOPIC = 250
DAY_MS = 24 * 3600 * 1000
SEGMENT_MS = 7 * DAY_MS
DELETE_RETENTION_MS = 1000
# Most histories fit in one such segment, the long ones span dozens; the largest write (one
# transaction, 1.4 KiB) and a roll record (half of it) must fit in one.
SMALL_SEGMENT_BYTES = 2048
CLEANER_BACKOFF_MS = 100
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": str(SEGMENT_MS),
    "segment.ms": str(SEGMENT_MS),
    # a roll record (1 or 4 KiB) leaves a segment dirty enough beside a clean part of up to
    # 1 MiB (with 0.01, a long history's partition was once left uncleaned behind one)
    "min.cleanable.dirty.ratio": "0.001",
    "delete.retention.ms": str(DELETE_RETENTION_MS),
    "message.timestamp.type": "CreateTime",
    # the histories' clocks start now and run days ahead, the roll records weeks ahead
    "message.timestamp.after.max.ms": str(2**63 - 1),
}
# The model's cleaner under this topic's settings, at a time past every record: tombstones
# kept (no pass has passed their horizon yet) or dropped (one has).
NOW = 10**14
KEEP_TOMBSTONES = TopicConfig(min_compaction_lag_ms=0, delete_retention_ms=10**15)
DROP_TOMBSTONES = TopicConfig(min_compaction_lag_ms=0, delete_retention_ms=0)


@pytest.fixture(scope="module")
def cleaner_kafka() -> Iterator[KafkaCluster]:
    """One Kafka node whose cleaner looks for work every 100 ms (default 15 s); its folder
    is kept in ``$JOBREG_KAFKA_COMPACTION_DIR`` when set (to read its segments and logs)."""
    with KafkaCluster(nodes=1, config={"log.cleaner.backoff.ms": str(CLEANER_BACKOFF_MS)},
                      directory=os.environ.get("JOBREG_KAFKA_COMPACTION_DIR") or None) as k:
        yield k


@dataclass
class History:
    """One history on its partition: its ops, its log (stamps moved to now), how it is
    written and where it is cut."""

    ops: list[tuple]
    log: list[Rec]
    units: list[Unit]
    cut: int  # units [0, cut) before the first pass, the rest after it
    model: list[Rec]  # the model's compacted log, with the offsets Kafka gave the records

    def repro(self) -> str:
        return json.dumps({"ops": self.ops, "cut": self.cut})


def _say(line: str) -> None:
    # progress on stderr (pytest -s shows it): a run of hundreds of histories takes minutes
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def drawn() -> list[tuple[list[tuple], BrokerSim]]:
    """The histories, drawn and built once for both layouts of segments."""
    ops = draw_ops(HISTORIES) + draw_ops(LONG, long_history_ops)
    assert len(ops) >= HISTORIES  # hypothesis drew them all
    return [(o, build_on_broker(o)) for o in ops]


@pytest.mark.timeout(600 + 3 * (HISTORIES + 20 * LONG))
@pytest.mark.parametrize("segment_bytes", [None, SMALL_SEGMENT_BYTES],
                         ids=["segment-per-part", "small-segments"])
def test_kafka_cleaner_keeps_the_answer(cleaner_kafka: KafkaCluster, drawn, segment_bytes,
                                        tmp_path) -> None:
    """Every drawn history, through Kafka's cleaner four times: the model's records and the
    fold's answer (see the module docstring). With ``small-segments`` the topic rolls a
    segment every 2 KiB (``internal.segment.bytes``), so the cleaner also cleans while the
    histories are written, wherever a segment ends or a transaction is open, and cleans
    many segments at once."""
    problems: list[str] = []
    stats: Counter[str] = Counter()
    started = time.monotonic()
    for first in range(0, len(drawn), PER_TOPIC):
        chunk = drawn[first:first + PER_TOPIC]
        _run_topic(cleaner_kafka, f"cleaner-{segment_bytes or 'whole'}-{first}", chunk,
                   problems, stats, segment_bytes)
    stats["seconds"] = round(time.monotonic() - started)
    print(f"\nKafka cleaner ({segment_bytes or 'a segment per part'}): {len(drawn)} "
          f"histories, {dict(stats)}")
    if problems:
        (tmp_path / "problems.txt").write_text("\n".join(problems))
        pytest.fail(f"{len(problems)} problem(s) (all in {tmp_path / 'problems.txt'}):\n"
                    + "\n".join(problems[:5]))


def test_kafkas_cleaner_never_lets_a_resubmission_replace_a_live_jobs_graph(
        cleaner_kafka: KafkaCluster) -> None:
    """The hazard the reassertions removed before submits had keys of their own, on Kafka's
    cleaner: a second submit of a live job, refused (job_exists), became the newest record
    of the job's key, the cleaner removed the submit before it, and the fold of the
    compacted log took the refused record's graph. Now, without any reassertion, the
    resubmission lies under its own birth key (partition 0), or under the job's key as an
    older jobreg wrote submits, refused wrong_key (partition 1): the cleaner never removes
    the birth, and the compacted fold keeps the job's graph and refuses the resubmission
    (``test_a_resubmission_never_replaces_a_live_jobs_graph_even_without_reassertion`` on
    the model)."""
    drawn = []
    for key_choice in (0, 3):
        ops = [("claim", "jm-1"), ("write", "jm-1", "submit", "a", False),
               ("raw", "submit", 1, "jm-1", "a", key_choice)]
        sim = build(ops, settle=False, sim=BrokerSim(reassert=False))
        assert isinstance(sim, BrokerSim)
        drawn.append((ops, sim))
    problems: list[str] = []
    _run_topic(cleaner_kafka, "cleaner-hazard", drawn, problems, Counter())
    assert problems == []  # Kafka's cleaner did what the model does, and the answer held
    read = read_partitions(cleaner_kafka.bootstrap, "cleaner-hazard", [0, 1], committed=True)
    for part, (_, sim) in enumerate(drawn):
        full, compacted = fold(visible(sim.log), NS), fold(read[part], NS)
        assert full.jobs["a"].graph.data == compacted.jobs["a"].graph.data == b"graph-a"
        assert [d.reason for d in compacted.rejected] == [d.reason for d in full.rejected] \
            == ["job_exists" if part == 0 else "wrong_key"]


def _run_topic(kafka: KafkaCluster, topic: str, drawn: list[tuple[list[tuple], BrokerSim]],
               problems: list[str], stats: Counter[str], segment_bytes: int | None = None
               ) -> None:
    node = kafka.nodes[0]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    config = dict(TOPIC_CONFIG)
    if segment_bytes is not None:
        # Kafka's test-only setting: segment.bytes is at least 1 MiB since 4.1
        config["internal.segment.bytes"] = str(segment_bytes)
    admin.create_topics([NewTopic(topic, num_partitions=len(drawn), replication_factor=1,
                                  config=config)])[topic].result(60)
    parts = list(range(len(drawn)))
    rng = random.Random(topic)
    histories: list[History] = []
    # The histories' clocks start at 1_000_000 ms; moved to now by whole duplicate windows
    # (fold rule 1 reads nothing else of a stamp), because the markers Kafka writes carry the
    # broker's time, and a segment rolls when a batch is segment.ms newer than its first.
    shift = -(-(int(time.time() * 1000) - 1_000_000) // DUPLICATE_WINDOW_MS) * DUPLICATE_WINDOW_MS
    for ops, sim in drawn:
        log = [dataclasses.replace(r, timestamp=r.timestamp + shift) for r in sim.log]
        assert fold(visible(log), NS).answer() == fold(visible(sim.log), NS).answer()
        units = sim.checked_units()
        histories.append(History(ops, log, units, rng.randint(0, len(units)), []))
    stamps = [r.timestamp for h in histories for r in h.log]
    # no history spans a segment: its records (and the markers stamped meanwhile) stay in
    # the active segment until a roll record closes it
    assert max(stamps) - min(stamps) < SEGMENT_MS - 3600_000
    roll_at = max(stamps) + SEGMENT_MS + 1
    roll_size = 4096 if segment_bytes is None else segment_bytes // 2
    writer = HistoryWriter(kafka.bootstrap, topic, f"cleaner-test-{topic}")
    try:
        rolls = {p: -1 for p in parts}
        passes = Counter[int]()  # passes that had something to clean, by partition
        for stage in (0, 1):
            work = {p: (h.log, h.units[:h.cut] if stage == 0 else h.units[h.cut:])
                    for p, h in enumerate(histories)}
            _say(f"{topic}: writing part {stage + 1}")
            stats["rounds"] += writer.write(work)
            _say(f"{topic}: reading part {stage + 1} back")
            _check_written(kafka, topic, histories, work, writer.offsets, rolls, problems,
                           whole=segment_bytes is None)
            roll_at = max(roll_at, int(time.time() * 1000) + SEGMENT_MS + 1)
            rolls = writer.roll(parts, roll_at, roll_size)
            roll_at += SEGMENT_MS + 1
            _say(f"{topic}: waiting for pass {stage + 1}")
            stats[f"pass {stage + 1} s"] += round(wait_cleaned(node.log_dir, topic, rolls))
            passes.update(p for p, offset in rolls.items() if offset > 0)
            for h in histories:
                h.model = compact(h.model, NOW, config=KEEP_TOMBSTONES)
            _check_pass(kafka, topic, histories, rolls, problems, f"pass {stage + 1}",
                        exact=False)
        for p in parts:
            for b in read_segments(node.log_dir, topic, p):
                if b.marker:
                    stats[f"{b.marker} markers after pass 2"] += 1
        for n in (3, 4):
            # the horizon stamped on the previous pass is its start + delete.retention.ms
            time.sleep(DELETE_RETENTION_MS / 1000 + 0.1)
            roll_at = max(roll_at, int(time.time() * 1000) + SEGMENT_MS + 1)
            rolls = writer.roll(parts, roll_at, roll_size)
            roll_at += SEGMENT_MS + 1
            _say(f"{topic}: waiting for pass {n}")
            stats[f"pass {n} s"] += round(wait_cleaned(node.log_dir, topic, rolls))
            passes.update(p for p, offset in rolls.items() if offset > 0)
            for h in histories:
                h.model = compact(h.model, NOW, config=DROP_TOMBSTONES)
            _check_pass(kafka, topic, histories, rolls, problems, f"pass {n}", exact=True)
        stats["committed transactions"] += writer.transactions["committed"]
        stats["aborted transactions"] += writer.transactions["aborted"]
    finally:
        writer.close()
    _check_disk(kafka, topic, histories, problems, stats)
    cleaned = cleaned_counts(node.logs, topic)
    few = [p for p in parts if cleaned.get(p, 0) < passes[p]]
    if few:
        problems.append(f"{topic}: log-cleaner.log shows fewer cleanings than passes of "
                        f"partitions {few[:10]}")
    stats["cleanings in log-cleaner.log"] += sum(cleaned.values())
    # while the parts were written (small segments), or on the cleaner's own past a horizon
    stats["cleanings besides the test's passes"] += sum(cleaned.values()) - sum(passes.values())
    stats["histories"] += len(histories)
    stats["records"] += sum(len(h.log) for h in histories)
    stats["aborted records"] += sum(r.aborted for h in histories for r in h.log)
    stats["records left"] += sum(len(visible(h.model)) for h in histories)


def _check_written(kafka: KafkaCluster, topic: str, histories: list[History],
                   work: dict[int, tuple[list[Rec], list[Unit]]],
                   offsets: dict[int, dict[int, int]], rolls: dict[int, int],
                   problems: list[str], whole: bool) -> None:
    """The model's log gets the part just written, at the offsets Kafka gave it; what a
    read_uncommitted reader reads after the last roll record is that part, in order (with
    ``whole`` nothing of it can have been cleaned yet: all of it)."""
    seen = read_partitions(kafka.bootstrap, topic, list(work), committed=False)
    for p, (log, units) in work.items():
        written = [Rec(offsets[p][i], r.key, r.value, r.timestamp, r.aborted)
                   for i, r in ((i, log[i]) for u in units for i in u.records)]
        at = {r.offset: (r.key, r.value, r.timestamp) for r in written}
        got = [(r.offset, (r.key, r.value, r.timestamp)) for r in seen[p] if r.offset > rolls[p]]
        ok = all(at.get(o) == record for o, record in got)  # each one as written there
        ok = ok and (not whole or [o for o, _ in got] == sorted(at))  # ... and all of them
        ok = ok and [r.offset for r in written] == sorted(at)  # in the history's order
        if not ok:
            problems.append(f"{topic}/{p}: read {len(got)} records back, not the "
                            f"{len(written)} written: {histories[p].repro()}")
        histories[p].model += written


def _as_tuples(records: list[LogRecord]) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp) for r in records]


def _check_pass(kafka: KafkaCluster, topic: str, histories: list[History],
                rolls: dict[int, int], problems: list[str], name: str, exact: bool) -> None:
    _say(f"{topic}: checking {name}")
    parts = list(range(len(histories)))
    committed = read_partitions(kafka.bootstrap, topic, parts, committed=True)
    everything = read_partitions(kafka.bootstrap, topic, parts, committed=False)
    for p, h in enumerate(histories):
        where = f"{topic}/{p} after {name}"
        got = _as_tuples(committed[p])
        if _as_tuples(everything[p]) != got:
            problems.append(f"{where}: aborted records still there: {h.repro()}")
        keys = Counter(r.key for r in committed[p] if r.offset < rolls[p])
        if any(n > 1 for n in keys.values()):
            problems.append(f"{where}: a key appears more than once: {h.repro()}")
        want = _as_tuples(visible(h.model))
        if not exact:  # a tombstone may go on any pass past its horizon
            left = {r[0] for r in got}
            want = [r for r in want if r[2] is not None or r[0] in left]
        if got != want:
            problems.append(f"{where}: the cleaner kept {len(got)} records, the model "
                            f"{len(want)} ({_diff(got, want)}): {h.repro()}")
        if exact:
            expected = fold(visible(h.log), NS).answer()
            if fold(committed[p], NS).answer() != expected:
                problems.append(f"{where}: fold(compacted) != fold(log): {h.repro()}")


def _diff(got: list[tuple], want: list[tuple]) -> str:
    g, w = set(got), set(want)
    return (f"only Kafka kept offsets {sorted(r[0] for r in g - w)[:8]}, only the model "
            f"{sorted(r[0] for r in w - g)[:8]}")


def _check_disk(kafka: KafkaCluster, topic: str, histories: list[History],
                problems: list[str], stats: Counter[str]) -> None:
    """The segment files after the last pass: the markers and empty batches Kafka keeps,
    and why (what no consumer shows)."""
    node = kafka.nodes[0]
    for p, h in enumerate(histories):
        where = f"{topic}/{p} on disk"
        batches = read_segments(node.log_dir, topic, p)
        data = [b for b in batches if not b.control]
        records = [r for b in data for r in b.records]
        if any(value is None for _, _, value in records):
            problems.append(f"{where}: a tombstone past its horizon is still there: "
                            f"{h.repro()}")
        visible_offsets = {r.offset for r in visible(h.model)}
        stray = [o for o, key, _ in records if o not in visible_offsets
                 and key != b"jobreg-test/roll"]
        if stray:
            problems.append(f"{where}: records at {stray[:5]} that no reader should see: "
                            f"{h.repro()}")
        last_data = {}
        for b in data:
            last_data[b.producer_id] = b.last_offset
        open_txn: dict[int, list] = {}
        for b in batches:
            if b.control:
                txn = open_txn.pop(b.producer_id, [])
                stats[f"{b.marker} markers left"] += 1
                if not txn:
                    problems.append(f"{where}: a {b.marker} marker at {b.base_offset} "
                                    f"with no batch of its transaction left: {h.repro()}")
            elif b.transactional:
                open_txn.setdefault(b.producer_id, []).append(b)
            if not b.control and not b.records:
                stats["empty batches left"] += 1
                if b.producer_id < 0 or last_data[b.producer_id] != b.last_offset:
                    problems.append(f"{where}: an empty batch at {b.base_offset} that is "
                                    f"not its producer's last: {h.repro()}")
