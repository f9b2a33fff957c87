"""registry/metrics.py: the README's table, METRICS and what is registered agree; the
metrics of one collector registry are made once; the fold's counts count each record once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from registry.errors import ConfigError, Fenced, LeaseExpired, OutcomeUnknown, WriteRejected
from registry.fold import fold
from registry.image import Image, LogRecord
from registry.metrics import METRICS, check_port, metrics_for

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_table() -> dict[str, tuple[str, tuple[str, ...]]]:
    text = README.read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in section.splitlines():
        m = re.match(r"\| `(jobreg_\w+)` \| (\w+) \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), tuple(re.findall(r"`(\w+)`", m.group(3))))
    return rows


def _registered(collector: CollectorRegistry) -> dict[str, tuple[str, tuple[str, ...]]]:
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for collector_metric in list(collector._collector_to_names):  # every metric registered
        name = collector_metric._name  # type: ignore[attr-defined]
        kind = collector_metric._type  # type: ignore[attr-defined]
        full = f"{name}_total" if kind == "counter" else name
        out[full] = (kind, tuple(collector_metric._labelnames))  # type: ignore[attr-defined]
    return out


def test_the_readme_table_and_the_registered_metrics_agree() -> None:
    """Every metric registered is in the README's table with its type and labels, and the
    table has no other; METRICS says the same."""
    collector = CollectorRegistry()
    metrics_for(collector)
    registered = _registered(collector)
    assert registered == _readme_table()
    assert registered == {m.name: (m.type, m.labels) for m in METRICS}
    assert all(m.name.startswith("jobreg_") for m in METRICS)


def test_one_set_of_metrics_per_collector_registry() -> None:
    """Asked twice (two clients in one process): the same metrics, no duplicate error; a
    name taken by someone else is a ConfigError."""
    collector = CollectorRegistry()
    assert metrics_for(collector) is metrics_for(collector)
    taken = CollectorRegistry()
    Counter("jobreg_writes", "not ours", registry=taken)
    with pytest.raises(ConfigError, match="cannot register jobreg's metrics"):
        metrics_for(taken)
    with pytest.raises(ConfigError, match="CollectorRegistry"):
        metrics_for("not a registry")  # type: ignore[arg-type]


@pytest.mark.parametrize("port", [0, -1, 65536, "80", True, 1.5])
def test_a_bad_port_is_refused(port: object) -> None:
    with pytest.raises(ConfigError, match="1 to 65535"):
        check_port(port)


def test_write_outcomes() -> None:
    from registry.client import _outcome_of

    assert _outcome_of(Fenced("stale_epoch", "x")) == ("fenced", "stale_epoch")
    assert _outcome_of(WriteRejected("job_exists", "x")) == ("refused", "job_exists")
    assert _outcome_of(LeaseExpired("x")) == ("lease_expired", "")
    assert _outcome_of(OutcomeUnknown("x", ())) == ("unknown", "")
    assert _outcome_of(KeyError("x")) == ("error", "KeyError")


def _junk(offset: int) -> LogRecord:
    return LogRecord(offset, b"ns/job/junk", b"not avro", 1000)


def test_a_record_is_counted_once_by_the_clients_of_a_process() -> None:
    """Two clients folding the same span (or one reading it again) count each quarantined
    record once; a step past what was counted counts only the new records."""
    from registry.folded import _count

    collector = CollectorRegistry()
    m = metrics_for(collector).client("t", "ns")
    empty = Image.empty("ns")
    first = fold([_junk(0), _junk(1)], empty)
    _count(m, empty, first)
    _count(m, empty, first)  # a second client, the same span
    labels = {"topic": "t", "namespace": "ns", "reason": "undecodable"}
    assert collector.get_sample_value("jobreg_records_quarantined_total", labels) == 2
    wider = fold([_junk(2)], first)
    half = fold([_junk(1)], fold([_junk(0)], empty))
    _count(m, fold([_junk(0)], empty), fold([_junk(2)], half))  # overlaps: only offset 2
    assert collector.get_sample_value("jobreg_records_quarantined_total", labels) == 3
    _count(m, first, wider)  # offset 2 again: counted already
    assert collector.get_sample_value("jobreg_records_quarantined_total", labels) == 3
