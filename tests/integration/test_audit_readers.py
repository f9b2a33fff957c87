"""Issue 26 item 1: ``jobreg audit query`` on PostgreSQL is read-only whatever URL it is given.

Run on the session's throwaway cluster (``tests/support/pg.py``), whose superuser is
``jobreg``, through the real CLI entry point.
"""

from __future__ import annotations

import json
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
from support.pg import reader_of

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


def test_a_reader_login_reads_everything_a_reader_needs(target: Target) -> None:
    """The login ``grant-reader`` made runs the queries and the named questions, as
    ``jobreg_audit_reader``."""
    code, out, err = cli("--json", "audit", "query", "--db", target.reader,
                         "SELECT current_user, session_user, count(*) FROM audit_records")
    assert code == 0, err
    assert json.loads(out)["rows"] == [["jobreg_audit_reader", sa.make_url(target.reader)
                                        .username, 3]]
    for name in ("refused", "terms", "results", "resurrections"):
        code, _, err = cli("audit", name, "--db", target.reader)
        assert code == 0, (name, err)


# --------------------------------------------------------------------------- logins refused


def _login_with(admin: str, login: str, password: str, *grants: str) -> None:
    """Login ``login`` in the reader role, then ``grants`` (``{login}`` is its name)."""
    with psycopg.connect(_dsn(admin), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {login} LOGIN PASSWORD '{password}' "
                     "IN ROLE jobreg_audit_reader")
        for grant in grants:
            conn.execute(grant.format(login=login))


# kind -> (what the admin granted, what the refusal names); {login} is the login, {w} a role
REFUSED_LOGINS: dict[str, tuple[tuple[str, ...], str]] = {
    "member of a role that may write": (
        ("CREATE ROLE {w} NOLOGIN", "GRANT INSERT ON audit_records TO {w}",
         "GRANT {w} TO {login}"), "may write public.audit_records"),  # inherited: its own
    "NOINHERIT member of a role that may write": (
        ("CREATE ROLE {w} NOLOGIN", "GRANT TRUNCATE ON audit_jobs TO {w}",
         "ALTER ROLE {login} NOINHERIT", "GRANT {w} TO {login}"),
        "may write public.audit_jobs (as {w})"),
    "member of a member of a role that may write": (
        ("CREATE ROLE {w} NOLOGIN", "CREATE ROLE {w}_2 NOLOGIN IN ROLE {w}",
         "GRANT DELETE ON audit_progress TO {w}", "GRANT {w}_2 TO {login}"),
        "may write public.audit_progress"),
    "a table's owner": (
        ("ALTER TABLE audit_terms OWNER TO {login}",), "owns public.audit_terms"),
    "the database's owner": (
        ("ALTER DATABASE {db} OWNER TO {login}",), "member of pg_database_owner"),
    "CREATE on the schema": (
        ("GRANT CREATE ON SCHEMA public TO {login}",), "may CREATE in schema public"),
    "PUBLIC may write": (
        ("GRANT UPDATE ON audit_jobs TO PUBLIC",), "may write public.audit_jobs"),
    "a SECURITY DEFINER function of the superuser": (
        ("CREATE FUNCTION jobreg_t_definer() RETURNS int SECURITY DEFINER LANGUAGE sql "
         "AS 'SELECT 1'",),
        "may run SECURITY DEFINER function jobreg_t_definer() (owner jobreg)"),
    **{f"member of {role}": ((f"GRANT {role} TO {{login}}",), f"member of {role}")
       for role in ("pg_execute_server_program", "pg_read_server_files",
                    "pg_write_server_files", "pg_write_all_data")},
    **{attribute: ((f"ALTER ROLE {{login}} {attribute}",), attribute)
       for attribute in ("CREATEROLE", "CREATEDB", "REPLICATION", "BYPASSRLS")},
}


@pytest.mark.parametrize("kind", list(REFUSED_LOGINS))
def test_a_login_that_can_do_more_than_read_is_refused(pg_db, postgres_cluster, kind) -> None:
    """A login in ``jobreg_audit_reader`` that may also become a role that writes, owns
    something, or holds a predefined role is refused before the statement is sent, as the
    superuser is; the refusal names why and the fix."""
    migrate(pg_db)
    _fill(pg_db)
    suffix = uuid.uuid4().hex[:8]
    login, writer, password = f"l_{suffix}", f"w_{suffix}", f"pw-{suffix}"
    grants, named = REFUSED_LOGINS[kind]
    try:
        _login_with(pg_db, login, password, *(g.format(login=login, w=writer, db=sa.make_url(
            pg_db).database) for g in grants))
        url = sa.make_url(pg_db).set(username=login, password=password) \
            .render_as_string(hide_password=False)
        before = _state(pg_db)
        code, out, err = cli("audit", "query", "--db", url, "DELETE FROM audit_records")
        assert code == 1 and out == "", (out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert f"refusing to query as '{login}'" in err and "grant-reader" in err, err
        assert named.format(w=writer) in err, err
        assert password not in err
        assert _state(pg_db) == before
    finally:
        with psycopg.connect(_dsn(pg_db), autocommit=True) as conn:  # PUBLIC's grant
            conn.execute("REVOKE ALL ON audit_jobs FROM PUBLIC")
            conn.execute(f"ALTER DATABASE {sa.make_url(pg_db).database} OWNER TO jobreg")
        _drop_roles(pg_db, f"{writer}_2", writer, login)


def test_a_wrong_password_is_one_line_without_the_secret(target: Target) -> None:
    wrong = sa.make_url(target.reader).set(password="not-the-password-4711") \
        .render_as_string(hide_password=False)
    code, out, err = cli("audit", "query", "--db", wrong, "SELECT 1")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "password authentication failed for user" in err
    assert "not-the-password-4711" not in err and target.reader_password not in err


# --------------------------------------------------------------------------- grant-reader


def test_grant_reader_makes_and_updates_a_login_and_never_shows_its_password(
        pg_db, tmp_path) -> None:
    migrate(pg_db)
    _fill(pg_db)
    login = f"g_{uuid.uuid4().hex[:8]}"
    first, second, third = (f"pw-{uuid.uuid4().hex}" for _ in range(3))
    shape = sa.make_url(pg_db).set(username=login).render_as_string(hide_password=True)
    try:
        # typed at a prompt, twice, not echoed
        code, out, err = cli("audit", "grant-reader", login, "--db", pg_db,
                             input=f"{first}\n{first}\n")
        assert code == 0, err
        assert f"created reader login {login}" in out and f"--db {shape} " in out
        assert first not in out + err
        assert _reads(pg_db, login, first)
        # again: the password is set, the login stays a reader (JSON, from the environment)
        code, out, err = cli("--json", "audit", "grant-reader", login, "--db", pg_db,
                             env={"JOBREG_AUDIT_READER_PASSWORD": second})
        assert code == 0, err
        assert json.loads(out) == {"format": "jobreg.audit-grant-reader/1", "role": login,
                                   "created": False, "url": shape}
        assert second not in out + err
        assert _reads(pg_db, login, second) and not _reads(pg_db, login, first)
        # from a file, as docker-compose.yml's secret (a trailing newline is not part of it)
        secret = tmp_path / "secret"
        secret.write_text(third + "\n")
        code, out, err = cli("audit", "grant-reader", login, "--db", pg_db,
                             "--password-file", str(secret))
        assert code == 0 and "updated the password of reader login" in out, err
        assert third not in out + err
        # the same file logs the reader in, through $JOBREG_AUDIT_DB_PASSWORD_FILE
        code, out, err = cli("audit", "query", "--db", shape, "SELECT count(*) FROM audit_jobs",
                             env={"JOBREG_AUDIT_DB_PASSWORD_FILE": str(secret)})
        assert code == 0, err
    finally:
        _drop_roles(pg_db, login)


def _reads(admin: str, login: str, password: str) -> bool:
    url = sa.make_url(admin).set(username=login, password=password) \
        .render_as_string(hide_password=False)
    return cli("audit", "query", "--db", url, "SELECT count(*) FROM audit_records")[0] == 0


@pytest.mark.parametrize("case", ["the superuser's name", "a bad name", "SQLite",
                                  "not migrated", "an empty password", "a missing file",
                                  "no right to create roles"])
def test_grant_reader_refuses_in_one_line(pg_db, tmp_path, case) -> None:
    if case != "not migrated":
        migrate(pg_db)
    login, password = f"g_{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    env = {"JOBREG_AUDIT_READER_PASSWORD": password}
    args, expected = {
        "the superuser's name": (
            ["jobreg", "--db", pg_db],
            (1, "role 'jobreg' exists and is not a reader login (SUPERUSER")),
        "a bad name": (["Robert'); DROP", "--db", pg_db], (2, "cannot be a reader login")),
        "SQLite": ([login, "--db", f"sqlite:///{tmp_path / 'a.db'}"],
                   (1, "a SQLite database has no logins")),
        "not migrated": ([login, "--db", pg_db], (1, "run `jobreg audit migrate` on it first")),
        "an empty password": ([login, "--db", pg_db, "--password-file", "/dev/null"],
                              (1, "needs a password")),
        "a missing file": ([login, "--db", pg_db, "--password-file", str(tmp_path / "none")],
                           (2, "cannot read the password of")),
        "no right to create roles": ([login, "--db", reader_of(pg_db) if case ==
                                      "no right to create roles" else pg_db],
                                     (1, "permission denied to create role")),
    }[case]
    try:
        code, out, err = cli("audit", "grant-reader", *args, env=env)
        assert (code, out) == (expected[0], ""), err
        assert expected[1] in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert password not in err
        with psycopg.connect(_dsn(pg_db)) as conn:
            assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s",
                                (login,)).fetchone() == (0,)
    finally:
        _drop_roles(pg_db, login)


def test_the_compose_health_check_runs_as_its_reader_login(pg_db, tmp_path) -> None:
    """docker-compose.yml's one-shot ``audit-reader`` steps and the audit service's health
    check, run as written against the real PostgreSQL (its host, port and database swapped in):
    unhealthy (exit 1, one line) until the stream has committed progress, then healthy."""
    import yaml

    services = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml")
                              .read_text())["services"]
    test = services["audit"]["healthcheck"]["test"]
    at = test.index("jobreg")
    env = dict(a.split("=", 1) for a in test[2:at])
    args = test[at + 1:]
    here = sa.make_url(pg_db)
    db = args.index("--db") + 1
    login = sa.make_url(args[db]).username
    args[db] = sa.make_url(args[db]).set(host=here.host, port=here.port, database=here.database) \
        .render_as_string(hide_password=False)
    secret = tmp_path / Path(env["JOBREG_AUDIT_DB_PASSWORD_FILE"]).name
    secret.write_text(f"pw-{uuid.uuid4().hex}\n")
    try:
        for step in services["audit-reader"]["command"][0].split("&&"):
            code, _, err = cli(*step.split()[1:], "--db", pg_db,
                               env={"JOBREG_AUDIT_READER_PASSWORD_FILE": str(secret)})
            assert code == 0, (step, err)
        health = {"JOBREG_AUDIT_DB_PASSWORD_FILE": str(secret)}
        code, out, err = cli(*args, env=health)
        assert code == 1 and "division by zero" in err and len(err.strip().splitlines()) == 1
        _fill(pg_db)
        code, out, err = cli(*args, env=health)
        assert code == 0, err
    finally:
        _drop_roles(pg_db, login)


def test_options_in_the_url_change_nothing(target: Target) -> None:
    """The URL may carry server settings (``?options=-c ...``): a superuser that starts as the
    reader role (``role``), or with a search_path of its own, is still refused (the check
    looks at the login, with schema-qualified names); a reader that asks for read-write
    transactions still gets read-only ones (jobreg's setting comes last), and no privilege."""
    superuser = sa.make_url(target.admin).update_query_dict(
        {"options": "-c role=jobreg_audit_reader -c search_path=nowhere,public"})
    code, out, err = cli("audit", "query", "--db", superuser.render_as_string(False), "SELECT 1")
    assert code == 1 and REFUSED_UP_FRONT in err, err
    reader = sa.make_url(target.reader).update_query_dict(
        {"options": "-c default_transaction_read_only=off"})
    before = _state(target.admin)
    code, out, err = cli("audit", "query", "--db", reader.render_as_string(False),
                         "DELETE FROM audit_records")
    assert code == 1 and "cannot execute DELETE in a read-only transaction" in err, err
    assert _state(target.admin) == before
