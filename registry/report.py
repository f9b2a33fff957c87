"""A self-contained HTML incident report: the fold's verdicts drawn, so nobody reads logs.

:func:`render_report` replays one namespace once (:meth:`Forensics.scan`: the
final :class:`~registry.image.Image`, every :class:`~registry.image.Decision`
in log order and every term) and draws and tells only what those say; no fold
rule is restated here. :func:`write_report` writes the page atomically.

**The page**, top to bottom:

* **What happened**: a summary generated from the verdicts, a headline
  sentence then one line each: the records and the time they span; the
  leadership terms and failovers (a term followed by another leader's); the
  refused writes, by writer; the resurrection attempts refused (writes refused
  as ``terminal_job``); the jobs that failed recovery, with their errors; the
  ignored checkpoint failures; restarts and jobs over their checkpoint failure
  budget; the job results still dirty (cleanup pending) and those cleaned; the
  quarantined and duplicate records; the jobs by status at the end of the log.
  One last line names the kinds of trouble that did not happen.
* A header (namespace, topic, offset and time range, counts by outcome, when
  the page was made).
* The timeline picture, its legend, then **why each job is in its state**
  (:meth:`Forensics.explain`) for every job with something to explain: a
  status other than ``ACTIVE``, a refused, ignored or quarantined record, a
  failed recovery or a restart, checkpoint failures over budget, or a dirty
  result (all drawn jobs when there are at most :data:`AUTO_EXPLAIN_ALL`; the
  jobs asked for when ``jobs`` is given). The plainly ``ACTIVE`` jobs not
  explained are named in one line.
* Tables of the refused writes, the quarantined records and the leadership terms.

**The picture** (inline SVG: a fixed column of lane names and a plot that
scrolls sideways on its own when the window is narrower than the plot; the
plot is 32 px per offset drawn, at least 480 and at most 1,100 px wide, so a
short log fits an 800-px window and none scrolls in a 1,400-px one) encodes:

* **x axis: log offset**, linear between the first and last record drawn. Log
  order is the truth; offsets label the ticks above the lanes. **Time** (UTC,
  the broker timestamps) is written below the lanes: the first record's time
  to the ms, then round times (a 1-2-5 step of ms, s, min, h or days, coarse
  ones first, finer ones where they fit), each placed where the log reached
  that time (interpolated between the records around it; a stamp that steps
  back counts as the latest before it): the time scale is not linear, no time
  is written twice, and labels never overlap. No label where no record carries
  a timestamp.
* **Background bands: leadership terms.** One colour per epoch, labelled
  ``epoch N · leader`` in the row above the lanes. A band starts at its grant
  and ends at its revoke (a dashed line), at the next grant, or at the last
  record drawn; no band means no term (before the first grant, or after a revoke).
* **Lanes**, top to bottom: ``leadership`` (grants ▲, revokes ▼, lease
  renewals |, committed calls □, and any record that names no job),
  ``quarantined`` (records the fold could not decode, purple ◆; only when
  the window has any), then one lane per job (submit ●, adopt ◆, release ◇,
  cancel ■, terminate ■ grey, reassert ○, recovery failed ▼ orange, restart
  ↻, result cleaned up ✓ in a box; checkpoints: triggered ▷ grey, completed ✓
  green, failed ! orange, discarded ⊘ grey). A job lane's name links to its
  explanation (when the page has one); a red edge left of the name marks a
  job with something to explain (its tooltip says what).
* **Outcome overrides shape**: a refused write (``REJECTED``) is a red ✕ on
  a red halo, an ``IGNORED`` record an amber ring, a ``DUPLICATE`` a small
  dashed grey ring. Every mark's ``<title>`` (the tooltip) gives offset,
  time, type, outcome, job, writer, epoch, reason and detail.
* **The legend** shows only the symbols the picture uses, grouped, and what
  a band, a dashed revoke line and the red edge mean.
* **Large logs**: beyond :data:`MAX_MARKS` marks, marks of accepted and
  duplicate records (not grants or revokes) are thinned to one per lane,
  symbol and few-pixel column, deterministically; every refused, ignored and
  quarantined record is always drawn. The page says when it thinned, and how
  many job lanes (beyond :data:`MAX_LANES`), explanations and table rows it
  left out; the summary names at most :data:`MAX_NAMED` items per line.

The page loads nothing: inline ``<style>`` only, no script, and a
``Content-Security-Policy`` that forbids every fetch (links are to anchors
in the page). Every string that comes from the log is HTML-escaped. The
output is a function of the log and the arguments alone (pass
``generated_at`` for byte-identical pages).
"""

from __future__ import annotations

import bisect
import html
import itertools
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .errors import ConfigError
from .events import GraphRef, JobStatus
from .files import atomic_write
from .forensics import Forensics, Scan, TermSummary
from .image import Decision, Image, JobView, Outcome
from .keys import check_id, parse_key

__all__ = ["AUTO_EXPLAIN_ALL", "MAX_EXPLAINED", "MAX_LANES", "MAX_MARKS", "MAX_NAMED",
           "MAX_TABLE_ROWS", "render_report", "write_report"]

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
MAX_NAMED = 8
"""Items (records, jobs, terms) the summary names per line at most; it counts the rest."""

_Scale = Callable[[float], float]

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_ALWAYS_DRAWN_TYPES = frozenset({"LeadershipGranted", "LeadershipRevoked"})

# -- geometry of the picture (SVG user units = CSS px at 100 %) ------------------------------
_LABEL_W = 230         # the column of lane names (its own SVG, never scrolled)
_PLOT_MAX = 1100       # the plot (its own SVG, scrolled sideways in a narrow window) ...
_PLOT_MIN = 480        # ... at most this wide and at least this wide, ...
_PER_OFFSET = 32       # ... and no wider than this much per offset (a short log stays narrow)
_PX0, _PAD_RIGHT = 14, 26
_BAND_ROW = 22         # term labels
_AXIS_ROW = 20         # offset tick labels
_LANES_TOP = _BAND_ROW + _AXIS_ROW + 4
_LANE_H = 24
_BOTTOM = 44           # time tick labels and the date
_CHAR_W = 6.3          # rough width of a character at font-size 11 (for fitting labels)
_TIME_CHAR_W = 6.0     # the same at font-size 10 (time labels)
_TIME_GAP = 14         # at least this much room between two time labels

_BAND_FILLS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#d9d2e9", "#d0e0e3", "#fce5cd", "#e6e6e6")
_BAND_INKS = ("#1c4587", "#274e13", "#7f6000", "#351c75", "#0c343d", "#783f04", "#333333")
_ATTENTION = "#d62728"

# symbol id -> (SVG body drawn around 0,0; legend text; legend group)
_SYMBOLS: dict[str, tuple[str, str, str]] = {
    "grant": ('<path d="M0,-7L6.5,5H-6.5Z" fill="#2ca02c" stroke="#1b641b"/>',
              "leadership granted", "Leadership"),
    "revoke": ('<path d="M0,7L6.5,-5H-6.5Z" fill="#555" stroke="#222"/>',
               "leadership revoked", "Leadership"),
    "renew": ('<path d="M0,-6V6" stroke="#7f7f7f" stroke-width="2"/>', "lease renewed",
              "Leadership"),
    "call": ('<rect x="-4" y="-4" width="8" height="8" fill="#fff" stroke="#666" '
             'stroke-width="1.5"/>', "call committed (its records applied together)",
             "Leadership"),
    "submit": ('<circle r="5.5" fill="#1f77b4" stroke="#0d3c61"/>', "submitted", "Jobs"),
    "adopt": ('<path d="M0,-6.5L6.5,0L0,6.5L-6.5,0Z" fill="#17becf" stroke="#0b6e78"/>',
              "adopted (lock taken)", "Jobs"),
    "release": ('<path d="M0,-6L6,0L0,6L-6,0Z" fill="#fff" stroke="#0b6e78" '
                'stroke-width="1.8"/>', "lock released", "Jobs"),
    "cancel": ('<rect x="-5.5" y="-5.5" width="11" height="11" fill="#111"/>',
               "cancelled", "Jobs"),
    "terminate": ('<rect x="-5.5" y="-5.5" width="11" height="11" fill="#777" stroke="#111"/>',
                  "terminated (finished/failed)", "Jobs"),
    "reassert": ('<circle r="5" fill="#fff" stroke="#1f77b4" stroke-width="2"/>',
                 "state reasserted", "Jobs"),
    "recovery": ('<path d="M0,7L6.5,-5H-6.5Z" fill="#ff7f0e" stroke="#8a4500"/>',
                 "recovery failed", "Jobs"),
    "restart": ('<path d="M4.6,-2.6A5.3,5.3 0 1 0 5.2,1.6" fill="none" stroke="#b35900" '
                'stroke-width="2.2"/><path d="M1.2,-5.6L6.8,-5.2L5.2,0Z" fill="#b35900"/>',
                "restarted (checkpoint failures over budget)", "Jobs"),
    "cleaned": ('<rect x="-5.5" y="-5.5" width="11" height="11" fill="#fff" stroke="#777" '
                'stroke-width="1.3"/><path d="M-3.2,0.2L-0.8,2.8L3.4,-2.8" fill="none" '
                'stroke="#2ca02c" stroke-width="2"/>', "result cleaned up", "Jobs"),
    "cp-triggered": ('<path d="M-3.5,-5L4.5,0L-3.5,5Z" fill="#fff" stroke="#888" '
                     'stroke-width="1.5"/>', "triggered", "Checkpoints"),
    "cp-completed": ('<path d="M-5,0.5L-1.5,4.5L5,-5" fill="none" stroke="#2ca02c" '
                     'stroke-width="3" stroke-linecap="round" stroke-linejoin="round"/>',
                     "completed", "Checkpoints"),
    "cp-failed": ('<circle r="5.8" fill="#ff7f0e" stroke="#8a4500"/>'
                  '<path d="M0,-3.4V0.8M0,2.8V3.3" stroke="#fff" stroke-width="2"/>',
                  "failed (counted)", "Checkpoints"),
    "cp-discarded": ('<circle r="4.8" fill="#fff" stroke="#999" stroke-width="1.5"/>'
                     '<path d="M-3.3,3.3L3.3,-3.3" stroke="#999" stroke-width="1.5"/>',
                     "discarded", "Checkpoints"),
    "other": ('<circle r="4" fill="#999"/>', "other record", "Records"),
    "rejected": ('<circle r="9" fill="#d62728" fill-opacity="0.18"/>'
                 '<path d="M-5.5,-5.5L5.5,5.5M-5.5,5.5L5.5,-5.5" stroke="#d62728" '
                 'stroke-width="3" stroke-linecap="round"/>', "REFUSED write (rejected)",
                 "Verdicts"),
    "ignored": ('<circle r="6" fill="none" stroke="#e69f00" stroke-width="2.5"/>',
                "ignored (kept, no effect)", "Verdicts"),
    "duplicate": ('<circle r="5" fill="none" stroke="#555" stroke-width="1.6" '
                  'stroke-dasharray="2.5,1.5"/>', "duplicate (no second effect)", "Verdicts"),
    "quarantined": ('<path d="M0,-7.5L7.5,0L0,7.5L-7.5,0Z" fill="#9c27b0" stroke="#4a0072"/>'
                    '<path d="M0,-3.5V1M0,3V3.6" stroke="#fff" stroke-width="1.8"/>',
                    "QUARANTINED (undecodable)", "Verdicts"),
}
_GROUPS = ("Leadership", "Jobs", "Checkpoints", "Records", "Verdicts")

_TYPE_SYMBOL = {
    "LeadershipGranted": "grant",
    "LeadershipRevoked": "revoke",
    "LeaseRenewed": "renew",
    "CallCommitted": "call",
    "JobSubmitted": "submit",
    "JobAdopted": "adopt",
    "JobLockReleased": "release",
    "JobCancelled": "cancel",
    "JobTerminated": "terminate",
    "JobReasserted": "reassert",
    "JobRecoveryFailed": "recovery",
    "JobRestarted": "restart",
    "JobCleanedUp": "cleaned",
    "CheckpointTriggered": "cp-triggered",
    "CheckpointCompleted": "cp-completed",
    "CheckpointFailed": "cp-failed",
    "CheckpointDiscarded": "cp-discarded",
}

# Time axis steps (ms): 1-2-5 of ms, then seconds, minutes, hours and days.
_TIME_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000,
               30_000, 60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000,
               7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000, 172_800_000,
               604_800_000)
_DAY = 86_400_000


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
        self.by_job: dict[str, list[Decision]] = {}
        for d in scanned.decisions:
            if d.job_id is not None:
                self.by_job.setdefault(d.job_id, []).append(d)

    def scan(self) -> Scan:
        return self._scanned

    def explain(self, job_id: str) -> str:
        # Forensics.explain, with the job's timeline from an index instead of a filter per job.
        check_id("job id", job_id)
        return self.explain_from(self._scanned.image, self.by_job.get(job_id, []), job_id)


@dataclass(frozen=True)
class _Lane:
    name: str           # shown (escaped at drawing time)
    kind: str           # "leadership", "quarantined" or "job"
    status: str = ""    # the job's status at the end of the log


def _esc(value: object) -> str:
    """Escape anything for HTML text and attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


def _iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "…"


def _px(x: float) -> str:
    return f"{x:.1f}"


def _n(count: int, one: str, many: str | None = None) -> str:
    """``1 record``, ``2 records``."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _duration(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min {ms % 60_000 // 1000} s"
    if ms < _DAY:
        return f"{ms // 3_600_000} h {ms % 3_600_000 // 60_000} min"
    return f"{ms // _DAY} d {ms % _DAY // 3_600_000} h"


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


def _job_of(d: Decision) -> str | None:
    """The job a record is about: its event's, or a quarantined record's key's."""
    return _quarantined_job(d) if d.outcome == Outcome.QUARANTINED else d.job_id


def render_report(forensics: Forensics, *, jobs: Sequence[str] | None = None,
                  since: int | None = None, until: int | None = None,
                  title: str | None = None, generated_at: int | None = None) -> str:
    """The incident report of ``forensics``'s namespace as one self-contained HTML page.

    ``since``/``until`` (ms since the Unix epoch, inclusive) select the records
    drawn by their broker timestamp; records without one are kept. ``jobs``
    selects the job lanes (default: every job with a record in the window, at
    most :data:`MAX_LANES`, the jobs with something to explain first) and the
    jobs explained (default: every job in the window with something to explain
    - not ``ACTIVE``, a refused, ignored or quarantined record, a failed
    recovery or restart, over its checkpoint failure budget, a dirty result -
    or all drawn jobs if at most :data:`AUTO_EXPLAIN_ALL`). The summary
    at the top covers the window. ``generated_at`` (ms) is the time the page
    says it was made (default: now).

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
        self.windowed = since is not None or until is not None
        self.title = title or f"jobreg incident report: {image.namespace}"
        self.generated_at = generated_at
        self.notes: list[str] = []
        self.window = [d for d in decisions if self._in_window(d.timestamp)]
        self.terms = self._window_terms()
        self.first = self._first_seen()
        self.quarantined_on = Counter(_quarantined_job(d) for d in self.window
                                      if d.outcome == Outcome.QUARANTINED)
        self.flags = {job: flags for job in self.first if (flags := self._flags(job))}
        self.wanted = wanted
        self._choose_lanes(wanted)
        self._choose_explained(wanted)
        self.used: set[str] = set()  # the symbols the picture draws (for its legend)
        self.plot_w = _PLOT_MAX        # the plot's width (set by the picture)

    # -- selection -----------------------------------------------------------------------------

    def _in_window(self, ts: int | None) -> bool:
        if ts is None:
            return True
        return (self.since is None or ts >= self.since) and (self.until is None or ts <= self.until)

    def _window_terms(self) -> list[TermSummary]:
        terms = self.f.terms()
        if self.windowed:
            w = self.window
            lo, hi = (w[0].offset, w[-1].offset) if w else (0, -1)
            terms = [t for t in terms if t.last_offset >= lo and t.first_offset <= hi]
        return terms

    def _first_seen(self) -> dict[str, int]:
        """Every job with a record in the window (a quarantined record's key counts), with the
        offset of its first one, in that order."""
        first: dict[str, int] = {}
        for d in self.window:
            job = _job_of(d)
            if job is not None:
                first.setdefault(job, d.offset)
        return first

    def _flags(self, job: str) -> list[str]:
        """What there is to explain about a job, for people (empty: plainly ACTIVE)."""
        counts: Counter[str] = Counter()
        for d in self.f.by_job.get(job, []):
            if self._in_window(d.timestamp):
                if d.outcome == Outcome.ACCEPTED and d.event_type in ("JobRecoveryFailed",
                                                                      "JobRestarted"):
                    counts[d.event_type] += 1
                else:
                    counts[d.outcome] += 1
        counts[Outcome.QUARANTINED] = self.quarantined_on[job]
        view = self.image.jobs.get(job)
        out: list[str] = []
        if view is None:
            out.append("not in the registry")
        elif view.status != JobStatus.ACTIVE:
            out.append(view.status)
        if counts["JobRecoveryFailed"]:
            out.append("failed recovery" + (f" {counts['JobRecoveryFailed']} times"
                                            if counts["JobRecoveryFailed"] > 1 else ""))
        for key, one in ((Outcome.REJECTED, "refused write"), (Outcome.IGNORED, "ignored record"),
                         (Outcome.QUARANTINED, "quarantined record"),
                         ("JobRestarted", "restart")):
            if counts[key]:
                out.append(_n(counts[key], one))
        if view is not None and view.over_budget:
            out.append("checkpoint failures over budget")
        if view is not None and view.dirty:
            out.append("result dirty")
        return out

    def _choose_lanes(self, wanted: list[str] | None) -> None:
        first = self.first
        if wanted is None:
            # Jobs with something to explain first, then by first appearance; drawn in log order.
            ranked = sorted(first, key=lambda j: (j not in self.flags, first[j], j))
            chosen = ranked[:MAX_LANES]
            left_out = len(ranked) - len(chosen)
            chosen.sort(key=lambda j: (first[j], j))
        else:
            chosen = wanted[:MAX_LANES]
            left_out = len(wanted) - len(chosen)
        if left_out:
            self.notes.append(
                f"{left_out} job lane(s) left out (at most {MAX_LANES} are drawn; jobs with "
                "something to explain first). The tables below list every record.")
        self.job_lanes = chosen
        self.lanes = [_Lane("leadership", "leadership")]
        if any(d.outcome == Outcome.QUARANTINED for d in self.window):
            self.lanes.append(_Lane("quarantined", "quarantined"))
        base = len(self.lanes)
        for j in chosen:
            view = self.image.jobs.get(j)
            self.lanes.append(_Lane(j, "job", view.status if view is not None else "unknown"))
        self.lane_of_job = {j: i + base for i, j in enumerate(chosen)}
        empty = [j for j in chosen if j not in first]
        if empty:
            self.notes.append(f"{len(empty)} job lane(s) have no record in the window: "
                              + ", ".join(_clip(j, 40) for j in empty[:10])
                              + (", …" if len(empty) > 10 else "") + ".")

    def _choose_explained(self, wanted: list[str] | None) -> None:
        if wanted is not None:
            chosen = list(wanted)
            self.plain: list[str] = []
        else:
            notable = [j for j in self.first if j in self.flags]
            self.plain = [j for j in self.first if j not in self.flags]
            chosen = notable
            if len(self.job_lanes) <= AUTO_EXPLAIN_ALL:
                chosen = notable + [j for j in self.plain if j in self.lane_of_job]
                self.plain = [j for j in self.plain if j not in self.lane_of_job]
        self.explained = chosen[:MAX_EXPLAINED]
        self.has_explanation = set(self.explained)
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
        summary = self._summary()
        timeline = self._timeline()  # before the notes: it may add one (thinning)
        body = [self._header(), timeline, self._explain(), self._refused(),
                self._quarantined(), self._terms_table()]
        notes = "".join(f"<li>{_esc(n)}</li>" for n in self.notes)
        notes_html = f'<ul class="notes">{notes}</ul>\n' if notes else ""
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{_esc(CSP)}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<meta name="generator" content="jobreg report">\n'
            f"<title>{_esc(self.title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{_esc(self.title)}</h1>\n" + summary + notes_html + "".join(body)
            + "\n</body>\n</html>\n")

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
        if self.windowed:
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
        dl = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in rows)
        pills = [("records", len(w), ""), ("accepted", counts[Outcome.ACCEPTED], ""),
                 ("rejected", counts[Outcome.REJECTED], "bad"),
                 ("ignored", counts[Outcome.IGNORED], "warn"),
                 ("quarantined", counts[Outcome.QUARANTINED], "q"),
                 ("duplicates", counts[Outcome.DUPLICATE], "")]
        pill_html = "".join(
            f'<span class="{"pill " + cls if n and cls else "pill"}"><b>{n}</b> {name}</span>'
            for name, n, cls in pills)
        return (f"<header><h2>The log</h2><dl>{dl}</dl>"
                f'<div class="pills">{pill_html}</div></header>\n')

    # -- the summary ---------------------------------------------------------------------------

    def _job(self, job: str | None) -> str:
        """A job's name, linked to its explanation when the page has one."""
        if job is None:
            return "(no job)"
        if job in self.has_explanation:
            return f'<a href="#job-{_esc(job)}">{_esc(job)}</a>'
        return f"<code>{_esc(job)}</code>"

    def _by(self, d: Decision) -> str:
        return f"{_esc(d.writer or 'an unknown writer')} (epoch {_esc(d.epoch)})"

    @staticmethod
    def _named(items: list[str], total: int | None = None) -> str:
        """The first :data:`MAX_NAMED` items, then how many more."""
        total = len(items) if total is None else total
        shown = items[:MAX_NAMED]
        return "; ".join(shown) + (f"; and {total - len(shown)} more" if total > len(shown)
                                   else "")

    def _summary(self) -> str:
        lines: list[tuple[str, str]] = []  # (class: bad/warn/ok/"", HTML)
        headline: list[str] = []
        w = self.window
        where = "in the window" if self.windowed else "in the log"
        stamps = [d.timestamp for d in w if d.timestamp is not None]
        if not w:
            lines.append(("", f"No record {where}."))
        else:
            span = (f" over {_duration(max(stamps) - min(stamps))} ({_esc(_iso(min(stamps)))} to "
                    f"{_esc(_iso(max(stamps)))})" if stamps else "")
            lines.append(("", f"{_n(len(w), 'record')} {where}, offsets {w[0].offset} to "
                              f"{w[-1].offset}{span}."))
        lines.append(self._summary_terms(headline))
        lines += self._summary_refused(headline)
        lines += self._summary_recovery(headline)
        lines += self._summary_checkpoints(headline)
        lines += self._summary_results(headline)
        lines += self._summary_records(headline)
        lines.append(self._summary_jobs())
        absent = [text for cls, text in lines if cls == "ok"]
        lines = [(cls, text) for cls, text in lines if cls != "ok"]
        if absent and w:
            lines.append(("ok", "None of these happened: " + ", ".join(absent) + "."))
        head = ("; ".join(headline) + ".") if headline else "No trouble found."
        items = "".join(f'<li class="{cls}">{text}</li>' if cls else f"<li>{text}</li>"
                        for cls, text in lines)
        return (f'<section class="summary" id="summary"><h2>What happened</h2>'
                f'<p class="headline">{_esc(head[0].upper() + head[1:])}</p>'
                f"<ul>{items}</ul></section>\n")

    def _summary_terms(self, headline: list[str]) -> tuple[str, str]:
        terms = self.terms
        if not terms:
            return ("warn", "No leadership term was granted "
                    + ("in the window." if self.windowed else "(nobody could write)."))
        failovers = sum(1 for a, b in itertools.pairwise(terms) if a.leader != b.leader)
        steps = [f"epoch {terms[0].epoch} <b>{_esc(terms[0].leader)}</b> from offset "
                 f"{terms[0].first_offset}"]
        for a, b in itertools.pairwise(terms):
            if a.end == "revoked":
                how = f"after {_esc(a.leader)} revoked epoch {a.epoch} at {a.end_offset}"
            else:
                how = f"epoch {a.epoch} ended without a revoke"
            moved = "took over" if a.leader != b.leader else "was granted again"
            steps.append(f"epoch {b.epoch} <b>{_esc(b.leader)}</b> {moved} at offset "
                         f"{b.first_offset} ({how})")
        if len(steps) > 2 * MAX_NAMED // 2 + 1:
            half = MAX_NAMED // 2
            steps = steps[:half] + [f"… {len(steps) - 2 * half} more …"] + steps[-half:]
        leader = self.image.active_leader
        end = (f"{_esc(leader.contender)} leads (epoch {leader.epoch}) at the end of the log"
               if leader is not None else
               f"nobody leads at the end of the log (epoch {self.image.epoch} "
               + ("was revoked)" if self.image.revoked else "has no active leader)"))
        moves = _n(failovers, "failover") if failovers else "no failover"
        text = f"{_n(len(terms), 'leadership term')}, {moves}: " + " → ".join(steps) + f". {end}."
        headline.append(f"{_n(len(terms), 'leadership term')}, {moves}")
        return ("", text)

    def _summary_refused(self, headline: list[str]) -> list[tuple[str, str]]:
        refused = [d for d in self.window if d.outcome == Outcome.REJECTED]
        if not refused:
            return [("ok", "a refused write"),
                    ("ok", "a resurrection attempt (a write refused as terminal_job)")]
        by_writer: dict[str, list[Decision]] = {}
        for d in refused:
            by_writer.setdefault(d.writer or "an unknown writer", []).append(d)
        parts = []
        for writer, ds in by_writer.items():
            reasons = Counter(d.reason for d in ds)
            what = ", ".join(f"{_esc(r)} ×{n}" if n > 1 else _esc(r) for r, n in reasons.items())
            # the first refusal that is not a resurrection attempt (those have a line below)
            first = next((d for d in ds if d.reason != "terminal_job"), None)
            parts.append(f"<b>{_esc(writer)}</b>: {_n(len(ds), 'write')} ({what})"
                         + ("" if first is None else
                            f", first {_esc(first.event_type)} of {self._job(first.job_id)} at "
                            f"offset {first.offset}: {_esc(_clip(first.detail, 160))}"))
        writers = ", ".join(by_writer)
        headline.append(f"{_n(len(refused), 'write')} refused (by {writers})")
        out = [("bad", f"{_n(len(refused), 'write')} refused, by writer: "
                + self._named(parts) + ".")]
        resurrect = [d for d in refused if d.reason == "terminal_job"]
        if resurrect:
            headline.append(_n(len(resurrect), "resurrection attempt") + " refused")
            items = [f"{self._by(d)} wrote {_esc(d.event_type)} for {self._job(d.job_id)} at "
                     f"offset {d.offset}: {_esc(_clip(d.detail, 160))}" for d in resurrect]
            out.append(("bad", f"{_n(len(resurrect), 'resurrection attempt')} refused (writes "
                        "refused as terminal_job: a cancelled, finished or failed job never "
                        "comes back): " + self._named(items) + "."))
        else:
            out.append(("ok", "a resurrection attempt (a write refused as terminal_job)"))
        return out

    def _summary_recovery(self, headline: list[str]) -> list[tuple[str, str]]:
        failed: dict[str, list[Decision]] = {}
        for d in self.window:
            if d.accepted and d.event_type == "JobRecoveryFailed" and d.job_id is not None:
                failed.setdefault(d.job_id, []).append(d)
        for job, view in self.image.jobs.items():
            if view.status == JobStatus.RECOVERY_FAILED and job in self.first:
                failed.setdefault(job, [])
        if not failed:
            return [("ok", "a failed recovery")]
        items = []
        for job, ds in failed.items():
            view = self.image.jobs.get(job)
            when = (" at offset " + ", ".join(str(d.offset) for d in ds)
                    + f" by {self._by(ds[-1])}" if ds else "")
            if view is not None and view.status == JobStatus.RECOVERY_FAILED:
                items.append(f"{self._job(job)} failed recovery{when}: "
                             f"<b>{_esc(_clip(view.error or 'no error recorded', 300))}</b>; "
                             "still RECOVERY_FAILED at the end of the log (no term recovers "
                             "it until it is retried or cancelled)")
            else:
                status = view.status if view is not None else "not in the registry"
                items.append(f"{self._job(job)} failed recovery{when}; {_esc(status)} at the end "
                             "of the log")
        headline.append(_n(len(failed), "job") + " failed recovery ("
                        + ", ".join(list(failed)[:MAX_NAMED])
                        + (", …" if len(failed) > MAX_NAMED else "") + ")")
        return [("bad", f"{_n(len(failed), 'job')} failed recovery: " + self._named(items)
                 + ".")]

    def _summary_checkpoints(self, headline: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        ignored = [d for d in self.window if d.outcome == Outcome.IGNORED
                   and d.event_type == "CheckpointFailed"]
        if ignored:
            headline.append(_n(len(ignored), "checkpoint failure") + " ignored")
            items = [f"{self._job(d.job_id)} at offset {d.offset}: {_esc(_clip(d.detail, 160))}"
                     for d in ignored]
            out.append(("warn", f"{_n(len(ignored), 'checkpoint failure')} ignored (kept, not "
                        "counted): " + self._named(items) + "."))
        restarts = [d for d in self.window if d.accepted and d.event_type == "JobRestarted"]
        if restarts:
            headline.append(_n(len(restarts), "restart"))
            items = [f"{self._job(d.job_id)} at offset {d.offset} by {self._by(d)}"
                     for d in restarts]
            out.append(("warn", f"{_n(len(restarts), 'job restart')} (checkpoint failures "
                        "over budget): " + self._named(items) + "."))
        over = [v for j, v in self.image.jobs.items() if j in self.first and v.over_budget]
        if over:
            headline.append(_n(len(over), "job") + " over checkpoint budget")
            items = [f"{self._job(v.job_id)} ("
                     f"{_n(v.checkpoints.consecutive_failures, 'consecutive failure')}, "
                     f"{v.max_checkpoint_failures} tolerable)" for v in over]
            out.append(("bad", f"{_n(len(over), 'job')} over its checkpoint failure budget at "
                        "the end of the log (restart or fail it): " + self._named(items) + "."))
        if not ignored:
            out.append(("ok", "an ignored checkpoint failure"))
        if not over:
            out.append(("ok", "a job over its checkpoint failure budget"))
        return out

    def _summary_results(self, headline: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        dirty = [v for j, v in self.image.jobs.items() if j in self.first and v.dirty]
        if dirty:
            headline.append(_n(len(dirty), "job result") + " still dirty")
            items = [f"{self._job(v.job_id)} ({_esc(v.status)}; holds {_esc(_holds(v))})"
                     for v in dirty]
            out.append(("warn", f"{_n(len(dirty), 'job result')} still dirty at the end of the "
                        "log (cleanup pending: its graph and checkpoints not deleted yet): "
                        + self._named(items) + "."))
        cleaned = [d for d in self.window if d.accepted and d.event_type == "JobCleanedUp"]
        if cleaned:
            items = [f"{self._job(d.job_id)} at offset {d.offset} by {self._by(d)}"
                     for d in cleaned]
            out.append(("", f"{_n(len(cleaned), 'job result')} marked clean: "
                        + self._named(items) + "."))
        if not dirty:
            out.append(("ok", "a dirty job result"))
        return out

    def _summary_records(self, headline: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        quarantined = [d for d in self.window if d.outcome == Outcome.QUARANTINED]
        if quarantined:
            headline.append(_n(len(quarantined), "record") + " quarantined")
            items = [f"offset {d.offset}"
                     + (f" on {self._job(j)}'s key" if (j := _quarantined_job(d)) else
                        f" (key {_esc(_clip(d.key or 'none', 60))})")
                     + f": {_esc(d.reason)}" for d in quarantined]
            out.append(("bad", f"{_n(len(quarantined), 'record')} quarantined (the fold could "
                        "not decode it; no effect): " + self._named(items) + "."))
        else:
            out.append(("ok", "a quarantined record"))
        other = [d for d in self.window if d.outcome == Outcome.IGNORED
                 and d.event_type != "CheckpointFailed"]
        if other:
            items = [f"{_esc(d.event_type)} of {self._job(d.job_id)} at offset {d.offset}: "
                     f"{_esc(_clip(d.detail, 160))}" for d in other]
            out.append(("warn", f"{_n(len(other), 'other record')} kept but ignored: "
                        + self._named(items) + "."))
        dups = sum(1 for d in self.window if d.outcome == Outcome.DUPLICATE)
        if dups:
            out.append(("", f"{_n(dups, 'duplicate record')} (a copy of an event already in "
                            "the log, as a retried write leaves; no second effect)."))
        return out

    def _summary_jobs(self) -> tuple[str, str]:
        views = [v for j, v in self.image.jobs.items() if j in self.first]
        if not views:
            return ("", "No job has a record " + ("in the window." if self.windowed
                                                  else "in the log."))
        by_status = Counter(v.status for v in views)
        order = [s for s in JobStatus.ALL if s in by_status] + sorted(
            s for s in by_status if s not in JobStatus.ALL)
        explained = sum(1 for j in self.explained if j in self.flags)
        return ("", f"{_n(len(views), 'job')} at the end of the log: "
                + ", ".join(f"{by_status[s]} {_esc(s)}" for s in order)
                + (f"; {explained} with something to explain, <a href=\"#why\">below</a>"
                   if explained else "") + ".")

    # -- the picture ---------------------------------------------------------------------------

    def _timeline(self) -> str:
        w = self.window
        if not w:
            return ('<section><h2>Timeline</h2><p class="empty">No records in the window.'
                    "</p></section>\n")
        lo, hi = w[0].offset, w[-1].offset
        pad = max(0.6, (hi - lo) * 0.012)
        dlo, dhi = lo - pad, hi + pad
        self.plot_w = round(min(_PLOT_MAX, max(_PLOT_MIN, (dhi - dlo) * _PER_OFFSET
                                               + _PX0 + _PAD_RIGHT)))
        scale = (self.plot_w - _PAD_RIGHT - _PX0) / (dhi - dlo)

        def x(offset: float) -> float:
            return _PX0 + (offset - dlo) * scale

        lanes_bottom = _LANES_TOP + _LANE_H * len(self.lanes)
        height = lanes_bottom + _BOTTOM
        plot: list[str] = [
            f'<svg class="tl-plot" viewBox="0 0 {self.plot_w} {height}" '
            f'width="{self.plot_w}" '
            f'height="{height}" font-family="system-ui, sans-serif" font-size="11">',
            "<title>Timeline: x is the log offset; bands are leadership terms; one lane per "
            "job</title>",
            _defs(),
        ]
        plot += self._bands(x, lo, hi, lanes_bottom)
        plot += self._lane_lines(self.plot_w)
        plot += self._axes(x, lo, hi, lanes_bottom)
        plot += self._marks(x)
        plot.append("</svg>")
        labels = [f'<svg class="tl-labels" viewBox="0 0 {_LABEL_W} {height}" '
                  f'width="{_LABEL_W}" height="{height}" font-family="system-ui, sans-serif" '
                  'font-size="11">']
        labels += self._lane_labels(lanes_bottom)
        labels.append("</svg>")
        caption = ("x: log offset (log order is the truth). Below the lanes: broker time (UTC), "
                   "each time written where the log reached it, so the time scale is not "
                   "linear. Bands: leadership terms. Hover a mark for its record; a job's name "
                   "links to its explanation.")
        return (f'<section><h2>Timeline</h2><div class="timeline" role="img" '
                f'aria-label="timeline of the log">{"".join(labels)}<div class="tl-scroll">'
                f'{"".join(plot)}</div></div><p class="caption">{_esc(caption)}</p>'
                f"{self._legend()}</section>\n")

    def _legend(self) -> str:
        extra: dict[str, list[tuple[str, str]]] = {g: [] for g in _GROUPS}
        fill = _BAND_FILLS[1]
        extra["Leadership"].append((f'<rect x="-9" y="-8" width="18" height="16" fill="{fill}"/>',
                                    "band: a leadership term (epoch · leader)"))
        if any(t.end == "revoked" for t in self.terms):
            extra["Leadership"].append(('<path d="M0,-9V9" stroke="#333" stroke-width="1.5" '
                                        'stroke-dasharray="4,3"/>', "dashed line: term revoked"))
        if any(lane.kind == "job" and lane.name in self.flags for lane in self.lanes):
            extra["Jobs"].append((f'<rect x="-2" y="-9" width="4" height="18" '
                                  f'fill="{_ATTENTION}"/>',
                                  "red edge: the job has something to explain (below)"))
        groups = []
        for group in _GROUPS:
            keys = [(body, text) for name, (body, text, g) in _SYMBOLS.items()
                    if g == group and name in self.used] + extra[group]
            if not keys:
                continue
            spans = "".join(f'<span class="key"><svg width="20" height="20" '
                            f'viewBox="-10 -10 20 20">{body}</svg>{_esc(text)}</span>'
                            for body, text in keys)
            groups.append(f'<div class="lg"><span class="lgname">{_esc(group)}</span>'
                          f'<span class="keys">{spans}</span></div>')
        return f'<div class="legend">{"".join(groups)}</div>'

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
            x0, x1 = max(x(start), 0.0), min(x(min(end, hi + 1)), float(self.plot_w))
            tip = (f"epoch {epoch} · leader {info.leader} · granted at {start} · {how}"
                   + (f" · lease {info.lease_ms} ms, {info.renewals} renewal(s)"
                      if info.lease_ms else ""))
            bands.append((epoch, x0, max(x1, x0 + 1.0), tip))
        out: list[str] = []
        label_end = 0.0
        for i, (epoch, x0, x1, tip) in enumerate(bands):
            info = by_epoch[epoch]
            fill, ink = _BAND_FILLS[epoch % len(_BAND_FILLS)], _BAND_INKS[epoch % len(_BAND_INKS)]
            width = x1 - x0
            out.append(f'<g class="band"><title>{_esc(tip)}</title>'
                       f'<rect x="{_px(x0)}" y="0" width="{_px(width)}" height="{_px(bottom)}" '
                       f'fill="{fill}" fill-opacity="0.75"/>'
                       f'<rect x="{_px(x0)}" y="0" width="{_px(width)}" height="{_BAND_ROW}" '
                       f'fill="{fill}"/>')
            if info.revoked_offset is not None and lo <= info.revoked_offset <= hi:
                out.append(f'<path d="M{_px(x1)},0V{_px(bottom)}" stroke="{ink}" '
                           'stroke-width="1.5" stroke-dasharray="4,3"/>')
            # The label starts in its band; it may reach left over an earlier band's unused
            # header, never right into the next band.
            right = bands[i + 1][1] - 4 if i + 1 < len(bands) else self.plot_w - 4
            for label in (f"epoch {epoch} · {info.leader}",
                          _clip(f"e{epoch} · {info.leader}", 16), f"e{epoch}"):
                need = len(label) * _CHAR_W
                start = max(2.0, min(x0 + 4, right - need))
                if start >= label_end + 8 or (start >= label_end and label == f"e{epoch}"):
                    out.append(f'<text x="{_px(start)}" y="15" fill="{ink}" font-weight="600">'
                               f"{_esc(label)}</text>")
                    label_end = start + need
                    break
            out.append("</g>")
        return out

    def _lane_lines(self, width: int) -> list[str]:
        return [f'<path d="M0,{_LANES_TOP + (i + 1) * _LANE_H}H{width}" stroke="#000" '
                'stroke-opacity="0.12"/>' for i in range(len(self.lanes))]

    def _lane_labels(self, bottom: float) -> list[str]:
        out = [f'<text x="{_LABEL_W - 8}" y="15" text-anchor="end" fill="#444" '
               'font-style="italic">leadership terms</text>',
               f'<text x="{_LABEL_W - 8}" y="{_BAND_ROW + 14}" text-anchor="end" fill="#444" '
               'font-style="italic">offset</text>']
        if any(d.timestamp is not None for d in self.window):
            out.append(f'<text x="{_LABEL_W - 8}" y="{_px(bottom + 15)}" text-anchor="end" '
                       'fill="#444" font-style="italic">time (UTC)</text>')
        out += self._lane_lines(_LABEL_W)
        for i, lane in enumerate(self.lanes):
            y = _LANES_TOP + i * _LANE_H
            mid = y + _LANE_H / 2
            if lane.kind == "job":
                flags = self.flags.get(lane.name, [])
                if flags:
                    out.append(f'<rect class="attention" x="0" y="{y + 2}" width="5" '
                               f'height="{_LANE_H - 4}" fill="{_ATTENTION}"><title>'
                               f"{_esc('to explain: ' + ', '.join(flags))}</title></rect>")
                tip = (f"job {lane.name} · at the end of the log: {lane.status}"
                       + (f" · {', '.join(flags)}" if flags else ""))
                name = (f'<text x="10" y="{_px(mid + 4)}">{_esc(_clip(lane.name, 21))}</text>'
                        f'<text x="{_LABEL_W - 8}" y="{_px(mid + 4)}" text-anchor="end" '
                        f'font-size="9" fill="{_status_ink(lane.status)}">{_esc(lane.status)}'
                        "</text>")
                if lane.name in self.has_explanation:
                    name = f'<a href="#job-{_esc(lane.name)}">{name}</a>'
                out.append(f"<g><title>{_esc(tip)}</title>{name}</g>")
            else:
                ink = "#4a0072" if lane.kind == "quarantined" else "#222"
                out.append(f'<text x="10" y="{_px(mid + 4)}" font-weight="700" fill="{ink}">'
                           f"{_esc(lane.name)}</text>")
        out.append(f'<path d="M{_LABEL_W - 0.5},{_LANES_TOP}V{_px(bottom)}" stroke="#000" '
                   'stroke-opacity="0.35"/>')
        return out

    def _axes(self, x: _Scale, lo: int, hi: int, bottom: float) -> list[str]:
        out: list[str] = []
        for tick in _ticks(lo, hi):
            tx = x(tick)
            label = str(tick)
            lx, anchor = _fit(tx, len(label) * _CHAR_W, self.plot_w)
            out.append(f'<path d="M{_px(tx)},{_BAND_ROW}V{_px(bottom)}" stroke="#000" '
                       'stroke-opacity="0.10"/>')
            out.append(f'<text class="ot" x="{_px(lx)}" y="{_BAND_ROW + 14}" '
                       f'text-anchor="{anchor}" fill="#444">{label}</text>')
        points = [(x(d.offset), d.timestamp) for d in self.window if d.timestamp is not None]
        for tx, label, ms in _time_ticks(points, self.plot_w):
            lx, anchor = _fit(tx, len(label) * _TIME_CHAR_W, self.plot_w)
            out.append(f'<path d="M{_px(tx)},{_px(bottom)}v5" stroke="#444"/>'
                       f'<text class="tt" x="{_px(lx)}" y="{_px(bottom + 16)}" '
                       f'text-anchor="{anchor}" font-size="10" fill="#333">'
                       f"<title>{_esc(_iso(ms))}</title>{_esc(label)}</text>")
        first = next((d.timestamp for d in self.window if d.timestamp is not None), None)
        if first is not None:
            out.append(f'<text x="{_PX0}" y="{_px(bottom + 34)}" fill="#666" font-size="10">'
                       f"{_esc(_iso(first)[:10])} (UTC date of the first record drawn)</text>")
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
            symbol = _symbol(d)
            self.used.add(symbol)
            out.append(f'<use href="#m-{symbol}" x="{_px(x(d.offset))}" y="{_px(cy)}">'
                       f"<title>{_esc(_tooltip(d))}</title></use>")
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
            if len(chosen) <= budget or column >= self.plot_w:
                break
            column *= 2
        self.notes.append(
            f"The picture has {len(placed)} marks, more than {MAX_MARKS}: marks of accepted and "
            f"duplicate records are thinned to one per lane, symbol and {column:g}-pixel column "
            f"({len(chosen)} of {len(thinnable)} drawn). Every refused, ignored and quarantined "
            "record, grant and revoke is drawn.")
        return sorted(kept + chosen, key=lambda p: p[1].offset)

    # -- explanations and tables ---------------------------------------------------------------

    def _explain(self) -> str:
        parts = ['<section id="why"><h2>Why each job is in its state</h2>']
        if self.wanted is not None:
            parts.append(f'<p class="lead">The {_n(len(self.wanted), "job")} asked for.</p>')
        elif self.explained:
            parts.append('<p class="lead">Every job with something to explain: a status other '
                         "than ACTIVE, a refused, ignored or quarantined record, a failed "
                         "recovery or a restart, checkpoint failures over budget, or a dirty "
                         "result" + (" (and, with this few jobs, every other one)"
                                     if any(j not in self.flags for j in self.explained)
                                     else "") + ".</p>")
        elif not self.first:
            parts.append('<p class="empty">No job has a record '
                         + ("in the window" if self.windowed else "in the log")
                         + ": nothing to explain.</p>")
        else:
            parts.append('<p class="empty">Every job is ACTIVE with nothing refused, ignored, '
                         "quarantined or failed: nothing to explain.</p>")
        for job in self.explained:
            flags = self.flags.get(job, [])
            tags = "".join(f'<span class="tag">{_esc(t)}</span>' for t in flags)
            parts.append(f'<h3 id="job-{_esc(job)}">{_esc(job)}</h3>'
                         + (f'<p class="tags">{tags}</p>' if tags else "")
                         + f"<pre>{_esc(self.f.explain(job))}</pre>")
        if self.plain:
            names = ", ".join(_esc(j) for j in self.plain[:40]) + (
                ", …" if len(self.plain) > 40 else "")
            parts.append(f'<p class="note">{_n(len(self.plain), "other job")} '
                         f"{'is' if len(self.plain) == 1 else 'are'} ACTIVE with nothing "
                         f"refused, ignored, quarantined or failed, not explained here: {names}. "
                         "Name one with --job to explain it.</p>")
        parts.append("</section>\n")
        return "".join(parts)

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

    def _terms_table(self) -> str:
        stamp = {d.offset: d.timestamp for d in self.all}
        head = ("epoch", "leader", "started", "granted at (UTC)", "ended", "first offset",
                "last offset", "accepted", "rejected")
        body = [(t.epoch, t.leader, t.started, _iso(stamp.get(t.first_offset)), t.ended,
                 t.first_offset, t.last_offset, t.accepted, t.rejected) for t in self.terms]
        return _table("Leadership terms", head, body, "No term was ever granted.",
                      reason_col=None, cls="terms")


def _holds(view: JobView) -> str:
    """What a dirty result still holds, for people."""
    graph = view.graph
    what = (f"its graph {graph.uri}" if isinstance(graph, GraphRef)
            else "its graph (inline)" if graph is not None else "no graph")
    return f"{what}, {_n(len(view.checkpoints.retained), 'retained checkpoint')}"


def _tooltip(d: Decision) -> str:
    lines = [f"offset {d.offset}" + (f" · {_iso(d.timestamp)}" if d.timestamp is not None
                                     else "")
             + f" · {d.event_type or '(undecodable)'} · {d.outcome}"]
    who = []
    job = _job_of(d)
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


def _fit(x: float, width: float, plot_w: int) -> tuple[float, str]:
    """Where to anchor a label of ``width`` centred on ``x`` so that it stays in the plot:
    ``(x, text-anchor)``."""
    if x - width / 2 < 2:
        return max(x, 2.0), "start"
    if x + width / 2 > plot_w - 2:
        return min(x, plot_w - 2.0), "end"
    return x, "middle"


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


def _time_label(ms: int, step: int, with_date: bool) -> str:
    t = datetime.fromtimestamp(ms / 1000, UTC)
    if step >= _DAY:
        return t.strftime("%m-%d")
    if step >= 60_000:
        text = t.strftime("%H:%M")
    elif step >= 1000:
        text = t.strftime("%H:%M:%S")
    else:
        text = t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"
    return t.strftime("%m-%d ") + text if with_date else text


def _time_ticks(points: Sequence[tuple[float, int]],
                plot_w: int) -> list[tuple[float, str, int]]:
    """The time axis: ``(x, label, ms)`` of round times, each where the log reached it.

    ``points`` are ``(x, timestamp)`` of the records drawn, in log order. The log
    "reaches" time T at the first record whose stamp (or an earlier record's: a stamp
    that steps back counts as the latest before it) is T or later; between two
    records, T is interpolated. Coarse steps are placed first, finer ones where
    they fit; a label never overlaps another, so no time is written twice.
    """
    if not points:
        return []
    xs = [p[0] for p in points]
    reached = list(itertools.accumulate((p[1] for p in points), max))
    t0, t1 = reached[0], reached[-1]
    span = t1 - t0
    if span == 0:
        return [(xs[0], _time_label(t0, 1, False), t0)]
    with_date = span > _DAY or datetime.fromtimestamp(t0 / 1000, UTC).date() \
        != datetime.fromtimestamp(t1 / 1000, UTC).date()

    def at(t: int) -> float:
        i = bisect.bisect_left(reached, t)
        if i == 0:
            return xs[0]
        a, b = reached[i - 1], reached[i]
        return xs[i - 1] + (xs[i] - xs[i - 1]) * (t - a) / (b - a)

    taken: list[tuple[float, float]] = []
    placed: set[int] = set()
    ticks: list[tuple[float, str, int]] = []

    def place(t: int, label: str) -> None:
        tx = at(t)
        width = len(label) * _TIME_CHAR_W
        lx, anchor = _fit(tx, width, plot_w)
        left = lx - (width / 2 if anchor == "middle" else 0 if anchor == "start" else width)
        box = (left - _TIME_GAP / 2, left + width + _TIME_GAP / 2)
        if t not in placed and all(box[1] <= a or box[0] >= b for a, b in taken):
            taken.append(box)
            placed.add(t)
            ticks.append((tx, label, t))

    place(t0, _time_label(t0, 1, with_date))  # where the picture starts, to the ms
    finest = next((s for s in _TIME_STEPS if span / s <= 25), _TIME_STEPS[-1])
    for step in reversed(_TIME_STEPS):
        if step < finest:
            break
        t = math.ceil(t0 / step) * step
        while t <= t1:
            place(t, _time_label(t, step, with_date))
            t += step
    ticks.sort(key=lambda tick: tick[2])
    return ticks


def _status_ink(status: str) -> str:
    return {"ACTIVE": "#1b641b", "RECOVERY_FAILED": "#b35900", "CANCELLED": "#111",
            "FINISHED": "#444", "FAILED": "#a00"}.get(status, "#666")


def _defs() -> str:
    return "<defs>" + "".join(f'<g id="m-{name}">{body}</g>'
                              for name, (body, _, _) in _SYMBOLS.items()) + "</defs>"


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[object]], empty: str, *,
           reason_col: int | None, cls: str, wrap_col: int | None = None) -> str:
    if not rows:
        return f'<section><h2>{_esc(title)}</h2><p class="empty">{_esc(empty)}</p></section>\n'
    shown = rows[:MAX_TABLE_ROWS]
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)
    trs = "".join(
        "<tr>" + "".join(
            f'<td class="{_cell_class(i, reason_col, wrap_col)}">{_esc(v)}</td>'
            if i in (reason_col, wrap_col) else f"<td>{_esc(v)}</td>"
            for i, v in enumerate(row)) + "</tr>"
        for row in shown)
    more = (f'<p class="note">{len(rows) - len(shown)} more row(s) left out (at most '
            f"{MAX_TABLE_ROWS}).</p>" if len(rows) > len(shown) else "")
    return (f'<section><h2>{_esc(title)} <span class="count">({len(rows)})</span></h2>'
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
    ".summary{border-left:4px solid #1c4587;background:#f4f7fb;padding:4px 12px 6px;"
    "margin:6px 0 10px;max-width:1100px}",
    ".summary h2{margin:4px 0}",
    ".headline{font-size:15px;font-weight:600;margin:2px 0 6px}",
    ".summary ul{margin:0;padding-left:20px}.summary li{margin:2px 0}",
    ".summary li.bad::marker{color:#d62728}.summary li.warn::marker{color:#e69f00}",
    ".summary li.ok{color:#555}",
    "header h2{margin-top:10px}",
    "header dl{display:grid;grid-template-columns:max-content 1fr;gap:1px 12px;margin:0 0 6px}",
    "header dt{color:#555}header dd{margin:0;font-family:ui-monospace,monospace;"
    "overflow-wrap:anywhere}",
    ".pills{display:flex;gap:8px;flex-wrap:wrap}",
    ".pill{border:1px solid #bbb;border-radius:10px;padding:1px 9px;background:#f6f6f6}",
    ".pill.bad{background:#fde2e2;border-color:#d62728;color:#8b0000}",
    ".pill.warn{background:#fff1d6;border-color:#e69f00}",
    ".pill.q{background:#f1dcf5;border-color:#9c27b0}",
    ".notes{background:#fff8e1;border:1px solid #e6c200;padding:6px 6px 6px 26px;margin:8px 0}",
    ".scroll{overflow-x:auto}",
    ".timeline{display:flex;width:max-content;max-width:100%;border:1px solid #ccc;"
    "background:#fff}",
    ".timeline svg{display:block;flex:none}",
    ".tl-scroll{overflow-x:auto;min-width:0}",
    ".caption{color:#555;font-size:12px;margin:4px 0;max-width:1100px}",
    ".legend{font-size:12px}",
    ".lg{display:grid;grid-template-columns:7.5em 1fr;align-items:start;margin:2px 0}",
    ".lgname{font-weight:600;line-height:20px}",
    ".keys{display:flex;flex-wrap:wrap;gap:0 14px}",
    ".key{display:inline-flex;align-items:center;gap:3px}",
    ".lead{color:#333;margin:2px 0 6px}",
    ".tags{margin:0 0 4px}.tag{display:inline-block;border:1px solid #d62728;color:#8b0000;"
    "background:#fde2e2;border-radius:8px;padding:0 7px;margin-right:6px;font-size:12px}",
    "table{border-collapse:collapse;font-size:12.5px}",
    "th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top;"
    "white-space:nowrap}",
    "td.wrap{white-space:normal;min-width:24em}",
    "th{background:#eee}tbody tr:nth-child(even){background:#fafafa}",
    "table.refused td.reason{color:#b00000;font-weight:600}",
    "table.quar td.reason{color:#6a1b9a;font-weight:600}",
    "pre{background:#f6f6f6;border:1px solid #ddd;padding:8px;white-space:pre-wrap;"
    "overflow-wrap:anywhere;margin:0 0 8px}",
    ".empty,.note,.count{color:#666}",
))
