"""The old import path of :mod:`registry.wire`: the Avro codec of the registry log.

The codec, the schema catalog and the schemas now live in the package :mod:`registry.wire`
(one module per job; its docstring lists them). This module re-exports the names callers
have imported from here, so that ``from registry.codec import encode`` keeps working;
nothing in ``registry`` imports it any more.
"""

from .wire import (
    AVRO_NAMESPACE,
    CATALOG_FILE,
    MAGIC_BYTE,
    Catalog,
    CatalogEntry,
    Codec,
    check_catalog,
    decode,
    default_codec,
    encode,
    fingerprint,
    plan_catalog_update,
    resolved_schemas,
    update_catalog,
)

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
