"""The versioned catalog of writer schemas (``schemas/catalog.json``) and its upkeep.

Without a schema registry, the schema id in front of every record is a catalog id. The
catalog is maintained with::

    jobreg catalog --update-catalog   # append new versions of changed .avsc files
    jobreg catalog --check            # exit 1 if the catalog is out of date

Ids and versions are stable forever: a changed schema (by Parsing Canonical Form, i.e. by
what the bytes mean, see :func:`~registry.wire.schemas.fingerprint`) is appended as a new
entry with a new id and version + 1; old entries stay so that old records still decode.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import fastavro

from ..errors import ConfigError, UnknownEventTypeError, UnknownSchemaError
from ..events import EVENT_TYPES
from .schemas import AVRO_NAMESPACE, SCHEMAS_PACKAGE, fingerprint, resolved_schemas

__all__ = [
    "CATALOG_FILE",
    "Catalog",
    "CatalogEntry",
    "check_catalog",
    "plan_catalog_update",
    "update_catalog",
]

CATALOG_FILE = "catalog.json"
"""File name of the versioned catalog inside the ``registry.schemas`` package."""

_NEWER_IDS = 1000
"""How far past the newest id it knows a reader takes an unknown schema id for a newer
jobreg's (each version adds a few); beyond, or id 0, the record is not a jobreg record."""

_MAX_SCHEMA_ID = 2**31 - 1  # Confluent ids are positive signed 32-bit integers


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
        if (not isinstance(parsed, dict) or parsed.get("type") != "record"
                or parsed.get("name") != expected):
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
            source = importlib.resources.files(SCHEMAS_PACKAGE).joinpath(CATALOG_FILE)
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
        return importlib.resources.files(SCHEMAS_PACKAGE).joinpath(CATALOG_FILE)
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
