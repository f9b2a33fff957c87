"""The audit projection and its exactly-once writer, without Spark: incidents 000 and 002 into
SQLite and PostgreSQL, `check` against the library's fold, crashes before the commit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.crashing import crashing_env
from support.incidents import incident_000, incident_002
from support.pg import query_as_reader as query

from registry.audit.db import migrate
from registry.audit.writer import AuditWriter, check, run_plain
from registry.codec import encode
from registry.events import InlineGraph, JobSubmitted, new_event_id
from registry.keys import job_key
from registry.log import write_raw

pytestmark = pytest.mark.integration




def _write_all(url: str, reg) -> AuditWriter:
    writer = AuditWriter(url, reg.topic)
    writer.require_schema()
    writer.catch_up(reg.bootstrap)
    run_plain(writer, reg.bootstrap)
    return writer


def test_incidents_land_in_the_views_and_check_passes(connect, db_url) -> None:
    marks = incident_000(lambda: connect("ns-000"))
    incident_002(connect)
    reg = marks["reg"]
    write_raw(reg.bootstrap, reg.topic, reg.partition, "ns-000/job/job-z", b"\x00garbage")
    writer = _write_all(db_url, reg)
    try:
        assert writer.rows > 0
        assert check(db_url, reg.bootstrap, reg.topic) == []
        cols, rows = query(db_url, "SELECT namespace, job_id, writer, reason FROM "
                                   "refused_writes ORDER BY namespace")
        assert rows == [("ns-000", "job-a", "jm-1", "stale_epoch"),
                        ("ns-002", "job-x", "jm-old", "stale_epoch")]
        assert query(db_url, "SELECT * FROM resurrections")[1] == []
        _, q = query(db_url, "SELECT namespace, reason FROM audit_quarantine")
        assert q == [("ns-000", "undecodable")]
        _, jobs = query(db_url, "SELECT namespace, job_id, status, owner_epoch, dirty, "
                                "graph_kind, graph_uri, held_checkpoints FROM audit_jobs "
                                "ORDER BY namespace, job_id")
        # job-a's result is dirty: its cleanup is not done, its graph still held
        assert [tuple(j) for j in jobs] == [
            ("ns-000", "job-a", "CANCELLED", None, True, "inline", None, 0),
            ("ns-000", "job-b", "ACTIVE", 1, False, "inline", None, 0),
            ("ns-002", "job-x", "ACTIVE", 2, False, "inline", None, 0)]
        _, terms = query(db_url, "SELECT namespace, epoch, leader, rejected_writes FROM "
                                 "audit_terms ORDER BY namespace, epoch")
        assert terms == [("ns-000", 1, "jm-1", 1), ("ns-000", 2, "jm-2", 0),
                         ("ns-000", 3, "jm-3", 0), ("ns-002", 1, "jm-old", 1),
                         ("ns-002", 2, "jm-new", 0)]
        # written again from the start: the progress cuts everything off
        again = AuditWriter(db_url, reg.topic)
        again.catch_up(reg.bootstrap)
        assert run_plain(again, reg.bootstrap) == 0
        again.close()
        # more records later: only they are added, and the check still passes
        t = connect("ns-000").claim_leadership("jm-4")
        t.submit("job-c", b"c")
        t.mark_clean("job-a")  # the new leader cleaned up what job-a left
        more = AuditWriter(db_url, reg.topic)
        more.catch_up(reg.bootstrap)
        assert run_plain(more, reg.bootstrap) >= 3
        more.close()
        assert check(db_url, reg.bootstrap, reg.topic) == []
        _, job_a = query(db_url, "SELECT status, reason, dirty, graph_kind, graph_uri, "
                                 "held_checkpoints FROM audit_jobs WHERE job_id = 'job-a'")
        assert [tuple(r) for r in job_a] == [("CANCELLED", "user cancel", False, None, None, 0)]
        _, cleaned = query(db_url, "SELECT event_type, outcome, job_status FROM job_history "
                                   "WHERE job_id = 'job-a' ORDER BY \"offset\" DESC LIMIT 1")
        assert [tuple(r) for r in cleaned] == [("JobCleanedUp", "ACCEPTED", "CANCELLED")]
    finally:
        writer.close()


def test_check_finds_a_missing_and_a_changed_row(connect, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    migrate(url)
    marks = incident_000(lambda: connect("ns-000"))
    writer = _write_all(url, marks["reg"])
    with writer.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE audit_records SET outcome = 'ACCEPTED', accepted = 1, "
                             "reason = NULL WHERE outcome = 'REJECTED'")
        conn.exec_driver_sql("DELETE FROM audit_records WHERE offset = 0")
        conn.exec_driver_sql("UPDATE audit_jobs SET status = 'ACTIVE' WHERE job_id = 'job-a'")
        conn.exec_driver_sql("UPDATE audit_jobs SET dirty = 1, held_checkpoints = 3 "
                             "WHERE job_id = 'job-b'")
    writer.close()
    diffs = check(url, marks["reg"].bootstrap, marks["reg"].topic)
    text = "\n".join(diffs)
    assert "records have no row (first offsets [0])" in text
    assert f"offset {marks['late']}: outcome 'ACCEPTED' != 'REJECTED'" in text
    assert "job 'job-a': status 'ACTIVE' != 'CANCELLED'" in text
    assert "job 'job-b': dirty True != False, held_checkpoints 3 != 0" in text
    # a row written before migration 0004 has no holdings: not a difference
    with AuditWriter(url, marks["reg"].topic).engine.begin() as conn:
        conn.exec_driver_sql("UPDATE audit_jobs SET dirty = 0, held_checkpoints = NULL, "
                             "graph_uri = NULL WHERE job_id = 'job-b'")
    diffs = check(url, marks["reg"].bootstrap, marks["reg"].topic)
    assert not any("job-b" in d for d in diffs), diffs


def test_a_result_shows_what_it_holds_until_its_cleanup(connect, db_url) -> None:
    """A job with a blob graph and two retained checkpoints: live, its holdings show; cancelled,
    its result is dirty and holds them; after the cleanup (JobCleanedUp) it is clean and holds
    nothing; a second JobCleanedUp changes nothing. The job's every record is in job_history."""
    reg = connect("ns-res", inline_limit=16)
    term = reg.claim_leadership("jm-1")
    term.submit("job-r", b"a graph too large to be inline" * 4, retained_checkpoints=2)
    for cp in (1, 2, 3):
        term.checkpoint_triggered("job-r", cp)
        term.checkpoint_completed("job-r", cp, f"file:///cp/job-r/{cp}")
    term.submit("job-s", b"s")
    uri = reg.job("job-r").graph.uri
    writer = _write_all(db_url, reg)
    rows = "SELECT job_id, status, dirty, graph_kind, graph_uri, held_checkpoints " \
           "FROM audit_jobs WHERE namespace = 'ns-res' ORDER BY job_id"
    try:
        assert [tuple(r) for r in query(db_url, rows)[1]] == [
            ("job-r", "ACTIVE", False, "blob", uri, 2), ("job-s", "ACTIVE", False, "inline",
                                                         None, 0)]
        term.cancel("job-r", "done with it")
        term.terminate("job-s", "FINISHED")
        run_plain(writer, reg.bootstrap)
        assert check(db_url, reg.bootstrap, reg.topic) == []
        assert [tuple(r) for r in query(db_url, rows)[1]] == [
            ("job-r", "CANCELLED", True, "blob", uri, 2),
            ("job-s", "FINISHED", True, "inline", None, 0)]
        _, owed = query(db_url, "SELECT job_id FROM audit_jobs WHERE dirty ORDER BY job_id")
        assert owed == [("job-r",), ("job-s",)]
        term.mark_clean("job-r")
        run_plain(writer, reg.bootstrap)
        assert [tuple(r) for r in query(db_url, rows)[1]] == [
            ("job-r", "CANCELLED", False, None, None, 0),
            ("job-s", "FINISHED", True, "inline", None, 0)]
        term.mark_clean("job-r")  # again: accepted, changes nothing
        run_plain(writer, reg.bootstrap)
        assert [tuple(r) for r in query(db_url, rows)[1]][0] == (
            "job-r", "CANCELLED", False, None, None, 0)
        assert check(db_url, reg.bootstrap, reg.topic) == []
        _, history = query(db_url, "SELECT event_type, outcome, job_status FROM job_history "
                                   "WHERE namespace = 'ns-res' AND job_id = 'job-r' "
                                   "AND event_type NOT LIKE 'Checkpoint%'")
        assert [tuple(h) for h in history] == [
            ("JobSubmitted", "ACCEPTED", "ACTIVE"), ("JobCancelled", "ACCEPTED", "CANCELLED"),
            ("JobCleanedUp", "ACCEPTED", "CANCELLED"), ("JobCleanedUp", "ACCEPTED", "CANCELLED")]
        assert query(db_url, "SELECT * FROM resurrections")[1] == []  # cleanup is no resurrection
    finally:
        writer.close()


CRASHER = """
import sys
from registry.audit.writer import AuditWriter, run_plain
w = AuditWriter(sys.argv[1], sys.argv[2])
w.catch_up(sys.argv[3])
run_plain(w, sys.argv[3])
print("finished", w.rows)
"""


def test_a_crash_before_the_commit_leaves_every_row_exactly_once(connect, db_url) -> None:
    reg = connect("crash")
    term = reg.claim_leadership("jm-1")
    for start in range(0, 12_000, 1000):
        term.submit_many([(f"job-{i}", b"g") for i in range(start, start + 1000)])
    write_raw(reg.bootstrap, reg.topic, reg.partition, job_key("crash", "job-1"),
              encode(JobSubmitted(event_id=new_event_id(), namespace="crash", epoch=0,
                                  writer="zombie", created_at=0, job_id="job-1",
                                  graph=InlineGraph(b"z"))))
    total = reg.sync().provenance.last_offset + 1 - _gaps(reg)
    args = [sys.executable, "-c", CRASHER, db_url, reg.topic, reg.bootstrap]
    env = crashing_env(7000)  # plain batches are at most 5,000 records
    killed = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert killed.returncode == -9, killed.stderr  # SIGKILL inside a batch, rows written
    _, [(kept,)] = query(db_url, "SELECT count(*) FROM audit_records")
    assert 0 < kept < 7000  # the committed batches only, nothing of the one that died
    assert check(db_url, reg.bootstrap, reg.topic) == []  # consistent up to its progress
    finished = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert check(db_url, reg.bootstrap, reg.topic) == []
    _, rows = query(db_url, "SELECT count(*), count(DISTINCT \"offset\") FROM audit_records")
    assert rows[0][0] == rows[0][1] == total
    assert query(db_url, "SELECT count(*) FROM refused_writes")[1] == [(1,)]


def _gaps(reg) -> int:
    """Offsets of the partition that hold no record (transaction markers)."""
    from registry.log import LogReader

    reader = LogReader(reg.bootstrap, reg.topic, reg.partition)
    n = sum(len(b) for b in reader.sync(30))
    reader.close()
    return reg.sync().provenance.last_offset + 1 - n


def test_a_database_ahead_of_the_log_is_refused(connect, tmp_path) -> None:
    """A database written from another (or a since wiped) topic must not swallow this log."""
    from registry.audit.db import AuditError

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    migrate(url)
    reg = connect("ahead")
    reg.claim_leadership("jm-1").submit("job-1", b"g")
    _write_all(url, reg).close()
    with AuditWriter(url, reg.topic).engine.begin() as conn:
        conn.exec_driver_sql("UPDATE audit_progress SET next_offset = next_offset + 100")
    writer = AuditWriter(url, reg.topic)
    with pytest.raises(AuditError, match="but the log ends at"):
        writer.catch_up(reg.bootstrap)
    writer.close()


def test_a_failed_commit_stops_the_pipeline_and_nothing_behind_it_is_written(
        connect, tmp_path) -> None:
    from registry.audit.db import AuditError
    from registry.audit.writer import Pipeline
    from registry.log import LogReader

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    migrate(url)
    reg = connect("pipe")
    term = reg.claim_leadership("jm-1")
    for i in range(30):  # one record a call, so every batch of 10 has rows of its own
        term.submit(f"job-{i}", b"g")
    reader = LogReader(reg.bootstrap, reg.topic, reg.partition)
    records = [r for b in reader.sync(30) for r in b]
    reader.close()
    writer = AuditWriter(url, reg.topic)
    real_commit, calls = writer.commit, []

    def failing_commit(rows, batch_id):
        calls.append(batch_id)
        if batch_id == 1:
            raise AuditError("the database went away")
        return real_commit(rows, batch_id)

    writer.commit = failing_commit
    pipeline = Pipeline(writer)
    with pytest.raises(AuditError, match="went away"):
        for i in range(0, len(records), 10):
            pipeline.submit(records[i:i + 10], i // 10)
        pipeline.close()
    assert 1 in calls and all(c <= 1 for c in calls)  # nothing after the failed batch
    assert query(url, "SELECT count(*) FROM audit_records")[1] == [(10,)]
    writer.close()
    # a new writer catches up from the database and writes the rest exactly once
    again = AuditWriter(url, reg.topic)
    again.catch_up(reg.bootstrap)
    assert run_plain(again, reg.bootstrap) == len(records) - 10
    again.close()
    assert check(url, reg.bootstrap, reg.topic) == []


def test_a_refused_call_shows_in_the_views_and_a_call_open_at_the_progress_lands_once(
        connect, db_url) -> None:
    from registry.events import as_call
    from registry.keys import record_key

    reg = connect("ns-calls")
    term = reg.claim_leadership("jm-1")
    term.submit("known", b"k")
    with pytest.raises(Exception, match="already exists"):
        term.submit_many([("a", b"a"), ("known", b"x"), ("c", b"c")])
    # A call whose records land before a run and whose commit lands after it.
    env = dict(namespace="ns-calls", epoch=1, writer="jm-1", created_at=0)
    records = as_call([JobSubmitted(event_id=new_event_id(), job_id=j, graph=InlineGraph(b"g"),
                                    **env) for j in ("d", "e")])
    for e in records[:-1]:
        write_raw(reg.bootstrap, reg.topic, reg.partition, record_key(e), encode(e))
    writer = _write_all(db_url, reg)
    try:
        assert check(db_url, reg.bootstrap, reg.topic) == []
        _, rows = query(db_url, "SELECT job_id, reason FROM refused_writes "
                                "WHERE namespace = 'ns-calls' ORDER BY \"offset\"")
        assert rows == [("a", "call_aborted"), ("known", "job_exists"), ("c", "call_aborted"),
                        (None, "call_aborted")]
        _, detail = query(db_url, "SELECT detail FROM audit_records WHERE job_id = 'a'")
        assert "job_exists" in detail[0][0]
        _, waiting = query(db_url, "SELECT count(*) FROM audit_records WHERE job_id IN ('d','e')")
        assert waiting == [(0,)]
    finally:
        writer.close()
    e = records[-1]
    write_raw(reg.bootstrap, reg.topic, reg.partition, record_key(e), encode(e))
    more = AuditWriter(db_url, reg.topic)
    try:
        more.catch_up(reg.bootstrap)
        run_plain(more, reg.bootstrap)
        assert check(db_url, reg.bootstrap, reg.topic) == []
        _, landed = query(db_url, "SELECT job_id, outcome FROM audit_records "
                                  "WHERE job_id IN ('d','e') ORDER BY job_id")
        assert landed == [("d", "ACCEPTED"), ("e", "ACCEPTED")]
        _, jobs = query(db_url, "SELECT job_id FROM audit_jobs WHERE namespace = 'ns-calls' "
                                "ORDER BY job_id")
        assert jobs == [("d",), ("e",), ("known",)]
    finally:
        more.close()


@pytest.mark.parametrize("damage", [b"\x00\x11 not json", b'{"format":"jobreg-audit-state/9"}\n',
                                    None], ids=["damaged", "unknown-format", "missing"])
def test_a_stored_state_that_cannot_be_read_is_refolded_from_the_log(connect, db_url,
                                                                      damage) -> None:
    """A namespace's row in ``audit_snapshots`` that cannot be read (damaged, or written in a
    format this version does not know) or is gone while the database holds records of the
    namespace is refolded from the log up to the partition's progress by the next batch
    that needs it: the verdicts stay the fold's (a write of the
    old leader is still refused, which a fold from nothing would accept), and the batch
    writes the snapshots again. Without a broker to refold from, the batch stops with a
    one-line error naming the namespace, and nothing of it is written."""
    from sqlalchemy import text

    from registry.audit.db import AuditError
    from registry.audit.projection import decode_state
    from registry.log import LogReader

    reg = connect("snap")
    reg.claim_leadership("jm-1").submit("job-1", b"g")
    reg.claim_leadership("jm-2").submit("job-2", b"g")
    _write_all(db_url, reg).close()

    def damage_it() -> None:
        with AuditWriter(db_url, reg.topic).engine.begin() as conn:
            if damage is None:  # deleted by hand: the namespace is not new, its state is gone
                conn.execute(text("DELETE FROM audit_snapshots WHERE namespace = 'snap'"))
            else:
                conn.execute(text("UPDATE audit_snapshots SET state = :s "
                                  "WHERE namespace = 'snap'"), {"s": damage})

    def stale_write(job_id: str) -> None:  # the old leader, epoch 1, after epoch 2 began
        write_raw(reg.bootstrap, reg.topic, reg.partition, job_key("snap", job_id),
                  encode(JobSubmitted(event_id=new_event_id(), namespace="snap", epoch=1,
                                      writer="jm-1", created_at=0, job_id=job_id,
                                      graph=InlineGraph(b"z"))))

    # without a broker: a one-line error, nothing written
    damage_it()
    stale_write("late-1")
    _, [(before,)] = query(db_url, "SELECT count(*) FROM audit_records")
    offline = AuditWriter(db_url, reg.topic)
    offline.partition_writer()  # begins the run from what the database holds, no broker
    start = offline.next_offsets[reg.partition]
    reader = LogReader(reg.bootstrap, reg.topic, reg.partition, start_offset=start)
    tail = [r for batch in reader.read_to_end(30) for r in batch]
    reader.close()
    with pytest.raises(AuditError) as refused:
        offline.commit(tail, 0)
    offline.close()
    message = str(refused.value)
    assert "the stored state of namespace 'snap' cannot be read" in message
    assert "no broker is at hand" in message and "\n" not in message
    assert query(db_url, "SELECT count(*) FROM audit_records")[1] == [(before,)]
    # with the broker: refolded, the old leader's writes refused, the snapshot readable again
    stale_write("late-2")
    _write_all(db_url, reg).close()
    assert check(db_url, reg.bootstrap, reg.topic) == []
    _, refused_rows = query(db_url, "SELECT job_id, reason FROM refused_writes "
                                    "WHERE namespace = 'snap' ORDER BY job_id")
    assert [tuple(r) for r in refused_rows] == [("late-1", "stale_epoch"),
                                                ("late-2", "stale_epoch")]
    _, [(state,)] = query(db_url, "SELECT state FROM audit_snapshots WHERE namespace = 'snap'")
    head, image = decode_state(bytes(state))
    assert head["format"] == "jobreg-audit-state/1" and set(image.jobs) == {"job-1", "job-2"}
