"""audit_jobs.reason: why a terminal job ended (its cancel's or terminate's reason).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Frozen, like 0001: the column is spelled out here, and ``tests/test_audit_schema.py``
checks that the database the revisions create matches the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit_jobs") as batch:
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_jobs") as batch:
        batch.drop_column("reason")
