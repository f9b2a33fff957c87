"""The codec: events <-> Confluent-framed Avro bytes, with the catalog or a schema registry.

Wire format (the Confluent wire format, so standard tooling can read the log)::

    byte 0      magic byte, always 0
    bytes 1..4  schema id, unsigned 32-bit big-endian
    bytes 5..   the event record, Avro binary encoding without a container

The schema id names the *writer* schema. Without a schema registry, ids come from the
versioned catalog (:mod:`registry.wire.catalog`); with a Confluent Schema Registry they are
the registry's ids. A reader decodes with the writer schema and resolves it against its own
*current* schema of the same event type (Avro schema resolution): fields an older writer
did not know get their defaults, fields a newer writer added are dropped.
"""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import threading
from typing import Any, cast

import fastavro

from ..errors import CodecError, UnknownEventTypeError, UnknownSchemaError
from ..events import EVENT_TYPES, Event
from .bodycheck import explain
from .catalog import Catalog, CatalogEntry
from .mapping import RecordWriter, record_builder
from .schemas import event_type_of, fingerprint

__all__ = ["MAGIC_BYTE", "Codec", "decode", "default_codec", "encode"]

MAGIC_BYTE = 0
"""First byte of every record in the Confluent wire format."""

_HEADER = struct.Struct(">BI")
_HEADER_SIZE = _HEADER.size


class _Writer(RecordWriter):
    """How to encode one event class: its record plan and the header of its schema id."""

    __slots__ = ("header",)

    def __init__(self, cls: type[Event], entry: CatalogEntry, schema_id: int) -> None:
        super().__init__(cls, entry)
        self.header = _HEADER.pack(MAGIC_BYTE, schema_id)


class _Reader:
    """How to decode one schema id: writer schema, reader schema (or None) and builder."""

    __slots__ = ("build", "reader", "type_name", "writer")

    def __init__(
        self, writer: dict[str, Any], reader: dict[str, Any] | None, type_name: str
    ) -> None:
        self.writer = writer
        self.reader = reader
        self.type_name = type_name
        self.build = record_builder(
            EVENT_TYPES[type_name], reader if reader is not None else writer
        )


def _registry_schema(schema_str: str) -> Any:
    # Imported here: the schema registry client pulls in an HTTP stack (the
    # 'schemaregistry' extra) that a catalog-only deployment never needs.
    from ..extras import needs

    with needs("schemaregistry", "a Codec with a schema registry"):
        from confluent_kafka.schema_registry import Schema

    return Schema(schema_str, "AVRO")


# --------------------------------------------------------------------------- codec


class Codec:
    """Encode events to, and decode them from, Confluent-framed Avro bytes.

    Parsed schemas and per-id decode plans are cached, so the per-record cost is
    one fastavro call plus building the dataclass. Instances are safe to share
    between threads (the caches are only ever filled with equal values).
    """

    __slots__ = ("_catalog", "_plain", "_readers", "_registry", "_subject_prefix", "_writers")

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
        self._plain: dict[type, _Writer | None] = {}
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
        """Encode ``event`` with the current schema of its type (a record without resource
        requirements: with the newest schema from before them, :meth:`_writer`).

        The envelope's ``schema_version`` is written as the version of the writer
        schema, whatever the dataclass says. Raises :class:`UnknownEventTypeError`
        for a class that is not one of :data:`~registry.events.EVENT_TYPES` and
        :class:`CodecError` for an event that does not fit its schema (wrong field
        types, out-of-range ints) or a schema registry failure.
        """
        return self._encode_with(self._writer(event), event)

    def _encode_with(self, writer: _Writer, event: Event) -> bytes:
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
        writer = self._writer(event)  # once: encode_as_read is on every write's path
        data = self._encode_with(writer, event)
        version = writer.version
        if event.schema_version != version:
            event = dataclasses.replace(event, schema_version=version)
        return data, event

    def _writer(self, event: Event) -> _Writer:
        # A record without resource requirements is written with the schema of its type from
        # just before CheckpointState.requirements (issue 43), while the current one is the
        # one that added them: a jobreg before it reads such a record as it always did (a
        # rolling upgrade's old standby would otherwise quarantine every checkpoint record,
        # cancel and terminate of a new leader, and could run a cancelled job again). Only a
        # record that carries requirements (a rescaled job's) needs the newer schema. A
        # later version of the type is written whole (it adds what the older one lacks).
        cls = type(event)
        if not _carries_requirements(event):
            plain = self._plain[cls] if cls in self._plain else self._plain_writer_for(event)
            if plain is not None:
                return plain
        writer = self._writers.get(cls)
        return writer if writer is not None else self._writer_for(event)

    def _plain_writer_for(self, event: Event) -> _Writer | None:
        cls = type(event)
        self._writer_for(event)  # the checks, and the current writer
        entry = self._catalog.current(cls.TYPE)
        plain = None
        if _has_requirements(entry.schema):
            before = [e for e in self._catalog.entries()
                      if e.type == cls.TYPE and e.version == entry.version - 1]
            if before and not _has_requirements(before[0].schema):
                schema_id = before[0].id if self._registry is None else self._register(before[0])
                plain = _Writer(cls, before[0], schema_id)
        self._plain[cls] = plain
        return plain

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
            said = " ".join(str(e).split()) or "a value out of range"
            raise CodecError(
                f"the body decodes but is not a valid {reader.type_name}: {said}"
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
        reader: _Reader | None = None
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
            if reader is None:  # the writer schema itself could not be made a decoder
                raise CodecError(f"schema id {schema_id} cannot be read with: "
                                 f"{' '.join(str(e).split()) or 'its schema does not parse'}"
                                 ) from e
            raise CodecError(_body_error(reader, schema_id, data)) from e
        if end != len(data):
            raise CodecError(
                f"{len(data) - end} trailing byte(s) after the Avro body "
                f"(schema id {schema_id}, {reader.type_name})"
            )
        # The writer schema is a jobreg event's record schema: its datum is a dict.
        return reader, cast(dict[str, Any], rec)

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
        type_name = event_type_of(parsed)
        assert isinstance(parsed, dict)  # event_type_of refused every schema but a record
        return parsed, type_name


def _body_error(reader: _Reader, schema_id: int, data: bytes) -> str:
    """What is wrong with a body fastavro could not decode, in words (no exception names):
    where it leaves its writer schema (:func:`~registry.wire.bodycheck.explain`)."""
    where = explain(reader.writer, data, _HEADER_SIZE)
    return (f"the body does not match schema id {schema_id} ({reader.type_name}): "
            + (where or f"its {len(data) - _HEADER_SIZE} byte(s) do not decode"))


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


def _carries_requirements(event: Event) -> bool:
    """Whether ``event`` holds resource requirements (a checkpoint state that has some)."""
    for name in ("state", "checkpoints"):
        state = getattr(event, name, None)
        if state is not None and bool(getattr(state, "requirements", None)):
            return True
    return False


def _has_requirements(schema: Any) -> bool:
    """Whether a resolved schema has a ``CheckpointState`` with ``requirements``."""
    if isinstance(schema, dict):
        if schema.get("type") == "record" and str(schema.get("name", "")).endswith(
                "CheckpointState"):
            return any(f.get("name") == "requirements" for f in schema.get("fields", ()))
        return any(_has_requirements(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_requirements(v) for v in schema)
    return False


def encode(event: Event) -> bytes:
    """Encode ``event`` with :func:`default_codec` (see :meth:`Codec.encode`)."""
    return default_codec().encode(event)


def decode(data: bytes) -> Event:
    """Decode ``data`` with :func:`default_codec` (see :meth:`Codec.decode`)."""
    return default_codec().decode(data)
