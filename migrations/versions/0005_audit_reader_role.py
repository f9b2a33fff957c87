"""The PostgreSQL role ``jobreg_audit_reader``: SELECT on the audit tables and views, nothing
else. Read-only by privilege, under the read-only transaction ``jobreg audit query`` uses.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

On PostgreSQL:

* the role is created (``NOLOGIN``) if it does not exist; roles belong to the cluster, so
  several audit databases on one cluster share it;
* it gets ``USAGE`` on the schema and ``SELECT`` on every table and view in it, and on
  those later revisions create (default privileges of the migrating user);
* ``jobreg audit query`` (``registry.audit.db.query``) switches to it (``SET LOCAL ROLE``)
  whenever the connected user may: a write is then refused twice, by the read-only
  transaction and by missing privileges, so switching the transaction to read-write from
  SQL would still write nothing;
* ``jobreg audit grant-reader NAME`` (``registry.audit.readers.grant_reader``) makes a login
  in it for people who only read; ``audit query`` refuses a login that can do more than
  read (a statement can leave ``SET LOCAL ROLE``; issue 26).

A migrating user without the right to create roles gets a notice and no role: the
migration does not fail, and ``audit query`` then runs as the login, which must itself be
able to do no more than read. SQLite has no roles: nothing to do there. The downgrade revokes
this database's grants and keeps the role (other databases may use it).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE = "jobreg_audit_reader"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        BEGIN
            CREATE ROLE {ROLE} NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;  -- another database's migration created it just now
        WHEN insufficient_privilege THEN
            RAISE NOTICE 'jobreg: no right to create role {ROLE}; audit queries rely on '
                         'read-only transactions alone';
            RETURN;
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO {ROLE}', current_schema());
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO {ROLE}', current_schema());
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT ON TABLES TO {ROLE}',
                   current_schema());
END
$$""")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"""
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I REVOKE SELECT ON TABLES FROM {ROLE}',
                       current_schema());
        EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA %I FROM {ROLE}', current_schema());
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM {ROLE}', current_schema());
    END IF;
END
$$""")
