"""Latency of the Flink bridge's requests, one at a time and pipelined (not a test: run it).

    PYTHONPATH=. python tests/support/bridge_bench.py [kafka]

Starts an embedded broker (or one Apache Kafka node with ``kafka``), one bridge as a
subprocess, leads, then times 200 requests of each kind one after another, and 500
``counter_next`` on 50 jobs sent at once.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import EmbeddedBroker  # noqa: E402
from registry.dev.kafka import KafkaCluster  # noqa: E402
from support.bridge_client import BridgeProcess  # noqa: E402


def _timed(b: BridgeProcess, op: str, n: int, **kw: Any) -> str:
    times = []
    for i in range(n):
        args = {k: (v(i) if isinstance(v, Callable) else v) for k, v in kw.items()}
        start = time.perf_counter()
        b.ok(op, **args)
        times.append(time.perf_counter() - start)
    times.sort()
    return (f"{op}: n={n} median {statistics.median(times) * 1000:.1f} ms "
            f"p90 {times[int(n * 0.9)] * 1000:.1f} ms")


def main() -> None:
    with (KafkaCluster(nodes=1) if "kafka" in sys.argv else EmbeddedBroker()) as broker:
        b = BridgeProcess(broker.bootstrap, "bench-" + uuid.uuid4().hex[:8], "bench", "jm-1",
                          lease=5.0)
        b.ok("contend")
        session = b.event("granted")["session"]
        job = f"{0:032x}"
        print(_timed(b, "store_add", 200, store="plans", name=lambda i: f"{i:032x}",
                     pointer="file:///p"))
        print(_timed(b, "store_get", 200, store="plans", name=lambda i: f"{i:032x}"))
        print(_timed(b, "counter_next", 200, job=job))
        print(_timed(b, "store_add", 200, store=f"checkpoints/{job}",
                     name=lambda i: f"/{i + 1000:019d}", pointer="file:///cp"))
        print(_timed(b, "publish", 200, component="dispatcher", session=session,
                     address=lambda i: f"a{i}"))
        start = time.perf_counter()
        ids = [b.send("counter_next", job=f"{i % 50 + 1:032x}") for i in range(500)]
        for ident in ids:
            assert b.answer(ident)["ok"]
        took = time.perf_counter() - start
        print(f"pipelined counter_next x500 over 50 jobs: {took:.2f} s, {500 / took:.0f}/s")
        b.stop()


if __name__ == "__main__":
    main()
