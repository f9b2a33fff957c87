"""Plain shapes and text tables for the CLI's answers (``--json`` and human output).

Every JSON answer of ``jobreg`` is one object with ``"format": "jobreg.<what>/1"``
first; fields are only ever added within a format version, never renamed or
removed. The shapes, field by field, are in the README ("JSON output"):

* a **job** (:func:`job_json`): ``job_id``, ``status``, ``owner_epoch``,
  ``error``, ``graph`` (``{"kind": "inline", "size"}`` or ``{"kind": "blob",
  "uri", "sha256", "size"}`` or ``null``), ``max_checkpoint_failures``,
  ``retained_checkpoints``, ``consecutive_failures``, ``over_budget``,
  ``checkpoints`` (the retained completed ones: ``[{"checkpoint_id", "location"}]``),
  ``requirements`` (its newest rescale's: ``[{"vertex_id", "lower_bound", "upper_bound"}]``,
  empty: none set);
* a **decision** (:func:`decision_json`): the fields of
  :class:`~registry.image.Decision` plus ``time`` (UTC ISO 8601 of ``timestamp``)
  and ``accepted``;
* a **term** (:func:`term_json`): the fields of
  :class:`~registry.forensics.TermSummary` plus ``started_time`` and ``ended_time``
  (UTC ISO 8601 of ``started_at`` and ``ended_at``);
* a **state** (:func:`state_json`): ``namespace``, ``last_offset``, ``log_time``,
  ``epoch``, ``leader``, ``revoked`` and ``jobs``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from .events import GraphRef, InlineGraph
from .forensics import TermSummary
from .image import Decision, Image, JobView

__all__ = [
    "UNKNOWN",
    "decision_json",
    "format_duration",
    "format_time",
    "job_json",
    "parse_time",
    "state_json",
    "table",
    "term_json",
    "term_times",
]


def format_time(ms: int | None) -> str | None:
    """UTC ISO 8601 with milliseconds (``2026-11-22T21:12:04.120Z``), or ``None``."""
    if ms is None:
        return None
    t = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def parse_time(text: str) -> int:
    """A point in time for ``--time``/``--since``/``--until``: ms since the Unix epoch
    (digits), or ISO 8601 (``2026-11-22T21:12:04``, ``...Z``, ``...+01:00``; no zone
    means UTC). Raises :class:`ValueError` with a message for people."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither ms since the Unix epoch nor an ISO 8601 time "
                         "(like 2026-11-22T21:12:04Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def _graph(graph: InlineGraph | GraphRef | None) -> dict[str, Any] | None:
    if isinstance(graph, InlineGraph):
        return {"kind": "inline", "size": len(graph.data)}
    if isinstance(graph, GraphRef):
        return {"kind": "blob", "uri": graph.uri, "sha256": graph.sha256, "size": graph.size}
    return None


def job_json(view: JobView) -> dict[str, Any]:
    """One job (see the module docstring)."""
    return {
        "job_id": view.job_id,
        "status": view.status,
        "owner_epoch": view.owner_epoch,
        "error": view.error,
        "graph": _graph(view.graph),
        "max_checkpoint_failures": view.max_checkpoint_failures,
        "retained_checkpoints": view.retained_checkpoints,
        "consecutive_failures": view.checkpoints.consecutive_failures,
        "over_budget": view.over_budget,
        "checkpoints": [{"checkpoint_id": c.checkpoint_id, "location": c.location}
                        for c in view.latest_checkpoints],
        "requirements": [{"vertex_id": r.vertex_id, "lower_bound": r.lower_bound,
                          "upper_bound": r.upper_bound}
                         for r in view.checkpoints.requirements],
        "reason": view.reason,
        "dirty": view.dirty,
    }


def decision_json(d: Decision) -> dict[str, Any]:
    """One verdict of the fold on one record."""
    out = d.as_dict()
    out["time"] = format_time(d.timestamp)
    out["accepted"] = d.accepted
    return out


def term_json(t: TermSummary) -> dict[str, Any]:
    """One leadership term (times in ms since the Unix epoch, and as ISO 8601 UTC; ``None``
    where unknown: :class:`~registry.forensics.TermSummary` says when)."""
    return {"epoch": t.epoch, "leader": t.leader, "started": t.started, "ended": t.ended,
            "first_offset": t.first_offset, "last_offset": t.last_offset,
            "accepted": t.accepted, "rejected": t.rejected, "lease_ms": t.lease_ms,
            "end": t.end, "end_offset": t.end_offset, "next_epoch": t.next_epoch,
            "started_at": t.started_at, "started_time": format_time(t.started_at),
            "ended_at": t.ended_at, "ended_time": format_time(t.ended_at),
            "duration_ms": t.duration_ms}


UNKNOWN = "unknown"
"""What a table shows for a time the log does not give (a record without a stamp)."""


def term_times(t: TermSummary) -> tuple[str, str, str]:
    """A term's start, end and duration for people: ISO 8601 UTC and a duration; ``-`` for
    the end and duration of the current term, :data:`UNKNOWN` for what the log does not say
    (a record without a time, or an end stamped before the start)."""
    current = t.end == "current"
    start = format_time(t.started_at) or UNKNOWN
    end = "-" if current else format_time(t.ended_at) or UNKNOWN
    took = "-" if current else UNKNOWN if t.duration_ms is None \
        else format_duration(t.duration_ms)
    return start, end, took


def format_duration(ms: int) -> str:
    """A duration for people, exact to the ms below a minute (``840 ms``, ``12.304 s``,
    ``3 min 04.120 s``, ``2 h 05 min``, ``3 d 04 h``)."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms // 1000}.{ms % 1000:03d} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min {ms % 60_000 // 1000:02d}.{ms % 1000:03d} s"
    if ms < 86_400_000:
        return f"{ms // 3_600_000} h {ms % 3_600_000 // 60_000:02d} min"
    return f"{ms // 86_400_000} d {ms % 86_400_000 // 3_600_000:02d} h"


def state_json(image: Image, *, include_terminal: bool = True) -> dict[str, Any]:
    """The registry's state as one image holds it."""
    jobs = sorted(image.jobs.values(), key=lambda v: v.job_id)
    return {
        "namespace": image.namespace,
        "last_offset": image.provenance.last_offset,
        "log_time": image.provenance.log_time,
        "epoch": image.epoch,
        "leader": image.leader,
        "revoked": image.revoked,
        "jobs": [job_json(v) for v in jobs if include_terminal or v.live],
    }


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *,
          right: Collection[int] = ()) -> str:
    """A plain text table; ``None`` shows as ``-``; the columns numbered in ``right`` are
    aligned right (figures), the others left. The one table of the CLI and the benchmarks."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths),
                      *(line(row) for row in cells)])
