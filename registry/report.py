"""A self-contained HTML incident report: the fold's verdicts drawn, so nobody reads logs.

:func:`render_report` replays one namespace once (:meth:`Forensics.scan`: the
final :class:`~registry.image.Image` and every :class:`~registry.image.Decision`
in log order) and draws only what those say; no fold rule is restated here.
:func:`write_report` writes the page atomically.

**The page.** A header (namespace, topic, offset and time range, counts by
outcome, when the page was made), a timeline picture, then tables of the
refused writes, the quarantined records and the leadership terms, and
:meth:`Forensics.explain` for the chosen jobs.

**The picture** (inline SVG) encodes:

* **x axis: log offset**, linear between the first and last record drawn. Log
  order is the truth; ticks are labelled with the offset above the lanes and,
  below them, the broker timestamp (UTC) of the last record at or before the
  tick (no label where no record carries a timestamp).
* **Background bands: leadership terms.** One colour per epoch, labelled
  ``epoch N · leader`` in the row above the lanes. A band starts at its grant
  and ends at its revoke, at the next grant, or at the last record drawn; no
  band means no term (before the first grant, or after a revoke).
* **Lanes**, top to bottom: ``leadership`` (grants ▲, revokes ▼, lease
  renewals |, and any record that names no job), ``quarantined`` (records the
  fold could not decode, purple ◆; the lane is tinted when it has any), then
  one lane per job (submit ●, adopt ◆, release ◇, cancel ■, terminate ■
  grey, reassert ○, recovery failed ▼ orange, checkpoints as short ticks:
  triggered grey, completed green, failed orange, discarded light grey).
* **Outcome overrides shape**: a refused write (``REJECTED``) is a red ✕ on
  a red halo, an ``IGNORED`` record an amber ring, a ``DUPLICATE`` a small
  dashed grey ring. Every mark's ``<title>`` (the tooltip) gives offset,
  time, type, outcome, job, writer, epoch, reason and detail.
* **Large logs**: beyond :data:`MAX_MARKS` marks, marks of accepted and
  duplicate records (not grants or revokes) are thinned to one per lane,
  symbol and few-pixel column, deterministically; every refused, ignored and
  quarantined record is always drawn. The page says when it thinned, and how
  many job lanes (beyond :data:`MAX_LANES`) and table rows it left out.

The page loads nothing: inline ``<style>`` only, no script, and a
``Content-Security-Policy`` that forbids every fetch. Every string that comes
from the log is HTML-escaped. The output is a function of the log and the
arguments alone (pass ``generated_at`` for byte-identical pages).
"""

from __future__ import annotations

import bisect
import html
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .errors import ConfigError
from .files import atomic_write
from .forensics import Forensics, Scan, TermSummary
from .image import Decision, Image, Outcome
from .keys import check_id, parse_key

__all__ = ["MAX_EXPLAINED", "MAX_LANES", "MAX_MARKS", "MAX_TABLE_ROWS", "render_report",
           "write_report"]

MAX_LANES = 50
"""Job lanes drawn at most; the page says how many were left out."""
MAX_MARKS = 5000
"""Above this many marks, accepted records' marks are thinned (never refused ones)."""
MAX_TABLE_ROWS = 2000
"""Rows per table at most; the page says how many were left out."""
MAX_EXPLAINED = 50
"""Jobs whose explanation is shown at most."""
AUTO_EXPLAIN_ALL = 10
"""With no ``jobs`` given, explain every drawn job if there are at most this many."""

_Scale = Callable[[float], float]

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_LEADERSHIP_TYPES = frozenset({"LeadershipGranted", "LeadershipRevoked", "LeaseRenewed"})
_ALWAYS_DRAWN_TYPES = frozenset({"LeadershipGranted", "LeadershipRevoked"})

# -- geometry of the picture (SVG user units = CSS px at 100 %) ------------------------------
_W = 1360
_LABEL_W = 230
_RIGHT = 24
_X0, _X1 = _LABEL_W, _W - _RIGHT
_BAND_ROW = 22         # term labels
_AXIS_ROW = 20         # offset tick labels
_LANES_TOP = _BAND_ROW + _AXIS_ROW + 4
_LANE_H = 24
_BOTTOM = 44           # time tick labels and the axis caption
_CHAR_W = 6.3          # rough width of a character at font-size 11 (for fitting labels)

_BAND_FILLS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#d9d2e9", "#d0e0e3", "#fce5cd", "#e6e6e6")
_BAND_INKS = ("#1c4587", "#274e13", "#7f6000", "#351c75", "#0c343d", "#783f04", "#333333")

# symbol id -> (SVG body drawn around 0,0; legend text)
_SYMBOLS: dict[str, tuple[str, str]] = {
    "grant": ('<path d="M0,-7L6.5,5H-6.5Z" fill="#2ca02c" stroke="#1b641b"/>',
              "leadership granted"),
    "revoke": ('<path d="M0,7L6.5,-5H-6.5Z" fill="#555" stroke="#222"/>',
               "leadership revoked"),
    "renew": ('<path d="M0,-6V6" stroke="#7f7f7f" stroke-width="2"/>', "lease renewed"),
    "submit": ('<circle r="5.5" fill="#1f77b4" stroke="#0d3c61"/>', "job submitted"),
    "adopt": ('<path d="M0,-6.5L6.5,0L0,6.5L-6.5,0Z" fill="#17becf" stroke="#0b6e78"/>',
              "job adopted (lock taken)"),
    "release": ('<path d="M0,-6L6,0L0,6L-6,0Z" fill="#fff" stroke="#0b6e78" '
                'stroke-width="1.8"/>', "job lock released"),
    "cancel": ('<rect x="-5.5" y="-5.5" width="11" height="11" fill="#111"/>',
               "job cancelled"),
    "terminate": ('<rect x="-5.5" y="-5.5" width="11" height="11" fill="#777" stroke="#111"/>',
                  "job terminated (finished/failed)"),
    "reassert": ('<circle r="5" fill="#fff" stroke="#1f77b4" stroke-width="2"/>',
                 "job reasserted"),
    "recovery": ('<path d="M0,7L6.5,-5H-6.5Z" fill="#ff7f0e" stroke="#8a4500"/>',
                 "job recovery failed"),
    "cp-triggered": ('<path d="M0,-5V5" stroke="#999" stroke-width="2"/>',
                     "checkpoint triggered"),
    "cp-completed": ('<path d="M0,-7V7" stroke="#2ca02c" stroke-width="3"/>',
                     "checkpoint completed"),
    "cp-failed": ('<path d="M0,-7V7" stroke="#ff7f0e" stroke-width="3"/>',
                  "checkpoint failed (counted)"),
    "cp-discarded": ('<path d="M0,-4V4" stroke="#ccc" stroke-width="2"/>',
                     "checkpoint discarded"),
    "other": ('<circle r="4" fill="#999"/>', "other event"),
    "rejected": ('<circle r="9" fill="#d62728" fill-opacity="0.18"/>'
                 '<path d="M-5.5,-5.5L5.5,5.5M-5.5,5.5L5.5,-5.5" stroke="#d62728" '
                 'stroke-width="3" stroke-linecap="round"/>', "REFUSED write (rejected)"),
    "ignored": ('<circle r="6" fill="none" stroke="#e69f00" stroke-width="2.5"/>',
                "ignored (kept, no effect)"),
    "duplicate": ('<circle r="5" fill="none" stroke="#555" stroke-width="1.6" '
                  'stroke-dasharray="2.5,1.5"/>', "duplicate (no second effect)"),
    "quarantined": ('<path d="M0,-7.5L7.5,0L0,7.5L-7.5,0Z" fill="#9c27b0" stroke="#4a0072"/>'
                    '<path d="M0,-3.5V1M0,3V3.6" stroke="#fff" stroke-width="1.8"/>',
                    "QUARANTINED (undecodable)"),
}

_TYPE_SYMBOL = {
    "LeadershipGranted": "grant",
    "LeadershipRevoked": "revoke",
    "LeaseRenewed": "renew",
    "JobSubmitted": "submit",
    "JobAdopted": "adopt",
    "JobLockReleased": "release",
    "JobCancelled": "cancel",
    "JobTerminated": "terminate",
    "JobReasserted": "reassert",
    "JobRecoveryFailed": "recovery",
    "CheckpointTriggered": "cp-triggered",
    "CheckpointCompleted": "cp-completed",
    "CheckpointFailed": "cp-failed",
    "CheckpointDiscarded": "cp-discarded",
    "JobRestarted": "recovery",
}


def _symbol(d: Decision) -> str:
    if d.outcome == Outcome.REJECTED:
        return "rejected"
    if d.outcome == Outcome.QUARANTINED:
        return "quarantined"
    if d.outcome == Outcome.IGNORED:
        return "ignored"
    if d.outcome == Outcome.DUPLICATE:
        return "duplicate"
    return _TYPE_SYMBOL.get(d.event_type or "", "other")


class _Scanned(Forensics):
    """The same Forensics questions, answered from one scan already made: one read of the
    source, and every answer on the page about the same log even if it grows meanwhile."""

    def __init__(self, base: Forensics, scanned: Scan) -> None:
        super().__init__(base.source, base.namespace)
        self._scanned = scanned
        self._by_job: dict[str, list[Decision]] = {}
        for d in scanned.decisions:
            if d.job_id is not None:
                self._by_job.setdefault(d.job_id, []).append(d)

    def scan(self) -> Scan:
        return self._scanned

    def explain(self, job_id: str) -> str:
        # Forensics.explain, with the job's timeline from an index instead of a filter per job.
        check_id("job id", job_id)
        return self.explain_from(self._scanned.image, self._by_job.get(job_id, []), job_id)


@dataclass(frozen=True)
class _Lane:
    name: str           # shown (escaped at drawing time)
    kind: str           # "leadership", "quarantined" or "job"
    status: str = ""    # the job's status at the end of the log


def _e(value: object) -> str:
    """Escape anything for HTML text and attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


def _iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "…"


def _f(x: float) -> str:
    return f"{x:.1f}"


def _check_args(jobs: Sequence[str] | None, since: int | None, until: int | None) -> None:
    for name, value in (("since", since), ("until", until)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{name} must be ms since the Unix epoch (an int), not {value!r}")
    if since is not None and until is not None and since > until:
        raise ConfigError(f"since ({since}, {_iso(since)}) is after until "
                          f"({until}, {_iso(until)})")
    if isinstance(jobs, (str, bytes)):
        raise ConfigError(f"jobs must be a sequence of job ids, not the string {jobs!r}")


def _quarantined_job(d: Decision) -> str | None:
    """The job a quarantined record's key names, if it names one (the key, not the value)."""
    parsed = parse_key(d.key) if d.key else None
    return parsed.job_id if parsed is not None else None


def render_report(forensics: Forensics, *, jobs: Sequence[str] | None = None,
                  since: int | None = None, until: int | None = None,
                  title: str | None = None, generated_at: int | None = None) -> str:
    """The incident report of ``forensics``'s namespace as one self-contained HTML page.

    ``since``/``until`` (ms since the Unix epoch, inclusive) select the records
    drawn by their broker timestamp; records without one are kept. ``jobs``
    selects the job lanes (default: every job with a record in the window, at
    most :data:`MAX_LANES`) and the jobs explained (default: the drawn jobs
    with a refused or quarantined record, or all drawn jobs if at most 10).
    ``generated_at`` (ms) is the time the page says it was made (default: now).

    Raises :class:`ConfigError` for an unknown or malformed job id, or
    ``since > until``. A :class:`~registry.client.Registry` is accepted too
    (its :meth:`~registry.client.Registry.forensics` is used).
    """
    _check_args(jobs, since, until)
    if not isinstance(forensics, Forensics):
        getter = getattr(forensics, "forensics", None)
        if not callable(getter):
            raise ConfigError(f"render_report needs a Forensics, not {type(forensics).__name__}")
        forensics = getter()
    wanted = None if jobs is None else list(dict.fromkeys(check_id("job id", j) for j in jobs))
    found = forensics.scan()
    image, decisions = found.image, found.decisions
    scanned = _Scanned(forensics, found)
    known = {d.job_id for d in decisions if d.job_id is not None}
    known.update(image.jobs.keys())
    known.update(j for d in image.quarantined if (j := _quarantined_job(d)) is not None)
    if wanted is not None:
        unknown = [j for j in wanted if j not in known]
        if unknown:
            raise ConfigError(
                f"unknown job id(s) in namespace {forensics.namespace!r}: "
                + ", ".join(repr(j) for j in unknown)
                + " (no record of the log names them)")
    page = _Page(scanned, image, decisions, wanted, since, until, title,
                 int(time.time() * 1000) if generated_at is None else generated_at)
    return page.render()


def write_report(forensics: Forensics, path: str | os.PathLike[str], *,
                 jobs: Sequence[str] | None = None, since: int | None = None,
                 until: int | None = None, title: str | None = None,
                 generated_at: int | None = None) -> Path:
    """:func:`render_report` to ``path``, atomically (:func:`registry.files.atomic_write`:
    a reader never sees half a page; a path that cannot be written is one ``ConfigError``);
    returns the path."""
    text = render_report(forensics, jobs=jobs, since=since, until=until, title=title,
                         generated_at=generated_at)
    path = Path(path)
    with atomic_write(path, "report") as f:
        f.write(text.encode("utf-8"))
    return path


class _Page:
    """One rendering: the selection made once, then the HTML built piece by piece."""

    def __init__(self, forensics: _Scanned, image: Image, decisions: list[Decision],
                 wanted: list[str] | None, since: int | None, until: int | None,
                 title: str | None, generated_at: int) -> None:
        self.f = forensics
        self.image = image
        self.all = decisions
        self.since, self.until = since, until
        self.title = title or f"jobreg incident report: {image.namespace}"
        self.generated_at = generated_at
        self.notes: list[str] = []
        self.window = [d for d in decisions if self._in_window(d.timestamp)]
        self._choose_lanes(wanted)
        self._choose_explained(wanted)

    # -- selection -----------------------------------------------------------------------------

    def _in_window(self, ts: int | None) -> bool:
        if ts is None:
            return True
        return (self.since is None or ts >= self.since) and (self.until is None or ts <= self.until)

    def _choose_lanes(self, wanted: list[str] | None) -> None:
        first: dict[str, int] = {}
        troubled: set[str] = set()
        for d in self.window:
            job = d.job_id
            if d.outcome == Outcome.QUARANTINED:
                job = _quarantined_job(d)
                if job is not None:
                    troubled.add(job)
                continue
            if job is None:
                continue
            first.setdefault(job, d.offset)
            if d.outcome == Outcome.REJECTED:
                troubled.add(job)
        self.troubled = troubled
        if wanted is None:
            # Jobs with trouble first, then by first appearance; drawn in log order.
            ranked = sorted(first, key=lambda j: (j not in troubled, first[j], j))
            chosen = ranked[:MAX_LANES]
            left_out = len(ranked) - len(chosen)
            chosen.sort(key=lambda j: (first[j], j))
        else:
            chosen = wanted[:MAX_LANES]
            left_out = len(wanted) - len(chosen)
        if left_out:
            self.notes.append(
                f"{left_out} job lane(s) left out (at most {MAX_LANES} are drawn; jobs with "
                "refused or quarantined records first). The tables below list every record.")
        self.job_lanes = chosen
        self.lanes = [_Lane("leadership", "leadership"), _Lane("quarantined", "quarantined")]
        for j in chosen:
            view = self.image.jobs.get(j)
            self.lanes.append(_Lane(j, "job", view.status if view is not None else "unknown"))
        self.lane_of_job = {j: i + 2 for i, j in enumerate(chosen)}
        empty = [j for j in chosen if j not in first]
        if empty:
            self.notes.append(f"{len(empty)} job lane(s) have no record in the window: "
                              + ", ".join(_clip(j, 40) for j in empty[:10])
                              + (", …" if len(empty) > 10 else "") + ".")

    def _choose_explained(self, wanted: list[str] | None) -> None:
        if wanted is not None:
            chosen = wanted
        elif len(self.job_lanes) <= AUTO_EXPLAIN_ALL:
            chosen = list(self.job_lanes)
        else:
            chosen = [j for j in self.job_lanes if j in self.troubled]
        self.explained = chosen[:MAX_EXPLAINED]
        if len(chosen) > MAX_EXPLAINED:
            self.notes.append(f"{len(chosen) - MAX_EXPLAINED} job explanation(s) left out "
                              f"(at most {MAX_EXPLAINED}).")

    def _lane(self, d: Decision) -> int | None:
        if d.outcome == Outcome.QUARANTINED:
            return 1
        if d.job_id is not None:
            return self.lane_of_job.get(d.job_id)
        return 0  # leadership records, and any record that names no job

    # -- the page ------------------------------------------------------------------------------

    def render(self) -> str:
        body = [self._header(), self._timeline(), self._refused(), self._quarantined(),
                self._terms(), self._explain()]
        notes = "".join(f"<li>{_e(n)}</li>" for n in self.notes)
        notes_html = f'<ul class="notes">{notes}</ul>' if notes else ""
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{_e(CSP)}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<meta name="generator" content="jobreg report">\n'
            f"<title>{_e(self.title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            + body[0] + notes_html + "".join(body[1:]) + "\n</body>\n</html>\n")

    def _header(self) -> str:
        w = self.window
        counts = {o: 0 for o in (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.IGNORED,
                                 Outcome.QUARANTINED, Outcome.DUPLICATE)}
        for d in w:
            counts[d.outcome] = counts.get(d.outcome, 0) + 1
        stamps = [d.timestamp for d in w if d.timestamp is not None]
        topic = getattr(self.f.source, "topic", None) or "unknown"
        offsets = f"{w[0].offset} – {w[-1].offset}" if w else "none"
        if self.all and (not w or (w[0].offset, w[-1].offset)
                         != (self.all[0].offset, self.all[-1].offset)):
            offsets += f" (the log: {self.all[0].offset} – {self.all[-1].offset})"
        span = f"{_iso(min(stamps))} – {_iso(max(stamps))}" if stamps else "no timestamps"
        window = "the whole log"
        if self.since is not None or self.until is not None:
            window = (f"records stamped {_iso(self.since) if self.since is not None else '…'}"
                      f" to {_iso(self.until) if self.until is not None else '…'} "
                      "(records without a timestamp kept)")
        leader = self.image.active_leader
        now = (f"epoch {self.image.epoch}, leader {leader.contender}" if leader is not None
               else f"epoch {self.image.epoch}, no active leader")
        rows = [
            ("namespace", self.image.namespace), ("topic", topic),
            ("window", window), ("offsets", offsets), ("time (UTC)", span),
            ("at the end of the log", now), ("generated", _iso(self.generated_at)),
        ]
        dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows)
        pills = [("records", len(w), ""), ("accepted", counts[Outcome.ACCEPTED], ""),
                 ("rejected", counts[Outcome.REJECTED], "bad"),
                 ("ignored", counts[Outcome.IGNORED], "warn"),
                 ("quarantined", counts[Outcome.QUARANTINED], "q"),
                 ("duplicates", counts[Outcome.DUPLICATE], "")]
        pill_html = "".join(
            f'<span class="{"pill " + cls if n and cls else "pill"}"><b>{n}</b> {name}</span>'
            for name, n, cls in pills)
        return (f"<header><h1>{_e(self.title)}</h1><dl>{dl}</dl>"
                f'<div class="pills">{pill_html}</div></header>\n')

    # -- the picture ---------------------------------------------------------------------------

    def _timeline(self) -> str:
        w = self.window
        if not w:
            return ('<section><h2>Timeline</h2><p class="empty">No records in the window.'
                    "</p></section>\n")
        lo, hi = w[0].offset, w[-1].offset
        pad = max(0.6, (hi - lo) * 0.012)
        dlo, dhi = lo - pad, hi + pad
        scale = (_X1 - _X0) / (dhi - dlo)

        def x(offset: float) -> float:
            return _X0 + (offset - dlo) * scale

        lanes_bottom = _LANES_TOP + _LANE_H * len(self.lanes)
        height = lanes_bottom + _BOTTOM
        out: list[str] = [
            f'<svg class="timeline" viewBox="0 0 {_W} {height}" width="{_W}" '
            f'height="{height}" role="img" font-family="system-ui, sans-serif" font-size="11">',
            "<title>Timeline: x is the log offset; bands are leadership terms; one lane per "
            "job</title>",
            _defs(),
        ]
        out += self._bands(x, lo, hi, lanes_bottom)
        out += self._lane_rows(lanes_bottom)
        out += self._axes(x, lo, hi, lanes_bottom)
        out += self._marks(x)
        out.append("</svg>")
        legend = "".join(
            f'<span class="key"><svg width="20" height="20" viewBox="-10 -10 20 20">'
            f"{body}</svg>{_e(text)}</span>"
            for body, text in _SYMBOLS.values())
        caption = ("x: log offset (log order is the truth); tick labels below: broker time (UTC) "
                   "of the last record at or before the tick. Bands: leadership terms. "
                   "Hover a mark for its record.")
        return (f'<section><h2>Timeline</h2><div class="scroll">{"".join(out)}</div>'
                f'<p class="caption">{_e(caption)}</p><div class="legend">{legend}</div>'
                "</section>\n")

    def _bands(self, x: _Scale, lo: int, hi: int, bottom: float) -> list[str]:
        bands: list[tuple[int, float, float, str]] = []  # epoch, x0, x1, tooltip
        terms = self.f.scan().terms
        by_epoch = {t.epoch: t for t in terms}
        for i, info in enumerate(terms):
            epoch = info.epoch
            end: float
            if info.revoked_offset is not None:
                end, how = info.revoked_offset, f"revoked at {info.revoked_offset}"
            elif i + 1 < len(terms):
                nxt = terms[i + 1]
                end, how = nxt.granted_offset, f"until epoch {nxt.epoch} at {nxt.granted_offset}"
            else:
                end, how = math.inf, "current"
            start = info.granted_offset
            if end < lo or start > hi:
                continue
            x0, x1 = max(x(start), _X0), min(x(min(end, hi + 1)), _X1)
            tip = (f"epoch {epoch} · leader {info.leader} · granted at {start} · {how}"
                   + (f" · lease {info.lease_ms} ms, {info.renewals} renewal(s)"
                      if info.lease_ms else ""))
            bands.append((epoch, x0, max(x1, x0 + 1.0), tip))
        out: list[str] = []
        label_end = float(_X0)
        for i, (epoch, x0, x1, tip) in enumerate(bands):
            info = by_epoch[epoch]
            fill, ink = _BAND_FILLS[epoch % len(_BAND_FILLS)], _BAND_INKS[epoch % len(_BAND_INKS)]
            width = x1 - x0
            out.append(f'<g class="band"><title>{_e(tip)}</title>'
                       f'<rect x="{_f(x0)}" y="0" width="{_f(width)}" height="{_f(bottom)}" '
                       f'fill="{fill}" fill-opacity="0.75"/>'
                       f'<rect x="{_f(x0)}" y="0" width="{_f(width)}" height="{_BAND_ROW}" '
                       f'fill="{fill}"/>')
            if info.revoked_offset is not None and lo <= info.revoked_offset <= hi:
                out.append(f'<path d="M{_f(x1)},0V{_f(bottom)}" stroke="{ink}" '
                           'stroke-width="1.5" stroke-dasharray="4,3"/>')
            # The label starts in its band; it may reach left over an earlier band's unused
            # header, never right into the next band.
            right = bands[i + 1][1] - 4 if i + 1 < len(bands) else _X1 - 4
            for label in (f"epoch {epoch} · {info.leader}",
                          _clip(f"e{epoch} · {info.leader}", 16), f"e{epoch}"):
                need = len(label) * _CHAR_W
                start = min(x0 + 4, right - need)
                if start >= label_end + 8 or (start >= label_end and label == f"e{epoch}"):
                    out.append(f'<text x="{_f(start)}" y="15" fill="{ink}" font-weight="600">'
                               f"{_e(label)}</text>")
                    label_end = start + need
                    break
            out.append("</g>")
        return out

    def _lane_rows(self, bottom: float) -> list[str]:
        out: list[str] = []
        quarantined = any(d.outcome == Outcome.QUARANTINED for d in self.window)
        for i, lane in enumerate(self.lanes):
            y = _LANES_TOP + i * _LANE_H
            mid = y + _LANE_H / 2
            if lane.kind == "quarantined" and quarantined:
                out.append(f'<rect x="{_X0}" y="{y}" width="{_X1 - _X0}" height="{_LANE_H}" '
                           'fill="#9c27b0" fill-opacity="0.13"/>')
            if lane.kind == "job" and lane.name in self.troubled:
                out.append(f'<rect x="0" y="{y}" width="4" height="{_LANE_H}" fill="#d62728"/>')
            out.append(f'<path d="M0,{y + _LANE_H}H{_X1}" stroke="#000" stroke-opacity="0.12"/>')
            if lane.kind == "job":
                tip = f"job {lane.name} · at the end of the log: {lane.status}"
                name = _clip(lane.name, 21)
                out.append(f'<g><title>{_e(tip)}</title><text x="10" y="{_f(mid + 4)}">'
                           f"{_e(name)}</text>"
                           f'<text x="{_X0 - 8}" y="{_f(mid + 4)}" text-anchor="end" '
                           f'font-size="9" fill="{_status_ink(lane.status)}">'
                           f"{_e(lane.status)}</text></g>")
            else:
                ink = "#4a0072" if lane.kind == "quarantined" else "#222"
                out.append(f'<text x="10" y="{_f(mid + 4)}" font-weight="700" fill="{ink}">'
                           f"{_e(lane.name)}</text>")
        out.append(f'<path d="M{_X0},{_LANES_TOP}V{_f(bottom)}" stroke="#000" '
                   'stroke-opacity="0.35"/>')
        return out

    def _axes(self, x: _Scale, lo: int, hi: int, bottom: float) -> list[str]:
        out: list[str] = []
        offsets = [d.offset for d in self.window]
        stamps = [d.timestamp for d in self.window]
        known_stamps = [s for s in stamps if s is not None]
        long_span = bool(known_stamps) and max(known_stamps) - min(known_stamps) > 86_400_000
        for tick in _ticks(lo, hi):
            tx = x(tick)
            out.append(f'<path d="M{_f(tx)},{_BAND_ROW}V{_f(bottom + 4)}" stroke="#000" '
                       'stroke-opacity="0.10"/>')
            out.append(f'<text x="{_f(tx)}" y="{_BAND_ROW + 14}" text-anchor="middle" '
                       f'fill="#444">{tick}</text>')
            i = bisect.bisect_right(offsets, tick) - 1
            stamp = next((stamps[k] for k in range(i, -1, -1) if stamps[k] is not None), None)
            if stamp is not None:
                out.append(f'<text x="{_f(tx)}" y="{_f(bottom + 15)}" text-anchor="middle" '
                           f'font-size="10" fill="#444">{_e(_tick_time(stamp, long_span))}'
                           "</text>")
        out.append(f'<text x="{_X0 - 8}" y="{_BAND_ROW + 14}" text-anchor="end" fill="#444" '
                   'font-style="italic">offset</text>')
        out.append(f'<text x="{_X0 - 8}" y="{_f(bottom + 15)}" text-anchor="end" fill="#444" '
                   'font-style="italic">time (UTC)</text>')
        out.append(f'<text x="{_X0 - 8}" y="15" text-anchor="end" fill="#444" '
                   'font-style="italic">leadership terms</text>')
        first = next((s for s in stamps if s is not None), None)
        if first is not None:
            out.append(f'<text x="{_X0}" y="{_f(bottom + 32)}" fill="#666" font-size="10">'
                       f"{_e(_iso(first)[:10])} (date of the first record drawn)</text>")
        return out

    def _marks(self, x: _Scale) -> list[str]:
        placed: list[tuple[int, Decision]] = []
        for d in self.window:
            lane = self._lane(d)
            if lane is not None:
                placed.append((lane, d))
        placed = self._thin(placed, x)
        out: list[str] = []
        # Refused and quarantined marks last, so they sit on top.
        placed.sort(key=lambda p: (_symbol(p[1]) in ("rejected", "quarantined"), p[1].offset))
        for lane, d in placed:
            cy = _LANES_TOP + lane * _LANE_H + _LANE_H / 2
            out.append(f'<use href="#m-{_symbol(d)}" x="{_f(x(d.offset))}" y="{_f(cy)}">'
                       f"<title>{_e(_tooltip(d))}</title></use>")
        return out

    def _thin(self, placed: list[tuple[int, Decision]], x: _Scale) -> list[tuple[int, Decision]]:
        if len(placed) <= MAX_MARKS:
            return placed

        def keep(d: Decision) -> bool:
            return d.outcome not in (Outcome.ACCEPTED, Outcome.DUPLICATE) \
                or d.event_type in _ALWAYS_DRAWN_TYPES

        kept = [p for p in placed if keep(p[1])]
        thinnable = [p for p in placed if not keep(p[1])]
        budget = max(0, MAX_MARKS - len(kept))
        column = 1.0
        while True:
            seen: set[tuple[int, str, int]] = set()
            chosen = []
            for lane, d in thinnable:
                cell = (lane, _symbol(d), int(x(d.offset) // column))
                if cell not in seen:
                    seen.add(cell)
                    chosen.append((lane, d))
            if len(chosen) <= budget or column >= _X1 - _X0:
                break
            column *= 2
        self.notes.append(
            f"The picture has {len(placed)} marks, more than {MAX_MARKS}: marks of accepted and "
            f"duplicate records are thinned to one per lane, symbol and {column:g}-pixel column "
            f"({len(chosen)} of {len(thinnable)} drawn). Every refused, ignored and quarantined "
            "record, grant and revoke is drawn.")
        return sorted(kept + chosen, key=lambda p: p[1].offset)

    # -- tables --------------------------------------------------------------------------------

    def _refused(self) -> str:
        rows = [d for d in self.window if d.outcome == Outcome.REJECTED]
        head = ("offset", "time (UTC)", "type", "job", "writer", "epoch", "expected epoch",
                "reason", "detail")
        body = [(d.offset, _iso(d.timestamp), d.event_type, d.job_id, d.writer, d.epoch,
                 d.expected_epoch, d.reason, d.detail) for d in rows]
        return _table("Refused writes", head, body, "No write was refused in the window.",
                      reason_col=7, cls="refused", wrap_col=8)

    def _quarantined(self) -> str:
        rows = [d for d in self.window if d.outcome == Outcome.QUARANTINED]
        head = ("offset", "time (UTC)", "key", "reason", "detail")
        body = [(d.offset, _iso(d.timestamp), d.key, d.reason, d.detail) for d in rows]
        return _table("Quarantined records", head, body,
                      "No record was quarantined in the window.", reason_col=3, cls="quar",
                      wrap_col=4)

    def _terms(self) -> str:
        stamp = {d.offset: d.timestamp for d in self.all}
        w = self.window
        lo, hi = (w[0].offset, w[-1].offset) if w else (0, -1)
        terms: list[TermSummary] = self.f.terms()
        if self.since is not None or self.until is not None:
            terms = [t for t in terms if t.last_offset >= lo and t.first_offset <= hi]
        head = ("epoch", "leader", "started", "granted at (UTC)", "ended", "first offset",
                "last offset", "accepted", "rejected")
        body = [(t.epoch, t.leader, t.started, _iso(stamp.get(t.first_offset)), t.ended,
                 t.first_offset, t.last_offset, t.accepted, t.rejected) for t in terms]
        return _table("Leadership terms", head, body, "No term was ever granted.",
                      reason_col=None, cls="terms")

    def _explain(self) -> str:
        if not self.explained:
            return ('<section><h2>Why each job is in its state</h2><p class="empty">'
                    "No job selected.</p></section>\n")
        parts = ["<section><h2>Why each job is in its state</h2>"]
        for job in self.explained:
            parts.append(f'<h3 id="job-{_e(job)}">{_e(job)}</h3>'
                         f"<pre>{_e(self.f.explain(job))}</pre>")
        parts.append("</section>\n")
        return "".join(parts)


def _tooltip(d: Decision) -> str:
    lines = [f"offset {d.offset}" + (f" · {_iso(d.timestamp)}" if d.timestamp is not None
                                     else "")
             + f" · {d.event_type or '(undecodable)'} · {d.outcome}"]
    who = []
    job = d.job_id or (_quarantined_job(d) if d.outcome == Outcome.QUARANTINED else None)
    if job is not None:
        who.append(f"job {job}")
    if d.writer is not None:
        who.append(f"writer {d.writer}")
    if d.epoch is not None:
        who.append(f"epoch {d.epoch}")
    if d.expected_epoch is not None:
        who.append(f"expected epoch {d.expected_epoch}")
    if who:
        lines.append(" · ".join(who))
    if d.outcome == Outcome.QUARANTINED and d.key:
        lines.append(f"key {d.key}")
    if d.reason:
        lines.append(f"reason: {d.reason}")
    if d.detail:
        lines.append(_clip(d.detail, 400))
    return "\n".join(lines)


def _ticks(lo: int, hi: int) -> list[int]:
    """Offsets to label: a 1-2-5 step giving at most ~10 ticks, all within [lo, hi]."""
    span = max(hi - lo, 1)
    step = 1
    magnitude = 1
    while True:
        for m in (1, 2, 5):
            step = m * magnitude
            if span / step <= 10:
                first = math.ceil(lo / step) * step
                return list(range(first, hi + 1, step))
        magnitude *= 10


def _tick_time(ms: int, long_span: bool) -> str:
    t = datetime.fromtimestamp(ms / 1000, UTC)
    if long_span:
        return t.strftime("%m-%d %H:%M")
    return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _status_ink(status: str) -> str:
    return {"ACTIVE": "#1b641b", "RECOVERY_FAILED": "#b35900", "CANCELLED": "#111",
            "FINISHED": "#444", "FAILED": "#a00"}.get(status, "#666")


def _defs() -> str:
    return "<defs>" + "".join(f'<g id="m-{name}">{body}</g>'
                              for name, (body, _) in _SYMBOLS.items()) + "</defs>"


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[object]], empty: str, *,
           reason_col: int | None, cls: str, wrap_col: int | None = None) -> str:
    if not rows:
        return f'<section><h2>{_e(title)}</h2><p class="empty">{_e(empty)}</p></section>\n'
    shown = rows[:MAX_TABLE_ROWS]
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    trs = "".join(
        "<tr>" + "".join(
            f'<td class="{_cell_class(i, reason_col, wrap_col)}">{_e(v)}</td>'
            if i in (reason_col, wrap_col) else f"<td>{_e(v)}</td>"
            for i, v in enumerate(row)) + "</tr>"
        for row in shown)
    more = (f'<p class="note">{len(rows) - len(shown)} more row(s) left out (at most '
            f"{MAX_TABLE_ROWS}).</p>" if len(rows) > len(shown) else "")
    return (f'<section><h2>{_e(title)} <span class="count">({len(rows)})</span></h2>'
            f'<div class="scroll"><table class="{cls}"><thead><tr>{th}</tr></thead>'
            f"<tbody>{trs}</tbody></table></div>{more}</section>\n")


def _cell_class(i: int, reason_col: int | None, wrap_col: int | None) -> str:
    return "reason" if i == reason_col else "wrap"


def _lines(parts: Iterable[str]) -> str:
    return "\n".join(parts)


_STYLE = _lines((
    "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#111;"
    "margin:16px;background:#fff}",
    "h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:18px 0 6px}"
    "h3{font-size:14px;margin:12px 0 4px;font-family:ui-monospace,monospace}",
    "header dl{display:grid;grid-template-columns:max-content 1fr;gap:1px 12px;margin:0 0 6px}",
    "header dt{color:#555}header dd{margin:0;font-family:ui-monospace,monospace}",
    ".pills{display:flex;gap:8px;flex-wrap:wrap}",
    ".pill{border:1px solid #bbb;border-radius:10px;padding:1px 9px;background:#f6f6f6}",
    ".pill.bad{background:#fde2e2;border-color:#d62728;color:#8b0000}",
    ".pill.warn{background:#fff1d6;border-color:#e69f00}",
    ".pill.q{background:#f1dcf5;border-color:#9c27b0}",
    ".notes{background:#fff8e1;border:1px solid #e6c200;padding:6px 6px 6px 26px;margin:8px 0}",
    ".scroll{overflow-x:auto}",
    "svg.timeline{display:block;border:1px solid #ccc;background:#fff}",
    ".caption{color:#555;font-size:12px;margin:4px 0}",
    ".legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px}",
    ".key{display:inline-flex;align-items:center;gap:3px}",
    "table{border-collapse:collapse;font-size:12.5px}",
    "th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top;"
    "white-space:nowrap}",
    "td.wrap{white-space:normal;min-width:24em}",
    "th{background:#eee}tbody tr:nth-child(even){background:#fafafa}",
    "table.refused td.reason{color:#b00000;font-weight:600}",
    "table.quar td.reason{color:#6a1b9a;font-weight:600}",
    "pre{background:#f6f6f6;border:1px solid #ddd;padding:8px;white-space:pre-wrap;"
    "margin:0 0 8px}",
    ".empty,.note,.count{color:#666}",
))
