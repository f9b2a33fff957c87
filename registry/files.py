"""Writing a file atomically: the one way jobreg writes snapshots, dumps and reports.

A reader never sees half a file: the bytes go to a temporary file in the same
directory, which is flushed and fsynced, then renamed over the target
(:func:`os.replace`, atomic), and the directory is fsynced so the rename
lasts. On any error the temporary file is removed and the target left as it
was; an ``OSError`` (a missing directory, no permission, a full disk, a target
in ``/proc``) is raised as one :class:`~registry.errors.ConfigError` naming
the target, not the temporary file. A crash of the process itself can leave a
``.<name>.*.tmp`` behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import ConfigError

__all__ = ["atomic_write"]


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], what: str) -> Iterator[BinaryIO]:
    """``with atomic_write(path, "snapshot") as f: f.write(...)``: ``path`` holds all of it
    or is untouched. ``what`` names the file in errors (``cannot write snapshot 'x': ...``)."""
    target = Path(path)
    directory = target.parent
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
        _fsync_dir(directory)
    except OSError as e:
        reason = e.strerror or str(e)
        raise ConfigError(f"cannot write {what} {str(target)!r}: {reason}") from e
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
