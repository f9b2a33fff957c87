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
* Tables of the refused writes, the quarantined records and the leadership terms
  (a record's detail on a line of its own under it; cells wrap, times do not, so
  each table fits an 800-px window).

**The picture** (inline SVG: a fixed column of lane names and a plot as wide as
the window allows, from 480 px up to its natural width: 32 px per offset drawn,
at least 480 and at most 1,100 px). The plot's geometry is laid out at 480 px
and written in percentages of its width, marks and labels keeping their size in
pixels, so a narrower window draws the same picture narrower: the whole of it
fits an 800-px window (the incident is never off to the side), and only a window
narrower than about 760 px scrolls the plot sideways on its own. It encodes:

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
  renewals |, committed calls □, leader information published ⚑, and any record
  that names no job),
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
in the page). The output is a function of the log and the arguments alone
(pass ``generated_at`` for byte-identical pages).

**How it is made.** This module selects what the page shows and computes the
picture's geometry (every coordinate, lane, tick and band label); it hands
that to the Jinja2 templates in ``registry/templates/`` as plain data (the
small dataclasses below, strings and numbers), and the templates write all
the markup: ``report.html.j2`` (the page, its CSS, the summary, the
explanations), ``timeline.html.j2`` (the picture and its legend),
``glyphs.svg.j2`` (the symbols' shapes) and ``tables.html.j2``. Autoescape
is on, so every value from the log is HTML-escaped; a template's own macro
output is the only markup that is not.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, Protocol

from .extras import needs

with needs("report", "the HTML report (jobreg report)"):
    import jinja2

from .errors import ConfigError, UnknownJob
from .events import GraphRef, JobStatus
from .files import atomic_write, check_replaceable
from .forensics import Forensics, Scan, TermSummary
from .image import Decision, Image, JobView, Outcome, TermInfo
from .keys import check_id, parse_key

__all__ = ["AUTO_EXPLAIN_ALL", "HasForensics", "MAX_EXPLAINED", "MAX_LANES", "MAX_MARKS",
           "MAX_NAMED", "MAX_TABLE_ROWS", "is_report", "render_report", "write_report"]

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

_OffsetToX = Callable[[float], float]

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_ALWAYS_DRAWN_TYPES = frozenset({"LeadershipGranted", "LeadershipRevoked"})

# -- geometry of the picture (SVG user units = CSS px at 100 %) ------------------------------
_NAMES_WIDTH = 230     # the column of lane names (its own SVG, never scrolled)
_PLOT_MAX = 1100       # the plot (its own SVG, as wide as the window allows) is drawn ...
_PLOT_MIN = 480        # ... at most this wide and at least this wide (narrower: it scrolls), ...
_PER_OFFSET = 32       # ... and no wider than this much per offset (a short log stays narrow);
# its geometry is laid out at _PLOT_MIN px and written as percentages of the plot's width
_PLOT_LEFT, _PLOT_RIGHT_PAD = 14, 26  # x of the plot's start; room right of its end (at 480)
_BAND_ROW = 22         # term labels
_AXIS_ROW = 20         # offset tick labels
_LANES_TOP = _BAND_ROW + _AXIS_ROW + 4
_LANE_HEIGHT = 24
_TIME_ROWS = 44        # below the lanes: time tick labels and the date
_CHAR_WIDTH = 6.3      # rough width of a character at font-size 11 (for fitting labels)
_TIME_CHAR_WIDTH = 6.0  # the same at font-size 10 (time labels)
_TIME_GAP = 14         # at least this much room between two time labels

_BAND_FILLS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#d9d2e9", "#d0e0e3", "#fce5cd", "#e6e6e6")
_BAND_INKS = ("#1c4587", "#274e13", "#7f6000", "#351c75", "#0c343d", "#783f04", "#333333")
_ATTENTION = "#d62728"  # the red edge of a job with something to explain
_STATUS_INKS = {"ACTIVE": "#1b641b", "RECOVERY_FAILED": "#b35900", "CANCELLED": "#111",
                "FINISHED": "#444", "FAILED": "#a00"}


class _Symbol(NamedTuple):
    glyph: str    # its shape: the name of a glyph of templates/glyphs.svg.j2
    legend: str   # what the legend says it means
    group: str    # the legend's row


# What a mark can be, in the legend's order; each is defined once in the picture as "m-<name>".
_SYMBOLS: dict[str, _Symbol] = {
    "grant": _Symbol("grant", "leadership granted", "Leadership"),
    "revoke": _Symbol("revoke", "leadership revoked", "Leadership"),
    "renew": _Symbol("renew", "lease renewed", "Leadership"),
    "call": _Symbol("call", "call committed (its records applied together)", "Leadership"),
    "leader-info": _Symbol("leader-info", "leader information published (Flink)", "Leadership"),
    "submit": _Symbol("submit", "submitted", "Jobs"),
    "adopt": _Symbol("adopt", "adopted (lock taken)", "Jobs"),
    "release": _Symbol("release", "lock released", "Jobs"),
    "cancel": _Symbol("cancel", "cancelled", "Jobs"),
    "terminate": _Symbol("terminate", "terminated (finished/failed)", "Jobs"),
    "reassert": _Symbol("reassert", "state reasserted", "Jobs"),
    "recovery": _Symbol("recovery", "recovery failed", "Jobs"),
    "restart": _Symbol("restart", "restarted (checkpoint failures over budget)", "Jobs"),
    "cleaned": _Symbol("cleaned", "result cleaned up", "Jobs"),
    "cp-triggered": _Symbol("cp-triggered", "triggered", "Checkpoints"),
    "cp-completed": _Symbol("cp-completed", "completed", "Checkpoints"),
    "cp-failed": _Symbol("cp-failed", "failed (counted)", "Checkpoints"),
    "cp-discarded": _Symbol("cp-discarded", "discarded", "Checkpoints"),
    "other": _Symbol("other", "other record", "Records"),
    "rejected": _Symbol("rejected", "REFUSED write (rejected)", "Verdicts"),
    "ignored": _Symbol("ignored", "ignored (kept, no effect)", "Verdicts"),
    "duplicate": _Symbol("duplicate", "duplicate (no second effect)", "Verdicts"),
    "quarantined": _Symbol("quarantined", "QUARANTINED (undecodable)", "Verdicts"),
}
_GROUPS = ("Leadership", "Jobs", "Checkpoints", "Records", "Verdicts")

_TYPE_SYMBOL = {
    "LeadershipGranted": "grant",
    "LeadershipRevoked": "revoke",
    "LeaseRenewed": "renew",
    "CallCommitted": "call",
    "LeaderInformationPublished": "leader-info",
    "JobSubmitted": "submit",
    "JobAdopted": "adopt",
    "JobLockReleased": "release",
    "JobCancelled": "cancel",
    "JobTerminated": "terminate",
    "JobReasserted": "reassert",
    "JobRecoveryFailed": "recovery",
    "JobRestarted": "restart",
    "JobRescaled": "rescale",
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


# -- the templates -------------------------------------------------------------------------------

def _blank_none(value: object) -> object:
    """Jinja2's ``finalize``: ``None`` prints as nothing (an absent epoch, reason or time: an
    empty cell), not as "None"."""
    return "" if value is None else value


def _coord(value: float) -> str:
    """A coordinate as the picture writes it: to 0.1 px (the template filter ``coord``)."""
    return f"{value:.1f}"


def _pct(value: float, width: float) -> str:
    """An x of the plot, laid out ``width`` px wide, as a percentage of the plot's width (the
    template filter ``pct``): to 0.001 %, a hundredth of a pixel at 1,100 px."""
    return f"{value * 100 / width:.3f}%"


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("registry", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    finalize=_blank_none,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    auto_reload=False,
)
_TEMPLATES.filters["coord"] = _coord
_TEMPLATES.filters["pct"] = _pct


# -- what the templates are given ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Span:
    """A piece of a line of text: plain, bold, code, or a link to an anchor of the page."""
    text: object          # None shows as nothing
    style: str = ""       # "", "bold" or "code"
    href: str = ""        # "#why", "#job-<id>": a link (no style)


_Text = list[_Span]


@dataclass(frozen=True, slots=True)
class _SummaryLine:
    tone: str             # "bad", "warn", "ok" (a kind of trouble that did not happen) or ""
    text: _Text


@dataclass(frozen=True, slots=True)
class _Pill:
    name: str
    count: int
    tone: str             # "bad", "warn", "q" (quarantined) or "": drawn only when count > 0


@dataclass(frozen=True, slots=True)
class _Band:
    """A leadership term's band: its x span, colours, tooltip, the dashed revoke line's x
    (``None``: none drawn) and the label that fits (``label`` empty: none fits)."""
    x: float
    width: float
    fill: str
    ink: str
    tooltip: str
    revoke_x: float | None
    label: str
    label_x: float


@dataclass(frozen=True, slots=True)
class _Tick:
    x: float              # where the tick is
    label_x: float        # where its label is anchored ...
    anchor: str           # ... and how (SVG text-anchor)
    label: str
    title: str = ""       # the label's tooltip


@dataclass(frozen=True, slots=True)
class _LaneName:
    """One lane's row in the column of names."""
    kind: str             # "leadership", "quarantined" or "job"
    label: str            # the name as shown (a long job id clipped)
    text_y: float
    ink: str              # a job's status colour; the other lanes' name colour
    status: str = ""      # a job's status at the end of the log
    tooltip: str = ""
    href: str = ""        # a job's explanation, when the page has one
    attention: str = ""   # what there is to explain (empty: no red edge)
    edge_y: int = 0       # the red edge's top and height
    edge_height: int = 0


@dataclass(frozen=True, slots=True)
class _Mark:
    symbol: str
    x: float
    y: float
    tooltip: str


@dataclass(frozen=True, slots=True)
class _LegendKey:
    glyph: str
    text: str
    fill: str = ""        # the colour of a glyph drawn in a colour of the page's choosing


@dataclass(frozen=True, slots=True)
class _LegendGroup:
    name: str
    keys: list[_LegendKey]


@dataclass(frozen=True, slots=True)
class _Timeline:
    """The picture, every coordinate computed: the lane names' column, the plot, the legend."""
    names_width: int
    names_right: int      # x where lane names' right-aligned texts end
    names_divider_x: float
    plot_width: int       # the width the plot's geometry is laid out at (its narrowest) ...
    plot_max: int         # ... and the widest it is drawn; its x are written in % of its width
    plot_left: int
    height: int
    band_row: int         # height of the band labels' row
    band_label_y: int
    offset_label_y: int
    lanes_top: int
    lanes_bottom: int
    time_caption_y: float
    time_label_y: float
    date_y: float
    attention: str        # the red edge's colour
    lane_rules: list[int]  # y of the line under each lane
    lanes: list[_LaneName]
    bands: list[_Band]
    offset_ticks: list[_Tick]
    time_ticks: list[_Tick]
    first_date: str       # the first stamped record's UTC date ("": no stamp)
    marks: list[_Mark]
    legend: list[_LegendGroup]


@dataclass(frozen=True, slots=True)
class _Explanation:
    job_id: str
    tags: list[str]       # what there is to explain about it
    text: str             # Forensics.explain


@dataclass(frozen=True, slots=True)
class _Why:
    """The explanations section."""
    asked: int | None     # how many jobs were asked for (None: none asked for)
    explanations: list[_Explanation]
    with_plain: bool      # some explained jobs have nothing to explain (a small log)
    any_job: bool         # some job has a record in the window
    plain_count: int      # ACTIVE jobs with nothing to explain, not explained ...
    plain_names: str      # ... and the first 40 of them


@dataclass(frozen=True, slots=True)
class _Table:
    title: str
    head: Sequence[str]
    rows: Sequence[Sequence[object]]  # at most max_rows
    empty: str            # said instead of a table without rows
    css_class: str
    column_classes: list[str]  # each column's cell class ("": none)
    details: Sequence[str]     # each row's detail, on a line of its own under it ("": none)
    total: int            # rows before the cut
    left_out: int
    max_rows: int


def _symbol(decision: Decision) -> str:
    if decision.outcome == Outcome.REJECTED:
        return "rejected"
    if decision.outcome == Outcome.QUARANTINED:
        return "quarantined"
    if decision.outcome == Outcome.IGNORED:
        return "ignored"
    if decision.outcome == Outcome.DUPLICATE:
        return "duplicate"
    return _TYPE_SYMBOL.get(decision.event_type or "", "other")


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
    name: str
    kind: str           # "leadership", "quarantined" or "job"
    status: str = ""    # the job's status at the end of the log


def _iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "…"


def _count(count: int, one: str, many: str | None = None) -> str:
    """``1 record``, ``2 records``."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _text(*parts: _Span | object) -> _Text:
    """A line of text from pieces: spans as they are, anything else as plain text."""
    return [p if isinstance(p, _Span) else _Span(p) for p in parts]


def _bold(text: object) -> _Span:
    return _Span(text, style="bold")


def _joined(pieces: Iterable[_Text], separator: str) -> _Text:
    out: _Text = []
    for i, piece in enumerate(pieces):
        if i:
            out.append(_Span(separator))
        out += piece
    return out


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


class HasForensics(Protocol):
    """What has the forensics of its namespace: a :class:`~registry.client.Registry`."""

    def forensics(self) -> Forensics:
        """The forensics of the namespace."""
        ...


def render_report(forensics: Forensics | HasForensics, *, jobs: Sequence[str] | None = None,
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

    Raises :class:`~registry.errors.UnknownJob` for a job no record names,
    :class:`ConfigError` for a malformed job id or ``since > until``. A :class:`~registry.client.Registry` is accepted too
    (its :meth:`~registry.client.Registry.forensics` is used).
    """
    _check_args(jobs, since, until)
    if not isinstance(forensics, Forensics):
        getter = getattr(forensics, "forensics", None)
        found_forensics = getter() if callable(getter) else None
        if not isinstance(found_forensics, Forensics):
            raise ConfigError(f"render_report needs a Forensics, not {type(forensics).__name__}")
        forensics = found_forensics
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
            raise UnknownJob(
                forensics.namespace, unknown[0],
                f"unknown job id(s) in namespace {forensics.namespace!r}: "
                + ", ".join(repr(j) for j in unknown)
                + " (no record of the log names them)")
    page = _Page(scanned, image, decisions, wanted, since, until, title,
                 int(time.time() * 1000) if generated_at is None else generated_at)
    return page.render()


def write_report(forensics: Forensics | HasForensics, path: str | os.PathLike[str], *,
                 jobs: Sequence[str] | None = None, since: int | None = None,
                 until: int | None = None, title: str | None = None,
                 generated_at: int | None = None, force: bool = False) -> Path:
    """:func:`render_report` to ``path``, atomically (:func:`registry.files.atomic_write`:
    a reader never sees half a page; a path that cannot be written is one ``ConfigError``),
    with the permissions the umask gives; returns the path. An existing file at ``path``
    is replaced only if it is a jobreg report (:func:`is_report`), or with ``force``."""
    path = Path(path)
    if not force:  # before the replay: a refusal should not wait for a long read
        check_replaceable(path, "report", is_report)
    text = render_report(forensics, jobs=jobs, since=since, until=until, title=title,
                         generated_at=generated_at)
    with atomic_write(path, "report", replaceable=is_report, force=force) as f:
        f.write(text.encode("utf-8"))
    return path


_GENERATOR = b'<meta name="generator" content="jobreg report">'


def is_report(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a report jobreg wrote (its head names jobreg as its generator):
    what :func:`write_report` may replace without ``force``."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.lstrip().lower().startswith(b"<!doctype html") and _GENERATOR in head


class _Page:
    """One rendering: the selection made once, then the templates given what they show."""

    def __init__(self, forensics: _Scanned, image: Image, decisions: list[Decision],
                 wanted: list[str] | None, since: int | None, until: int | None,
                 title: str | None, generated_at: int) -> None:
        self.forensics = forensics
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

    # -- selection -----------------------------------------------------------------------------

    def _in_window(self, ts: int | None) -> bool:
        if ts is None:
            return True
        return (self.since is None or ts >= self.since) and (self.until is None or ts <= self.until)

    def _window_terms(self) -> list[TermSummary]:
        terms = self.forensics.terms()
        if self.windowed:
            window = self.window
            first, last = (window[0].offset, window[-1].offset) if window else (0, -1)
            terms = [t for t in terms if t.last_offset >= first and t.first_offset <= last]
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
        for d in self.forensics.by_job.get(job, []):
            if self._in_window(d.timestamp):
                if d.outcome == Outcome.ACCEPTED and d.event_type in (
                        "JobRecoveryFailed", "JobRestarted", "JobRescaled"):
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
                         ("JobRestarted", "restart"), ("JobRescaled", "rescale")):
            if counts[key]:
                out.append(_count(counts[key], one))
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
        headline, summary = self._summary()
        timeline = self._timeline()  # before the notes are shown: it may add one (thinning)
        log_facts, pills = self._header()
        return _TEMPLATES.get_template("report.html.j2").render(
            csp=CSP, title=self.title, windowed=self.windowed,
            headline=headline, summary=summary, notes=self.notes,
            log_facts=log_facts, pills=pills,
            timeline=timeline, symbols=_SYMBOLS,
            why=self._explanations(),
            tables=[self._refused(), self._quarantined(), self._terms_table()])

    def _header(self) -> tuple[list[tuple[str, str]], list[_Pill]]:
        """The facts about the log (term, value) and the counts by outcome."""
        window = self.window
        counts = {o: 0 for o in (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.IGNORED,
                                 Outcome.QUARANTINED, Outcome.DUPLICATE)}
        for d in window:
            counts[d.outcome] = counts.get(d.outcome, 0) + 1
        stamps = [d.timestamp for d in window if d.timestamp is not None]
        topic = getattr(self.forensics.source, "topic", None) or "unknown"
        offsets = f"{window[0].offset} – {window[-1].offset}" if window else "none"
        if self.all and (not window or (window[0].offset, window[-1].offset)
                         != (self.all[0].offset, self.all[-1].offset)):
            offsets += f" (the log: {self.all[0].offset} – {self.all[-1].offset})"
        span = f"{_iso(min(stamps))} – {_iso(max(stamps))}" if stamps else "no timestamps"
        selected = "the whole log"
        if self.windowed:
            selected = (f"records stamped {_iso(self.since) if self.since is not None else '…'}"
                        f" to {_iso(self.until) if self.until is not None else '…'} "
                        "(records without a timestamp kept)")
        leader = self.image.active_leader
        now = (f"epoch {self.image.epoch}, leader {leader.contender}" if leader is not None
               else f"epoch {self.image.epoch}, no active leader")
        facts = [
            ("namespace", self.image.namespace), ("topic", topic),
            ("window", selected), ("offsets", offsets), ("time (UTC)", span),
            ("at the end of the log", now), ("generated", _iso(self.generated_at)),
        ]
        pills = [_Pill("records", len(window), ""),
                 _Pill("accepted", counts[Outcome.ACCEPTED], ""),
                 _Pill("rejected", counts[Outcome.REJECTED], "bad"),
                 _Pill("ignored", counts[Outcome.IGNORED], "warn"),
                 _Pill("quarantined", counts[Outcome.QUARANTINED], "q"),
                 _Pill("duplicates", counts[Outcome.DUPLICATE], "")]
        return facts, pills

    # -- the summary ---------------------------------------------------------------------------

    def _job_ref(self, job: str | None) -> _Span:
        """A job's name, linked to its explanation when the page has one."""
        if job is None:
            return _Span("(no job)")
        if job in self.has_explanation:
            return _Span(job, href=f"#job-{job}")
        return _Span(job, style="code")

    @staticmethod
    def _writer_ref(d: Decision) -> _Span:
        """Who wrote a record: ``jm-2 (epoch 2)``."""
        epoch = "" if d.epoch is None else d.epoch
        return _Span(f"{d.writer or 'an unknown writer'} (epoch {epoch})")

    @staticmethod
    def _named(items: list[_Text]) -> _Text:
        """The first :data:`MAX_NAMED` items, then how many more."""
        shown = items[:MAX_NAMED]
        return _joined(shown, "; ") + (_text(f"; and {len(items) - len(shown)} more")
                                       if len(items) > len(shown) else [])

    def _summary(self) -> tuple[str, list[_SummaryLine]]:
        """The headline and the lines of "What happened"."""
        lines: list[_SummaryLine] = []
        headline: list[str] = []
        window = self.window
        where = "in the window" if self.windowed else "in the log"
        stamps = [d.timestamp for d in window if d.timestamp is not None]
        if window:
            span = (f" over {_duration(max(stamps) - min(stamps))} ({_iso(min(stamps))} to "
                    f"{_iso(max(stamps))})" if stamps else "")
            lines.append(_SummaryLine("", _text(
                f"{_count(len(window), 'record')} {where}, offsets {window[0].offset} to "
                f"{window[-1].offset}{span}.")))
        lines.append(self._summary_terms(headline))
        lines += self._summary_refused(headline)
        lines += self._summary_recovery(headline)
        lines += self._summary_checkpoints(headline)
        lines += self._summary_results(headline)
        lines += self._summary_records(headline)
        lines.append(self._summary_jobs())
        absent = [line.text for line in lines if line.tone == "ok"]
        lines = [line for line in lines if line.tone != "ok"]
        if absent and window:
            lines.append(_SummaryLine("ok", _text("None of these happened: ")
                                      + _joined(absent, ", ") + _text(".")))
        if not window:  # nothing happened there: neither trouble nor "no trouble"
            head = f"No record {where}."
        else:
            head = ("; ".join(headline) + ".") if headline else "No trouble found."
        return head[0].upper() + head[1:], lines

    def _summary_terms(self, headline: list[str]) -> _SummaryLine:
        terms = self.terms
        if not terms:
            return _SummaryLine("warn", _text(
                "No leadership term was granted "
                + ("in the window." if self.windowed else "(nobody could write).")))
        failovers = sum(1 for a, b in itertools.pairwise(terms) if a.leader != b.leader)
        steps = [_text(f"epoch {terms[0].epoch} ", _bold(terms[0].leader),
                       f" from offset {terms[0].first_offset}")]
        for before, after in itertools.pairwise(terms):
            if before.end == "revoked":
                how = (f"after {before.leader} revoked epoch {before.epoch} at "
                       f"{before.end_offset}")
            else:
                how = f"epoch {before.epoch} ended without a revoke"
            moved = "took over" if before.leader != after.leader else "was granted again"
            steps.append(_text(f"epoch {after.epoch} ", _bold(after.leader),
                               f" {moved} at offset {after.first_offset} ({how})"))
        if len(steps) > 2 * MAX_NAMED // 2 + 1:
            half = MAX_NAMED // 2
            steps = steps[:half] + [_text(f"… {len(steps) - 2 * half} more …")] + steps[-half:]
        leader = self.image.active_leader
        end = (f"{leader.contender} leads (epoch {leader.epoch}) at the end of the log"
               if leader is not None else
               f"nobody leads at the end of the log (epoch {self.image.epoch} "
               + ("was revoked)" if self.image.revoked else "has no active leader)"))
        moves = _count(failovers, "failover") if failovers else "no failover"
        headline.append(f"{_count(len(terms), 'leadership term')}, {moves}")
        return _SummaryLine("", _text(f"{_count(len(terms), 'leadership term')}, {moves}: ")
                            + _joined(steps, " → ") + _text(f". {end}."))

    def _summary_refused(self, headline: list[str]) -> list[_SummaryLine]:
        refused = [d for d in self.window if d.outcome == Outcome.REJECTED]
        if not refused:
            return [_SummaryLine("ok", _text("a refused write")),
                    _SummaryLine("ok", _text("a resurrection attempt (a write refused as "
                                             "terminal_job)"))]
        by_writer: dict[str, list[Decision]] = {}
        for d in refused:
            by_writer.setdefault(d.writer or "an unknown writer", []).append(d)
        parts: list[_Text] = []
        for writer, ds in by_writer.items():
            reasons = Counter(d.reason for d in ds)
            what = _joined((_text(r, f" ×{n}") if n > 1 else _text(r)
                            for r, n in reasons.items()), ", ")
            # the first refusal that is not a resurrection attempt (those have a line below)
            first = next((d for d in ds if d.reason != "terminal_job"), None)
            part = _text(_bold(writer), f": {_count(len(ds), 'write')} (") + what + _text(")")
            if first is not None:
                part += _text(", first ", first.event_type, " of ", self._job_ref(first.job_id),
                              f" at offset {first.offset}: ", _clip(first.detail, 160))
            parts.append(part)
        writers = ", ".join(by_writer)
        headline.append(f"{_count(len(refused), 'write')} refused (by {writers})")
        out = [_SummaryLine("bad", _text(f"{_count(len(refused), 'write')} refused, by writer: ")
                            + self._named(parts) + _text("."))]
        resurrect = [d for d in refused if d.reason == "terminal_job"]
        if resurrect:
            headline.append(_count(len(resurrect), "resurrection attempt") + " refused")
            items = [_text(self._writer_ref(d), " wrote ", d.event_type, " for ",
                           self._job_ref(d.job_id), f" at offset {d.offset}: ",
                           _clip(d.detail, 160)) for d in resurrect]
            out.append(_SummaryLine("bad", _text(
                f"{_count(len(resurrect), 'resurrection attempt')} refused (writes refused as "
                "terminal_job: a cancelled, finished or failed job never comes back): ")
                + self._named(items) + _text(".")))
        else:
            out.append(_SummaryLine("ok", _text("a resurrection attempt (a write refused as "
                                                "terminal_job)")))
        return out

    def _summary_recovery(self, headline: list[str]) -> list[_SummaryLine]:
        failed: dict[str, list[Decision]] = {}
        for d in self.window:
            if d.accepted and d.event_type == "JobRecoveryFailed" and d.job_id is not None:
                failed.setdefault(d.job_id, []).append(d)
        for job, known in self.image.jobs.items():
            if known.status == JobStatus.RECOVERY_FAILED and job in self.first:
                failed.setdefault(job, [])
        if not failed:
            return [_SummaryLine("ok", _text("a failed recovery"))]
        items: list[_Text] = []
        for job, ds in failed.items():
            view = self.image.jobs.get(job)
            when = (_text(" at offset " + ", ".join(str(d.offset) for d in ds) + " by ",
                          self._writer_ref(ds[-1])) if ds else [])
            if view is not None and view.status == JobStatus.RECOVERY_FAILED:
                items.append(_text(self._job_ref(job), " failed recovery") + when + _text(
                    ": ", _bold(_clip(view.error or "no error recorded", 300)),
                    "; still RECOVERY_FAILED at the end of the log (no term recovers it until "
                    "it is retried or cancelled)"))
            else:
                status = view.status if view is not None else "not in the registry"
                items.append(_text(self._job_ref(job), " failed recovery") + when
                             + _text("; ", status, " at the end of the log"))
        headline.append(_count(len(failed), "job") + " failed recovery ("
                        + ", ".join(list(failed)[:MAX_NAMED])
                        + (", …" if len(failed) > MAX_NAMED else "") + ")")
        return [_SummaryLine("bad", _text(f"{_count(len(failed), 'job')} failed recovery: ")
                             + self._named(items) + _text("."))]

    def _summary_checkpoints(self, headline: list[str]) -> list[_SummaryLine]:
        out: list[_SummaryLine] = []
        ignored = [d for d in self.window if d.outcome == Outcome.IGNORED
                   and d.event_type == "CheckpointFailed"]
        if ignored:
            headline.append(_count(len(ignored), "checkpoint failure") + " ignored")
            items = [_text(self._job_ref(d.job_id), f" at offset {d.offset}: ",
                           _clip(d.detail, 160)) for d in ignored]
            out.append(_SummaryLine("warn", _text(
                f"{_count(len(ignored), 'checkpoint failure')} ignored (kept, not counted): ")
                + self._named(items) + _text(".")))
        restarts = [d for d in self.window if d.accepted and d.event_type == "JobRestarted"]
        if restarts:
            headline.append(_count(len(restarts), "restart"))
            items = [_text(self._job_ref(d.job_id), f" at offset {d.offset} by ",
                           self._writer_ref(d)) for d in restarts]
            out.append(_SummaryLine("warn", _text(
                f"{_count(len(restarts), 'job restart')} (checkpoint failures over budget): ")
                + self._named(items) + _text(".")))
        over = [v for j, v in self.image.jobs.items() if j in self.first and v.over_budget]
        if over:
            headline.append(_count(len(over), "job") + " over checkpoint budget")
            items = [_text(self._job_ref(v.job_id), " ("
                           f"{_count(v.checkpoints.consecutive_failures, 'consecutive failure')}"
                           f", {v.max_checkpoint_failures} tolerable)") for v in over]
            out.append(_SummaryLine("bad", _text(
                f"{_count(len(over), 'job')} over its checkpoint failure budget at the end of "
                "the log (restart or fail it): ") + self._named(items) + _text(".")))
        if not ignored:
            out.append(_SummaryLine("ok", _text("an ignored checkpoint failure")))
        if not over:
            out.append(_SummaryLine("ok", _text("a job over its checkpoint failure budget")))
        return out

    def _summary_results(self, headline: list[str]) -> list[_SummaryLine]:
        out: list[_SummaryLine] = []
        dirty = [v for j, v in self.image.jobs.items() if j in self.first and v.dirty]
        if dirty:
            headline.append(_count(len(dirty), "job result") + " still dirty")
            items = [_text(self._job_ref(v.job_id), " (", v.status, "; holds ", _holds(v), ")")
                     for v in dirty]
            out.append(_SummaryLine("warn", _text(
                f"{_count(len(dirty), 'job result')} still dirty at the end of the log (cleanup "
                "pending: its graph and checkpoints not deleted yet): ")
                + self._named(items) + _text(".")))
        cleaned = [d for d in self.window if d.accepted and d.event_type == "JobCleanedUp"]
        if cleaned:
            items = [_text(self._job_ref(d.job_id), f" at offset {d.offset} by ",
                           self._writer_ref(d)) for d in cleaned]
            out.append(_SummaryLine("", _text(f"{_count(len(cleaned), 'job result')} marked "
                                              "clean: ") + self._named(items) + _text(".")))
        if not dirty:
            out.append(_SummaryLine("ok", _text("a dirty job result")))
        return out

    def _summary_records(self, headline: list[str]) -> list[_SummaryLine]:
        out: list[_SummaryLine] = []
        quarantined = [d for d in self.window if d.outcome == Outcome.QUARANTINED]
        if quarantined:
            headline.append(_count(len(quarantined), "record") + " quarantined")
            items = []
            for d in quarantined:
                job = _quarantined_job(d)
                on = (_text(" on ", self._job_ref(job), "'s key") if job else
                      _text(f" (key {_clip(d.key or 'none', 60)})"))
                items.append(_text(f"offset {d.offset}") + on + _text(": ", d.reason))
            out.append(_SummaryLine("bad", _text(
                f"{_count(len(quarantined), 'record')} quarantined (the fold could not decode "
                "it; no effect): ") + self._named(items) + _text(".")))
        else:
            out.append(_SummaryLine("ok", _text("a quarantined record")))
        other = [d for d in self.window if d.outcome == Outcome.IGNORED
                 and d.event_type != "CheckpointFailed"]
        if other:
            items = [_text(d.event_type, " of ", self._job_ref(d.job_id),
                           f" at offset {d.offset}: ", _clip(d.detail, 160)) for d in other]
            out.append(_SummaryLine("warn", _text(
                f"{_count(len(other), 'other record')} kept but ignored: ")
                + self._named(items) + _text(".")))
        duplicates = sum(1 for d in self.window if d.outcome == Outcome.DUPLICATE)
        if duplicates:
            out.append(_SummaryLine("", _text(
                f"{_count(duplicates, 'duplicate record')} (a copy of an event already in the "
                "log, as a retried write leaves; no second effect).")))
        return out

    def _summary_jobs(self) -> _SummaryLine:
        views = [v for j, v in self.image.jobs.items() if j in self.first]
        if not views:
            return _SummaryLine("", _text("No job has a record " + (
                "in the window." if self.windowed else "in the log.")))
        by_status = Counter(v.status for v in views)
        order = [s for s in JobStatus.ALL if s in by_status] + sorted(
            s for s in by_status if s not in JobStatus.ALL)
        explained = sum(1 for j in self.explained if j in self.flags)
        text = _text(f"{_count(len(views), 'job')} at the end of the log: "
                     + ", ".join(f"{by_status[s]} {s}" for s in order))
        if explained:
            text += _text(f"; {explained} with something to explain, ",
                          _Span("below", href="#why"))
        return _SummaryLine("", text + _text("."))

    # -- the picture ---------------------------------------------------------------------------

    def _timeline(self) -> _Timeline | None:
        """The picture's geometry (``None``: no record in the window)."""
        window = self.window
        if not window:
            return None
        first, last = window[0].offset, window[-1].offset
        pad = max(0.6, (last - first) * 0.012)
        domain_start, domain_end = first - pad, last + pad
        plot_max = round(min(_PLOT_MAX, max(_PLOT_MIN, (domain_end - domain_start) * _PER_OFFSET
                                            + _PLOT_LEFT + _PLOT_RIGHT_PAD)))
        # Laid out at the narrowest it is drawn: a wider plot spreads the same marks and labels
        # apart (x in %, sizes in px), so what does not overlap here overlaps nowhere.
        plot_width = _PLOT_MIN
        scale = (plot_width - _PLOT_RIGHT_PAD - _PLOT_LEFT) / (domain_end - domain_start)

        def x_of(offset: float) -> float:
            return _PLOT_LEFT + (offset - domain_start) * scale

        lanes_bottom = _LANES_TOP + _LANE_HEIGHT * len(self.lanes)
        marks = self._marks(x_of, plot_width)
        stamped = [(x_of(d.offset), d.timestamp) for d in self.window if d.timestamp is not None]
        return _Timeline(
            names_width=_NAMES_WIDTH, names_right=_NAMES_WIDTH - 8,
            names_divider_x=_NAMES_WIDTH - 0.5,
            plot_width=plot_width, plot_max=plot_max, plot_left=_PLOT_LEFT,
            height=lanes_bottom + _TIME_ROWS,
            band_row=_BAND_ROW, band_label_y=15, offset_label_y=_BAND_ROW + 14,
            lanes_top=_LANES_TOP, lanes_bottom=lanes_bottom,
            time_caption_y=lanes_bottom + 15, time_label_y=lanes_bottom + 16,
            date_y=lanes_bottom + 34, attention=_ATTENTION,
            lane_rules=[_LANES_TOP + (i + 1) * _LANE_HEIGHT for i in range(len(self.lanes))],
            lanes=self._lane_names(),
            bands=self._bands(x_of, first, last, plot_width),
            offset_ticks=[_tick(x_of(offset), str(offset), _CHAR_WIDTH, plot_width)
                          for offset in _offset_ticks(first, last)],
            time_ticks=[_tick(x, label, _TIME_CHAR_WIDTH, plot_width, title=_iso(ms))
                        for x, label, ms in _time_ticks(stamped, plot_width)],
            first_date=_iso(stamped[0][1])[:10] if stamped else "",
            marks=marks,
            legend=self._legend({mark.symbol for mark in marks}))

    def _legend(self, used: set[str]) -> list[_LegendGroup]:
        """The legend: the symbols the picture uses, by group, and what bands, a dashed
        revoke line and the red edge mean (the last two only when drawn)."""
        extra: dict[str, list[_LegendKey]] = {g: [] for g in _GROUPS}
        extra["Leadership"].append(_LegendKey("band", "band: a leadership term (epoch · leader)",
                                              fill=_BAND_FILLS[1]))
        if any(t.end == "revoked" for t in self.terms):
            extra["Leadership"].append(_LegendKey("revoked-line", "dashed line: term revoked"))
        if any(lane.kind == "job" and lane.name in self.flags for lane in self.lanes):
            extra["Jobs"].append(_LegendKey("attention-edge", "red edge: the job has something "
                                            "to explain (below)", fill=_ATTENTION))
        groups = []
        for group in _GROUPS:
            keys = [_LegendKey(symbol.glyph, symbol.legend) for name, symbol in _SYMBOLS.items()
                    if symbol.group == group and name in used] + extra[group]
            if keys:
                groups.append(_LegendGroup(group, keys))
        return groups

    def _bands(self, x_of: _OffsetToX, first: int, last: int, plot_width: int) -> list[_Band]:
        spans: list[tuple[TermInfo, float, float, str]] = []  # term, x start, x end, tooltip
        terms = self.forensics.scan().terms
        for i, info in enumerate(terms):
            end: float
            if info.revoked_offset is not None:
                end, how = info.revoked_offset, f"revoked at {info.revoked_offset}"
            elif i + 1 < len(terms):
                following = terms[i + 1]
                end, how = (following.granted_offset,
                            f"until epoch {following.epoch} at {following.granted_offset}")
            else:
                end, how = math.inf, "current"
            start = info.granted_offset
            if end < first or start > last:
                continue
            x_start = max(x_of(start), 0.0)
            x_end = min(x_of(min(end, last + 1)), float(plot_width))
            tooltip = (f"epoch {info.epoch} · leader {info.leader} · granted at {start} · {how}"
                       + (f" · lease {info.lease_ms} ms, {info.renewals} renewal(s)"
                          if info.lease_ms else ""))
            spans.append((info, x_start, max(x_end, x_start + 1.0), tooltip))
        bands: list[_Band] = []
        label_end = 0.0
        for i, (info, x_start, x_end, tooltip) in enumerate(spans):
            epoch = info.epoch
            ink = _BAND_INKS[epoch % len(_BAND_INKS)]
            revoked = info.revoked_offset is not None and first <= info.revoked_offset <= last
            # The label starts in its band; it may reach left over an earlier band's unused
            # header, never right into the next band.
            right = spans[i + 1][1] - 4 if i + 1 < len(spans) else plot_width - 4
            label, label_x = "", 0.0
            for candidate in (f"epoch {epoch} · {info.leader}",
                              _clip(f"e{epoch} · {info.leader}", 16), f"e{epoch}"):
                need = len(candidate) * _CHAR_WIDTH
                at = max(2.0, min(x_start + 4, right - need))
                if at >= label_end + 8 or (at >= label_end and candidate == f"e{epoch}"):
                    label, label_x = candidate, at
                    label_end = at + need
                    break
            bands.append(_Band(x=x_start, width=x_end - x_start,
                               fill=_BAND_FILLS[epoch % len(_BAND_FILLS)], ink=ink,
                               tooltip=tooltip, revoke_x=x_end if revoked else None,
                               label=label, label_x=label_x))
        return bands

    def _lane_names(self) -> list[_LaneName]:
        names = []
        for i, lane in enumerate(self.lanes):
            top = _LANES_TOP + i * _LANE_HEIGHT
            text_y = top + _LANE_HEIGHT / 2 + 4
            if lane.kind == "job":
                flags = self.flags.get(lane.name, [])
                names.append(_LaneName(
                    kind="job", label=_clip(lane.name, 21), text_y=text_y,
                    ink=_STATUS_INKS.get(lane.status, "#666"), status=lane.status,
                    tooltip=(f"job {lane.name} · at the end of the log: {lane.status}"
                             + (f" · {', '.join(flags)}" if flags else "")),
                    href=f"#job-{lane.name}" if lane.name in self.has_explanation else "",
                    attention=", ".join(flags), edge_y=top + 2, edge_height=_LANE_HEIGHT - 4))
            else:
                names.append(_LaneName(
                    kind=lane.kind, label=lane.name, text_y=text_y,
                    ink="#4a0072" if lane.kind == "quarantined" else "#222"))
        return names

    def _marks(self, x_of: _OffsetToX, plot_width: int) -> list[_Mark]:
        placed: list[tuple[int, Decision]] = []
        for d in self.window:
            lane = self._lane(d)
            if lane is not None:
                placed.append((lane, d))
        placed = self._thin(placed, x_of, plot_width)
        # Refused and quarantined marks last, so they sit on top.
        placed.sort(key=lambda p: (_symbol(p[1]) in ("rejected", "quarantined"), p[1].offset))
        return [_Mark(symbol=_symbol(d), x=x_of(d.offset),
                      y=_LANES_TOP + lane * _LANE_HEIGHT + _LANE_HEIGHT / 2, tooltip=_tooltip(d))
                for lane, d in placed]

    def _thin(self, placed: list[tuple[int, Decision]], x_of: _OffsetToX,
              plot_width: int) -> list[tuple[int, Decision]]:
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
                cell = (lane, _symbol(d), int(x_of(d.offset) // column))
                if cell not in seen:
                    seen.add(cell)
                    chosen.append((lane, d))
            if len(chosen) <= budget or column >= plot_width:
                break
            column *= 2
        self.notes.append(
            f"The picture has {len(placed)} marks, more than {MAX_MARKS}: marks of accepted and "
            f"duplicate records are thinned to one per lane, symbol and {column:g}-pixel column "
            f"({len(chosen)} of {len(thinnable)} drawn). Every refused, ignored and quarantined "
            "record, grant and revoke is drawn.")
        return sorted(kept + chosen, key=lambda p: p[1].offset)

    # -- explanations and tables ---------------------------------------------------------------

    def _explanations(self) -> _Why:
        return _Why(
            asked=None if self.wanted is None else len(self.wanted),
            explanations=[_Explanation(job, self.flags.get(job, []), self.forensics.explain(job))
                          for job in self.explained],
            with_plain=any(j not in self.flags for j in self.explained),
            any_job=bool(self.first),
            plain_count=len(self.plain),
            plain_names=", ".join(self.plain[:40]) + (", …" if len(self.plain) > 40 else ""))

    def _refused(self) -> _Table:
        rows = [d for d in self.window if d.outcome == Outcome.REJECTED]
        head = ("offset", "time (UTC)", "type", "job", "writer", "epoch", "expected epoch",
                "reason")
        body = [(d.offset, _iso(d.timestamp), d.event_type, d.job_id, d.writer, d.epoch,
                 d.expected_epoch, d.reason) for d in rows]
        return _table("Refused writes", head, body, "No write was refused in the window.",
                      css_class="refused", reason_column=7, details=[d.detail for d in rows])

    def _quarantined(self) -> _Table:
        rows = [d for d in self.window if d.outcome == Outcome.QUARANTINED]
        head = ("offset", "time (UTC)", "key", "reason")
        body = [(d.offset, _iso(d.timestamp), d.key, d.reason) for d in rows]
        return _table("Quarantined records", head, body,
                      "No record was quarantined in the window.", css_class="quar",
                      reason_column=3, details=[d.detail for d in rows])

    def _terms_table(self) -> _Table:
        stamp = {d.offset: d.timestamp for d in self.all}
        head = ("epoch", "leader", "started", "granted at (UTC)", "ended", "first offset",
                "last offset", "accepted", "rejected")
        body = [(t.epoch, t.leader, t.started, _iso(stamp.get(t.first_offset)), t.ended,
                 t.first_offset, t.last_offset, t.accepted, t.rejected) for t in self.terms]
        return _table("Leadership terms", head, body, "No term was ever granted.",
                      css_class="terms")


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[object]], empty: str, *,
           css_class: str, reason_column: int | None = None,
           details: Sequence[str] = ()) -> _Table:
    """A table of at most :data:`MAX_TABLE_ROWS` rows; the reason column's cells are coloured.
    ``details`` (long texts, one per row) go on a line of their own under their row, across
    the table: a column of them would leave the others too little room in a narrow window."""
    column_classes = ["reason" if i == reason_column else "" for i in range(len(head))]
    shown = rows[:MAX_TABLE_ROWS]
    return _Table(title=title, head=head, rows=shown, empty=empty, css_class=css_class,
                  column_classes=column_classes, details=list(details)[:MAX_TABLE_ROWS],
                  total=len(rows), left_out=len(rows) - len(shown), max_rows=MAX_TABLE_ROWS)


def _holds(view: JobView) -> str:
    """What a dirty result still holds, for people."""
    graph = view.graph
    what = (f"its graph {graph.uri}" if isinstance(graph, GraphRef)
            else "its graph (inline)" if graph is not None else "no graph")
    return f"{what}, {_count(len(view.checkpoints.retained), 'retained checkpoint')}"


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


def _tick(x: float, label: str, char_width: float, plot_width: int, title: str = "") -> _Tick:
    """A tick at ``x`` whose label stays in the plot."""
    label_x, anchor = _fit(x, len(label) * char_width, plot_width)
    return _Tick(x=x, label_x=label_x, anchor=anchor, label=label, title=title)


def _fit(x: float, width: float, plot_width: int) -> tuple[float, str]:
    """Where to anchor a label of ``width`` centred on ``x`` so that it stays in the plot:
    ``(x, text-anchor)``."""
    if x - width / 2 < 2:
        return max(x, 2.0), "start"
    if x + width / 2 > plot_width - 2:
        return min(x, plot_width - 2.0), "end"
    return x, "middle"


def _offset_ticks(first: int, last: int) -> list[int]:
    """Offsets to label: a 1-2-5 step giving at most ~10 ticks, all within [first, last]."""
    span = max(last - first, 1)
    step = 1
    magnitude = 1
    while True:
        for multiple in (1, 2, 5):
            step = multiple * magnitude
            if span / step <= 10:
                start = math.ceil(first / step) * step
                return list(range(start, last + 1, step))
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
                plot_width: int) -> list[tuple[float, str, int]]:
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

    def x_reaching(t: int) -> float:
        i = bisect.bisect_left(reached, t)
        if i == 0:
            return xs[0]
        before, after = reached[i - 1], reached[i]
        return xs[i - 1] + (xs[i] - xs[i - 1]) * (t - before) / (after - before)

    taken: list[tuple[float, float]] = []
    placed: set[int] = set()
    ticks: list[tuple[float, str, int]] = []

    def place(t: int, label: str) -> None:
        tx = x_reaching(t)
        width = len(label) * _TIME_CHAR_WIDTH
        lx, anchor = _fit(tx, width, plot_width)
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
