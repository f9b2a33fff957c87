"""Writing a file atomically: the one way jobreg writes snapshots, dumps and reports.

A reader never sees half a file: the bytes go to a temporary file in the same
directory, which is flushed and fsynced, then renamed over the target
(:func:`os.replace`, atomic), and the directory is fsynced so the rename
lasts. The file gets the permissions any new file gets (``0666`` less the umask:
``-rw-r--r--`` under umask 022), as ``open()`` would give it; the temporary file's own
``0600`` is not kept. A file already at the target is replaced only when the caller's
``replaceable`` recognises it as one of jobreg's own outputs by its content (a dump, a
report), or with ``force``; anything else is refused with one line naming ``--force``
(checked before the write and again just before the rename). On any error the
temporary file is removed and the target left as it was; an ``OSError`` (a missing
directory, no permission, a full disk, a target in ``/proc``) is raised as one
:class:`~registry.errors.ConfigError` naming the target, not the temporary file. A crash of the process itself can leave a
``.<name>.*.tmp`` behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import ConfigError

__all__ = ["atomic_write", "check_replaceable", "umask"]


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc``); else
    set and restored at once."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_replaceable(target: Path, what: str,
                      replaceable: Callable[[Path], bool] | None) -> None:
    """:class:`~registry.errors.ConfigError` if something is at ``target`` that
    ``replaceable`` does not recognise as one of jobreg's own outputs (see
    :func:`atomic_write`; for a caller that refuses before a long computation)."""
    if os.path.lexists(target) and (replaceable is None or not target.is_file()
                                    or not replaceable(target)):
        raise ConfigError(f"will not replace {str(target)!r}: it is not a jobreg {what} "
                          "(--force replaces it)")


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], what: str, *,
                 replaceable: Callable[[Path], bool] | None = None,
                 force: bool = True) -> Iterator[BinaryIO]:
    """``with atomic_write(path, "snapshot") as f: f.write(...)``: ``path`` holds all of it
    or is untouched. ``what`` names the file in errors (``cannot write snapshot 'x': ...``).

    With ``force=False`` an existing ``path`` is replaced only if ``replaceable(path)``
    says it is one of jobreg's own outputs; else :class:`~registry.errors.ConfigError`
    before anything is written (``force=True``, the default, replaces whatever is there:
    a snapshot file is always jobreg's own).
    """
    target = Path(path)
    directory = target.parent
    tmp: str | None = None
    if not force:
        check_replaceable(target, what, replaceable)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())
            yield f
            f.flush()
            os.fsync(f.fileno())
        if not force:  # a file that appeared while this one was written
            check_replaceable(target, what, replaceable)
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
