"""The forensics CLI through its real entry point: every read command, --json shapes, exit
codes, environment variables, dumps with no broker, progress bars, bad input."""

from __future__ import annotations

import io
import json
import os
import pty
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner
from support.incidents import incident_000

from registry import EmbeddedBroker, Registry
from registry.cli import EXIT_NOT_FOUND, ProgressBar, main
from registry.codec import encode
from registry.events import InlineGraph, JobSubmitted, new_event_id
from registry.log import write_raw

pytestmark = pytest.mark.integration

JOBREG = [sys.executable, "-m", "registry.cli"]
NS = "cli-000"


@pytest.fixture(scope="module")
def incident(broker: EmbeddedBroker):
    """Incident 000 on a topic of its own, plus one corrupt record, for every test here."""
    topic = f"jobreg-cli-{new_event_id()[:8]}"
    made: list[Registry] = []

    def factory() -> Registry:
        made.append(Registry.connect(broker.bootstrap, NS, topic=topic))
        return made[-1]

    marks = incident_000(factory)
    reg = marks["reg"]
    marks["corrupt"] = write_raw(reg.bootstrap, topic, reg.partition, f"{NS}/job/job-z",
                                 b"\x00\x00\x00\x00\x07 not avro")
    marks["topic"], marks["bootstrap"] = topic, broker.bootstrap
    yield marks
    for r in made:
        r.close()


def cli(marks: dict, *args: str, env: dict | None = None) -> tuple[int, str, str]:
    """Run ``jobreg --bootstrap B --topic T --namespace N ARGS`` in-process (click's runner)."""
    runner = CliRunner()
    result = runner.invoke(main, ["--bootstrap", marks["bootstrap"], "--topic", marks["topic"],
                                  "--namespace", NS, *args], env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def as_json(marks: dict, *args: str) -> dict:
    code, out, err = cli(marks, "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_jobs_and_leader(incident) -> None:
    code, out, _ = cli(incident, "jobs")
    assert code == 0 and "job-b" in out and "job-a" not in out  # job-a is cancelled
    assert "job-a" in cli(incident, "jobs", "--all")[1]
    doc = as_json(incident, "jobs", "--all")
    assert doc["format"] == "jobreg.jobs/1" and doc["namespace"] == NS
    by_id = {j["job_id"]: j for j in doc["jobs"]}
    assert by_id["job-a"]["status"] == "CANCELLED" and by_id["job-a"]["owner_epoch"] is None
    assert by_id["job-b"] == {"job_id": "job-b", "status": "ACTIVE", "owner_epoch": 1,
                              "error": None, "graph": {"kind": "inline", "size": 7},
                              "max_checkpoint_failures": 0, "retained_checkpoints": 1,
                              "consecutive_failures": 0, "over_budget": False,
                              "checkpoints": [], "requirements": [], "reason": None,
                              "dirty": False, "last_completed_checkpoint": None,
                              "checkpoint_state_at": None, "checkpoint_state_time": None}
    assert as_json(incident, "leader") == {
        "format": "jobreg.leader/1", "namespace": NS, "epoch": 3, "leader": "jm-3",
        "revoked": False, "last_offset": doc["last_offset"]}
    assert "epoch 3: jm-3 (leading)" in cli(incident, "leader")[1]


def test_jobs_shows_each_jobs_last_checkpoint_and_when_its_state_was_written(broker) -> None:
    """Issue 43, item 7: a job whose checkpoints stopped stands out in ``jobreg jobs``."""
    topic = f"jobreg-cli-{new_event_id()[:8]}"
    reg = Registry.connect(broker.bootstrap, NS, topic=topic)
    try:
        term = reg.claim_leadership("jm-1")
        term.submit("job-c", InlineGraph(b"g"))
        term.submit("job-d", InlineGraph(b"g"))
        term.checkpoint_triggered("job-c", 1)
        done = term.checkpoint_completed("job-c", 1, location="file:///cp/1")
        stamp = next(d.timestamp for d in reg.timeline("job-c") if d.offset == done.offset)
    finally:
        reg.close()
    marks = {"bootstrap": broker.bootstrap, "topic": topic}
    by_id = {j["job_id"]: j for j in as_json(marks, "jobs")["jobs"]}
    c, d = by_id["job-c"], by_id["job-d"]
    assert c["last_completed_checkpoint"] == 1 and c["checkpoint_state_at"] == stamp
    assert c["checkpoint_state_time"].endswith("Z")
    assert (d["last_completed_checkpoint"], d["checkpoint_state_at"]) == (None, None)
    code, out, _ = cli(marks, "jobs")
    assert code == 0 and "last checkpoint" in out and "checkpoint state at" in out
    row = next(line for line in out.splitlines() if line.startswith("job-c"))
    assert " 1 " in row and c["checkpoint_state_time"] in row


def test_terms_timeline_explain(incident) -> None:
    doc = as_json(incident, "terms")
    assert [(t["epoch"], t["leader"], t["rejected"]) for t in doc["terms"]] == [
        (1, "jm-1", 1), (2, "jm-2", 0), (3, "jm-3", 0)]
    assert set(doc["terms"][0]) == {"epoch", "leader", "started", "ended", "first_offset",
                                    "last_offset", "accepted", "rejected", "lease_ms", "end",
                                    "end_offset", "next_epoch", "started_at", "started_time",
                                    "ended_at", "ended_time", "duration_ms"}
    # The end, structured (issue 15 item 8), next to the text for people.
    first, last = doc["terms"][0], doc["terms"][-1]
    assert (first["end"], first["next_epoch"]) == ("superseded", 2)
    assert first["end_offset"] == doc["terms"][1]["first_offset"] == incident["grant2"]
    assert (last["end"], last["end_offset"], last["next_epoch"]) == ("current", None, None)
    code, out, _ = cli(incident, "terms")
    assert code == 0 and "superseded by epoch 2" in out

    doc = as_json(incident, "timeline", "job-a")
    steps = [(r["offset"], r["event_type"], r["outcome"], r["reason"]) for r in doc["records"]]
    assert (incident["late"], "JobLockReleased", "REJECTED", "stale_epoch") in steps
    first = doc["records"][0]
    assert first["time"].endswith("Z") and first["accepted"] is True
    assert {"offset", "outcome", "timestamp", "key", "event_type", "event_id", "job_id",
            "epoch", "writer", "reason", "detail", "expected_epoch", "actual_epoch", "leader",
            "time", "accepted"} == set(first)
    # The reason given to cancel() is in the timeline (issue 15 item 7), as the detail of
    # the accepted record that decided it.
    cancel = next(r for r in doc["records"] if r["event_type"] == "JobCancelled")
    assert (cancel["outcome"], cancel["detail"]) == ("ACCEPTED", "reason: user cancel")
    code, out, _ = cli(incident, "timeline", "job-a")
    assert code == 0 and "stale_epoch" in out and "JobCancelled" in out
    assert "ACCEPTED  user cancel" in out  # under reason (issue 29)

    doc = as_json(incident, "explain", "job-a")
    assert doc["job"]["status"] == "CANCELLED"
    assert f"Refused at offset {incident['late']}" in doc["explanation"]
    code, out, _ = cli(incident, "explain", "job-a")
    assert code == 0 and out.startswith("job 'job-a' is CANCELLED")


def test_rejected_quarantine_state(incident) -> None:
    doc = as_json(incident, "rejected")
    assert [(r["offset"], r["writer"], r["reason"]) for r in doc["records"]] == [
        (incident["late"], "jm-1", "stale_epoch")]
    doc = as_json(incident, "quarantine")
    assert [r["offset"] for r in doc["records"]] == [incident["corrupt"]]
    assert "QUARANTINED" in doc["records"][0]["outcome"]
    code, out, _ = cli(incident, "quarantine")
    assert code == 0 and str(incident["corrupt"]) in out

    before = as_json(incident, "state", "--offset", str(incident["adopted"] - 1), "--all")
    after = as_json(incident, "state", "--offset", str(incident["adopted"]), "--all")
    owner = {d: {j["job_id"]: j["owner_epoch"] for j in s["jobs"]}
             for d, s in (("before", before), ("after", after))}
    assert owner["before"]["job-a"] == 1 and owner["after"]["job-a"] == 2
    assert after["last_offset"] == incident["adopted"] and after["epoch"] == 2
    assert after["at"] == {"offset": incident["adopted"], "time": None}
    empty = as_json(incident, "state", "--offset", "-1")
    assert empty["epoch"] == 0 and empty["jobs"] == [] and empty["leader"] is None
    # by time: an ISO time long ago, and ms far ahead
    assert as_json(incident, "state", "--time", "2001-01-01T00:00:00Z")["last_offset"] == -1
    ahead = as_json(incident, "state", "--time", str(10**13))
    assert ahead["last_offset"] == as_json(incident, "jobs")["last_offset"]
    code, out, _ = cli(incident, "state", "--offset", str(incident["adopted"]))
    assert code == 0 and f"after offset {incident['adopted']}" in out and "epoch 2, jm-2" in out
    # An offset that holds no record (a transaction marker's, a compacted record's; here one
    # past the end): it says which record the state is after (issue 15 item 9).
    past = incident["corrupt"] + 3
    code, out, _ = cli(incident, "state", "--offset", str(past))
    assert code == 0 and f"after offset {incident['corrupt']} (the last record at or before " \
        f"{past}; offsets are not dense" in out


def test_terms_show_when_each_term_started_and_ended_by_its_records_times(incident) -> None:
    """Issue 35 part 4: a term starts at its grant's record time and ends at the revoke's or
    the next grant's, as the broker stamped those records (the timeline shows the same
    stamps), and lasts the difference."""
    terms = as_json(incident, "terms")["terms"]
    reg = Registry.connect(incident["bootstrap"], NS, topic=incident["topic"])
    try:
        stamps = {d.offset: d.timestamp for d in reg.forensics().decisions()}
    finally:
        reg.close()
    for t, nxt in zip(terms, [*terms[1:], None], strict=True):
        assert t["started_at"] == stamps[t["first_offset"]] is not None
        assert t["started_time"].endswith("Z")
        if nxt is None:
            assert (t["ended_at"], t["ended_time"], t["duration_ms"]) == (None, None, None)
        else:
            assert t["ended_at"] == stamps[t["end_offset"]] == nxt["started_at"]
            assert t["duration_ms"] == t["ended_at"] - t["started_at"] >= 0
    code, out, _ = cli(incident, "terms")
    head, _, *rows = out.splitlines()
    assert "from (UTC)" in head and "until (UTC)" in head and "duration" in head
    assert terms[0]["started_time"] in rows[0] and terms[0]["ended_time"] in rows[0]
    assert "unknown" not in out


def test_terms_from_records_without_a_time_say_unknown(incident, tmp_path) -> None:
    """A dump whose records carry no time (the dump format allows it; a source that gives
    none) shows "unknown", never a time."""
    from registry.dumpfile import DumpReader, write_dump

    stamped, bare = tmp_path / "stamped.avro", tmp_path / "bare.avro"
    assert cli(incident, "dump", str(stamped))[0] == 0
    reader = DumpReader(stamped)
    meta = {k: v for k, v in reader.metadata.items() if k.startswith("jobreg.")
            and k != "jobreg.format"}
    with open(bare, "wb") as f:
        write_dump(f, meta, ({"partition": r.partition, "offset": r.offset, "timestamp": None,
                              "key": r.key, "value": r.value} for r in reader.records()))
    result = CliRunner().invoke(main, ["--json", "--from-file", str(bare), "terms"],
                                catch_exceptions=False)
    terms = json.loads(result.stdout)["terms"]
    assert [(t["started_at"], t["ended_at"], t["duration_ms"]) for t in terms] == \
        [(None, None, None)] * 3
    result = CliRunner().invoke(main, ["--from-file", str(bare), "terms"])
    rows = result.stdout.splitlines()[2:]
    assert result.exit_code == 0 and len(rows) == 3
    assert [r.split().count("unknown") for r in rows] == [3, 3, 1]  # the last is current


def test_dump_then_every_command_from_the_file_with_no_broker(incident, tmp_path) -> None:
    path = str(tmp_path / "incident.avro")
    code, out, _ = cli(incident, "dump", path)
    assert code == 0 and "records of namespace 'cli-000'" in out
    assert "commit markers and other namespaces' records take offsets too" in out
    doc = as_json(incident, "dump", str(tmp_path / "again.avro"))
    assert doc["first_offset"] <= doc["last_offset"] and doc["records"] <= \
        doc["last_offset"] - doc["first_offset"] + 1
    live = {cmd: as_json(incident, *cmd.split()) for cmd in
            ("jobs --all", "leader", "terms", "timeline job-a", "rejected", "quarantine")}
    runner = CliRunner()
    for cmd, expected in live.items():
        # no --bootstrap at all: the file answers alone
        result = runner.invoke(main, ["--json", "--from-file", path, *cmd.split()],
                               env={"JOBREG_BOOTSTRAP": None})
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == expected, cmd
    result = runner.invoke(main, ["--from-file", path, "--namespace", "other", "jobs"])
    assert result.exit_code == 2 and "holds namespace 'cli-000'" in result.stderr


def test_the_real_entry_point_with_environment_variables(incident, tmp_path) -> None:
    env = {**os.environ, "JOBREG_BOOTSTRAP": incident["bootstrap"],
           "JOBREG_TOPIC": incident["topic"], "JOBREG_NAMESPACE": NS}
    result = subprocess.run([*JOBREG, "--json", "rejected"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["records"][0]["reason"] == "stale_epoch"
    assert result.stderr == ""  # piped: no progress bar
    result = subprocess.run([*JOBREG, "timeline", "job-never"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == EXIT_NOT_FOUND and "no record mentions job" in result.stdout


def test_exit_codes_for_bad_input(incident) -> None:
    assert cli(incident, "explain", "no-such-job")[0] == EXIT_NOT_FOUND
    for args in (["timeline", "bad id!"], ["state"], ["state", "--offset", "1", "--time", "1"],
                 ["state", "--time", "yesterday"], ["state", "--offset", "-5"],
                 ["report"], ["jobs", "--bogus"], ["report", "--out", "x.html",
                                                   "--since", "2030-01-01",
                                                   "--until", "2020-01-01"]):
        code, _, err = cli(incident, *args)
        assert code == 2, (args, err)
        assert "Usage" in err or "Error" in err
    runner = CliRunner()
    result = runner.invoke(main, ["--namespace", "no/slash", "jobs"])
    assert result.exit_code == 2 and "namespace" in result.stderr
    result = runner.invoke(main, ["jobs"], env={"JOBREG_BOOTSTRAP": None})
    assert result.exit_code == 2 and "--bootstrap" in result.stderr
    code, _, err = cli(incident, "--topic", "no-such-topic", "jobs")
    assert code == 1 and "does not exist" in err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_port_fails_at_once_not_after_the_timeout() -> None:
    """Issue 15 item 3: with a timeout of an hour, the answer comes at once (the run's own
    60 s limit would fail the test otherwise)."""
    port = _closed_port()
    result = subprocess.run([*JOBREG, "--bootstrap", f"127.0.0.1:{port}", "--timeout", "3600",
                             "jobs"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert _one_line(result.stderr) == (f"Error: no Kafka broker at 127.0.0.1:{port} "
                                        f"(127.0.0.1:{port}: connection refused)")


def test_a_long_replay_shows_progress_on_a_terminal_and_none_when_piped(broker) -> None:
    topic = f"jobreg-cli-long-{new_event_id()[:8]}"
    with Registry.connect(broker.bootstrap, "long", topic=topic) as reg:
        term = reg.claim_leadership("jm-1")
        term.submit_many([(f"job-{i}", b"g") for i in range(3000)])
        # and a zombie write, so the table has something to show
        write_raw(reg.bootstrap, topic, reg.partition, "long/job/job-1",
                  encode(JobSubmitted(event_id=new_event_id(), namespace="long", epoch=0,
                                      writer="zombie", created_at=0, job_id="job-1",
                                      graph=InlineGraph(b"g"))))
    args = [*JOBREG, "--bootstrap", broker.bootstrap, "--topic", topic, "--namespace", "long",
            "rejected"]
    piped = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
    primary, replica = pty.openpty()
    try:
        on_tty = subprocess.run(args, stdout=subprocess.PIPE, stderr=replica, timeout=120)
        os.close(replica)
        replica = -1
        seen = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(primary)
        if replica >= 0:
            os.close(replica)
    assert on_tty.returncode == 0
    assert b"replaying [" in seen and b"100%" in seen


def test_progress_bar_draws_only_past_its_threshold() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, threshold=10)
    bar(5, 0.1)
    assert stream.getvalue() == ""
    bar(50, 0.5)
    bar(100, None)
    bar(120, 1.0)
    text = stream.getvalue()
    assert "\r" in text and " 50%" in text and "100 records" in text and text.endswith("\n")


def test_report_writes_a_self_contained_page(incident, tmp_path) -> None:
    out = tmp_path / "incident.html"
    doc = as_json(incident, "report", "--out", str(out), "--job", "job-a")
    assert doc == {"format": "jobreg.report/1", "namespace": NS, "file": str(out)}
    page = out.read_text()
    assert "stale_epoch" in page and "job-a" in page and "https://" not in page
    code, _, err = cli(incident, "report", "--out", str(out), "--job", "job-never")
    assert code == EXIT_NOT_FOUND and "unknown job id" in err  # as timeline and explain


# -- issue 15 items 1-5: every error is one line, with the right exit code ------------------

def _one_line(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") <= 1, err
    return err.strip()


def test_a_mistyped_namespace_says_so_and_lists_the_namespaces_there(incident) -> None:
    runner = CliRunner()
    for command in (["jobs"], ["leader"], ["terms"], ["rejected"]):
        result = runner.invoke(main, ["--bootstrap", incident["bootstrap"], "--topic",
                                      incident["topic"], "--namespace", "cli-00O", *command])
        assert result.exit_code == EXIT_NOT_FOUND, command
        assert _one_line(result.stderr) == (
            f"Error: namespace 'cli-00O' has no records on topic '{incident['topic']}' "
            f"(namespaces with records there: {NS})")
    # At an offset before any record the namespace may well be empty: no error there.
    assert cli(incident, "state", "--offset", "-1")[0] == 0


@pytest.mark.parametrize("bootstrap", ["foo", "", "foo:", ":9092", "foo:99999", "a b:1",
                                       "127.0.0.1:1,bar"])
def test_a_malformed_bootstrap_is_refused_at_once(bootstrap: str) -> None:
    result = CliRunner().invoke(main, ["--bootstrap", bootstrap, "jobs"])
    assert result.exit_code == 2
    assert "is not HOST:PORT" in result.stderr and "Traceback" not in result.stderr


def test_unwritable_outputs_and_unreadable_dumps_are_one_line(incident, tmp_path) -> None:
    missing = tmp_path / "no-such-dir"
    for args, what, path in ((["dump", str(missing / "x.avro")], "dump", missing / "x.avro"),
                             (["report", "--out", str(missing / "x.html")], "report",
                              missing / "x.html")):
        code, _, err = cli(incident, *args)
        assert code == 1
        assert _one_line(err) == (f"Error: cannot write {what} {str(path)!r}: "
                                  "No such file or directory")
    not_a_dump = tmp_path / "x.avro"
    not_a_dump.write_bytes(b"\x00" * 10)
    result = CliRunner().invoke(main, ["--from-file", str(not_a_dump), "jobs"])
    assert result.exit_code == 1 and _one_line(result.stderr) == (
        f"Error: {not_a_dump}: not a jobreg dump (not an Avro object container file)")
    result = CliRunner().invoke(main, ["--from-file", str(tmp_path / "absent.avro"), "jobs"])
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_garbage_is_not_taken_for_a_newer_jobreg(incident) -> None:
    """The incident's corrupt record (zero magic byte, schema id 7, bytes that are no Avro)
    and a frame with an id no jobreg writes are quarantined as what they are."""
    bad = write_raw(incident["bootstrap"], incident["topic"], incident["reg"].partition,
                    f"{NS}/job/job-y", b"\x00\x63\x63\x63\x63 garbage")
    doc = as_json(incident, "quarantine")
    by_offset = {r["offset"]: r["detail"] for r in doc["records"]}
    assert by_offset[bad].startswith("not a jobreg record: schema id 1667457891")
    assert "newer jobreg" not in by_offset[bad]
