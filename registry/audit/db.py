"""The audit database: engines, migrations and a read-only query path.

Two backends are supported, SQLite (development, tests, a laptop) and
PostgreSQL (production, ``docker-compose.yml``)::

    migrate("sqlite:///jobreg-audit.db")                 # alembic upgrade head
    cols, rows = query(url, "SELECT * FROM refused_writes WHERE namespace = :ns",
                       {"ns": "prod"}, limit=100)

URLs are SQLAlchemy URLs; ``postgresql://`` and ``postgres://`` mean
``postgresql+psycopg://`` (psycopg 3). Errors are :class:`AuditError` (a
:class:`registry.errors.RegistryError`) with a message for people, never a
driver traceback: a malformed URL, an unsupported backend, a database that
cannot be reached (PostgreSQL gives up after ``connect_timeout``,
:data:`PG_CONNECT_TIMEOUT` seconds unless the URL says otherwise), a refused query.

**Read-only is enforced by the database**, not by inspecting the SQL:

* SQLite: the file is opened with the URI ``file:<path>?mode=ro`` and
  ``PRAGMA query_only=ON`` (so not even a temporary table can be written);
* PostgreSQL: the session starts with ``default_transaction_read_only=on``
  (a startup option), every statement is sent as a prepared statement (the
  server accepts exactly one statement per call, so ``...; COMMIT; ...`` cannot
  smuggle a second one in), and the transaction is always rolled back.

* PostgreSQL, and by privilege: the *login* of the URL must be able to do no more than
  read (:mod:`registry.audit.readers`): a superuser, an owner, a member of a role that may
  write or of ``pg_execute_server_program`` and the like is refused before the statement is
  sent, because a statement can leave ``SET ROLE`` and a read-only transaction does not stop
  ``COPY ... TO PROGRAM``. :func:`registry.audit.readers.grant_reader` (``jobreg audit
  grant-reader NAME``) makes such a login, a member of ``jobreg_audit_reader`` (migration
  0005: ``SELECT`` on the audit tables and views, nothing else), and every query runs as that
  role (``SET LOCAL ROLE``), so a write is refused by missing privileges as well as by the
  read-only transaction, from any client.

Migrations live in the package ``registry.migrations`` when installed (the
repository's top-level ``migrations/`` folder otherwise); Alembic is configured
programmatically (:func:`alembic_config`), no ``alembic.ini`` needed.
"""

from __future__ import annotations

import atexit
import importlib.resources
import importlib.util
import os
import re
import shutil
import sqlite3
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..extras import needs

with needs("audit", "the audit database (registry.audit)"):
    import sqlalchemy
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.util.exc import CommandError
    from sqlalchemy import URL, Connection, Engine, event, make_url, pool, text
    from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError, StatementError

from ..errors import ConfigError, RegistryError

__all__ = [
    "DEFAULT_DB_URL",
    "MIGRATIONS_PACKAGE",
    "PASSWORD_FILE_ENV",
    "PG_CONNECT_TIMEOUT",
    "READER_ROLE",
    "AuditError",
    "alembic_config",
    "current_revision",
    "downgrade",
    "engine_for",
    "migrate",
    "migrations_dir",
    "query",
    "read_engine",
]

#: The audit database when none is given: a SQLite file in the working directory.
DEFAULT_DB_URL = "sqlite:///jobreg-audit.db"
#: Environment variable naming a file that holds the PostgreSQL password (used when the URL
#: has none).
PASSWORD_FILE_ENV = "JOBREG_AUDIT_DB_PASSWORD_FILE"
#: Seconds a PostgreSQL connection attempt may take (libpq ``connect_timeout``).
PG_CONNECT_TIMEOUT = 5
#: The installed package holding ``env.py``, ``script.py.mako`` and ``versions/``.
MIGRATIONS_PACKAGE = "registry.migrations"

_APPLICATION_NAME = "jobreg-audit"
_SQLITE_BUSY_TIMEOUT = 5.0  # seconds to wait for another writer's lock
_SQLITE_READONLY = 8  # SQLITE_READONLY; extended codes keep it in the low byte
_PG_INSUFFICIENT_PRIVILEGE = "42501"
_PG_READ_ONLY_SQL_TRANSACTION = "25006"
_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


class AuditError(RegistryError):
    """The audit database cannot be used: a bad URL, unreachable, or it refused a statement."""


# --------------------------------------------------------------------------- URLs and engines


def _redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for URLs that did not parse)."""
    return _PASSWORD_IN_URL.sub(r"\1***@", url)


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _parse(url: str | URL) -> URL:
    """Parse and normalise a database URL; only SQLite and PostgreSQL are supported."""
    if isinstance(url, URL):
        parsed = url
    else:
        if not isinstance(url, str) or not url.strip():
            raise AuditError(f"malformed database URL {url!r}: expected e.g. {DEFAULT_DB_URL!r}")
        try:
            parsed = make_url(url.strip())
        except (ArgumentError, ValueError) as e:
            raise AuditError(
                f"malformed database URL {_redact(url)!r}: {e} (expected e.g. "
                f"{DEFAULT_DB_URL!r} or 'postgresql+psycopg://user@host:5432/dbname')"
            ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    secret = os.environ.get(PASSWORD_FILE_ENV)
    if secret and parsed.password is None and parsed.get_backend_name() == "postgresql":
        try:  # a password in a file (a Docker secret), never in the URL or the compose file
            parsed = parsed.set(password=Path(secret).read_text().strip())
        except OSError as e:
            raise AuditError(f"cannot read the database password from {secret} "
                             f"(${PASSWORD_FILE_ENV}): {e.strerror}") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise AuditError(
            f"unsupported database {_shown(parsed)!r}: the audit schema supports "
            "sqlite:/// and postgresql+psycopg:// URLs"
        )
    return parsed


def _is_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:")


def _sqlite_uri_mode(url: URL) -> bool:
    return str(url.query.get("uri", "")).lower() in ("true", "1", "yes")


def _sqlite_url(url: URL, readonly: bool) -> URL:
    """Check a SQLite URL's file (and directory) and, for ``readonly``, make it a ``mode=ro`` URI."""
    if _is_memory(url) or _sqlite_uri_mode(url):
        return url  # in memory, or an explicit URI the caller built: PRAGMA query_only still applies
    path = Path(str(url.database))
    if not path.parent.is_dir():
        raise AuditError(
            f"cannot open SQLite database {str(path)!r}: directory {str(path.parent)!r} does not exist"
        )
    if not readonly:
        return url
    if not path.is_file():
        raise AuditError(f"no SQLite database at {str(path)!r} (create it with migrate first)")
    if path.with_name(path.name + "-journal").exists():
        _roll_back_crashed_writer(path)
    uri = "file:" + quote(str(path.resolve()))
    return url.set(database=uri, query={**url.query, "mode": "ro", "uri": "true"})


def _roll_back_crashed_writer(path: Path) -> None:
    """Roll back what a writer that died mid-transaction left in the file (a hot journal).
    A read-only connection cannot, and refuses every read until someone does ("attempt to
    write a readonly database"); a read on a read-write connection makes SQLite do it, as
    any client does on open. A journal of a writer still at work is not hot: then this read
    only waits for its lock, like any reader's."""
    try:
        with closing(sqlite3.connect(path, timeout=_SQLITE_BUSY_TIMEOUT)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise AuditError(f"cannot recover SQLite database {str(path)!r} after a crashed "
                         f"write: {e}") from None


def _pg_connect_args(url: URL, readonly: bool) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        args["connect_timeout"] = PG_CONNECT_TIMEOUT
    if "application_name" not in url.query:
        args["application_name"] = _APPLICATION_NAME
    if readonly:
        options = str(url.query.get("options", ""))
        args["options"] = (options + " -c default_transaction_read_only=on").strip()
        # Prepare every statement: the extended protocol carries exactly one statement.
        args["prepare_threshold"] = 0
    return args


def engine_for(url: str | URL, *, readonly: bool = False) -> Engine:
    """An engine for the audit database at ``url`` (nothing is connected yet).

    ``readonly``: the database itself refuses every write on this engine's
    connections (see the module docstring). A SQLite file must then exist; for a
    writable engine its directory must. Raises :class:`AuditError` for a
    malformed URL, an unsupported backend or a missing driver. The caller
    disposes of the engine.
    """
    parsed = _parse(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        parsed = _sqlite_url(parsed, readonly)
        kwargs["connect_args"] = {"timeout": _SQLITE_BUSY_TIMEOUT}
        if not _is_memory(parsed):
            kwargs["poolclass"] = pool.NullPool
    else:
        kwargs["connect_args"] = _pg_connect_args(parsed, readonly)
    try:
        engine = sqlalchemy.create_engine(parsed, **kwargs)
    except ArgumentError as e:  # includes NoSuchModuleError: an unknown dialect or driver
        raise AuditError(f"malformed database URL {_shown(parsed)!r}: {e}") from None
    except ImportError as e:
        raise AuditError(
            f"the database driver for {_shown(parsed)!r} is not installed: {e}"
        ) from None
    if engine.dialect.name == "sqlite":
        _sqlite_hooks(engine, readonly)
    return engine


_SQLITE_REFUSED = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH}


_SQLITE_GUARD_PRAGMAS = {"query_only", "writable_schema"}


def _read_only_authorizer(action: int, arg1: str | None, arg2: str | None,
                          _db: str | None, _source: str | None) -> int:
    """SQLite's authorizer for read-only connections: no ATTACH/DETACH (it creates files),
    and ``query_only``/``writable_schema`` may be read but not set (``query_only`` keeps
    every other write out, pragmas that write the file included)."""
    if action in _SQLITE_REFUSED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and arg2 is not None \
            and (arg1 or "").lower() in _SQLITE_GUARD_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _sqlite_hooks(engine: Engine, readonly: bool) -> None:
    """Make SQLite transactions real (DDL included) and, for ``readonly``, refuse every write.

    pysqlite opens transactions itself, and only before DML; with its handling
    off and ``BEGIN`` emitted by SQLAlchemy, a migration is one transaction, as
    on PostgreSQL.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        if readonly:
            dbapi_connection.execute("PRAGMA query_only = ON")
            # query_only alone can be switched off from SQL, and ATTACH creates a file:
            # the authorizer refuses both before they run (issue 15 item 13).
            dbapi_connection.set_authorizer(_read_only_authorizer)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")


# --------------------------------------------------------------------------- errors


def _db_message(e: BaseException) -> str:
    """The database's (or driver's) own message, without SQLAlchemy's decoration."""
    orig = getattr(e, "orig", None) or e
    return " ".join(str(orig).split()) or type(orig).__name__


def _is_write_refusal(e: DBAPIError) -> bool:
    orig = e.orig
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        # SQLITE_AUTH: the read-only authorizer refused it (ATTACH, query_only = OFF)
        return code is not None and code & 0xFF in (_SQLITE_READONLY, sqlite3.SQLITE_AUTH)
    return getattr(orig, "sqlstate", None) in (_PG_READ_ONLY_SQL_TRANSACTION,
                                               _PG_INSUFFICIENT_PRIVILEGE)


@contextmanager
def _connected(engine: Engine) -> Iterator[Connection]:
    """``engine.connect()`` with a failure to connect turned into :class:`AuditError`."""
    try:
        conn = engine.connect()
    except (DBAPIError, OSError) as e:
        raise AuditError(
            f"cannot connect to the audit database {_shown(engine.url)!r}: {_db_message(e)}"
        ) from None
    with conn:
        yield conn


def read_engine(url: str | URL) -> Engine:
    """A read-only engine (:func:`engine_for` with ``readonly``) on a database checked to be
    an audit database: what every audit read that is not a user's own SQL opens.

    Creates nothing: a SQLite file that does not exist is refused before any connection
    (``mode=ro`` would refuse it too). Raises :class:`AuditError` (one line naming the
    database) for a database that cannot be opened, is not a database at all (a text file)
    or has no audit tables (never migrated).
    """
    shown = _shown(_parse(url))  # as given, not the mode=ro URI a SQLite file is opened by
    engine = engine_for(url, readonly=True)
    try:
        with _connected(engine) as conn:
            try:
                found = sqlalchemy.inspect(conn).has_table("audit_progress")
            except DBAPIError as e:
                raise AuditError(f"cannot read the audit database {shown!r}: "
                                 f"{_db_message(e)}") from None
            finally:
                with suppress(SQLAlchemyError):
                    conn.rollback()
    except BaseException:
        engine.dispose()
        raise
    if not found:
        engine.dispose()
        raise AuditError(f"{shown!r} is not an audit database (it has no audit "
                         "tables: `jobreg audit migrate --db URL` creates them)")
    return engine


# --------------------------------------------------------------------------- migrations


_EXTRACTED: dict[str, Path] = {}


def _extracted(root: Any) -> Path:
    """The migrations of a zip, copied once per process into a temporary directory (Alembic
    reads its scripts from files)."""
    key = str(root)
    if key not in _EXTRACTED:
        out = Path(tempfile.mkdtemp(prefix="jobreg-migrations-"))
        atexit.register(shutil.rmtree, out, True)

        def copy(node: Any, into: Path) -> None:
            for child in node.iterdir():
                if child.is_dir():
                    (into / child.name).mkdir()
                    copy(child, into / child.name)
                else:
                    (into / child.name).write_bytes(child.read_bytes())

        copy(root, out)
        _EXTRACTED[key] = out
    return _EXTRACTED[key]


def migrations_dir() -> Path:
    """The Alembic script directory: package ``registry.migrations``, else the repo's ``migrations/``."""
    candidates: list[Path] = []
    try:
        root = importlib.resources.files(MIGRATIONS_PACKAGE)
    except (ModuleNotFoundError, TypeError, ValueError):
        root = None
    if isinstance(root, Path):  # a regular package's folder
        candidates.append(root)
    elif root is not None:  # a namespace package (no __init__.py): its directories
        spec = importlib.util.find_spec(MIGRATIONS_PACKAGE)
        if spec is not None:
            candidates.extend(Path(p) for p in (spec.submodule_search_locations or []))
    # jobreg imported from a zip or a wheel (spark-submit --py-files), where the namespace
    # package cannot be imported (zipimport needs directory entries, which wheels lack)
    archive = next((p for p in Path(__file__).parents if p.is_file()), None)
    if archive is not None and zipfile.is_zipfile(archive):
        inside = zipfile.Path(archive, MIGRATIONS_PACKAGE.replace(".", "/") + "/")
        if inside.is_dir():
            candidates.append(_extracted(inside))
    candidates.append(Path(__file__).resolve().parents[2] / "migrations")
    for path in candidates:
        if (path / "env.py").is_file() and (path / "versions").is_dir():
            return path
    raise AuditError(
        f"cannot find the audit migrations (package {MIGRATIONS_PACKAGE} or "
        f"{str(candidates[-1])!r}): reinstall jobreg"
    )


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic :class:`~alembic.config.Config` for the audit migrations, no ini file needed.

    With ``url``, ``sqlalchemy.url`` is set (e.g. for ``command.revision(cfg,
    autogenerate=True)`` when writing the next revision, or offline ``--sql``).
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("path_separator", "os")
    if url is not None:
        rendered = _parse(url).render_as_string(hide_password=False)
        cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return cfg


def _run_alembic(url: str | URL, action: str, revision: str) -> None:
    engine = engine_for(url)
    try:
        with _connected(engine) as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            try:
                with conn.begin():
                    if action == "upgrade":
                        command.upgrade(cfg, revision)
                    else:
                        command.downgrade(cfg, revision)
            except CommandError as e:
                raise AuditError(f"cannot {action} the audit schema to {revision!r}: {e}") from None
            except DBAPIError as e:
                raise AuditError(
                    f"the database refused the audit schema {action} to {revision!r}: "
                    f"{_db_message(e)}"
                ) from None
    finally:
        engine.dispose()


def migrate(url: str | URL, revision: str = "head") -> None:
    """Upgrade the audit schema at ``url`` to ``revision`` (``alembic upgrade``), in one transaction."""
    _run_alembic(url, "upgrade", revision)


def downgrade(url: str | URL, revision: str = "base") -> None:
    """Downgrade the audit schema at ``url`` to ``revision`` (``base``: drop every table and view)."""
    _run_alembic(url, "downgrade", revision)


def current_revision(url: str | URL) -> str | None:
    """The schema revision of the database at ``url`` (``None``: never migrated, or downgraded).

    Reads over a read-only connection; a SQLite file must exist.
    """
    engine = engine_for(url, readonly=True)
    try:
        with _connected(engine) as conn:
            try:
                return MigrationContext.configure(conn).get_current_revision()
            except (SQLAlchemyError, CommandError) as e:
                raise AuditError(f"cannot read the audit schema revision: {_db_message(e)}") from None
            finally:
                with suppress(SQLAlchemyError):
                    conn.rollback()
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- queries


READER_ROLE = "jobreg_audit_reader"
"""The PostgreSQL role with SELECT on the audit tables and views and nothing else
(migration 0005); :func:`query` runs as it whenever the connected user may."""


def _as_reader(conn: Connection) -> None:
    """``SET LOCAL ROLE`` :data:`READER_ROLE` when the connected user is a member (a
    superuser is a member of every role) and the role may read this database's audit
    tables (a database not migrated to 0005, on a cluster where another one created the
    role, has no grants for it)."""
    may = conn.execute(text(
        "SELECT coalesce(has_table_privilege(r.oid, to_regclass('audit_records'), 'SELECT'),"
        " false) FROM pg_roles r WHERE r.rolname = :role"
        " AND pg_has_role(current_user, r.oid, 'MEMBER')"), {"role": READER_ROLE}).scalar()
    if may:
        conn.exec_driver_sql(f"SET LOCAL ROLE {READER_ROLE}")


def query(
    url: str | URL,
    sql: str,
    params: dict[str, Any] | None = None,
    *,
    limit: int | None = None,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only SQL statement; returns (column names, rows), at most ``limit`` rows.

    ``params`` fill ``:name`` placeholders (SQLAlchemy ``text()``; write a cast of one as
    ``CAST(:name AS type)``, not ``:name::type``). The database refuses writes (see the
    module docstring): a write raises :class:`AuditError` saying the database
    refused it, with the database's own message. Nothing is ever committed.
    """
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"limit must be a non-negative integer or None, not {limit!r}")
    engine = engine_for(url, readonly=True)
    try:
        with _connected(engine) as conn:
            try:
                if engine.dialect.name == "postgresql":
                    # The login first: SET ROLE is no sandbox for one that may do more.
                    from .readers import refuse_more_than_reading  # it builds on this module

                    refuse_more_than_reading(conn)
                    _as_reader(conn)
                result = conn.execute(text(sql), params or {})
                if not result.returns_rows:
                    return [], []
                columns = list(result.keys())
                if limit is None:
                    fetched = result.fetchall()
                else:  # fetchmany(0) would mean "the driver's batch size"
                    fetched = result.fetchmany(limit) if limit > 0 else []
                return columns, [tuple(row) for row in fetched]
            except DBAPIError as e:
                if _is_write_refusal(e):
                    raise AuditError(
                        f"the database refused the write (read-only access): {_db_message(e)}"
                    ) from None
                raise AuditError(f"the database refused the query: {_db_message(e)}") from None
            except StatementError as e:  # e.g. a :placeholder without a value in params
                raise AuditError(f"invalid query: {_db_message(e)}") from None
            finally:
                with suppress(SQLAlchemyError):
                    conn.rollback()
    finally:
        engine.dispose()
