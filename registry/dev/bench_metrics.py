"""What the metrics add to a write: ``python -m registry.dev.bench_metrics [N]``.

Times what :meth:`registry.client.Term._write` adds per call (the timer and outcome count of
``_Meter``, ``observe_group``) and what a fold step of accepted records adds in
:class:`registry.folded.FoldedLog` (the epoch and lag gauges, the identity check of the
image's kept lists), each N times (default 100,000) on a collector registry of its own, and
prints microseconds per call. No broker: only the metrics' own cost.
"""

from __future__ import annotations

import sys
import time

from prometheus_client import CollectorRegistry

from registry.client import _Meter
from registry.folded import _count
from registry.image import Image
from registry.metrics import metrics_for

__all__ = ["bench_metrics", "main"]


def bench_metrics(n: int = 100_000) -> dict[str, tuple[float, float]]:
    """(wall, CPU) microseconds per call: ``write`` (an accepted write's metering),
    ``refused`` (a write that raised), ``fold_step`` (a fold step of accepted records). The
    CPU time is the process's: on a machine shared with other work the wall time is longer."""
    metrics = metrics_for(CollectorRegistry()).client("bench", "bench")
    error = ValueError("refused")
    image = Image.empty("bench")

    def write() -> None:
        with _Meter(metrics):
            metrics.observe_group(1, 1)

    def refused() -> None:
        try:
            with _Meter(metrics):
                raise error
        except ValueError:
            pass

    def fold_step() -> None:
        _count(metrics, image, image)
        metrics.epoch.set(image.epoch)
        metrics.log_lag.set(0)

    figures: dict[str, tuple[float, float]] = {}
    for name, call in (("write", write), ("refused", refused), ("fold_step", fold_step)):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            call()
        figures[name] = ((time.perf_counter() - wall) / n * 1e6,
                         (time.process_time() - cpu) / n * 1e6)
    return figures


def main(argv: list[str] | None = None) -> None:
    """Print the figures of :func:`bench_metrics`."""
    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 100_000
    for name, (wall, cpu) in bench_metrics(n).items():
        print(f"{name:>10}: {wall:.2f} us per call, {cpu:.2f} us of CPU ({n:,} calls)")


if __name__ == "__main__":
    main()
