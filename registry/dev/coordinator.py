"""A scripted coordinator process: one job manager, driven over stdin, for the demo.

``python -m registry.dev.coordinator BOOTSTRAP NAMESPACE CONTENDER TOPIC TIMEOUT`` connects a
:class:`~registry.client.Registry` of its own (its own consumer and producers, in
its own process: a separate coordinator as in a Flink HA setup) and then runs
commands, one JSON object per line on stdin, answering each with one JSON line on
stdout: ``{"ok": true, ...}`` or ``{"ok": false, "error": <class>, "reason": <code>,
"detail": <message>, "offset": <the refused record's, or null>, "event_ids": [<the records
the call sent; empty if it sent none>]}`` (the last two for a jobreg error only). Errors never
end the process; ``{"op": "exit"}`` or the end of stdin does.

Commands (``op``): ``claim``; ``elect`` (``lease`` s, ``timeout`` s: wait that long to
lead); ``submit`` / ``submit_many`` / ``adopt`` / ``release`` / ``cancel`` /
``terminate``; ``recover`` (``fail``: job ids whose initialisation throws);
``checkpoint`` (``kind``: triggered, completed, failed, discarded); ``jobs``;
``leader``; ``zombie`` (a raw write of a job event with a given epoch, bypassing the
client: what a paused old leader's in-flight request does); ``exit``.

:class:`CoordinatorProcess` is the other end: it starts one and sends commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

__all__ = ["CoordinatorProcess", "main"]


class CoordinatorProcess:
    """A coordinator in a child process; :meth:`send` runs one command and returns the reply."""

    def __init__(self, bootstrap: str, namespace: str, contender: str, *, topic: str = "jobreg",
                 timeout: float = 60.0, registry_timeout: float = 10.0) -> None:
        self.contender = contender
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "registry.dev.coordinator", bootstrap, namespace, contender, topic,
             str(registry_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            bufsize=1)
        self._stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        ready = self._read()
        if not ready.get("ok"):
            raise RuntimeError(f"coordinator {contender} did not start: {ready}")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"coordinator {self.contender} ended: "
                               + "".join(self._stderr[-20:]))
        reply: dict[str, Any] = json.loads(line)
        return reply

    def send(self, op: str, **args: Any) -> dict[str, Any]:
        """Run one command in the child and return its reply."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP), as a long GC pause or a frozen VM would."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process run again (SIGCONT)."""
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """Ask the child to exit; kill it (by its pid) if it does not within the timeout."""
        if self.proc.poll() is None:
            try:
                self.resume()
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.close()
                self.proc.wait(self.timeout)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> CoordinatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the child ------------------------------------------------------------------------------


def _reply(**fields: Any) -> None:
    print(json.dumps(fields, default=str), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the coordinator until ``exit`` or the end of stdin."""
    from registry.client import Registry
    from registry.errors import RegistryError, WriteRejected
    from registry.events import EVENT_TYPES, InlineGraph, new_event_id, now_ms
    from registry.keys import record_key
    from registry.log import write_raw
    from registry.wire import encode

    bootstrap, namespace, contender, topic, timeout = (argv or sys.argv[1:])[:5]
    reg = Registry.connect(bootstrap, namespace, topic=topic, timeout=float(timeout))
    term: Any = None
    election: Any = None
    _reply(ok=True, pid=os.getpid())

    def receipt(r: Any) -> dict[str, Any]:
        return {"offset": r.offset, "epoch": r.epoch, "ignored": r.ignored}

    def run(cmd: dict[str, Any]) -> dict[str, Any]:
        nonlocal term, election
        op = cmd["op"]
        if op == "claim":
            term = reg.claim_leadership(contender)
            return {"epoch": term.epoch}
        if op == "elect":
            election = reg.elect(contender, lease=float(cmd["lease"]))
            try:
                term = election.acquire(timeout=float(cmd.get("timeout", 60)))
            except TimeoutError:
                election.cancel()
                election = None
                return {"elected": False, "epoch": reg.epoch(), "leader": str(reg.leader())}
            return {"elected": True, "epoch": term.epoch}
        if op == "submit":
            return receipt(term.submit(cmd["job"], cmd.get("graph", "graph").encode(),
                                       max_checkpoint_failures=cmd.get("budget", 0)))
        if op == "submit_many":
            rs = term.submit_many([(j, f"graph of {j}".encode()) for j in cmd["jobs"]])
            return {"offsets": [r.offset for r in rs]}
        if op == "adopt":
            return {"offsets": [r.offset for r in term.adopt(*cmd["jobs"])]}
        if op == "release":
            return receipt(term.release(cmd["job"]))
        if op == "cancel":
            return receipt(term.cancel(cmd["job"], cmd.get("reason", "")))
        if op == "terminate":
            return receipt(term.terminate(cmd["job"], cmd["state"], cmd.get("reason", "")))
        if op == "recover":
            fail = set(cmd.get("fail", []))

            def initialize(job: Any) -> None:
                if job.job_id in fail:
                    raise RuntimeError("ClassNotFoundException while initializing the job")

            results = term.recover(initialize)
            return {"recovered": [r.job_id for r in results if r.ok],
                    "failed": {r.job_id: r.error for r in results if not r.ok}}
        if op == "checkpoint":
            kind, job, cid = cmd["kind"], cmd["job"], int(cmd["id"])
            r = {"triggered": lambda: term.checkpoint_triggered(job, cid),
                 "completed": lambda: term.checkpoint_completed(job, cid, cmd["location"]),
                 "failed": lambda: term.checkpoint_failed(job, cid, cmd["reason"],
                                                          task=cmd.get("task")),
                 "discarded": lambda: term.checkpoint_discarded(job, cid, cmd.get("reason", "")),
                 }[kind]()
            view = reg.job(job)
            return {**receipt(r), "consecutive_failures":
                    view.checkpoints.consecutive_failures, "over_budget": view.over_budget}
        if op == "jobs":
            return {"jobs": {j: v.status for j, v in reg.jobs(include_terminal=True).items()},
                    "live": sorted(reg.jobs())}
        if op == "leader":
            lead = reg.leader()
            return {"epoch": reg.epoch(), "leader": lead.contender if lead else None}
        if op == "zombie":
            cls: Any = EVENT_TYPES[cmd["type"]]  # a job event (the command names it)
            payload = dict(cmd.get("payload", {}))
            if "graph" in payload:
                payload["graph"] = InlineGraph(payload["graph"].encode())
            event = cls(event_id=new_event_id(), namespace=namespace, epoch=int(cmd["epoch"]),
                        writer=contender, created_at=now_ms(), job_id=cmd["job"], **payload)
            return {"offset": write_raw(bootstrap, topic, reg.partition, record_key(event),
                                        encode(event))}
        raise ValueError(f"unknown op {op!r}")

    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                cmd = json.loads(line)
                if cmd.get("op") == "exit":
                    break
                _reply(ok=True, **run(cmd))
            except WriteRejected as e:
                _reply(ok=False, error=type(e).__name__, reason=e.reason, detail=str(e),
                       offset=e.offset, event_ids=list(e.event_ids))
            except RegistryError as e:
                _reply(ok=False, error=type(e).__name__, reason=None, detail=str(e),
                       offset=None, event_ids=list(e.event_ids))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                _reply(ok=False, error=type(e).__name__, reason=None, detail=str(e))
    finally:
        if election is not None:
            election.cancel()
        reg.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
