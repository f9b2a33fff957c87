"""The fold runs per Kafka partition: ``audit_progress.generation`` fences the tasks of an
old run, ``audit_snapshots`` holds each namespace's fold state at the committed offset.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

Frozen, like 0001 to 0005 (the columns are spelled out here).

* ``audit_progress.generation``: the run that may write the partition. Every start of the
  audit job (Spark or plain) raises it for every partition of its stream; a task that
  carries another generation is refused (a zombie task of an old driver). Rows written
  before this revision read 0: such a partition has no snapshots yet, and the next start
  folds it once on the driver to write them.
* ``audit_snapshots``: per (stream, topic, namespace), the audit projection's state of
  the namespace (the fold's image in the snapshot encoding of ``registry.snapshot``, plus
  the per-term write counts and times) as of ``next_offset`` of its partition, written in
  the same transaction as the rows and the progress.

The downgrade drops both; a 0005 writer then folds the log from the start to catch up, as
it always did.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit_progress") as batch:
        batch.add_column(sa.Column("generation", sa.BigInteger(), nullable=False,
                                   server_default="0"))
    op.create_table(
        "audit_snapshots",
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("next_offset", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("stream", "topic", "namespace", name=op.f("pk_audit_snapshots")),
    )


def downgrade() -> None:
    op.drop_table("audit_snapshots")
    with op.batch_alter_table("audit_progress") as batch:
        batch.drop_column("generation")
