"""Forensics: answer from the log alone what the registry believed, when, and why.

Every answer here is the fold (:mod:`registry.fold`) replayed over a source of
records - the broker, or an offline dump - and nothing else; no rule is
restated. A :class:`Forensics` reads one namespace from a :class:`LogSource`:

* :class:`BrokerSource` reads the namespace's partition from offset 0 to its end;
* :class:`DumpSource` reads an Avro object container file written by
  :meth:`Forensics.dump`, which embeds the writer schemas (the schema catalog),
  so it replays with no broker and on a jobreg whose own catalog is older.

**Time.** ``state_at(time=T)`` uses the record timestamps the broker assigned.
The topics jobreg creates use ``LogAppendTime``: the broker stamps each record
as it appends it, so timestamps follow log order (up to the broker clock's own
steps). The image "at T" is the image after the longest prefix of the log
whose records are all stamped at or before T: a record stamped after T ends
the prefix even if a later record carries an earlier stamp (possible only
with ``CreateTime`` topics, a broker clock stepping back, or the embedded broker, which keeps
the producer's stamp: README "What differs", Record time). The returned
image's provenance names the exact last offset it reflects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from .dumpfile import DUMP_SCHEMA, DumpReader, is_dump, write_dump
from .errors import ConfigError, DamagedDump
from .events import GraphRef, JobStatus
from .files import atomic_write
from .fold import fold_batches
from .image import Decision, Image, JobView, LogRecord, Outcome, TermInfo
from .kafka_config import Kafka
from .keys import check_id
from .log import LogReader
from .placement import locate
from .wire import Catalog, Codec, default_codec

__all__ = [
    "DUMP_SCHEMA",
    "BrokerSource",
    "DumpSource",
    "Forensics",
    "LogSource",
    "TermSummary",
    "term_duration",
]

_BATCH = 1000


class LogSource(Protocol):
    """Where forensics reads records from, in log order, in batches."""

    def batches(self) -> Iterator[list[LogRecord]]:
        """Every record of the source, oldest first."""
        ...

    def codec(self) -> Codec:
        """The codec that decodes this source's values."""
        ...

    def fraction_read(self) -> float | None:
        """How much of the source the current :meth:`batches` has read, 0..1 (``None``:
        unknown). Only for progress bars."""
        ...


Progress = Callable[[int, "float | None"], None]
"""``progress(records_read, fraction_read)``, called after each batch a replay reads."""


class BrokerSource:
    """One partition of a topic on a broker, read from offset 0 to its end as of the start
    of each read.

    ``timeout`` bounds how long a read may go without progress (not the whole
    read: a million records take longer than any sensible timeout); a broker
    that stops answering raises :class:`~registry.errors.BrokerError` after it.
    """

    def __init__(self, bootstrap: str | Kafka, topic: str, partition: int,
                 timeout: float = 10.0, codec: Codec | None = None) -> None:
        self.bootstrap, self.topic, self.partition = bootstrap, topic, partition
        self.timeout = timeout
        self._codec = codec
        self._read = 0
        self._end: int | None = None

    def batches(self) -> Iterator[list[LogRecord]]:
        reader = LogReader(self.bootstrap, self.topic, self.partition)
        try:
            # The end offset only sizes the progress bar; the end-of-partition event
            # ends the read (LogReader explains why the offset cannot).
            self._read, self._end = 0, reader.end_offset(self.timeout)
            for batch in reader.read_to_end(self.timeout):
                self._read = batch[-1].offset + 1
                yield batch
        finally:
            reader.close()

    def codec(self) -> Codec:
        return self._codec or default_codec()

    def fraction_read(self) -> float | None:
        return min(1.0, self._read / self._end) if self._end else None


class DumpSource:
    """A dump file written by :meth:`Forensics.dump` (:mod:`registry.dumpfile` says what a
    damaged one does: :class:`~registry.errors.DamagedDump`, after the records before the
    damage)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._reader = DumpReader(self.path)
        self._size = 1
        self._reading = False
        meta = self._reader.metadata
        self.namespace = meta["jobreg.namespace"]
        self.topic = meta["jobreg.topic"]
        try:
            self._catalog = Catalog.from_dict(json.loads(meta["jobreg.catalog"]))
        except json.JSONDecodeError as e:
            raise DamagedDump(f"{self.path}: damaged header: its schema catalog "
                              f"(jobreg.catalog) is not JSON at char {e.pos}") from e
        except Exception as e:  # valid JSON that is not a catalog: its parts raise anything
            raise DamagedDump(f"{self.path}: damaged header: its schema catalog "
                              "(jobreg.catalog) is not a catalog") from e

    def batches(self) -> Iterator[list[LogRecord]]:
        self._size = max(1, self.path.stat().st_size)
        self._reading = True
        batch: list[LogRecord] = []
        try:
            for rec in self._reader.records():
                batch.append(rec)
                if len(batch) >= _BATCH:
                    yield batch
                    batch = []
        except DamagedDump:
            if batch:  # the records before the damage first: a read that stops there may
                yield batch  # be answered (state --offset before the damage)
            raise
        finally:
            self._reading = False
        if batch:
            yield batch

    def codec(self) -> Codec:
        # The writer schemas the dump carries: newer than ours, perhaps.
        return Codec(self._catalog)

    def fraction_read(self) -> float | None:
        return min(1.0, self._reader.position / self._size) if self._reading else None


class Scan(NamedTuple):
    """One read of the source: the final image, every verdict in log order (SKIPPED
    ones left out; a call's record with its final verdict) and every term, oldest first."""

    image: Image
    decisions: list[Decision]
    terms: list[TermInfo]


@dataclass(frozen=True)
class TermSummary:
    """One leadership term as the log tells it.

    ``started`` says how it began (``granted``, with its lease if any);
    ``ended`` how it ended (``revoked at N``, ``superseded by epoch E at N``,
    or ``current``); ``first_offset``/``last_offset`` bound the records of
    the term (its grant to its last record); ``accepted``/``rejected`` count
    the writes that carried its epoch. The same, structured: ``lease_ms`` (``None``:
    no lease), ``end`` (``revoked``, ``superseded`` or ``current``), ``end_offset``
    (the revoke or the next grant; ``None`` while current) and ``next_epoch`` (the
    term that superseded it).

    **Times** are the record times of the log (``LogRecord.timestamp``, ms since the Unix
    epoch; the module docstring says what they mean): ``started_at`` the grant's,
    ``ended_at`` the revoke's or the next grant's (``None`` while current), and
    ``duration_ms`` the one less the other. ``None`` where a record carries no time (a
    source that gives none) and, for ``duration_ms``, while the term is current or when its
    end is stamped before its start (a producer's skewed clock on a ``CreateTime`` broker):
    an unknown time is said so, never guessed.
    """

    epoch: int
    leader: str
    started: str
    ended: str
    first_offset: int
    last_offset: int
    accepted: int
    rejected: int
    lease_ms: int | None = None
    end: str = "current"
    end_offset: int | None = None
    next_epoch: int | None = None
    started_at: int | None = None
    ended_at: int | None = None
    duration_ms: int | None = None


def term_duration(started_at: int | None, ended_at: int | None) -> int | None:
    """How long a term lasted by its records' times (ms), or ``None``: a time unknown, the
    term not ended, or its end stamped before its start (no negative duration is shown)."""
    if started_at is None or ended_at is None or ended_at < started_at:
        return None
    return ended_at - started_at


class DumpCount(int):
    """How many records a dump holds (an ``int``), and the offsets of its first and last
    (``None`` for an empty dump). Offsets are not dense: each transaction's commit marker
    takes an offset of its own, and other namespaces' records on the partition take theirs,
    so a dump of 17 records may span offsets 1 to 28."""

    first_offset: int | None
    last_offset: int | None

    def __new__(cls, count: int, first_offset: int | None = None,
                last_offset: int | None = None) -> DumpCount:
        self = super().__new__(cls, count)
        self.first_offset, self.last_offset = first_offset, last_offset
        return self


class NoRecords(ConfigError):
    """The namespace has no record in the source at all (a mistyped ``--namespace``?)."""

    def __init__(self, namespace: str, topic: str | None) -> None:
        where = f" on topic {topic!r}" if topic else ""
        super().__init__(f"namespace {namespace!r} has no records{where}")
        self.namespace, self.topic = namespace, topic


def namespaces_on(bootstrap: str | Kafka, topic: str, timeout: float = 10.0) -> list[str]:
    """The namespaces that have records on ``topic``: every partition read to its end, keys
    only. For an error message that must say which namespaces there are."""
    from .keys import parse_key
    from .log import topic_partitions

    found: set[str] = set()
    for partition in range(topic_partitions(bootstrap, topic, timeout)):
        reader = LogReader(bootstrap, topic, partition)
        try:
            for batch in reader.read_to_end(timeout):
                for r in batch:
                    parsed = parse_key(r.key.decode("utf-8", "replace")) if r.key else None
                    if parsed is not None:
                        found.add(parsed.namespace)
        finally:
            reader.close()
    return sorted(found)


class Forensics:
    """Read-only questions about one namespace, answered by replaying the fold over a source.

    With ``require_records``, a full replay of a namespace that has no record at all in the
    source raises :class:`NoRecords` (the CLI's guard against a mistyped namespace).
    """

    def __init__(self, source: LogSource, namespace: str, *,
                 progress: Progress | None = None, require_records: bool = False) -> None:
        self.source = source
        self.namespace = check_id("namespace", namespace)
        self.require_records = require_records
        self.progress = progress
        """Called after each batch of every read (a progress bar, say)."""

    @classmethod
    def from_broker(cls, kafka: Kafka, topic: str, namespace: str, timeout: float, *,
                    progress: Progress | None = None, require_records: bool = False,
                    partitions: int | None = None) -> Forensics:
        """Forensics over ``namespace``'s log on the broker: the partition it hashes to among
        the topic's partitions (asked of the broker; ``partitions``: another count to map
        with), checked by :func:`registry.placement.locate` (a namespace whose records lie
        on another partition raises :class:`~registry.errors.NamespaceMoved`)."""
        placement = locate(kafka, topic, namespace, timeout, partitions=partitions)
        source = BrokerSource(kafka, topic, placement.partition, timeout)
        return cls(source, namespace, progress=progress, require_records=require_records)

    def _batches(self) -> Iterator[list[LogRecord]]:
        read = 0
        for batch in self.source.batches():
            yield batch
            read += len(batch)
            if self.progress is not None:
                fraction = getattr(self.source, "fraction_read", None)
                self.progress(read, fraction() if fraction is not None else None)

    def replay(self, *, until_offset: int | None = None, until_time: int | None = None,
               on_decision: Callable[[Decision], None] | None = None,
               on_term: Callable[[TermInfo], None] | None = None) -> Image:
        """Fold the source from the start, stopping after ``until_offset`` or before the
        first record stamped after ``until_time`` (ms since the Unix epoch); the callbacks
        see every verdict and every change of a term (:func:`registry.fold.fold_batches`)."""
        def cut() -> Iterator[list[LogRecord]]:
            for batch in self._batches():
                keep = []
                for r in batch:
                    if until_offset is not None and r.offset > until_offset:
                        break
                    if until_time is not None and r.timestamp is not None \
                            and r.timestamp > until_time:
                        break
                    keep.append(r)
                if keep:
                    yield keep
                if len(keep) < len(batch):
                    return

        image = fold_batches(cut(), Image.empty(self.namespace), self.source.codec(),
                             on_decision, on_term)
        if self.require_records and until_offset is None and until_time is None \
                and not image.recent_ids and not image.quarantined:
            # Every record of the namespace leaves its id (rule 1) or a quarantine entry.
            raise NoRecords(self.namespace, getattr(self.source, "topic", None))
        return image

    def state_at(self, offset: int | None = None, time: int | None = None) -> Image:
        """The image after the last record at or before ``offset``, or stamped at or before
        ``time`` (ms; see the module docstring for what time means). Exactly one of them."""
        if (offset is None) == (time is None):
            raise ConfigError("give exactly one of offset and time")
        if offset is not None and offset < -1:
            raise ConfigError(f"offset must be >= -1, not {offset}")
        return self.replay(until_offset=offset, until_time=time)

    def decisions(self) -> list[Decision]:
        """The fold's verdict on every record of the namespace, in log order."""
        return self.scan().decisions

    def scan(self) -> Scan:
        """The final image, every verdict (SKIPPED ones left out) and every term, from one
        read of the source: the other questions are answered from this."""
        out: dict[int, Decision] = {}
        terms: dict[int, TermInfo] = {}

        def note(d: Decision) -> None:
            if d.outcome not in (Outcome.SKIPPED, Outcome.COLLECTED):
                out[d.offset] = d  # a call's record: its final verdict replaces PENDING

        def term(info: TermInfo) -> None:
            terms[info.epoch] = info

        image = self.replay(on_decision=note, on_term=term)
        return Scan(image, sorted(out.values(), key=lambda d: d.offset),
                    [terms[e] for e in sorted(terms)])

    def rejected(self) -> list[Decision]:
        """Every record the fold refused, in log order, with reason and epochs."""
        return [d for d in self.decisions() if d.outcome == Outcome.REJECTED]

    def quarantined(self) -> list[Decision]:
        """Every record the fold could not decode, in log order."""
        return [d for d in self.decisions() if d.outcome == Outcome.QUARANTINED]

    def timeline(self, job_id: str) -> list[Decision]:
        """Every record about ``job_id``, in log order, with the fold's verdict."""
        return self.job_history(job_id)[1]

    def job_history(self, job_id: str) -> tuple[Image, list[Decision]]:
        """The final image and the job's timeline, from one read of the source."""
        check_id("job id", job_id)
        found = self.scan()
        return found.image, [d for d in found.decisions if d.job_id == job_id]

    def terms(self) -> list[TermSummary]:
        """Every leadership term: who, how and when it started and ended, its span, duration
        and write counts."""
        return self.terms_from(self.scan())

    @staticmethod
    def terms_from(found: Scan) -> list[TermSummary]:
        """:meth:`terms` from a :meth:`scan` already made."""
        decisions, terms = found.decisions, found.terms
        counts: dict[int, list[int]] = {}
        last: dict[int, int] = {}
        # Every record's time (the grants and revokes among them); a negative stamp is
        # Kafka's "no timestamp" (-1), not a time.
        stamp = {d.offset: d.timestamp for d in decisions
                 if d.timestamp is not None and d.timestamp >= 0}
        for d in decisions:
            # a duplicate is neither: it is a copy of a record counted already
            if d.epoch is None or d.event_type == "LeadershipGranted" \
                    or d.outcome == Outcome.DUPLICATE:
                continue
            c = counts.setdefault(d.epoch, [0, 0])
            c[0 if d.accepted else 1] += 1
            if d.accepted:
                last[d.epoch] = d.offset
        out = []
        for i, info in enumerate(terms):
            epoch = info.epoch
            nxt = terms[i + 1] if i + 1 < len(terms) else None
            if info.revoked_offset is not None:
                end, end_offset = "revoked", info.revoked_offset
                ended = f"revoked at {info.revoked_offset}"
            elif nxt is not None:
                end, end_offset = "superseded", nxt.granted_offset
                ended = f"superseded by epoch {nxt.epoch} at {nxt.granted_offset}"
            else:
                end, end_offset = "current", None
                ended = "current"
            started = "granted" + (f", lease {info.lease_ms} ms" if info.lease_ms else "")
            accepted, rejected = counts.get(epoch, [0, 0])
            started_at = stamp.get(info.granted_offset)
            ended_at = stamp.get(end_offset) if end_offset is not None else None
            out.append(TermSummary(epoch, info.leader, started, ended, info.granted_offset,
                                   max(last.get(epoch, info.granted_offset),
                                       info.revoked_offset or info.granted_offset),
                                   accepted, rejected, info.lease_ms, end, end_offset,
                                   nxt.epoch if end == "superseded" and nxt else None,
                                   started_at, ended_at, term_duration(started_at, ended_at)))
        return out

    def explain(self, job_id: str) -> str:
        """A short account, for people, of why the job is in its current state."""
        image, timeline = self.job_history(job_id)
        return self.explain_from(image, timeline, job_id)

    def explain_from(self, image: Image, timeline: list[Decision], job_id: str) -> str:
        """:meth:`explain` from a final image and the job's timeline already read."""
        view = image.jobs.get(job_id)
        accepted = [d for d in timeline if d.accepted]
        if view is None:
            lines = [f"job {job_id!r} is not in namespace {self.namespace!r}"
                     + (f"; {len(timeline)} record(s) mention it." if timeline else ".")]
            lines += [f"At offset {d.offset} {d.writer} (epoch {d.epoch}) reasserted that it "
                      "does not exist (a refused call had named it)." for d in accepted
                      if d.event_type == "JobReasserted"]
        else:
            lines = [f"job {job_id!r} is {view.status}"
                     + (f", held by epoch {view.owner_epoch}" if view.owner_epoch else "")
                     + (f" (recovery failed: {view.error})" if view.error else "")
                     + (f" (reason: {view.reason})" if view.reason else "") + "."]
        if view is not None:
            lines += _story(view, accepted)
        refused = [d for d in timeline if d.outcome == Outcome.REJECTED]
        for d in refused:
            lines.append(f"Refused at offset {d.offset}: {d.event_type} by {d.writer} "
                         f"(epoch {d.epoch}): {d.reason} - {d.detail}.")
        ignored = [d for d in timeline if d.outcome == Outcome.IGNORED]
        if ignored:
            lines.append(f"{len(ignored)} record(s) were kept but ignored: "
                         + "; ".join(d.detail for d in ignored) + ".")
        return "\n".join(lines)

    def dump(self, path: str | os.PathLike[str], *, topic: str = "",
             force: bool = False) -> DumpCount:
        """Write the namespace's records to an Avro object container file; return how many
        (a :class:`DumpCount`: an ``int`` that also says which offsets they span).

        The file embeds the writer schemas (the schema catalog) so that
        :class:`DumpSource` replays it anywhere. Written atomically
        (:func:`registry.files.atomic_write`), so a reader never sees half a dump, with the
        permissions the umask gives; an existing file at ``path`` is replaced only if it is
        a jobreg dump, or with ``force``.
        """
        from .keys import parse_key

        catalog = self.source.codec().catalog
        count, first, last = 0, None, None

        def records() -> Iterator[dict[str, Any]]:
            nonlocal count, first, last
            for batch in self._batches():
                for r in batch:
                    key = r.key.decode("utf-8", "replace") if r.key is not None else None
                    parsed = parse_key(key) if key is not None else None
                    if parsed is not None and parsed.namespace != self.namespace:
                        continue  # another namespace on the same partition
                    count += 1
                    first = r.offset if first is None else first
                    last = r.offset
                    yield {"partition": r.partition, "offset": r.offset,
                           "timestamp": r.timestamp, "key": r.key, "value": r.value}

        meta = {"jobreg.namespace": self.namespace, "jobreg.topic": topic,
                "jobreg.catalog": json.dumps(catalog.to_dict())}
        with atomic_write(path, "dump", replaceable=is_dump, force=force) as f:
            write_dump(f, meta, records())
        return DumpCount(count, first, last)


_ENDS = ("JobCancelled", "JobTerminated")
_RESTATEMENTS = ("JobReasserted", "JobCleanedUp")


def _by(d: Decision) -> str:
    return f"at offset {d.offset} by {d.writer} (epoch {d.epoch})"


def _story(view: JobView, accepted: list[Decision]) -> list[str]:
    """How the job got to its state, by the records that decided it: its submit, what ended
    it (not a reassertion that restated it), the reassertions as such, and its result."""
    lines: list[str] = []
    submits = [d for d in accepted if d.event_type == "JobSubmitted"]
    if submits:
        lines.append(f"It was submitted {_by(submits[0])}.")
    elif accepted:
        lines.append("Its submit is no longer in the log (the cleaner removed it).")
    deciding = [d for d in accepted if d.event_type not in _RESTATEMENTS]
    if not view.live:
        ends = [d for d in deciding if d.event_type in _ENDS]
        if ends:
            verb = ("cancelled" if view.status == JobStatus.CANCELLED
                    else f"ended as {view.status}")
            lines.append(f"It was {verb} {_by(ends[-1])}"
                         + (f": {view.reason}" if view.reason else "") + ".")
        elif accepted:
            lines.append("The record that ended it is no longer in the log (the cleaner "
                         "removed it); the records below restate it.")
    elif deciding and deciding[-1] is not (submits[0] if submits else None):
        last = deciding[-1]
        lines.append(f"Its state was last set {_by(last)}: {last.event_type}.")
    lines += _checkpoint_story(view, accepted)
    restated = [d for d in accepted if d.event_type == "JobReasserted"]
    if restated:
        lines.append(f"The leader restated its state {len(restated)} time(s) (JobReasserted "
                     f"at offset(s) {', '.join(str(d.offset) for d in restated)}), after "
                     "records it did not accept landed on its keys.")
    if not view.live:
        lines.append(_result(view, [d for d in accepted if d.event_type == "JobCleanedUp"]))
    return lines


def _checkpoint_story(view: JobView, accepted: list[Decision]) -> list[str]:
    """Restarts, and a checkpoint failure budget that is exhausted: which failures count."""
    lines: list[str] = []
    restarts = [d for d in accepted if d.event_type == "JobRestarted"]
    if restarts:
        last = restarts[-1]
        lines.append(f"It was restarted {len(restarts)} time(s), the last {_by(last)}"
                     + (f" ({last.detail})" if last.detail else "")
                     + "; a restart starts its count of checkpoint failures afresh.")
    if view.over_budget:
        resets = ("CheckpointCompleted", "JobRestarted")
        since = max((i for i, d in enumerate(accepted) if d.event_type in resets), default=-1)
        counted = [d for d in accepted[since + 1:] if d.event_type == "CheckpointFailed"
                   and d.outcome == Outcome.ACCEPTED]
        fail = view.checkpoints.consecutive_failures
        lines.append(f"Its checkpoint failures are over budget: {fail} counted since the last "
                     f"completed checkpoint or restart, {view.max_checkpoint_failures} "
                     "tolerated (Flink's tolerable-failed-checkpoints). Flink would fail over "
                     "the job here: its leader should restart it (JobRestarted) or end it."
                     + (" The counted failures: " + "; ".join(
                         f"offset {d.offset}" + (f" ({d.detail})" if d.detail else "")
                         for d in counted[-5:]) + ("" if len(counted) <= 5 else
                                                   f" (the last 5 of {len(counted)})") + "."
                        if counted else ""))
    return lines


def _result(view: JobView, cleaned: list[Decision]) -> str:
    if view.dirty:
        graph = view.graph
        what = (f"its graph {graph.uri}" if isinstance(graph, GraphRef)
                else "its graph (inline)" if graph is not None else "no graph")
        cps = view.checkpoints.retained
        return (f"Its result is dirty: its cleanup is not done yet; it holds {what} and "
                f"{len(cps)} retained checkpoint(s)"
                + (f" ({', '.join(c.location for c in cps)})" if cps else "") + ".")
    if cleaned:
        return f"Its result was marked clean {_by(cleaned[0])}."
    return ("Its result is clean; no JobCleanedUp is in the log (the results of jobs that "
            "ended before jobreg kept results are clean).")
