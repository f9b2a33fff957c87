"""Avro codec of the registry log: events <-> Confluent-framed Avro bytes.

Wire format (the Confluent wire format, so standard tooling can read the log)::

    byte 0      magic byte, always 0
    bytes 1..4  schema id, unsigned 32-bit big-endian
    bytes 5..   the event record, Avro binary encoding without a container

The schema id names the *writer* schema. Without a schema registry, ids come
from the versioned catalog ``schemas/catalog.json`` (installed as
``registry.schemas``); with a Confluent Schema Registry they are the registry's
ids. A reader decodes with the writer schema and resolves it against its own
*current* schema of the same event type (Avro schema resolution): fields an
older writer did not know get their defaults, fields a newer writer added are
dropped.

The catalog is maintained with::

    jobreg catalog --update-catalog   # append new versions of changed .avsc files
    jobreg catalog --check            # exit 1 if the catalog is out of date

Ids and versions are stable forever: a changed schema (by Parsing Canonical
Form, i.e. by what the bytes mean) is appended as a new entry with a new id and
version + 1; old entries stay so that old records still decode.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import io
import json
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import fastavro
from fastavro.repository.base import AbstractSchemaRepository, SchemaRepositoryError
from fastavro.schema import load_schema, to_parsing_canonical_form

from .errors import CodecError, ConfigError, UnknownEventTypeError, UnknownSchemaError
from .events import EVENT_TYPES, NESTED_TYPES, Event, GraphRef, InlineGraph

__all__ = [
    "AVRO_NAMESPACE",
    "CATALOG_FILE",
    "MAGIC_BYTE",
    "Catalog",
    "CatalogEntry",
    "Codec",
    "check_catalog",
    "update_catalog",
    "decode",
    "default_codec",
    "encode",
    "fingerprint",
    "plan_catalog_update",
    "resolved_schemas",
]

AVRO_NAMESPACE = "jobreg"
"""Avro namespace of every jobreg schema (record full names are ``jobreg.<Type>``)."""

_NEWER_IDS = 1000
"""How far past the newest id it knows a reader takes an unknown schema id for a newer
jobreg's (each version adds a few); beyond, or id 0, the record is not a jobreg record."""

CATALOG_FILE = "catalog.json"
"""File name of the versioned catalog inside the ``registry.schemas`` package."""

MAGIC_BYTE = 0
"""First byte of every record in the Confluent wire format."""

_SCHEMAS_PACKAGE = "registry.schemas"
_HEADER = struct.Struct(">BI")
_HEADER_SIZE = _HEADER.size
_MAX_SCHEMA_ID = 2**31 - 1  # Confluent ids are positive signed 32-bit integers
_ENVELOPE_FIELD = "envelope"
_ENVELOPE_NAMES = tuple(f.name for f in dataclasses.fields(Event))
_INLINE_GRAPH = f"{AVRO_NAMESPACE}.InlineGraph"
_GRAPH_REF = f"{AVRO_NAMESPACE}.GraphRef"
_INT_TYPES = frozenset({"int", "long"})


# --------------------------------------------------------------------------- schema helpers


def fingerprint(schema: Mapping[str, Any] | str | list[Any]) -> str:
    """SHA-256 (hex) of the schema's Parsing Canonical Form.

    Two schemas with the same fingerprint encode every datum to the same bytes;
    docs, defaults and other attributes do not take part.
    """
    return hashlib.sha256(to_parsing_canonical_form(schema).encode("utf-8")).hexdigest()


def _full_name(parsed: Mapping[str, Any]) -> str:
    """The full name of a parsed record schema (fastavro qualifies ``name``)."""
    if not isinstance(parsed, Mapping) or parsed.get("type") != "record":
        raise UnknownEventTypeError(f"schema is not an Avro record: {str(parsed)[:200]}")
    return str(parsed["name"])


def _type_from_name(full_name: str) -> str:
    """``jobreg.JobSubmitted`` -> ``JobSubmitted``; UnknownEventTypeError otherwise."""
    namespace, _, short = full_name.rpartition(".")
    if namespace != AVRO_NAMESPACE or short not in EVENT_TYPES:
        raise UnknownEventTypeError(
            f"Avro record {full_name!r} is not a jobreg event type "
            f"(known: {', '.join(EVENT_TYPES)})"
        )
    return short


class _TraversableRepository(AbstractSchemaRepository):
    """fastavro schema repository over ``<full name>.avsc`` files in a folder or package."""

    def __init__(self, root: Traversable) -> None:
        self._root = root

    def load(self, name: str) -> dict[str, Any]:
        """Return the parsed JSON of ``<name>.avsc``."""
        try:
            text = self._root.joinpath(f"{name}.avsc").read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError) as e:
            raise SchemaRepositoryError(f"no schema file {name}.avsc") from e
        try:
            return json.loads(text)
        except ValueError as e:
            raise SchemaRepositoryError(f"{name}.avsc is not valid JSON: {e}") from e


def _schemas_root(schemas_dir: str | os.PathLike[str] | Traversable | None) -> Traversable:
    if schemas_dir is None:
        return importlib.resources.files(_SCHEMAS_PACKAGE)
    if isinstance(schemas_dir, str | os.PathLike):
        return Path(schemas_dir)
    return schemas_dir


def resolved_schemas(
    schemas_dir: str | os.PathLike[str] | Traversable | None = None,
) -> dict[str, dict[str, Any]]:
    """Load the ``.avsc`` file of every event type, with named types inlined.

    Returns ``{type name: schema}`` in :data:`registry.events.EVENT_TYPES` order;
    each schema is the fully resolved JSON as fastavro writes it (full names, the
    first use of each named type defined inline). ``schemas_dir`` defaults to the
    installed ``registry.schemas`` package. Raises :class:`ConfigError` if a file
    is missing or invalid.
    """
    repo = _TraversableRepository(_schemas_root(schemas_dir))
    out: dict[str, dict[str, Any]] = {}
    for type_name in EVENT_TYPES:
        full = f"{AVRO_NAMESPACE}.{type_name}"
        try:
            schema = load_schema(full, repo=repo, _write_hint=False)
        except Exception as e:  # fastavro raises several unrelated types here
            raise ConfigError(f"cannot load schema {full}.avsc: {e}") from e
        if not isinstance(schema, dict) or schema.get("name") != full:
            raise ConfigError(f"{full}.avsc must define the record {full}")
        out[type_name] = schema
    return out


# --------------------------------------------------------------------------- catalog


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One schema of the catalog: its id, event type, version and resolved JSON."""

    id: int
    type: str
    version: int
    schema: dict[str, Any]
    """The resolved schema JSON as stored in the catalog (do not mutate)."""
    parsed: dict[str, Any] = dataclasses.field(repr=False, compare=False)
    """The schema parsed by :func:`fastavro.parse_schema` (do not mutate)."""
    fingerprint: str = dataclasses.field(repr=False, compare=False)
    """SHA-256 of the schema's Parsing Canonical Form."""


class Catalog:
    """The versioned catalog of writer schemas: ``id -> (type, version, schema)``.

    Built from the JSON object ``{"schemas": [{"id", "type", "version",
    "schema"}, ...]}`` of ``schemas/catalog.json`` (see :meth:`load`) or any
    equal dict (see :meth:`from_dict`, for tests). Every schema is parsed once,
    here. The *current* schema of a type is its highest version: the one new
    records are written with and the one older (or newer) writers' records are
    resolved against.
    """

    __slots__ = ("_by_id", "_current")

    def __init__(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Validate and parse catalog entries; :class:`ConfigError` if malformed."""
        by_id: dict[int, CatalogEntry] = {}
        versions: dict[tuple[str, int], int] = {}
        for raw in entries:
            entry = self._entry(raw)
            if entry.id in by_id:
                raise ConfigError(f"catalog: duplicate schema id {entry.id}")
            key = (entry.type, entry.version)
            if key in versions:
                raise ConfigError(
                    f"catalog: {entry.type} version {entry.version} has two ids "
                    f"({versions[key]} and {entry.id})"
                )
            by_id[entry.id] = entry
            versions[key] = entry.id
        current: dict[str, CatalogEntry] = {}
        for entry in by_id.values():
            best = current.get(entry.type)
            if best is None or entry.version > best.version:
                current[entry.type] = entry
        self._by_id = by_id
        self._current = current

    @staticmethod
    def _entry(raw: Mapping[str, Any]) -> CatalogEntry:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"catalog: entry is not an object: {raw!r}")
        sid, type_name, version, schema = (
            raw.get("id"),
            raw.get("type"),
            raw.get("version"),
            raw.get("schema"),
        )
        if type(sid) is not int or not 0 < sid <= _MAX_SCHEMA_ID:
            raise ConfigError(f"catalog: bad schema id {sid!r}")
        if not isinstance(type_name, str) or not type_name:
            raise ConfigError(f"catalog: schema id {sid} has a bad type {type_name!r}")
        if type(version) is not int or version < 1:
            raise ConfigError(f"catalog: schema id {sid} has a bad version {version!r}")
        if not isinstance(schema, dict):
            raise ConfigError(f"catalog: schema id {sid} has no schema object")
        try:
            parsed = fastavro.parse_schema(schema)
            fp = fingerprint(schema)
        except Exception as e:
            raise ConfigError(f"catalog: schema id {sid} does not parse: {e}") from e
        expected = f"{AVRO_NAMESPACE}.{type_name}"
        if parsed.get("type") != "record" or parsed.get("name") != expected:
            raise ConfigError(
                f"catalog: schema id {sid} of type {type_name} must be the record {expected}"
            )
        return CatalogEntry(sid, type_name, version, schema, parsed, fp)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | Traversable | Mapping[str, Any] | None = None
    ) -> Catalog:
        """Load a catalog file (default: the installed ``registry.schemas/catalog.json``).

        ``path`` may also be an already parsed catalog dict. Raises
        :class:`ConfigError` if the file is missing or malformed.
        """
        if isinstance(path, Mapping):
            return cls.from_dict(path)
        source: Traversable
        if path is None:
            source = importlib.resources.files(_SCHEMAS_PACKAGE).joinpath(CATALOG_FILE)
        elif isinstance(path, str | os.PathLike):
            source = Path(path)
        else:
            source = path
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the schema catalog {source}: {e}") from e
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Catalog:
        """Build a catalog from its JSON object ``{"schemas": [...]}``."""
        if not isinstance(data, Mapping) or not isinstance(data.get("schemas"), list):
            raise ConfigError('a schema catalog is an object {"schemas": [...]}')
        return cls(data["schemas"])

    def to_dict(self) -> dict[str, Any]:
        """The catalog as its JSON object, entries in id order."""
        return {
            "schemas": [
                {"id": e.id, "type": e.type, "version": e.version, "schema": e.schema}
                for e in sorted(self._by_id.values(), key=lambda e: e.id)
            ]
        }

    def entries(self) -> list[CatalogEntry]:
        """Every entry, in id order."""
        return sorted(self._by_id.values(), key=lambda e: e.id)

    def entry(self, schema_id: int) -> CatalogEntry:
        """The entry of ``schema_id``; :class:`UnknownSchemaError` if absent."""
        entry = self._by_id.get(schema_id)
        if entry is None:
            known = f"{min(self._by_id)}..{max(self._by_id)}" if self._by_id else "none"
            newest = max(self._by_id, default=0)
            if not 0 < schema_id <= newest + _NEWER_IDS:
                # No jobreg writes id 0, nor thousands of schemas past this one's.
                raise UnknownSchemaError(
                    f"not a jobreg record: schema id {schema_id} is far outside this "
                    f"reader's schema catalog (known ids: {known})"
                )
            raise UnknownSchemaError(
                f"schema id {schema_id} is not in this reader's schema catalog (known ids: "
                f"{known}): a newer jobreg wrote it (upgrade this reader, or configure the "
                "schema registry the writer uses), or it is not a jobreg record"
            )
        return entry

    def types(self) -> list[str]:
        """The event types that have at least one schema."""
        return list(self._current)

    def current(self, type_name: str) -> CatalogEntry:
        """The entry of the current (highest) version of ``type_name``.

        Raises :class:`UnknownEventTypeError` if the catalog has no such type.
        """
        entry = self._current.get(type_name)
        if entry is None:
            raise UnknownEventTypeError(f"the schema catalog has no event type {type_name!r}")
        return entry

    def writer_id(self, type_name: str) -> int:
        """Id of the current (highest) version of ``type_name``: the one to write with."""
        return self.current(type_name).id

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The parsed (fastavro) schema of ``schema_id``; :class:`UnknownSchemaError` if absent."""
        return self.entry(schema_id).parsed

    def type_of(self, schema_id: int) -> str:
        """The event type name of ``schema_id``; :class:`UnknownSchemaError` if absent."""
        return self.entry(schema_id).type

    def version_of(self, schema_id: int) -> int:
        """The version of ``schema_id`` within its type; :class:`UnknownSchemaError` if absent."""
        return self.entry(schema_id).version

    def current_version(self, type_name: str) -> int:
        """The highest version of ``type_name``; :class:`UnknownEventTypeError` if absent."""
        return self.current(type_name).version

    def __len__(self) -> int:
        return len(self._by_id)

    def __repr__(self) -> str:
        return f"Catalog({len(self._by_id)} schemas, {len(self._current)} types)"


# --------------------------------------------------------------------------- codec plans


def _union_branches(avro_type: Any) -> list[Any] | None:
    return avro_type if isinstance(avro_type, list) else None


def _is_record_union(avro_type: Any) -> bool:
    branches = _union_branches(avro_type)
    return branches is not None and any(
        isinstance(b, dict) and b.get("type") == "record" or (isinstance(b, str) and "." in b)
        for b in branches
    )


def _int_kind(avro_type: Any) -> str | None:
    """``"int"``/``"nullable"`` if values of this type must be Python ints (or None)."""
    if isinstance(avro_type, str) and avro_type in _INT_TYPES:
        return "int"
    branches = _union_branches(avro_type)
    if (
        branches
        and all(isinstance(b, str) for b in branches)
        and set(branches) <= {"null", "int", "long"}
        and "null" in branches
    ):
        return "nullable"
    return None


def _record_fields(parsed: Mapping[str, Any]) -> dict[str, Any]:
    return {f["name"]: f for f in parsed["fields"]}


def _envelope_fields(parsed: Mapping[str, Any]) -> dict[str, Any]:
    env = _record_fields(parsed).get(_ENVELOPE_FIELD)
    if env is None or not isinstance(env["type"], dict):
        raise CodecError(f"schema {parsed.get('name')} has no inline envelope record")
    return _record_fields(env["type"])


def _check_int(name: str, value: Any, nullable: bool) -> None:
    if type(value) is int or (nullable and value is None):
        return
    if isinstance(value, int) and not isinstance(value, bool):
        return
    raise CodecError(f"field {name!r} must be an int, not {type(value).__name__} {value!r}")


def _graph_to_avro(name: str, graph: Any) -> Any:
    if graph is None:
        return None
    if isinstance(graph, InlineGraph):
        return (_INLINE_GRAPH, {"data": graph.data})
    if isinstance(graph, GraphRef):
        _check_int(f"{name}.size", graph.size, False)
        return (_GRAPH_REF, {"uri": graph.uri, "sha256": graph.sha256, "size": graph.size})
    raise CodecError(
        f"field {name!r} must be an InlineGraph or a GraphRef, not {type(graph).__name__}"
    )


def _short(name: str) -> str:
    return name.rpartition(".")[2]


def _to_avro(value: Any) -> Any:
    """A nested dataclass (see ``NESTED_TYPES``) as an Avro datum: dicts, lists."""
    if isinstance(value, tuple):
        return [_to_avro(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_avro(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _needs_conversion(avro_type: Any) -> bool:
    """True if values of this (non-graph) type hold nested records or arrays."""
    if isinstance(avro_type, dict):
        return avro_type.get("type") in ("record", "array")
    if isinstance(avro_type, list):
        return any(_needs_conversion(b) for b in avro_type)
    return isinstance(avro_type, str) and _short(avro_type) in NESTED_TYPES


def _nested_reader(avro_type: Any, named: dict[str, Any] | None = None) -> Callable[[Any], Any] | None:
    """A converter Avro value -> Python for ``avro_type`` (records of ``NESTED_TYPES`` become
    their frozen dataclasses, arrays tuples), or ``None`` where the value is used as read."""
    named = {} if named is None else named
    if isinstance(avro_type, str):
        avro_type = named.get(avro_type, avro_type)
        if isinstance(avro_type, str):
            return None
    if isinstance(avro_type, list):  # a union: records arrive as (name, value) pairs
        branches = {}
        for b in avro_type:
            conv = _nested_reader(b, named)
            name = b["name"] if isinstance(b, dict) else b
            if conv is not None:
                branches[name] = conv
        if not branches:
            return None

        def union(value: Any) -> Any:
            if isinstance(value, tuple):
                name, inner = value
                conv = branches.get(name)
                return conv(inner) if conv is not None else inner
            return value

        return union
    kind = avro_type.get("type")
    if kind == "array":
        item = _nested_reader(avro_type["items"], named)
        return tuple if item is None else (lambda xs: tuple(item(x) for x in xs))
    if kind == "record":
        named[avro_type["name"]] = avro_type
        cls = NESTED_TYPES.get(_short(avro_type["name"]))
        if cls is None:
            return None
        subs = [(f["name"], _nested_reader(f["type"], named)) for f in avro_type["fields"]]
        names = {f.name for f in dataclasses.fields(cls)}
        subs = [(n, c) for n, c in subs if n in names]

        def record(value: dict[str, Any]) -> Any:
            if isinstance(value, tuple):  # a record read as the branch of a union
                value = value[1]
            return cls(**{n: (value[n] if c is None else c(value[n])) for n, c in subs})

        return record
    return None


def _can_skip_init(cls: type) -> bool:
    """True if ``cls`` is a slotted dataclass whose ``__init__`` only assigns its fields.

    Such an object can be built with ``object.__new__`` and the slot descriptors'
    ``__set__`` (which bypass the frozen ``__setattr__``), at about half the
    cost of calling the generated ``__init__``, and compares equal to it.
    """
    return (
        dataclasses.is_dataclass(cls)
        and "__slots__" in cls.__dict__
        and getattr(cls, "__post_init__", None) is None
        and all(f.init for f in dataclasses.fields(cls))
    )


_new = object.__new__

if _can_skip_init(InlineGraph) and _can_skip_init(GraphRef):
    _set_data = InlineGraph.data.__set__  # type: ignore[attr-defined]
    _set_uri = GraphRef.uri.__set__  # type: ignore[attr-defined]
    _set_sha256 = GraphRef.sha256.__set__  # type: ignore[attr-defined]
    _set_size = GraphRef.size.__set__  # type: ignore[attr-defined]

    def _inline_graph(d: dict[str, Any]) -> InlineGraph:
        g = _new(InlineGraph)
        _set_data(g, d["data"])
        return g

    def _graph_ref(d: dict[str, Any]) -> GraphRef:
        g = _new(GraphRef)
        _set_uri(g, d["uri"])
        _set_sha256(g, d["sha256"])
        _set_size(g, d["size"])
        return g

else:  # pragma: no cover - only if events.py gains __post_init__ validation

    def _inline_graph(d: dict[str, Any]) -> InlineGraph:
        return InlineGraph(d["data"])

    def _graph_ref(d: dict[str, Any]) -> GraphRef:
        return GraphRef(d["uri"], d["sha256"], d["size"])


def _graph_from_avro(value: Any) -> InlineGraph | GraphRef | None:
    """Avro graph union value (``None`` or ``(record name, dict)``) -> dataclass."""
    if value is None:
        return None
    name, record = value
    if name == _INLINE_GRAPH:
        return _inline_graph(record)
    if name == _GRAPH_REF:
        return _graph_ref(record)
    raise UnknownEventTypeError(f"unknown graph record {name!r}")


class _Writer:
    """How to encode one event class: header, parsed writer schema and field plan."""

    __slots__ = ("cls", "envelope", "graphs", "header", "ints", "nested", "payload", "schema",
                 "version")

    def __init__(self, cls: type[Event], entry: CatalogEntry, schema_id: int) -> None:
        names = {f.name for f in dataclasses.fields(cls)}
        env_fields = _envelope_fields(entry.parsed)
        fields = _record_fields(entry.parsed)
        del fields[_ENVELOPE_FIELD]
        for schema_fields in (env_fields, fields):
            for fname, field in schema_fields.items():
                if fname not in names and "default" not in field:
                    raise CodecError(
                        f"schema id {entry.id} ({entry.type} v{entry.version}) needs field "
                        f"{fname!r} that {cls.__name__} does not have"
                    )
        lost = names - set(env_fields) - set(fields)
        if lost:
            raise CodecError(
                f"schema id {entry.id} ({entry.type} v{entry.version}) cannot carry "
                f"{cls.__name__} field(s) {sorted(lost)}"
            )
        self.cls = cls
        self.schema = entry.parsed
        self.version = entry.version
        self.header = _HEADER.pack(MAGIC_BYTE, schema_id)
        self.envelope = tuple(n for n in env_fields if n in names and n != "schema_version")
        self.payload = tuple(n for n in fields if n in names)
        self.graphs = tuple(n for n in self.payload if _is_record_union(fields[n]["type"])
                            and n == "graph")
        self.nested = tuple(n for n in self.payload if n not in self.graphs
                            and _needs_conversion(fields[n]["type"]))
        ints = [(n, _int_kind(env_fields[n]["type"])) for n in self.envelope]
        ints += [(n, _int_kind(fields[n]["type"])) for n in self.payload]
        self.ints = tuple((n, kind == "nullable") for n, kind in ints if kind)

    def record(self, event: Event) -> dict[str, Any]:
        """The Avro datum of ``event`` (envelope sub-record, tuple notation for graphs)."""
        env = {name: getattr(event, name) for name in self.envelope}
        env["schema_version"] = self.version
        rec: dict[str, Any] = {name: getattr(event, name) for name in self.payload}
        for name, nullable in self.ints:
            value = env[name] if name in env else rec[name]
            if type(value) is not int:
                _check_int(name, value, nullable)
        for name in self.graphs:
            rec[name] = _graph_to_avro(name, rec[name])
        for name in self.nested:
            rec[name] = _to_avro(rec[name])
        rec[_ENVELOPE_FIELD] = env
        return rec


class _Reader:
    """How to decode one schema id: writer schema, reader schema (or None) and builder."""

    __slots__ = ("build", "reader", "type_name", "writer")

    def __init__(
        self, writer: dict[str, Any], reader: dict[str, Any] | None, type_name: str
    ) -> None:
        self.writer = writer
        self.reader = reader
        self.type_name = type_name
        self.build = _builder(EVENT_TYPES[type_name], reader if reader is not None else writer)


def _builder(cls: type[Event], parsed: dict[str, Any]) -> Callable[[dict[str, Any]], Event]:
    """A function Avro record -> ``cls`` instance, for records read with schema ``parsed``.

    Record fields the dataclass does not have are ignored; dataclass fields the
    record lacks take their dataclass default (or the build fails).
    """
    env_fields = _envelope_fields(parsed)
    fields = _record_fields(parsed)
    del fields[_ENVELOPE_FIELD]
    dc_fields = dataclasses.fields(cls)
    env_names = tuple(f.name for f in dc_fields if f.name in env_fields)
    payload = tuple(
        (f.name, _graph_from_avro if f.name == "graph" else _nested_reader(fields[f.name]["type"]))
        for f in dc_fields
        if f.name in fields
    )
    complete = len(env_names) + len(payload) == len(dc_fields)
    if not (complete and env_names == _ENVELOPE_NAMES and _can_skip_init(cls)):

        def build_init(rec: dict[str, Any]) -> Event:
            env = rec[_ENVELOPE_FIELD]
            kwargs = {name: env[name] for name in env_names}
            for name, conv in payload:
                value = rec[name]
                kwargs[name] = value if conv is None else conv(value)
            return cls(**kwargs)

        return build_init

    # The hot path of a replay: every field set through its slot (see _can_skip_init),
    # the six envelope fields unrolled.
    new = _new
    s_event_id, s_namespace, s_epoch, s_writer, s_created_at, s_schema_version = (
        getattr(cls, name).__set__ for name in _ENVELOPE_NAMES
    )
    payload_set = tuple((name, getattr(cls, name).__set__, conv) for name, conv in payload)

    def build_fast(rec: dict[str, Any]) -> Event:
        obj = new(cls)
        env = rec["envelope"]
        s_event_id(obj, env["event_id"])
        s_namespace(obj, env["namespace"])
        s_epoch(obj, env["epoch"])
        s_writer(obj, env["writer"])
        s_created_at(obj, env["created_at"])
        s_schema_version(obj, env["schema_version"])
        for name, put, conv in payload_set:
            value = rec[name]
            put(obj, value if conv is None else conv(value))
        return obj

    return build_fast


def _registry_schema(schema_str: str) -> Any:
    # Imported here: the schema registry client pulls in an HTTP stack that a
    # catalog-only deployment never needs.
    from confluent_kafka.schema_registry import Schema

    return Schema(schema_str, "AVRO")


# --------------------------------------------------------------------------- codec


class Codec:
    """Encode events to, and decode them from, Confluent-framed Avro bytes.

    Parsed schemas and per-id decode plans are cached, so the per-record cost is
    one fastavro call plus building the dataclass. Instances are safe to share
    between threads (the caches are only ever filled with equal values).
    """

    __slots__ = ("_catalog", "_readers", "_registry", "_subject_prefix", "_writers")

    def __init__(
        self,
        catalog: Catalog | None = None,
        *,
        schema_registry: Any = None,
        subject_prefix: str = "jobreg",
    ) -> None:
        """Create a codec.

        ``catalog``: the schemas this process knows (default: the installed
        catalog). It gives the current (writer and reader) schema of every type.

        ``schema_registry``: ``None`` (schema ids are catalog ids) or a
        ``confluent_kafka.schema_registry.SchemaRegistryClient`` (tests use
        ``SchemaRegistryClient.new_client({"url": "mock://jobreg-test"})``; any
        object with ``register_schema(subject, schema) -> int`` and
        ``get_schema(id) -> obj with .schema_str`` works). With a registry,
        encode registers the current schema of the type under the subject
        ``f"{subject_prefix}.{TypeName}"`` (record-name strategy) once and caches
        the id; decode fetches unknown ids from the registry (cached), finds the
        event type from the record's name and resolves against the catalog's
        current schema of that type.
        """
        self._catalog = catalog if catalog is not None else Catalog.load()
        self._registry = schema_registry
        self._subject_prefix = subject_prefix
        self._writers: dict[type, _Writer] = {}
        self._readers: dict[int, _Reader] = {}

    @property
    def catalog(self) -> Catalog:
        """The catalog this codec reads and writes with."""
        return self._catalog

    @property
    def schema_registry(self) -> Any:
        """The schema registry client, or ``None`` in catalog mode."""
        return self._registry

    # ------------------------------------------------------------------ encode

    def encode(self, event: Event) -> bytes:
        """Encode ``event`` with the current schema of its type.

        The envelope's ``schema_version`` is written as the version of the writer
        schema, whatever the dataclass says. Raises :class:`UnknownEventTypeError`
        for a class that is not one of :data:`~registry.events.EVENT_TYPES` and
        :class:`CodecError` for an event that does not fit its schema (wrong field
        types, out-of-range ints) or a schema registry failure.
        """
        writer = self._writers.get(type(event))
        if writer is None:
            writer = self._writer_for(event)
        try:
            rec = writer.record(event)
            buf = io.BytesIO()
            buf.write(writer.header)
            fastavro.schemaless_writer(buf, writer.schema, rec)
            return buf.getvalue()
        except CodecError:
            raise
        except Exception as e:
            raise CodecError(f"cannot encode {type(event).__name__}: {e}") from e

    def encode_as_read(self, event: Event) -> tuple[bytes, Event]:
        """:meth:`encode`, and the event as :meth:`decode` gives those bytes back: the same,
        with ``schema_version`` the writer schema's (a writer folding what it wrote need not
        decode it; ``tests/unit/test_codec.py`` checks the two agree for every event type)."""
        data = self.encode(event)
        version = self._writers[type(event)].version
        if event.schema_version != version:
            event = dataclasses.replace(event, schema_version=version)
        return data, event

    def _writer_for(self, event: Event) -> _Writer:
        cls = type(event)
        type_name = getattr(cls, "TYPE", None)
        if (
            not isinstance(event, Event)
            or not isinstance(type_name, str)
            or EVENT_TYPES.get(type_name) is not cls
        ):
            raise UnknownEventTypeError(f"{cls.__name__} is not a jobreg event type")
        entry = self._catalog.current(type_name)
        schema_id = entry.id if self._registry is None else self._register(entry)
        writer = _Writer(cls, entry, schema_id)
        self._writers[cls] = writer
        if self._registry is not None:
            self._readers.setdefault(schema_id, _Reader(entry.parsed, None, entry.type))
        return writer

    def _register(self, entry: CatalogEntry) -> int:
        subject = f"{self._subject_prefix}.{entry.type}"
        try:
            schema_id = self._registry.register_schema(
                subject, _registry_schema(json.dumps(entry.schema))
            )
        except Exception as e:
            raise CodecError(f"cannot register the schema of {entry.type} as {subject}: {e}") from e
        if type(schema_id) is not int or not 0 <= schema_id <= 0xFFFFFFFF:
            raise CodecError(f"schema registry returned a bad id {schema_id!r} for {subject}")
        return schema_id

    # ------------------------------------------------------------------ decode

    def decode(self, data: bytes) -> Event:
        """Decode one record into its event dataclass.

        ``schema_version`` of the result is the writer's (from the envelope).
        Raises only :class:`CodecError` subclasses, for any input:
        :class:`UnknownSchemaError` if the schema id is unknown (to the catalog
        or the registry), :class:`UnknownEventTypeError` if the writer schema is
        not a jobreg event, :class:`CodecError` for anything else (not the wire
        format, truncated or trailing bytes, undecodable body).
        """
        reader, rec = self._read(data)
        try:
            return reader.build(rec)
        except CodecError:
            raise
        except Exception as e:
            raise CodecError(
                f"cannot build a {reader.type_name} from its record: {type(e).__name__}: {e}"
            ) from e

    def decode_record(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """Decode one record into ``(type name, Avro record dict)``, without the dataclass.

        The dict is resolved against this reader's current schema of the type,
        so it has exactly that schema's fields (defaults filled in, fields the
        reader does not know dropped); graph unions are ``(record name, dict)``
        tuples. Meant for tools and for inspecting fields a dataclass does not
        (yet) have. Raises like :meth:`decode`.
        """
        reader, rec = self._read(data)
        return reader.type_name, rec

    def _read(self, data: bytes) -> tuple[_Reader, dict[str, Any]]:
        """Check the header, find the decode plan and read the Avro body."""
        try:
            magic, schema_id = _HEADER.unpack_from(data)
        except Exception as e:
            raise self._not_wire_format(data) from e
        if magic != MAGIC_BYTE:
            raise self._not_wire_format(data)
        try:
            reader = self._readers.get(schema_id)
            if reader is None:
                reader = self._reader_for(schema_id)
            buf = io.BytesIO(data)
            buf.seek(_HEADER_SIZE)
            rec = fastavro.schemaless_reader(
                buf, reader.writer, reader.reader, return_record_name=True
            )
            end = buf.tell()
        except CodecError:
            raise
        except Exception as e:
            raise CodecError(
                f"cannot decode a record with schema id {schema_id}: {type(e).__name__}: {e}"
            ) from e
        if end != len(data):
            raise CodecError(
                f"{len(data) - end} trailing byte(s) after the Avro body "
                f"(schema id {schema_id}, {reader.type_name})"
            )
        return reader, rec

    @staticmethod
    def _not_wire_format(data: Any) -> CodecError:
        if not isinstance(data, bytes | bytearray | memoryview):
            return CodecError(f"expected bytes, got {type(data).__name__}")
        head = bytes(data[:8]).hex()
        return CodecError(
            f"record of {len(data)} byte(s) (starting {head or 'empty'}) is not in the "
            "Confluent wire format (magic byte 0, 4-byte schema id, Avro body)"
        )

    def _reader_for(self, schema_id: int) -> _Reader:
        if self._registry is None:
            entry = self._catalog.entry(schema_id)
            if entry.type not in EVENT_TYPES:
                raise UnknownEventTypeError(
                    f"schema id {schema_id} is {entry.type!r}, not a jobreg event type"
                )
            writer, writer_fp, type_name = entry.parsed, entry.fingerprint, entry.type
        else:
            writer, type_name = self._fetch(schema_id)
            writer_fp = fingerprint(writer)
        current = self._catalog.current(type_name)
        # Same canonical form: the writer schema is our own, no resolution needed
        # (fastavro is faster with reader_schema=None).
        reader = None if writer_fp == current.fingerprint else current.parsed
        plan = _Reader(writer, reader, type_name)
        self._readers[schema_id] = plan
        return plan

    def _fetch(self, schema_id: int) -> tuple[dict[str, Any], str]:
        try:
            registered = self._registry.get_schema(schema_id)
        except Exception as e:
            status = getattr(e, "http_status_code", None)
            if status == 404 or getattr(e, "error_code", None) in (40403, 40400):
                raise UnknownSchemaError(
                    f"schema id {schema_id} is not in the schema registry; the record was "
                    "written against another registry, or the schema was deleted"
                ) from e
            raise CodecError(f"cannot fetch schema id {schema_id} from the registry: {e}") from e
        schema_type = getattr(registered, "schema_type", "AVRO") or "AVRO"
        if schema_type != "AVRO":
            raise UnknownEventTypeError(
                f"schema id {schema_id} is a {schema_type} schema, not Avro"
            )
        try:
            parsed = fastavro.parse_schema(json.loads(registered.schema_str))
        except Exception as e:
            raise CodecError(f"schema id {schema_id} from the registry does not parse: {e}") from e
        return parsed, _type_from_name(_full_name(parsed))


# --------------------------------------------------------------------------- defaults

_default_lock = threading.Lock()
_default: Codec | None = None


def default_codec() -> Codec:
    """The process-wide :class:`Codec` over the installed catalog (created on first use)."""
    global _default
    codec = _default
    if codec is None:
        with _default_lock:
            if _default is None:
                _default = Codec()
            codec = _default
    return codec


def encode(event: Event) -> bytes:
    """Encode ``event`` with :func:`default_codec` (see :meth:`Codec.encode`)."""
    return default_codec().encode(event)


def decode(data: bytes) -> Event:
    """Decode ``data`` with :func:`default_codec` (see :meth:`Codec.decode`)."""
    return default_codec().decode(data)


# --------------------------------------------------------------------------- catalog upkeep


def plan_catalog_update(
    catalog: Mapping[str, Any], schemas: Mapping[str, dict[str, Any]]
) -> tuple[dict[str, Any], list[str]]:
    """Compute the catalog that matches ``schemas`` (``{type: resolved schema}``).

    For each type whose schema differs, by Parsing Canonical Form, from the
    catalog's current version of that type (or that has none), a new entry is
    appended with id = max id + 1 and version = max version of the type + 1.
    If only docs, defaults or other non-canonical attributes differ, the current
    entry's schema JSON is refreshed in place (same id and version: the bytes
    mean the same). Existing entries are never renumbered or removed.

    Returns ``(new catalog dict, list of human-readable changes)``; no changes
    means the catalog is up to date.
    """
    current = Catalog.from_dict(catalog)
    entries = [dict(e) for e in catalog["schemas"]]
    next_id = max((e["id"] for e in entries), default=0) + 1
    changes: list[str] = []
    for type_name, schema in schemas.items():
        try:
            head: CatalogEntry | None = current.current(type_name)
        except UnknownEventTypeError:
            head = None
        if head is not None and head.fingerprint == fingerprint(schema):
            if head.schema != schema:
                for e in entries:
                    if e["id"] == head.id:
                        e["schema"] = schema
                changes.append(
                    f"{type_name} v{head.version} (id {head.id}): docs/defaults refreshed"
                )
            continue
        version = 1 if head is None else head.version + 1
        entries.append({"id": next_id, "type": type_name, "version": version, "schema": schema})
        changes.append(f"{type_name} v{version}: new schema id {next_id}")
        next_id += 1
    new = {**catalog, "schemas": entries}
    Catalog.from_dict(new)  # validate what we are about to write
    return new, changes


def _catalog_path(catalog_path: str | os.PathLike[str] | Traversable | None) -> Traversable:
    if catalog_path is None:
        return importlib.resources.files(_SCHEMAS_PACKAGE).joinpath(CATALOG_FILE)
    if isinstance(catalog_path, str | os.PathLike):
        return Path(catalog_path)
    return catalog_path


def _plan(
    catalog_path: str | os.PathLike[str] | Traversable | None,
    schemas_dir: str | os.PathLike[str] | Traversable | None,
) -> tuple[Traversable, dict[str, Any], list[str]]:
    """(catalog file, up-to-date catalog dict, changes) for the catalog file and .avsc files."""
    path = _catalog_path(catalog_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        data: dict[str, Any] = {"schemas": []}
        missing = [f"{path}: missing"]
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from e
        missing = []
    new, changes = plan_catalog_update(data, resolved_schemas(schemas_dir))
    extra = sorted(set(Catalog.from_dict(new).types()) - set(EVENT_TYPES))
    problems = [f"catalog type {t!r} is not an event type" for t in extra]
    return path, new, missing + changes + problems


def check_catalog(
    catalog_path: str | os.PathLike[str] | Traversable | None = None,
    schemas_dir: str | os.PathLike[str] | Traversable | None = None,
) -> list[str]:
    """What is out of date in the catalog (the ``--check`` logic); empty means up to date.

    Lists what ``--update-catalog`` would change, plus catalog types that are
    not :data:`~registry.events.EVENT_TYPES` (those are never removed
    automatically). Defaults: the installed catalog and ``.avsc`` files.
    Raises :class:`ConfigError` if a file is malformed.
    """
    return _plan(catalog_path, schemas_dir)[2]


def update_catalog(catalog_path: str | os.PathLike[str] | None = None,
                   schemas_dir: str | os.PathLike[str] | None = None, *,
                   write: bool) -> tuple[Traversable, int, list[str]]:
    """Plan (and with ``write`` apply) the catalog update ``jobreg catalog`` makes: returns
    the catalog file, its number of schemas after the update, and the changes (what
    :func:`check_catalog` lists). Raises :class:`ConfigError` (or ``OSError``) for malformed
    or unreadable files."""
    path, new, changes = _plan(catalog_path, schemas_dir)
    if write and new != _read_json_or_none(path):
        Path(str(path)).write_text(
            json.dumps(new, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    return path, len(new["schemas"]), changes


def _read_json_or_none(path: Traversable) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None

