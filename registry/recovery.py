"""Recovery with a blast radius of one job (incident 003).

When a term takes over, :meth:`registry.client.Term.recover` adopts every live
job of earlier terms. Each job is recovered on its own: its graph is loaded
(and verified, for blobs), then the user's hook (Flink's initialize-on-master)
runs. Whatever goes wrong for one job - a missing or corrupt blob, a hook that
raises - becomes that job's ``JobRecoveryFailed`` record; every other job is
adopted, and ``recover()`` returns normally. A job that failed recovery is not
tried again by later recoveries until :meth:`~registry.client.Term.retry` or a
cancel; its error stays in the registry.

This module holds the per-job part (pure but for reading the blob store); the
:class:`~registry.client.Term` writes the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .blobs import BlobStore
from .events import CompletedCheckpoint, GraphRef, InlineGraph, JobStatus
from .image import Image, JobView

__all__ = ["CleanupHook", "CleanupResult", "RecoveredJob", "RecoveryHook", "RecoveryResult",
           "candidates", "clean_one", "load_graph", "recover_one"]


@dataclass(frozen=True)
class RecoveredJob:
    """What the recovery hook gets for one job: its graph bytes and checkpoints to restore."""

    job_id: str
    graph: bytes
    checkpoints: tuple[CompletedCheckpoint, ...]
    view: JobView


RecoveryHook = Callable[[RecoveredJob], object]


@dataclass(frozen=True)
class RecoveryResult:
    """The outcome of recovering one job: ``ADOPTED`` or ``RECOVERY_FAILED`` (with ``error``).

    ``offset`` is where the record that says so sits in the log.
    """

    job_id: str
    status: str
    error: str | None = None
    offset: int | None = None

    @property
    def ok(self) -> bool:
        """True if the job was adopted (or its result cleaned up)."""
        return self.status in ("ADOPTED", "CLEANED")


CleanupHook = Callable[[JobView], object]
"""Deletes what a terminal job left: gets the dirty result (its ``graph``, ``checkpoints``,
``status`` and ``reason``); returning means done, raising means try again later."""


@dataclass(frozen=True)
class CleanupResult:
    """The outcome of cleaning up one dirty result: ``cleaned``, or the hook's ``error``.

    ``offset`` is where the ``JobCleanedUp`` record sits in the log (if cleaned).
    """

    job_id: str
    cleaned: bool
    error: str | None = None
    offset: int | None = None


def clean_one(view: JobView, hook: CleanupHook) -> str | None:
    """Run the cleanup hook for one dirty result; return its error, or ``None``.

    As :func:`recover_one`, never raises for the job's own fault (any ``Exception``).
    """
    try:
        hook(view)
    except Exception as e:  # the blast radius is this job
        return f"{type(e).__name__}: {e}"
    return None


def candidates(image: Image, epoch: int) -> list[JobView]:
    """The jobs a term of ``epoch`` must recover: live, ACTIVE, not already its own.

    Jobs that failed recovery are left out (they wait for a retry or a cancel).
    """
    return [v for v in image.jobs.values()
            if v.status == JobStatus.ACTIVE and v.owner_epoch != epoch]


def load_graph(view: JobView, store: BlobStore | None) -> bytes:
    """The job's graph bytes; raises :class:`~registry.errors.BlobError` for a missing or
    corrupt blob (and ``ValueError`` for a job that has no graph at all)."""
    graph = view.graph
    if isinstance(graph, InlineGraph):
        return graph.data
    if isinstance(graph, GraphRef):
        if store is None:
            raise ValueError(f"job {view.job_id!r} has its graph in a blob store, and none is "
                             "configured")
        return store.get(graph)
    raise ValueError(f"job {view.job_id!r} has no graph")


def recover_one(view: JobView, store: BlobStore | None, hook: RecoveryHook | None) -> str | None:
    """Recover one job: load and verify its graph, run the hook. Return the error, or ``None``.

    Never raises for the job's own fault (any ``Exception``); the error text
    names the exception type. ``BaseException`` (KeyboardInterrupt, SystemExit)
    still propagates: stopping the process is not one job's fault.
    """
    try:
        graph = load_graph(view, store)
        if hook is not None:
            hook(RecoveredJob(view.job_id, graph, view.latest_checkpoints, view))
    except Exception as e:  # the blast radius is this job
        return f"{type(e).__name__}: {e}"
    return None
