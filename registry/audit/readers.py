"""Who may run the audit database's read-only queries on PostgreSQL, and how to make such a login.

``SET LOCAL ROLE jobreg_audit_reader`` inside a read-only transaction is no sandbox: a
statement may leave the role (``set_config('role', ...)``, ``RESET ROLE``, ``SET SESSION
AUTHORIZATION``) for anything its *login* role may become, and a read-only transaction does
not stop what acts outside the database (``COPY ... TO PROGRAM``, ``COPY ... TO 'file'``,
``pg_read_file``, ``lo_export``). So read-only holds only when the login itself can do no
more than read. :func:`excess_privileges` lists what a login can do beyond reading, and
:func:`registry.audit.db.query` refuses, before the statement is sent, to run one for a login
with any; :func:`grant_reader` makes a login that has none::

    grant_reader("postgresql://admin@db/audit", "alice", password)   # once, as an admin
    query("postgresql://alice@db/audit", "SELECT * FROM refused_writes")

More than reading is, for the login and for every role it is a member of, directly or through
others (it may ``SET ROLE`` to any of them, ``INHERIT`` or not):

* the attributes ``SUPERUSER``, ``CREATEROLE``, ``CREATEDB``, ``REPLICATION``, ``BYPASSRLS``;
* membership in a predefined role (``pg_execute_server_program``, ``pg_read_server_files``,
  ``pg_write_server_files``, ``pg_write_all_data``, ``pg_signal_backend``, ... and
  ``pg_database_owner``, which the owner of the database is in);
* owning the database, a schema in it, or a table, view or sequence in one (system schemas
  apart);
* ``INSERT``, ``UPDATE``, ``DELETE``, ``TRUNCATE``, ``REFERENCES`` or ``TRIGGER`` on any table,
  view or sequence in the database (what ``PUBLIC`` was granted counts);
* ``CREATE`` on the database or on a schema in it;
* ``EXECUTE`` on a ``SECURITY DEFINER`` function whose owner is none of those roles: it runs
  with its owner's rights.

What remains is reading: ``SELECT`` where it was granted, ``USAGE`` on schemas, ``CONNECT``
and ``TEMPORARY`` on the database (a temporary table cannot be created in a read-only
transaction) and ``EXECUTE`` on ordinary functions, which run with the caller's rights.
What the check does not cover: what is granted after it ran (it runs before every query), and
a login's ``SELECT`` on tables outside the audit schema (a reader reads what it was granted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..extras import needs

with needs("audit", "the audit database (registry.audit)"):
    from sqlalchemy import URL, Connection, text
    from sqlalchemy.exc import DBAPIError

from ..errors import ConfigError
from .db import READER_ROLE, AuditError, _connected, _db_message, _parse, _shown, engine_for

__all__ = ["ReaderLogin", "check_reader_name", "excess_privileges", "grant_reader",
           "refuse_more_than_reading"]

#: A reader login's name: a plain lowercase identifier, so it reads the same in SQL and in a URL.
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: How many reasons a refusal names (the rest are counted).
_SHOWN_REASONS = 3

# Every role the login may become (itself included), and what each may do beyond reading.
# Names are schema-qualified so that a search_path given in the URL changes nothing.
_EXCESS_SQL = r"""
WITH login AS (
    SELECT oid, rolname FROM pg_catalog.pg_roles
    WHERE rolname = coalesce(CAST(:role AS text), CAST(session_user AS text))
), mine AS (
    SELECT r.oid, r.rolname, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication,
           r.rolbypassrls
    FROM pg_catalog.pg_roles r, login WHERE pg_catalog.pg_has_role(login.oid, r.oid, 'MEMBER')
), schemas AS (
    SELECT oid, nspname, nspowner FROM pg_catalog.pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
      AND nspname NOT LIKE 'pg\_temp\_%' AND nspname NOT LIKE 'pg\_toast\_temp\_%'
), relations AS (
    SELECT c.oid, c.relowner, pg_catalog.format('%I.%I', s.nspname, c.relname) AS name
    FROM pg_catalog.pg_class c JOIN schemas s ON s.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
), via AS (  -- " (as ROLE)" when a privilege is the login's through another role
    SELECT m.oid, CASE WHEN m.oid = (SELECT oid FROM login) THEN ''
                       ELSE pg_catalog.format(' (as %s)', m.rolname) END AS suffix FROM mine m
)
SELECT a.rank, pg_catalog.format('%s%s', a.attr, v.suffix)
FROM mine m JOIN via v USING (oid),
     LATERAL (VALUES (0, 'SUPERUSER', m.rolsuper), (1, 'CREATEROLE', m.rolcreaterole),
                     (1, 'CREATEDB', m.rolcreatedb), (1, 'REPLICATION', m.rolreplication),
                     (1, 'BYPASSRLS', m.rolbypassrls)) a(rank, attr, has)
WHERE a.has
UNION ALL
SELECT 2, pg_catalog.format('member of %s', m.rolname) FROM mine m
WHERE m.oid < 16384 AND m.rolname LIKE 'pg\_%'
UNION ALL
SELECT 3, pg_catalog.format('owns database %s', d.datname) FROM pg_catalog.pg_database d
WHERE d.datname = pg_catalog.current_database() AND d.datdba IN (SELECT oid FROM mine)
UNION ALL
SELECT 3, pg_catalog.format('owns schema %s', s.nspname) FROM schemas s
WHERE s.nspowner IN (SELECT oid FROM mine)
UNION ALL
SELECT 3, pg_catalog.format('owns %s', r.name) FROM relations r
WHERE r.relowner IN (SELECT oid FROM mine)
UNION ALL
SELECT 4, pg_catalog.format('may write %s%s', r.name, min(v.suffix)) FROM relations r, via v
WHERE pg_catalog.has_table_privilege(v.oid, r.oid,
                                     'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
GROUP BY r.name
UNION ALL
SELECT 5, pg_catalog.format('may CREATE in database %s%s', pg_catalog.current_database(),
                            min(v.suffix)) FROM via v
WHERE pg_catalog.has_database_privilege(v.oid, pg_catalog.current_database(), 'CREATE')
HAVING count(*) > 0
UNION ALL
SELECT 5, pg_catalog.format('may CREATE in schema %s%s', s.nspname, min(v.suffix))
FROM schemas s, via v WHERE pg_catalog.has_schema_privilege(v.oid, s.oid, 'CREATE')
GROUP BY s.nspname
UNION ALL
SELECT 6, pg_catalog.format('may run SECURITY DEFINER function %s (owner %s)',
                            CAST(p.oid AS pg_catalog.regprocedure), o.rolname)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles o ON o.oid = p.proowner
WHERE p.prosecdef AND p.proowner NOT IN (SELECT oid FROM mine)
  AND EXISTS (SELECT FROM mine m
              WHERE pg_catalog.has_function_privilege(m.oid, p.oid, 'EXECUTE'))
ORDER BY 1, 2
"""


def check_reader_name(name: str) -> str:
    """``name`` if it can be a reader login's name, else :class:`ConfigError`: a lowercase
    identifier (letters, digits, ``_``; at most 63), not ``pg_...``, not the reader role."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{name!r} cannot be a reader login: use lowercase letters, digits "
                          "and _ (at most 63, not starting with a digit)")
    if name.startswith("pg_") or name == READER_ROLE:
        raise ConfigError(f"{name!r} cannot be a reader login: the name is reserved")
    return name


def excess_privileges(conn: Connection, role: str | None = None) -> list[str]:
    """What ``role`` (default: the session's login, ``session_user``) can do beyond reading
    the audit database, one phrase each (``SUPERUSER``, ``member of pg_read_server_files``,
    ``may write public.audit_records (as writer)``, ...); empty for a reader. See the module
    docstring for the list. PostgreSQL only; runs in the connection's transaction."""
    rows = conn.execute(text(_EXCESS_SQL), {"role": role}).all()
    return [str(reason) for _rank, reason in rows]


def refuse_more_than_reading(conn: Connection) -> None:
    """Raise :class:`AuditError` when the session's login can do more than read (see
    :func:`excess_privileges`); its message names what, and the fix."""
    excess = excess_privileges(conn)
    if not excess:
        return
    login = conn.execute(text("SELECT CAST(session_user AS text)")).scalar()
    shown = ", ".join(excess[:_SHOWN_REASONS])
    if len(excess) > _SHOWN_REASONS:
        shown += f" and {len(excess) - _SHOWN_REASONS} more"
    raise AuditError(
        f"refusing to query as {login!r}: it can do more than read ({shown}), so a statement "
        f"could leave the read-only role and write, or run programs and files on the server; "
        f"connect as a login that only reads (create one with `jobreg audit grant-reader NAME "
        f"--db <admin URL>`)")


@dataclass(frozen=True)
class ReaderLogin:
    """What :func:`grant_reader` did."""

    role: str
    created: bool
    """``False``: the login existed, a reader already; its password was set."""
    url: str
    """The URL to query with, its password left out (give it in the URL or in
    ``$JOBREG_AUDIT_DB_PASSWORD_FILE``)."""


def _role_state(conn: Connection, name: str) -> tuple[bool, bool] | None:
    """``(is a member of the reader role, can log in)`` of role ``name``, ``None`` if none."""
    row = conn.execute(text(
        "SELECT pg_catalog.pg_has_role(r.oid, :reader, 'MEMBER'), r.rolcanlogin "
        "FROM pg_catalog.pg_roles r WHERE r.rolname = :name"),
        {"name": name, "reader": READER_ROLE}).first()
    return None if row is None else (bool(row[0]), bool(row[1]))


def _scram_verifier(conn: Connection, name: str, password: str) -> str:
    """The password as the server stores it (``SCRAM-SHA-256$...`` under the default
    ``password_encryption``), computed by libpq here, as psql's ``\\password`` does, so the
    secret itself is never sent in a statement (nor logged with it)."""
    pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
    return bytes(pgconn.encrypt_password(password.encode(), name.encode())).decode()


def grant_reader(url: str | URL, name: str, password: str) -> ReaderLogin:
    """Create the PostgreSQL login ``name`` that only reads the audit database at ``url``
    (an admin's URL: a role that may create roles), with ``password``.

    The login is ``LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    INHERIT`` and a member of ``jobreg_audit_reader`` alone (``INHERIT``: it reads with the
    role's ``SELECT`` from any client, not only through :func:`~registry.audit.db.query`),
    with ``CONNECT`` on the database. Run again for a login that is already such a reader, it
    sets the password (idempotent); a role of that name that is anything else is refused.
    Once made, the login is checked with :func:`excess_privileges` (``PUBLIC`` or the reader
    role may have been granted more) and nothing is kept if it fails. One transaction.
    Raises :class:`ConfigError` for a bad name or an empty password and :class:`AuditError`
    otherwise (SQLite, a database not migrated to 0005, no right to create roles).
    """
    check_reader_name(name)
    if not isinstance(password, str) or not password:
        raise ConfigError("a reader login needs a password (an empty one cannot log in)")
    parsed = _parse(url)
    if parsed.get_backend_name() != "postgresql":
        raise AuditError("a SQLite database has no logins: anyone who can read the file reads "
                         "it, and `jobreg audit query` opens it read-only; grant-reader is for "
                         "PostgreSQL")
    engine = engine_for(parsed)
    try:
        with _connected(engine) as conn:
            try:
                with conn.begin():
                    return _grant(conn, parsed, name, password)
            except DBAPIError as e:
                raise AuditError(f"the database refused to make reader login {name!r}: "
                                 f"{_db_message(e)}") from None
    finally:
        engine.dispose()


def _grant(conn: Connection, url: URL, name: str, password: str) -> ReaderLogin:
    may_read = conn.execute(text(
        "SELECT coalesce(pg_catalog.has_table_privilege(r.oid, "
        "pg_catalog.to_regclass('audit_records'), 'SELECT'), false) "
        "FROM pg_catalog.pg_roles r WHERE r.rolname = :reader"), {"reader": READER_ROLE}).scalar()
    if not may_read:
        raise AuditError(f"{_shown(url)!r} has no role {READER_ROLE} that reads its audit tables: "
                         "run `jobreg audit migrate` on it first (revision 0005 makes the role)")
    state = _role_state(conn, name)
    verifier = _scram_verifier(conn, name, password)
    ident = conn.dialect.identifier_preparer.quote(name)
    quoted = "'" + verifier.replace("'", "''") + "'"  # a verifier: base64 and '$', no quote
    if state is None:
        conn.exec_driver_sql(
            f"CREATE ROLE {ident} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
            f"NOBYPASSRLS INHERIT PASSWORD {quoted} IN ROLE {READER_ROLE}")
    else:
        member, can_login = state
        excess = excess_privileges(conn, name)
        if not member or not can_login or excess:
            why = ", ".join(excess[:_SHOWN_REASONS]) or (
                f"not a member of {READER_ROLE}" if not member else "NOLOGIN")
            raise AuditError(f"role {name!r} exists and is not a reader login ({why}): choose "
                             "another name, or drop that role first")
        conn.exec_driver_sql(f"ALTER ROLE {ident} WITH PASSWORD {quoted}")
    database = conn.dialect.identifier_preparer.quote(
        str(conn.execute(text("SELECT pg_catalog.current_database()")).scalar()))
    conn.exec_driver_sql(f"GRANT CONNECT ON DATABASE {database} TO {ident}")
    excess = excess_privileges(conn, name)
    if excess:
        raise AuditError(f"reader login {name!r} would not only read ({', '.join(excess)}): "
                         f"nothing was created; revoke that from PUBLIC or {READER_ROLE} first")
    shown = url.set(username=name, password=None).render_as_string(hide_password=True)
    return ReaderLogin(role=name, created=state is None, url=shown)
