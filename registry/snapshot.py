"""Snapshots of the fold's image: write an :class:`~registry.image.Image` to a file, read it back.

A snapshot is a cache, never a source of truth: the image it holds is exactly
(``==``, every field) the image the fold produced, so folding the rest of the
log onto it gives the image a full replay gives::

    fold(tail, read_snapshot(write_snapshot(p, fold(prefix, ns), ...)).image)
        == fold(prefix + tail, ns)

Any :class:`~registry.errors.ConfigError` from :func:`read_snapshot` (missing,
unreadable, truncated, corrupt, another namespace or topic, another format
version, written by a newer jobreg) means: replay the log from the start.

File layout (format ``jobreg-snapshot/1``)::

    line 1   the header: one line of JSON (ASCII) ending in "\\n"
             {"body_bytes": N, "body_encoding": "gzip+json", "body_sha256": "<hex>",
              "format": "jobreg-snapshot/1", "last_offset": ..., "namespace": ...,
              "partition": ..., "topic": ..., "written_at_ms": ...}
    rest     the body: exactly N bytes whose sha256 is body_sha256
             (:func:`encode_image` / :func:`decode_image`)

The body is gzip-compressed (``mtime`` 0), two lines of JSON: the field
names of every record type, then the image (map entries sorted by key, so the
same image always gives the same bytes)::

    {"format": "jobreg-snapshot/1",
     "types": {"JobView": ["job_id", "status", ...], "TermInfo": [...], ...}}
    <value>

where a ``<value>`` is, by its Python type:

* ``None``, ``bool``, ``int``, ``float``, ``str``: the JSON value itself;
* ``tuple``: a JSON array of values (an image holds no lists, so every array
  is a tuple; ``()`` and ``None`` stay apart);
* ``bytes``: ``{"bytes": "<base64>"}``;
* ``immutables.Map``: ``{"map": [[key, value], ...]}`` (keys are values too, so
  ``int`` epochs stay ``int`` and job ids stay ``str``);
* a record type (the image, its provenance, and the dataclasses and named
  tuples inside it): ``{"<TypeName>": [field values...]}``, the values in the
  order of ``types[TypeName]``, the field names at the time of writing.

Records are decoded by field name: a field the file lacks takes the type's
current default (so a field added later with a default still reads old
snapshots); a field the file has but the type no longer knows, an unknown
type, or a missing field without default is a :class:`ConfigError` (the
snapshot was written by another jobreg; replay instead).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import gzip
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import immutables

from .errors import ConfigError
from .events import (
    EMPTY_CHECKPOINTS,
    CheckpointState,
    CompletedCheckpoint,
    GraphRef,
    InlineGraph,
    now_ms,
)
from .fold import bulk
from .image import Decision, Image, JobView, LeaderView, Provenance, TermInfo

__all__ = [
    "BODY_ENCODING",
    "FORMAT",
    "Snapshot",
    "decode_image",
    "encode_image",
    "read_snapshot",
    "write_snapshot",
]

FORMAT = "jobreg-snapshot/1"
"""The format tag, in the file header and in the body; another tag is refused."""

BODY_ENCODING = "gzip+json"
"""How the body is encoded (named in the header)."""

_COMPRESS_LEVEL = 1  # measured: level 6 is 1.4-3x slower for 3-7% less size
_MAX_HEADER = 64 * 1024

_RECORD_TYPES: tuple[type, ...] = (
    Image,
    Provenance,
    JobView,
    TermInfo,
    Decision,
    LeaderView,
    InlineGraph,
    GraphRef,
    CheckpointState,
    CompletedCheckpoint,
)
_BYTES_TAG = "bytes"
_MAP_TAG = "map"
_PRIMITIVES = frozenset({str, int, type(None), bool, float})


@dataclass(frozen=True)
class Snapshot:
    """A snapshot as read back: the image and where it came from.

    ``topic`` and ``partition`` name the log the image folds (the image's
    provenance says up to which offset); ``written_at_ms`` is the writer's
    wall clock, for people only.
    """

    image: Image
    topic: str
    partition: int
    written_at_ms: int


# -- record types ----------------------------------------------------------------


def _field_names(cls: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return tuple(cls._fields)  # a NamedTuple


def _positional(cls: type) -> bool:
    """True if ``cls(*values)`` takes every field in order."""
    if dataclasses.is_dataclass(cls):
        return all(f.init and not f.kw_only for f in dataclasses.fields(cls))
    return True


def _getter(cls: type) -> Callable[[Any], Any] | None:
    """obj -> its field values, in field order (``None``: a named tuple is its values)."""
    if not dataclasses.is_dataclass(cls):
        return None
    names = _field_names(cls)
    if len(names) == 1:
        name = names[0]
        return lambda o: (getattr(o, name),)
    return attrgetter(*names)


_TYPES: dict[str, type] = {cls.__name__: cls for cls in _RECORD_TYPES}
_FIELDS: dict[str, tuple[str, ...]] = {name: _field_names(cls) for name, cls in _TYPES.items()}
_ENCODERS: dict[type, tuple[str, Callable[[Any], Any] | None]] = {
    cls: (cls.__name__, _getter(cls)) for cls in _RECORD_TYPES
}
assert not {_BYTES_TAG, _MAP_TAG} & set(_TYPES)


# -- the body codec ----------------------------------------------------------------
# A 100,000-job image holds about two million values: the hot loops test for
# plain values inline instead of calling a function for each, tuples of plain
# values go to json as they are (it writes a tuple as an array), and decoding
# lets json's own parser call back once per tagged object (object_pairs_hook).

_P = _PRIMITIVES
_EMPTY: tuple[()] = ()


def _enc(v: Any) -> Any:
    t = type(v)
    if t in _P:
        return v
    if t is tuple:
        if all(type(x) in _P for x in v):
            return v
        return [x if type(x) in _P else _enc(x) for x in v]
    rec = _ENCODERS.get(t)
    if rec is not None:
        if v is EMPTY_CHECKPOINTS:  # shared by most jobs: built once
            return _EMPTY_CHECKPOINTS_JSON
        name, getter = rec
        values = v if getter is None else getter(v)
        return {name: [x if type(x) in _P or x is _EMPTY else _enc(x) for x in values]}
    if t is bytes:
        return {_BYTES_TAG: base64.b64encode(v).decode("ascii")}
    if t is immutables.Map:
        try:
            items = sorted(v.items(), key=itemgetter(0))
        except TypeError:  # keys of mixed types: still a stable order
            items = sorted(v.items(), key=lambda kv: (type(kv[0]).__name__, repr(kv[0])))
        return {  # (key, value) tuples: json writes them as arrays
            _MAP_TAG: [
                kv
                if type(kv[0]) in _P and type(kv[1]) in _P
                else (
                    kv[0] if type(kv[0]) in _P else _enc(kv[0]),
                    kv[1] if type(kv[1]) in _P else _enc(kv[1]),
                )
                for kv in items
            ]
        }
    raise ConfigError(f"cannot snapshot a value of type {t.__qualname__}: {v!r:.80}")


# The fold shares EMPTY_CHECKPOINTS between jobs: encode it once, decode it to itself.
_EMPTY_CHECKPOINTS_JSON = json.loads(
    json.dumps(_enc(dataclasses.replace(EMPTY_CHECKPOINTS)), separators=(",", ":"))
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("ascii")


def encode_image(image: Image) -> bytes:
    """The snapshot body of ``image``: gzip-compressed JSON (module docstring). Deterministic."""
    if not isinstance(image, Image):
        raise ConfigError(f"encode_image needs an Image, not {type(image).__qualname__}")
    head = _dumps({"format": FORMAT, "types": {k: list(v) for k, v in _FIELDS.items()}})
    with bulk():
        text = _dumps(_enc(image))
    return gzip.compress(head + b"\n" + text, compresslevel=_COMPRESS_LEVEL, mtime=0)


def _tup(v: list[Any]) -> tuple[Any, ...]:
    """A JSON array (objects in it already decoded) as the tuple it was written from."""
    return tuple([x if type(x) is not list else _tup(x) if x else _EMPTY for x in v])


class _Decoder:
    """Decodes the tagged objects of one body (``object_pairs_hook``), given its ``types`` line."""

    def __init__(self, types: Any) -> None:
        if not isinstance(types, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v)
            for k, v in types.items()
        ):
            raise ValueError("'types' must map type names to lists of field names")
        self._written = types
        self._builders: dict[str, Callable[[Any], Any]] = {
            _BYTES_TAG: _bytes,
            _MAP_TAG: _map,
        }

    def hook(self) -> Callable[[list[tuple[str, Any]]], Any]:
        """The ``object_pairs_hook``: json calls it for every object, innermost first."""
        builders = self._builders
        plan = self._plan

        def hook(pairs: list[tuple[str, Any]]) -> Any:
            if len(pairs) != 1:
                raise ValueError(f"a tagged value has one key, not {[k for k, _ in pairs]!r:.80}")
            tag, inner = pairs[0]
            return (builders.get(tag) or plan(tag))(inner)

        return hook

    def _plan(self, name: str) -> Callable[[Any], Any]:
        cls = _TYPES.get(name)
        if cls is None:
            raise ValueError(f"unknown record type {name!r}")
        written = self._written.get(name)
        if written is None:
            raise ValueError(f"record type {name!r} is not in the body's 'types'")
        current = _FIELDS[name]
        unknown = [n for n in written if n not in current]
        if unknown:
            raise ValueError(f"{name} has fields {unknown} this jobreg does not know")
        if len(set(written)) != len(written):
            raise ValueError(f"{name} lists a field twice: {written}")
        n = len(written)
        build: Callable[[Any], Any]
        if tuple(written) == current and not dataclasses.is_dataclass(cls):
            make = cls._make  # type: ignore[attr-defined]

            def build(row: Any) -> Any:
                if type(row) is not list or len(row) != n:
                    raise ValueError(f"a {name} must be a list of {n} values")
                return make([x if type(x) is not list else _tup(x) if x else _EMPTY for x in row])

        elif tuple(written) == current and _positional(cls):
            shared_row, shared = _SHARED.get(cls, (None, None))

            def build(row: Any) -> Any:
                if type(row) is not list or len(row) != n:
                    raise ValueError(f"a {name} must be a list of {n} values")
                if row == shared_row:  # the fold shares this value between jobs; so do we
                    return shared
                return cls(*[x if type(x) is not list else _tup(x) if x else _EMPTY for x in row])

        else:  # an older (or reordered) field list: by name, missing fields take defaults
            names = tuple(written)

            def build(row: Any) -> Any:
                if type(row) is not list or len(row) != n:
                    raise ValueError(f"a {name} must be a list of {n} values")
                return cls(
                    **{
                        k: x if type(x) is not list else _tup(x)
                        for k, x in zip(names, row, strict=True)
                    }
                )

        self._builders[name] = build
        return build


_SHARED: dict[type, tuple[list[Any], Any]] = {
    CheckpointState: (_EMPTY_CHECKPOINTS_JSON["CheckpointState"], EMPTY_CHECKPOINTS)
}


def _bytes(inner: Any) -> bytes:
    if type(inner) is not str:
        raise ValueError("bytes must be a base64 string")
    return binascii.a2b_base64(inner, strict_mode=True)


def _map(pairs: Any) -> immutables.Map:
    if type(pairs) is not list:
        raise ValueError("a map must be a list of [key, value] pairs")
    if all(type(p) is list and len(p) == 2 and type(p[0]) is not list for p in pairs):
        out = dict(pairs)  # TypeError for an unhashable key (a map as a key)
    elif all(type(p) is list and len(p) == 2 for p in pairs):  # tuple keys
        out = {_tup(k) if type(k) is list else k: x for k, x in pairs}
    else:
        raise ValueError("a map must be a list of [key, value] pairs")
    if len(out) != len(pairs):
        raise ValueError("a map lists a key twice")
    if any(type(x) is list for x in out.values()):
        out = {k: x if type(x) is not list else _tup(x) for k, x in out.items()}
    return immutables.Map(out)


_MAP_FIELDS = ("jobs", "terms", "unsettled", "seen")
_DECISION_FIELDS = ("rejected", "ignored", "quarantined")


def _check_image(image: Any) -> Image:
    """Shallow type checks, so a well-formed body of the wrong shape is refused."""
    if type(image) is not Image:
        raise ValueError(f"the body holds a {type(image).__qualname__}, not an Image")
    if type(image.provenance) is not Provenance:
        raise ValueError("the image's provenance is not a Provenance")
    for name in _MAP_FIELDS:
        if type(getattr(image, name)) is not immutables.Map:
            raise ValueError(f"the image's {name} is not a map")
    for name in _DECISION_FIELDS:
        value = getattr(image, name)
        if type(value) is not tuple or any(type(d) is not Decision for d in value):
            raise ValueError(f"the image's {name} is not a tuple of Decisions")
    if any(type(j) is not JobView for j in image.jobs.values()):
        raise ValueError("the image's jobs are not all JobViews")
    if any(type(t) is not TermInfo for t in image.terms.values()):
        raise ValueError("the image's terms are not all TermInfos")
    return image


def decode_image(data: bytes) -> Image:
    """The image in a snapshot body (:func:`encode_image`'s inverse).

    Raises :class:`ConfigError` for anything that is not a body of this
    format, never a bare ``json``/``zlib``/``KeyError``.
    """
    try:
        text = gzip.decompress(data)
        head, sep, rest = text.partition(b"\n")
        header = json.loads(head)
        if not sep or not isinstance(header, dict) or "types" not in header:
            raise ValueError("not a snapshot body")
        if header.get("format") != FORMAT:
            raise ValueError(f"body format {header.get('format')!r:.80}, expected {FORMAT!r}")
        decoder = _Decoder(header["types"])
        with bulk():
            return _check_image(json.loads(rest, object_pairs_hook=decoder.hook()))
    except ConfigError:
        raise
    except (
        OSError,  # gzip.BadGzipFile
        EOFError,  # truncated gzip stream
        zlib.error,
        ValueError,  # json, unicode, base64 and our own checks
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        RecursionError,
        binascii.Error,
    ) as e:
        raise ConfigError(f"not a valid {FORMAT} body: {e}") from e


# -- files ---------------------------------------------------------------------


def write_snapshot(
    path: str | os.PathLike[str], image: Image, *, topic: str, partition: int
) -> Path:
    """Write a snapshot of ``image`` (folded from ``topic``/``partition``) to ``path``.

    Atomic: the file is written to a temporary file in the same directory,
    fsynced, and renamed over ``path`` (``os.replace``), then the directory
    is fsynced; a crash or error leaves any previous snapshot at ``path``
    intact (the temporary file is removed on error; a crash of the process
    itself can leave a ``.<name>.*.tmp`` behind). Returns the path. An
    ``OSError`` is raised as :class:`ConfigError` naming the path.
    """
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"topic must be a non-empty string, not {topic!r}")
    if type(partition) is not int or partition < 0:
        raise ConfigError(f"partition must be an int >= 0, not {partition!r}")
    target = Path(path)
    body = encode_image(image)
    header = {
        "body_bytes": len(body),
        "body_encoding": BODY_ENCODING,
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "format": FORMAT,
        "last_offset": image.provenance.last_offset,
        "namespace": image.namespace,
        "partition": partition,
        "topic": topic,
        "written_at_ms": now_ms(),
    }
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("ascii") + b"\n"
    directory = target.parent
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
        _fsync_dir(directory)
    except OSError as e:
        raise ConfigError(f"cannot write snapshot {str(target)!r}: {e}") from e
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return target


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


def read_snapshot(
    path: str | os.PathLike[str],
    *,
    namespace: str | None = None,
    topic: str | None = None,
    partition: int | None = None,
) -> Snapshot:
    """Read and check the snapshot at ``path``.

    Raises :class:`ConfigError` (naming the path) if the file cannot be read
    (the ``OSError`` is the ``__cause__``), is not a snapshot, has another
    format version, belongs to another ``namespace``/``topic``/``partition``
    than the ones given, or its body is truncated or corrupt (its size or
    sha256 differs from the header's).
    """
    where = str(Path(path))
    try:
        with open(path, "rb") as f:
            line = f.readline(_MAX_HEADER)
            body = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read snapshot {where!r}: {e}") from e
    header = _parse_header(line, where)
    if header.get("format") != FORMAT:
        raise ConfigError(
            f"{where!r} is a snapshot of format {header.get('format')!r:.80}; "
            f"this jobreg reads {FORMAT!r}"
        )
    try:
        h_ns, h_topic, h_part = header["namespace"], header["topic"], header["partition"]
        size, digest, written_at = (
            header["body_bytes"],
            header["body_sha256"],
            header["written_at_ms"],
        )
        encoding, last_offset = header["body_encoding"], header["last_offset"]
    except KeyError as e:
        raise ConfigError(f"snapshot {where!r}: the header lacks {e}") from None
    if encoding != BODY_ENCODING:
        raise ConfigError(f"snapshot {where!r}: unknown body encoding {encoding!r:.80}")
    if namespace is not None and h_ns != namespace:
        raise ConfigError(f"snapshot {where!r} is of namespace {h_ns!r}, not {namespace!r}")
    if topic is not None and h_topic != topic:
        raise ConfigError(f"snapshot {where!r} is of topic {h_topic!r}, not {topic!r}")
    if partition is not None and h_part != partition:
        raise ConfigError(f"snapshot {where!r} is of partition {h_part!r}, not {partition!r}")
    if len(body) != size:
        raise ConfigError(
            f"snapshot {where!r} is truncated or corrupt: body of {len(body)} bytes, "
            f"the header says {size!r}"
        )
    if hashlib.sha256(body).hexdigest() != digest:
        raise ConfigError(f"snapshot {where!r} is corrupt: the body's sha256 does not match")
    try:
        image = decode_image(body)
    except ConfigError as e:
        raise ConfigError(f"snapshot {where!r}: {e}") from e
    if (image.namespace, image.provenance.last_offset) != (h_ns, last_offset):
        raise ConfigError(
            f"snapshot {where!r}: the header says namespace {h_ns!r} at offset {last_offset!r}, "
            f"the image {image.namespace!r} at {image.provenance.last_offset!r}"
        )
    if type(h_topic) is not str or type(h_part) is not int or type(written_at) is not int:
        raise ConfigError(f"snapshot {where!r}: malformed header")
    return Snapshot(image=image, topic=h_topic, partition=h_part, written_at_ms=written_at)


def _parse_header(line: bytes, where: str) -> dict[str, Any]:
    if not line.endswith(b"\n"):
        raise ConfigError(f"{where!r} is not a jobreg snapshot (no header line)")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{where!r} is not a jobreg snapshot: {e}") from e
    if not isinstance(header, dict) or "format" not in header:
        raise ConfigError(f"{where!r} is not a jobreg snapshot (no format in its header)")
    return header
