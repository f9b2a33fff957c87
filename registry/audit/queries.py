"""The named audit questions: one SQL statement each over the views of
:mod:`registry.audit.models`, with the sentence that says what it answers.

``jobreg audit <name>`` runs them (:func:`registry.audit.db.query`, read-only); plain data,
so listing them costs no database library.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["NAMED_QUERIES", "NamedQuery"]


class NamedQuery(NamedTuple):
    """A question the audit database answers by name."""

    doc: str
    sql: str
    must_be_empty: bool = False
    """A row is a violation of a guarantee (the command then exits 1)."""


NAMED_QUERIES: dict[str, NamedQuery] = {
    "refused": NamedQuery(
        "Every refused write: who wrote it, with which epoch, and why.",
        'SELECT namespace, "offset", log_time, event_type, job_id, writer, epoch, '
        'expected_epoch, reason FROM refused_writes ORDER BY namespace, "partition", '
        '"offset"'),
    "terms": NamedQuery(
        "Every leadership term: when it was granted and ended (the current one: CURRENT), "
        "its duration and write counts.",
        "SELECT namespace, epoch, leader, granted_offset, granted_at, ended_at, "
        "COALESCE(ended_by, 'CURRENT') AS ended_by, duration_ms, accepted_writes, "
        "rejected_writes FROM leadership_terms ORDER BY namespace, epoch"),
    "results": NamedQuery(
        "Every job result (terminal job), dirty ones first, with what their cleanup "
        "must still delete (graph, retained checkpoints).",
        "SELECT namespace, job_id, status, dirty, graph_kind, graph_uri, "
        "held_checkpoints, reason, last_offset FROM audit_jobs "
        "WHERE status IN ('CANCELLED', 'FAILED', 'FINISHED') "
        "ORDER BY dirty DESC, namespace, job_id"),
    "resurrections": NamedQuery(
        "Jobs with accepted activity after they became terminal (must be empty; exit 1 "
        "if not).",
        'SELECT namespace, job_id, "offset", event_type, writer, job_status, '
        "terminal_offset, terminal_status FROM resurrections "
        'ORDER BY namespace, job_id, "offset"',
        must_be_empty=True),
}
"""Name -> question; the CLI makes one ``jobreg audit`` command of each."""
