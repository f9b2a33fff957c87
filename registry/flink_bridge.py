"""``jobreg flink-bridge``: Flink's high-availability services on jobreg, over pipes.

The Java backend (Flink 2.3's ``HighAvailabilityServices`` on jobreg) starts one bridge per
Flink process and speaks JSON lines with it (protocol v1, README "The Flink bridge"):
requests on the bridge's stdin, answers and events on its stdout, logs on stderr. The bridge turns each request into calls of jobreg's own client
(:class:`~registry.client.Registry`, :meth:`~registry.client.Registry.elect`,
:class:`~registry.client.Term`), so the fold stays the one source of truth, and turns
jobreg's exact outcomes into the protocol's error kinds (:func:`error_kind`): a write is
answered ``ok`` only once the fold accepted it.

How Flink's stores map onto the registry (README "The Flink bridge"):

* ``plans`` (Flink's ``ExecutionPlanStore``): a plan is a job, ``Term.submit(job, graph)``,
  whose graph is the pointer's UTF-8 bytes (inline; the plan's file stays where Flink's
  storage helper wrote it). ``store_names plans`` lists the live jobs only: a job the
  registry knows ended is never recovered, nor one whose plan Flink could not recover
  (``plan_failed``: ``RECOVERY_FAILED``, as jobreg's own recovery leaves such a job out).
  Removing a live job's plan cancels the job.
* ``applications``: jobs named ``application:<id>``, listed by this store only; removing
  one terminates it (``FINISHED``) and marks its result clean.
* ``checkpoints/<job>`` (Flink's ``CompletedCheckpointStore``): the job's retained
  completed checkpoints (fold rule 6); ``store_add`` is ``checkpoint_completed(job, id,
  location=pointer, retained=N)``, N the store's ``state.checkpoints.num-retained`` (the
  fold needs no trigger before a completion, only ids newer than the last completed). ``counter_next`` (Flink's ``getAndIncrement`` before each checkpoint)
  writes ``checkpoint_triggered``; the counter is read from the fold's checkpoint state.
* results (Flink's ``JobResultStore``, fold rule 5): ``cancel`` / ``terminate`` make the
  dirty result, ``mark_clean`` cleans it; ``job_terminal`` records the job's end at once.

Threads: one reader of stdin (it answers nothing itself: ``alive`` only notes the time),
requests on a small pool (so a slow write delays neither ``alive`` nor other answers), one
lock around stdout, a contender thread (grants and revocations, strictly alternating) and a
poller of watched leader information.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Final

from .client import Receipt, Registry, Term
from .election import Election, lease_clock
from .errors import (
    BlobError,
    BrokerError,
    ConfigError,
    ElectionCancelled,
    Fenced,
    LeaseExpired,
    OutcomeUnknown,
    RegistryError,
    UnknownJob,
    WriteRejected,
)
from .events import GraphRef, InlineGraph, JobStatus, VertexParallelism
from .image import Image, JobView

__all__ = [
    "APPLICATION_PREFIX",
    "PROTOCOL",
    "Bridge",
    "BridgeError",
    "Request",
    "checkpoint_id_of",
    "checkpoint_name",
    "error_kind",
    "parse_request",
    "protocol_stdout",
    "session_of",
]

_log = logging.getLogger("registry.flink_bridge")

PROTOCOL: Final = 1
"""The protocol version the bridge speaks (its ``ready`` event says it)."""

APPLICATION_PREFIX: Final = "application:"
"""Jobs that hold Flink's application store entries are named so (see the module docstring)."""

_VERSION: Final = 0  # jobreg replaces nothing in place: every entry has one version

_FLINK_TERMINAL: Final = {"FINISHED": JobStatus.FINISHED, "FAILED": JobStatus.FAILED,
                          "CANCELED": JobStatus.CANCELLED}
_TO_FLINK: Final = {v: k for k, v in _FLINK_TERMINAL.items()}

_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,200}")
_CHECKPOINT_NAME = re.compile(r"/?([0-9]{1,19})")


def session_of(namespace: str, epoch: int) -> str:
    """Flink's leader session id of term ``epoch`` of ``namespace`` (a UUID derived from
    both, so a reader of the log maps it back to the epoch)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"jobreg:{namespace}:{epoch}"))


def checkpoint_name(checkpoint_id: int) -> str:
    """Flink's name of a checkpoint in its store: ``/%019d`` of the id."""
    return f"/{checkpoint_id:019d}"


def checkpoint_id_of(name: str) -> int:
    """The checkpoint id a store name (``/%019d``) stands for; :class:`BridgeError`
    ``Invalid`` for any other name."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        raise BridgeError("Invalid", f"a checkpoint's name is /%019d of its id, not {name!r}")
    return int(match.group(1))


class BridgeError(Exception):
    """A request answered with an error of ``kind`` (one of the protocol's error kinds)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# -- parsing ------------------------------------------------------------------------------

_STR, _INT, _OPT_STR, _MAYBE_INT = "str", "int", "str|null", "int, optional"
_VERTICES = "a list of {vertex: str, lower: int, upper: int}"

_OPS: Final[dict[str, dict[str, str]]] = {
    "contend": {}, "withdraw": {},
    "publish": {"component": _STR, "session": _STR, "address": _OPT_STR},
    "watch": {"component": _STR}, "unwatch": {"component": _STR}, "leaders": {},
    "store_add": {"store": _STR, "name": _STR, "pointer": _STR, "retained": _MAYBE_INT},
    "store_replace": {"store": _STR, "name": _STR, "version": _INT, "pointer": _STR},
    "store_get": {"store": _STR, "name": _STR},
    "store_exists": {"store": _STR, "name": _STR},
    "store_names": {"store": _STR}, "store_all": {"store": _STR},
    "store_remove": {"store": _STR, "name": _STR}, "store_clear": {"store": _STR},
    "counter_get": {"job": _STR}, "counter_next": {"job": _STR},
    "counter_set": {"job": _STR, "value": _INT},
    "job_terminal": {"job": _STR, "status": _STR},
    "plan_failed": {"job": _STR, "error": _STR},
    "plan_rescale": {"job": _STR, "requirements": _VERTICES},
    "plan_requirements": {"job": _STR},
    "result_create": {"job": _STR, "status": _STR}, "result_clean": {"job": _STR},
    "result_has": {"job": _STR}, "results_dirty": {},
}
"""Every op with an id, and its arguments (required unless ``optional``; ``str|null``: a
string or null).
Arguments an op does not name are ignored, so a newer Java side may add some."""


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed line: ``op`` with its ``args``; ``id`` is ``None`` for ``alive`` (no
    answer). ``error``: why the request is ``Invalid`` (it is answered so, with its id)."""

    id: int | None
    op: str
    args: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_ok(kind: str, value: object) -> bool:
    if kind in (_INT, _MAYBE_INT):
        return _is_int(value)
    if kind == _OPT_STR:
        return value is None or isinstance(value, str)
    if kind == _VERTICES:
        return isinstance(value, list) and all(
            isinstance(v, dict) and isinstance(v.get("vertex"), str)
            and _is_int(v.get("lower")) and _is_int(v.get("upper")) for v in value)
    return isinstance(value, str)


def parse_request(line: str | bytes) -> Request:
    """Parse one line of the Java side. Never raises: a line with a usable ``id`` but a bad
    op or argument is a :class:`Request` with ``error`` set (answered ``Invalid``); a line
    with no usable id is raised as :class:`BridgeError` (nothing can be answered: the
    bridge says so in one line on stderr)."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BridgeError("Invalid", f"a line that is not UTF-8 ({e.reason} at byte "
                                         f"{e.start})") from None
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise BridgeError("Invalid", f"a line that is not JSON: {_one_line(str(e))}") from None
    if not isinstance(message, dict):
        raise BridgeError("Invalid", f"a line that is not a JSON object but "
                                     f"{type(message).__name__}")
    op = message.get("op")
    if op == "alive" and "id" not in message:
        return Request(None, "alive")
    ident = message.get("id")
    if not _is_int(ident):
        raise BridgeError("Invalid", f"a request without an integer id (op {_show(op)})")
    assert isinstance(ident, int)
    if not isinstance(op, str) or op not in _OPS:
        return Request(ident, str(op), error=f"unknown op {_show(op)}")
    args: dict[str, Any] = {}
    for name, kind in _OPS[op].items():
        if name not in message:
            if kind == _MAYBE_INT:
                continue
            return Request(ident, op, error=f"{op} needs {name!r} ({kind})")
        value = message[name]
        if not _type_ok(kind, value):
            return Request(ident, op, error=f"{op}: {name!r} must be {kind}, not "
                                            f"{_show(value)}")
        args[name] = value
    return Request(ident, op, args)


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, type(None))) \
        else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())


def error_kind(error: BaseException) -> tuple[str, str]:
    """The protocol's error kind and one-line message for an exception of a request.

    The exact outcome decides: ``OutcomeUnknown`` only when jobreg says the write may be in
    the log; ``Fenced`` when the fold refused the term (or the log shows it over);
    ``Unavailable`` when nothing was sent (the broker unreachable, the lease not renewed in
    time); ``AlreadyExists`` / ``NotExist`` / ``Invalid`` for the fold's other refusals and
    for bad arguments; anything else is a defect (``Internal``).
    """
    message = _one_line(str(error)) or type(error).__name__
    if isinstance(error, BridgeError):
        return error.kind, message
    if isinstance(error, OutcomeUnknown):
        return "OutcomeUnknown", message
    if isinstance(error, Fenced):
        return "Fenced", message
    if isinstance(error, WriteRejected):
        if error.reason in ("job_exists", "terminal_job"):
            return "AlreadyExists", message
        if error.reason == "unknown_job":
            return "NotExist", message
        return "Invalid", f"{error.reason}: {message}"
    if isinstance(error, UnknownJob):
        return "NotExist", message
    if isinstance(error, ConfigError):
        return "Invalid", message
    if isinstance(error, LeaseExpired):
        return "Unavailable", message  # nothing sent: the lease could not be renewed in time
    if isinstance(error, (BrokerError, BlobError)):
        return "Unavailable", message  # raised before anything was sent
    return "Internal", f"{type(error).__name__}: {message}"


# -- the bridge -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Lead:
    """One term this bridge leads: announced (``granted`` sent) and over (``revoked`` sent)
    under the bridge's lead lock, so events of a term come in order."""

    election: Election
    term: Term
    session: str
    lost: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    announced: bool = False
    over: bool = False


def lease_deadlines(election: Election) -> dict[str, int]:
    """How long ``election``'s lease is certainly valid, as a ``granted`` or ``lease`` line
    says it: ``valid_for_ms`` from now, and the same end as absolute deadlines the JVM checks
    too, so that a line delayed on its way (a full pipe, this process descheduled or stopped)
    never extends the JVM's belief: ``deadline_mono_ns`` on ``CLOCK_MONOTONIC``, which the
    JVM's ``System.nanoTime()`` reads on the same host, and ``deadline_wall_ms`` on the wall
    clock, which counts a suspend of the host (``CLOCK_MONOTONIC`` does not). The clocks are
    read before the lease, so each deadline is at or before the lease's end."""
    mono, wall = time.monotonic_ns(), time.time_ns() // 1_000_000
    valid_ms = int(election.valid_for() * 1000)
    return {"valid_for_ms": valid_ms, "deadline_mono_ns": mono + valid_ms * 1_000_000,
            "deadline_wall_ms": wall + valid_ms}


class Bridge:
    """The bridge of one Flink process: :meth:`run` reads requests from ``stdin`` until EOF.

    ``registry`` is connected to the namespace (its ``timeout`` at most half of ``lease``);
    ``out`` receives the answers and events (one JSON line each, written under one lock;
    by default this process's stdout, :func:`protocol_stdout`).
    """

    def __init__(self, registry: Registry, contender: str, lease: float, *,
                 out: IO[str] | None = None, poll_ms: int = 100, workers: int = 8,
                 clock: Callable[[], float] = lease_clock) -> None:
        self.registry = registry
        self.namespace = registry.namespace
        self.contender = contender
        self.lease = lease
        self.poll = poll_ms / 1000
        self._out = protocol_stdout() if out is None else out
        self._out_lock = threading.Lock()
        self._clock = clock
        self._last_heard = clock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bridge-req")
        self._lead_lock = threading.RLock()
        self._lead: _Lead | None = None
        self._contender: threading.Thread | None = None
        self._election: Election | None = None
        self._lost_early: dict[int, str] = {}
        self._withdrawn = threading.Event()
        self._closing = threading.Event()
        self._watch_lock = threading.Lock()
        self._watched: dict[str, tuple[str | None, str | None] | None] = {}
        self._poller: threading.Thread | None = None
        self._counter_locks: dict[str, threading.Lock] = {}
        self._counter_guard = threading.Lock()

    # -- output ----------------------------------------------------------------------------

    def emit(self, message: Mapping[str, Any]) -> None:
        """Write one line to the Java side, whole: every thread's lines (the pool's answers,
        the renewer's ``lease``, the contender's ``granted`` and ``revoked``, the poller's
        ``leader``) go through here, one write and one flush under one lock."""
        line = json.dumps(message, separators=(",", ":")) + "\n"
        with self._out_lock:
            try:
                self._out.write(line)
                self._out.flush()
            except (OSError, ValueError):  # the JVM is gone; its EOF on stdin ends us
                pass

    def _answer(self, ident: int, result: object) -> None:
        self.emit({"id": ident, "ok": True, "result": result})

    def _fail(self, ident: int, kind: str, message: str) -> None:
        self.emit({"id": ident, "ok": False, "error": kind, "message": message})

    # -- the loop ----------------------------------------------------------------------------

    def run(self, stdin: IO[bytes]) -> int:
        """Read requests until EOF, then leave (revoking a term this bridge leads); 0."""
        self.emit({"event": "ready", "namespace": self.namespace, "protocol": PROTOCOL})
        try:
            for raw in stdin:
                self._last_heard = self._clock()
                if not raw.strip():
                    continue
                self.handle_line(raw)
        finally:
            self.close()
        return 0

    def handle_line(self, raw: bytes | str) -> None:
        """Handle one line: ``alive`` at once, a request on the pool, a line that cannot be
        answered as one line on stderr."""
        try:
            request = parse_request(raw)
        except BridgeError as e:
            _log.error("flink-bridge: %s", e)
            return
        if request.id is None:
            return  # alive: the time was noted
        if request.error is not None:
            self._fail(request.id, "Invalid", request.error)
            return
        try:
            self._pool.submit(self._serve, request)
        except RuntimeError:  # closing
            self._fail(request.id, "Unavailable", "the bridge is shutting down")

    def _serve(self, request: Request) -> None:
        assert request.id is not None
        try:
            result = getattr(self, "op_" + request.op)(**request.args)
        except Exception as e:  # noqa: BLE001 - every request gets exactly one answer
            kind, message = error_kind(e)
            if kind == "Internal":
                _log.exception("flink-bridge: %s failed", request.op)
            if isinstance(e, Fenced):
                self._fenced(e)
            self._fail(request.id, kind, message)
            return
        self._answer(request.id, result)

    @property
    def closing(self) -> bool:
        """True once :meth:`close` began (EOF on stdin, or the process is leaving)."""
        return self._closing.is_set()

    def close(self) -> None:
        """Stop contending (revoking a term this bridge leads) and every thread."""
        self._closing.set()
        self._withdraw()
        self._pool.shutdown(wait=True, cancel_futures=False)
        if self._poller is not None:
            self._poller.join(5)

    # -- election ----------------------------------------------------------------------------

    def alive(self) -> bool:
        """True while the JVM was heard from (``alive`` or any request) within half a lease:
        only then is the lease renewed, or a term claimed."""
        return self._clock() - self._last_heard < self.lease / 2

    def op_contend(self) -> dict[str, Any]:
        with self._lead_lock:
            if self._contender is not None and self._contender.is_alive():
                return {}
            self._withdrawn.clear()
            self._contender = threading.Thread(target=self._contend,
                                               name="bridge-contender", daemon=True)
            self._contender.start()
        return {}

    def op_withdraw(self) -> dict[str, Any]:
        self._withdraw()
        return {}

    def _withdraw(self) -> None:
        with self._lead_lock:
            self._withdrawn.set()
            contender, lead, waiting = self._contender, self._lead, self._election
        if lead is not None:
            lead.reason = lead.reason or "withdrawn"
            lead.lost.set()
        elif waiting is not None:
            waiting.cancel()  # acquire() raises ElectionCancelled (or returns a term: revoked)
        if contender is not None:
            contender.join()

    def _contend(self) -> None:
        try:
            self._contend_loop()
        except Exception as e:  # a defect: say so, Java's onError ends the JobManager
            _log.exception("flink-bridge: the contender failed")
            self.emit({"event": "error", "message": _one_line(f"the contender failed: "
                                                              f"{type(e).__name__}: {e}")})

    def _contend_loop(self) -> None:
        while not self._withdrawn.is_set():
            election = self.registry.elect(
                self.contender, self.lease, on_revoked=self._on_revoked,
                on_renewed=self._on_renewed, keep_alive=self.alive, clock=self._clock)
            with self._lead_lock:
                if self._withdrawn.is_set():
                    return
                self._election = election
            try:
                term = election.acquire()
            except ElectionCancelled:
                return
            except ConfigError as e:
                self.emit({"event": "error", "message": _one_line(str(e))})
                return
            except Exception as e:  # noqa: BLE001 - keep contending; say why
                _log.warning("flink-bridge: contending failed (%s); trying again", e)
                election.cancel()
                self._withdrawn.wait(self.lease / 4)
                continue
            self._lead_term(election, term)
        with self._lead_lock:
            self._election = None

    def _lead_term(self, election: Election, term: Term) -> None:
        """Announce ``term``, wait until it is over, give it up, announce that."""
        lead = _Lead(election, term, session_of(self.namespace, term.epoch))
        with self._lead_lock:
            self._lead = lead
            lead.announced = True
            self.emit({"event": "granted", "epoch": term.epoch, "session": lead.session,
                       **lease_deadlines(election)})
            early = self._lost_early.pop(term.epoch, None)
            if early is not None or self._withdrawn.is_set():
                lead.reason = early or "withdrawn"
                lead.lost.set()
        lead.lost.wait()
        # Gives the term up if it still holds it (withdrawn, EOF); stops the renewer.
        election.cancel(revoke=self._withdrawn.is_set())
        with self._lead_lock:
            lead.over = True
            self._lead = None
            self.emit({"event": "revoked", "epoch": term.epoch,
                       "reason": lead.reason or "revoked"})

    def _on_revoked(self, term: Term) -> None:
        with self._lead_lock:
            lead = self._lead
            fenced = term.fenced()
            reason = ("not_alive: the JVM was not heard from within half a lease"
                      if not self.alive() else fenced.reason if fenced is not None
                      else "lease lost")
            if lead is None or lead.term is not term:
                self._lost_early[term.epoch] = reason  # lost before it was announced
                return
            lead.reason = lead.reason or reason
            lead.lost.set()

    def _on_renewed(self, term: Term) -> None:
        with self._lead_lock:
            lead = self._lead
            if lead is None or lead.term is not term or not lead.announced or lead.over \
                    or lead.lost.is_set():
                return
            self.emit({"event": "lease", "epoch": term.epoch, **lease_deadlines(lead.election)})

    def _fenced(self, error: Fenced) -> None:
        # A write of the current term was fenced: the term is certainly over.
        with self._lead_lock:
            lead = self._lead
            if lead is not None and lead.term.fenced() is not None:
                lead.reason = lead.reason or f"fenced: {_one_line(str(error))}"
                lead.lost.set()

    def _term(self) -> _Lead:
        """The term this bridge leads, or ``NotLeader`` (nothing is sent)."""
        with self._lead_lock:
            lead = self._lead
        if lead is None or lead.lost.is_set() or lead.over:
            raise BridgeError("NotLeader", f"{self.contender!r} holds no term of "
                                           f"{self.namespace!r}")
        return lead

    # -- leader information ------------------------------------------------------------------

    def op_publish(self, component: str, session: str, address: str | None) -> dict[str, Any]:
        lead = self._term()
        if session != lead.session:
            raise BridgeError("Fenced", f"session {session} is not the session of term "
                                        f"{lead.term.epoch} ({lead.session})")
        lead.term.publish_leader(component, session, address)
        return {}

    def _leaders(self, image: Image) -> dict[str, tuple[str | None, str | None]]:
        return {c: (v.session, v.address) for c, v in image.leaders.items()}

    def op_leaders(self) -> dict[str, Any]:
        leaders = self._leaders(self.registry.sync())
        return {c: {"session": s, "address": a} for c, (s, a) in leaders.items()}

    def op_watch(self, component: str) -> dict[str, Any]:
        value = self._leaders(self.registry.sync()).get(component, (None, None))
        with self._watch_lock:
            self._watched[component] = value
            self._emit_leader(component, value)
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll_loop, daemon=True,
                                                name="bridge-watch")
                self._poller.start()
        return {}

    def op_unwatch(self, component: str) -> dict[str, Any]:
        with self._watch_lock:
            self._watched.pop(component, None)
        return {}

    def _emit_leader(self, component: str, value: tuple[str | None, str | None]) -> None:
        self.emit({"event": "leader", "component": component, "session": value[0],
                   "address": value[1]})

    def _poll_loop(self) -> None:
        while not self._closing.wait(self.poll):
            with self._watch_lock:
                if not self._watched:
                    continue
            try:
                leaders = self._leaders(self.registry.sync())
            except RegistryError as e:
                _log.debug("flink-bridge: reading leader information failed: %s", e)
                continue
            with self._watch_lock:
                for component, seen in list(self._watched.items()):
                    now = leaders.get(component, (None, None))
                    if now != seen:
                        self._watched[component] = now
                        self._emit_leader(component, now)

    # -- stores ------------------------------------------------------------------------------

    def _store(self, store: str) -> tuple[str, str | None]:
        if store in ("plans", "applications"):
            return store, None
        kind, sep, job = store.partition("/")
        if kind == "checkpoints" and sep and job:
            return kind, job
        raise BridgeError("Invalid", f"unknown store {store!r} (plans, applications or "
                                     "checkpoints/<job>)")

    @staticmethod
    def _job_of(kind: str, name: str) -> str:
        return APPLICATION_PREFIX + name if kind == "applications" else name

    @staticmethod
    def _listed(kind: str, job_id: str) -> str | None:
        """The name of ``job_id`` in store ``kind`` (``None``: not this store's)."""
        if kind == "applications":
            return job_id.removeprefix(APPLICATION_PREFIX) \
                if job_id.startswith(APPLICATION_PREFIX) else None
        return None if job_id.startswith(APPLICATION_PREFIX) else job_id

    @staticmethod
    def _pointer(view: JobView) -> str:
        graph = view.graph
        if isinstance(graph, InlineGraph):
            return graph.data.decode("utf-8", errors="replace")
        if isinstance(graph, GraphRef):
            return graph.uri
        return ""

    def _entries(self, store: str, *, listing: bool = False) -> list[tuple[str, str]]:
        """(name, pointer) of every entry of ``store``, in its order. ``listing``: what Flink
        lists to recover (``store_names``, ``store_all``): a plan whose recovery failed is
        left out, as jobreg's own recovery leaves such a job out (``recovery.candidates``)."""
        kind, job = self._store(store)
        image = self.registry.sync()
        if job is None:
            entries = []
            for job_id, view in sorted(image.jobs.items()):
                name = self._listed(kind, job_id)
                if name is None or not view.live or (
                        listing and view.status == JobStatus.RECOVERY_FAILED):
                    continue
                entries.append((name, self._pointer(view)))
            return entries
        found = image.jobs.get(job)
        if found is None:
            return []
        return [(checkpoint_name(c.checkpoint_id), c.location)
                for c in found.checkpoints.retained]

    def op_store_get(self, store: str, name: str) -> dict[str, Any]:
        for entry, pointer in self._entries(store):
            if entry == self._normal(store, name):
                return {"pointer": pointer, "version": _VERSION}
        raise BridgeError("NotExist", f"{store} holds no {name!r}")

    def op_store_exists(self, store: str, name: str) -> dict[str, Any]:
        found = any(e == self._normal(store, name) for e, _ in self._entries(store))
        return {"version": _VERSION if found else -1}

    def op_store_names(self, store: str) -> list[str]:
        return [name for name, _ in self._entries(store, listing=True)]

    def op_store_all(self, store: str) -> list[dict[str, Any]]:
        return [{"name": n, "pointer": p, "version": _VERSION}
                for n, p in self._entries(store, listing=True)]

    def _normal(self, store: str, name: str) -> str:
        kind, _ = self._store(store)
        return checkpoint_name(checkpoint_id_of(name)) if kind == "checkpoints" else name

    def op_store_add(self, store: str, name: str, pointer: str,
                     retained: int = 0) -> dict[str, Any]:
        """Add an entry. For a completed checkpoint, ``retained`` is how many completed
        checkpoints Flink's store keeps (``state.checkpoints.num-retained``, as its store was
        built): the record carries it and the fold keeps that many, the newest (rule 6)."""
        kind, job = self._store(store)
        if job is None:
            job_id = self._job_of(kind, name)
            view = self.registry.image.jobs.get(job_id)  # else the fold says job_exists
            if view is not None:
                raise BridgeError("AlreadyExists", f"job {job_id!r} is known ({view.status})")
            lead = self._term()
            self._written(lead.term.submit(job_id, pointer.encode("utf-8")))
            return {"version": _VERSION}
        cp = checkpoint_id_of(name)
        lead = self._term()
        view = self._leaders_view(job)
        if not view.live:
            raise BridgeError("Invalid", f"job {job!r} is {view.status}: no checkpoint is "
                                         "added to an ended job")
        self._check_new_checkpoint(view, cp)
        if retained < 0:
            raise BridgeError("Invalid", f"checkpoint {cp} of {job!r}: retained must be a "
                                         f"count of checkpoints, not {retained}")
        receipt = lead.term.checkpoint_completed(job, cp, location=pointer, retained=retained)
        if receipt.ignored is not None:  # a completion of the same id got in first
            self._check_new_checkpoint(self._job(job), cp)
            raise BridgeError("Invalid", f"checkpoint {cp} of {job!r}: {receipt.ignored}")
        return {"version": _VERSION}

    @staticmethod
    def _check_new_checkpoint(view: JobView, cp: int) -> None:
        state = view.checkpoints
        if any(c.checkpoint_id == cp for c in state.retained):
            raise BridgeError("AlreadyExists", f"checkpoint {cp} of {view.job_id!r} is "
                                               "there")
        if cp <= state.last_completed:
            raise BridgeError("Invalid", f"checkpoint {cp} of {view.job_id!r} is not newer "
                                         f"than the last completed {state.last_completed}")
        if cp in state.discarded:
            raise BridgeError("Invalid", f"checkpoint {cp} of {view.job_id!r} was discarded")

    @staticmethod
    def _written(receipt: Receipt) -> None:
        if receipt.ignored is not None:
            raise BridgeError("Invalid", receipt.ignored)

    def _job(self, job: str) -> JobView:
        view = self.registry.sync().jobs.get(job)
        if view is None:
            raise BridgeError("NotExist", f"no job {job!r}")
        return view

    def _leaders_view(self, job: str) -> JobView:
        """The job as this leader's image shows it, read from the log only if the image does
        not know it: for a leader's own writes, whose state its image holds once each write
        returns (a record of an older term that lands later is refused by the fold). Saves
        a round trip per write, so that writes of many jobs share their group commits;
        whatever the image missed, the fold decides, and its answer is the answer."""
        view = self.registry.image.jobs.get(job)
        return view if view is not None else self._job(job)

    def op_store_replace(self, store: str, name: str, version: int,
                         pointer: str) -> dict[str, Any]:
        kind, _ = self._store(store)
        if not any(e == self._normal(store, name) for e, _ in self._entries(store)):
            raise BridgeError("NotExist", f"{store} holds no {name!r}")
        what = "a completed checkpoint" if kind == "checkpoints" else "a job's graph"
        raise BridgeError("Invalid", f"jobreg has no event that replaces {what} ({store} "
                                     f"{name})")

    def op_store_remove(self, store: str, name: str) -> dict[str, Any]:
        kind, job = self._store(store)
        if job is None:
            job_id = self._job_of(kind, name)
            view = self.registry.sync().jobs.get(job_id)
            if view is None or not view.live:
                return {"removed": True}  # the job's end is already in the log
            lead = self._term()
            if kind == "applications":
                # An application entry is a job of its own: ended, and its result cleaned.
                self._written(lead.term.terminate(job_id, JobStatus.FINISHED,
                                                  "removed from Flink's application store"))
                lead.term.mark_clean(job_id)
            else:
                lead.term.cancel(job_id, "execution plan removed by Flink")
            return {"removed": True}
        cp = checkpoint_id_of(name)
        view = self.registry.sync().jobs.get(job)
        if view is None or not view.live:
            # An ended job's checkpoints are its dirty result's: result_clean drops them.
            return {"removed": True}
        if any(c.checkpoint_id == cp for c in view.checkpoints.retained):
            # The fold keeps the newest retained checkpoints of a live job; none is removed
            # alone. Flink then keeps the checkpoint's files (releaseAndTryRemove: false).
            return {"removed": False}
        return {"removed": True}

    def op_store_clear(self, store: str) -> dict[str, Any]:
        for name, _ in self._entries(store):
            if not self.op_store_remove(store, name)["removed"]:
                raise BridgeError("Invalid", f"jobreg keeps the newest completed checkpoint "
                                             f"of a live job; {store} cannot be cleared")
        return {}

    # -- checkpoint id counter ------------------------------------------------------------

    @staticmethod
    def _next_id(view: JobView) -> int:
        return max(view.checkpoints.newest_id, 0) + 1

    def _counter_lock(self, job: str) -> threading.Lock:
        with self._counter_guard:
            return self._counter_locks.setdefault(job, threading.Lock())

    def op_counter_get(self, job: str) -> dict[str, Any]:
        return {"value": self._next_id(self._job(job))}

    def op_counter_next(self, job: str) -> dict[str, Any]:
        lead = self._term()
        with self._counter_lock(job):
            value = self._next_id(self._leaders_view(job))
            lead.term.checkpoint_triggered(job, value)
        return {"value": value}

    def op_counter_set(self, job: str, value: int) -> dict[str, Any]:
        if value < 1:
            raise BridgeError("Invalid", f"checkpoint ids start at 1, not {value}")
        lead = self._term()
        with self._counter_lock(job):
            current = self._next_id(self._leaders_view(job))
            if value <= current:
                # Ids only increase per job (fold rule 6): the next id stays ``current``,
                # which is as good to Flink (its ids need only increase).
                return {}
            # The id before ``value`` triggered and discarded: the next one is ``value``.
            lead.term.checkpoint_triggered(job, value - 1)
            lead.term.checkpoint_discarded(job, value - 1, f"checkpoint id counter set to "
                                                           f"{value}")
        return {}

    # -- job status and results -----------------------------------------------------------

    @staticmethod
    def _status(status: str) -> str:
        state = _FLINK_TERMINAL.get(status)
        if state is None:
            raise BridgeError("Invalid", f"{status!r} is not a globally terminal Flink job "
                                         "status (FINISHED, CANCELED, FAILED)")
        return state

    def _end(self, job: str, status: str) -> bool:
        """Record the end of ``job`` (``False``: it had ended already, nothing written)."""
        state = self._status(status)
        view = self.registry.sync().jobs.get(job)
        if view is not None and not view.live:
            return False
        lead = self._term()
        reason = f"Flink job status {status}"
        try:
            if view is None:
                # A job the registry never saw (Flink's contract tests use random ids): it is
                # submitted with an empty graph, then ended. Two writes: if the second fails
                # the answer says so, and a retry ends the job (then known, live).
                lead.term.submit(job, b"")
            if state == JobStatus.CANCELLED:
                lead.term.cancel(job, reason)
            else:
                lead.term.terminate(job, state, reason)
        except WriteRejected as e:
            if e.reason == "terminal_job":
                return False
            raise
        return True

    def op_job_terminal(self, job: str, status: str) -> dict[str, Any]:
        self._end(job, status)
        return {}

    def op_plan_failed(self, job: str, error: str) -> dict[str, Any]:
        """The JobManager could not read or deserialize the job's execution plan: the job is
        ``RECOVERY_FAILED`` with ``error`` kept (the record :meth:`Term.recover` writes for a
        graph it cannot load), and no longer listed by ``store_names plans``, so the next
        leader does not try it again (a plan that does not deserialize fails the same way on
        every JobManager); a retry (:meth:`Term.retry`) or a cancel moves it on. A job that
        failed recovery before gets the new error. Unknown job ``NotExist``, ended job
        ``AlreadyExists`` (the fold's ``unknown_job`` / ``terminal_job``)."""
        lead = self._term()
        reason = _one_line(error) or "the execution plan could not be recovered"
        lead.term.recovery_failed(job, reason)
        return {}

    def op_plan_rescale(self, job: str, requirements: list[dict[str, Any]]) -> dict[str, Any]:
        """Flink's ``putJobResourceRequirements`` (the adaptive scheduler's rescale): a
        :class:`~registry.events.JobRescaled` of the job (:meth:`Term.rescale`), a fenced
        record of its own; the plan Flink stored is never replaced, and
        :meth:`op_plan_requirements` gives the next leader these requirements to apply to it.
        Bad requirements ``Invalid`` (one line, the fold's own statement of what is bad),
        unknown job ``NotExist``, ended job ``AlreadyExists``."""
        wanted = [VertexParallelism(r["vertex"], r["lower"], r["upper"]) for r in requirements]
        lead = self._term()
        self._written(lead.term.rescale(job, wanted, reason="putJobResourceRequirements"))
        return {}

    def op_plan_requirements(self, job: str) -> dict[str, Any]:
        """The job's resource requirements as its newest rescale set them (empty: none set,
        the plan's own), as the log has them now: what a recovered plan is given."""
        view = self._job(job)
        return {"requirements": [{"vertex": r.vertex_id, "lower": r.lower_bound,
                                  "upper": r.upper_bound}
                                 for r in view.checkpoints.requirements]}

    def op_result_create(self, job: str, status: str) -> dict[str, Any]:
        if not self._end(job, status):
            raise BridgeError("AlreadyExists", f"job {job!r} has a result")
        return {}

    def op_result_clean(self, job: str) -> dict[str, Any]:
        view = self.registry.sync().jobs.get(job)
        if view is None or view.live:
            raise BridgeError("NotExist", f"no result of job {job!r}")
        if not view.dirty:
            return {}
        self._term().term.mark_clean(job)
        return {}

    def op_result_has(self, job: str) -> dict[str, Any]:
        view = self.registry.sync().jobs.get(job)
        ended = view is not None and not view.live
        return {"dirty": ended and view is not None and view.dirty,
                "clean": ended and view is not None and not view.dirty}

    def op_results_dirty(self) -> list[dict[str, Any]]:
        return [{"job": job, "status": _TO_FLINK.get(view.status, view.status)}
                for job, view in self.registry.results(dirty=True).items()
                if not job.startswith(APPLICATION_PREFIX)]


def protocol_stdout() -> IO[str]:
    """This process's stdout for the protocol's lines: UTF-8 text over a buffered writer of
    its own, whatever ``PYTHONUNBUFFERED`` (or ``-u``) made of ``sys.stdout``.

    Unbuffered, ``sys.stdout`` is text over the raw file. When the JVM reads slowly and the
    pipe is full, a write(2) that a signal interrupts (SIGSTOP and SIGCONT, a handled
    signal) returns having written part of the line, and the text layer drops the rest
    without a word: the line is cut and the next one glued to it, two lines Flink never
    gets (tests/unit/test_flink_bridge_protocol.py). A buffered writer writes the rest."""
    raw = io.FileIO(sys.stdout.fileno(), "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", newline="\n")


def check_namespace(namespace: str) -> str:
    """The namespace as the Java side sends it (``[A-Za-z0-9._-]``, 1-200 characters, a
    letter or digit first), or :class:`~registry.errors.ConfigError`."""
    if not _NAMESPACE.fullmatch(namespace) or not namespace[0].isalnum():
        raise ConfigError(f"namespace {namespace!r} is not a sanitized Flink cluster id "
                          "([A-Za-z0-9._-], 1-200 characters, a letter or digit first)")
    return namespace


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent (the JVM) dies
    (``PR_SET_PDEATHSIG``); nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError) as e:
        _log.debug("flink-bridge: PR_SET_PDEATHSIG unavailable: %s", e)
