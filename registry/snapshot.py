"""Snapshots of the fold's image: write an :class:`~registry.image.Image` to a file, read it back.

A snapshot is a cache, never a source of truth: the image it holds is exactly
(``==``, every field, the same types) the image the fold produced, so folding
the rest of the log onto it gives the image a full replay gives::

    fold(tail, read_snapshot(write_snapshot(p, fold(prefix, ns), ...)).image)
        == fold(prefix + tail, ns)

Any :class:`~registry.errors.ConfigError` from :func:`read_snapshot` (missing,
unreadable, truncated, corrupt, another namespace or topic, another format
version, written by a newer jobreg, or under other fold rules: :class:`StaleSnapshot`)
means: replay the log from the start.

File layout (format ``jobreg-snapshot/2``)::

    line 1   the header: one line of JSON (ASCII) ending in "\\n"
             {"body_bytes": N, "body_encoding": "gzip+json+raw", "body_sha256": "<hex>",
              "format": "jobreg-snapshot/2", "last_offset": ..., "namespace": ...,
              "partition": ..., "topic": ..., "written_at_ms": ...}
    rest     the body: exactly N bytes whose sha256 is body_sha256
             (:func:`encode_image` / :func:`decode_image`)

The body is gzip-compressed (level 1, ``mtime`` 0): two lines of JSON, then
raw bytes::

    {"format": "jobreg-snapshot/2", "rules": "<RULES: the fold rules it was written under>",
     "types": {"JobView": ["job_id", "status", ...], "TermInfo": [...], ...}}
    <column>
    <blob: every bytes value (inline graphs), concatenated>

The image is stored *column-wise*: a ``<column>`` is a list of values (here a
list of one: the image), written as one of

* a JSON array: plain values (``None``, ``bool``, ``int``, ``float``, ``str``)
  as themselves;
* ``{"const": [value, n]}``: ``n`` times the same plain value;
* ``{"shared": [name, n]}``: ``n`` times a value the fold shares between jobs
  (``EMPTY_CHECKPOINTS``; a value equal to it is read back as it);
* ``{"tuple": [<lengths>, <items>]}``: tuples, their items in one column;
* ``{"bytes": [start, <lengths>]}``: bytes, concatenated in the blob from
  ``start``;
* ``{"map": [<lengths>, <keys>, <values>]}``: ``immutables.Map``\\ s, entries
  sorted by key (the same image always gives the same bytes); ``<keys>`` may be
  ``{"key": field}``: each key is that field of its value (a job's id);
* ``{"rec": [TypeName, n, [<column>, ...]]}``: ``n`` records of a record type
  (the image, its provenance, the dataclasses and named tuples inside it),
  one column per field in the order of ``types[TypeName]``, the field names
  at the time of writing;
* ``{"union": [<tags>, [<column>, ...]]}``: values of several kinds; value
  ``i`` is the next one of column ``tags[i]``;

where ``<lengths>`` and ``<tags>`` are columns of ints. So a 100,000-job image
reads with one plain ``json.loads`` and a few loops (in C) over whole
columns, instead of a callback per value, and bytes are never base64.

Records are decoded by field name: a field the file lacks takes the type's
current default (so a field added later with a default still reads old
snapshots); a field the file has but the type no longer knows, an unknown
type, or a missing field without default is a :class:`ConfigError` (the
snapshot was written by another jobreg; replay instead).

Files of format ``jobreg-snapshot/1`` (body encoding ``gzip+json``: gzip'd
JSON with a tagged object per record, bytes value and map) are still read;
only ``/2`` is written.
"""

from __future__ import annotations

import binascii
import dataclasses
import gc
import gzip
import hashlib
import io
import json
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, chain, compress, repeat
from operator import attrgetter, is_, itemgetter
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
    VertexParallelism,
    now_ms,
)
from .files import atomic_write
from .fold import bulk
from .image import (
    CheckpointRecords,
    Decision,
    Image,
    JobView,
    LeaderInfo,
    LeaderView,
    LogRecord,
    Provenance,
    TermInfo,
)

__all__ = [
    "BODY_ENCODING",
    "FORMAT",
    "READABLE_FORMATS",
    "RULES",
    "Snapshot",
    "StaleSnapshot",
    "decode_image",
    "encode_image",
    "read_snapshot",
    "write_snapshot",
]

FORMAT = "jobreg-snapshot/3"
"""The format tag written, in the file header and in the body."""

def _rules_digest() -> str:
    """A digest of the source of the code that decides what an image holds (the rules, the
    events, the image, the keys, the fold's entry points and the codec): a snapshot is a
    cache of one fold, and an image folded under other rules may lack what these rules keep
    (the eleventh read's A3 fix added ``Image.call_members``, whose value for an older image
    is not its default: the twelfth read's D5), so a body written under other rules is not
    read."""
    import importlib

    modules = [importlib.import_module(f"registry.{name}")
               for name in ("rules", "events", "image", "keys", "fold", "wire")]
    wire_dir = Path(modules[-1].__file__ or "").parent
    sources = [Path(m.__file__ or "") for m in modules[:-1]]
    sources += sorted(wire_dir.glob("*.py"))
    digest = hashlib.sha256()
    for source in sources:
        try:
            digest.update(source.name.encode() + b"\0" + source.read_bytes())
        except OSError:  # no source beside the code: its name and jobreg's version
            import importlib.metadata

            try:
                version = importlib.metadata.version("jobreg")
            except importlib.metadata.PackageNotFoundError:
                version = "?"
            digest.update(f"{source.name} {version}".encode())
    return digest.hexdigest()[:16]


RULES = _rules_digest()
"""The fold rules a body is written under (in its first line); one of other rules is
refused with :class:`StaleSnapshot`."""


class StaleSnapshot(ConfigError):
    """A snapshot body written under other fold rules (:data:`RULES`): replay the log."""


BODY_ENCODING = "gzip+json+raw"
"""How the body is encoded (named in the header)."""

READABLE_FORMATS: dict[str, str] = {FORMAT: BODY_ENCODING}
"""The format tags read (any other is refused), each with its body encoding. Formats 1
and 2 held the image of jobreg 0.1 (every term and every event id ever folded), which
this jobreg no longer has: such a snapshot is refused, and the log replayed."""

# Measured on 100,000 jobs with 200-byte graphs: gzip level 1 adds ~10% to reading
# (inflating is fast) and makes files of compressible graphs ~10x smaller (2.5 MB,
# not 25 MB); writing graphs that do not compress, it costs ~0.5 s (still faster
# than format 1 wrote). Level 6 is slower again for a few % less size.
_COMPRESS_LEVEL = 1
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib reads (and checks) the gzip header and trailer
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
    VertexParallelism,  # a job's resource requirements (CheckpointState.requirements)
    LogRecord,  # the records of calls waiting for their commit (Image.calls)
    LeaderInfo,  # the current term's leader information (Image.leaders)
    CheckpointRecords,  # the checkpoint records under keys of their own (fold rule 6)
)
_PRIMITIVES = frozenset({str, int, type(None), bool, float})

# Values the fold shares between records: written by name, read back as the one object.
_SHARED: dict[str, Any] = {"EMPTY_CHECKPOINTS": EMPTY_CHECKPOINTS}
_SHARED_BY_TYPE: dict[type, tuple[str, Any]] = {type(v): (k, v) for k, v in _SHARED.items()}


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


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return tuple(cls._fields)  # a NamedTuple


def _positional(cls: type) -> bool:
    """True if ``cls(*values)`` takes every field in order."""
    if dataclasses.is_dataclass(cls):
        return all(f.init and not f.kw_only for f in dataclasses.fields(cls))
    return True


def _default(cls: type, name: str) -> Callable[[], Any] | None:
    """The default of field ``name`` of ``cls`` as a factory, ``None`` if it has none."""
    if dataclasses.is_dataclass(cls):
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        if f.default is not dataclasses.MISSING:
            value = f.default
            return lambda: value
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory
        return None
    defaults = cls._field_defaults  # type: ignore[attr-defined]
    if name in defaults:
        value = defaults[name]
        return lambda: value
    return None


_TYPES: dict[str, type] = {cls.__name__: cls for cls in _RECORD_TYPES}
_FIELDS: dict[str, tuple[str, ...]] = {name: _field_names(cls) for name, cls in _TYPES.items()}
_TYPES_LINE = {k: list(v) for k, v in _FIELDS.items()}


# -- format 2: the body codec -------------------------------------------------------
# A 100,000-job image holds about two million values. Writing turns each
# collection into columns (one list per record field) with loops in C (zip,
# map, sorted); reading is one json.loads without hooks, then one C loop per
# column (map over tuple.__new__, slices of the blob, immutables.Map(zip(...))).

_PLAIN = object()  # the union kind of plain values


def _sorted_items(m: immutables.Map[Any, Any]) -> list[tuple[Any, Any]]:
    try:
        return sorted(m.items(), key=itemgetter(0))
    except TypeError:  # keys of mixed types: still a stable order
        return sorted(m.items(), key=lambda kv: (type(kv[0]).__name__, repr(kv[0])))


class _Writer:
    """Encodes columns (lists of values) for one body, collecting the blob."""

    def __init__(self) -> None:
        self.blob: list[bytes] = []
        self.blob_size = 0

    def column(self, values: Sequence[Any]) -> Any:
        types = set(map(type, values))
        if types <= _PRIMITIVES:
            n = len(values)
            if n > 1 and len(types) == 1 and float not in types and values.count(values[0]) == n:
                return {"const": [values[0], n]}
            return values  # json writes a tuple as an array too
        if len(types) == 1:
            (t,) = types
            if t not in _SHARED_BY_TYPE:
                return self._typed(t, values)
        return self._union(values, types)

    def _typed(self, t: type, values: Sequence[Any]) -> Any:
        """The column of ``values``, all of the non-plain type ``t``."""
        if t is tuple:
            return {
                "tuple": [
                    self.column(list(map(len, values))),
                    self.column(list(chain.from_iterable(values))),
                ]
            }
        if t is bytes:
            lengths = list(map(len, values))
            start = self.blob_size
            self.blob.extend(values)
            self.blob_size += sum(lengths)
            return {"bytes": [start, self.column(lengths)]}
        if t is immutables.Map:
            return self._maps(values)
        name = t.__name__
        if _TYPES.get(name) is t:
            return {"rec": [name, len(values), [self.column(c) for c in _columns(t, values)]]}
        v = values[0]
        raise ConfigError(f"cannot snapshot a value of type {t.__qualname__}: {v!r:.80}")

    def _union(self, values: Sequence[Any], types: set[type]) -> Any:
        """The column of ``values`` of several kinds (plain, a shared value, each other type)."""
        kinds: list[Any] = list(map(type, values))
        if not types.isdisjoint(_PRIMITIVES):
            kinds = [_PLAIN if k in _PRIMITIVES else k for k in kinds]
        for t in types & _SHARED_BY_TYPE.keys():
            name, shared = _SHARED_BY_TYPE[t]
            kinds = [
                name if k is t and (v is shared or v == shared) else k
                for k, v in zip(kinds, values, strict=True)
            ]
        order = list(dict.fromkeys(kinds))  # first seen first
        if len(order) == 1:
            return self._group(order[0], values)
        tags = list(map({k: i for i, k in enumerate(order)}.__getitem__, kinds))
        columns = [
            self._group(k, list(compress(values, map(is_, kinds, repeat(k))))) for k in order
        ]
        return {"union": [self.column(tags), columns]}

    def _group(self, kind: Any, values: Sequence[Any]) -> Any:
        if kind is _PLAIN:
            return self.column(values)
        if type(kind) is str:  # a shared value's name
            return {"shared": [kind, len(values)]}
        return self._typed(kind, values)

    def _maps(self, maps: Sequence[immutables.Map[Any, Any]]) -> Any:
        lengths = list(map(len, maps))
        keys: list[Any] = []
        values: list[Any] = []
        for m in maps:
            items = _sorted_items(m)
            keys += map(itemgetter(0), items)
            values += map(itemgetter(1), items)
        values_column = self.column(values)
        if type(values_column) is dict and "rec" in values_column:
            keys_column = self._keys(keys, values)
        else:
            keys_column = self.column(keys)
        return {"map": [self.column(lengths), keys_column, values_column]}

    def _keys(self, keys: list[Any], records: list[Any]) -> Any:
        """The keys column: ``{"key": field}`` if every key is the first field of its record."""
        key_types = set(map(type, keys))
        if len(key_types) == 1 and key_types <= {str, int}:
            field = _FIELDS[type(records[0]).__name__][0]
            firsts = list(map(attrgetter(field), records))
            if set(map(type, firsts)) == key_types and firsts == keys:
                return {"key": field}
        return self.column(keys)


def _columns(t: type, records: Sequence[Any]) -> list[Sequence[Any]]:
    """The field columns of ``records`` (all of type ``t``), in field order."""
    names = _FIELDS[t.__name__]
    if not dataclasses.is_dataclass(t):  # a named tuple is its values
        return list(zip(*records, strict=True)) if records else [()] * len(names)
    return [list(map(attrgetter(name), records)) for name in names]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("ascii")


def encode_image(image: Image) -> bytes:
    """The snapshot body of ``image`` (module docstring). Deterministic."""
    if not isinstance(image, Image):
        raise ConfigError(f"encode_image needs an Image, not {type(image).__qualname__}")
    head = _dumps({"format": FORMAT, "rules": RULES, "types": _TYPES_LINE})
    writer = _Writer()
    with bulk():
        value = _dumps(writer.column([image]))
        text = b"".join([head, b"\n", value, b"\n", *writer.blob])
        return gzip.compress(text, compresslevel=_COMPRESS_LEVEL, mtime=0)


def _written_fields(name: Any, types: dict[str, Any]) -> tuple[type, Any, Any]:
    """The class, the fields as the body lists them, and this jobreg's fields of ``name``.

    Raises ``ValueError`` (made a ConfigError by the caller) for an unknown
    type, one the body does not list, an unknown field or a repeated one.
    """
    cls = _TYPES.get(name) if type(name) is str else None
    if cls is None:
        raise ValueError(f"unknown record type {name!r:.80}")
    written = types.get(name)
    if written is None:
        raise ValueError(f"record type {name!r} is not in the body's 'types'")
    current = _FIELDS[name]
    unknown = [f for f in written if f not in current]
    if unknown:
        raise ValueError(f"{name} has fields {unknown} this jobreg does not know")
    if len(set(written)) != len(written):
        raise ValueError(f"{name} lists a field twice: {written}")
    return cls, written, current


class _Rows(list):  # type: ignore[type-arg]
    """Records decoded from a ``rec`` column, with that column's type and field columns."""

    __slots__ = ("cls", "fields")

    cls: type
    fields: dict[str, list[Any]]


class _Reader:
    """Decodes the columns of one body, given its ``types`` line and its blob."""

    def __init__(self, types: Any, data: bytes, blob_start: int) -> None:
        if not isinstance(types, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v)
            for k, v in types.items()
        ):
            raise ValueError("'types' must map type names to lists of field names")
        self._written = types
        self._data = data
        self._blob_start = blob_start
        self.blob_used = 0
        self._blob: io.BytesIO | None = None
        self._value_types: dict[int, set[type]] = {}  # id(map) -> the types of its values
        self._kinds: dict[str, Callable[[list[Any]], list[Any]]] = {
            "const": self._const,
            "shared": self._shared,
            "tuple": self._tuple,
            "bytes": self._bytes,
            "map": self._map,
            "rec": self._rec,
            "union": self._union,
        }
        self._builders: dict[str, Callable[[int, Any], _Rows]] = {}

    def value_types(self, m: immutables.Map[Any, Any]) -> set[type]:
        """The types of the values of ``m`` (a map this reader built: known without a walk)."""
        known = self._value_types.get(id(m))
        return set(map(type, m.values())) if known is None else known

    def column(self, col: Any) -> list[Any]:
        if type(col) is list:
            return col
        if type(col) is not dict or len(col) != 1:
            raise ValueError(f"a column is an array or an object with one key: {col!r:.80}")
        ((kind, arg),) = col.items()
        decode = self._kinds.get(kind)
        if decode is None:
            raise ValueError(f"unknown column kind {kind!r:.80}")
        if type(arg) is not list:
            raise ValueError(f"a {kind} column holds an array")
        return decode(arg)

    def _counts(self, col: Any) -> list[int]:
        counts = self.column(col)
        if not set(map(type, counts)) <= {int} or (counts and min(counts) < 0):
            raise ValueError("lengths and tags must be ints >= 0")
        return counts

    @staticmethod
    def _count(n: Any) -> int:
        if type(n) is not int or n < 0:
            raise ValueError(f"a count must be an int >= 0, not {n!r:.80}")
        return n

    def _const(self, arg: list[Any]) -> list[Any]:
        value, n = arg
        if type(value) in (list, dict):
            raise ValueError("a const column holds a plain value")
        return [value] * self._count(n)

    def _shared(self, arg: list[Any]) -> list[Any]:
        name, n = arg
        if type(name) is not str or name not in _SHARED:
            raise ValueError(f"unknown shared value {name!r:.80}")
        return [_SHARED[name]] * self._count(n)

    def _tuple(self, arg: list[Any]) -> list[Any]:
        lengths, items = arg
        lengths = self._counts(lengths)
        items = self.column(items)
        if sum(lengths) != len(items):
            raise ValueError("a tuple column's lengths do not add up to its items")
        offsets = list(accumulate(lengths, initial=0))
        return list(map(tuple, map(items.__getitem__, map(slice, offsets, offsets[1:]))))

    def _bytes(self, arg: list[Any]) -> list[Any]:
        start, lengths = arg
        lengths = self._counts(lengths)
        total = sum(lengths)
        start = self._count(start) + self._blob_start
        if start + total > len(self._data):
            raise ValueError("a bytes column reaches beyond the blob")
        self.blob_used += total
        blob = self._blob
        if blob is None:
            blob = self._blob = io.BytesIO(self._data)  # shares the bytes, copies nothing
        blob.seek(start)
        return list(map(blob.read, lengths))

    def _map(self, arg: list[Any]) -> list[Any]:
        lengths, keys, values = arg
        lengths = self._counts(lengths)
        values = self.column(values)
        rows = values if type(values) is _Rows else None
        if type(keys) is dict and len(keys) == 1 and "key" in keys:
            field = keys["key"]
            if rows is None or type(field) is not str or field not in rows.fields:
                raise ValueError(f"map keys from field {field!r:.80} of values without it")
            keys = rows.fields[field]
        else:
            keys = self.column(keys)
        if len(keys) != len(values) or sum(lengths) != len(values):
            raise ValueError("a map column's lengths, keys and values do not agree")
        Map = immutables.Map
        if len(lengths) == 1:
            maps = [Map(zip(keys, values, strict=True))]
        else:
            offsets = list(accumulate(lengths, initial=0))
            maps = [
                Map(zip(keys[a:b], values[a:b], strict=True))
                for a, b in zip(offsets, offsets[1:], strict=False)
            ]
        if list(map(len, maps)) != lengths:
            raise ValueError("a map lists a key twice")
        if rows is not None:
            for m in maps:
                self._value_types[id(m)] = {rows.cls} if len(m) else set()
        return maps

    def _union(self, arg: list[Any]) -> list[Any]:
        tags, columns = arg
        tags = self._counts(tags)
        if type(columns) is not list:
            raise ValueError("a union holds an array of columns")
        groups = [self.column(c) for c in columns]
        if sum(map(len, groups)) != len(tags):
            raise ValueError("a union's tags do not match its columns")
        iters = [iter(g) for g in groups]
        out = list(map(next, map(iters.__getitem__, tags)))  # IndexError: a tag too large
        if len(out) != len(tags):  # a group ran out (StopIteration ends the map)
            raise ValueError("a union's tags do not match its columns")
        return out

    def _rec(self, arg: list[Any]) -> _Rows:
        name, n, columns = arg
        build = self._builders.get(name) if type(name) is str else None
        if build is None:
            build = self._builders[name] = self._plan(name)
        return build(self._count(n), columns)

    def _plan(self, name: Any) -> Callable[[int, Any], _Rows]:
        """How to build records of type ``name`` from columns in the body's field order."""
        cls, written, current = _written_fields(name, self._written)
        defaults: dict[str, Callable[[], Any]] = {}
        for f in current:
            if f not in written:
                default = _default(cls, f)
                if default is None:
                    raise ValueError(f"{name} lacks field {f!r}, which has no default")
                defaults[f] = default
        make = _maker(cls)
        width = len(written)

        def build(n: int, columns: Any) -> _Rows:
            if type(columns) is not list or len(columns) != width:
                raise ValueError(f"a {name} column holds {width} field columns")
            fields = dict(zip(written, map(self.column, columns), strict=True))
            if any(len(c) != n for c in fields.values()):
                raise ValueError(f"a {name} column's fields are not all {n} long")
            for f, default in defaults.items():
                fields[f] = [default() for _ in range(n)]
            rows = _Rows(make([fields[f] for f in current]) if n else ())
            rows.cls = cls
            rows.fields = fields
            return rows

        return build


def _maker(cls: type) -> Callable[[list[list[Any]]], list[Any]]:
    """columns (one per field, in field order) -> the records of type ``cls``."""
    if not dataclasses.is_dataclass(cls):  # a named tuple: tuple.__new__, in C
        new = partial(tuple.__new__, cls)
        return lambda cols: list(map(new, zip(*cols, strict=True)))
    if _positional(cls):
        return lambda cols: list(map(cls, *cols))
    names = _FIELDS[cls.__name__]
    return lambda cols: [
        cls(**dict(zip(names, row, strict=True))) for row in zip(*cols, strict=True)
    ]


def _decode_columns(text: bytes, end_head: int, types: Any) -> Image:
    end_value = text.find(b"\n", end_head + 1)
    if end_value < 0:
        raise ValueError("the body has no image line")
    reader = _Reader(types, text, end_value + 1)
    images = reader.column(json.loads(text[end_head + 1 : end_value]))
    if len(images) != 1:
        raise ValueError("the body holds no single image")
    image = _check_image(images[0], reader.value_types)
    if reader.blob_used != len(text) - end_value - 1:
        raise ValueError("the blob's size is not what the columns use")
    return image


# -- checks ----------------------------------------------------------------------

_MAP_FIELDS = ("jobs", "unsettled", "recent_ids", "leaders", "checkpoint_floors",
               "checkpoint_records", "call_members")
_DECISION_FIELDS = ("rejected", "ignored", "quarantined")


def _value_types(m: immutables.Map[Any, Any]) -> set[type]:
    return set(map(type, m.values()))


def _check_image(
    image: Any, value_types: Callable[[immutables.Map[Any, Any]], set[type]] = _value_types
) -> Image:
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
        if type(value) is not tuple or not set(map(type, value)) <= {Decision}:
            raise ValueError(f"the image's {name} is not a tuple of Decisions")
    if not value_types(image.jobs) <= {JobView}:
        raise ValueError("the image's jobs are not all JobViews")
    if image.term is not None and type(image.term) is not TermInfo:
        raise ValueError("the image's term is not a TermInfo")
    if not value_types(image.leaders) <= {LeaderInfo}:
        raise ValueError("the image's leaders are not all LeaderInfos")
    return image


_DECODERS: dict[str, Callable[[bytes, int, Any], Image]] = {FORMAT: _decode_columns}


def _decode(data: bytes) -> tuple[str, Image]:
    """(format, image) of a body of any readable format; ConfigError if it is none."""
    try:
        with bulk():
            inflate = zlib.decompressobj(wbits=_GZIP_WBITS)
            text = inflate.decompress(data)
            if not inflate.eof or inflate.unused_data:
                raise ValueError("the body is not one whole gzip stream")
            end_head = text.find(b"\n")
            header = json.loads(text[:end_head]) if end_head >= 0 else None
            if not isinstance(header, dict) or "types" not in header:
                raise ValueError("not a snapshot body")
            fmt = header.get("format")
            if not isinstance(fmt, str) or (decode := _DECODERS.get(fmt)) is None:
                raise ValueError(f"body format {fmt!r:.80}, expected one of {list(_DECODERS)}")
            if header.get("rules") != RULES:
                raise StaleSnapshot(f"written under other fold rules ({header.get('rules')!r:.40}; "
                                    f"this jobreg's are {RULES!r}): the log is replayed")
            image = decode(text, end_head, header["types"])
            _promote()
            return fmt, image
    except ConfigError:
        raise
    except (
        OSError,
        EOFError,
        zlib.error,  # not gzip, or corrupt
        ValueError,  # json, unicode, base64 and our own checks
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        RecursionError,
        binascii.Error,
    ) as e:
        raise ConfigError(f"not a valid snapshot body: {e}") from e


def _promote() -> None:
    """Move every object the cyclic collector tracks to its oldest generation, uncollected."""
    # A decoded image is ~3 objects per job, all new: the first young collection
    # after bulk() would walk them all (measured: a third of the time to read a
    # 100,000-job image) only to find them alive. The image lives as long as the
    # client, so put it (and whatever else is young) where a full collection
    # would have put it. Never when someone else froze objects: unfreeze would
    # thaw theirs too.
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def decode_image(data: bytes) -> Image:
    """The image in a snapshot body (:func:`encode_image`'s inverse; also reads format 1).

    Raises :class:`ConfigError` for anything that is not a body of a readable
    format, never a bare ``json``/``zlib``/``KeyError``.
    """
    return _decode(data)[1]


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
    with atomic_write(target, "snapshot") as f:
        f.write(head)
        f.write(body)
    return target


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
    fmt = header.get("format")
    if type(fmt) is not str or fmt not in READABLE_FORMATS:
        raise ConfigError(
            f"{where!r} is a snapshot of format {fmt!r:.80}; "
            f"this jobreg reads {' and '.join(map(repr, READABLE_FORMATS))}"
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
    if encoding != READABLE_FORMATS[fmt]:
        raise ConfigError(f"snapshot {where!r}: unknown body encoding {encoding!r:.80} for {fmt}")
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
        body_format, image = _decode(body)
    except StaleSnapshot as e:
        raise StaleSnapshot(f"snapshot {where!r}: {e}") from e
    except ConfigError as e:
        raise ConfigError(f"snapshot {where!r}: {e}") from e
    if body_format != fmt:
        raise ConfigError(f"snapshot {where!r}: a {body_format} body under a {fmt} header")
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
