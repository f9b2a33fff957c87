"""The Avro schemas of the events: the ``.avsc`` files and what identifies a schema.

Every event type ``T`` has a file ``jobreg.T.avsc`` (the top-level ``schemas/`` folder,
installed as the package ``registry.schemas``); named types shared between events
(``jobreg.GraphRef``, ...) have their own files. :func:`resolved_schemas` loads them
through fastavro's schema repository, so a file names a shared type and fastavro inlines
it. :func:`fingerprint` is what tells two schemas apart: their Parsing Canonical Form.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from collections.abc import Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from fastavro.repository.base import AbstractSchemaRepository, SchemaRepositoryError
from fastavro.schema import load_schema, to_parsing_canonical_form

from ..errors import ConfigError, UnknownEventTypeError
from ..events import EVENT_TYPES

__all__ = ["AVRO_NAMESPACE", "SCHEMAS_PACKAGE", "event_type_of", "fingerprint",
           "resolved_schemas"]

AVRO_NAMESPACE = "jobreg"
"""Avro namespace of every jobreg schema (record full names are ``jobreg.<Type>``)."""

SCHEMAS_PACKAGE = "registry.schemas"
"""The package the ``.avsc`` files and the catalog are installed as."""


def fingerprint(schema: dict[str, Any] | str | list[Any]) -> str:
    """SHA-256 (hex) of the schema's Parsing Canonical Form (of a schema as JSON parses it:
    fastavro refuses other mappings).

    Two schemas with the same fingerprint encode every datum to the same bytes;
    docs, defaults and other attributes do not take part.
    """
    return hashlib.sha256(to_parsing_canonical_form(schema).encode("utf-8")).hexdigest()


def event_type_of(parsed: Mapping[str, Any] | str | list[Any]) -> str:
    """The event type a parsed record schema is (``jobreg.JobSubmitted`` -> ``JobSubmitted``).

    Raises :class:`UnknownEventTypeError` if it is not a record or not a jobreg event type.
    """
    return _type_from_name(_full_name(parsed))


def _full_name(parsed: Mapping[str, Any] | str | list[Any]) -> str:
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
            loaded = json.loads(text)
        except ValueError as e:
            raise SchemaRepositoryError(f"{name}.avsc is not valid JSON: {e}") from e
        if not isinstance(loaded, dict):
            raise SchemaRepositoryError(f"{name}.avsc is not a JSON object")
        return loaded


def _schemas_root(schemas_dir: str | os.PathLike[str] | Traversable | None) -> Traversable:
    if schemas_dir is None:
        return importlib.resources.files(SCHEMAS_PACKAGE)
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
