"""``jobreg bench audit``'s report (issue 36, item 4): each Spark figure per source, the
peak memory of the driver and the executors, where Spark's connector came from; a bad
``--sources`` is a usage error. No test here times anything."""

from __future__ import annotations

from click.testing import CliRunner

from registry.cli import main
from registry.dev.bench_audit import AuditFigures, _freshness, format_audit, format_audit_summary
from registry.dev.sparkcluster import cluster_workers


def test_the_report_names_each_source_and_the_memory() -> None:
    f = AuditFigures(events=1000, cores=2, broker="Apache Kafka 4.4.0, 1 node",
                     sources="connector org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0")
    f.throughput[("plain", "postgresql")] = 1000.0
    f.throughput[("spark local[2] jobreg-kafka", "postgresql")] = 2000.0
    f.throughput[("spark local[2] kafka", "postgresql")] = 3000.0
    f.freshness["spark local[2] kafka"] = (0.25, 0.5, 100)
    f.memory["spark local[2] kafka"] = (1536.4, 512.0)
    out = format_audit(f)
    assert out.splitlines()[0] == "the log on Apache Kafka 4.4.0, 1 node"
    assert "Spark's kafka source: connector org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0" \
        in out
    assert "spark local[2] kafka, peak memory: driver (Python + JVM) / executors (JVMs + " \
           "Python workers)" in out and "1,536 / 512 MiB" in out
    scaling = out.split("scaling into PostgreSQL", 1)[1].splitlines()
    kafka = next(line for line in scaling if line.startswith("spark local[2] kafka "))
    assert kafka.split()[3:5] == ["3,000", "1.50"]  # x the first Spark engine
    assert kafka.split()[-4:] == ["250", "500", "1,536", "512"]


def test_freshness_percentiles() -> None:
    sent = {i: 0.0 for i in range(100)}
    seen = {i: i / 100 for i in range(100)}
    p50, p95, n = _freshness(sent, seen)
    assert (round(p50, 3), round(p95, 2), n) == (0.495, 0.94, 100)


def test_an_unknown_source_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["bench", "audit", "--sources", "python,spark"])
    assert result.exit_code == 2 and "--sources" in result.stderr


def test_cluster_n_names_a_standalone_cluster_of_n_workers() -> None:
    assert cluster_workers("cluster[2]") == 2
    assert cluster_workers("cluster[12]") == 12
    for other in ("local[2]", "cluster[0]", "cluster[]", "cluster[2", "spark://h:7077"):
        assert cluster_workers(other) is None


def test_the_summary_has_a_line_per_broker_and_spark_engine() -> None:
    runs = []
    for broker, per_s in (("embedded", 1000.0), ("Kafka", 2000.0)):
        f = AuditFigures(events=1000)
        f.throughput[("plain", "postgresql")] = 9999.0  # not a Spark figure: not shown
        for engine in ("spark local[2] kafka", "spark cluster[2] kafka"):
            f.throughput[(engine, "postgresql")] = per_s
            f.throughput[(engine, "sqlite")] = 1.0  # PostgreSQL's only
            f.freshness[engine] = (0.25, 1.5, 10)
            f.memory[engine] = (700.0, 2048.0)
        runs.append((broker, f))
    lines = format_audit_summary(runs).splitlines()
    assert lines[1].split() == ["broker", "engine", "events/s", "p50", "ms", "p95", "ms",
                                "driver", "MiB", "exec", "MiB"]
    assert [line.split() for line in lines[3:]] == [
        [b, f"{form}[2]", "kafka", n, "250", "1,500", "700", "2,048"]
        for b, n in (("embedded", "1,000"), ("Kafka", "2,000"))
        for form in ("local", "cluster")]


def test_a_cluster_without_a_worker_count_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["bench", "audit", "--masters", "local[2],cluster[0]"])
    assert result.exit_code == 2 and "cluster[N] names N workers" in result.stderr
