"""``jobreg bench roundtrips`` through its real entry point: a tiny run prints every write at
every size with its figures and ratios, the requests librdkafka sent, and a producer's start;
bad options are usage errors in one line. The figures themselves are not tested (no test times
anything)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from registry.dev.bench_roundtrips import VARIANTS

JOBREG = [sys.executable, "-m", "registry.cli"]


@pytest.mark.integration
@pytest.mark.embedded_only("`jobreg bench roundtrips` starts its own embedded broker")
def test_a_tiny_run_prints_every_write_at_every_size() -> None:
    proc = subprocess.run([*JOBREG, "bench", "roundtrips", "--writes", "10", "--rounds", "2",
                           "--sizes", "1,8", "--long-batches", "100"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for v in VARIANTS:
        for n in (1, 8):
            row = next((line for line in lines
                        if line.startswith(f"{v.key}. {v.label} ")
                        and re.split(r"\s{2,}", line)[1] == str(n)), None)
            assert row is not None, (v.key, n)
    first = re.split(r"\s{2,}", next(line for line in lines if line.startswith("c. ")))
    assert first[5].endswith("x e")  # the ratio to today's write, from the same run
    today = re.split(r"\s{2,}", next(line for line in lines if line.startswith("e. ")))
    assert today[5].endswith("x b")  # ... and today's to the write before issue 35
    # Where the time goes: today's write says how many ListOffsets answers confirmed it (the
    # rest were probed), and has no "1st answer" of a probe-only confirmation.
    steps = [re.split(r"\s{2,}", line) for line in lines if line.startswith("e. ")][2:4]
    for row in steps:
        assert len(row) == 10 and row[-2] == "-" and re.fullmatch(r"\d+/10( \(\d+ read back\))?", row[-1]), row
    for request in ("AddPartitionsToTxn", "Produce", "EndTxn", "ListOffsets", "Fetch"):
        assert any(f"  {request}  " in line for line in lines), request
    assert any(line.startswith("init_transactions, an id another producer holds")
               for line in lines)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, says", [
    (["--sizes", "0,8"], "records per write from 1 to 2048"),
    (["--sizes", "one"], "records per write from 1 to 2048"),
    (["--writes", "10", "--rounds", "11"], "at most one round per write"),
    (["--replication", "3"], "--replication is for --bootstrap's cluster"),
    (["--kafka-nodes", "0"], "--kafka-nodes"),
    (["--writes", "5"], "--writes"),
])
def test_a_bad_option_is_a_usage_error_in_one_line(args, says) -> None:
    proc = subprocess.run([*JOBREG, "bench", "roundtrips", *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
