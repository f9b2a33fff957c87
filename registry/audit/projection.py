"""The audit projection: the library's fold, turned into rows of the audit tables.

One :class:`AuditProjection` follows a whole topic (every partition, every
namespace on it). For each batch of records it runs :class:`registry.fold.Delta`
- the same code every client runs, no rule restated - and turns each verdict and
the state it left into rows (:class:`BatchRows`) for :mod:`registry.audit.models`.

The projection never changes its own state while it computes a batch: the new
state travels in the :class:`BatchRows` and becomes current only through
:meth:`AuditProjection.advance`, which the writer calls after the database
committed the rows and the progress together. A batch that fails to commit
leaves the projection where it was, so the same records can be projected again.

Routing: a record belongs to the namespace its key names; a record whose key
names none (a foreign or corrupt key) belongs to the namespace its event names
if it decodes; otherwise it is quarantined with no namespace (such a record is
quarantined by every client of its partition too, but they do not agree on
which namespace to blame, so the audit blames none).
"""

from __future__ import annotations

import functools
import gc
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..errors import CodecError
from ..events import (
    UNKNOWN_CHECKPOINT,
    CheckpointCompleted,
    CheckpointDiscarded,
    CheckpointEvent,
    CheckpointFailed,
    CheckpointTriggered,
    Event,
    GraphRef,
    InlineGraph,
    JobRestarted,
)
from ..fold import Delta, bulk
from ..image import Decision, Image, LogRecord, Outcome, TermInfo
from ..keys import parse_key
from ..wire import Codec, default_codec
from .db import AuditError

__all__ = ["REFOLD_CHUNK", "AuditProjection", "BatchRows", "UnreadableState", "decode_state",
           "encode_state"]

REFOLD_CHUNK = 5000
"""Records per fold step of :meth:`AuditProjection.refolded`."""

_CHECKPOINT_STATUS = {CheckpointTriggered: "TRIGGERED", CheckpointCompleted: "COMPLETED",
                      CheckpointFailed: "FAILED", CheckpointDiscarded: "DISCARDED"}


@dataclass
class _State:
    """What the projection carries from batch to batch (all rebuilt by replaying the log)."""

    images: dict[str, Image] = field(default_factory=dict)
    counts: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # accepted, rejected
    term_times: dict[tuple[str, int], list[int | None]] = field(default_factory=dict)
    next_offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    terms: dict[tuple[str, int], TermInfo] = field(default_factory=dict)  # every term seen
    # namespace -> its waiting call members' events by offset (rule 8), decoded once. A
    # cache, shared by copies: an entry is always the event of the record at its offset,
    # and a missing one is decoded again.
    members: dict[str, dict[int, Event]] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(dict(self.images), {k: list(v) for k, v in self.counts.items()},
                      {k: list(v) for k, v in self.term_times.items()}, dict(self.next_offsets),
                      dict(self.terms), self.members)


@dataclass
class BatchRows:
    """The rows one batch adds or replaces, and the state they leave the projection in."""

    records: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    terms: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    """Full rows, replaced whole on conflict."""
    checkpoint_failures: list[dict[str, Any]] = field(default_factory=list)
    """Ignored failures of checkpoints without a full row in this batch: on conflict only
    ``counted``, ``ignored_reason``, ``failure_reason`` and ``last_offset`` change."""
    progress: dict[int, int] = field(default_factory=dict)
    """partition -> the first offset not reflected, for the partitions this batch read."""
    namespaces: set[str] = field(default_factory=set)
    """The namespaces whose state this batch changed (their snapshots must be rewritten)."""
    state: _State | None = None

    def __len__(self) -> int:
        return len(self.records)


class UnreadableState(AuditError):
    """A namespace's stored state (``audit_snapshots``) cannot be read."""


class AuditProjection:
    """Folds one topic into audit rows, batch by batch (see the module docstring)."""

    def __init__(self, topic: str, codec: Codec | None = None,
                 loader: Callable[[str], bytes | None] | None = None,
                 repair: Callable[[str, str], bytes] | None = None) -> None:
        self.topic = topic
        self.codec = codec or default_codec()
        self.loader = loader
        """Called with a namespace :meth:`project` meets for the first time; returns its
        state (:func:`encode_state`) as of the projection's offsets, or ``None`` (new)."""
        self.repair = repair
        """Called with a namespace and why the state :attr:`loader` gave cannot be read
        (damaged, or in a format this version does not know); returns the state to use
        instead (refolded from the log). Without it such a state raises
        :class:`UnreadableState`."""
        self._state = _State()

    @property
    def next_offsets(self) -> dict[int, int]:
        """partition -> the first offset the projection has not folded yet."""
        return dict(self._state.next_offsets)

    def image(self, namespace: str) -> Image:
        """The fold's image of ``namespace`` as far as the projection has read."""
        return self._state.images.get(namespace) or Image.empty(namespace)

    def namespaces(self) -> list[str]:
        """Every namespace seen so far."""
        return sorted(self._state.images)

    def term_counts(self, namespace: str, epoch: int) -> tuple[int, int]:
        """(accepted, rejected) writes carrying ``epoch`` in ``namespace``."""
        c = self._state.counts.get((namespace, epoch), [0, 0])
        return c[0], c[1]

    def start_at(self, next_offsets: dict[int, int]) -> None:
        """Say where the database's progress is, before replaying up to it."""
        self._state.next_offsets = dict(next_offsets)

    def project(self, records: Iterable[LogRecord]) -> BatchRows:
        """The rows for ``records`` (any partitions; each partition's records in offset
        order). Records below a partition's next offset were projected already and are
        skipped, so a batch replayed after a crash adds nothing twice."""
        state = self._state.copy()
        out = BatchRows(state=state)
        deltas: dict[str, Delta] = {}
        touched_jobs: dict[tuple[str, str], tuple[int, int | None]] = {}
        touched_terms: set[tuple[str, int]] = set()
        checkpoints: dict[tuple[str, str, int], dict[str, Any]] = {}
        with bulk():
            for r in records:
                done = state.next_offsets.get(r.partition, 0)
                if r.offset < done:
                    continue
                state.next_offsets[r.partition] = r.offset + 1
                out.progress[r.partition] = r.offset + 1
                ns = self._namespace_of(r)
                if ns is None:
                    self._orphan(r, out)
                    continue
                delta = deltas.get(ns)
                if delta is None:
                    if ns not in state.images and self.loader is not None:
                        data = self.loader(ns)
                        if data is not None:
                            self._load(state, ns, data)
                    delta = deltas[ns] = Delta(
                        state.images.get(ns) or Image.empty(ns), self.codec,
                        functools.partial(_note_term, state.terms, ns),
                        members=state.members.setdefault(ns, {}))
                d = delta.replay(r)
                if d.outcome in (Outcome.SKIPPED, Outcome.COLLECTED):
                    continue
                # A call's records get their rows when the fold decides them (rule 8): at
                # the commit, or when the term ends without one; a waiting one has none yet.
                for mr, md, me in delta.resolved:
                    self._record(mr, ns, md, me, delta, out, state, touched_jobs,
                                 touched_terms, checkpoints)
                if d.outcome == Outcome.PENDING:
                    continue
                self._record(r, ns, d, delta.last_event, delta, out, state, touched_jobs,
                             touched_terms, checkpoints)
        for ns, delta in deltas.items():
            state.images[ns] = delta.apply()
        out.namespaces = set(deltas)
        for (ns, job_id), (offset, stamp) in touched_jobs.items():
            view = state.images[ns].jobs.get(job_id)
            if view is not None:
                out.jobs.append(_job_row(ns, view, offset, stamp))
        for ns, epoch in touched_terms:
            info = state.terms.get((ns, epoch))
            if info is not None:
                acc, rej = state.counts.get((ns, epoch), [0, 0])
                granted_at, revoked_at = state.term_times.get((ns, epoch), [None, None])
                out.terms.append({
                    "namespace": ns, "epoch": epoch, "leader": info.leader,
                    "granted_offset": info.granted_offset, "revoked_offset": info.revoked_offset,
                    "lease_ms": info.lease_ms, "renewals": info.renewals,
                    "accepted_writes": acc, "rejected_writes": rej,
                    "granted_at": granted_at, "revoked_at": revoked_at})
        for row in checkpoints.values():
            (out.checkpoint_failures if row.pop("_partial") else out.checkpoints).append(row)
        return out

    def state_of(self, namespace: str, rows: BatchRows | None = None) -> bytes:
        """``namespace``'s state (:func:`encode_state`) as ``rows`` leave it (as it is now
        when ``rows`` is ``None``)."""
        state = rows.state if rows is not None and rows.state is not None else self._state
        return encode_state(state, namespace)

    def resume(self, state: _State | None) -> None:
        """Continue from ``state`` (what :meth:`state_after` gave for the batch before):
        a worker's cache, valid only at the same offsets."""
        if state is not None:
            self._state = state

    @staticmethod
    def state_after(rows: BatchRows) -> _State | None:
        """The whole state ``rows`` leave the projection in (for :meth:`resume`)."""
        return rows.state

    def adopt(self, namespace: str, data: bytes) -> None:
        """Take ``namespace``'s state from :func:`encode_state` (a snapshot, or a cache)."""
        _load(self._state, namespace, data)

    def advance(self, rows: BatchRows) -> None:
        """Make the state ``rows`` computed current: call after the rows were committed."""
        if rows.state is not None:
            self._state = rows.state
            # The images are large, acyclic and long-lived: move them out of the cyclic
            # collector's sight, or every full collection walks them again (reference
            # counting still frees what the next state no longer shares).
            gc.freeze()

    def replay(self, records: Iterable[LogRecord]) -> None:
        """Fold records that are already in the database (a restart catching up)."""
        self.advance(self.project(records))

    @classmethod
    def refolded(cls, topic: str, records: Iterable[LogRecord]) -> AuditProjection:
        """A projection that folded ``records`` (a partition's log from its start) afresh,
        :data:`REFOLD_CHUNK` records at a time: the rows of a whole long partition are never
        held at once."""
        projection = cls(topic)
        projection.start_at({})
        it = iter(records)
        while chunk := list(islice(it, REFOLD_CHUNK)):
            projection.replay(chunk)
        return projection

    # -- internals ------------------------------------------------------------------

    def _load(self, state: _State, ns: str, data: bytes) -> None:
        """Take ``ns``'s stored state, or what :attr:`repair` gives when it cannot be read."""
        try:
            _load(state, ns, data)
        except Exception as e:  # anything a damaged or unknown encoding raises in decoding
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
            if self.repair is None:
                raise UnreadableState(f"the stored state of namespace {ns!r} cannot be "
                                      f"read ({reason})") from None
            _load(state, ns, self.repair(ns, reason))

    def _namespace_of(self, r: LogRecord) -> str | None:
        if r.key is not None:
            try:
                parsed = parse_key(r.key.decode("utf-8"))
            except UnicodeDecodeError:
                parsed = None
            if parsed is not None:
                return parsed.namespace
        if r.value is None:
            return None
        try:
            return self.codec.decode(r.value).namespace
        except CodecError:
            return None

    def _orphan(self, r: LogRecord, out: BatchRows) -> None:
        key = r.key.decode("utf-8", "replace") if r.key is not None else None
        if r.value is None:
            reason, detail = "tombstone", "a record without a value and without a namespace key"
        else:
            reason = "undecodable"
            try:
                self.codec.decode(r.value)
                detail = "decodes, but names no namespace jobreg can place"
            except CodecError as e:
                detail = str(e)
        detail = f"{detail} (key {key!r})"
        out.records.append(_record_row(self.topic, r, None, Decision(
            r.offset, Outcome.QUARANTINED, r.timestamp, key, reason=reason, detail=detail),
            None, None))
        out.quarantine.append({"topic": self.topic, "partition": r.partition,
                               "offset": r.offset, "namespace": None, "key": key,
                               "value": r.value, "reason": reason, "detail": detail,
                               "log_time": r.timestamp})

    def _record(self, r: LogRecord, ns: str, d: Decision, event: Any, delta: Delta,
                out: BatchRows, state: _State,
                touched_jobs: dict[tuple[str, str], tuple[int, int | None]],
                touched_terms: set[tuple[str, int]],
                checkpoints: dict[tuple[str, str, int], dict[str, Any]]) -> None:
        view = delta.job(d.job_id) if d.job_id is not None else None
        out.records.append(_record_row(self.topic, r, ns, d, event,
                                       view.status if view is not None else None))
        if d.outcome == Outcome.QUARANTINED:
            out.quarantine.append({"topic": self.topic, "partition": r.partition,
                                   "offset": r.offset, "namespace": ns, "key": d.key,
                                   "value": r.value, "reason": d.reason, "detail": d.detail,
                                   "log_time": r.timestamp})
            return
        if d.epoch is not None and d.outcome != Outcome.DUPLICATE:
            if d.event_type == "LeadershipGranted":
                if d.accepted:
                    state.term_times[(ns, d.epoch)] = [r.timestamp, None]
            else:
                c = state.counts.setdefault((ns, d.epoch), [0, 0])
                c[0 if d.accepted else 1] += 1
                if d.accepted and d.event_type == "LeadershipRevoked":
                    state.term_times.setdefault((ns, d.epoch), [None, None])[1] = r.timestamp
            touched_terms.add((ns, d.epoch))
        # A record about no job (a grant, a revoke, a renewal, a call's commit, Flink's
        # leader information: fold rule 9) has its row in audit_records and counts in its
        # term; leader information has no table of its own, deliberately: it is the
        # current term's only (the stored image holds it), and its history is those rows.
        if not d.accepted or d.job_id is None:
            return
        if d.outcome == Outcome.ACCEPTED:
            touched_jobs[(ns, d.job_id)] = (r.offset, r.timestamp)
        if isinstance(event, CheckpointEvent) and not isinstance(event, JobRestarted) \
                and view is not None:
            self._checkpoint(ns, d, event, view, checkpoints)

    @staticmethod
    def _checkpoint(ns: str, d: Decision, event: CheckpointEvent, view: Any,
                    checkpoints: dict[tuple[str, str, int], dict[str, Any]]) -> None:
        key = (ns, event.job_id, event.checkpoint_id)
        row = checkpoints.get(key)
        if d.outcome == Outcome.IGNORED:
            # an ignored failure changes nothing but what the row says about the failure
            if row is None:
                row = checkpoints[key] = {
                    "namespace": ns, "job_id": event.job_id,
                    "checkpoint_id": event.checkpoint_id, "status": "FAILED",
                    "location": None, "_partial": True}
            row.update(counted=False, ignored_reason=d.detail, last_offset=d.offset,
                       failure_reason=_failure_reason(event))
            return
        status = _CHECKPOINT_STATUS.get(type(event))
        if status is None:
            # a kind of checkpoint record with no row of its own: its row in audit_records
            # (and so in job_history) says what it was
            return
        counted = None
        if status == "FAILED":  # a failure in the trigger phase (id -1) counted if accepted
            counted = (event.checkpoint_id in view.checkpoints.counted
                       or event.checkpoint_id == UNKNOWN_CHECKPOINT)
        checkpoints[key] = {
            "namespace": ns, "job_id": event.job_id, "checkpoint_id": event.checkpoint_id,
            "status": status, "counted": counted, "ignored_reason": None,
            "location": getattr(event, "location", None),
            "failure_reason": _failure_reason(event),
            "last_offset": d.offset, "_partial": False}


def _note_term(terms: dict[tuple[str, int], TermInfo], ns: str, term: TermInfo) -> None:
    """Keep a term of ``ns`` the fold tells of (its ``on_term``)."""
    terms[(ns, term.epoch)] = term


def encode_state(state: _State, ns: str) -> bytes:
    """One namespace's part of the projection's state: a line of JSON (per-term write
    counts, term times, every term seen) then the fold's image in the snapshot encoding
    (:func:`registry.snapshot.encode_image`)."""
    from ..snapshot import encode_image

    head = {"format": "jobreg-audit-state/1",
            "counts": sorted([e, *c] for (n, e), c in state.counts.items() if n == ns),
            "times": sorted([e, *t] for (n, e), t in state.term_times.items() if n == ns),
            "terms": sorted(list(t) for (n, _), t in state.terms.items() if n == ns)}
    image = state.images.get(ns) or Image.empty(ns)
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + encode_image(image)


def decode_state(data: bytes) -> tuple[dict[str, Any], Image]:
    """:func:`encode_state`'s inverse: the JSON head and the image."""
    from ..snapshot import decode_image

    line, _, body = data.partition(b"\n")
    head = json.loads(line)
    if head.get("format") != "jobreg-audit-state/1":
        raise ValueError(f"not an audit state: {head.get('format')!r}")
    return head, decode_image(body)


def _load(state: _State, ns: str, data: bytes) -> None:
    """Take ``ns``'s state from ``data``: all of it, or (it raises) nothing."""
    head, image = decode_state(data)
    counts = {(ns, e): [acc, rej] for e, acc, rej in head["counts"]}
    times = {(ns, e): [granted, revoked] for e, granted, revoked in head["times"]}
    terms = {(ns, t[0]): TermInfo(*t) for t in head["terms"]}
    state.images[ns] = image
    state.counts.update(counts)
    state.term_times.update(times)
    state.terms.update(terms)


def _failure_reason(event: Any) -> str | None:
    """Flink's name for why a checkpoint failed, else what the writer said (older records)."""
    if not isinstance(event, CheckpointFailed):
        return getattr(event, "reason", None)
    return event.failure_reason if event.failure_reason != "UNSPECIFIED" else event.reason


def _record_row(topic: str, r: LogRecord, ns: str | None, d: Decision, event: Any,
                job_status: str | None) -> dict[str, Any]:
    return {"topic": topic, "partition": r.partition, "offset": r.offset, "namespace": ns,
            "key": d.key, "event_id": d.event_id, "event_type": d.event_type,
            "job_id": d.job_id, "epoch": d.epoch, "writer": d.writer,
            "created_at": getattr(event, "created_at", None), "log_time": r.timestamp,
            "outcome": d.outcome, "accepted": d.accepted, "reason": d.reason,
            "detail": d.detail or None, "expected_epoch": d.expected_epoch,
            "actual_epoch": d.actual_epoch, "leader": d.leader, "job_status": job_status}


def _job_row(ns: str, view: Any, offset: int, stamp: int | None) -> dict[str, Any]:
    graph = view.graph
    kind = "inline" if isinstance(graph, InlineGraph) else \
        "blob" if isinstance(graph, GraphRef) else None
    return {"namespace": ns, "job_id": view.job_id, "status": view.status,
            "owner_epoch": view.owner_epoch, "error": view.error,
            "max_checkpoint_failures": view.max_checkpoint_failures,
            "retained_checkpoints": view.retained_checkpoints,
            "consecutive_failures": view.checkpoints.consecutive_failures,
            "graph_kind": kind, "last_offset": offset, "updated_at": stamp,
            "reason": view.reason, "dirty": view.dirty,
            "graph_uri": graph.uri if isinstance(graph, GraphRef) else None,
            "held_checkpoints": len(view.latest_checkpoints)}
