"""The one exception tree of jobreg.

Every error the library raises on purpose derives from :class:`RegistryError`;
third-party errors (confluent-kafka, fastavro, the OS) are wrapped with
``raise ... from e`` so callers catch one root::

    RegistryError
    ├── ConfigError            bad argument, malformed id, bad configuration
    │   ├── NamespaceMoved         the namespace's records lie on another partition than the
    │   │                          topic's partition count now maps it to (README "The log")
    │   └── DamagedDump            a dump file whose header or data is damaged or cut short
    ├── CodecError             bytes that are not a jobreg event
    │   ├── UnknownSchemaError     the header names a schema this reader cannot find
    │   └── UnknownEventTypeError  the schema is not one of our event types
    ├── BrokerError            the broker cannot be reached or started
    │   ├── BrokerStartError       the embedded broker did not come up
    │   ├── AuthenticationFailed   the broker refused the client's SASL login
    │   └── NotAuthorized          the broker's authorizer refused an operation (an ACL is
    │                              missing): the message names the operation and resource
    ├── BlobError              a job graph in the blob store is missing or corrupt
    │   ├── BlobMissing            no blob under that reference
    │   └── BlobCorrupt            the blob's size or sha256 does not match its reference
    ├── MissingExtra           a part of jobreg whose optional dependencies (an extra such as
    │                          ``jobreg[audit]``) are not installed
    ├── LeaseExpired           this leader's lease may have run out elsewhere: it must not write
    ├── UnknownJob             a command names a job the registry has never seen
    ├── OutcomeUnknown         a write's fate could not be read back from the log in time
    └── WriteRejected          the fold refused the record (reason, expected/actual epoch)
        ├── Fenced                 a newer term exists, or the term was revoked
        └── ClaimRejected          a leadership grant lost its compare-and-set

Rejections are not exceptions inside the fold: the fold records them in the
image. :class:`WriteRejected` is how the *client* reports the fold's verdict on
its own record to the caller.

What an exception from a write means (every method of
:class:`~registry.client.Term`, and :meth:`~registry.client.Registry.claim_leadership`):
once the fold has decided the call's records, the call returns those
decisions, and nothing done after that (settling keys, re-putting a blob)
turns a decided outcome into an exception. An exception means exactly one of:

* **not accepted**: :class:`WriteRejected` (and so :class:`Fenced`,
  :class:`ClaimRejected`): the fold refused the call, or the log shows the
  term ended before any of its records could land (a record that lands
  later lands after the newer grant and is refused; one the broker may have
  appended before the term ended, unreported, makes it unknown);
  :class:`LeaseExpired`,
  :class:`ConfigError`, :class:`UnknownJob`, :class:`BlobError` and
  :class:`BrokerError`: raised before anything was sent;
* **unknown**: :class:`OutcomeUnknown`: records were sent and their fate
  could not be read back; the log is the truth.

Every such exception carries ``event_ids``: the ids of the records the call
sent (every copy; empty when nothing was sent), to look up in
:meth:`~registry.client.Registry.timeline` or a dump.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationFailed",
    "BlobCorrupt",
    "BlobError",
    "BlobMissing",
    "BrokerError",
    "BrokerStartError",
    "ClaimRejected",
    "CodecError",
    "ConfigError",
    "DamagedDump",
    "ElectionCancelled",
    "ElectionTimeout",
    "Fenced",
    "LeaseExpired",
    "MissingExtra",
    "NamespaceMoved",
    "NotAuthorized",
    "OutcomeUnknown",
    "RegistryError",
    "UnknownEventTypeError",
    "UnknownJob",
    "UnknownSchemaError",
    "WriteRejected",
]


class RegistryError(Exception):
    """Root of every error jobreg raises on purpose.

    ``event_ids``: the records a write sent before it raised (see the module
    docstring); empty for every error raised before anything was sent.
    """

    event_ids: tuple[str, ...] = ()


class ConfigError(RegistryError, ValueError):
    """A bad argument, a malformed identifier or an invalid configuration."""


class MissingExtra(RegistryError, ImportError):
    """A part of jobreg needs an extra that is not installed (``pip install 'jobreg[audit]'``).

    Also an :class:`ImportError`, so code that probes for an optional part with
    ``try: import ... except ImportError`` keeps working. ``extra`` is the extra's name.
    """

    def __init__(self, message: str, *, extra: str, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.extra = extra


class NamespaceMoved(ConfigError):
    """The namespace's records were written under another partition count of the topic and
    lie on a partition other than the one the topic's count maps it to now (partitions were
    added): reading or claiming it there would see none of them. The message says what
    happened and what to do (:mod:`registry.placement`)."""

    def __init__(self, message: str, *, namespace: str, topic: str, partitions: int,
                 partition: int, found_partition: int, written_under: int | None) -> None:
        super().__init__(message)
        self.namespace, self.topic = namespace, topic
        self.partitions, self.partition = partitions, partition
        self.found_partition, self.written_under = found_partition, written_under


class DamagedDump(ConfigError):
    """A dump file (``jobreg dump``) whose header or data is damaged, or that is cut short:
    the message names the file, where the damage lies and how many records precede it."""


class CodecError(RegistryError):
    """Bytes that cannot be decoded into a jobreg event (or an event that cannot be encoded)."""


class UnknownSchemaError(CodecError):
    """The record header names a writer schema this reader does not know."""


class UnknownEventTypeError(CodecError):
    """The writer schema decodes, but it is not one of jobreg's event types."""


class BrokerError(RegistryError):
    """The Kafka broker cannot be reached, or refused an operation."""


class AuthenticationFailed(BrokerError):
    """The broker refused the client's SASL login: the message names the mechanism and the
    user, never the secret. Retrying with the same settings cannot help."""


class NotAuthorized(BrokerError):
    """The broker's authorizer refused an operation of this client: the principal lacks an
    ACL. The message is one line naming the user, the operation and the resource
    (``WRITE on topic 'jobreg'``) and the broker's error code; the same fields are
    attributes: ``operation``, ``resource_type`` (``topic``, ``transactional id``),
    ``resource`` and ``code``. Retrying cannot help until an administrator grants it. A
    write refused so was not appended."""

    def __init__(self, message: str, *, operation: str, resource_type: str, resource: str,
                 code: str) -> None:
        super().__init__(message)
        self.operation, self.resource_type = operation, resource_type
        self.resource, self.code = resource, code


class BrokerStartError(BrokerError):
    """The embedded broker binary is missing or did not come up."""


class BlobError(RegistryError):
    """A job graph in the blob store cannot be used."""


class BlobMissing(BlobError):
    """No blob exists under the reference."""


class BlobCorrupt(BlobError):
    """The stored bytes do not match the reference's size or sha256."""


class LeaseExpired(RegistryError):
    """The leader has not renewed its lease in time; it stops writing until it renews.

    A contender may take over once it has seen no renewal for a full lease;
    writing on would only produce records the fold refuses.
    """


class ElectionTimeout(RegistryError, TimeoutError):
    """``Election.acquire(timeout)`` did not lead within its timeout (a ``TimeoutError`` too)."""


class ElectionCancelled(RegistryError, RuntimeError):
    """``Election.acquire`` was cancelled (``Election.cancel``) before it led (a
    ``RuntimeError`` too)."""


class UnknownJob(RegistryError, KeyError):
    """A command names a job id that the registry has never seen."""

    def __init__(self, namespace: str, job_id: str, message: str | None = None) -> None:
        super().__init__(message or f"namespace {namespace!r} has no job {job_id!r}")
        self.namespace = namespace
        self.job_id = job_id

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class OutcomeUnknown(RegistryError):
    """A write was sent, but its fate could not be read back from the log in time.

    The record may still land; the log, not this exception, is the truth. Read
    ``Registry.timeline()`` for the event id in ``event_ids`` to find out.
    """

    def __init__(self, message: str, event_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.event_ids = tuple(event_ids)


class WriteRejected(RegistryError):
    """The fold refused a record this client wrote.

    Attributes mirror the :class:`registry.image.Decision` the fold recorded:
    ``reason`` (a stable code), ``detail`` (for people), ``expected_epoch``,
    ``actual_epoch``, ``leader`` and the record's ``offset`` and ``event_id``.
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        expected_epoch: int | None = None,
        actual_epoch: int | None = None,
        leader: str | None = None,
        offset: int | None = None,
        event_id: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.expected_epoch = expected_epoch
        self.actual_epoch = actual_epoch
        self.leader = leader
        self.offset = offset
        self.event_id = event_id


class Fenced(WriteRejected):
    """The writer's term is over: a newer epoch exists, or the term was revoked."""


class ClaimRejected(WriteRejected):
    """A leadership grant lost its compare-and-set: another claim came first
    (``cas_failed``), or the leader renewed after the contender read the log
    (``renewed_since``, fold rule 3)."""
