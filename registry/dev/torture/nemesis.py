"""The campaign's fault injector: seeded, one fault at a time, every fault on record.

Faults (``kind`` in ``nemesis.jsonl`` and the counts of ``summary.json``):

* ``pause_short`` / ``pause_long``: SIGSTOP a worker for 0.2-0.8 or 1.2-2.5 leases, then
  SIGCONT (a GC pause, a frozen VM);
* ``kill``: SIGKILL a worker; the runner restarts it (a new incarnation) 0.2-1.5 s later;
* ``pause_in_write`` / ``kill_in_write``: the same, aimed: the nemesis watches the worker's
  history and strikes while a write is in flight (its invoke line is the last one); with
  several writer threads per worker, half of them wait for two or more writes in flight at
  once (mid-group: ``in_flight`` in the line says how many the history's tail showed);
* ``broker_pause``: SIGSTOP the embedded broker for 0.2-1.2 leases (only a broker the
  runner started);
* ``net_cut`` / ``net_blackhole``: the fault proxy between every client and the embedded
  broker resets or stalls every connection for 0.1-1.0 leases;
* On Apache Kafka's three nodes (a :class:`~registry.dev.torture.cluster.CampaignCluster`),
  one node fault at a time, each begun only while the cluster is whole (every node up and
  in every ISR), aimed while a worker's write is in flight when one comes within 1.5 s
  (``in_write`` in the line; ``ns`` the namespace of that write, or a random one):

  - ``leader_kill`` / ``leader_pause``: SIGKILL (restarted 0.2-2 leases later,
    :meth:`KafkaCluster.restart`) or SIGSTOP (0.3-2.5 leases) the node leading the
    namespace's partition;
  - ``coordinator_kill`` / ``coordinator_pause``: the same to the transaction coordinator of
    the namespace's transactional id (the leader of its ``__transaction_state`` partition);
  - ``node_restart``: SIGKILL any node and restart it 0.2-1 leases later;
  - ``node_cut``: cut a node (the partition's leader half of the time) off from the other
    nodes for 0.5-3 leases; clients still reach it (only with network namespaces,
    :mod:`registry.dev.torture.netsplit`).

  A node fault is two lines (``phase`` start and end; the end says how long the node took
  to come back, and ``learned_at`` when it named the same partition leaders as the other
  nodes: a leader deposed while cut off or paused serves its stale log to clients until
  then); ``roles`` names what the struck node was (leader of the run's partitions,
  coordinator of its namespaces);
* ``zombie`` (``sub``: ``stale_epoch``, ``future_epoch``, ``wrong_writer``,
  ``revoked_term``, ``forged_grant``): a job event or a grant written straight to the
  topic with a plain producer, bypassing the client, that the fold must refuse;
* ``garbage``: bytes that are not an event (random, a valid header with a random body,
  a truncated record, a tombstone) on a job key, a lock key or a term key, or over the
  record that holds a job's birth, end or checkpoint state;
* ``duplicate``: a record already in the namespace's log, re-sent verbatim.

Every fault is one line of ``nemesis.jsonl`` (pauses two: ``phase`` start and end), with
the event id and offset of every record it wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from registry.image import Image

__all__ = ["ZOMBIE_KINDS", "Nemesis"]

ZOMBIE_KINDS = ("stale_epoch", "future_epoch", "wrong_writer", "revoked_term", "forged_grant")


class Workers(Protocol):
    """What the nemesis needs of the runner's process table."""

    def running(self) -> dict[str, int]:
        """process name -> pid of every worker alive now."""
        ...

    def kill(self, process: str, pid: int) -> bool:
        """SIGKILL ``process`` if ``pid`` is still its running incarnation, and restart it
        later; ``False`` if it is gone or was replaced meanwhile."""
        ...


class Nemesis:
    """Injects faults until :meth:`stop`; see the module docstring."""

    def __init__(self, rng: random.Random, *, workers: Workers, bootstrap: str, topic: str,
                 namespaces: dict[str, int], lease: float, log_path: Path,
                 broker: Any = None, proxy: Any = None, interval: tuple[float, float] = (0.3, 1.2),
                 timeout: float = 1.0, writers: int = 1, cluster: Any = None) -> None:
        self.rng = rng
        self.cluster = cluster  # a CampaignCluster: Kafka node faults
        self._node_thread: threading.Thread | None = None
        self._last_invoke: dict[str, Any] = {}
        self.writers = writers
        self.workers = workers
        self.bootstrap, self.topic = bootstrap, topic
        self.namespaces = namespaces  # ns -> partition
        self.lease = lease
        self.broker, self.proxy = broker, proxy
        self.interval = interval
        self.timeout = timeout
        self.counts: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self._log = log_path.open("a", buffering=1)
        self.history_dir = log_path.parent / "history"
        self._log_lock = threading.Lock()
        self._stop = threading.Event()
        self._paused: dict[int, str] = {}  # pid -> process (or "broker")
        self._pause_lock = threading.Lock()
        self._timers: list[threading.Timer] = []
        self._net_thread: threading.Thread | None = None
        self._regs: dict[str, Any] = {}
        self._readers: dict[int, Any] = {}
        self._recent: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
        self._writer: Any = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Nemesis:
        self._thread = threading.Thread(target=self._loop, name="nemesis", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop injecting; resume everything paused, heal the network."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for t in self._timers:
            t.cancel()
        with self._pause_lock:
            paused = dict(self._paused)
            self._paused.clear()
        for pid, who in paused.items():
            self._signal(pid, signal.SIGCONT)
            self._record(kind="resume", phase="end", pid=pid, process=who, at_stop=True)
        if self.proxy is not None:
            self.proxy.heal()
        if self._node_thread is not None:  # it ends its fault at once: the stop is set
            self._node_thread.join(180)
        for reg in self._regs.values():
            with contextlib.suppress(Exception):
                reg.close()
        for reader in self._readers.values():
            with contextlib.suppress(Exception):
                reader.close()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._log.close()

    # -- the loop ---------------------------------------------------------------------

    def _loop(self) -> None:
        kinds = {"pause_short": 2.0, "pause_long": 1.5, "kill": 0.8, "pause_in_write": 2.5,
                 "kill_in_write": 0.8, "zombie": 4.0, "garbage": 1.5, "duplicate": 1.5}
        if self.broker is not None:
            kinds["broker_pause"] = 0.8
        if self.proxy is not None:
            kinds["net_cut"] = 0.5
            kinds["net_blackhole"] = 0.5
        if self.cluster is not None:
            # One node fault at a time, each lasting seconds: while one is on, another
            # kind is drawn, so the other faults keep their rate.
            node_kinds = {"leader_kill": 2.0, "leader_pause": 1.5, "coordinator_kill": 1.5,
                          "coordinator_pause": 1.2, "node_restart": 0.8}
            if self.cluster.can_cut:
                node_kinds["node_cut"] = 2.0
            kinds.update(node_kinds)
        while not self._stop.wait(self.rng.uniform(*self.interval)):
            kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
            if kind in self._NODE_KINDS and self._node_thread is not None \
                    and self._node_thread.is_alive():
                others = {k: w for k, w in kinds.items() if k not in self._NODE_KINDS}
                kind = self.rng.choices(list(others), weights=list(others.values()))[0]
            try:
                done = getattr(self, f"_{kind}")()
            except Exception as e:  # the broker is paused or cut: try another fault later
                self.skipped[kind] += 1
                self._record(kind=kind, skipped=f"{type(e).__name__}: {e}"[:300])
                continue
            if done:
                self.counts[kind if kind != "zombie" else f"zombie_{done}"] += 1
            else:
                self.skipped[kind] += 1

    def _record(self, **fields: Any) -> None:
        with self._log_lock:
            if not self._log.closed:
                self._log.write(json.dumps({"time": time.time(), **fields}) + "\n")

    @staticmethod
    def _signal(pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    # -- process faults ---------------------------------------------------------------

    def _victim(self) -> tuple[str, int] | None:
        running = self.workers.running()
        with self._pause_lock:
            free = {p: pid for p, pid in running.items() if pid not in self._paused}
        if len(free) <= 1 and len(running) > 1:
            return None  # keep one worker going
        if not free:
            return None
        name = self.rng.choice(sorted(free))
        return name, free[name]

    def _pause(self, pid: int, who: str, seconds: float, kind: str, **extra: Any) -> bool:
        with self._pause_lock:
            if pid in self._paused:
                return False
            if not self._signal(pid, signal.SIGSTOP):
                return False
            self._paused[pid] = who
        self._record(kind=kind, phase="start", pid=pid, process=who, seconds=seconds,
                     **extra)

        def resume() -> None:
            with self._pause_lock:
                if self._paused.pop(pid, None) is None:
                    return
                self._signal(pid, signal.SIGCONT)
            self._record(kind=kind, phase="end", pid=pid, process=who)

        t = threading.Timer(seconds, resume)
        t.daemon = True
        self._timers.append(t)
        t.start()
        return True

    def _pause_short(self) -> bool:
        v = self._victim()
        return v is not None and self._pause(v[1], v[0], self.rng.uniform(0.2, 0.8) * self.lease,
                                             "pause_short")

    def _pause_long(self) -> bool:
        v = self._victim()
        return v is not None and self._pause(v[1], v[0], self.rng.uniform(1.2, 2.5) * self.lease,
                                             "pause_long")

    def _kill(self) -> bool:
        v = self._victim()
        return v is not None and self._kill_pid(*v)

    def _kill_pid(self, name: str, pid: int, kind: str = "kill", **extra: Any) -> bool:
        # The process table kills, so that it never mistakes this death for a crash and
        # restarts the worker twice (once as a crash, once as a kill).
        if not self.workers.kill(name, pid):
            return False
        self._record(kind=kind, pid=pid, process=name, **extra)
        return True

    _WRITES = frozenset({"submit", "submit_many", "cancel", "terminate", "adopt", "release",
                         "clean", "checkpoint_triggered", "checkpoint_completed", "checkpoint_failed",
                         "checkpoint_discarded", "checkpoint_trigger_failed",
                         "checkpoint_restarted", "recover", "revoke"})

    def _in_write(self, name: str, pid: int, wait: float = 1.5, need: int = 1) -> int:
        """Wait (up to ``wait`` s) until ``name``'s newest history line is a write's invoke
        and at least ``need`` writes are in flight (invokes without a completion in the
        history's tail); how many were, or 0 if the moment did not come."""
        path = self.history_dir / f"{name}.jsonl"
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self._stop.is_set():
            lines = []
            try:
                with path.open("rb") as f:
                    f.seek(max(0, path.stat().st_size - 8192))
                    tail = f.read().rstrip(b"\n").split(b"\n")[1:]
                for raw in tail:
                    with contextlib.suppress(ValueError):
                        lines.append(json.loads(raw))
            except OSError:
                pass
            line = lines[-1] if lines else {}
            if line.get("type") == "invoke" and line.get("f") in self._WRITES and \
                    line.get("pid") == pid:
                open_ = {x.get("op") for x in lines if x.get("pid") == pid and
                         x.get("type") == "invoke" and x.get("f") in self._WRITES}
                open_ -= {x.get("op") for x in lines if x.get("type") != "invoke"}
                if len(open_) >= need:
                    self._last_invoke = line
                    return len(open_)
            time.sleep(0.002)
        return 0

    def _need(self) -> int:
        return 2 if self.writers > 1 and self.rng.random() < 0.5 else 1

    def _pause_in_write(self) -> bool:
        v = self._victim()
        if v is None:
            return False
        in_flight = self._in_write(*v, need=self._need())
        if not in_flight:
            return False
        long = self.rng.random() < 0.5
        seconds = self.rng.uniform(1.2, 2.5) if long else self.rng.uniform(0.2, 0.8)
        return self._pause(v[1], v[0], seconds * self.lease, "pause_in_write",
                           in_flight=in_flight)

    def _kill_in_write(self) -> bool:
        v = self._victim()
        if v is None:
            return False
        in_flight = self._in_write(*v, need=self._need())
        if not in_flight:
            return False
        return self._kill_pid(*v, kind="kill_in_write", in_flight=in_flight)

    def _broker_pause(self) -> bool:
        pid = getattr(self.broker, "pid", None)
        if pid is None:
            return False
        return self._pause(pid, "broker", self.rng.uniform(0.2, 1.2) * self.lease,
                           "broker_pause")

    def _interrupt(self, mode: str) -> bool:
        if self._net_thread is not None and self._net_thread.is_alive():
            return False
        seconds = self.rng.uniform(0.1, 1.0) * self.lease
        self._net_thread = self.proxy.interrupt(seconds, mode)
        self._record(kind=f"net_{mode}", phase="start", seconds=seconds)
        return True

    def _net_cut(self) -> bool:
        return self._interrupt("cut")

    def _net_blackhole(self) -> bool:
        return self._interrupt("blackhole")

    # -- Kafka node faults ------------------------------------------------------------

    _NODE_KINDS = frozenset({"leader_kill", "leader_pause", "coordinator_kill",
                             "coordinator_pause", "node_restart", "node_cut"})

    def _roles(self) -> dict[int, list[str]]:
        """What each node is now: the leader of the run's partitions, the coordinator of
        its namespaces' transactional ids."""
        from registry.log import transactional_id

        roles: dict[int, list[str]] = {}
        for part in sorted(set(self.namespaces.values())):
            roles.setdefault(self.cluster.leader_of(self.topic, part), []).append(
                f"leader:{part}")
        for ns in sorted(self.namespaces):
            node = self.cluster.coordinator_of(transactional_id(self.topic, ns))
            if node is not None:
                roles.setdefault(node, []).append(f"coordinator:{ns}")
        return roles

    def _node_fault(self, kind: str) -> bool:
        """One node fault (module docstring): pick the node, wait for a write in flight,
        strike; a thread ends the fault later."""
        if self._node_thread is not None and self._node_thread.is_alive():
            return False
        if not self.cluster.whole([self.topic], timeout=self.timeout):
            return False
        roles = self._roles()
        action = kind.rpartition("_")[2]  # kill, pause, restart, cut
        # Only a namespace's leader writes: look at each worker in turn for 1.5 s in all.
        with self._pause_lock:
            running = {p: pid for p, pid in self.workers.running().items()
                       if pid not in self._paused}
        order = self.rng.sample(sorted(running), len(running))
        v, in_flight = None, 0
        for name in order:
            v = (name, running[name])
            in_flight = self._in_write(*v, wait=1.5 / max(1, len(order)))
            if in_flight:
                break
        ns = self._last_invoke.get("ns") if in_flight else None
        if ns not in self.namespaces:
            ns = self.rng.choice(sorted(self.namespaces))
        if kind.startswith("leader") or (kind == "node_cut" and self.rng.random() < 0.5):
            want = f"leader:{self.namespaces[ns]}"
        elif kind.startswith("coordinator"):
            want = f"coordinator:{ns}"
        else:
            want = ""
        nodes = [n for n, r in roles.items() if n > 0 and (not want or want in r)]
        if not want:
            nodes = self.cluster.node_ids()
        if not nodes:
            return False
        node = self.rng.choice(sorted(nodes))
        before = self._leader_epochs(node)
        if action == "kill" or action == "restart":
            seconds = self.rng.uniform(0.2, 2.0 if action == "kill" else 1.0) * self.lease
            self.cluster.kill(node)
        elif action == "pause":
            seconds = self.rng.uniform(0.3, 2.5) * self.lease
            self.cluster.pause(node)
        else:
            seconds = self.rng.uniform(0.5, 3.0) * self.lease
            self.cluster.cut(node)
        self._record(kind=kind, phase="start", node=node, seconds=seconds, ns=ns,
                     in_write=in_flight, roles=roles.get(node, []),
                     process=v[0] if v is not None and in_flight else None)

        def end() -> None:
            self._stop.wait(seconds)
            began = time.monotonic()
            error = None
            try:
                if action in ("kill", "restart"):
                    self.cluster.restart(node)
                elif action == "pause":
                    self.cluster.resume(node)
                else:
                    self.cluster.heal_cut(node)
            except Exception as e:  # noqa: BLE001 - on record; the runner heals the cluster
                error = f"{type(e).__name__}: {e}"[:300]
            back = time.monotonic() - began
            # Until the node knows who leads now, a client whose metadata still names it
            # may read its stale log: the checker needs when that ended (``learned_at``).
            learned_at = None
            deadline = time.monotonic() + 60
            while error is None and time.monotonic() < deadline:
                if self.cluster.agrees(node, self.topic):
                    learned_at = time.time()
                    break
                time.sleep(0.05)
            after = self._leader_epochs(None, avoid=node)
            # Deposed: a partition it led got a new leader epoch meanwhile (None: unknown).
            deposed = None if before is None or after is None else any(
                after.get(p) != before.get(p) for p in before)
            self._record(kind=kind, phase="end", node=node, back_after=round(back, 2),
                         learned_at=learned_at, error=error, deposed=deposed,
                         leader_epochs={str(p): [before.get(p), after.get(p)]
                                        for p in before} if before and after else None)

        self._node_thread = threading.Thread(target=end, name=f"nemesis-{kind}", daemon=True)
        self._node_thread.start()
        return True

    def _leader_epochs(self, node: int | None, avoid: int | None = None
                       ) -> dict[int, int] | None:
        """The leader epoch of each of the run's partitions that ``node`` leads (every one
        of them if ``None``), as the first node other than ``avoid`` that answers says (a
        struck node may not know yet); ``None``: none answered."""
        from registry.dev.torture.cluster import node_view

        for n in self.cluster.kafka.nodes:
            if not n.is_running() or n.node_id == avoid:
                continue
            try:
                view = node_view(n.host, n.port, self.topic, self.timeout)
            except (OSError, ValueError):
                continue
            return {p: view[p][1] for p in set(self.namespaces.values())
                    if p in view and (node is None or view[p][0] == node)}
        return None

    def _leader_kill(self) -> bool:
        return self._node_fault("leader_kill")

    def _leader_pause(self) -> bool:
        return self._node_fault("leader_pause")

    def _coordinator_kill(self) -> bool:
        return self._node_fault("coordinator_kill")

    def _coordinator_pause(self) -> bool:
        return self._node_fault("coordinator_pause")

    def _node_restart(self) -> bool:
        return self._node_fault("node_restart")

    def _node_cut(self) -> bool:
        return self._node_fault("node_cut")

    # -- log faults -------------------------------------------------------------------

    def _reg(self, ns: str) -> Any:
        from registry.client import Registry

        reg = self._regs.get(ns)
        if reg is None:
            reg = Registry.connect(self.bootstrap, ns, topic=self.topic, timeout=self.timeout)
            self._regs[ns] = reg
        return reg

    def _write(self, ns: str, key: str | bytes | None, value: bytes | None) -> int:
        from registry.log import PlainWriter

        if self._writer is None:
            self._writer = PlainWriter(self.bootstrap, self.timeout, self.topic)
        raw = key.encode() if isinstance(key, str) else key
        offsets: list[int] = self._writer.write(self.topic, self.namespaces[ns], [(raw, value)])
        return offsets[0]

    def _zombie(self) -> str | None:
        from registry.events import (
            InlineGraph,
            JobAdopted,
            JobCancelled,
            JobSubmitted,
            JobTerminated,
            LeadershipGranted,
            new_event_id,
            now_ms,
        )
        from registry.keys import record_key
        from registry.wire import encode

        ns = self.rng.choice(sorted(self.namespaces))
        reg = self._reg(ns)
        image = reg.sync()
        sub = self.rng.choice(ZOMBIE_KINDS)
        epoch, leader = image.epoch, image.leader
        # Earlier terms are history: the image keeps only the current one.
        terms = {t.epoch: t for t in reg.forensics().scan().terms} if sub in (
            "stale_epoch", "revoked_term") else {}
        if sub == "stale_epoch":
            e_epoch = max(0, epoch - 1)
            info = terms.get(e_epoch)
            writer = info.leader if info is not None else "zombie"
        elif sub == "future_epoch":
            e_epoch, writer = epoch + self.rng.randint(2, 4), "zombie"
        elif sub == "wrong_writer":
            e_epoch, writer = epoch, "zombie"
        elif sub == "revoked_term":
            if image.revoked and leader is not None:
                e_epoch, writer = epoch, leader
            else:
                old = [t for t in terms.values() if t.revoked_offset is not None]
                if not old:
                    sub, e_epoch = "stale_epoch", max(0, epoch - 1)
                    info = terms.get(e_epoch)
                    writer = info.leader if info is not None else "zombie"
                else:
                    t = self.rng.choice(old)
                    e_epoch, writer = t.epoch, t.leader
        else:
            e_epoch, writer = epoch, "zombie-grant"
        base: dict[str, Any] = {"event_id": new_event_id(), "namespace": ns, "epoch": e_epoch,
                "writer": writer, "created_at": now_ms()}
        live = sorted(j for j, v in image.jobs.items() if v.live)
        dead = sorted(j for j, v in image.jobs.items() if not v.live)
        if sub == "forged_grant":
            event: Any = LeadershipGranted(**{**base, "epoch": epoch},
                                           prev_epoch=epoch - 1, lease_ms=2000)
        else:
            what = self.rng.choice(["cancel", "submit", "resubmit", "adopt", "terminate"])
            if what in ("cancel", "adopt", "terminate") and live:
                job = self.rng.choice(live)
                if what == "cancel":
                    event = JobCancelled(**base, job_id=job, reason="zombie")
                elif what == "adopt":
                    event = JobAdopted(**base, job_id=job)
                else:
                    event = JobTerminated(**base, job_id=job, state="FINISHED")
            elif what == "resubmit" and dead:
                event = JobSubmitted(**base, job_id=self.rng.choice(dead),
                                     graph=InlineGraph(b"zombie"))
            else:
                event = JobSubmitted(**base, job_id=f"zombie-{uuid.uuid4().hex[:8]}",
                                     graph=InlineGraph(b"zombie"))
        key = record_key(event)
        offset = self._write(ns, key, encode(event))
        self._record(kind="zombie", sub=sub, ns=ns, key=key, offset=offset,
                     partition=self.namespaces[ns], event_id=event.event_id,
                     event_type=event.TYPE, epoch=event.epoch, writer=event.writer,
                     job=getattr(event, "job_id", None), current_epoch=epoch)
        return sub

    @staticmethod
    def _held_key(ns: str, image: Image, job: str, where: str) -> str | None:
        """The key of the record holding ``job``'s birth, end or checkpoint state (``where``),
        ``None`` if it has none; for ``job`` and ``lock`` those keys."""
        from registry.keys import birth_key, end_key

        view, records = image.jobs[job], image.checkpoint_records.get(job)
        if where == "birth":
            return birth_key(ns, job, view.born_by) if view.born_by else None
        if where == "end":
            return end_key(ns, job, view.ended_by) if view.ended_by else None
        if where == "checkpoint":
            return records.holder if records is not None else None
        return f"{ns}/job/{job}" + ("/lock" if where == "lock" else "")

    def _garbage(self) -> bool:
        from registry.wire import default_codec

        ns = self.rng.choice(sorted(self.namespaces))
        image = self._reg(ns).sync()
        jobs = sorted(image.jobs)
        where = self.rng.choice(["job", "lock", "term", "birth", "end", "checkpoint", "call"])
        key: str | None = None
        if where == "call":
            # over the commit of a call whose members hold parts of jobs (the fold makes
            # those parts due: rule 8, the eleventh read's A3); else a job's own key
            commits = sorted(set(image.call_members.values()))
            if commits:
                key = self.rng.choice(commits)
            elif jobs:
                where, key = "job", f"{ns}/job/{self.rng.choice(jobs)}"
        elif where != "term" and jobs:
            # birth, end, checkpoint: over the record that holds a job's birth, its end or
            # its checkpoint state (keys of their own; the fold makes that part due and the
            # leader restates it), of a job that has one; else a job's own or lock key
            held = {j: self._held_key(ns, image, j, where) for j in jobs}
            having = [j for j in jobs if held[j] is not None]
            if having:
                key = held[self.rng.choice(having)]
            else:  # no job has such a record: a job's own key
                where, key = "job", f"{ns}/job/{self.rng.choice(jobs)}"
        if key is None:
            where = "term"
            key = f"{ns}/term/{image.epoch}/{uuid.uuid4()}"
        shape = self.rng.choices(["random", "header", "truncated", "tombstone"],
                                 [4, 3, 2, 1])[0]
        if shape == "random":
            value: bytes | None = self.rng.randbytes(self.rng.randint(1, 64))
        elif shape == "header":
            sid = default_codec().catalog.writer_id(self.rng.choice(
                ["JobSubmitted", "JobCancelled", "LeadershipGranted", "CheckpointCompleted"]))
            value = b"\x00" + sid.to_bytes(4, "big") + self.rng.randbytes(self.rng.randint(0, 80))
        elif shape == "truncated":
            recent = [v for _k, v in self._recent_records(ns) if v]
            value = recent[-1][: max(1, len(recent[-1]) // 2)] if recent else b"\x00\x00"
        else:
            value = None
        offset = self._write(ns, key, value)
        self._record(kind="garbage", ns=ns, key=key, where=where, shape=shape, offset=offset,
                     partition=self.namespaces[ns])
        return True

    def _recent_records(self, ns: str) -> list[tuple[bytes | None, bytes | None]]:
        from registry.log import LogReader

        part = self.namespaces[ns]
        reader = self._readers.get(part)
        if reader is None:
            reader = LogReader(self.bootstrap, self.topic, part)
            self._readers[part] = reader
        for batch in reader.sync(self.timeout):
            for r in batch:
                key = (r.key or b"").decode("utf-8", "replace")
                owner = key.partition("/")[0]
                if owner in self.namespaces:
                    keep = self._recent.setdefault(owner, [])
                    keep.append((r.key, r.value))
                    del keep[:-400]
        return self._recent.get(ns, [])

    def _duplicate(self) -> bool:
        ns = self.rng.choice(sorted(self.namespaces))
        recent = self._recent_records(ns)
        if not recent:
            return False
        key, value = self.rng.choice(recent)
        offset = self._write(ns, key, value)
        self._record(kind="duplicate", ns=ns, key=(key or b"").decode("utf-8", "replace"),
                     offset=offset, partition=self.namespaces[ns])
        return True
