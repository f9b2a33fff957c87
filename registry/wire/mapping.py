"""Events (frozen dataclasses) <-> Avro records (the dicts fastavro reads and writes).

:class:`RecordWriter` is how one event class is written with one schema: which fields go
into the envelope sub-record, which are graph unions (tuple notation) or nested records,
which must be ints. :func:`record_builder` is the way back, for records read with one
schema: on the hot path of a replay it builds the frozen, slotted dataclass without its
``__init__`` (see ``_can_skip_init``). Nothing here knows about schema ids or framing
(:mod:`registry.wire.codec`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import CodecError, UnknownEventTypeError
from ..events import NESTED_TYPES, Event, GraphRef, InlineGraph
from .schemas import AVRO_NAMESPACE

if TYPE_CHECKING:
    from .catalog import CatalogEntry

__all__ = ["RecordWriter", "record_builder", "to_avro"]

_ENVELOPE_FIELD = "envelope"
_ENVELOPE_NAMES = tuple(f.name for f in dataclasses.fields(Event))
_INLINE_GRAPH = f"{AVRO_NAMESPACE}.InlineGraph"
_GRAPH_REF = f"{AVRO_NAMESPACE}.GraphRef"
_INT_TYPES = frozenset({"int", "long"})


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


def to_avro(value: Any) -> Any:
    """A nested dataclass (see ``NESTED_TYPES``) as an Avro datum: dicts, lists."""
    if isinstance(value, tuple):
        return [to_avro(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_avro(getattr(value, f.name)) for f in dataclasses.fields(value)}
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

        def record(value: dict[str, Any] | tuple[str, dict[str, Any]]) -> Any:
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
    # The slot descriptors (the classes' own __dict__ holds them).
    _set_data = InlineGraph.__dict__["data"].__set__
    _set_uri = GraphRef.__dict__["uri"].__set__
    _set_sha256 = GraphRef.__dict__["sha256"].__set__
    _set_size = GraphRef.__dict__["size"].__set__

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


class RecordWriter:
    """How to write one event class with one schema: parsed writer schema and field plan."""

    __slots__ = ("cls", "envelope", "graphs", "ints", "nested", "payload", "schema", "version")

    def __init__(self, cls: type[Event], entry: CatalogEntry) -> None:
        """Plan writing ``cls`` with ``entry``'s schema; :class:`CodecError` if they do not
        fit (a schema field without a default the class lacks, a class field the schema
        cannot carry)."""
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
            rec[name] = to_avro(rec[name])
        rec[_ENVELOPE_FIELD] = env
        return rec


def record_builder(cls: type[Event], parsed: dict[str, Any]) -> Callable[[dict[str, Any]], Event]:
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
