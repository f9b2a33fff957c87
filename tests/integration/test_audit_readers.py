"""Issue 26 item 1: ``jobreg audit query`` on PostgreSQL is read-only whatever URL it is given.

Run on the session's throwaway cluster (``tests/support/pg.py``), whose superuser is
``jobreg``, through the real CLI entry point.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import psycopg.sql
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from registry.audit.db import migrate
from registry.audit.models import TABLES
from registry.cli import main

pytestmark = pytest.mark.integration


def _fill(url: str) -> None:
    """A few rows in the tables an escape would write to."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO audit_progress (stream, topic, \"partition\", next_offset, batch_id,"
                " updated_at, generation) VALUES ('audit', 'jobreg', 0, 3, 1, 1, 1)")
            for offset in range(3):
                conn.exec_driver_sql(
                    "INSERT INTO audit_records (topic, \"partition\", \"offset\", namespace,"
                    " event_type, outcome, accepted) VALUES ('jobreg', 0, %s, 'prod',"
                    " 'LeadershipGranted', 'ACCEPTED', TRUE)", (offset,))
    finally:
        engine.dispose()


def test_a_superuser_url_runs_no_shell_command(pg_db, postgres_cluster) -> None:
    """The reproduction of the issue: a DO block leaves ``SET LOCAL ROLE`` with
    ``set_config('role', ...)`` and runs ``COPY ... TO PROGRAM`` on the database server."""
    migrate(pg_db)
    _fill(pg_db)
    proof = Path(postgres_cluster.base_dir) / f"proof-{uuid.uuid4().hex[:8]}.txt"
    sql = ("DO $$BEGIN PERFORM set_config('role','jobreg',true); "
           f"EXECUTE 'COPY (SELECT current_user) TO PROGRAM ''id >> {proof}'''; END$$")
    done = subprocess.run([sys.executable, "-m", "registry.cli", "audit", "query", "--db",
                           pg_db, sql], capture_output=True, text=True, timeout=60)
    assert not proof.exists(), f"a shell command ran on the server: {proof.read_text()!r}"
    assert done.returncode == 1, done
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "SUPERUSER" in done.stderr and "grant-reader" in done.stderr
    with psycopg.connect(sa.make_url(pg_db).render_as_string().replace("+psycopg", "")) as c:
        assert c.execute("SELECT count(*) FROM audit_records").fetchone() == (3,)


# --------------------------------------------------------------------------- the escapes

SUPERUSER = "jobreg"  # the throwaway cluster's (tests/support/pg.py)
REFUSED_UP_FRONT = f"refusing to query as '{SUPERUSER}': it can do more than read (SUPERUSER"

# (statement, what the database answers the reader login): {proof} is a file the server may
# write, {lo} a large object, {reader_dsn} / {admin_dsn} the database as the reader login /
# as the superuser. Every statement tries to write, to run a program or to touch a file.
ESCAPES: dict[str, tuple[str, str]] = {
    "DO set_config('role') then COPY TO PROGRAM": (
        "DO $$BEGIN PERFORM set_config('role', 'jobreg', true); "
        "EXECUTE 'COPY (SELECT 1) TO PROGRAM ''id >> {proof}'''; END$$",
        "permission denied to set role"),
    "set_config('role')": (
        "SELECT set_config('role', 'jobreg', false)", "permission denied to set role"),
    "DO RESET ROLE then COPY TO PROGRAM": (
        "DO $$BEGIN RESET ROLE; EXECUTE 'COPY (SELECT 1) TO PROGRAM ''id >> {proof}'''; END$$",
        "privileges of the pg_execute_server_program role"),
    "DO RESET ROLE then DELETE": (
        "DO $$BEGIN RESET ROLE; DELETE FROM audit_records; END$$",
        "cannot execute DELETE in a read-only transaction"),
    "SET SESSION AUTHORIZATION": (
        "SET SESSION AUTHORIZATION jobreg", "permission denied to set session authorization"),
    "DO SET SESSION AUTHORIZATION then COPY TO PROGRAM": (
        "DO $$BEGIN SET SESSION AUTHORIZATION jobreg; "
        "EXECUTE 'COPY (SELECT 1) TO PROGRAM ''id >> {proof}'''; END$$",
        "permission denied to set session authorization"),
    "SET transaction_read_only = off": (
        "SET transaction_read_only = off",
        "transaction read-write mode must be set before any query"),
    "DO SET LOCAL transaction_read_only = off then DELETE": (
        "DO $$BEGIN SET LOCAL transaction_read_only = off; DELETE FROM audit_records; END$$",
        "transaction read-write mode must be set before any query"),
    "COPY TO PROGRAM": (
        "COPY (SELECT 1) TO PROGRAM 'id >> {proof}'",
        "privileges of the pg_execute_server_program role"),
    "COPY FROM PROGRAM": (
        "COPY audit_progress FROM PROGRAM 'id >> {proof}'",
        "privileges of the pg_execute_server_program role"),
    "COPY TO a server file": (
        "COPY (SELECT 1) TO '{proof}'", "privileges of the pg_write_server_files role"),
    "pg_read_file": (
        "SELECT pg_read_file('postgresql.conf')", "permission denied for function pg_read_file"),
    "lo_import": (
        "SELECT lo_import('/etc/hostname')", "permission denied for function lo_import"),
    "lo_export": (
        "SELECT lo_export({lo}, '{proof}')", "permission denied for function lo_export"),
    "dblink as the reader login": (
        "SELECT * FROM dblink('{reader_dsn}', 'DELETE FROM audit_records RETURNING 1') "
        "AS t(n int)", "permission denied for table audit_records"),
    "dblink as the superuser": (
        "SELECT * FROM dblink('{admin_dsn}', 'DELETE FROM audit_records RETURNING 1') "
        "AS t(n int)", "password is required"),
    "writable CTE": (
        "WITH gone AS (DELETE FROM audit_records RETURNING 1) SELECT count(*) FROM gone",
        "in a read-only transaction"),
    "SELECT FOR UPDATE": (
        "SELECT * FROM audit_progress FOR UPDATE",
        "cannot execute SELECT FOR UPDATE in a read-only transaction"),
    "a volatile function that writes": (
        "SELECT jobreg_t_bump()", "cannot execute INSERT in a read-only transaction"),
}


def _dsn(url: str) -> str:
    parsed = sa.make_url(url)
    dsn = f"host={parsed.host} port={parsed.port} dbname={parsed.database} user={parsed.username}"
    return dsn + (f" password={parsed.password}" if parsed.password else "")


@dataclass
class Target:
    """A migrated, filled database with a reader login made by ``audit grant-reader``."""

    admin: str
    reader: str
    proof: Path
    large_object: int
    dblink: bool
    reader_password: str


def _drop_roles(admin: str, *names: str) -> None:
    with psycopg.connect(_dsn(admin), autocommit=True) as conn:
        for name in names:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
                ident = psycopg.sql.Identifier(name)
                conn.execute(psycopg.sql.SQL("REASSIGN OWNED BY {} TO jobreg").format(ident))
                conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(ident))
                conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(ident))


@pytest.fixture(scope="module")
def target(postgres_cluster) -> Iterator[Target]:
    name = f"jobreg_r_{uuid.uuid4().hex[:12]}"
    admin = postgres_cluster.create_database(name)
    login, password = f"reader_{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    try:
        migrate(admin)
        _fill(admin)
        with psycopg.connect(_dsn(admin), autocommit=True) as conn:
            dblink = bool(conn.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'dblink'").fetchone())
            if dblink:
                conn.execute("CREATE EXTENSION dblink")
            large_object = conn.execute("SELECT lo_from_bytea(0, 'secret')").fetchone()[0]
            conn.execute(
                "CREATE FUNCTION jobreg_t_bump() RETURNS int VOLATILE LANGUAGE sql AS $$ "
                "INSERT INTO audit_progress (stream, topic, \"partition\", next_offset, "
                "batch_id, updated_at) VALUES ('bump', 'jobreg', 9, 1, 1, 1) RETURNING 1 $$")
        code, out, err = cli("audit", "grant-reader", login, "--db", admin,
                             env={"JOBREG_AUDIT_READER_PASSWORD": password})
        assert code == 0, err
        reader = sa.make_url(admin).set(username=login, password=password) \
            .render_as_string(hide_password=False)
        yield Target(admin, reader, Path(postgres_cluster.base_dir) / f"proof-{name}.txt",
                     large_object, dblink, password)
    finally:
        postgres_cluster.drop_database(name)
        _drop_roles(postgres_cluster.url(), login)


def cli(*args: str, env: dict[str, str] | None = None, input: str | None = None
        ) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env, input=input, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _state(admin: str) -> tuple:
    """Everything a statement could have changed: the audit tables' rows, the tables, the
    large objects, the roles."""
    with psycopg.connect(_dsn(admin)) as conn:
        rows = tuple(conn.execute(
            f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {table} t"
        ).fetchone()[0] for table in TABLES)
        return (rows,
                conn.execute("SELECT count(*) FROM pg_class WHERE relkind = 'r'").fetchone(),
                conn.execute("SELECT array_agg(oid ORDER BY oid) FROM pg_largeobject_metadata"
                             ).fetchone(),
                conn.execute("SELECT array_agg(rolname ORDER BY rolname) FROM pg_roles").fetchone())


@pytest.mark.parametrize("login", ["superuser", "reader login"])
@pytest.mark.parametrize("escape", list(ESCAPES))
def test_every_escape_is_refused(target: Target, escape: str, login: str) -> None:
    """Issue 26 item 1: with the cluster's superuser URL the statement is refused before it is
    sent; with a login made by ``audit grant-reader`` it is sent and the database refuses it.
    Either way: exit 1, one line on stderr, no traceback, nothing written, no file."""
    if "dblink" in escape and not target.dblink:
        pytest.skip("the dblink extension is not installed on this PostgreSQL")
    template, refusal = ESCAPES[escape]
    sql = template.format(proof=target.proof, lo=target.large_object,
                          reader_dsn=_dsn(target.reader), admin_dsn=_dsn(target.admin))
    url = target.admin if login == "superuser" else target.reader
    before = _state(target.admin)
    code, out, err = cli("audit", "query", "--db", url, sql)
    assert code == 1, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert (REFUSED_UP_FRONT if login == "superuser" else refusal) in err, err
    assert target.reader_password not in out + err
    assert not target.proof.exists(), f"the server wrote {target.proof}"
    assert _state(target.admin) == before
    assert out == ""
