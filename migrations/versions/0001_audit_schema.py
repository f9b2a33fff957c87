"""The audit schema: tables for the fold's decisions and image, and the audit views.

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Frozen: this revision spells out the schema instead of importing
``registry.audit.models``; ``tests/test_audit_schema.py`` checks that the
database it creates matches the models exactly. Every time is BIGINT
milliseconds since the Unix epoch. The views are plain SQL valid on both
SQLite and PostgreSQL; ``"offset"`` and ``"partition"`` are always quoted
(``OFFSET`` is reserved).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OUTCOMES = "'ACCEPTED', 'IGNORED', 'REJECTED', 'DUPLICATE', 'QUARANTINED'"
_JOB_STATUSES = "'ACTIVE', 'RECOVERY_FAILED', 'CANCELLED', 'FINISHED', 'FAILED'"
_TERMINAL = "'CANCELLED', 'FAILED', 'FINISHED'"
_CHECKPOINT_STATUSES = "'TRIGGERED', 'COMPLETED', 'FAILED', 'DISCARDED'"

#: name -> SELECT of every view, in creation order (dropped in reverse).
VIEWS: dict[str, str] = {
    # Every record the fold refused (fencing, CAS, job rules), with both epochs and the leader.
    "refused_writes": """
SELECT r.topic, r."partition", r."offset", r.log_time, r.namespace, r.event_type,
       r.event_id, r.job_id, r.writer, r.epoch, r.expected_epoch, r.actual_epoch,
       r.leader, r.reason, r.detail
FROM audit_records r
WHERE r.outcome = 'REJECTED'
""",
    # Every term; it ends when it is revoked or when the next term is granted.
    "leadership_terms": """
SELECT t.namespace, t.epoch, t.leader, t.granted_offset, t.revoked_offset, t.lease_ms,
       t.renewals, t.accepted_writes, t.rejected_writes, t.granted_at, t.revoked_at,
       n.epoch AS next_epoch,
       COALESCE(t.revoked_at, n.granted_at) AS ended_at,
       CASE WHEN t.revoked_offset IS NOT NULL THEN 'REVOKED'
            WHEN n.epoch IS NOT NULL THEN 'SUPERSEDED' END AS ended_by,
       COALESCE(t.revoked_at, n.granted_at) - t.granted_at AS duration_ms
FROM audit_terms t
LEFT JOIN audit_terms n
  ON n.namespace = t.namespace
 AND n.epoch = (SELECT MIN(m.epoch) FROM audit_terms m
                WHERE m.namespace = t.namespace AND m.epoch > t.epoch)
""",
    # Every record about a job, in log order per job (and registry topic).
    "job_history": """
SELECT r.namespace, r.job_id, r.topic, r."partition", r."offset", r.log_time,
       r.event_type, r.event_id, r.epoch, r.writer, r.outcome, r.accepted, r.reason,
       r.detail, r.job_status
FROM audit_records r
WHERE r.job_id IS NOT NULL
ORDER BY r.namespace, r.job_id, r.topic, r."partition", r."offset"
""",
    # Every CheckpointFailed record: counted (ACCEPTED), ignored with why (IGNORED), or refused.
    "checkpoint_failures": """
SELECT r.topic, r."partition", r."offset", r.log_time, r.namespace, r.job_id, r.epoch,
       r.writer, r.outcome,
       CASE r.outcome WHEN 'ACCEPTED' THEN TRUE WHEN 'IGNORED' THEN FALSE END AS counted,
       r.reason, r.detail, r.job_status
FROM audit_records r
WHERE r.event_type = 'CheckpointFailed'
""",
    # Accepted records that left a job live after an earlier accepted record had left it
    # terminal (same topic and partition, lower offset): the fold forbids it, so this view
    # is empty for every correct log. One row per offending record, with the first terminal
    # record of the job before it.
    "resurrections": f"""
SELECT r.namespace, r.job_id, r.topic, r."partition", r."offset", r.log_time,
       r.event_type, r.event_id, r.epoch, r.writer, r.outcome, r.job_status,
       t."offset" AS terminal_offset, t.log_time AS terminal_log_time,
       t.event_type AS terminal_event_type, t.job_status AS terminal_status
FROM audit_records r
JOIN audit_records t
  ON t.topic = r.topic AND t."partition" = r."partition"
 AND t.namespace = r.namespace AND t.job_id = r.job_id
 AND t."offset" = (SELECT MIN(f."offset") FROM audit_records f
                   WHERE f.topic = r.topic AND f."partition" = r."partition"
                     AND f.namespace = r.namespace AND f.job_id = r.job_id
                     AND f."offset" < r."offset" AND f.accepted
                     AND f.job_status IN ({_TERMINAL}))
WHERE r.accepted AND r.job_id IS NOT NULL
  AND r.job_status IS NOT NULL AND r.job_status NOT IN ({_TERMINAL})
""",
}


def upgrade() -> None:
    """Create the audit tables, their indexes and the views."""
    op.create_table(
        "audit_records",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("event_id", sa.Text(), nullable=True),
        sa.Column("event_type", sa.Text(), nullable=True),
        sa.Column("job_id", sa.Text(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.Column("writer", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=True),
        sa.Column("log_time", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("expected_epoch", sa.BigInteger(), nullable=True),
        sa.Column("actual_epoch", sa.BigInteger(), nullable=True),
        sa.Column("leader", sa.Text(), nullable=True),
        sa.Column("job_status", sa.String(length=32), nullable=True),
        sa.CheckConstraint(f"outcome IN ({_OUTCOMES})", name=op.f("ck_audit_records_outcome")),
        sa.CheckConstraint(
            "accepted = (outcome IN ('ACCEPTED', 'IGNORED'))",
            name=op.f("ck_audit_records_accepted_matches_outcome"),
        ),
        sa.CheckConstraint(
            f"job_status IN ({_JOB_STATUSES})", name=op.f("ck_audit_records_job_status")
        ),
        sa.PrimaryKeyConstraint("topic", "partition", "offset", name=op.f("pk_audit_records")),
    )
    op.create_index(
        op.f("ix_audit_records_namespace_job_id"), "audit_records", ["namespace", "job_id"]
    )
    op.create_index(
        op.f("ix_audit_records_namespace_outcome"), "audit_records", ["namespace", "outcome"]
    )

    op.create_table(
        "audit_jobs",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("owner_epoch", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("max_checkpoint_failures", sa.Integer(), nullable=False),
        sa.Column("retained_checkpoints", sa.Integer(), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("graph_kind", sa.String(length=8), nullable=True),
        sa.Column("last_offset", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(f"status IN ({_JOB_STATUSES})", name=op.f("ck_audit_jobs_status")),
        sa.CheckConstraint(
            "graph_kind IN ('inline', 'blob')", name=op.f("ck_audit_jobs_graph_kind")
        ),
        sa.PrimaryKeyConstraint("namespace", "job_id", name=op.f("pk_audit_jobs")),
    )

    op.create_table(
        "audit_terms",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("leader", sa.Text(), nullable=False),
        sa.Column("granted_offset", sa.BigInteger(), nullable=False),
        sa.Column("revoked_offset", sa.BigInteger(), nullable=True),
        sa.Column("lease_ms", sa.BigInteger(), nullable=True),
        sa.Column("renewals", sa.BigInteger(), nullable=False),
        sa.Column("accepted_writes", sa.BigInteger(), nullable=False),
        sa.Column("rejected_writes", sa.BigInteger(), nullable=False),
        sa.Column("granted_at", sa.BigInteger(), nullable=True),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("namespace", "epoch", name=op.f("pk_audit_terms")),
    )

    op.create_table(
        "audit_checkpoints",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("counted", sa.Boolean(), nullable=True),
        sa.Column("ignored_reason", sa.Text(), nullable=True),
        sa.Column("location", sa.Text(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("last_offset", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            f"status IN ({_CHECKPOINT_STATUSES})", name=op.f("ck_audit_checkpoints_status")
        ),
        sa.PrimaryKeyConstraint(
            "namespace", "job_id", "checkpoint_id", name=op.f("pk_audit_checkpoints")
        ),
    )

    op.create_table(
        "audit_quarantine",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("log_time", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("topic", "partition", "offset", name=op.f("pk_audit_quarantine")),
    )

    op.create_table(
        "audit_progress",
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("next_offset", sa.BigInteger(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("stream", "topic", "partition", name=op.f("pk_audit_progress")),
    )

    for name, select in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {select.strip()}")


def downgrade() -> None:
    """Drop the views, the indexes and the tables."""
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_index(op.f("ix_audit_records_namespace_outcome"), table_name="audit_records")
    op.drop_index(op.f("ix_audit_records_namespace_job_id"), table_name="audit_records")
    for table in (
        "audit_progress",
        "audit_quarantine",
        "audit_checkpoints",
        "audit_terms",
        "audit_jobs",
        "audit_records",
    ):
        op.drop_table(table)
