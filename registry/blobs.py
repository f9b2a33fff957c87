"""The content-addressed blob store for job graphs too large to travel inline.

A graph larger than the inline limit is written here first; the event then
carries a :class:`~registry.events.GraphRef` (uri, sha256, size). The rules:

* **Write before reference.** :meth:`BlobStore.put` returns only once the blob
  is complete and durable under its final name, so an event written after it
  never references a blob that is not there.
* **Verify on read.** :meth:`BlobStore.get` always checks size and sha256 and
  raises :class:`~registry.errors.BlobCorrupt` on a mismatch.
* **Never collect a referenced blob.** :func:`plan_collection` is a pure plan: a
  blob is deleted only if no job references its uri (a live job, or a terminal
  one whose result is not yet clean) *and* it is older than a grace period.
  Which jobs reference what is the fold's business, not this module's;
  :func:`collect` lists, plans and deletes.

**Key spaces.** One store (one directory) may be shared by every namespace of
every topic, so a store is divided into *spaces*, one per (topic, namespace):
:meth:`BlobStore.scoped` returns the view of one space, and a view's
:meth:`~BlobStore.put`, :meth:`~BlobStore.list` and :meth:`~BlobStore.delete`
only ever touch its own space. Content addressing (dedup) holds within a space:
two namespaces that store the same bytes hold a copy each. Garbage collection
runs on a view, so a namespace's collection lists and deletes only its own
space and can never delete another namespace's (or topic's) blob, whatever
that namespace's jobs are. Reading (:meth:`~BlobStore.get`,
:meth:`~BlobStore.exists`) works for a blob of any space of the store.

:class:`FileBlobStore` keeps blob ``<sha256>`` of namespace ``N`` on topic ``T``
at ``<root>/<T>/<N>/<sha256[:2]>/<sha256>`` and names it by the ``file://`` uri
of that absolute path (topics and namespaces are ids, :func:`~registry.keys.check_id`:
no ``/``, never ``.`` or ``..``). The unscoped store, ``FileBlobStore(root)``,
is the flat layout ``<root>/<sha256[:2]>/<sha256>`` that jobreg used before key
spaces: its blobs still load through any view, but no namespace's garbage
collection ever lists or deletes them; they are left for an operator (who may
run :func:`collect` on the unscoped store with the uris every namespace's jobs
reference).

**A crash mid-write** leaves at most a temporary file (``.tmp-*``) in the
blob's directory, never a partial blob under a final name: the bytes go to the
temporary file, which is flushed and fsynced, then renamed onto the final name
with :func:`os.replace` (atomic), and the directory is fsynced so the rename
survives a power loss. :meth:`FileBlobStore.list` never shows temporary files,
so garbage collection never sees them either; :meth:`FileBlobStore.sweep_temp`
removes leftovers older than an hour. A put that fails with an ``OSError``
removes its own temporary file and raises :class:`~registry.errors.BlobError`.
Re-putting the same bytes after a crash simply writes the blob again.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import hashlib
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .errors import BlobCorrupt, BlobError, BlobMissing, ConfigError, RegistryError
from .events import GraphRef
from .keys import check_id

__all__ = [
    "TEMP_PREFIX",
    "BlobInfo",
    "BlobStore",
    "CollectionReport",
    "FileBlobStore",
    "collect",
    "open_blob_store",
    "plan_collection",
]

TEMP_PREFIX = ".tmp-"
"""Name prefix of the temporary files a :class:`FileBlobStore` writes before the rename."""

_SHA256_NAME = re.compile(r"[0-9a-f]{64}")
_SHARD_NAME = re.compile(r"[0-9a-f]{2}")


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """One complete blob as a store lists it.

    ``uri`` is what a :class:`~registry.events.GraphRef` would carry,
    ``sha256`` the hex digest the blob is stored under (taken from its name,
    not recomputed), ``size`` its length in bytes and ``mtime`` its
    modification time in seconds since the Unix epoch (``st_mtime``).
    """

    uri: str
    sha256: str
    size: int
    mtime: float


class BlobStore(abc.ABC):
    """The small interface a blob store implements (a directory here; S3 or HDFS elsewhere).

    Blobs are content-addressed: the name is derived from the sha256 of the
    bytes, so putting the same bytes twice yields the same reference (within
    one space, see :meth:`scoped`).
    """

    def scoped(self, topic: str, namespace: str) -> BlobStore:
        """The view of this store's space for ``namespace`` on ``topic``.

        A view's :meth:`put`, :meth:`list` and :meth:`delete` touch only its own
        space, so garbage collection on it never deletes another space's blob;
        its :meth:`get` and :meth:`exists` read a blob of any space of the same
        store. Scoping a view again gives the view of the other space (never a
        space inside a space). :class:`~registry.client.Registry` uses the view
        of its own topic and namespace for every put and every collection.

        This default returns the store itself: a store that does not override
        it has one space, and must be given to one namespace of one topic only
        (its garbage collection sees, and may delete, everything in it).
        Raises :class:`ConfigError` for a malformed topic or namespace.
        """
        check_id("topic", topic)
        check_id("namespace", namespace)
        return self

    def contains(self, uri: str) -> bool:
        """Whether ``uri`` names a blob location of this store, in any of its spaces.

        :meth:`~registry.client.Term.submit` copies a caller's
        :class:`~registry.events.GraphRef` that the store contains into the
        submitting namespace's own space; one it does not contain is
        referenced as is and never collected. This default says ``False``
        (every caller's reference is foreign); a store that implements
        :meth:`scoped` should override it.
        """
        return False

    @abc.abstractmethod
    def put(self, data: bytes) -> GraphRef:
        """Store ``data`` and return its reference; idempotent and atomic.

        When this returns, the blob is complete and durable, so an event that
        references it may be written. The same bytes always give the same
        :class:`~registry.events.GraphRef`. Raises :class:`BlobError` if the
        blob cannot be written; no partial blob is ever visible.
        """

    @abc.abstractmethod
    def get(self, ref: GraphRef) -> bytes:
        """Return the bytes of ``ref``, verified against its size and sha256.

        Raises :class:`BlobMissing` if no blob is stored under ``ref.uri``,
        :class:`BlobCorrupt` if the stored bytes differ in size or sha256,
        :class:`ConfigError` if ``ref.uri`` does not belong to this store and
        :class:`BlobError` for any other failure to read.
        """

    @abc.abstractmethod
    def list(self) -> Iterator[BlobInfo]:
        """Yield every complete blob of this store's own space (never a temporary file)."""

    @abc.abstractmethod
    def delete(self, uri: str) -> bool:
        """Delete the blob at ``uri``: ``True`` if it deleted one, ``False`` if it was already gone.

        Raises :class:`ConfigError` if ``uri`` does not name a blob of this
        store's own space and :class:`BlobError` if the deletion fails.
        """

    def exists(self, ref: GraphRef) -> bool:
        """Whether a blob is stored under ``ref.uri`` (presence only; :meth:`get` verifies).

        This default reads the blob through :meth:`get`; a store should
        override it with something cheaper (a stat, a HEAD request).
        """
        try:
            self.get(ref)
        except BlobMissing:
            return False
        except BlobCorrupt:
            return True
        return True


class FileBlobStore(BlobStore):
    """A blob store in a local (or mounted) directory, one space per (topic, namespace).

    ``FileBlobStore(root)`` is the unscoped store: its own space is the flat
    layout ``<root>/<sha[:2]>/<sha>`` of the blobs written before key spaces.
    :meth:`scoped` gives the view of ``<root>/<topic>/<namespace>/<sha[:2]>/<sha>``.
    Every view reads (:meth:`get`, :meth:`exists`) a blob of any space of the
    root; :meth:`put`, :meth:`list`, :meth:`delete` and :meth:`sweep_temp` touch
    only the view's own space.

    The uri of a blob is ``Path.as_uri()`` of its absolute path. ``root`` is
    created if missing and resolved to an absolute path, so two stores opened
    on the same directory by different spellings produce the same uris. Spaces
    are told apart by directory name, so the root must be on a case-sensitive
    file system if topics or namespaces differ only by case.
    """

    space: tuple[str, str] | None
    """``(topic, namespace)`` of this view, or ``None`` for the unscoped (flat) store."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        """Open (creating if missing) the store at directory ``root``, unscoped."""
        path = Path(root).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.root = path.resolve(strict=True)
        except OSError as e:
            raise BlobError(f"cannot create blob store directory {str(path)!r}: {e}") from e
        if not self.root.is_dir():
            raise ConfigError(f"blob store root {str(self.root)!r} is not a directory")
        self.space = None
        self._dir = self.root  # this view's own space

    def __repr__(self) -> str:
        if self.space is None:
            return f"FileBlobStore({str(self.root)!r})"
        return f"FileBlobStore({str(self.root)!r}).scoped{self.space!r}"

    def scoped(self, topic: str, namespace: str) -> FileBlobStore:
        """The view of ``<root>/<topic>/<namespace>/`` (see :meth:`BlobStore.scoped`).

        Nothing is created until the first :meth:`put`. Raises
        :class:`ConfigError` unless both are ids (:func:`~registry.keys.check_id`),
        so a space can never lie outside the root or inside another space.
        """
        check_id("topic", topic)
        check_id("namespace", namespace)
        view = copy.copy(self)
        view.space = (topic, namespace)
        view._dir = self.root / topic / namespace
        return view

    def contains(self, uri: str) -> bool:
        """Whether ``uri`` names a blob location (present or not) of any space of this root."""
        try:
            self._path_of(uri)
        except ConfigError:
            return False
        return True

    # -- paths ---------------------------------------------------------------------------

    def _blob_path(self, sha256: str) -> Path:
        return self._dir / sha256[:2] / sha256

    def _path_of(self, uri: str) -> Path:
        """The path of the blob named by ``uri`` in any space of the root (or the flat layout).

        ConfigError unless it is ``<root>/<sha[:2]>/<sha>`` or
        ``<root>/<topic>/<namespace>/<sha[:2]>/<sha>`` with well-formed ids.
        """
        path = Path(os.path.normpath(_path_from_file_uri(uri)))
        name = path.name
        parts = path.relative_to(self.root).parts if path.is_relative_to(self.root) else ()
        if not (_SHA256_NAME.fullmatch(name) and parts[-2:] == (name[:2], name)
                and (len(parts) == 2 or (len(parts) == 4 and _is_id(parts[0])
                                         and _is_id(parts[1])))):
            raise ConfigError(
                f"uri {uri!r} does not name a blob in the store at {str(self.root)!r}"
            )
        return path

    def _own_path_of(self, uri: str) -> Path:
        """The path of the blob named by ``uri``; ConfigError unless it is in this view's space."""
        path = self._path_of(uri)
        if path != self._blob_path(path.name):
            raise ConfigError(
                f"uri {uri!r} names a blob outside this view's space {self._space_name()} "
                f"of the store at {str(self.root)!r}"
            )
        return path

    def _space_name(self) -> str:
        if self.space is None:
            return "(the flat layout)"
        return f"(topic {self.space[0]!r}, namespace {self.space[1]!r})"

    # -- the interface -------------------------------------------------------------------

    def put(self, data: bytes) -> GraphRef:
        """Store ``data`` atomically in this view's space and return its reference.

        If the blob already exists with the right size it is not rewritten,
        but its mtime is set to now so garbage collection treats it as young.
        Otherwise the bytes go to a ``.tmp-*`` file in the same directory,
        which is fsynced and renamed onto the final name; then the directory
        is fsynced. Raises :class:`BlobError` (naming the path) on failure.
        """
        data = bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        path = self._blob_path(sha)
        ref = GraphRef(path.as_uri(), sha, len(data))
        try:
            if os.stat(path).st_size == len(data):
                os.utime(path)
                return ref
        except FileNotFoundError:
            pass  # not there (or deleted just now): write it
        except OSError as e:
            raise BlobError(f"cannot check blob {str(path)!r}: {e}") from e

        shard = path.parent
        tmp = shard / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
        try:
            if not shard.is_dir():
                _make_dirs(shard, self.root)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(shard)
        except OSError as e:
            # The temp file may never have been created or may already be renamed;
            # if it cannot be removed, sweep_temp will get it.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise BlobError(f"cannot write blob {str(path)!r}: {e}") from e
        return ref

    def get(self, ref: GraphRef) -> bytes:
        """Read the blob of ``ref`` and verify its size, then its sha256 (see :meth:`BlobStore.get`)."""
        path = self._path_of(ref.uri)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != ref.size:
                    raise BlobCorrupt(
                        f"blob {str(path)!r} has {size} bytes, its reference says {ref.size}"
                    )
                data = f.read()
        except FileNotFoundError as e:
            raise BlobMissing(f"no blob at {str(path)!r}") from e
        except OSError as e:
            raise BlobError(f"cannot read blob {str(path)!r}: {e}") from e
        if len(data) != ref.size:  # changed while we read it
            raise BlobCorrupt(
                f"blob {str(path)!r} has {len(data)} bytes, its reference says {ref.size}"
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != ref.sha256:
            raise BlobCorrupt(
                f"blob {str(path)!r} has sha256 {digest}, its reference says {ref.sha256}"
            )
        return data

    def exists(self, ref: GraphRef) -> bool:
        """Whether a file is stored under ``ref.uri`` (a stat; the content is not verified)."""
        path = self._path_of(ref.uri)
        try:
            return stat.S_ISREG(os.stat(path).st_mode)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise BlobError(f"cannot check blob {str(path)!r}: {e}") from e

    def list(self) -> Iterator[BlobInfo]:
        """Yield every complete blob of this view's space, sorted by sha256.

        Temporary and stray files are skipped, and so is every other space
        (for the unscoped store: every scoped space; for a view: the flat layout).
        """
        for path in self._files(temp=False):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # deleted while we walked
            except OSError as e:
                raise BlobError(f"cannot stat blob {str(path)!r}: {e}") from e
            yield BlobInfo(path.as_uri(), path.name, st.st_size, st.st_mtime)

    def delete(self, uri: str) -> bool:
        """Delete the blob at ``uri`` of this view's space (see :meth:`BlobStore.delete`).

        Raises :class:`ConfigError` for a uri of another space, without touching it.
        """
        path = self._own_path_of(uri)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise BlobError(f"cannot delete blob {str(path)!r}: {e}") from e
        return True

    def sweep_temp(self, max_age_s: float = 3600, *, now: float | None = None) -> int:
        """Remove ``.tmp-*`` files (of this view's space) left by crashed writes whose mtime is
        at least ``max_age_s`` old.

        Returns how many were removed. Keep ``max_age_s`` well above the time a
        put takes: a younger temporary file may belong to a put in progress.
        """
        if not max_age_s >= 0:
            raise ConfigError(f"max_age_s must be >= 0, not {max_age_s!r}")
        cutoff = (time.time() if now is None else now) - max_age_s
        removed = 0
        for path in self._files(temp=True):
            try:
                if os.stat(path).st_mtime <= cutoff:
                    os.unlink(path)
                    removed += 1
            except FileNotFoundError:
                continue  # renamed into place or removed meanwhile
            except OSError as e:
                raise BlobError(f"cannot remove temporary file {str(path)!r}: {e}") from e
        return removed

    def _files(self, *, temp: bool) -> Iterator[Path]:
        """The blob files (or, with ``temp``, the temporary files) of every shard of this
        view's space, sorted."""
        try:
            shards = sorted(
                e.name
                for e in os.scandir(self._dir)
                if _SHARD_NAME.fullmatch(e.name) and e.is_dir()
            )
        except FileNotFoundError:
            return  # a space nothing was ever put in
        except OSError as e:
            raise BlobError(f"cannot list blob store {str(self._dir)!r}: {e}") from e
        for shard in shards:
            shard_path = self._dir / shard
            try:
                names = sorted(e.name for e in os.scandir(shard_path) if e.is_file())
            except FileNotFoundError:
                continue
            except OSError as e:
                raise BlobError(f"cannot list blob directory {str(shard_path)!r}: {e}") from e
            for name in names:
                if temp:
                    if name.startswith(TEMP_PREFIX):
                        yield shard_path / name
                elif _SHA256_NAME.fullmatch(name) and name[:2] == shard:
                    yield shard_path / name


def _is_id(name: str) -> bool:
    try:
        check_id("name", name)
    except ConfigError:
        return False
    return True


def _make_dirs(path: Path, root: Path) -> None:
    """Create ``path`` and its missing parents below ``root``, fsyncing each new entry's parent."""
    missing = []
    while path != root and not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        _fsync_dir(directory.parent)


def _fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or a new entry in it survives a power loss (POSIX)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _path_from_file_uri(uri: str) -> str:
    """The absolute local path of a ``file://`` uri; ConfigError for anything else."""
    parts = urlsplit(uri)
    if parts.scheme != "file":
        raise ConfigError(f"not a file:// uri: {uri!r}")
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise ConfigError(f"unsupported file uri {uri!r}: only file:///absolute/path")
    from urllib.request import url2pathname  # here: it imports http.client and email

    path = url2pathname(parts.path)
    if not os.path.isabs(path):
        raise ConfigError(f"file uri {uri!r} does not name an absolute path")
    return path


def open_blob_store(location: str | os.PathLike[str]) -> BlobStore:
    """Open the blob store at ``location``: a ``file:///path`` uri or a plain path.

    Both give a :class:`FileBlobStore` (the directory is created if missing).
    Any other scheme (``s3://``, ``hdfs://``) raises :class:`ConfigError`
    naming it.
    """
    if not isinstance(location, str):
        return FileBlobStore(location)
    if not location:
        raise ConfigError("blob store location is empty")
    scheme = urlsplit(location).scheme
    if scheme == "file":
        return FileBlobStore(_path_from_file_uri(location))
    if scheme:
        raise ConfigError(
            f"unsupported blob store scheme {scheme!r} in {location!r} "
            "(supported: file:// uris and plain paths)"
        )
    return FileBlobStore(location)


def plan_collection(
    referenced: Iterable[str], blobs: Iterable[BlobInfo], *, grace_s: float, now: float
) -> list[BlobInfo]:
    """Pure: the blobs to delete = not referenced AND mtime <= now - grace_s. Never one in `referenced`.

    ``referenced`` are the uris (strings) that jobs reference
    (:meth:`~registry.image.Image.referenced_blobs`); a blob is matched by exact uri. The result keeps the order of ``blobs``. Raises
    :class:`ConfigError` if ``grace_s`` is negative (or NaN) or if
    ``referenced`` is a single string or holds anything but strings (a
    mistake that would otherwise match nothing and plan every old blob).
    """
    if not grace_s >= 0:
        raise ConfigError(f"grace_s must be >= 0, not {grace_s!r}")
    if isinstance(referenced, str | bytes):
        raise ConfigError("referenced must be an iterable of uris, not a single string")
    live = set(referenced)
    bad = next((u for u in live if not isinstance(u, str)), None)
    if bad is not None:
        raise ConfigError(f"referenced must hold uri strings, not {type(bad).__name__}: {bad!r}")
    cutoff = now - grace_s
    return [b for b in blobs if b.uri not in live and b.mtime <= cutoff]


@dataclass(frozen=True, slots=True)
class CollectionReport:
    """What :func:`collect` did.

    ``deleted`` are the blobs it deleted; ``kept_referenced`` counts listed
    blobs kept because a live job references them (whatever their age);
    ``kept_young`` counts unreferenced blobs kept because they are younger
    than the grace period; ``errors`` holds one message per blob whose
    deletion failed. A planned blob that was already gone is in none of them.
    """

    deleted: tuple[BlobInfo, ...]
    kept_referenced: int
    kept_young: int
    errors: tuple[str, ...]


def collect(
    store: BlobStore,
    referenced: Iterable[str],
    *,
    grace_s: float,
    now: float | None = None,
    blobs: Iterable[BlobInfo] | None = None,
) -> CollectionReport:
    """List, plan, delete. Re-reads nothing; an error deleting one blob is reported and the rest go on.

    ``referenced`` must be every uri a live job references (from the fold) of
    every namespace whose blobs can be in ``store``'s own space: for a view from
    :meth:`BlobStore.scoped`, that namespace's; ``store.list()`` and
    ``store.delete`` never reach another space. ``now`` defaults to
    :func:`time.time`. The store is listed once (unless
    the caller passes the listing as ``blobs``) and the plan is
    :func:`plan_collection`. A failure to list raises :class:`BlobError`
    before anything is deleted.
    """
    if now is None:
        now = time.time()
    if isinstance(referenced, str | bytes):
        raise ConfigError("referenced must be an iterable of uris, not a single string")
    live = set(referenced)
    blobs = list(store.list() if blobs is None else blobs)
    plan = plan_collection(live, blobs, grace_s=grace_s, now=now)
    kept_referenced = sum(1 for b in blobs if b.uri in live)
    deleted: list[BlobInfo] = []
    errors: list[str] = []
    for blob in plan:
        try:
            if store.delete(blob.uri):
                deleted.append(blob)
        except (RegistryError, OSError) as e:
            errors.append(f"{blob.uri}: {e}")
    return CollectionReport(
        deleted=tuple(deleted),
        kept_referenced=kept_referenced,
        kept_young=len(blobs) - kept_referenced - len(plan),
        errors=tuple(errors),
    )
