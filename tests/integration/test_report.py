"""The HTML incident report: what it shows, that it escapes log data, that it loads nothing.

Incident 000 is played on the embedded broker and rendered; headless Chromium
draws the page to a PNG (decoded here with zlib, no imaging library) and logs
every network request it makes (``--log-net-log``), which must contain none
from the page. Two control pages prove that the net log does see a page's
request, and that the report's own Content-Security-Policy stops one.

The demo's five incidents (and one more with what they lack: a quarantined
record, a duplicate, a restart, a job over its checkpoint budget, a cleaned
result) are played on the embedded broker with the library and their reports
drawn by Chromium at 1,400 and 800 px wide (issue 15 items 10-12): what the
browser shows of the summary and the explanations, and where it lays out every
text of the timeline (a copy of the page with a measuring script added, read
back with ``--dump-dom``; the report itself has no script). Each test prints
the directory of its pages and screenshots.

``JOBREG_REPORT_KEEP=<dir>`` keeps the pages and screenshots there (to look at);
``JOBREG_ALLOW_NO_CHROMIUM=1`` skips the browser tests where Chromium is absent
(otherwise its absence fails: CI installs it).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.incidents import incident_000

from registry import ConfigError, Registry, UnknownJob, WriteRejected
from registry.codec import Codec, default_codec, encode
from registry.events import (
    Event,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobLockReleased,
    JobSubmitted,
    JobTerminated,
    LeaderInformationPublished,
    LeadershipGranted,
    LeaseRenewed,
    new_event_id,
)
from registry.forensics import Forensics
from registry.image import LogRecord
from registry.keys import job_key, lock_key, record_key
from registry.log import write_raw
from registry.recovery import RecoveredJob
from registry.report import _SYMBOLS, render_report, write_report

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("JOBREG_CHROMIUM", "/usr/bin/chromium")
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


# -- an in-memory log ----------------------------------------------------------------------------

class MemorySource:
    """A LogSource over records held in memory."""

    def __init__(self, records: list[LogRecord]) -> None:
        self.records = records

    def batches(self) -> Iterator[list[LogRecord]]:
        for i in range(0, len(self.records), 1000):
            yield self.records[i:i + 1000]

    def codec(self) -> Codec:
        return default_codec()


class Log:
    """Builds a namespace's records: events under their proper keys, stamped 1 s apart."""

    def __init__(self, ns: str = "mem") -> None:
        self.ns = ns
        self.records: list[LogRecord] = []

    def add(self, event: Event, key: str | None = None, value: bytes | None = None,
            stamp: int | None = -1) -> int:
        offset = len(self.records)
        ts = T0 + offset * 1000 if stamp == -1 else stamp
        self.records.append(LogRecord(offset, (key or record_key(event)).encode(),
                                      encode(event) if value is None else value, ts))
        return offset

    def env(self, epoch: int, writer: str) -> dict:
        return dict(event_id=new_event_id(), namespace=self.ns, epoch=epoch, writer=writer,
                    created_at=0)

    def grant(self, epoch: int, writer: str) -> int:
        return self.add(LeadershipGranted(**self.env(epoch, writer), prev_epoch=epoch - 1))

    def submit(self, epoch: int, writer: str, job: str, stamp: int | None = -1) -> int:
        return self.add(JobSubmitted(**self.env(epoch, writer), job_id=job,
                                     graph=InlineGraph(b"g")), stamp=stamp)

    def forensics(self) -> Forensics:
        return Forensics(MemorySource(self.records), self.ns)


def _memory_incident(writer1: str = "jm-1") -> Log:
    """Incident 000's shape, plus a quarantined record and a duplicate."""
    log = Log()
    log.grant(1, writer1)
    log.submit(1, writer1, "job-a")
    log.submit(1, writer1, "job-b")
    log.grant(2, "jm-2")
    adopt = JobAdopted(**log.env(2, "jm-2"), job_id="job-a")
    log.add(adopt)
    late = JobLockReleased(**log.env(1, writer1), job_id="job-a")  # the zombie
    log.add(late)
    log.add(JobCancelled(**log.env(2, "jm-2"), job_id="job-a", reason="user cancel"))
    # the accepted adopt again: a duplicate (a copy of a refused record is decided anew:
    # fold rule 1)
    log.add(adopt)
    log.add(late, key=job_key(log.ns, "job-b"), value=b"\x00garbage")  # undecodable
    log.grant(3, "jm-3")
    return log


# -- the page, without a broker ------------------------------------------------------------------

def test_log_data_is_escaped_everywhere() -> None:
    evil = "<script>alert('x')</script>"
    log = Log()
    log.add(LeadershipGranted(**log.env(1, evil), prev_epoch=0))
    log.submit(1, evil, "job-a")
    log.grant(2, "jm-2")
    log.add(JobLockReleased(**log.env(1, evil), job_id="job-a"))  # refused: stale_epoch
    log.add(JobCancelled(**log.env(2, "jm-2"), job_id="job-a"), key=lock_key(log.ns, "job-a"),
            value=b"<img src=x onerror=alert(1)>")  # quarantined, garbage on a job key
    page = render_report(log.forensics(), title="<b>bold</b>", generated_at=T0)
    assert "<script" not in page.lower() and "<img" not in page and "<b>bold" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "stale_epoch" in page


def test_the_page_shows_what_the_fold_decided_and_is_deterministic(tmp_path) -> None:
    log = _memory_incident()
    f = log.forensics()
    page = render_report(f, generated_at=T0)
    assert page == render_report(f, generated_at=T0)
    assert page.count('href="#m-rejected"') == 1          # the zombie's release
    assert page.count('href="#m-quarantined"') == 1
    assert page.count('href="#m-duplicate"') == 1
    assert page.count('href="#m-grant"') == 3
    for pill in ("<b>10</b> records", "<b>1</b> rejected", "<b>1</b> quarantined",
                 "<b>1</b> duplicates"):
        assert pill in page
    assert "epoch 1 · jm-1" in page and "epoch 3 · jm-3" in page
    assert "2023-11-14T22:13:20.000Z" in page                    # first record, UTC
    assert f.explain("job-a").replace("'", "&#39;") in page
    # a window by time: records 3..6 only; job lanes and explanations follow it
    part = render_report(f, since=T0 + 3000, until=T0 + 6000, generated_at=T0)
    assert part.count('href="#m-grant"') == 1
    assert "offsets</dt><dd>3 – 6 (the log: 0 – 9)" in part
    assert "job-b</h3>" not in part and "job-a</h3>" in part
    quiet_b = render_report(f, jobs=["job-b"], since=T0 + 3000, until=T0 + 6000)
    assert "1 job lane(s) have no record in the window: job-b." in quiet_b
    assert "No records in the window" in render_report(f, since=T0 + 10**6)
    only_b = render_report(f, jobs=["job-b"], generated_at=T0)
    assert "job-b</h3>" in only_b and "job-a</h3>" not in only_b
    out = write_report(f, tmp_path / "r.html", generated_at=T0)
    assert out.read_text(encoding="utf-8") == page
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left
    log.submit(3, "jm-3", "job-c", stamp=None)  # a record without a timestamp: always kept
    part = render_report(log.forensics(), since=T0 + 3000, until=T0 + 6000, generated_at=T0)
    assert "offsets</dt><dd>3 – 10 (the log: 0 – 10)" in part and "job-c</h3>" in part


def test_bad_arguments_are_config_errors() -> None:
    f = _memory_incident().forensics()
    with pytest.raises(UnknownJob, match="unknown job id.*'job-zz'"):  # as the client says it
        render_report(f, jobs=["job-a", "job-zz"])
    with pytest.raises(ConfigError, match="malformed job id"):
        render_report(f, jobs=["<x>"])
    with pytest.raises(ConfigError, match="since .* is after until"):
        render_report(f, since=T0 + 2, until=T0 + 1)
    with pytest.raises(ConfigError, match="sequence of job ids"):
        render_report(f, jobs="job-a")


def test_a_large_log_is_thinned_but_keeps_every_refused_write() -> None:
    log = Log()
    log.grant(1, "jm-1")
    for i in range(60):
        log.submit(1, "jm-1", f"job-{i:02d}")
    for _ in range(6000):
        log.add(LeaseRenewed(**log.env(1, "jm-1")))
    log.grant(2, "jm-2")
    for i in range(0, 60, 2):  # 30 zombie writes
        log.add(JobLockReleased(**log.env(1, "jm-1"), job_id=f"job-{i:02d}"))
    page = render_report(log.forensics(), generated_at=T0)
    assert "10 job lane(s) left out" in page
    assert "thinned" in page and page.count('href="#m-renew"') < 2000
    assert page.count('href="#m-rejected"') == 30  # jobs with refused writes got the lanes
    assert page.count('href="#m-grant"') == 2 and "<b>30</b> rejected" in page
    assert page.count("<h3 ") == 30  # explained: the jobs with a refused write
    chosen = [f"job-{i:02d}" for i in range(1, 60, 2)]  # the untroubled ones
    quiet = render_report(log.forensics(), jobs=chosen, generated_at=T0)
    assert "job lane(s) left out" not in quiet and quiet.count('href="#m-rejected"') == 0
    assert quiet.count("<h3 ") == 30 and quiet.count('href="#m-submit"') == 30


def test_leader_information_is_drawn_on_the_leadership_lane_and_a_stale_one_refused() -> None:
    log = Log()
    log.grant(1, "jm-1")
    log.add(LeaderInformationPublished(**log.env(1, "jm-1"), component="dispatcher",
                                       session="s-1", address="jm-1:6123"))
    log.grant(2, "jm-2")
    log.add(LeaderInformationPublished(**log.env(1, "jm-1"), component="dispatcher",
                                       session="s-1", address="jm-1:6123"))  # deposed
    page = render_report(log.forensics(), generated_at=T0)
    assert page.count('href="#m-leader-info"') == 1 and page.count('href="#m-rejected"') == 1
    assert "leader information published (Flink)" in page  # in the legend
    assert "dispatcher: session s-1 at jm-1:6123" in page  # the accepted one's tooltip
    assert "stale_epoch" in page


# -- incident 000 on the broker, drawn by Chromium -----------------------------------------------

def _chromium() -> str:
    if Path(CHROMIUM).exists():
        return CHROMIUM
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("JOBREG_ALLOW_NO_CHROMIUM") == "1":
        pytest.skip("chromium is not installed (JOBREG_ALLOW_NO_CHROMIUM=1): the report is "
                    "not rendered by a browser in this run")
    pytest.fail(f"chromium not found at {CHROMIUM} or on PATH (apt-get install chromium; "
                "set JOBREG_ALLOW_NO_CHROMIUM=1 to skip instead)")


def _run_chromium(browser: str, page: Path, work: Path, name: str) -> tuple[Path, list[str]]:
    """Render ``page`` to ``work/<name>.png``; return it and every URL the page requested."""
    shot, netlog = work / f"{name}.png", work / f"{name}.netlog.json"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--hide-scrollbars",
           # no real name resolution, so the browser's own traffic cannot leave the machine
           "--host-resolver-rules=MAP * ~NOTFOUND",
           f"--user-data-dir={work / (name + '-profile')}", f"--screenshot={shot}",
           "--window-size=1400,1000", f"--log-net-log={netlog}",
           page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    events = json.loads(netlog.read_text(encoding="utf-8"))
    kinds = {v: k for k, v in events["constants"]["logEventTypes"].items()}
    requested = []
    for e in events["events"]:
        params = e.get("params") or {}
        # The browser's own requests (time sync, sign-in) have no initiator; a page's have one.
        if kinds.get(e["type"]) == "URL_REQUEST_START_JOB" and "url" in params \
                and params.get("initiator") != "not an origin":
            requested.append(params["url"])
    return shot, requested


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG: (width, height, rows of RGB(A) bytes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, bytearray(), None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data[pos + 8:pos + 8 + 13])
        elif kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(bytes(idat))
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i:i + 3]) for r in rows for i in range(0, stride, bpp)]


def _near(pixels: list[bytes], rgb: tuple[int, int, int], tolerance: int = 6) -> int:
    r0, g0, b0 = rgb
    return sum(1 for p in pixels if abs(p[0] - r0) <= tolerance and abs(p[1] - g0) <= tolerance
               and abs(p[2] - b0) <= tolerance)


def test_incident_000_report_in_a_headless_browser(connect, tmp_path) -> None:
    browser = _chromium()
    marks = incident_000(lambda: connect("report"))
    forensics = marks["reg"].forensics()
    path = write_report(forensics, tmp_path / "incident-000.html", generated_at=T0)
    page = path.read_text(encoding="utf-8")

    # what a person needs, in the page
    assert "stale_epoch" in page and "jm-1" in page
    row = (f"<td>{marks['late']}</td><td>[^<]*</td><td>JobLockReleased</td><td>job-a</td>"
           '<td>jm-1</td><td>1</td><td>2</td><td class="reason">stale_epoch</td>')
    assert re.search(row, page), "the refused write's table row"
    for epoch, leader in ((1, "jm-1"), (2, "jm-2"), (3, "jm-3")):
        assert f"<tr><td>{epoch}</td><td>{leader}</td>" in page  # the terms table
        assert f"epoch {epoch} · {leader}" in page                   # the band labels
    assert page.count('href="#m-rejected"') == 1
    explain = forensics.explain("job-a")
    assert "stale_epoch" in explain and explain.replace("'", "&#39;") in page
    assert f"<dd>{forensics.source.topic}</dd>" in page
    # self-contained: nothing to fetch
    lowered = page.lower()
    for external in ("http://", "https://", "src=", "@import", "url(", "<script", "<link"):
        assert external not in lowered, external
    assert "default-src &#39;none&#39;" in page

    keep = os.environ.get("JOBREG_REPORT_KEEP")
    shot, requested = _run_chromium(browser, path, tmp_path, "report")
    assert requested == [], f"the report made network requests: {requested}"
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
        shutil.copy(shot, Path(keep) / shot.name)
    assert shot.stat().st_size > 5_000
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1400, 1000)
    assert len(set(pixels[::7])) > 30, "the screenshot is (nearly) one colour"
    assert _near(pixels, (0xD6, 0x27, 0x28)) > 20, "no red refused-write mark drawn"
    for band in ("#d9ead3", "#fff2cc", "#d9d2e9"):  # the fills of epochs 1, 2, 3
        rgb = (int(band[1:3], 16), int(band[3:5], 16), int(band[5:7], 16))
        assert _near(pixels, rgb, 3) > 200, f"no band for a term in {band}"

    # Controls: the net log does see a page's request; the report's CSP stops one.
    meta = re.search(r'<meta http-equiv="Content-Security-Policy"[^>]*>', page)
    assert meta is not None
    probe = '<img alt="" src="http://127.0.0.1:9/probe.png">'
    open_page, csp_page = tmp_path / "open.html", tmp_path / "csp.html"
    open_page.write_text(f"<!DOCTYPE html><html><body>{probe}</body></html>")
    csp_page.write_text(f"<!DOCTYPE html><html><head>{meta.group(0)}</head>"
                        f"<body>{probe}</body></html>")
    assert _run_chromium(browser, open_page, tmp_path, "open")[1] == \
        ["http://127.0.0.1:9/probe.png"]
    assert _run_chromium(browser, csp_page, tmp_path, "csp")[1] == []


# -- the demo's incidents on the broker, drawn by Chromium at two widths (issue 15 10-12) --------

WIDTHS = (1400, 800)
INCIDENTS = ("000", "001", "002", "003", "004", "extras")
RECOVERY_ERROR = "ClassNotFoundException while initializing the job"


def _raw(reg: Registry, event: Event) -> int:
    """Write ``event`` straight to the log under its key, as a process the registry no longer
    hears from would (the demo's "zombie")."""
    return write_raw(reg.bootstrap, reg.topic, reg.partition, record_key(event), encode(event))


def _env(reg: Registry, epoch: int, writer: str) -> dict:
    return dict(event_id=new_event_id(), namespace=reg.namespace, epoch=epoch, writer=writer,
                created_at=0)


def _failing(job: str) -> Callable[[RecoveredJob], None]:
    def hook(recovered: RecoveredJob) -> None:
        if recovered.job_id == job:
            raise RuntimeError(RECOVERY_ERROR)
    return hook


def _play_001(make: Callable[[str], Registry]) -> None:
    """A finished job resubmitted after a failover: refused as terminal_job."""
    jm1 = make("incident-001")
    t1 = jm1.claim_leadership("jm-1", lease_ms=6000)
    t1.submit_many([("job-old", b"old"), ("job-run", b"run")])
    t1.terminate("job-old", "FINISHED")
    for _ in range(3):
        t1._write([LeaseRenewed(**_env(jm1, t1.epoch, "jm-1"))], guard=False)
    t1.submit("job-new", b"new")
    jm2 = make("incident-001")
    t2 = jm2.claim_leadership("jm-2", lease_ms=6000)
    t2.recover()
    with pytest.raises(WriteRejected, match="terminal"):
        t2.submit("job-old", b"the left-behind graph")


def _play_002(make: Callable[[str], Registry]) -> None:
    """The old leader removes a job the new leader holds: refused by epoch."""
    old = make("incident-002")
    t_old = old.claim_leadership("jm-old")
    t_old.submit("job-x", b"graph v1")
    new = make("incident-002")
    t_new = new.claim_leadership("jm-new")
    t_new.adopt("job-x")
    _raw(old, JobTerminated(**_env(old, 1, "jm-old"), job_id="job-x", state="FAILED",
                            reason="old leader removes its job graph"))


def _play_003(make: Callable[[str], Registry]) -> None:
    """One job of twenty throws during recovery; the next leader skips it."""
    jm1 = make("incident-003")
    jm1.claim_leadership("jm-1").submit_many([(f"job-{i:02d}", b"g") for i in range(20)])
    for contender in ("jm-2", "jm-3"):
        make("incident-003").claim_leadership(contender).recover(_failing("job-07"))


def _play_004(make: Callable[[str], Registry]) -> None:
    """A late failure of a discarded checkpoint: ignored."""
    t = make("incident-004").claim_leadership("jm-1")
    t.submit("job", b"g", max_checkpoint_failures=1)
    t.checkpoint_triggered("job", 4)
    t.checkpoint_completed("job", 4, "file:///checkpoints/job/4")
    t.checkpoint_triggered("job", 5)
    t.checkpoint_failed("job", 5, "DECLINED", "map-1", failure_reason="CHECKPOINT_DECLINED")
    t.checkpoint_discarded("job", 5, "declined by map-1")
    late = t.checkpoint_failed("job", 5, "DECLINED", "sink-3",
                               failure_reason="CHECKPOINT_DECLINED")
    assert late.ignored is not None
    t.checkpoint_triggered("job", 6)
    t.checkpoint_completed("job", 6, "file:///checkpoints/job/6")


def _play_extras(make: Callable[[str], Registry]) -> None:
    """What the five lack: a restart, a job over its checkpoint budget, a cleaned and a dirty
    result, a failed recovery among 15 jobs (11 plainly ACTIVE), a quarantined record and a
    duplicate."""
    jm1 = make("extras")
    plain = [(f"job-p{i:02d}", b"p") for i in range(11)]
    jm1.claim_leadership("jm-1").submit_many(
        [("job-b", b"b"), ("job-c", b"c"), ("job-d", b"d"), ("job-e", b"e"), *plain])
    jm2 = make("extras")
    t = jm2.claim_leadership("jm-2")
    t.recover(_failing("job-e"))
    for cp in (1, 2):
        t.checkpoint_triggered("job-b", cp)
        t.checkpoint_failed("job-b", cp, "declined", failure_reason="CHECKPOINT_DECLINED")
        if cp == 1:
            t.job_restarted("job-b", "tolerable checkpoint failures exceeded")
    t.cancel("job-c", "user cancel")
    t.mark_clean("job-c")
    t.terminate("job-d", "FINISHED")
    write_raw(jm2.bootstrap, jm2.topic, jm2.partition, job_key(jm2.namespace, "job-b"),
              b"\x00not avro")
    renewal = LeaseRenewed(**_env(jm2, t.epoch, "jm-2"))
    _raw(jm2, renewal)
    _raw(jm2, renewal)  # the same event again: a duplicate


PLAYS: dict[str, Callable[[Callable[[str], Registry]], object]] = {
    "000": lambda make: incident_000(lambda: make("incident-000")),
    "001": _play_001, "002": _play_002, "003": _play_003, "004": _play_004,
    "extras": _play_extras,
}


def _namespace(name: str) -> str:
    return name if name == "extras" else f"incident-{name}"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    keep = os.environ.get("JOBREG_REPORT_KEEP")
    path = Path(keep) if keep else tmp_path_factory.mktemp("report-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def incident_pages(broker, artifacts, tmp_path_factory) -> dict[str, Path]:
    """The reports of the incidents played on the broker: name -> page."""
    topic = f"jobreg-test-{uuid.uuid4().hex[:12]}"
    blobs = tmp_path_factory.mktemp("report-blobs")
    made: list[Registry] = []

    def make(namespace: str) -> Registry:
        made.append(Registry.connect(broker.bootstrap, namespace, topic=topic,
                                     blob_store=blobs))
        return made[-1]

    pages = {}
    try:
        for name, play in PLAYS.items():
            play(make)
            reg = next(r for r in made if r.namespace == _namespace(name))
            pages[name] = write_report(reg.forensics(), artifacts / f"report-{name}.html",
                                       title=f"incident {name}", generated_at=T0)
    finally:
        for reg in made:
            reg.close()
    return pages


_MEASURE = """<script>(() => {
const at = e => { const r = e.getBoundingClientRect();
  return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]; };
const own = t => [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.data).join('');
const q = s => document.querySelector(s);
const tl = q('.timeline'), plot = q('.tl-scroll'), why = q('#why'), sum = q('.summary');
const out = {
  innerWidth, clientWidth: document.documentElement.clientWidth,
  scrollWidth: document.documentElement.scrollWidth,
  height: document.documentElement.scrollHeight,
  plot: plot ? [plot.scrollWidth, plot.clientWidth] : null,
  names: q('.tl-labels') ? at(q('.tl-labels')) : null,
  texts: tl ? [...tl.querySelectorAll('text')].map(t => [own(t), t.getAttribute('class') || '',
                                                          at(t)]) : [],
  legend: [...document.querySelectorAll('.legend .key')].map(k => k.textContent),
  summary: sum ? sum.innerText : null, why: why ? why.innerText : null,
  body: document.body.innerText,
  tops: Object.fromEntries(['.summary', 'header', '.timeline', '#why'].map(
    s => [s, q(s) ? at(q(s))[1] : null])),
  summaryBottom: sum ? at(sum)[3] : null,
  anchors: [...document.querySelectorAll('a[href^="#"]')].map(
    a => [a.getAttribute('href'), !!document.getElementById(a.getAttribute('href').slice(1))]),
  plotBox: plot ? at(plot) : null,
  marks: [...document.querySelectorAll('.tl-plot use')].map(u => [u.getAttribute('href'),
    (u.querySelector('title') || {textContent: ''}).textContent.split('\\n')[0], at(u)]),
  tables: [...document.querySelectorAll('table')].map(t => ({
    title: t.closest('section').querySelector('h2').textContent, box: at(t),
    scroll: [t.parentElement.scrollWidth, t.parentElement.clientWidth],
    clipped: [...t.querySelectorAll('th,td')].filter(c => c.scrollWidth > c.clientWidth + 1)
      .map(c => c.textContent)})),
};
const pre = document.createElement('pre'); pre.id = 'jobreg-measure';
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
})();</script>"""


def _chromium_args(browser: str, work: Path, name: str) -> list[str]:
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={work / (name + '-profile')}"]


def _browse(browser: str, page: Path, width: int, work: Path) -> tuple[Path, dict]:
    """Lay ``page`` out ``width`` px wide: a screenshot of the whole page (scroll bars shown)
    and what a measuring script reads of a copy of it (the report itself has no script)."""
    stem = f"{page.stem}-{width}"
    html_text = page.read_text(encoding="utf-8")
    copy = work / f"{stem}.measure.html"
    copy.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html_text)
                    .replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    done = subprocess.run([*_chromium_args(browser, work, stem + "-m"),
                           f"--window-size={width},1000", "--dump-dom", copy.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r'<pre id="jobreg-measure">(.*?)</pre>', done.stdout, re.S)
    assert found, f"no measurement in the DOM of {copy}: {done.stdout[-2000:]}"
    measured = json.loads(html.unescape(found.group(1)))
    shot = work / f"{stem}.png"
    height = min(max(int(measured["height"]) + 20, 600), 8000)
    done = subprocess.run([*_chromium_args(browser, work, stem + "-s"),
                           f"--window-size={width},{height}", f"--screenshot={shot}",
                           page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for profile in (stem + "-m-profile", stem + "-s-profile"):
        shutil.rmtree(work / profile, ignore_errors=True)
    return shot, measured


@pytest.fixture(scope="module")
def browsed(incident_pages, artifacts) -> dict[tuple[str, int], tuple[Path, dict]]:
    """Every incident's page laid out by Chromium at every width: (name, width) -> (screenshot,
    measurements)."""
    browser = _chromium()
    print(f"\nreport pages and screenshots: {artifacts}")
    return {(name, width): _browse(browser, page, width, artifacts)
            for name, page in incident_pages.items() for width in WIDTHS}


def test_the_page_starts_with_what_happened(browsed, artifacts) -> None:
    """Issue 15 item 10: a generated summary first: terms and failovers, refused writes and
    by whom, failed recoveries with their errors, ignored checkpoint failures, resurrection
    attempts refused, dirty results (and restarts, budgets, quarantined, duplicates)."""
    print(f"\nreport pages and screenshots: {artifacts}")
    said = {name: browsed[name, 1400][1]["summary"] for name in INCIDENTS}
    for (name, width), (shot, m) in browsed.items():
        tops = m["tops"]
        assert tops[".summary"] < tops["header"] < tops[".timeline"] < tops["#why"], \
            (name, width, tops, shot)
        if width == 1400:
            assert m["summaryBottom"] < 1000, f"{name}: the summary is not all on the first " \
                f"screen ({shot})"
    s = said["000"]
    assert "3 leadership terms, 2 failovers" in s
    assert "epoch 2 jm-2 took over at offset" in s and "(epoch 1 ended without a revoke)" in s
    assert "1 write refused, by writer: jm-1: 1 write (stale_epoch), first JobLockReleased " \
        "of job-a" in s
    assert "1 job result still dirty" in s and "job-a (CANCELLED; holds its graph (inline)" in s
    assert "jm-3 leads (epoch 3) at the end of the log" in s
    assert "None of these happened: a resurrection attempt" in s
    s = said["001"]
    assert "2 leadership terms, 1 failover" in s
    assert "1 resurrection attempt refused" in s and "jm-2 (epoch 2) wrote JobSubmitted for " \
        "job-old" in s and "terminal_job" in s and "FINISHED" in s
    assert "1 write refused, by writer: jm-2: 1 write (terminal_job)." in s  # told once
    s = said["002"]
    assert "jm-old: 1 write (stale_epoch), first JobTerminated of job-x" in s
    s = said["003"]
    assert "1 job failed recovery: job-07 failed recovery at offset" in s
    assert f"by jm-2 (epoch 2): RuntimeError: {RECOVERY_ERROR}; still RECOVERY_FAILED" in s
    assert "20 jobs at the end of the log: 19 ACTIVE, 1 RECOVERY_FAILED" in s
    assert "3 leadership terms, 2 failovers" in s
    s = said["004"]
    assert "1 leadership term, no failover: epoch 1 jm-1 from offset 0." in s
    assert "1 checkpoint failure ignored (kept, not counted): job at offset" in s
    assert "checkpoint 5 was discarded" in s
    assert "None of these happened: a refused write" in s and "a dirty job result" in s
    s = said["extras"]
    for expected in ("1 job restart (checkpoint failures over budget): job-b at offset",
                     "1 job over its checkpoint failure budget at the end of the log",
                     "job-b (1 consecutive failure, 0 tolerable)",
                     "1 job result marked clean: job-c at offset",
                     "1 job result still dirty", "job-d (FINISHED;",
                     "1 record quarantined", "on job-b's key",
                     "1 duplicate record", "job-e failed recovery at offset",
                     f"RuntimeError: {RECOVERY_ERROR}"):
        assert expected in s, (expected, s)
    # the headline line says it in one sentence
    headline = [line for line in s.splitlines() if line.strip()][1]
    assert headline.startswith("2 leadership terms, 1 failover;") \
        and "1 job failed recovery (job-e)" in headline and "1 record quarantined" in headline


def test_every_job_with_something_to_explain_is_explained(browsed, artifacts) -> None:
    """Issue 15 item 11: incident 003 explains job-07 (RECOVERY_FAILED, with its error) and
    names the plainly ACTIVE jobs instead; nothing says "selected" when nobody selected."""
    print(f"\nreport pages and screenshots: {artifacts}")
    for (name, width), (_, m) in browsed.items():
        assert "selected" not in m["body"].lower(), (name, width)
        assert all(ok for _, ok in m["anchors"]), (name, m["anchors"])  # every link lands
    why = browsed["003", 1400][1]["why"]
    assert "job-07\n" in why and "job 'job-07' is RECOVERY_FAILED, held by epoch" not in why
    assert f"job 'job-07' is RECOVERY_FAILED (recovery failed: RuntimeError: " \
        f"{RECOVERY_ERROR})" in why
    assert "19 other jobs are ACTIVE with nothing refused, ignored, quarantined or failed" in why
    assert "job-06\n" not in why and "job 'job-00'" not in why
    assert ["#job-job-07", True] in browsed["003", 1400][1]["anchors"]
    why = browsed["extras", 1400][1]["why"]
    for job in ("job-b", "job-c", "job-d", "job-e"):  # budget+restart+quarantined, terminal...
        assert f"job '{job}' is" in why, job
    assert "job 'job-p00'" not in why and "11 other jobs are ACTIVE" in why
    for job, tags in (("job-b", ("1 quarantined record", "1 restart",
                                 "checkpoint failures over budget")),
                      ("job-c", ("CANCELLED",)), ("job-d", ("FINISHED", "result dirty")),
                      ("job-e", ("RECOVERY_FAILED", "failed recovery"))):
        block = why.split(f"{job}\n", 1)[1]
        for tag in tags:
            assert tag in block.split("job '", 1)[0], (job, tag, block[:300])
    # small logs still explain every job; a refusal is one more thing to explain
    assert "job 'job-a' is CANCELLED" in browsed["000", 1400][1]["why"]
    assert "job 'job-old' is FINISHED" in browsed["001", 1400][1]["why"]


def test_nothing_to_explain_is_said_as_such() -> None:
    log = Log()
    log.grant(1, "jm-1")
    for i in range(12):
        log.submit(1, "jm-1", f"job-{i:02d}")
    page = render_report(log.forensics(), generated_at=T0)
    assert "selected" not in page and "<h3 " not in page
    assert "Every job is ACTIVE with nothing refused, ignored, quarantined or failed: nothing " \
        "to explain." in page and "12 other jobs are ACTIVE" in page
    assert "None of these happened: a refused write" in page
    empty = render_report(log.forensics(), since=T0 + 10**6, generated_at=T0)
    assert "selected" not in empty and "No record in the window." in empty
    asked = render_report(log.forensics(), jobs=["job-03"], generated_at=T0)
    assert "The 1 job asked for." in asked and asked.count("<h3 ") == 1


def _overlaps(texts: list) -> list[tuple[str, str]]:
    boxes = [(t, b) for t, _, b in texts if t.strip()]
    out = []
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            if min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5:
                out.append((ta, tb))
    return out


def test_the_timeline_reads_at_1400_and_800_px(browsed, incident_pages, artifacts) -> None:
    """Issue 15 item 12, on every incident's page at both widths: no text of the picture
    overlaps another (the "time (UTC)" caption and the first time label included), no time
    label repeats, no horizontal scroll bar at 1,400 px (at 800 the plot scrolls on its own
    and the lane names stay), a legend of only the symbols drawn, the red edge explained,
    the quarantine lane neither tinted nor drawn empty."""
    print(f"\nreport pages and screenshots: {artifacts}")
    for (name, width), (shot, m) in browsed.items():
        where = f"{name} at {width} px ({shot})"
        assert shot.stat().st_size > 5_000, where
        assert m["scrollWidth"] <= m["clientWidth"], f"the page scrolls sideways: {where}"
        assert _overlaps(m["texts"]) == [], where
        times = [(b[0], t) for t, cls, b in m["texts"] if cls == "tt"]
        labels = [t for _, t in sorted(times)]
        assert labels and len(set(labels)) == len(labels), (where, labels)
        assert labels == sorted(labels), (where, labels)  # left to right, in time order
        caption = next(b for t, _, b in m["texts"] if t == "time (UTC)")
        assert all(caption[2] < b[0] for _, cls, b in m["texts"] if cls == "tt"), where
        names = m["names"]
        assert names[0] >= 0 and names[2] <= m["clientWidth"], f"lane names cut off: {where}"
        if width == 1400:
            assert m["plot"][0] <= m["plot"][1], f"the timeline scrolls at 1400 px: {where}"
    # at 800 px every incident's plot fits (issue 29 §2: 003's scrolled, its end off-screen)
    for name in INCIDENTS:
        assert browsed[name, 800][1]["plot"][0] <= browsed[name, 800][1]["plot"][1], name
    for name, page in incident_pages.items():
        text = page.read_text(encoding="utf-8")
        used = set(re.findall(r'<use href="#m-([a-z-]+)"', text))
        legend = browsed[name, 1400][1]["legend"]
        symbols = {s: t for s, (_, t, _) in _SYMBOLS.items()}
        assert {s for s, t in symbols.items() if t in legend} == used, (name, legend)
        attention = re.findall(r'<rect class="attention"[^>]*><title>([^<]*)</title>', text)
        assert attention, name  # every incident has a job to explain
        assert all(t.startswith("to explain: ") for t in attention), attention
        assert "red edge: the job has something to explain (below)" in legend
        assert 'fill="#9c27b0" fill-opacity' not in text  # no tinted quarantine lane
        assert ('font-weight="700" fill="#4a0072">quarantined<' in text) == (name == "extras")
    legend = browsed["003", 1400][1]["legend"]
    assert len(legend) <= 8 and not any("checkpoint" in k for k in legend), legend
    legend = browsed["004", 1400][1]["legend"]
    assert {"triggered", "completed", "failed (counted)", "discarded"} <= set(legend)
    # incident 000's picture, in pixels: the refused write's red, the three terms' bands
    _, _, pixels = _png_pixels(browsed["000", 1400][0])
    assert _near(pixels, (0xD6, 0x27, 0x28)) > 20
    for band in ("#d9ead3", "#fff2cc", "#d9d2e9"):
        rgb = (int(band[1:3], 16), int(band[3:5], 16), int(band[5:7], 16))
        assert _near(pixels, rgb, 3) > 200, band


def _inside(box: list[float], frame: list[float]) -> bool:
    return box[0] >= frame[0] - 0.5 and box[2] <= frame[2] + 0.5


def test_at_800_px_the_story_is_on_screen_without_scrolling_sideways(browsed, artifacts) -> None:
    """Issue 29 §2: at 800 px incident 003's timeline scrolled and showed offsets 0-32 only
    (epoch 3 off-screen), and the refused-writes and terms tables were cut at "deta..." and
    "accep...". On every incident's page at both widths: every mark and every text of the
    picture lies within the visible part of the plot, the plot and the tables do not scroll
    sideways, no table cell is cut (they wrap), and no table reaches past the window."""
    print(f"\nreport pages and screenshots: {artifacts}")
    for (name, width), (shot, m) in browsed.items():
        where = f"{name} at {width} px ({shot})"
        frame = m["plotBox"]
        assert frame[2] <= m["clientWidth"], f"the timeline reaches past the window: {where}"
        assert m["plot"][0] <= m["plot"][1], f"the timeline scrolls: {where}"
        off = [(href, title) for href, title, box in m["marks"] if not _inside(box, frame)]
        assert off == [], f"marks off-screen: {where}: {off[:5]}"
        off = [t for t, cls, box in m["texts"] if cls in ("ot", "tt") and not _inside(box, frame)]
        assert off == [], f"labels off-screen: {where}: {off[:5]}"
        for table in m["tables"]:
            assert table["scroll"][0] <= table["scroll"][1], (table["title"], where)
            assert table["box"][2] <= m["clientWidth"], (table["title"], where)
            assert table["clipped"] == [], (table["title"], where, table["clipped"][:5])
    # incident 003 at 800 px: job-07's failed recovery and all of epoch 3 are in sight
    shot, m = browsed["003", 800]
    frame = m["plotBox"]
    failed = [box for href, title, box in m["marks"]
              if href == "#m-recovery" and "JobRecoveryFailed" in title]
    assert len(failed) == 1 and _inside(failed[0], frame), (failed, frame, shot)
    grants = [box for href, title, box in m["marks"] if href == "#m-grant"]
    assert len(grants) == 3 and all(_inside(b, frame) for b in grants), (grants, frame, shot)
    epoch3 = [box for t, _, box in m["texts"] if t.startswith(("epoch 3", "e3"))]
    assert epoch3 and _inside(epoch3[0], frame), (epoch3, frame, shot)
    last = max(int(t) for t, cls, _ in m["texts"] if cls == "ot")
    assert last >= 60, f"the last offset label in sight is {last} ({shot})"
    terms = next(t for t in m["tables"] if t["title"].startswith("Leadership terms"))
    assert terms["clipped"] == [] and terms["scroll"][0] <= terms["scroll"][1]
