"""jobreg: an event-sourced job registry for highly available coordinators.

Start at :class:`Registry` (read the registry, claim leadership) and
:class:`Term` (write as the leader). State is only ever
:func:`registry.fold.replay` over the log; see the README for the guarantees.
"""

import logging
from typing import TYPE_CHECKING

from .blobs import BlobStore, FileBlobStore
from .client import DEFAULT_INLINE_LIMIT, Receipt, Registry, Term
from .election import Election
from .errors import (
    AuthenticationFailed,
    BlobCorrupt,
    BlobError,
    BlobMissing,
    BrokerError,
    BrokerStartError,
    ClaimRejected,
    CodecError,
    ConfigError,
    DamagedDump,
    ElectionCancelled,
    ElectionTimeout,
    Fenced,
    LeaseExpired,
    MissingExtra,
    NamespaceMoved,
    NotAuthorized,
    OutcomeUnknown,
    RegistryError,
    UnknownEventTypeError,
    UnknownJob,
    UnknownSchemaError,
    WriteRejected,
)
from .events import CheckpointState, CompletedCheckpoint, GraphRef, InlineGraph, JobStatus
from .fold import fold, replay
from .image import Decision, Image, JobView, LeaderInfo, LeaderView, LogRecord, Outcome
from .log import DEFAULT_TOPIC, TopicConfig
from .recovery import CleanupResult, RecoveredJob, RecoveryResult

if TYPE_CHECKING:
    from .dev.broker import EmbeddedBroker
else:
    # Not seen by type checkers: a module __getattr__ would type every misspelt name.
    def __getattr__(name: str) -> object:
        # The embedded broker is development tooling (registry.dev); it stays importable
        # from here without the runtime importing the dev floor until someone asks for it.
        if name == "EmbeddedBroker":
            from .dev.broker import EmbeddedBroker

            return EmbeddedBroker
        # Read from the installed metadata on first use: importlib.metadata is a fifth of
        # `import registry`'s time (README "Install"), and a coordinator rarely asks.
        if name == "__version__":
            from importlib.metadata import PackageNotFoundError, version

            try:
                found = version("jobreg")
            except PackageNotFoundError:  # running from a source tree that is not installed
                found = "0+unknown"
            globals()["__version__"] = found
            return found
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CleanupResult",
    "DEFAULT_INLINE_LIMIT",
    "DEFAULT_TOPIC",
    "AuthenticationFailed",
    "BlobCorrupt",
    "BlobError",
    "BlobMissing",
    "BlobStore",
    "BrokerError",
    "BrokerStartError",
    "ClaimRejected",
    "CodecError",
    "CheckpointState",
    "CompletedCheckpoint",
    "ConfigError",
    "DamagedDump",
    "NamespaceMoved",
    "NotAuthorized",
    "Decision",
    "Election",
    "ElectionCancelled",
    "ElectionTimeout",
    "EmbeddedBroker",
    "Fenced",
    "FileBlobStore",
    "GraphRef",
    "Image",
    "InlineGraph",
    "JobStatus",
    "JobView",
    "LeaderInfo",
    "LeaderView",
    "LeaseExpired",
    "LogRecord",
    "MissingExtra",
    "Outcome",
    "OutcomeUnknown",
    "Receipt",
    "RecoveredJob",
    "RecoveryResult",
    "Registry",
    "RegistryError",
    "Term",
    "TopicConfig",
    "UnknownEventTypeError",
    "UnknownJob",
    "UnknownSchemaError",
    "WriteRejected",
    "__version__",
    "fold",
    "replay",
]

# Library convention: silent unless the application configures logging
# (librdkafka's connection chatter goes to the "registry.kafka" logger).
logging.getLogger("registry").addHandler(logging.NullHandler())
