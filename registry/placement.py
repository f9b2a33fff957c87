"""Where a namespace lives on the topic, checked: the one place every path maps a namespace
to a partition (the client, forensics and so the CLI, ``audit check``).

A namespace lives on partition ``crc32(namespace) % N`` (:func:`registry.keys.partition_for`)
of a topic of ``N`` partitions. Adding partitions (``kafka-topics --alter --partitions``, a
routine Kafka operation) changes ``N``, and a namespace whose hash then gives another
partition would be read there: none of its records, and a claim starting at epoch 1 while its
old leader goes on writing on the old partition, two leaders fenced by nothing. Nothing in
Kafka can hold the count a namespace was written under (a topic has no free-form
configuration, Kafka refuses unknown topic configs), so the records hold it:

* every grant records the partition count its claimant mapped the namespace with and the
  partition that gave (:class:`~registry.events.LeadershipGranted` ``partitions``,
  ``partition``); grants are never compacted away (each has a key of its own);
* a namespace that has an accepted grant on the partition the current count gives lives
  there: nothing to check (a namespace whose partition did not change when partitions were
  added goes on working). The client knows this from its own fold at no cost;
* a namespace with no grant there is either new or moved. Kafka only ever adds partitions,
  so a moved namespace lives on ``crc32 % n`` for a count ``n`` the topic had before. Which
  counts it had is told by the first grant of each partition (one small read per partition
  from its start: a partition's first grant is its first namespace's first record): if
  every first grant recorded the current count (or no partition has a grant), the topic
  was never resized while it held namespaces and nothing moved, so nothing more is read.
  Otherwise the partitions the namespace would have mapped to under every count from the
  smallest recorded one (from 1 if a first grant predates recording) up to the current one
  are read to their ends, looking for a grant of the namespace: found, the path refuses with
  :class:`~registry.errors.NamespaceMoved`, which says where it was written, under which
  count, and what to do.

Cost: nothing for a namespace that has a grant on its partition (the client) beyond its own
fold; one read of each partition's first records for a new namespace and for forensics; on a
topic that was resized (or whose first grants predate recording), full reads of the
partitions the namespace could have lived on, once per new namespace.

A namespace is born (its first grant, :func:`check_birth`) only under the smallest count
the partitions' first grants recorded: a namespace born under a newer count on a partition
whose first grant recorded an older one would leave no first grant saying so, and a client
mapping with the older count (as the refusal tells people to) would not look for it.

What it does not catch: a namespace that already has grants on both its old and its new
partition (a split written before jobreg recorded counts, or by a foreign writer) is
believed where the current count puts it; ``audit run`` refuses such a namespace (it reads
every partition). A claim re-reads the topic's count before it sends its grant
(:func:`check_count`); a client connected before partitions were added keeps reading and
writing the partition it connected to (where its namespace's records are) until it claims.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .errors import CodecError, ConfigError, NamespaceMoved
from .events import LeadershipGranted
from .image import LogRecord
from .kafka_config import Kafka
from .keys import parse_key, partition_for
from .log import LogReader, topic_partitions
from .wire import Codec, default_codec

_READERS = 8  # partitions read at once

__all__ = [
    "Placement",
    "check_birth",
    "check_count",
    "check_mapping",
    "former_partitions",
    "locate",
    "verify",
]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a namespace lives: ``partition`` of ``topic``, mapped with ``partitions``.
    ``first_counts``: the counts the first grants of the topic's partitions recorded (``0``:
    not recorded), when they were read (``None``: they were not)."""

    topic: str
    namespace: str
    partitions: int
    partition: int
    first_counts: tuple[int, ...] | None = None


def former_partitions(namespace: str, partitions: int, first_grants: Iterable[int],
                      topic_count: int | None = None) -> dict[int, list[int]]:
    """The partitions other than its current one where ``namespace`` may have been written:
    partition -> the counts that put it there. ``first_grants``: the count recorded by the
    first grant of each partition that has one (``0``: not recorded). Empty when every first
    grant recorded ``partitions`` (the topic was not resized while it held namespaces).

    Kafka never removes partitions, so the counts the topic had lie between the smallest
    recorded one (1 when a first grant predates recording) and the current one; a recorded
    count above it (records copied from a larger topic, or a client that mapped with the
    topic's count while others map with a smaller one) is a candidate too, on any of the
    topic's ``topic_count`` partitions (default ``partitions``).
    """
    counts = set(first_grants)
    if not counts or counts == {partitions}:
        return {}
    low = 1 if 0 in counts else min(counts | {partitions})
    crc = zlib.crc32(namespace.encode("utf-8"))
    here = crc % partitions
    out: dict[int, list[int]] = {}
    for n in sorted(set(range(low, partitions)) | {c for c in counts if c > 0}):
        if n != partitions and (q := crc % n) != here \
                and q < (partitions if topic_count is None else topic_count):
            out.setdefault(q, []).append(n)
    return out


def _grant(record: LogRecord, codec: Codec, namespace: str | None = None
           ) -> LeadershipGranted | None:
    """The grant ``record`` holds (of ``namespace``, if given), else ``None``."""
    if record.key is None or record.value is None:
        return None
    parsed = parse_key(record.key.decode("utf-8", "replace"))
    if parsed is None or parsed.kind != "term" or record.key.endswith(b"/lease") \
            or (namespace is not None and parsed.namespace != namespace):
        return None
    try:
        event = codec.decode(record.value)
    except CodecError:
        return None
    return event if isinstance(event, LeadershipGranted) else None


def _find_grant(kafka: Kafka, topic: str, partition: int, timeout: float, codec: Codec,
                namespace: str | None) -> LeadershipGranted | None:
    """The first grant on ``partition`` (of ``namespace``, if given), reading from its start
    and stopping there."""
    reader = LogReader(kafka, topic, partition)
    batches = reader.read_to_end(timeout)
    try:
        for batch in batches:
            for record in batch:
                if (grant := _grant(record, codec, namespace)) is not None:
                    return grant
        return None
    finally:
        batches.close()  # type: ignore[attr-defined]
        reader.close()


def _moved(namespace: str, topic: str, partitions: int, found: int,
           grant: LeadershipGranted, counts: list[int]) -> NamespaceMoved:
    here = partition_for(namespace, partitions)
    under = grant.partitions if grant.partitions > 0 else None
    if under is not None:
        what = f"was written under {under} partitions of topic {topic!r} (partition {found})"
    else:  # a grant of before the count was recorded: the counts that put it there
        what = (f"was written on partition {found} of topic {topic!r}, when the topic had "
                f"{' or '.join(map(str, counts))} partitions")
    restore = str(under) if under is not None else "|".join(map(str, counts))
    return NamespaceMoved(
        f"namespace {namespace!r} {what}; the topic now has {partitions}, which maps it to "
        f"partition {here}, where none of its records are (partitions were added). Map "
        f"namespaces with the count they were written under (partitions={restore}, CLI "
        f"--partitions {restore}) or move the namespace to a new topic; see README "
        f"\"Scaling the topic\"",
        namespace=namespace, topic=topic, partitions=partitions, partition=here,
        found_partition=found, written_under=under)


def verify(kafka: Kafka, topic: str, namespace: str, partitions: int, timeout: float, *,
           here: bool | None = None, codec: Codec | None = None,
           topic_count: int | None = None) -> Placement:
    """Check that ``namespace``'s records are where ``partitions`` maps it (see the module
    docstring); return its placement or raise :class:`~registry.errors.NamespaceMoved`.

    ``here``: whether the caller folded the namespace's partition and found an accepted
    grant there (``True``: nothing is read; ``None``: not known, and on a resized topic the
    partition is read up to the namespace's first grant before other partitions are).
    Raises :class:`~registry.errors.BrokerError` when a partition cannot be read within
    ``timeout`` seconds of no progress. ``topic_count``: the topic's
    partition count, when the caller has just asked (``partitions`` may be smaller: a
    mapping pinned to the count namespaces were written under).
    """
    placement = Placement(topic, namespace, partitions, partition_for(namespace, partitions))
    if here:
        return placement
    codec = codec or default_codec()
    if topic_count is None:
        topic_count = topic_partitions(kafka, topic, timeout)
    # One reader per partition, side by side: each costs a consumer's set-up and a fetch
    # (about 10 ms here), and one after the other they added up to ~80 ms for 8 partitions.
    with ThreadPoolExecutor(max_workers=min(topic_count, _READERS)) as pool:
        firsts = [g.partitions for g in pool.map(
            lambda q: _find_grant(kafka, topic, q, timeout, codec, None), range(topic_count))
            if g is not None]
        former = sorted(former_partitions(namespace, partitions, firsts, topic_count).items())
        if former and here is None and _find_grant(kafka, topic, placement.partition, timeout,
                                                   codec, namespace) is not None:
            return placement
        found = list(pool.map(
            lambda qc: _find_grant(kafka, topic, qc[0], timeout, codec, namespace), former))
    for (q, counts), grant in zip(former, found, strict=True):
        if grant is not None:
            raise _moved(namespace, topic, partitions, q, grant, counts)
    return dataclasses.replace(placement, first_counts=tuple(firsts))


def check_birth(kafka: Kafka, topic: str, namespace: str, partitions: int, timeout: float, *,
                codec: Codec | None = None, topic_count: int | None = None) -> None:
    """Before the first grant of ``namespace`` (a claim at epoch 0): :func:`verify` again
    (a namespace created elsewhere since the client connected is found), and refuse to bring
    a namespace into being under another count than the one the topic's first namespaces
    were written under. After partitions were added, a namespace born under the new count
    on a partition whose first grant recorded the old one leaves no trace a client of the
    old count would look for: it could start the namespace a second time."""
    placement = verify(kafka, topic, namespace, partitions, timeout, here=False, codec=codec,
                       topic_count=topic_count)
    recorded = [c for c in placement.first_counts or () if c > 0]
    if recorded and min(recorded) != partitions:
        first = min(recorded)
        raise ConfigError(
            f"namespace {namespace!r} has no records yet, and the namespaces of topic "
            f"{topic!r} were first written under {first} partitions, not the {partitions} it "
            f"would be mapped with (partitions were added): a namespace born under another "
            f"count may be started a second time by clients of the first. Map with "
            f"partitions={first} (CLI --partitions {first}); see README \"Scaling the topic\"")


def locate(kafka: Kafka, topic: str, namespace: str, timeout: float, *,
           partitions: int | None = None, codec: Codec | None = None) -> Placement:
    """Where ``namespace`` lives on ``topic`` (an existing topic), checked by :func:`verify`.

    ``partitions``: the count to map namespaces with; by default the topic's. A count above
    the topic's is a :class:`~registry.errors.ConfigError`.
    """
    actual = topic_partitions(kafka, topic, timeout)
    if partitions is None:
        partitions = actual
    check_mapping(topic, partitions, actual)
    return verify(kafka, topic, namespace, partitions, timeout, codec=codec, topic_count=actual)


def check_mapping(topic: str, partitions: int, actual: int) -> None:
    """Refuse a mapping count the topic cannot serve (more partitions than it has)."""
    if not 0 < partitions <= actual:
        raise ConfigError(f"cannot map namespaces with {partitions} partitions: topic "
                          f"{topic!r} has {actual}")


def check_count(topic: str, namespace: str, partitions: int, actual: int) -> None:
    """Before a claim of a client that maps with the topic's own count: refuse when that
    count changed since the client read it (``partitions``; ``actual`` now) and the change
    moves ``namespace`` (its grant would start a second history on another partition than
    the one new clients read)."""
    if actual == partitions:
        return
    now = partition_for(namespace, actual)
    if now != partition_for(namespace, partitions):
        raise ConfigError(
            f"topic {topic!r} has {actual} partitions now, not the {partitions} this client "
            f"mapped namespace {namespace!r} with (partitions were added): the claim would "
            f"write on partition {partition_for(namespace, partitions)} while new clients "
            f"read partition {now}. Connect again (README \"Scaling the topic\")")
