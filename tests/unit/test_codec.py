"""Unit tests of the Avro schemas, the schema catalog and the codec (no broker)."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import types
import typing
from importlib.resources import files
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.codec import (
    Catalog,
    Codec,
    check_catalog,
    decode,
    default_codec,
    encode,
    fingerprint,
    plan_catalog_update,
    resolved_schemas,
)
from registry.errors import CodecError, ConfigError, UnknownEventTypeError, UnknownSchemaError
from registry.events import (
    CHECKPOINT_FAILURE_REASONS,
    EMPTY_CHECKPOINTS,
    EVENT_TYPES,
    NESTED_TYPES,
    CallCommitted,
    CheckpointCompleted,
    CheckpointDiscarded,
    CheckpointFailed,
    CheckpointState,
    CheckpointTriggered,
    CompletedCheckpoint,
    Event,
    GraphRef,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobCleanedUp,
    JobEvent,
    JobLockReleased,
    JobReasserted,
    JobRecoveryFailed,
    JobRescaled,
    JobRestarted,
    JobStatus,
    JobSubmitted,
    JobTerminated,
    LeaderInformationPublished,
    LeadershipGranted,
    LeadershipRevoked,
    LeaseRenewed,
    VertexParallelism,
)

SCHEMAS = files("registry.schemas")
CATALOG = Catalog.load()
CODEC = Codec(CATALOG)
ENVELOPE_NAMES = [f.name for f in dataclasses.fields(Event)]
EVENT_ID = "6f1c2c1e-1111-4111-8111-111111111111"

# --------------------------------------------------------------------------- strategies

texts = st.text(max_size=30)  # any unicode except lone surrogates (not UTF-8 encodable)
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
graphs = st.one_of(
    st.builds(InlineGraph, st.binary(max_size=200)),
    st.builds(GraphRef, texts, texts, longs),
)
ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
id_tuples = st.lists(longs, max_size=5).map(lambda xs: tuple(sorted(set(xs))))
checkpoint_states = st.builds(
    CheckpointState,
    seq=longs,
    last_completed=longs,
    retained=st.lists(st.builds(CompletedCheckpoint, longs, texts), max_size=3).map(tuple),
    pending=id_tuples,
    discarded=id_tuples,
    counted=id_tuples,
    unknown_failures=longs,
    requirements=st.lists(st.builds(VertexParallelism, texts, ints, ints),
                          max_size=3).map(tuple),
)
ENVELOPE = {
    "event_id": st.one_of(st.uuids().map(str), texts),
    "namespace": texts,
    "epoch": longs,
    "writer": texts,
    "created_at": longs,
    "schema_version": st.integers(min_value=-5, max_value=5),  # overwritten by the codec
}
PAYLOAD: dict[type[Event], dict[str, st.SearchStrategy[Any]]] = {
    LeadershipGranted: {"prev_epoch": longs, "lease_ms": st.none() | longs,
                        "partitions": st.integers(0, 2**31 - 1),
                        "partition": st.integers(-1, 2**31 - 1),
                        "saw_renewal": st.none() | longs, "layout": longs},
    LeadershipRevoked: {"reason": texts},
    JobSubmitted: {
        "job_id": texts,
        "graph": graphs,
        "max_checkpoint_failures": ints,
        "retained_checkpoints": ints,
        "call_id": st.none() | texts,
    },
    JobAdopted: {"job_id": texts, "call_id": st.none() | texts},
    JobLockReleased: {"job_id": texts},
    JobCancelled: {"job_id": texts, "reason": texts, "graph": st.none() | graphs,
                   "checkpoints": checkpoint_states},
    JobTerminated: {
        "job_id": texts,
        "state": st.sampled_from(["FINISHED", "FAILED"]) | texts,
        "reason": texts,
        "graph": st.none() | graphs,
        "checkpoints": checkpoint_states,
    },
    JobCleanedUp: {"job_id": texts, "status": st.sampled_from(JobStatus.ALL) | texts,
                   "reason": st.none() | texts, "end_event_id": st.none() | texts},
    JobReasserted: {
        "job_id": texts,
        "status": st.sampled_from(JobStatus.ALL) | texts,
        "owner_epoch": st.none() | longs,
        "graph": st.none() | graphs,
        "error": st.none() | texts,
        "max_checkpoint_failures": ints,
        "retained_checkpoints": ints,
        "checkpoints": checkpoint_states,
        "reason": st.none() | texts,
        "dirty": st.booleans(),
    },
    JobRecoveryFailed: {"job_id": texts, "error": texts, "call_id": st.none() | texts},
    LeaseRenewed: {"renewal": st.none() | longs, "attempts": st.none() | longs},
    LeaderInformationPublished: {"component": texts, "session": texts,
                                 "address": st.none() | texts},
    CallCommitted: {"size": ints},
    CheckpointTriggered: {"job_id": texts, "checkpoint_id": longs, "state": checkpoint_states},
    CheckpointCompleted: {
        "job_id": texts,
        "checkpoint_id": longs,
        "state": checkpoint_states,
        "location": texts,
        "retained": ints,
    },
    CheckpointFailed: {
        "job_id": texts,
        "checkpoint_id": longs,
        "state": checkpoint_states,
        "reason": texts,
        "failure_reason": st.sampled_from(CHECKPOINT_FAILURE_REASONS),
        "task": st.none() | texts,
        "reason_counts": st.none() | st.booleans(),
    },
    JobRescaled: {
        "job_id": texts,
        "checkpoint_id": longs,
        "state": checkpoint_states,
        "reason": texts,
    },
    JobRestarted: {
        "job_id": texts,
        "checkpoint_id": longs,
        "state": checkpoint_states,
        "reason": texts,
    },
    CheckpointDiscarded: {
        "job_id": texts,
        "checkpoint_id": longs,
        "state": checkpoint_states,
        "reason": texts,
    },
}


def events_of(cls: type[Event]) -> st.SearchStrategy[Event]:
    """Events of one type with arbitrary field values."""
    return st.fixed_dictionaries({**ENVELOPE, **PAYLOAD[cls]}).map(lambda kw: cls(**kw))


any_event = st.sampled_from(list(EVENT_TYPES.values())).flatmap(events_of)


def envelope(**over: Any) -> dict[str, Any]:
    """Fixed envelope kwargs for hand-written events."""
    kw: dict[str, Any] = {
        "event_id": EVENT_ID,
        "namespace": "ns",
        "epoch": 7,
        "writer": "w1",
        "created_at": 1_700_000_000_000,
    }
    kw.update(over)
    return kw


def submitted(graph: Any = None, **over: Any) -> JobSubmitted:
    """A JobSubmitted with a 100-byte inline graph by default."""
    return JobSubmitted(
        **envelope(**over), job_id="job-1", graph=graph or InlineGraph(bytes(range(100)))
    )


def writer_entry(event: Event, catalog: Catalog = CATALOG):
    """The schema ``event`` is written with: its type's current one, but for a record without
    resource requirements the newest from before ``CheckpointState.requirements`` (so a
    jobreg before them reads it)."""
    current = catalog.current(event.TYPE)
    carries = any(getattr(getattr(event, n, None), "requirements", ())
                  for n in ("state", "checkpoints"))
    if carries or "requirements" not in json.dumps(current.schema):
        return current
    before = [e for e in catalog.entries()
              if e.type == event.TYPE and e.version == current.version - 1]
    return before[0] if before and "requirements" not in json.dumps(before[0].schema) \
        else current


def as_written(event: Event, catalog: Catalog = CATALOG) -> Event:
    """``event`` as a reader sees it: schema_version is the writer schema's version."""
    return dataclasses.replace(event, schema_version=writer_entry(event, catalog).version)


# --------------------------------------------------------------------------- helpers


def catalog_dict(catalog: Catalog = CATALOG) -> dict[str, Any]:
    """A deep copy of a catalog's JSON object (safe to modify)."""
    return copy.deepcopy(catalog.to_dict())


def with_entries(*entries: dict[str, Any], base: Catalog = CATALOG) -> Catalog:
    """``base`` plus extra catalog entries."""
    data = catalog_dict(base)
    data["schemas"].extend(entries)
    return Catalog.from_dict(data)


def codec_over(*entries: dict[str, Any], schema_registry: Any = None) -> Codec:
    """A codec over the installed catalog plus ``entries`` (e.g. a v2 of a type)."""
    return Codec(with_entries(*entries), schema_registry=schema_registry)


EXTRA_FIELD = {
    "name": "cancelled_by",
    "type": "string",
    "default": "unknown",
    "doc": "Who cancelled the job (added in v2).",
}


NEXT_ID = max(e.id for e in CATALOG.entries()) + 1  # the id a new catalog entry gets
NEXT_VERSION = CATALOG.current_version("JobCancelled") + 1  # of the JobCancelled below


def cancelled_v2(schema_id: int = NEXT_ID) -> dict[str, Any]:
    """Catalog entry: the next JobCancelled version: the current one plus a string field with
    a default (named v2 in these tests)."""
    schema = copy.deepcopy(CATALOG.current("JobCancelled").schema)
    schema["fields"].append(dict(EXTRA_FIELD))
    return {"id": schema_id, "type": "JobCancelled", "version": NEXT_VERSION, "schema": schema}


def frame(schema_id: int, body: bytes) -> bytes:
    """Confluent wire format: magic 0, 4-byte big-endian id, body."""
    return struct.pack(">BI", 0, schema_id) + body


def avro_body(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """Schemaless Avro encoding of ``record`` with ``schema``."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


class NotFound(Exception):
    """Shaped like confluent_kafka's SchemaRegistryError for a missing schema."""

    http_status_code = 404
    error_code = 40403


class FakeRegistry:
    """In-memory schema registry with the two methods the codec uses.

    The real mock (``confluent_kafka.schema_registry`` ``mock://`` client) is
    tested too, but needs the ``schemaregistry`` extras of confluent-kafka.
    """

    def __init__(self, first_id: int = 100) -> None:
        self.by_id: dict[int, Any] = {}
        self.ids: dict[tuple[str, str], int] = {}
        self.next_id = first_id
        self.registrations: list[str] = []

    def register_schema(self, subject: str, schema: Any, normalize_schemas: bool = False) -> int:
        self.registrations.append(subject)
        key = (subject, schema.schema_str)
        if key not in self.ids:
            self.ids[key] = self.next_id
            self.by_id[self.next_id] = schema
            self.next_id += 1
        return self.ids[key]

    def get_schema(self, schema_id: int) -> Any:
        if schema_id not in self.by_id:
            raise NotFound(f"schema {schema_id} not found")
        return self.by_id[schema_id]


def mock_registry() -> Any:
    """confluent-kafka's in-memory mock registry client.

    In confluent-kafka 2.16 ``SchemaRegistryClient({"url": "mock://..."})`` is a
    real HTTP client; the mock is ``SchemaRegistryClient.new_client`` and its
    store belongs to the client instance, so codecs share the client object.
    """
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient.new_client({"url": "mock://jobreg-test"})


# --------------------------------------------------------------------------- round trips


def test_strategies_cover_every_event_type() -> None:
    assert set(PAYLOAD) == set(EVENT_TYPES.values())
    for cls, fields in PAYLOAD.items():
        assert set(ENVELOPE) | set(fields) == {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("type_name", list(EVENT_TYPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_every_event_type(type_name: str, data: st.DataObject) -> None:
    event = data.draw(events_of(EVENT_TYPES[type_name]))
    raw = CODEC.encode(event)
    assert raw[0] == 0
    assert int.from_bytes(raw[1:5], "big") == writer_entry(event).id
    assert CODEC.decode(raw) == as_written(event)


def test_a_record_without_requirements_is_written_as_a_jobreg_before_them_reads_it() -> None:
    """A rolling upgrade's old standby (a jobreg before CheckpointState.requirements) reads a
    new leader's checkpoint records, cancels and terminates; only a rescaled job's records
    need the newer schemas (the twentieth adversarial read's M3)."""
    from registry.events import VertexParallelism

    before = Catalog.from_dict({"schemas": [d for d in catalog_dict()["schemas"]
                                            if d["id"] <= 39]})
    old = Codec(before)
    plain = CheckpointState(seq=1, pending=(1,))
    rescaled = CheckpointState(seq=2, requirements=(VertexParallelism("0" * 32, 1, 2),))
    common = dict(event_id="e", namespace="ns", epoch=1, writer="w", created_at=0)
    for event in (CheckpointTriggered(job_id="a", checkpoint_id=1, state=plain, **common),
                  JobCancelled(job_id="a", reason="user", **common),
                  JobTerminated(job_id="a", state="FINISHED", checkpoints=plain, **common),
                  JobReasserted(job_id="a", status="ACTIVE", owner_epoch=None, graph=None,
                                checkpoints=plain, **common)):
        assert old.decode(CODEC.encode(event)) == as_written(event)
    for event in (CheckpointTriggered(job_id="a", checkpoint_id=3, state=rescaled, **common),
                  JobRescaled(job_id="a", checkpoint_id=-1, state=rescaled, **common)):
        with pytest.raises(UnknownSchemaError, match="newer jobreg"):
            old.decode(CODEC.encode(event))
        assert CODEC.decode(CODEC.encode(event)) == as_written(event)


@settings(max_examples=200, deadline=None)
@given(event=any_event)
def test_a_writer_knows_the_event_a_reader_decodes(event: Event) -> None:
    """The client folds what it wrote from the events it encoded, not from the bytes: the
    two must be equal in every field, the uncompared ``schema_version`` included (the fold
    reads it)."""
    data, as_read = CODEC.encode_as_read(event)
    decoded = CODEC.decode(data)
    assert as_read == decoded and as_read.schema_version == decoded.schema_version
    assert dataclasses.asdict(as_read) == dataclasses.asdict(decoded)


@settings(max_examples=100, deadline=None)
@given(event=any_event)
def test_round_trip_through_module_shortcuts(event: Event) -> None:
    assert decode(encode(event)) == as_written(event)


@pytest.mark.parametrize(
    "graph",
    [InlineGraph(b""), InlineGraph(b"\x00\xff" * 50), GraphRef("s3://b/k", "ab" * 32, 2**40)],
    ids=["empty-inline", "inline", "ref"],
)
def test_job_submitted_graph_branches(graph: InlineGraph | GraphRef) -> None:
    event = submitted(graph)
    decoded = CODEC.decode(CODEC.encode(event))
    assert decoded == event
    assert type(decoded.graph) is type(graph)


@pytest.mark.parametrize(
    "graph",
    [None, InlineGraph(b"g"), GraphRef("file:///x", "00" * 32, 0)],
    ids=["none", "inline", "ref"],
)
@pytest.mark.parametrize("owner_epoch", [None, 0, 2**63 - 1])
def test_job_reasserted_optional_fields(graph: Any, owner_epoch: int | None) -> None:
    event = JobReasserted(
        **envelope(), job_id="j", status="ACTIVE", owner_epoch=owner_epoch, graph=graph
    )
    decoded = CODEC.decode(CODEC.encode(event))
    assert decoded == event
    assert type(decoded.graph) is type(graph)


def test_graph_union_is_written_by_name_not_by_shape() -> None:
    # A GraphRef and an InlineGraph must never be confused, even when empty.
    ref = CODEC.encode(submitted(GraphRef("", "", 0)))
    inline = CODEC.encode(submitted(InlineGraph(b"")))
    assert ref != inline
    assert isinstance(CODEC.decode(ref).graph, GraphRef)
    assert isinstance(CODEC.decode(inline).graph, InlineGraph)


def test_schema_version_is_the_writer_schema_version() -> None:
    event = LeadershipRevoked(**envelope(), schema_version=42, reason="bye")
    decoded = CODEC.decode(CODEC.encode(event))
    assert decoded.schema_version == CATALOG.current_version("LeadershipRevoked") == 1
    assert decoded == event  # the encoding's version is not part of what happened


def test_decoded_events_are_normal_frozen_dataclasses() -> None:
    event = submitted()
    decoded = CODEC.decode(CODEC.encode(event))
    assert decoded == event and hash(decoded) == hash(event)
    assert repr(decoded) == repr(as_written(event))
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.epoch = 8  # type: ignore[misc]
    assert dataclasses.asdict(decoded) == dataclasses.asdict(as_written(event))


def test_decode_accepts_any_bytes_like() -> None:
    raw = CODEC.encode(submitted())
    assert CODEC.decode(bytearray(raw)) == CODEC.decode(memoryview(raw)) == submitted()


def test_default_codec_is_a_singleton_over_the_installed_catalog() -> None:
    assert default_codec() is default_codec()
    assert default_codec().catalog.to_dict() == CATALOG.to_dict()
    assert default_codec().schema_registry is None


def test_decode_record_gives_the_avro_dict() -> None:
    type_name, rec = CODEC.decode_record(CODEC.encode(submitted()))
    assert type_name == "JobSubmitted"
    assert rec["envelope"]["epoch"] == 7
    assert rec["graph"] == ("jobreg.InlineGraph", {"data": bytes(range(100))})


# --------------------------------------------------------------------------- encode errors


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (submitted(epoch="7"), "epoch"),  # a str where an int belongs
        (submitted(epoch=7.5), "epoch"),  # would be silently truncated by fastavro
        (submitted(created_at=True), "created_at"),  # bools are not ints
        (submitted(epoch=2**63), None),  # out of the Avro long range
        (submitted(epoch=-(2**63) - 1), None),
        (submitted(GraphRef("u", "s", "3")), "size"),
        (submitted(GraphRef("u", "s", 2**64)), None),
        (submitted(InlineGraph("not bytes")), None),  # type: ignore[arg-type]
        (submitted({"data": b"x"}), "InlineGraph or a GraphRef"),
        (JobSubmitted(**envelope(), job_id="j", graph=None), None),  # type: ignore[arg-type]
        (JobAdopted(**envelope(), job_id=5), "job_id"),  # type: ignore[arg-type]
        (JobAdopted(**envelope(), job_id=None), "job_id"),  # type: ignore[arg-type]
        (JobAdopted(**envelope(), job_id="\ud800"), None),  # not UTF-8 encodable
        (LeadershipGranted(**envelope(), prev_epoch=1, lease_ms="1"), "lease_ms"),
        (JobReasserted(**envelope(), job_id="j", status=1, owner_epoch=None, graph=None), None),
    ],
)
def test_encode_rejects_events_that_do_not_fit_the_schema(event: Event, match: str | None) -> None:
    with pytest.raises(CodecError, match=match) as info:
        CODEC.encode(event)
    assert not isinstance(info.value, UnknownSchemaError)


@pytest.mark.parametrize(
    "obj",
    [
        Event(**envelope()),
        JobEvent(**envelope(), job_id="j"),
        object(),
        {"job_id": "j"},
    ],
)
def test_encode_rejects_what_is_not_an_event_type(obj: Any) -> None:
    with pytest.raises(UnknownEventTypeError):
        CODEC.encode(obj)


# --------------------------------------------------------------------------- schemas and catalog


def _avsc_files() -> list[Any]:
    return sorted((p for p in SCHEMAS.iterdir() if p.name.endswith(".avsc")), key=lambda p: p.name)


def test_every_avsc_parses_and_is_named_after_its_file() -> None:
    texts_by_name = {
        p.name[: -len(".avsc")]: json.loads(p.read_text("utf-8")) for p in _avsc_files()
    }
    shared = ("jobreg.Envelope", "jobreg.InlineGraph", "jobreg.GraphRef",
              "jobreg.CompletedCheckpoint", "jobreg.VertexParallelism",
              "jobreg.CheckpointState")  # dependency order
    enums = ("jobreg.CheckpointFailureReason",)  # plain strings in the dataclasses
    expected = set(shared) | set(enums) | {f"jobreg.{t}" for t in EVENT_TYPES}
    assert set(texts_by_name) == expected
    assert {n.removeprefix("jobreg.") for n in shared[1:]} == set(NESTED_TYPES)
    named: dict[str, Any] = {}
    for name in (*shared, *enums):
        fastavro.parse_schema(texts_by_name[name], named)
    for name, schema in texts_by_name.items():
        assert schema["namespace"] == "jobreg" and f"jobreg.{schema['name']}" == name
        parsed = fastavro.parse_schema(schema, dict(named))
        assert parsed["name"] == name
    assert list(resolved_schemas()) == list(EVENT_TYPES)


def test_every_record_and_field_has_a_doc() -> None:
    for path in _avsc_files():
        schema = json.loads(path.read_text("utf-8"))
        assert schema.get("doc"), path.name
        for field in schema.get("fields", []):  # an enum has symbols, not fields
            assert field.get("doc"), f"{path.name}: {field['name']}"


def test_catalog_is_up_to_date() -> None:
    assert check_catalog() == []
    assert main(["--check"]) == 0


def test_catalog_is_one_to_one_with_event_types() -> None:
    assert CATALOG.types() == list(EVENT_TYPES)
    first = {e.type: e.id for e in CATALOG.entries() if e.version == 1}
    # ids never change: each type's first version got the next id when the type appeared
    assert [first[t] for t in EVENT_TYPES] == sorted(first.values())
    assert len(set(first.values())) == len(EVENT_TYPES)
    for type_name in EVENT_TYPES:
        assert CATALOG.type_of(CATALOG.writer_id(type_name)) == type_name
        assert CATALOG.schema(CATALOG.writer_id(type_name))["name"] == f"jobreg.{type_name}"


def _avro_type_of(annotation: Any, name: str) -> Any:
    """The Avro type a dataclass annotation must have in the schema."""
    if name == "schema_version":
        return "int"
    simple = {str: "string", int: "long", bytes: "bytes", bool: "boolean"}
    if annotation in simple:
        return simple[annotation]
    if annotation in NESTED_TYPES.values():
        return f"jobreg.{annotation.__name__}"
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = typing.get_args(annotation)
        branches = [_avro_type_of(a, name) for a in args if a is not type(None)]
        return ["null", *branches] if type(None) in args else branches
    raise AssertionError(f"no Avro mapping for {annotation!r} ({name})")


def _schema_type(avro_type: Any) -> Any:
    """A field type with named types reduced to their full name."""
    if isinstance(avro_type, list):
        return [_schema_type(b) for b in avro_type]
    if isinstance(avro_type, dict):
        # an enum's symbols travel as plain strings (CheckpointFailed.failure_reason)
        return "string" if avro_type.get("type") == "enum" else avro_type["name"]
    return avro_type


def _check_fields(cls: type, fields: list[dict[str, Any]], names: list[str]) -> None:
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    assert [f["name"] for f in fields] == names, cls.__name__
    for field in fields:
        name = field["name"]
        assert _schema_type(field["type"]) == _avro_type_of(hints[name], name), (cls, name)
        default = by_name[name].default
        if dataclasses.is_dataclass(default):
            default = dataclasses.asdict(default)
            default = {k: list(v) if isinstance(v, tuple) else v for k, v in default.items()}
        if default is not dataclasses.MISSING and name != "schema_version":
            assert field.get("default", "<none>") == default, (cls, name)
        if isinstance(field["type"], list) and field["type"][0] == "null":
            assert field.get("default", "<none>") is None, (cls, name)


@pytest.mark.parametrize("type_name", list(EVENT_TYPES))
def test_dataclass_and_schema_cannot_drift(type_name: str) -> None:
    cls = EVENT_TYPES[type_name]
    schema = CATALOG.current(type_name).schema
    envelope_field, *payload = schema["fields"]
    assert envelope_field["name"] == "envelope"
    assert envelope_field["type"]["name"] == "jobreg.Envelope"
    _check_fields(cls, envelope_field["type"]["fields"], ENVELOPE_NAMES)
    payload_names = [f.name for f in dataclasses.fields(cls) if f.name not in ENVELOPE_NAMES]
    _check_fields(cls, payload, payload_names)


def test_graph_records_match_their_dataclasses() -> None:
    for cls in (InlineGraph, GraphRef):
        schema = json.loads(SCHEMAS.joinpath(f"jobreg.{cls.__name__}.avsc").read_text("utf-8"))
        _check_fields(cls, schema["fields"], [f.name for f in dataclasses.fields(cls)])


def test_catalog_accessors_and_errors() -> None:
    assert CATALOG.current_version("JobSubmitted") == 3  # v2: checkpoint budget; v3: call_id
    assert CATALOG.version_of(3) == 1 and CATALOG.type_of(3) == "JobSubmitted"
    assert len(CATALOG) == len(CATALOG.entries()) >= len(EVENT_TYPES)
    with pytest.raises(UnknownSchemaError, match="999"):
        CATALOG.schema(999)
    with pytest.raises(UnknownEventTypeError):
        CATALOG.writer_id("NoSuchEvent")
    assert Catalog.load(catalog_dict()).to_dict() == CATALOG.to_dict()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["schemas"].append(dict(d["schemas"][0])),  # duplicate id
        lambda d: d["schemas"].append({**d["schemas"][0], "id": 50}),  # duplicate version
        lambda d: d["schemas"][0].update(type="LeadershipRevoked"),  # name mismatch
        lambda d: d["schemas"][0].update(id=0),
        lambda d: d["schemas"][0].update(version="1"),
        lambda d: d["schemas"][0].update(schema={"type": "record", "name": "x"}),
        lambda d: d.pop("schemas"),
    ],
)
def test_malformed_catalogs_are_config_errors(mutate: Any) -> None:
    data = catalog_dict()
    mutate(data)
    with pytest.raises(ConfigError):
        Catalog.from_dict(data)


def test_missing_catalog_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Catalog.load(tmp_path / "nope.json")


@pytest.fixture
def schema_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the .avsc files and of the catalog, to run the maintenance CLI on."""
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    for path in _avsc_files():
        (schemas / path.name).write_text(path.read_text("utf-8"), encoding="utf-8")
    catalog = tmp_path / "catalog.json"
    catalog.write_text(SCHEMAS.joinpath("catalog.json").read_text("utf-8"), encoding="utf-8")
    return schemas, catalog


def main(args: list[str]) -> int:
    """``jobreg catalog ARGS``' exit status."""
    from click.testing import CliRunner

    from registry.cli import main as jobreg

    return CliRunner().invoke(jobreg, ["catalog", *args]).exit_code


def _edit_avsc(schemas: Path, full_name: str, edit: Any) -> None:
    path = schemas / f"{full_name}.avsc"
    schema = json.loads(path.read_text("utf-8"))
    edit(schema)
    path.write_text(json.dumps(schema, indent=2), encoding="utf-8")


def test_update_catalog_appends_a_new_version(schema_tree: tuple[Path, Path]) -> None:
    schemas, catalog = schema_tree
    args = ["--catalog", str(catalog), "--schemas-dir", str(schemas)]
    before = json.loads(catalog.read_text("utf-8"))
    _edit_avsc(schemas, "jobreg.JobCancelled", lambda s: s["fields"].append(dict(EXTRA_FIELD)))
    assert main(["--check", *args]) == 1
    assert main(["--update-catalog", *args]) == 0
    after = json.loads(catalog.read_text("utf-8"))
    assert after["schemas"][: len(before["schemas"])] == before["schemas"]  # never renumbered
    new = after["schemas"][-1]
    assert (new["id"], new["type"], new["version"]) == (NEXT_ID, "JobCancelled", NEXT_VERSION)
    assert main(["--check", *args]) == 0
    updated = Catalog.load(catalog)
    assert updated.writer_id("JobCancelled") == NEXT_ID
    assert updated.current_version("JobCancelled") == NEXT_VERSION
    # A change of a shared named type is a new version of every event that uses it.
    _edit_avsc(
        schemas,
        "jobreg.GraphRef",
        lambda s: s["fields"].append({"name": "mime", "type": "string", "default": "", "doc": "d"}),
    )
    users = ["JobSubmitted", "JobCancelled", "JobTerminated", "JobReasserted"]
    current = {t: CATALOG.current_version(t) for t in users} | {"JobCancelled": NEXT_VERSION}
    assert sorted(c.split(":")[0] for c in check_catalog(catalog, schemas)) == sorted(
        f"{t} v{current[t] + 1}" for t in users
    )
    assert main(["--update-catalog", *args]) == 0
    assert [e["id"] for e in json.loads(catalog.read_text("utf-8"))["schemas"]] == list(
        range(1, NEXT_ID + 1 + len(users))
    )


def test_doc_only_changes_refresh_the_entry_in_place(schema_tree: tuple[Path, Path]) -> None:
    schemas, catalog = schema_tree
    _edit_avsc(schemas, "jobreg.JobAdopted", lambda s: s.update(doc="A better doc."))
    changes = check_catalog(catalog, schemas)
    assert len(changes) == 1 and "JobAdopted v2 (id 18)" in changes[0]
    assert main(["--update-catalog", "--catalog", str(catalog), "--schemas-dir", str(schemas)]) == 0
    updated = Catalog.load(catalog)
    assert len(updated) == len(CATALOG)
    assert updated.current("JobAdopted").schema["doc"] == "A better doc."
    assert updated.current("JobAdopted").fingerprint == CATALOG.current("JobAdopted").fingerprint


def test_update_catalog_creates_the_initial_catalog(schema_tree: tuple[Path, Path]) -> None:
    schemas, catalog = schema_tree
    catalog.unlink()
    args = ["--catalog", str(catalog), "--schemas-dir", str(schemas)]
    assert main(["--check", *args]) == 1
    assert main(["--update-catalog", *args]) == 0
    fresh = Catalog.load(catalog)
    assert [e.id for e in fresh.entries()] == list(range(1, len(EVENT_TYPES) + 1))
    for type_name in EVENT_TYPES:  # a fresh catalog holds today's schemas as version 1
        assert fresh.current(type_name).schema == CATALOG.current(type_name).schema


def test_plan_is_idempotent_and_bad_schema_dirs_are_config_errors(tmp_path: Path) -> None:
    data = catalog_dict()
    assert plan_catalog_update(data, resolved_schemas()) == (data, [])
    with pytest.raises(ConfigError):
        resolved_schemas(tmp_path)
    shutil.copy(SCHEMAS.joinpath("jobreg.JobAdopted.avsc"), tmp_path / "jobreg.JobAdopted.avsc")
    with pytest.raises(ConfigError):
        resolved_schemas(tmp_path)


def test_catalog_command_check() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "registry.cli", "catalog", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stdout


def test_fingerprint_ignores_docs_and_defaults() -> None:
    schema = copy.deepcopy(CATALOG.current("JobCancelled").schema)
    base = fingerprint(schema)
    schema["doc"] = "other"
    next(f for f in schema["fields"] if f["name"] == "reason")["default"] = "x"
    assert fingerprint(schema) == base
    schema["fields"].append(dict(EXTRA_FIELD))
    assert fingerprint(schema) != base


# --------------------------------------------------------------------------- schema evolution


def test_v1_record_decodes_with_a_v2_reader_default_filled() -> None:
    event = JobCancelled(**envelope(), job_id="j", reason="r")
    raw = CODEC.encode(event)  # written with the current version
    reader = codec_over(cancelled_v2())
    assert reader.catalog.writer_id("JobCancelled") == NEXT_ID
    assert reader.decode(raw) == event  # schema_version stays the writer's
    type_name, rec = reader.decode_record(raw)
    assert type_name == "JobCancelled"
    assert rec["cancelled_by"] == "unknown"
    assert rec["envelope"]["schema_version"] == as_written(event).schema_version


def test_v2_writer_fills_defaults_for_fields_the_dataclass_lacks() -> None:
    writer = codec_over(cancelled_v2())
    raw = writer.encode(JobCancelled(**envelope(), job_id="j", reason="r"))
    assert int.from_bytes(raw[1:5], "big") == NEXT_ID
    decoded = writer.decode(raw)
    assert decoded.schema_version == NEXT_VERSION and decoded.reason == "r"
    assert writer.decode_record(raw)[1]["cancelled_by"] == "unknown"


def test_v2_record_is_unknown_to_a_v1_catalog_reader() -> None:
    raw = codec_over(cancelled_v2()).encode(JobCancelled(**envelope(), job_id="j"))
    with pytest.raises(UnknownSchemaError, match=rf"schema id {NEXT_ID} .*upgrade"):
        CODEC.decode(raw)


def test_v2_record_decodes_with_a_v1_reader_through_the_registry() -> None:
    registry = FakeRegistry()
    v2 = cancelled_v2()
    # A newer writer (knows v2) sets the new field; an older reader (v1 only) drops it.
    writer_id = registry.register_schema(
        "jobreg.JobCancelled", Schema(json.dumps(v2["schema"]), "AVRO")
    )
    event = JobCancelled(**envelope(), job_id="j", reason="r")
    record = {
        "envelope": {**envelope(), "schema_version": NEXT_VERSION},
        "job_id": "j",
        "reason": "r",
        "graph": None,
        "checkpoints": dataclasses.asdict(EMPTY_CHECKPOINTS),
        "cancelled_by": "alice",
    }
    raw = frame(writer_id, avro_body(v2["schema"], record))
    old_reader = Codec(CATALOG, schema_registry=registry)
    assert old_reader.decode(raw) == dataclasses.replace(event, schema_version=NEXT_VERSION)
    assert "cancelled_by" not in old_reader.decode_record(raw)[1]
    new_reader = codec_over(v2, schema_registry=registry)
    assert new_reader.decode_record(raw)[1]["cancelled_by"] == "alice"


def test_identical_writer_schema_decodes_without_resolution() -> None:
    raw = CODEC.encode(submitted())
    CODEC.decode(raw)
    assert CODEC._readers[CATALOG.writer_id("JobSubmitted")].reader is None
    reader = codec_over(cancelled_v2())
    cancel = JobCancelled(**envelope(), job_id="j")
    reader.decode(CODEC.encode(cancel))
    assert reader._readers[writer_entry(cancel).id].reader is not None


# --------------------------------------------------------------------------- garbage


_PYTHON_ERROR = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b")


def _must_raise_only_codec_errors(data: Any, codec: Codec = CODEC) -> None:
    """Only CodecError, and its message is one line in words: no Python exception name
    pasted in (issue 26: `cannot decode ...: EOFError: Expected -4398046511104 bytes`)."""
    try:
        event = codec.decode(data)
    except CodecError as e:
        assert "\n" not in str(e) and not _PYTHON_ERROR.search(str(e)), str(e)
        return
    assert isinstance(event, Event)


@pytest.mark.parametrize("body,said", [
    (b"\xff" * 6 + b"\x01", "a string length of -4398046511104 at byte 5 (field "
                           "envelope.event_id)"),
    (b"\x02", "a string length of 1 with 0 byte(s) left at byte 5 (field envelope.event_id)"),
    (b"\xff" * 11, "a number longer than 10 bytes at byte 5 (field envelope.event_id)"),
    (b"\x02\xff", "a string that is not UTF-8 at byte 5 (field envelope.event_id)"),
])
def test_a_body_that_does_not_match_its_schema_is_said_in_words(body: bytes, said: str) -> None:
    schema_id = CODEC.catalog.current("JobCancelled").id
    with pytest.raises(CodecError) as e:
        CODEC.decode(frame(schema_id, body))
    assert str(e.value) == (f"the body does not match schema id {schema_id} (JobCancelled): "
                            + said)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_codec_errors(data: bytes) -> None:
    _must_raise_only_codec_errors(data)


@settings(max_examples=500, deadline=None)
@given(
    schema_id=st.sampled_from([*range(1, NEXT_ID + 1), 2**31, 2**32 - 1]),
    body=st.binary(max_size=300),
)
def test_valid_header_and_random_body_raise_only_codec_errors(schema_id: int, body: bytes) -> None:
    _must_raise_only_codec_errors(frame(schema_id, body))


@settings(max_examples=300, deadline=None)
@given(event=any_event, data=st.data())
def test_corrupted_records_raise_only_codec_errors(event: Event, data: st.DataObject) -> None:
    raw = bytearray(CODEC.encode(event))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    _must_raise_only_codec_errors(bytes(raw[:cut]))
    _must_raise_only_codec_errors(bytes(raw))


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00\x00", "text", None, 42, [0, 0]])
def test_not_the_wire_format(data: Any) -> None:
    with pytest.raises(CodecError) as info:
        CODEC.decode(data)
    assert type(info.value) is CodecError


def test_wrong_magic_byte() -> None:
    raw = CODEC.encode(submitted())
    with pytest.raises(CodecError, match="not in the Confluent wire format"):
        CODEC.decode(b"\x01" + raw[1:])


def test_unknown_schema_id_names_the_id_and_says_upgrade() -> None:
    raw = CODEC.encode(submitted())
    with pytest.raises(UnknownSchemaError, match=r"schema id 999\b.*upgrade"):
        CODEC.decode(frame(999, raw[5:]))


@pytest.mark.parametrize("schema_id", [0, NEXT_ID + 5000, 0x63636363])
def test_an_id_no_jobreg_writes_is_not_a_jobreg_record(schema_id: int) -> None:
    """Issue 15 item 5: garbage with a zero magic byte is not taken for a newer jobreg's."""
    with pytest.raises(UnknownSchemaError, match=rf"not a jobreg record: schema id {schema_id}\b"):
        CODEC.decode(frame(schema_id, b"garbage"))


def test_every_truncation_is_a_codec_error() -> None:
    for event in (submitted(), submitted(GraphRef("u", "s", 1))):
        raw = CODEC.encode(event)
        for cut in range(len(raw)):
            with pytest.raises(CodecError):
                CODEC.decode(raw[:cut])


def test_trailing_bytes_are_a_codec_error() -> None:
    raw = CODEC.encode(submitted())
    with pytest.raises(CodecError, match="trailing"):
        CODEC.decode(raw + b"\x00")


def test_body_of_another_type_is_a_codec_error() -> None:
    body = CODEC.encode(submitted())[5:]
    with pytest.raises(CodecError):
        CODEC.decode(frame(CATALOG.writer_id("LeadershipRevoked"), body))
    revoked = CODEC.encode(LeadershipRevoked(**envelope(), reason="r"))[5:]
    with pytest.raises(CodecError):
        CODEC.decode(frame(CATALOG.writer_id("JobSubmitted"), revoked))


def test_invalid_utf8_is_a_codec_error() -> None:
    raw = CODEC.encode(JobAdopted(**envelope(), job_id="jj"))
    bad = raw.replace(b"\x04jj", b"\x04\xff\xfe")
    assert bad != raw
    with pytest.raises(CodecError):
        CODEC.decode(bad)


def test_catalog_type_that_is_not_an_event_is_unknown_event_type() -> None:
    schema = copy.deepcopy(CATALOG.current("JobAdopted").schema)
    schema["name"] = "jobreg.JobTeleported"
    codec = codec_over({"id": 77, "type": "JobTeleported", "version": 1, "schema": schema})
    body = CODEC.encode(JobAdopted(**envelope(), job_id="j"))[5:]
    with pytest.raises(UnknownEventTypeError, match="JobTeleported"):
        codec.decode(frame(77, body))


# --------------------------------------------------------------------------- schema registry


def test_registry_mode_registers_once_and_decodes_in_another_codec() -> None:
    registry = FakeRegistry()
    writer = Codec(CATALOG, schema_registry=registry)
    events = [submitted(), JobAdopted(**envelope(), job_id="j"), submitted(epoch=8)]
    raws = [writer.encode(e) for e in events]
    assert registry.registrations == ["jobreg.JobSubmitted", "jobreg.JobAdopted"]
    assert {int.from_bytes(r[1:5], "big") for r in raws} == {100, 101}
    reader = Codec(CATALOG, schema_registry=registry)
    assert [reader.decode(r) for r in raws] == events
    assert reader._readers[100].reader is None  # same schema: no resolution needed
    with pytest.raises(UnknownSchemaError, match="3"):
        reader.decode(frame(3, raws[0][5:]))  # a catalog id means nothing to the registry


def test_registry_ids_are_not_catalog_ids() -> None:
    registry = FakeRegistry(first_id=1)  # like the mock: ids from 1, as in the catalog
    event = JobAdopted(**envelope(), job_id="j")
    raw = Codec(CATALOG, schema_registry=registry).encode(event)
    assert int.from_bytes(raw[1:5], "big") == 1 != CATALOG.writer_id("JobAdopted")
    assert Codec(CATALOG, schema_registry=registry).decode(raw) == event
    assert isinstance(CODEC.decode(Codec(CATALOG).encode(event)), JobAdopted)


def test_registry_subject_prefix() -> None:
    registry = FakeRegistry()
    Codec(CATALOG, schema_registry=registry, subject_prefix="acme").encode(submitted())
    assert registry.registrations == ["acme.JobSubmitted"]


def test_registry_schema_that_is_not_an_event_is_unknown_event_type() -> None:
    registry = FakeRegistry()
    foreign = {"type": "record", "name": "Other", "namespace": "acme", "fields": []}
    sid = registry.register_schema("acme.Other", Schema(json.dumps(foreign), "AVRO"))
    with pytest.raises(UnknownEventTypeError, match="acme.Other"):
        Codec(CATALOG, schema_registry=registry).decode(frame(sid, b""))


def test_registry_failures_are_codec_errors() -> None:
    class Down:
        def register_schema(self, subject: str, schema: Any) -> int:
            raise ConnectionError("registry down")

        def get_schema(self, schema_id: int) -> Any:
            raise ConnectionError("registry down")

    codec = Codec(CATALOG, schema_registry=Down())
    with pytest.raises(CodecError, match="registry down"):
        codec.encode(submitted())
    with pytest.raises(CodecError, match="registry down") as info:
        codec.decode(frame(5, b""))
    assert not isinstance(info.value, UnknownSchemaError)


def test_confluent_mock_registry() -> None:
    registry = mock_registry()
    writer = Codec(CATALOG, schema_registry=registry)
    raw = writer.encode(submitted())
    assert Codec(CATALOG, schema_registry=registry).decode(raw) == submitted()
    with pytest.raises(UnknownSchemaError):
        Codec(CATALOG, schema_registry=registry).decode(frame(10_000, raw[5:]))
