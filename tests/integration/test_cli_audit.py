"""`jobreg audit ...` through the real entry point: migrate, run, query, check, the named
queries, their JSON, exit codes, and bad input (a write, a database that is gone)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from support.incidents import incident_000, incident_002

from registry.cli import main

pytestmark = pytest.mark.integration


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def audited(connect, tmp_path):
    """Incidents 000 and 002 on a topic, written into a fresh SQLite audit database."""
    marks = incident_000(lambda: connect("ns-000"))
    incident_002(connect)
    reg = marks["reg"]
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    base = ["--bootstrap", reg.bootstrap, "--topic", reg.topic]
    code, out, err = cli(*base, "--json", "audit", "run", "--plain", "--db", db)
    assert code == 0, err
    run = json.loads(out)
    assert run["format"] == "jobreg.audit-run/1" and run["records"] > 0
    assert run["source"] == "plain"
    return base, db


def test_run_check_and_the_named_queries(audited) -> None:
    base, db = audited
    code, out, _ = cli(*base, "audit", "check", "--db", db)
    assert code == 0 and "agrees with the fold" in out
    code, out, _ = cli("--json", "audit", "refused", "--db", db)
    doc = json.loads(out)
    assert code == 0 and doc["format"] == "jobreg.audit-refused/1"
    refused = [dict(zip(doc["columns"], row, strict=True)) for row in doc["rows"]]
    assert [(r["namespace"], r["writer"], r["reason"]) for r in refused] == [
        ("ns-000", "jm-1", "stale_epoch"), ("ns-002", "jm-old", "stale_epoch")]
    code, out, _ = cli("audit", "terms", "--db", db)
    assert code == 0 and "jm-new" in out and "(5 rows)" in out
    code, out, _ = cli("audit", "resurrections", "--db", db)
    assert code == 0 and "(0 rows)" in out
    code, out, _ = cli("--json", "audit", "results", "--db", db)
    doc = json.loads(out)
    results = [dict(zip(doc["columns"], row, strict=True)) for row in doc["rows"]]
    assert [(r["job_id"], r["status"], bool(r["dirty"]), r["reason"]) for r in results] == [
        ("job-a", "CANCELLED", True, "user cancel")]  # cancelled, its cleanup not done
    # --limit says when it left rows out (issue 15 item 14)
    code, out, _ = cli("--json", "audit", "query", "SELECT * FROM audit_records", "--limit",
                       "5", "--db", db)
    doc = json.loads(out)
    assert len(doc["rows"]) == 5 and doc["truncated"] is True
    code, out, _ = cli("audit", "query", "SELECT * FROM audit_records", "--limit", "5",
                       "--db", db)
    assert "(5 rows shown; there are more: raise --limit)" in out
    code, out, _ = cli("--json", "audit", "query", "SELECT count(*) FROM audit_jobs", "--db", db)
    assert json.loads(out)["truncated"] is False
    code, out, _ = cli("--json", "audit", "query", "SELECT count(*) AS n FROM audit_jobs",
                       "--db", db)
    assert json.loads(out)["rows"] == [[3]]
    # nothing new: a second run writes nothing, the check still passes
    code, out, _ = cli(*base, "--json", "audit", "run", "--plain", "--db", db)
    assert json.loads(out)["records"] == 0
    assert cli(*base, "audit", "check", "--db", db)[0] == 0


def test_a_resurrection_or_a_difference_exits_1(audited) -> None:
    import sqlite3

    base, db = audited
    path = db.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:  # what a broken projection would have written
        conn.execute("UPDATE audit_records SET job_status = 'ACTIVE' WHERE job_id = 'job-a' "
                     "AND event_type = 'JobReasserted'")
        conn.execute("UPDATE audit_jobs SET status = 'ACTIVE' WHERE job_id = 'job-a'")
    code, out, _ = cli("audit", "resurrections", "--db", db)
    assert code == 1 and "job-a" in out
    code, out, _ = cli(*base, "--json", "audit", "check", "--db", db)
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False
    assert any("job 'job-a': status 'ACTIVE' != 'CANCELLED'" in d for d in doc["differences"])


def test_check_against_dumps_when_the_broker_is_gone(audited, tmp_path) -> None:
    """Issue 15 item 16: `audit check --from-file` checks each dump's namespace against the
    dump, says which namespaces it did not check, and finds a planted difference."""
    import sqlite3

    base, db = audited
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for ns in ("ns-000", "ns-002"):
        assert cli(*base, "--namespace", ns, "dump", str(dumps / f"{ns}.avro"))[0] == 0
    # no --bootstrap: the dumps are the log
    code, out, err = cli("audit", "check", "--db", db, "--from-file", str(dumps))
    assert code == 0, err
    assert "agrees with the fold of 2 dump(s)" in out and "not checked" not in out
    code, out, _ = cli("--json", "audit", "check", "--db", db, "--from-file",
                       str(dumps / "ns-000.avro"))
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["unchecked"] == ["ns-002"]
    # the global --from-file works too
    code, out, _ = cli("--from-file", str(dumps / "ns-002.avro"), "audit", "check", "--db", db)
    assert code == 0 and "not checked (no dump given): ns-000" in out
    path = db.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE audit_jobs SET status = 'ACTIVE' WHERE job_id = 'job-a'")
        conn.execute("DELETE FROM audit_records WHERE namespace = 'ns-002' AND \"offset\" = "
                     "(SELECT max(\"offset\") FROM audit_records WHERE namespace = 'ns-002')")
    code, out, _ = cli("audit", "check", "--db", db, "--from-file", str(dumps))
    assert code == 1
    assert "job 'job-a': status 'ACTIVE' != 'CANCELLED'" in out
    assert "(ns-002): 1 records have no row" in out
    # bad input: a directory without dumps, a file that is not a dump, one namespace twice
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = cli("audit", "check", "--db", db, "--from-file", str(empty))
    assert code == 2 and "no dump (*.avro) in" in err
    code, _, err = cli("audit", "check", "--db", db, "--from-file", "/proc/version")
    assert code == 1 and "not a jobreg dump" in err and "Traceback" not in err
    code, _, err = cli("audit", "check", "--db", db, "--from-file", str(dumps / "ns-000.avro"),
                       "--from-file", str(dumps / "ns-000.avro"))
    assert code == 2 and "several dumps of namespace(s) ns-000" in err


def test_writes_are_refused_by_the_database(audited) -> None:
    _, db = audited
    for sql in ("DELETE FROM audit_records", "DROP TABLE audit_jobs",
                "UPDATE audit_terms SET leader = 'x'"):
        code, _, err = cli("audit", "query", sql, "--db", db)
        assert code == 1 and "refused the write" in err, (sql, err)
    assert json.loads(cli("--json", "audit", "query", "SELECT count(*) FROM audit_jobs",
                          "--db", db)[1])["rows"] == [[3]]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_databases_and_arguments(tmp_path) -> None:
    code, _, err = cli("audit", "migrate", "--db", "mysql://nobody@nowhere/x")
    assert code == 1 and "unsupported database" in err
    code, _, err = cli("audit", "query", "SELECT 1", "--db",
                       f"postgresql://jobreg@127.0.0.1:{_closed_port()}/x")
    assert code == 1 and "cannot connect to the audit database" in err
    code, _, err = cli("audit", "query", "SELECT 1", "--db",
                       f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    assert code == 1 and "Error" in err
    code, _, err = cli("audit", "check", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert code == 2 and "--bootstrap" in err
    code, _, err = cli("audit", "run", "--max-offsets-per-trigger", "0")
    assert code == 2 and "Usage" in err
    code, out, _ = cli("audit", "migrate", "--db", f"sqlite:///{tmp_path / 'ok.db'}")
    assert code == 0 and "revision 0006" in out


def test_audit_run_touches_no_database_before_the_broker_answers(tmp_path) -> None:
    """Issue 15 item 15: an unreachable broker creates no database file, and a run says
    where it wrote."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "never.db"
    code, _, err = cli("--bootstrap", f"127.0.0.1:{port}", "audit", "run", "--plain",
                       "--db", f"sqlite:///{db}")
    assert code == 1 and "no Kafka broker at" in err and "Traceback" not in err
    assert not db.exists()


def test_audit_run_says_which_database_it_wrote(audited) -> None:
    base, db = audited
    code, out, _ = cli(*base, "audit", "run", "--plain", "--db", db)
    assert code == 0 and f"batches to {db} (plain" in out


@pytest.mark.parametrize(("engine", "sig"), [
    ("plain", signal.SIGINT), ("plain", signal.SIGTERM),
    # SIGTERM on Spark: test_spark_cluster.py's follow runs end so
    pytest.param("spark", signal.SIGINT, marks=pytest.mark.spark)],
    ids=["plain-SIGINT", "plain-SIGTERM", "spark-SIGINT"])
def test_a_follow_run_ends_on_ctrl_c_and_on_a_containers_stop(connect, tmp_path, engine,
                                                              sig) -> None:
    """`audit run --follow` ends between batches on SIGINT (Ctrl-C) and on SIGTERM (what
    `docker compose stop` sends the audit service), says what it wrote, exits 0, and the
    database agrees with the fold. Ctrl-C is sent as a terminal sends it: to the whole
    process group (Spark's JVM and Python workers too). On Spark, pyspark's own SIGINT
    handler used to raise KeyboardInterrupt in the middle of the run ("Aborted!", exit 1)."""
    from registry.audit.db import query
    from registry.audit.writer import check

    reg = connect("follow")
    reg.claim_leadership("jm-1").submit("job-1", b"g")
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    how = ["--plain"] if engine == "plain" else ["--interval", "200 milliseconds"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "registry.cli", "--bootstrap", reg.bootstrap, "--topic",
         reg.topic, "audit", "run", "--follow", *how, "--db", db],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the follow run wrote nothing"
            try:
                if query(db, "SELECT count(*) FROM audit_jobs")[1] == [(1,)]:
                    break
            except Exception:  # the database is not migrated yet
                pass
            time.sleep(0.2)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C: the terminal signals the foreground group
        else:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "wrote 2 records" in out and "Traceback" not in err and "Aborted" not in err, err
    assert check(db, reg.bootstrap, reg.topic) == []
