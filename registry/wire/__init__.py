"""The registry log's records: Avro in the Confluent wire format, one module per job.

* :mod:`~registry.wire.schemas`: the ``.avsc`` files (loaded with fastavro's schema
  repository) and :func:`fingerprint`;
* :mod:`~registry.wire.catalog`: the versioned catalog of writer schemas
  (``schemas/catalog.json``, installed as ``registry.schemas``) and its upkeep, the
  ``jobreg catalog`` command's logic;
* :mod:`~registry.wire.mapping`: event dataclasses <-> Avro records, with the fast path
  that builds the frozen dataclasses of a replay;
* :mod:`~registry.wire.codec`: :class:`Codec`, the Confluent framing (magic byte, 4-byte
  schema id, Avro body) with catalog or schema-registry ids.

The package imports only the core (:mod:`registry.events`, :mod:`registry.errors`) and
third-party libraries. ``registry.codec`` is its old import path and re-exports the same
names.
"""

from .catalog import (
    CATALOG_FILE,
    Catalog,
    CatalogEntry,
    check_catalog,
    plan_catalog_update,
    update_catalog,
)
from .codec import MAGIC_BYTE, Codec, decode, default_codec, encode
from .schemas import AVRO_NAMESPACE, fingerprint, resolved_schemas

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
