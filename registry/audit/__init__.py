"""The SQL audit database: tables and views the fold's decisions are materialized into.

* :mod:`registry.audit.models`: the tables (SQLAlchemy declarative models).
* :mod:`registry.audit.db`: engines, Alembic migrations (``migrate``,
  ``downgrade``, ``current_revision``) and the read-only :func:`query` path.
* :mod:`registry.audit.readers`: who may run those queries on PostgreSQL (a login that can
  do no more than read) and :func:`~registry.audit.readers.grant_reader`, which makes one.
* :mod:`registry.audit.queries`: the named questions (``jobreg audit refused`` ...) as SQL
  over the views; plain data, so the CLI lists them without loading SQLAlchemy.
* :mod:`registry.audit.partition`: one Kafka partition's batch folded and committed in one
  transaction (generation fencing, snapshots), shared by the Spark tasks and ``--plain``.

The names below are loaded on first use, so importing a submodule such as
:mod:`registry.audit.queries` does not import SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DEFAULT_DB_URL": "db", "AuditError": "db", "alembic_config": "db",
    "current_revision": "db", "downgrade": "db", "engine_for": "db", "migrate": "db",
    "query": "db", "grant_reader": "readers", "TABLES": "models", "VIEWS": "models",
    "Base": "models",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
