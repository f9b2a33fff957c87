"""Alembic environment of the jobreg audit schema.

Run through :mod:`registry.audit.db` (``migrate``, ``downgrade``,
``alembic_config``), which configures Alembic programmatically: no
``alembic.ini`` is needed, so this works from an installed package. The caller
either passes an open connection in ``config.attributes["connection"]`` (what
``registry.audit.db`` does, so its error handling and timeouts apply) or sets
``sqlalchemy.url``. Offline mode (``--sql``) renders the SQL for that URL.

``render_as_batch`` is on so that future revisions can alter tables on SQLite
(which cannot ``ALTER`` most things in place); the models' naming convention
gives every constraint a name, which batch mode needs.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from registry.audit.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    """Render the migration SQL for ``sqlalchemy.url`` without connecting."""
    _configure(
        url=config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate over the given connection, or over a new one to ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database: set sqlalchemy.url or pass a connection")
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run_on(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
