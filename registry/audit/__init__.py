"""The SQL audit database: tables and views the fold's decisions are materialized into.

* :mod:`registry.audit.models`: the tables (SQLAlchemy declarative models).
* :mod:`registry.audit.db`: engines, Alembic migrations (``migrate``,
  ``downgrade``, ``current_revision``) and the read-only :func:`query` path.
* :mod:`registry.audit.partition`: one Kafka partition's batch folded and committed in one
  transaction (generation fencing, snapshots), shared by the Spark tasks and ``--plain``.
"""

from __future__ import annotations

from .db import (
    DEFAULT_DB_URL,
    AuditError,
    alembic_config,
    current_revision,
    downgrade,
    engine_for,
    migrate,
    query,
)
from .models import TABLES, VIEWS, Base

__all__ = [
    "DEFAULT_DB_URL",
    "TABLES",
    "VIEWS",
    "AuditError",
    "Base",
    "alembic_config",
    "current_revision",
    "downgrade",
    "engine_for",
    "migrate",
    "query",
]
