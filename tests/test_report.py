"""The HTML incident report: what it shows, that it escapes log data, that it loads nothing.

Incident 000 is played on the embedded broker and rendered; headless Chromium
draws the page to a PNG (decoded here with zlib, no imaging library) and logs
every network request it makes (``--log-net-log``), which must contain none
from the page. Two control pages prove that the net log does see a page's
request, and that the report's own Content-Security-Policy stops one.

``JOBREG_REPORT_KEEP=<dir>`` keeps the page and its screenshot there (to look at);
``JOBREG_ALLOW_NO_CHROMIUM=1`` skips the browser test where Chromium is absent
(otherwise its absence fails: CI installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_forensics import _incident_000

from registry import ConfigError
from registry.codec import Codec, default_codec, encode
from registry.events import (
    Event,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobLockReleased,
    JobSubmitted,
    LeadershipGranted,
    LeaseRenewed,
    new_event_id,
)
from registry.forensics import Forensics
from registry.image import LogRecord
from registry.keys import job_key, lock_key, record_key
from registry.report import render_report, write_report

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
    log.add(JobAdopted(**log.env(2, "jm-2"), job_id="job-a"))
    late = JobLockReleased(**log.env(1, writer1), job_id="job-a")  # the zombie
    log.add(late)
    log.add(JobCancelled(**log.env(2, "jm-2"), job_id="job-a", reason="user cancel"))
    log.add(late)  # the same event again: a duplicate
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
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
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
    assert f.explain("job-a").replace("'", "&#x27;") in page
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
    with pytest.raises(ConfigError, match="unknown job id.*'job-zz'"):
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
    marks = _incident_000(lambda: connect("report"))
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
    assert "stale_epoch" in explain and explain.replace("'", "&#x27;") in page
    assert f"<dd>{forensics.source.topic}</dd>" in page
    # self-contained: nothing to fetch
    lowered = page.lower()
    for external in ("http://", "https://", "src=", "@import", "url(", "<script", "<link"):
        assert external not in lowered, external
    assert "default-src &#x27;none&#x27;" in page

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
