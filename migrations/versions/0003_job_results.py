"""audit_jobs.dirty: a terminal job whose result is not yet cleaned up (Flink's job results).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

Frozen, like 0001 and 0002: the column is spelled out here, and
``tests/test_audit_schema.py`` checks that the database the revisions create matches the
models. Rows written before it read as clean (the results of jobs that ended before
jobreg kept results are clean).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit_jobs") as batch:
        batch.add_column(sa.Column("dirty", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("audit_jobs") as batch:
        batch.drop_column("dirty")
