"""The audit database: migration 0001 against the models, the views, the read-only query path.

Every schema test runs on SQLite (a file in the test's tmp dir) and on PostgreSQL (a
database of its own on the session's throwaway cluster, ``tests/support/pg.py``). Rows are
crafted by hand: the views are checked on exactly the histories they must recognise.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.exc import IntegrityError
from support.pg import READER_LOGIN, reader_of

from registry.audit import VIEWS, AuditError, Base, db
from registry.audit.db import (
    READER_ROLE,
    alembic_config,
    current_revision,
    downgrade,
    engine_for,
    migrate,
    query,
)
from registry.audit.models import (
    OUTCOMES,
    TABLES,
    TERMINAL_STATUSES,
    AuditJob,
    AuditRecord,
    AuditTerm,
)
from registry.errors import RegistryError
from registry.events import JobStatus
from registry.image import Outcome

HEAD = "0006"


# --------------------------------------------------------------------------- fixtures, helpers


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a SQLite file, or a PostgreSQL database of this test's own."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return str(request.getfixturevalue("pg_db"))


@pytest.fixture
def audit(db_url: str) -> Iterator[tuple[str, sa.Engine]]:
    """``(url, writable engine)`` of a database migrated to head; on PostgreSQL the url is a
    login that only reads (``query`` refuses the cluster's superuser)."""
    migrate(db_url)
    engine = engine_for(db_url)
    try:
        yield reader_of(db_url), engine
    finally:
        engine.dispose()


def rec(
    offset: int,
    event_type: str | None,
    outcome: str = Outcome.ACCEPTED,
    *,
    job_id: str | None = None,
    job_status: str | None = None,
    namespace: str | None = "prod",
    topic: str = "jobreg",
    partition: int = 0,
    **columns: Any,
) -> dict[str, Any]:
    """One ``audit_records`` row with every column set (defaults for what a test ignores)."""
    row: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "namespace": namespace,
        "key": f"{namespace}/job/{job_id}" if job_id else f"{namespace}/term/1/e{offset}",
        "event_id": f"e{offset}",
        "event_type": event_type,
        "job_id": job_id,
        "epoch": 1,
        "writer": "jm-1",
        "created_at": 1_000 + offset,
        "log_time": 2_000 + 10 * offset,
        "outcome": outcome,
        "accepted": outcome in (Outcome.ACCEPTED, Outcome.IGNORED),
        "reason": None,
        "detail": None,
        "expected_epoch": None,
        "actual_epoch": None,
        "leader": None,
        "job_status": job_status,
    }
    unknown = set(columns) - set(row)
    assert not unknown, unknown
    row.update(columns)
    return row


def insert(engine: sa.Engine, model: type[Base], rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        conn.execute(sa.insert(model.__table__), rows)


def select(url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Rows of a query as dicts (read with a plain engine: these tests are about the views
    and the migrations, not the read-only path, and run before revision 0005 too)."""
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            result = conn.execute(sa.text(sql), params)
            return [dict(row._mapping) for row in result]
    finally:
        engine.dispose()


def schema(engine: sa.Engine) -> tuple[set[str], set[str]]:
    """(tables, views) in the database."""
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        return set(inspector.get_table_names()), set(inspector.get_view_names())


def diff_against_models(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


A, C, F = JobStatus.ACTIVE, JobStatus.CANCELLED, JobStatus.FINISHED


def normal_history() -> list[dict[str, Any]]:
    """What a correct log looks like: job-a submitted, cancelled, refused, reasserted cancelled."""
    return [
        rec(0, "LeadershipGranted"),
        rec(1, "JobSubmitted", job_id="job-a", job_status=A),
        rec(2, "CheckpointTriggered", job_id="job-a", job_status=A),
        rec(3, "JobCancelled", job_id="job-a", job_status=C),
        rec(4, "JobAdopted", Outcome.REJECTED, job_id="job-a", job_status=C,
            reason="terminal_job"),
        rec(5, "JobSubmitted", Outcome.REJECTED, job_id="job-a", job_status=C,
            reason="terminal_job"),
        rec(6, "JobReasserted", job_id="job-a", job_status=C),
        rec(7, "JobSubmitted", job_id="job-b", job_status=A),
        rec(8, "JobTerminated", job_id="job-b", job_status=F),
        rec(9, "JobReasserted", job_id="job-b", job_status=F),
        # The same namespace and job id in another registry topic, or on another partition
        # (a topic whose partition count was changed): histories of their own.
        *(rec(offset, event_type, job_id="job-a", job_status=A, topic=topic, partition=partition)
          for topic, partition in (("jobreg", 1), ("jobreg-staging", 0))
          for offset, event_type in ((3, "JobSubmitted"), (4, "JobAdopted"))),
    ]


# --------------------------------------------------------------------------- migrations


def test_upgrade_matches_the_models_and_downgrade_removes_everything(db_url: str) -> None:
    migrate(db_url)
    engine = engine_for(db_url)
    try:
        assert current_revision(db_url) == HEAD
        tables, views = schema(engine)
        assert tables == {*TABLES, "alembic_version"}
        assert views == set(VIEWS)
        assert diff_against_models(engine) == []

        downgrade(db_url)
        assert current_revision(db_url) is None
        assert schema(engine) == ({"alembic_version"}, set())  # only Alembic's bookkeeping

        migrate(db_url)  # and again, from base
        assert current_revision(db_url) == HEAD
        assert schema(engine) == ({*TABLES, "alembic_version"}, set(VIEWS))
        assert diff_against_models(engine) == []
        migrate(db_url)  # at head already: nothing to do
        assert current_revision(db_url) == HEAD
    finally:
        engine.dispose()


def _columns(engine: sa.Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return {c["name"] for c in sa.inspect(conn).get_columns(table)}


def test_each_revision_upgrades_and_downgrades_with_the_rows_it_finds(db_url: str) -> None:
    """Step by step: a job row written at 0002 reads as a clean result with no holdings
    recorded after 0003 and 0004; each downgrade removes only its own columns and keeps
    the row."""
    result = {"dirty", "graph_uri", "held_checkpoints"}
    migrate(db_url, "0002")
    engine = engine_for(db_url)
    try:
        assert current_revision(db_url) == "0002"
        assert not result & _columns(engine, "audit_jobs")
        with engine.begin() as conn:  # the row a 0002 writer wrote: no such columns yet
            conn.exec_driver_sql(
                "INSERT INTO audit_jobs (namespace, job_id, status, max_checkpoint_failures, "
                "retained_checkpoints, consecutive_failures, graph_kind, last_offset, reason) "
                "VALUES ('prod', 'old', 'CANCELLED', 0, 1, 0, NULL, 7, 'user cancel')")
        migrate(db_url, "0003")
        assert current_revision(db_url) == "0003"
        assert select(db_url, "SELECT job_id, dirty FROM audit_jobs") == [
            {"job_id": "old", "dirty": False}]
        migrate(db_url)
        assert current_revision(db_url) == HEAD
        assert diff_against_models(engine) == []
        rows = select(db_url, "SELECT job_id, status, reason, dirty, graph_uri, "
                              "held_checkpoints FROM audit_jobs")
        assert rows == [{"job_id": "old", "status": C, "reason": "user cancel", "dirty": False,
                         "graph_uri": None, "held_checkpoints": None}]
        # a row written at head, then every revision undone in turn
        insert(engine, AuditJob, [{
            "namespace": "prod", "job_id": "new", "status": C, "max_checkpoint_failures": 0,
            "retained_checkpoints": 2, "consecutive_failures": 0, "graph_kind": "blob",
            "last_offset": 9, "reason": None, "dirty": True,
            "graph_uri": "file:///blobs/prod/ab12", "held_checkpoints": 2}])
        assert select(db_url, "SELECT job_id FROM audit_jobs WHERE dirty ORDER BY job_id") == [
            {"job_id": "new"}]
        downgrade(db_url, "0003")
        assert current_revision(db_url) == "0003"
        assert result & _columns(engine, "audit_jobs") == {"dirty"}
        downgrade(db_url, "0002")
        assert not result & _columns(engine, "audit_jobs")
        assert "reason" in _columns(engine, "audit_jobs")
        assert select(db_url, "SELECT job_id FROM audit_jobs ORDER BY job_id") == [
            {"job_id": "new"}, {"job_id": "old"}]
        downgrade(db_url)
        assert current_revision(db_url) is None
        assert schema(engine) == ({"alembic_version"}, set())
    finally:
        engine.dispose()


def test_revision_0006_fences_old_progress_and_adds_the_snapshots(db_url: str) -> None:
    """A progress row written at 0005 reads generation 0 at 0006 (no snapshots yet: the next
    start adopts it); the downgrade drops the snapshots and the column and keeps the row."""
    migrate(db_url, "0005")
    engine = engine_for(db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                'INSERT INTO audit_progress (stream, topic, "partition", next_offset, '
                "batch_id, updated_at) VALUES ('audit', 'jobreg', 3, 42, 7, 1)")
        migrate(db_url)
        assert current_revision(db_url) == HEAD
        assert diff_against_models(engine) == []
        assert select(db_url, "SELECT next_offset, generation FROM audit_progress") == [
            {"next_offset": 42, "generation": 0}]
        with engine.begin() as conn:
            conn.exec_driver_sql(
                'INSERT INTO audit_snapshots (stream, topic, namespace, "partition", '
                "next_offset, state, updated_at) VALUES ('audit', 'jobreg', 'prod', 3, 42, "
                + ("'\\x00'" if engine.dialect.name == "postgresql" else "x'00'") + ", 1)")
        downgrade(db_url, "0005")
        assert current_revision(db_url) == "0005"
        assert "generation" not in _columns(engine, "audit_progress")
        assert "audit_snapshots" not in schema(engine)[0]
        assert select(db_url, "SELECT next_offset FROM audit_progress") == [{"next_offset": 42}]
    finally:
        engine.dispose()


def test_a_failed_migration_changes_nothing(db_url: str) -> None:
    """The whole upgrade is one transaction, on SQLite too: tables, views and version stamp."""
    engine = engine_for(db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE job_history (a INTEGER)")  # the view's name
        with pytest.raises(AuditError, match="refused the audit schema upgrade") as caught:
            migrate(db_url)
        assert "job_history" in str(caught.value)
        assert schema(engine) == ({"job_history"}, set())
        assert current_revision(db_url) is None
    finally:
        engine.dispose()


def test_the_schema_knows_exactly_the_codes_statuses_and_outcomes(
    audit: tuple[str, sa.Engine],
) -> None:
    """CHECK constraints (not compared by autogenerate) accept the code's values, refuse others."""
    _url, engine = audit
    # SKIPPED records are another namespace's; a PENDING one (a call's record before its
    # commit) gets its row once the fold decides it; a COLLECTED one is the leader's
    # tombstone of a checkpoint record no state stands on: none is ever stored.
    assert set(OUTCOMES) == {
        v for k, v in vars(Outcome).items()
        if k.isupper() and v not in (Outcome.SKIPPED, Outcome.PENDING, Outcome.COLLECTED)
    }
    assert set(TERMINAL_STATUSES) == JobStatus.TERMINAL
    insert(engine, AuditRecord,
           [rec(i, "JobSubmitted", outcome) for i, outcome in enumerate(OUTCOMES)])
    job = {"namespace": "prod", "max_checkpoint_failures": 0, "retained_checkpoints": 1,
           "consecutive_failures": 0, "graph_kind": "inline", "last_offset": 1}
    insert(engine, AuditJob,
           [{**job, "job_id": f"j-{s}", "status": s} for s in JobStatus.ALL])

    refused = [
        (AuditJob, {**job, "job_id": "j-x", "status": "ZOMBIE"}),
        (AuditJob, {**job, "job_id": "j-y", "status": A, "graph_kind": "tape"}),
        (AuditRecord, rec(100, "JobSubmitted", Outcome.SKIPPED)),
        (AuditRecord, rec(101, "JobSubmitted", Outcome.REJECTED, accepted=True)),
        (AuditRecord, rec(102, "JobSubmitted", job_id="j", job_status="ZOMBIE")),
    ]
    for model, row in refused:
        with pytest.raises(IntegrityError):
            insert(engine, model, [row])


def test_offline_mode_renders_the_migration_sql(capsys: pytest.CaptureFixture[str]) -> None:
    command.upgrade(alembic_config("postgresql://jobreg@127.0.0.1:1/none"), "head", sql=True)
    out = capsys.readouterr().out
    assert "CREATE TABLE audit_records" in out
    assert "CREATE VIEW resurrections" in out


def test_migrations_are_found() -> None:
    found = db.migrations_dir()
    assert (found / "env.py").is_file()
    assert (found / "versions" / "0001_audit_schema.py").is_file()


def test_migrations_are_found_past_a_package_without_a_spec(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # importlib.resources answers with a Traversable that is no path (a namespace package's)
    # while find_spec has no spec: the search goes on to the other places (mypy found the
    # spec's None was read before the generator's `if spec` could guard it).
    monkeypatch.setattr(db.importlib.resources, "files", lambda package: object())
    monkeypatch.setattr(db.importlib.util, "find_spec", lambda name: None)
    found = db.migrations_dir()
    assert (found / "versions" / "0001_audit_schema.py").is_file()


# --------------------------------------------------------------------------- views


def test_resurrections_is_empty_for_a_correct_history(audit: tuple[str, sa.Engine]) -> None:
    url, engine = audit
    insert(engine, AuditRecord, normal_history())
    assert select(url, "SELECT * FROM resurrections") == []


def test_resurrections_catches_a_terminal_job_accepted_as_live_again(
    audit: tuple[str, sa.Engine],
) -> None:
    url, engine = audit
    insert(engine, AuditRecord, [
        *normal_history(),
        # What the fold must never do: accept records that leave a terminal job live.
        rec(11, "JobReasserted", job_id="job-a", job_status=A, epoch=2, writer="jm-2"),
        rec(12, "CheckpointFailed", Outcome.IGNORED, job_id="job-b", job_status=A),
        # A refused record cannot resurrect anything, whatever it claims.
        rec(13, "JobSubmitted", Outcome.REJECTED, job_id="job-b", job_status=A),
    ])
    rows = select(url, 'SELECT * FROM resurrections ORDER BY "offset"')
    assert [(r["namespace"], r["job_id"], r["topic"], r["partition"], r["offset"]) for r in rows] \
        == [("prod", "job-a", "jobreg", 0, 11), ("prod", "job-b", "jobreg", 0, 12)]
    first = rows[0]
    assert (first["event_type"], first["job_status"], first["epoch"], first["writer"]) == (
        "JobReasserted", A, 2, "jm-2")
    assert (first["terminal_offset"], first["terminal_status"], first["terminal_event_type"]) == (
        3, C, "JobCancelled")
    assert (rows[1]["terminal_offset"], rows[1]["terminal_status"]) == (8, F)


def test_refused_writes(audit: tuple[str, sa.Engine]) -> None:
    url, engine = audit
    insert(engine, AuditRecord, [
        rec(0, "LeadershipGranted"),
        rec(1, "LeadershipGranted", epoch=2, writer="jm-2"),
        rec(2, "JobCancelled", Outcome.REJECTED, job_id="job-a", job_status=A,
            reason="stale_epoch", detail="expected epoch 2, actual 1: ...",
            expected_epoch=2, actual_epoch=1, leader="jm-2"),
        rec(3, "LeadershipGranted", Outcome.REJECTED, epoch=2, writer="jm-3",
            reason="cas_failed", expected_epoch=2, actual_epoch=2, leader="jm-2"),
        rec(4, "JobSubmitted", Outcome.DUPLICATE, job_id="job-a", job_status=A),
        rec(5, None, Outcome.QUARANTINED, namespace=None, reason="undecodable"),
        rec(6, "CheckpointFailed", Outcome.IGNORED, job_id="job-a", job_status=A,
            reason="checkpoint_discarded"),
    ])
    rows = select(url, 'SELECT * FROM refused_writes ORDER BY "offset"')
    assert {"offset", "log_time", "namespace", "event_type", "job_id", "writer", "epoch",
            "expected_epoch", "leader", "reason", "detail"} <= set(rows[0])
    assert [(r["offset"], r["event_type"], r["job_id"], r["writer"], r["epoch"],
             r["expected_epoch"], r["actual_epoch"], r["leader"], r["reason"]) for r in rows] == [
        (2, "JobCancelled", "job-a", "jm-1", 1, 2, 1, "jm-2", "stale_epoch"),
        (3, "LeadershipGranted", None, "jm-3", 2, 2, 2, "jm-2", "cas_failed"),
    ]
    assert rows[0]["detail"] == "expected epoch 2, actual 1: ..."
    assert rows[0]["log_time"] == 2_020


def test_leadership_terms(audit: tuple[str, sa.Engine]) -> None:
    url, engine = audit
    term = {"granted_offset": 0, "revoked_offset": None, "lease_ms": 5_000, "renewals": 3,
            "accepted_writes": 10, "rejected_writes": 1, "revoked_at": None}
    insert(engine, AuditTerm, [
        {**term, "namespace": "prod", "epoch": 1, "leader": "jm-1", "granted_at": 1_000},
        {**term, "namespace": "prod", "epoch": 2, "leader": "jm-2", "granted_at": 5_000,
         "granted_offset": 7, "revoked_offset": 9, "revoked_at": 7_000},
        {**term, "namespace": "prod", "epoch": 3, "leader": "jm-1", "granted_at": 9_000,
         "granted_offset": 12},
        {**term, "namespace": "test", "epoch": 1, "leader": "jm-9", "granted_at": 100},
    ])
    rows = select(url, "SELECT * FROM leadership_terms ORDER BY namespace, epoch")
    assert [(r["namespace"], r["epoch"], r["leader"], r["next_epoch"], r["ended_at"],
             r["ended_by"], r["duration_ms"]) for r in rows] == [
        ("prod", 1, "jm-1", 2, 5_000, "SUPERSEDED", 4_000),
        ("prod", 2, "jm-2", 3, 7_000, "REVOKED", 2_000),
        ("prod", 3, "jm-1", None, None, None, None),
        ("test", 1, "jm-9", None, None, None, None),
    ]
    assert set(term) <= set(rows[0])  # every column of audit_terms is there too
    assert (rows[0]["renewals"], rows[0]["accepted_writes"], rows[0]["lease_ms"]) == (3, 10, 5_000)


def test_job_history_is_every_job_record_in_log_order(audit: tuple[str, sa.Engine]) -> None:
    url, engine = audit
    history = normal_history()
    insert(engine, AuditRecord, list(reversed(history)))  # insertion order must not matter
    rows = select(url, "SELECT * FROM job_history")
    assert [(r["job_id"], r["topic"], r["partition"], r["offset"]) for r in rows] == [
        *(("job-a", "jobreg", 0, offset) for offset in range(1, 7)),
        ("job-a", "jobreg", 1, 3), ("job-a", "jobreg", 1, 4),
        ("job-a", "jobreg-staging", 0, 3), ("job-a", "jobreg-staging", 0, 4),
        ("job-b", "jobreg", 0, 7), ("job-b", "jobreg", 0, 8), ("job-b", "jobreg", 0, 9),
    ]
    assert {r["namespace"] for r in rows} == {"prod"}
    refused = rows[3]
    assert (refused["outcome"], refused["reason"], refused["job_status"]) == (
        Outcome.REJECTED, "terminal_job", C)
    assert {"outcome", "reason", "job_status", "event_type", "log_time"} <= set(refused)


def test_checkpoint_failures(audit: tuple[str, sa.Engine]) -> None:
    url, engine = audit
    insert(engine, AuditRecord, [
        rec(1, "JobSubmitted", job_id="job-a", job_status=A),
        rec(2, "CheckpointTriggered", job_id="job-a", job_status=A),
        rec(3, "CheckpointFailed", job_id="job-a", job_status=A, detail="task 3 timed out"),
        rec(4, "CheckpointFailed", Outcome.IGNORED, job_id="job-a", job_status=A,
            reason="checkpoint_discarded", detail="checkpoint 2 was discarded"),
        rec(5, "CheckpointFailed", Outcome.REJECTED, job_id="job-a", job_status=A,
            reason="stale_epoch"),
        rec(6, "CheckpointCompleted", job_id="job-a", job_status=A),
    ])
    rows = select(url, 'SELECT * FROM checkpoint_failures ORDER BY "offset"')
    # SQLite has no boolean type: TRUE/FALSE come back as 1/0, which compare equal.
    assert [(r["offset"], r["job_id"], r["outcome"], r["counted"], r["reason"], r["detail"])
            for r in rows] == [
        (3, "job-a", Outcome.ACCEPTED, True, None, "task 3 timed out"),
        (4, "job-a", Outcome.IGNORED, False, "checkpoint_discarded", "checkpoint 2 was discarded"),
        (5, "job-a", Outcome.REJECTED, None, "stale_epoch", None),
    ]


# --------------------------------------------------------------------------- the query path


def test_query_returns_columns_and_rows(audit: tuple[str, sa.Engine]) -> None:
    url, engine = audit
    insert(engine, AuditRecord, normal_history())
    sql = ('SELECT "offset", event_type, outcome FROM audit_records '
           'WHERE job_id = :job AND topic = :topic AND "partition" = :p ORDER BY "offset"')
    params = {"job": "job-a", "topic": "jobreg", "p": 0}
    columns, rows = query(url, sql, params)
    assert columns == ["offset", "event_type", "outcome"]
    assert rows[:2] == [(1, "JobSubmitted", "ACCEPTED"), (2, "CheckpointTriggered", "ACCEPTED")]
    assert len(rows) == 6
    assert query(url, sql, params, limit=2) == (columns, rows[:2])
    assert query(url, sql, params, limit=0) == (columns, [])
    assert query(url, "SELECT COUNT(*) AS n FROM audit_records WHERE event_id LIKE 'e3%'") == (
        ["n"], [(3,)])


WRITES = {
    "DELETE": "DELETE FROM audit_records",
    "DROP TABLE": "DROP TABLE audit_records",
    "UPDATE": "UPDATE audit_records SET outcome = 'REJECTED', accepted = FALSE",
    "INSERT": ("INSERT INTO audit_progress (stream, topic, \"partition\", next_offset, batch_id,"
               " updated_at) VALUES ('s', 'jobreg', 0, 1, 1, 1)"),
    "CREATE TABLE": "CREATE TABLE sneaky (a INTEGER)",
}


def test_query_writes_are_refused_by_the_database(audit: tuple[str, sa.Engine]) -> None:
    url, engine = audit
    insert(engine, AuditRecord, normal_history())
    before = query(url, 'SELECT * FROM audit_records ORDER BY topic, "offset"')
    assert len(before[1]) == len(normal_history())
    for verb, sql in WRITES.items():
        with pytest.raises(AuditError) as caught:
            query(url, sql)
        message = str(caught.value)
        assert "database refused the write" in message
        if engine.dialect.name == "sqlite":
            assert "attempt to write a readonly database" in message  # SQLite's own words
        else:
            assert f"cannot execute {verb} in a read-only transaction" in message  # PostgreSQL's
        assert isinstance(caught.value, RegistryError)
    assert query(url, 'SELECT * FROM audit_records ORDER BY topic, "offset"') == before
    assert query(url, "SELECT COUNT(*) FROM audit_progress")[1] == [(0,)]
    assert schema(engine) == ({*TABLES, "alembic_version"}, set(VIEWS))


def test_query_read_only_cannot_be_switched_off_from_sql(audit: tuple[str, sa.Engine]) -> None:
    """No second statement rides along, and a setting does not outlive its call."""
    url, engine = audit
    insert(engine, AuditRecord, normal_history())
    sneaky = [
        "SELECT 1; DELETE FROM audit_records",
        "SET TRANSACTION READ WRITE; DELETE FROM audit_records",
        "COMMIT; DELETE FROM audit_records",
    ]
    for sql in sneaky:
        with pytest.raises(AuditError, match="refused"):
            query(url, sql)
    if engine.dialect.name == "sqlite":
        # the authorizer refuses switching query_only off, and ATTACH (it creates a file)
        attached = Path(url.removeprefix("sqlite:///") + ".attached")
        for sql in ("PRAGMA query_only = OFF", "PRAGMA writable_schema = ON",
                    f"ATTACH DATABASE '{attached}' AS e", "DETACH DATABASE main"):
            with pytest.raises(AuditError, match="refused the write"):
                query(url, sql)
        assert not attached.exists()
        assert query(url, "PRAGMA query_only")[1] == [(1,)]  # reading it is fine
    else:
        query(url, "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE")
        query(url, "SET default_transaction_read_only = off")
    with pytest.raises(AuditError, match="refused the write"):
        query(url, "DELETE FROM audit_records")
    assert query(url, "SELECT COUNT(*) FROM audit_records")[1] == [(len(normal_history()),)]


def test_query_errors_are_audit_errors(audit: tuple[str, sa.Engine]) -> None:
    url, _engine = audit
    with pytest.raises(AuditError, match="refused the query"):
        query(url, "SELECT * FROM no_such_table")
    with pytest.raises(AuditError, match="invalid query"):
        query(url, "SELECT * FROM audit_records WHERE job_id = :job")  # no value for :job
    with pytest.raises(RegistryError, match="limit"):
        query(url, "SELECT 1", limit=-1)


def test_the_session_database_fixture(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql+psycopg://jobreg@127.0.0.1:")
    assert select(postgres_url, "SELECT current_database(), session_user") == [
        {"current_database": "jobreg_audit_test", "session_user": "jobreg"}]
    with pytest.raises(AuditError, match="refusing to query as 'jobreg': .*SUPERUSER"):
        query(postgres_url, "SELECT 1")  # the cluster's superuser (issue 26)


def test_postgres_queries_run_as_the_reader_role(pg_db: str) -> None:
    """Issue 15 item 13: on PostgreSQL read-only holds by privilege, not only by a setting
    of the transaction: queries run as ``jobreg_audit_reader``; a login role in it cannot
    write even in a read-write transaction of its own; a database not migrated to 0005
    (the role exists, it has no grants there) is still queried, read-only, and the login's
    own lack of privileges refuses what the role would have allowed."""
    import psycopg

    migrate(pg_db)
    engine = engine_for(pg_db)
    try:
        insert(engine, AuditRecord, normal_history())
        reader = reader_of(pg_db)
        # what query() switches to, and what a write then meets
        assert query(reader, "SELECT current_user, session_user")[1] == [
            (READER_ROLE, READER_LOGIN)]
        with pytest.raises(AuditError, match="read-write mode must be set before any query"):
            query(reader, "SELECT set_config('transaction_read_only', 'off', false)")
        # the reader login with a client that is not jobreg's
        parsed = sa.make_url(reader)
        dsn = (f"host={parsed.host} port={parsed.port} dbname={parsed.database} "
               f"user={parsed.username} password={parsed.password}")
        with psycopg.connect(dsn) as conn:
            conn.execute("BEGIN READ WRITE")
            assert conn.execute("SELECT count(*) FROM leadership_terms").fetchone() is not None
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("DELETE FROM audit_records")
        assert query(reader, "SELECT count(*) FROM audit_records")[1] == [
            (len(normal_history()),)]
        with pytest.raises(AuditError, match="refused the write"):
            query(reader, "DELETE FROM audit_records")
        # back at 0004: the role has no grants here; queries run as the login, read-only
        downgrade(pg_db, "0004")
        assert query(reader, "SELECT current_user")[1] == [(READER_LOGIN,)]
        with pytest.raises(AuditError, match="permission denied for table audit_records"):
            query(reader, "SELECT count(*) FROM audit_records")
        with pytest.raises(AuditError, match="refused the write"):
            query(reader, "DELETE FROM audit_records")
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- unusable databases


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_postgres_is_a_quick_audit_error() -> None:
    url = f"postgresql+psycopg://jobreg@127.0.0.1:{_closed_port()}/jobreg"
    for call in (lambda: query(url, "SELECT 1"), lambda: migrate(url),
                 lambda: current_revision(url), lambda: downgrade(url)):
        started = time.monotonic()
        with pytest.raises(AuditError, match="cannot connect to the audit database") as caught:
            call()
        assert time.monotonic() - started < 5
        assert "Connection refused" in str(caught.value)


def test_a_postgres_that_never_answers_times_out() -> None:
    """A port that accepts TCP but never speaks (a hung server): bounded by connect_timeout."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        accepted: list[socket.socket] = []
        stop = threading.Event()

        def hold() -> None:  # accept and say nothing
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    accepted.append(server.accept()[0])
                except OSError:
                    continue

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        try:
            started = time.monotonic()
            with pytest.raises(AuditError, match="cannot connect"):
                query(f"postgresql+psycopg://jobreg@127.0.0.1:{port}/x?connect_timeout=2",
                      "SELECT 1")
            assert time.monotonic() - started < 10
        finally:
            stop.set()
            holder.join(5)
            for conn in accepted:
                conn.close()


def test_sqlite_in_a_missing_directory_or_file(tmp_path: Path) -> None:
    missing_dir = f"sqlite:///{tmp_path / 'nope' / 'audit.db'}"
    for call in (lambda: migrate(missing_dir), lambda: query(missing_dir, "SELECT 1")):
        with pytest.raises(AuditError, match="does not exist"):
            call()
    missing_file = tmp_path / "audit.db"
    with pytest.raises(AuditError, match="no SQLite database"):
        query(f"sqlite:///{missing_file}", "SELECT 1")
    assert not missing_file.exists()  # a read never creates the database


@pytest.mark.parametrize("url", [
    "not a url",
    "",
    "postgresql+psycopg://jobreg:secret@localhost:port/db",
    "nosuchdb://host/db",
    "sqlite://somehost/audit.db",
    "postgresql+nosuchdriver://localhost/db",
])
def test_malformed_url_is_an_audit_error(url: str) -> None:
    with pytest.raises(AuditError) as caught:
        query(url, "SELECT 1")
    assert "secret" not in str(caught.value)


def test_query_after_a_writer_died_mid_transaction_reads_what_was_committed(tmp_path) -> None:
    """A writer SIGKILLed inside a transaction that spilled pages into the file leaves a hot
    journal; a read-only connection cannot roll it back and refused every read ("attempt to
    write a readonly database") until a writer came. The read rolls it back first."""
    import os
    import signal
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    migrate(url)
    with engine_for(url).begin() as conn:
        conn.execute(sa.text("CREATE TABLE scratch (v TEXT)"))
        conn.execute(sa.text("INSERT INTO scratch VALUES ('committed')"))
    writer = ("import os, signal, sqlite3, sys\n"
              "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "db.execute('PRAGMA cache_size = 1')\n"  # spill to the file early
              "db.execute('BEGIN')\n"
              "db.executemany('INSERT INTO scratch VALUES (?)', [('x' * 500,)] * 5000)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    died = subprocess.run([sys.executable, "-c", writer, str(tmp_path / "audit.db")])
    assert died.returncode == -signal.SIGKILL
    assert os.path.getsize(tmp_path / "audit.db-journal") > 0, "no hot journal was left"
    assert query(url, "SELECT v FROM scratch") == (["v"], [("committed",)])
