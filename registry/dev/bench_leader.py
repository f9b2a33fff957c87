"""One namespace's leader of ``jobreg bench peers``' namespaces row, as a process of its own.

``python -m registry.dev.bench_leader`` reads one JSON line on stdin (``bootstrap``, ``topic``,
``topic_config`` (the fields of :class:`~registry.log.TopicConfig`), ``namespace``, ``k``,
``count``, ``calls``, ``warm_up``, ``graph_bytes``, ``profile`` (a directory or ``null``),
``timeout`` (the registry's, seconds)), then:

1. connects, claims the namespace's leadership and makes ``warm_up`` untimed submits;
2. writes ``{"ready": true}`` on stdout and waits for a line on stdin (the start: the bench
   releases every leader at once);
3. submits its share, the jobs ``j`` with ``j % count == k`` of ``calls``, one at a time;
4. writes its result as one JSON line (``latencies_ms``, ``start``/``end`` on
   ``time.perf_counter`` (the system's monotonic clock, one for every process), ``cpu_s``
   (``time.process_time``: every thread of the process), ``rdkafka_cpu_s`` (librdkafka's
   threads alone), ``failure`` (the registry error that stopped it, or ``""``) and exits.

An error before the start is written as ``{"error": "..."}`` instead of ``ready`` (exit 1).
With ``profile``, the timed phase's CPU in Python's thread (``time.thread_time``) is profiled
into ``<profile>/<namespace>.prof`` (``python -m pstats``).

A module of its own run by ``sys.executable -m`` (not multiprocessing) so that a leader is a
fresh interpreter with its own librdkafka whatever the calling program's main module is.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

__all__ = ["main", "rdkafka_cpu_seconds"]


def rdkafka_cpu_seconds() -> float | None:
    """The CPU time this process's librdkafka threads (named ``rdk:*``) have used so far,
    from ``/proc/self/task``; ``None`` where there is no ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if not comm.read().startswith("rdk:"):
                    continue
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / tick


def _graph(i: int, size: int) -> bytes:
    head = f"graph-{i}:".encode()
    return head + b"g" * (size - len(head))


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _lead(task: dict[str, Any]) -> dict[str, Any]:
    from registry.client import Registry
    from registry.errors import RegistryError
    from registry.log import TopicConfig

    k, count, size = task["k"], task["count"], task["graph_bytes"]
    reg = Registry.connect(task["bootstrap"], task["namespace"], topic=task["topic"],
                           topic_config=TopicConfig(**task["topic_config"]),
                           timeout=task.get("timeout", 10.0))
    try:
        term = reg.claim_leadership("leader-1")
        for i in range(task["warm_up"]):
            term.submit(f"warm-{k}-{i}", _graph(i, size))
        profiler = None
        if task.get("profile"):
            import cProfile

            profiler = cProfile.Profile(time.thread_time)
        _say({"ready": True})
        if not sys.stdin.readline():
            return {"error": "the bench went away before the start"}
        lat: list[float] = []
        failure = ""
        rdk0, cpu0, t0 = rdkafka_cpu_seconds(), time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        for j in range(k, task["calls"], count):
            graph = _graph(j, size)
            t = time.perf_counter()
            try:
                term.submit(f"job-{j}", graph)
            except RegistryError as e:
                failure = f"after {time.perf_counter() - t:.1f} s: {type(e).__name__}: {e}"
                break
            lat.append((time.perf_counter() - t) * 1000)
        t1 = time.perf_counter()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(task["profile"], f"{task['namespace']}.prof"))
        cpu, rdk1 = time.process_time() - cpu0, rdkafka_cpu_seconds()
        return {"latencies_ms": lat, "start": t0, "end": t1, "cpu_s": cpu,
                "rdkafka_cpu_s": None if rdk0 is None or rdk1 is None else rdk1 - rdk0,
                "failure": failure}
    finally:
        reg.close()


def main() -> int:
    """Lead one namespace as the bench asks on stdin (the module docstring)."""
    task: dict[str, Any] = {}
    try:
        task = json.loads(sys.stdin.readline())
        result = _lead(task)
    except BaseException as e:  # said to the bench, which names the namespace
        from registry.errors import RegistryError

        said = f"{task.get('namespace', '?')}: {type(e).__name__}: {e}"
        if not isinstance(e, RegistryError):  # a defect: where it was
            said += "\n" + traceback.format_exc(limit=5)
        result = {"error": said}
    _say(result)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
