"""PostgreSQL fixtures: one throwaway cluster per test session, a fresh database per test.

``postgres_cluster`` (session) starts :class:`registry.dev.pgcluster.ThrowawayPostgres`
on 127.0.0.1 and stops it, by its pid, when the session ends. ``postgres_url``
(session) is the URL of the database ``jobreg_audit_test`` on it; ``pg_db``
(per test) creates a database of its own and drops it afterwards, so tests
never share state.

Without PostgreSQL server binaries the tests that need them are skipped, with
the reason, unless ``CI`` is set or ``JOBREG_REQUIRE_POSTGRES=1``: then they
fail, because CI must run them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from registry.dev.pgcluster import PostgresNotFound, ThrowawayPostgres

#: The session's shared database (``postgres_url``).
TEST_DATABASE = "jobreg_audit_test"


def postgres_required() -> bool:
    """True when missing PostgreSQL binaries must fail the tests instead of skipping them."""
    return bool(os.environ.get("CI")) or os.environ.get("JOBREG_REQUIRE_POSTGRES") == "1"


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[ThrowawayPostgres]:
    """A PostgreSQL cluster on a free 127.0.0.1 port for the whole session."""
    cluster = ThrowawayPostgres()
    try:
        cluster.start()
    except PostgresNotFound as e:
        if postgres_required():
            pytest.fail(f"PostgreSQL is required here (CI or JOBREG_REQUIRE_POSTGRES=1): {e}")
        pytest.skip(f"{e}; set JOBREG_REQUIRE_POSTGRES=1 to make this a failure")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_cluster: ThrowawayPostgres) -> str:
    """SQLAlchemy URL of the session's database ``jobreg_audit_test`` (psycopg 3)."""
    return postgres_cluster.create_database(TEST_DATABASE)


@pytest.fixture
def pg_db(postgres_cluster: ThrowawayPostgres) -> Iterator[str]:
    """SQLAlchemy URL of a database created for this test alone, dropped afterwards."""
    name = f"jobreg_t_{uuid.uuid4().hex[:16]}"
    url = postgres_cluster.create_database(name)
    try:
        yield url
    finally:
        postgres_cluster.drop_database(name)


#: The reader login :func:`reader_of` makes (roles belong to the cluster: one for the session).
READER_LOGIN = "jobreg_test_reader"
READER_PASSWORD = "reader-test-password"


def reader_of(url: str) -> str:
    """The URL of ``url``'s database as a login that only reads (``grant_reader``, idempotent),
    which ``query`` accepts; ``url`` itself when it is not PostgreSQL. The database must be
    migrated (0005 or later)."""
    import sqlalchemy as sa

    from registry.audit.readers import grant_reader

    if not url.startswith("postgresql"):
        return url
    grant_reader(url, READER_LOGIN, READER_PASSWORD)
    return sa.make_url(url).set(username=READER_LOGIN, password=READER_PASSWORD) \
        .render_as_string(hide_password=False)


def query_as_reader(url: str, sql: str, params: dict | None = None, **kwargs: object) -> tuple:
    """``registry.audit.db.query`` as a login that only reads (:func:`reader_of`): tests that
    read what a run wrote, on SQLite or on PostgreSQL (whose superuser ``query`` refuses)."""
    from registry.audit.db import query

    return query(reader_of(url), sql, params, **kwargs)  # type: ignore[arg-type]
