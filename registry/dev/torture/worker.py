"""One coordinator process of a fault campaign: random operations, and their history.

``python -m registry.dev.torture.worker RUN_DIR PROCESS INCARNATION`` reads ``RUN_DIR/run.json``,
connects a :class:`~registry.client.Registry` of its own per namespace, contends in each
with ``reg.elect(contender, lease)`` (a background thread per namespace: it waits to lead,
and once the term is lost or given up, contends again), and runs random operations in
``writers`` threads (``run.json``; 1 when absent) until SIGTERM or the run's deadline, each
from an RNG seeded by ``(seed, process, incarnation, thread)``. The threads share the
process's ``Registry`` and ``Term`` of each namespace, so calls of one ``Term`` are
concurrent (what group commit puts in one transaction), and some are paired on purpose
(``twin``): two threads make the same or conflicting calls at the same moment (the same new
job id submitted twice, overlapping ``submit_many`` batches, the same job cancelled or ended
twice, the same checkpoint triggered twice, a revoke of the term while another call of it
is in flight), so that calls of one group are refused, fenced and cut together.

Every operation appends JSON lines to ``RUN_DIR/history/PROCESS.jsonl`` (one ``write`` of
an ``O_APPEND`` descriptor per line, so a SIGKILL loses at most the line in flight):
an ``invoke`` before the call, then ``ok`` (it happened: receipts or the value read),
``fail`` (it did not happen, as :mod:`registry.errors` documents: ``WriteRejected``,
``Fenced``, ``ClaimRejected``, ``LeaseExpired``, ``ConfigError``, ``UnknownJob``,
``BlobError``, ``BrokerError``) or ``info`` (unknown: ``OutcomeUnknown``, anything else;
``unexpected`` marks an exception outside the documented tree). A call whose completion line is missing was cut by a kill.
Each line: ``process``, ``pid``, ``incarnation``, ``thread`` (the writing thread's name:
``writer-K``, or ``contend-NS`` for elections), ``index`` (per line, unique in the process
across its threads), ``op`` (pairs an invoke with its completion; unique in the process
across its threads), ``type``, ``f``, ``ns``, ``args``, ``value``, ``error``,
``reason``, ``event_ids`` (every event id the call generated or reported), ``epoch`` (the
term used), ``time`` (wall clock, seconds).

Operations: submit (inline, or over the inline limit into the shared blob store, some of
them with contents shared between namespaces), submit_many (2-5 jobs, sometimes with a
known id), cancel, terminate, adopt (1-3 jobs, sometimes a terminal one), release, the
checkpoint lifecycle, recover (a hook that fails for jobs whose id ends in ``-bad``),
collect_garbage (the run's grace), revoke (give the term up), reads (``read``: every
job's status; ``leader``: epoch, leader, revoked), snapshots, and writes through a term
that is already over (``stale``: they must fail).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

__all__ = ["main"]

NOT_DONE = ("WriteRejected", "LeaseExpired", "ConfigError", "UnknownJob", "BlobError",
            "BrokerError")
"""Exceptions that mean "not accepted" (the ``fail`` type; subclasses included), as
``registry.errors`` documents; ``OutcomeUnknown`` (and anything else) is ``info``."""

HOOK_FAILURE = "planted hook failure"
"""What the recovery hook raises for jobs whose id ends in ``-bad`` (not a lost graph)."""

_WEIGHTS = {
    "submit": 20, "submit_many": 6, "cancel": 8, "terminate": 5, "adopt": 6, "release": 4,
    "clean": 4,
    "checkpoint": 16, "recover": 4, "gc": 4, "read": 8, "leader": 4, "snapshot": 1,
    "revoke": 1, "stale": 4, "twin": 8,
}


_WRITES = frozenset({"submit", "submit_many", "cancel", "terminate", "adopt", "release",
                     "clean", "checkpoint", "recover", "revoke"})


class _Capture(threading.local):
    ids: list[str] | None = None


_capture = _Capture()


MUTATIONS = {
    "finding2": "issue 42, finding 2 put back: groups overlap (4 in flight) and a group plans "
                "reassertions of jobs that a group in flight writes",
    "finding3": "issue 42, finding 3 put back: a grant compares epochs only (no saw_renewal), "
                "so a contender that read before the leader renewed wins",
}
"""What ``jobreg torture --mutate`` can put back into the workers' jobreg, to show that the
campaign catches it (the checker's self-test against the real code paths)."""


def _mutate(name: str | None) -> None:
    """Put a fixed defect back into this worker's jobreg (:data:`MUTATIONS`)."""
    if not name:
        return
    if name not in MUTATIONS:
        raise SystemExit(f"unknown mutation {name!r}: one of {', '.join(MUTATIONS)}")
    import registry.client as client_mod
    import registry.writes as writes_mod

    if name == "finding2":
        class _Blind(dict):  # type: ignore[type-arg]
            def values(self):  # type: ignore[no-untyped-def]
                return []  # no group is ever in flight, as far as planning knows

        writes_mod.MAX_IN_FLIGHT = 4
        original_init = client_mod.Term.__init__

        def init(self, *a, **kw):  # type: ignore[no-untyped-def]
            original_init(self, *a, **kw)
            self._in_flight = _Blind()

        client_mod.Term.__init__ = init  # type: ignore[method-assign]
    else:
        original_claim = client_mod.Registry._claim_leadership

        def claim(self, *a, **kw):  # type: ignore[no-untyped-def]
            kw["saw_renewal"] = None
            return original_claim(self, *a, **kw)

        client_mod.Registry._claim_leadership = claim  # type: ignore[method-assign]


def _patch_event_ids() -> None:
    """Record every event id a call of this thread generates (the call's own records)."""
    import registry.client as client_mod

    original = getattr(client_mod, "new_event_id", None)
    if original is None:
        return

    def capturing() -> str:
        eid: str = original()
        if _capture.ids is not None:
            _capture.ids.append(eid)
        return eid

    # The client's id source, swapped to record the ids this worker writes (mypy: the
    # client imports the name without re-exporting it).
    client_mod.new_event_id = capturing  # type: ignore[attr-defined]


class History:
    """Appends JSON lines to one file, one ``os.write`` each."""

    def __init__(self, path: Path, process: str, incarnation: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._index = 0
        self._op = 0
        self.base = {"process": process, "pid": os.getpid(), "incarnation": incarnation}

    def next_op(self) -> int:
        with self._lock:
            self._op += 1
            return self._op

    def write(self, **fields: Any) -> None:
        with self._lock:
            self._index += 1
            line = {**self.base, "thread": threading.current_thread().name,
                    "index": self._index, "time": time.time(), **fields}
            os.write(self._fd, (json.dumps(line, default=str) + "\n").encode())


class _Offer:
    """A call one writer thread asks another to make at the same moment as its own."""

    def __init__(self, action: Any) -> None:
        self.action = action  # called by the thread that takes the offer
        self.taken = threading.Event()


class _Rendezvous:
    """Pairs writer threads: :meth:`offer` waits (briefly) for another thread to
    :meth:`take` the offer; both then call at once. Pausing threads wait here, so a free
    thread answers at once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._offer: _Offer | None = None

    def offer(self, action: Any, wait: float) -> bool:
        """Offer ``action``; ``True`` once a thread took it, ``False`` if none did within
        ``wait`` seconds (or another offer is open)."""
        offer = _Offer(action)
        with self._cond:
            if self._offer is not None:
                return False
            self._offer = offer
            self._cond.notify_all()
        if offer.taken.wait(wait):
            return True
        with self._cond:
            if self._offer is offer:
                self._offer = None
                return False
        return True  # taken just as the wait ended

    def take(self) -> Any:
        """The open offer's action (marked taken), or ``None``."""
        with self._cond:
            offer, self._offer = self._offer, None
        if offer is None:
            return None
        offer.taken.set()
        return offer.action

    def pause(self, seconds: float, stop: threading.Event) -> None:
        """Wait ``seconds``, or less when an offer is made or the worker stops."""
        with self._cond:
            if self._offer is None and not stop.is_set():
                self._cond.wait(seconds)


class _Ns:
    """One namespace as this worker sees it."""

    def __init__(self, name: str, reg: Any) -> None:
        self.name = name
        self.reg = reg
        self.election: Any = None
        self.term: Any = None
        self.old_terms: list[Any] = []
        # The term a revoke op gave up. Per term, not a flag: a revoke op that ends after
        # its term was lost must not make the next term resign (campaign seed 260014: it
        # did, the worker left that term without revoking it, and the checker saw a
        # leader that never learned its loss).
        self.resigned: Any = None
        self.thread: threading.Thread | None = None
        self.cp_next: dict[str, int] = {}


class Worker:
    """The coordinator: contenders in the background, random operations in front."""

    def __init__(self, run_dir: Path, process: str, incarnation: int) -> None:
        self.cfg = json.loads((run_dir / "run.json").read_text())
        self.run_dir = run_dir
        self.process = process
        self.incarnation = incarnation
        self.contender = f"{process}.{incarnation}"
        self.writers = int(self.cfg.get("writers", 1))
        # Writer 1 draws what the single loop drew before there were writer threads.
        self._rngs = {k: random.Random(f"{self.cfg['seed']}/{process}/{incarnation}"
                                       + (f"/{k}" if k > 1 else ""))
                      for k in range(1, self.writers + 1)}
        self._local = threading.local()
        # One writer draws from today's mix exactly; several add the paired calls.
        self._ops = [f for f in _WEIGHTS if f != "twin" or self.writers > 1]
        self._weights = [_WEIGHTS[f] for f in self._ops]
        self.rendezvous = _Rendezvous()
        self.hist = History(run_dir / "history" / f"{process}.jsonl", process, incarnation)
        self.stop = threading.Event()
        self.ppid = os.getppid()
        self.lease = float(self.cfg["lease"])
        self.spaces: dict[str, _Ns] = {}
        self.counter = 0
        self._counter_lock = threading.Lock()
        self.pool = [random.Random(f"{self.cfg['seed']}/pool/{k}").randbytes(
            self.cfg["inline_limit"] + 500 + 300 * k) for k in range(3)]

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        from registry.client import Registry

        _patch_event_ids()
        _mutate(self.cfg.get("mutate"))
        for ns in self.cfg["namespaces"]:
            reg = Registry.connect(self.cfg["bootstrap"], ns, topic=self.cfg["topic"],
                                   timeout=float(self.cfg["timeout"]),
                                   inline_limit=int(self.cfg["inline_limit"]),
                                   blob_store=self.cfg["blob_dir"])
            self.spaces[ns] = _Ns(ns, reg)
        self.hist.write(type="info", f="start", contender=self.contender)
        for st in self.spaces.values():
            st.thread = threading.Thread(target=self._contend, args=(st,), daemon=True,
                                         name=f"contend-{st.name}")
            st.thread.start()

    def _contend(self, st: _Ns) -> None:
        """Wait to lead; lead until the term is lost or given up; contend again."""
        while not self.stop.is_set():
            lost = threading.Event()  # this election's: a late callback of another is not

            def revoked(term: Any, st: _Ns = st, lost: threading.Event = lost) -> None:
                self.hist.write(type="info", f="revoked", ns=st.name, epoch=term.epoch)
                lost.set()

            op = self.hist.next_op()
            self.hist.write(type="invoke", f="elect", op=op, ns=st.name)
            try:
                election = st.reg.elect(self.contender, lease=self.lease, on_revoked=revoked)
                st.election = election
                term = election.acquire()
            except RuntimeError:
                return  # cancelled: the worker stops
            except Exception as e:
                self.hist.write(type="info", f="elect", op=op, ns=st.name,
                                error=type(e).__name__, reason=str(e)[:300],
                                unexpected=not _documented(e))
                time.sleep(self.lease / 4)
                continue
            st.term = term
            self.hist.write(type="ok", f="elect", op=op, ns=st.name, epoch=term.epoch,
                            value={"epoch": term.epoch, "contender": self.contender})
            while not (self.stop.is_set() or lost.is_set() or st.resigned is term):
                # What the Flink bridge hands to hasLeadership(): until when this process
                # believes, now, that it certainly leads (the checker's two_leaders rule).
                now, certain = time.time(), election.valid_for()
                if certain > 0:
                    self.hist.write(type="info", f="certain", ns=st.name, epoch=term.epoch,
                                    until=now + certain)
                lost.wait(0.2)
            st.term = None
            st.old_terms.append(term)
            if self.stop.is_set():
                return
            election.cancel()
            if st.resigned is term:
                self.stop.wait(self.lease)  # let another contender take over

    # -- the loop -------------------------------------------------------------------------

    @property
    def rng(self) -> random.Random:
        """The calling writer thread's RNG (writer 1's outside the writer threads)."""
        return getattr(self._local, "rng", None) or self._rngs[1]

    def run(self) -> None:
        """Run the writer threads until they stop (SIGTERM, the deadline, the runner gone)."""
        threads = [threading.Thread(target=self._loop, args=(k,), daemon=True,
                                    name=f"writer-{k}") for k in range(1, self.writers + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _loop(self, k: int) -> None:
        self._local.rng = self._rngs[k]
        deadline = float(self.cfg["deadline"]) + 60  # the runner stops us; this is a backstop
        lo, hi = self.cfg.get("op_pause", [0.01, 0.06])
        while not self.stop.is_set() and time.time() < deadline:
            if os.getppid() != self.ppid:
                self.stop.set()  # the runner is gone: every thread stops
                break
            try:
                twin = self.rendezvous.take() if self.writers > 1 else None
                if twin is not None:
                    twin()  # the other half of a pair, at once
                    continue
                leading = sorted(n for n, st in self.spaces.items() if st.term is not None)
                if leading and self.rng.random() < 0.8:
                    st = self.spaces[self.rng.choice(leading)]
                else:
                    st = self.spaces[self.rng.choice(sorted(self.spaces))]
                f = self.rng.choices(self._ops, weights=self._weights)[0]
                if st.term is None and f in _WRITES | {"twin"} and self.rng.random() < 0.6:
                    self.rendezvous.pause(self.rng.uniform(lo, hi), self.stop)  # a standby
                    continue                                                    # mostly waits
                self._op(st, f)
            except Exception:  # a bug of the worker itself, not of the registry
                self.hist.write(type="info", f="worker_error",
                                reason=traceback.format_exc()[-1500:])
            self.rendezvous.pause(self.rng.uniform(lo, hi), self.stop)

    def shutdown(self) -> None:
        self.stop.set()
        for st in self.spaces.values():
            if st.election is not None:
                st.election.cancel()  # no revoke: the term stays as the log has it
        for st in self.spaces.values():
            with contextlib.suppress(Exception):
                st.reg.close()
        self.hist.write(type="info", f="stop")

    # -- operations -----------------------------------------------------------------------

    def _call(self, st: _Ns, f: str, fn: Any, *, args: dict[str, Any], term: Any = None,
              stale: bool = False, value: Any = None) -> Any:
        """Run one library call with its history lines; return its result or None."""
        op = self.hist.next_op()
        epoch = term.epoch if term is not None else None
        self.hist.write(type="invoke", f=f, op=op, ns=st.name, args=args, epoch=epoch,
                        stale=stale or None)
        _capture.ids = []
        try:
            result = fn()
        except BaseException as e:
            ids = list(dict.fromkeys(_capture.ids + _exception_ids(e)))
            name = type(e).__name__
            kind = "fail" if any(c.__name__ in NOT_DONE for c in type(e).__mro__) else "info"
            self.hist.write(type=kind, f=f, op=op, ns=st.name, epoch=epoch, error=name,
                            reason=getattr(e, "reason", None), detail=str(e)[:300],
                            event_ids=ids, stale=stale or None,
                            unexpected=None if _documented(e) else True,
                            trace=None if _documented(e) else traceback.format_exc()[-1500:])
            if not isinstance(e, Exception):
                raise
            return None
        finally:
            captured = _capture.ids or []
            _capture.ids = None
        receipts = _receipts(result)
        shown = {"receipts": receipts} if receipts is not None else \
            value(result) if value is not None else None
        ids = list(dict.fromkeys(captured + [r["event_id"] for r in receipts or []]))
        self.hist.write(type="ok", f=f, op=op, ns=st.name, epoch=epoch, value=shown,
                        event_ids=ids, stale=stale or None)
        return result

    def _new_id(self, bad: bool = False) -> str:
        with self._counter_lock:
            self.counter += 1
            n = self.counter
        return f"{self.contender}-{n}" + ("-bad" if bad else "")

    def _graph(self) -> bytes:
        r = self.rng.random()
        if r < 0.12:
            return self.rng.choice(self.pool)  # the same bytes in every namespace
        if r < 0.3:
            return self.rng.randbytes(self.cfg["inline_limit"] + self.rng.randint(1, 1500))
        return self.rng.randbytes(self.rng.randint(4, 120))

    def _known(self, st: _Ns, live: bool | None = True) -> list[str]:
        jobs = st.reg.image.jobs
        return sorted(j for j, v in jobs.items() if live is None or v.live == live)

    def _pick(self, st: _Ns, p_terminal: float = 0.1) -> str | None:
        pool = self._known(st, not self.rng.random() < p_terminal)
        if not pool:
            pool = self._known(st, None)
        return self.rng.choice(pool) if pool else None

    def _op(self, st: _Ns, f: str) -> None:
        term = st.term
        stale = False
        if f == "stale" or (term is None and f in _WRITES | {"twin"}):
            if not st.old_terms:
                f = "read" if f == "stale" else "leader"
            else:
                term, stale = self.rng.choice(st.old_terms[-3:]), True
                if f in ("stale", "recover", "revoke", "twin"):
                    f = self.rng.choice(["submit", "cancel", "adopt", "checkpoint", "clean"])
        reg = st.reg
        if f == "submit":
            job, graph = self._new_id(self.rng.random() < 0.05), self._graph()
            budget = self.rng.randint(0, 2)
            self._call(st, "submit", lambda: term.submit(job, graph,
                                                         max_checkpoint_failures=budget),
                       args={"job": job, "size": len(graph), "budget": budget}, term=term,
                       stale=stale)
        elif f == "submit_many":
            jobs = [self._new_id(self.rng.random() < 0.05)
                    for _ in range(self.rng.randint(2, 5))]
            existing = []
            if self.rng.random() < 0.25:
                known = self._pick(st, 0.5)
                if known is not None:
                    jobs.insert(self.rng.randrange(len(jobs) + 1), known)
                    existing.append(known)
            graphs = [(j, self._graph()) for j in jobs]
            self._call(st, "submit_many", lambda: term.submit_many(graphs),
                       args={"jobs": jobs, "existing": existing}, term=term, stale=stale)
        elif f in ("cancel", "terminate", "release"):
            picked = self._pick(st, 0.1 if f != "release" else 0.05)
            if picked is None:
                return
            job = picked
            if self.rng.random() < 0.03:
                job = self._new_id()  # never submitted: UnknownJob before sending
            if f == "cancel":
                fn = lambda: term.cancel(job, "torture")  # noqa: E731
                args = {"job": job}
            elif f == "terminate":
                state = self.rng.choice(["FINISHED", "FAILED"])
                fn = lambda: term.terminate(job, state, "torture")  # noqa: E731
                args = {"job": job, "state": state}
            else:
                fn = lambda: term.release(job)  # noqa: E731
                args = {"job": job}
            self._call(st, f, fn, args=args, term=term, stale=stale)
        elif f == "clean":  # the cleanup of a job that ended is done (Flink's markResultAsClean)
            dirty = sorted(st.reg.image.results(dirty=True))
            if not dirty:
                return
            job = self.rng.choice(dirty)
            self._call(st, "clean", lambda: term.mark_clean(job), args={"job": job},
                       term=term, stale=stale)
        elif f == "adopt":
            pool = self._known(st)
            if not pool:
                return
            jobs = self.rng.sample(pool, min(len(pool), self.rng.randint(1, 3)))
            if self.rng.random() < 0.15:
                dead = self._known(st, False)
                if dead:
                    jobs.append(self.rng.choice(dead))
            self._call(st, "adopt", lambda: term.adopt(*jobs), args={"jobs": jobs},
                       term=term, stale=stale)
        elif f == "checkpoint":
            self._checkpoint(st, term, stale)
        elif f == "recover":
            def hook(job: Any) -> None:
                if job.job_id.endswith("-bad"):
                    raise RuntimeError(HOOK_FAILURE)

            self._call(st, "recover", lambda: term.recover(hook), args={}, term=term,
                       value=lambda rs: {"results": [
                           {"job": r.job_id, "status": r.status, "error": r.error,
                            "offset": r.offset} for r in rs]})
        elif f == "revoke":
            if self.rng.random() < 0.5:
                return  # rarer than its weight says
            self._call(st, "revoke", lambda: term.revoke("torture resign"), args={},
                       term=term)
            st.resigned = term  # leaves only this term (if it is still the one led)
        elif f == "gc":
            grace = float(self.cfg["gc_grace"])
            self._call(st, "gc", lambda: reg.collect_garbage(grace), args={"grace": grace},
                       value=lambda rep: {"deleted": [b.uri for b in rep.deleted],
                                          "kept_referenced": rep.kept_referenced,
                                          "kept_young": rep.kept_young,
                                          "errors": list(rep.errors)})
        elif f == "read":
            self._call(st, "read", lambda: reg.jobs(include_terminal=True), args={},
                       value=lambda jobs: {"jobs": {j: v.status for j, v in jobs.items()}})
        elif f == "leader":
            self._call(st, "leader", reg.sync, args={},
                       value=lambda im: {"epoch": im.epoch, "leader": im.leader,
                                         "revoked": im.revoked,
                                         "last_offset": im.provenance.last_offset})
        elif f == "twin":
            self._twin(st, term, stale)
        elif f == "snapshot":
            with self._counter_lock:
                self.counter += 1
                n = self.counter
            path = self.run_dir / "snapshots" / f"{st.name}.{self.contender}.{n}.snap"
            path.parent.mkdir(exist_ok=True)
            self._call(st, "snapshot", lambda: reg.write_snapshot(path), args={},
                       value=lambda p: {"path": str(p)})

    def _twin(self, st: _Ns, term: Any, stale: bool) -> None:
        """Two calls of one term at the same moment, one by this thread, one by whichever
        writer thread takes the offer (alone if none does within a moment): conflicting or
        equal calls, so that a group holds a refused call next to accepted ones, and a
        revoke lands while another call of the term is in flight."""
        kind = self.rng.choices(["submit", "submit_many", "cancel", "end", "checkpoint",
                                 "revoke"], [5, 3, 4, 3, 3, 1])[0]
        mine: Any
        theirs: Any
        if kind == "submit":  # the same new id twice: one is accepted, one refused
            job, graph, other = self._new_id(), self._graph(), self._graph()
            mine = lambda: self._call(st, "submit", lambda: term.submit(job, graph),  # noqa: E731
                                      args={"job": job, "size": len(graph), "twin": True},
                                      term=term, stale=stale)
            theirs = lambda: self._call(st, "submit", lambda: term.submit(job, other),  # noqa: E731
                                        args={"job": job, "size": len(other), "twin": True},
                                        term=term, stale=stale)
        elif kind == "submit_many":  # overlapping batches: one sinks on the shared id
            shared = self._new_id()
            a = [self._new_id(), shared]
            b = [shared, self._new_id(), self._new_id()]

            def many(jobs: list[str]) -> Any:
                graphs = [(j, self._graph()) for j in jobs]
                return lambda: self._call(st, "submit_many", lambda: term.submit_many(graphs),
                                          args={"jobs": jobs, "existing": [], "twin": True},
                                          term=term, stale=stale)
            mine, theirs = many(a), many(b)
        elif kind in ("cancel", "end"):  # the same job ended twice (or two ways)
            picked = self._pick(st, 0.05)
            if picked is None:
                return
            job = picked
            how = ["cancel", "cancel"] if kind == "cancel" else \
                self.rng.sample(["cancel", "FINISHED", "FAILED"], 2)

            def end(how_: str) -> Any:
                if how_ == "cancel":
                    return lambda: self._call(st, "cancel",
                                              lambda: term.cancel(job, "torture twin"),
                                              args={"job": job, "twin": True}, term=term,
                                              stale=stale)
                return lambda: self._call(st, "terminate",
                                          lambda: term.terminate(job, how_, "torture twin"),
                                          args={"job": job, "state": how_, "twin": True},
                                          term=term, stale=stale)
            mine, theirs = end(how[0]), end(how[1])
        elif kind == "checkpoint":  # the same checkpoint triggered twice
            pool = self._known(st)
            if not pool:
                return
            job = self.rng.choice(pool)
            cps = st.reg.image.jobs[job].checkpoints
            cid = max([cps.last_completed, *cps.pending, *cps.discarded, *cps.counted,
                       st.cp_next.get(job, 0)]) + 1
            st.cp_next[job] = max(cid, st.cp_next.get(job, 0))

            def trigger() -> Any:
                return self._call(st, "checkpoint_triggered",
                                  lambda: term.checkpoint_triggered(job, cid),
                                  args={"job": job, "id": cid, "twin": True}, term=term,
                                  stale=stale)
            mine = theirs = trigger
        else:  # the term given up while another call of it is in flight
            if stale:
                return
            job, graph = self._new_id(), self._graph()
            theirs = lambda: self._call(st, "submit", lambda: term.submit(job, graph),  # noqa: E731
                                        args={"job": job, "size": len(graph), "twin": True},
                                        term=term)

            def mine() -> None:
                self._call(st, "revoke", lambda: term.revoke("torture twin resign"),
                           args={"twin": True}, term=term)
                st.resigned = term
        self.rendezvous.offer(theirs, wait=0.25)
        mine()

    def _checkpoint(self, st: _Ns, term: Any, stale: bool) -> None:
        pool = self._known(st)
        if not pool:
            return
        job = self.rng.choice(pool)
        view = st.reg.image.jobs[job]
        cps = view.checkpoints
        known = [cps.last_completed, *cps.pending, *cps.discarded, *cps.counted]
        newest = max(known + [st.cp_next.get(job, 0)])
        r = self.rng.random()
        if r < 0.4 or not (cps.pending or cps.last_completed >= 0):
            cid = newest + 1 if self.rng.random() < 0.95 else max(0, newest)  # sometimes stale
            st.cp_next[job] = max(cid, st.cp_next.get(job, 0))
            kind, fn = "triggered", lambda: term.checkpoint_triggered(job, cid)
        else:
            choices = list(cps.pending) or [cps.last_completed]
            cid = self.rng.choice(choices) if self.rng.random() < 0.85 else \
                self.rng.randint(0, max(1, newest))
            kind = self.rng.choices(["completed", "failed", "discarded", "trigger_failed",
                                     "restarted"], [4, 4, 2, 1, 1])[0]
            why = self.rng.choice(["CHECKPOINT_DECLINED", "CHECKPOINT_EXPIRED",
                                   "FINALIZE_CHECKPOINT_FAILURE", "JOB_FAILOVER_REGION",
                                   "CHANNEL_STATE_SHARED_STREAM_EXCEPTION", "UNSPECIFIED"])
            if kind == "completed":
                fn = lambda: term.checkpoint_completed(job, cid, f"mem://{job}/{cid}")  # noqa: E731
            elif kind == "failed":
                fn = lambda: term.checkpoint_failed(job, cid, "declined", task="t1",  # noqa: E731
                                                    failure_reason=why)
            elif kind == "trigger_failed":
                fn = lambda: term.checkpoint_trigger_failed(job, why)  # noqa: E731
            elif kind == "restarted":
                fn = lambda: term.job_restarted(job, "over budget")  # noqa: E731
            else:
                fn = lambda: term.checkpoint_discarded(job, cid, "torture")  # noqa: E731
        self._call(st, f"checkpoint_{kind}", fn, args={"job": job, "id": cid}, term=term,
                   stale=stale)


def _documented(e: BaseException) -> bool:
    from registry.errors import RegistryError

    return isinstance(e, RegistryError)


def _exception_ids(e: BaseException) -> list[str]:
    ids = getattr(e, "event_ids", None)
    if ids:
        return [str(i) for i in ids]
    one = getattr(e, "event_id", None)
    return [one] if one else []


def _receipts(result: Any) -> list[dict[str, Any]] | None:
    """Receipts of a write as dicts; ``None`` when the result is not receipts."""
    items = result if isinstance(result, list) else [result]
    if not items or not all(hasattr(r, "event_id") and hasattr(r, "offset") for r in items):
        return None
    return [{"offset": r.offset, "epoch": r.epoch, "event_id": r.event_id,
             "ignored": getattr(r, "ignored", None)} for r in items]


def main(argv: list[str] | None = None) -> int:
    """Run one worker until SIGTERM or the deadline."""
    run_dir, process, incarnation = (argv or sys.argv[1:])[:3]
    from registry import stalls
    from registry.dev.torture.runner import code_fingerprint

    wanted = json.loads((Path(run_dir) / "run.json").read_text()).get("code")
    if wanted is not None and wanted != code_fingerprint():
        print(f"worker {process}: the jobreg code changed since the run began (fingerprint "
              f"{code_fingerprint()}, the run's {wanted}); not starting", file=sys.stderr)
        return 3
    worker = Worker(Path(run_dir), process, int(incarnation))
    # Fold rule 6's collection after every second checkpoint record (64 in production), so
    # that the campaign's terms write tombstones under faults as often as it can check them.
    from registry import client
    client.COLLECT_BATCH = 2
    # The nemesis of threads: each thread of this worker may be held at the write path's
    # and the election's stall points (registry.stalls), drawn from the run's seed.
    chance = float(worker.cfg.get("stalls", 0.0))
    stall = stalls.Random(f"{worker.cfg['seed']}/{process}/{incarnation}/stalls", p=chance)
    if chance > 0:
        stalls.install(stall)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    # A worker that does not stop when told is sent SIGUSR1 before SIGKILL: every thread's
    # stack goes to its .err file, so a hung call can be explained afterwards.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        worker.start()
        worker.run()
    finally:
        # A stuck close (a paused broker) must not keep the process alive.
        threading.Timer(5.0, lambda: os._exit(0)).start()
        worker.shutdown()
        if chance > 0:
            with contextlib.suppress(OSError):
                (Path(run_dir) / "stalls").mkdir(exist_ok=True)
                (Path(run_dir) / "stalls" / f"{process}.{incarnation}.json").write_text(
                    json.dumps(stall.stalls))
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
