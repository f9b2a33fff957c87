"""audit_jobs.graph_uri and audit_jobs.held_checkpoints: what a job holds, so what a dirty
result's cleanup must delete.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

Frozen, like 0001 to 0003: the columns are spelled out here, and
``tests/test_audit_schema.py`` checks that the database the revisions create matches the
models.

* ``graph_uri``: the blob's URI when ``graph_kind`` is ``'blob'`` (a live job's graph, or
  the one a dirty result holds); ``NULL`` for an inline graph or none.
* ``held_checkpoints``: how many completed checkpoints the job holds (the retained ones:
  what recovery may restore, and what a dirty result's cleanup must delete; 0 once the
  result is clean). ``NULL`` on rows written before this revision, until their job next
  changes: the audit database keeps no graph or checkpoint list to fill them from (only
  the log does: rewrite the audit from the log to have them everywhere).
  ``jobreg audit check`` compares both columns only on rows that have them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit_jobs") as batch:
        batch.add_column(sa.Column("graph_uri", sa.Text(), nullable=True))
        batch.add_column(sa.Column("held_checkpoints", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_jobs") as batch:
        batch.drop_column("held_checkpoints")
        batch.drop_column("graph_uri")
