"""Issue 26 item 1: ``jobreg audit query`` on PostgreSQL is read-only whatever URL it is given.

Run on the session's throwaway cluster (``tests/support/pg.py``), whose superuser is
``jobreg``, through the real CLI entry point.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from registry.audit.db import migrate

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
