"""Issue 29 section 2: what a newcomer trips over in the CLI, each through the real entry
point (``jobreg`` via click's runner, as the other CLI tests): global options after the
command, times in the audit tables, the timeline's reason, ``jobs`` after a cancel, one rule
for exit codes, ``--limit 0``, an empty report window, an Avro file that is not a dump."""

from __future__ import annotations

import json
import re
from pathlib import Path

import fastavro
import pytest
from click.testing import CliRunner
from support.incidents import incident_000

from registry import Registry
from registry.cli import EPILOG, EXIT_NOT_FOUND, EXIT_USAGE, main

pytestmark = pytest.mark.integration

NS = "ns-29"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
README = Path(__file__).parents[2] / "README.md"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def log(connect) -> dict:
    """Incident 000 (job-a cancelled with "user cancel", job-b live, a stale release refused)
    in namespace ns-29, and a namespace whose only job was cancelled."""
    marks = incident_000(lambda: connect(NS))
    reg: Registry = marks["reg"]
    done = connect("ns-29-done")
    t = done.claim_leadership("jm-1")
    t.submit("job-x", b"g")
    t.cancel("job-x", "no longer needed")
    marks["at"] = ["--bootstrap", reg.bootstrap, "--topic", reg.topic]
    return marks


def test_global_options_work_after_the_command(log, tmp_path) -> None:
    """`jobreg jobs --json` answered "No such option '--json'"."""
    at = log["at"]
    before = run(*at, "--namespace", NS, "--json", "jobs")
    after = run("jobs", "--json", *at, "--namespace", NS)
    assert before[0] == after[0] == 0, after
    assert json.loads(after[1]) == json.loads(before[1])
    assert json.loads(after[1])["format"] == "jobreg.jobs/1"
    # Given in both places, the one after the command wins.
    code, out, _ = run(*at, "--namespace", "elsewhere", "leader", "--namespace", NS, "--json")
    assert code == 0 and json.loads(out)["namespace"] == NS
    # Checked as before the command: a malformed one is a usage error, one line why.
    code, _, err = run("jobs", "--bootstrap", "foo")
    assert code == EXIT_USAGE and "Invalid value for --bootstrap" in err
    assert "is not HOST:PORT" in err and "No such option" not in err
    # --from-file after the command; audit check keeps its own --from-file.
    dump = tmp_path / "ns.avro"
    assert run(*at, "--namespace", NS, "dump", str(dump))[0] == 0
    code, out, _ = run("timeline", "job-a", "--from-file", str(dump), "--json")
    assert code == 0 and json.loads(out)["job_id"] == "job-a"
    code, out, _ = run("jobs", "--help")
    assert "may also come after the command: --bootstrap, --namespace" in " ".join(out.split())
    code, out, _ = run("audit", "check", "--help")
    assert "command: --bootstrap, --namespace, --topic, --command-config, --partitions, --json" \
        in " ".join(out.split())  # its own --from-file is not the global one


def test_the_timeline_shows_the_users_reason_in_its_reason_column(log) -> None:
    """The cancel's reason sat under `detail` while `reason` showed `-`."""
    code, out, _ = run(*log["at"], "--namespace", NS, "timeline", "job-a")
    assert code == 0
    header, _, *rows = out.splitlines()
    assert header.split()[-2:] == ["outcome", "reason"]
    cancel = next(r for r in rows if "JobCancelled" in r)
    assert cancel.rstrip().endswith("ACCEPTED  user cancel")
    refused = next(r for r in rows if "REJECTED" in r)
    assert "stale_epoch: " in refused
    # JSON keeps the fold's code and the detail apart, as before.
    doc = json.loads(run(*log["at"], "--namespace", NS, "--json", "timeline", "job-a")[1])
    cancel_json = next(r for r in doc["records"] if r["event_type"] == "JobCancelled")
    assert (cancel_json["reason"], cancel_json["detail"]) == (None, "reason: user cancel")


def test_jobs_after_a_cancel_points_to_all_which_says_why(log) -> None:
    """`jobs` printed "(no jobs)" after a cancel; `jobs --all` had no reason column."""
    at = [*log["at"], "--namespace", "ns-29-done"]
    code, out, _ = run(*at, "jobs")
    assert code == 0 and out.strip() == "(no live jobs; 1 ended: --all shows them)"
    code, out, _ = run(*at, "jobs", "--all")
    header, _, row = out.splitlines()
    assert header.split()[-1] == "reason" and "CANCELLED" in row
    assert row.rstrip().endswith("no longer needed")


def test_an_unknown_job_exits_3_everywhere_and_help_and_readme_say_the_same(log,
                                                                           tmp_path) -> None:
    """`report --job` of an unknown job exited 1, `explain`/`timeline` 3; `--help` listed an
    exit-2 cause the README did not."""
    at = [*log["at"], "--namespace", NS]
    for args in (["timeline", "job-never"], ["explain", "job-never"],
                 ["report", "--out", str(tmp_path / "r.html"), "--job", "job-never"]):
        code, _, _ = run(*at, *args)
        assert code == EXIT_NOT_FOUND, args
    code, _, err = run(*at, "report", "--out", str(tmp_path / "r.html"), "--job", "job-never")
    assert "unknown job id(s) in namespace 'ns-29': 'job-never'" in err
    assert not (tmp_path / "r.html").exists()
    help_text = " ".join(run("--help")[1].split())
    assert " ".join(EPILOG.split()) in help_text
    readme = README.read_text()
    start = readme.index("Exit codes (the same words end `jobreg --help`): ")
    paragraph = readme[start:readme.index("\n\n", start)]
    said = " ".join(paragraph.replace("`", "").split())
    assert said.replace("Exit codes (the same words end jobreg --help): ", "Exit codes: ") \
        == " ".join(EPILOG.split())


def test_limit_0_says_it_showed_no_row(connect, tmp_path) -> None:
    """`--limit 0` printed "0 rows shown; there are more"."""
    db = _audited(connect, tmp_path)
    code, out, _ = run("audit", "query", "SELECT * FROM audit_records", "--limit", "0",
                       "--db", db)
    assert code == 0 and out.strip().endswith("(--limit 0: no row shown; the query has rows)")
    doc = json.loads(run("--json", "audit", "query", "SELECT * FROM audit_records",
                         "--limit", "0", "--db", db)[1])
    assert doc["rows"] == [] and doc["truncated"] is True


def test_audit_terms_show_times_as_iso_and_the_current_term_as_current(connect,
                                                                      tmp_path) -> None:
    """`audit terms` showed no time, `audit query` raw ms, and the current term as `-`."""
    db = _audited(connect, tmp_path)
    code, out, _ = run("audit", "terms", "--db", db)
    header, _, *rows = out.splitlines()[:-1]
    assert code == 0 and header.split()[4:7] == ["granted_at", "ended_at", "ended_by"]
    assert all(ISO.search(r) for r in rows) and len(rows) == 3
    assert "CURRENT" in rows[-1] and "SUPERSEDED" in rows[0]
    code, out, _ = run("audit", "query", "SELECT epoch, granted_at, ended_at FROM "
                       "leadership_terms ORDER BY epoch", "--db", db)
    lines = out.splitlines()
    assert code == 0 and len(ISO.findall(lines[2])) == 2 and len(ISO.findall(lines[4])) == 1
    assert not re.search(r"\b\d{13}\b", out)  # no raw ms left for people
    doc = json.loads(run("--json", "audit", "terms", "--db", db)[1])
    terms = [dict(zip(doc["columns"], r, strict=True)) for r in doc["rows"]]
    assert isinstance(terms[0]["granted_at"], int)  # JSON keeps the stored ms
    assert terms[-1]["ended_at"] is None and terms[-1]["ended_by"] == "CURRENT"


def test_an_empty_window_is_said_once_without_no_trouble(log, tmp_path) -> None:
    """The report said "No trouble found. No record in the window." for an empty window."""
    out = tmp_path / "empty.html"
    code, _, err = run(*log["at"], "--namespace", NS, "report", "--out", str(out),
                       "--since", "2100-01-01T00:00:00Z")
    page = out.read_text()
    assert code == 0, err
    assert "No record in the window." in page and "No trouble found" not in page
    assert page.count("No record in the window") == 1


def test_an_avro_file_that_is_not_a_dump_is_named_as_such(tmp_path) -> None:
    """A valid Avro file that is not a dump said "(format None)"."""
    other = tmp_path / "other.avro"
    with other.open("wb") as f:
        fastavro.writer(f, fastavro.parse_schema(
            {"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}]}),
            [{"x": 1}])
    code, _, err = run("jobs", "--from-file", str(other))
    assert code == 1 and "None" not in err
    assert err.strip() == (f"Error: {other}: not a jobreg dump (an Avro file without jobreg's "
                           "format mark; `jobreg dump` writes dumps)")


def _audited(connect, tmp_path) -> str:
    """Incident 000 written into a fresh SQLite audit database; its URL."""
    marks = incident_000(lambda: connect(NS))
    reg = marks["reg"]
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    code, _, err = run("--bootstrap", reg.bootstrap, "--topic", reg.topic, "audit", "run",
                       "--plain", "--db", db)
    assert code == 0, err
    return db
