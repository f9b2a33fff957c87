"""The per-partition fold-and-commit (issue 16) against the real broker and PostgreSQL: a task
retried after its commit writes nothing twice, a task of an old run is refused, a gap is
refused, the fold resumes from the snapshots (and refolds from the log a snapshot it cannot
read), and five namespaces on five partitions fold in parallel on Spark and agree with
``audit check``.

The task function (:class:`consumers.audit_job.FoldTask`) is called directly where a test
must be deterministic: it is exactly what ``mapInArrow`` runs on an executor."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from support.pg import query_as_reader as query

from consumers.audit_job import FoldTask, run_audit
from registry.audit.db import AuditError
from registry.audit.partition import Fenced, Gap, PartitionWriter, clear_cache
from registry.audit.writer import AuditWriter, check, run_plain
from registry.keys import partition_for
from registry.log import LogReader

pytestmark = pytest.mark.integration


def _log(reg) -> list:
    reader = LogReader(reg.bootstrap, reg.topic, reg.partition)
    try:
        return [r for batch in reader.sync(30) for r in batch]
    finally:
        reader.close()


def _arrow(records) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "partition": pa.array([r.partition for r in records], pa.int32()),
        "offset": pa.array([r.offset for r in records], pa.int64()),
        "key": pa.array([r.key for r in records], pa.binary()),
        "value": pa.array([r.value for r in records], pa.binary()),
        "ms": pa.array([r.timestamp for r in records], pa.int64())})


def _summary(out) -> list[tuple[int, int, int, int]]:
    (batch,) = list(out)
    d = batch.to_pydict()
    return list(zip(d["partition"], d["start"], d["end"], d["rows"], strict=True))


def _jobs(reg, n: int, prefix: str = "job") -> None:
    term = reg.claim_leadership("jm-1")
    for i in range(n):
        term.submit(f"{prefix}-{i}", b"g")


def _begin(url: str, reg) -> AuditWriter:
    writer = AuditWriter(url, reg.topic)
    writer.require_schema()
    writer.catch_up(reg.bootstrap)
    return writer


def _rows(url: str) -> tuple[int, int]:
    _, [(n, distinct)] = query(url, 'SELECT count(*), count(DISTINCT "offset") '
                                    "FROM audit_records")
    return n, distinct


def _twelve_committed(url: str, connect, namespace: str) -> tuple[Any, list, AuditWriter,
                                                                  FoldTask, list]:
    """A namespace with 20 jobs, a run begun, and a task that committed the first 12 of its
    records: (registry, records, writer, task, the task's summary)."""
    from registry.audit.db import migrate

    migrate(url)
    reg = connect(namespace)
    _jobs(reg, 20)
    records = _log(reg)
    writer = _begin(url, reg)
    task = FoldTask(url, reg.topic, writer.generation, reg.bootstrap, batch_id=0)
    return reg, records, writer, task, _summary(task(iter([_arrow(records[:12])])))


def test_a_task_retried_after_its_commit_writes_nothing_twice(connect, pg_db) -> None:
    reg, records, writer, task, first = _twelve_committed(pg_db, connect, "retry")
    assert first == [(reg.partition, 0, records[11].offset + 1, 12)]
    # the same task again (its summary never reached the driver): cut at the progress
    assert _summary(task(iter([_arrow(records[:12])]))) == [
        (reg.partition, records[11].offset + 1, records[11].offset + 1, 0)]
    # a retry on another executor (no cache) that also carries the next records
    clear_cache()
    again = _summary(task(iter([_arrow(records)])))
    assert again == [(reg.partition, records[11].offset + 1, records[-1].offset + 1,
                      len(records) - 12)]
    assert _rows(pg_db) == (len(records), len(records))
    assert check(pg_db, reg.bootstrap, reg.topic) == []
    # a new run (the driver died after the commit): nothing twice, the rest lands once
    _jobs(reg, 5, "later")
    writer.close()
    more = _begin(pg_db, reg)
    assert run_plain(more, reg.bootstrap) > 0
    more.close()
    total = len(_log(reg))
    assert _rows(pg_db) == (total, total)
    assert check(pg_db, reg.bootstrap, reg.topic) == []


def test_a_task_refolds_a_stored_state_it_cannot_read_from_the_log(connect, pg_db,
                                                                     caplog) -> None:
    """The executor's path (FoldTask) to the refold of
    ``test_audit_writer.py::test_a_stored_state_that_cannot_be_read_is_refolded_from_the_log``:
    a task without a cached state meets a damaged snapshot and refolds from the broker."""
    from sqlalchemy import text

    from registry.audit.db import engine_for

    reg, records, writer, task, _ = _twelve_committed(pg_db, connect, "heal")
    with engine_for(pg_db).begin() as conn:
        conn.execute(text("UPDATE audit_snapshots SET state = :s"), {"s": b"\x00damaged"})
    clear_cache()  # another executor: no cached state
    with caplog.at_level("WARNING", logger="registry.audit"):
        assert _summary(task(iter([_arrow(records)]))) == [
            (reg.partition, records[11].offset + 1, records[-1].offset + 1,
             len(records) - 12)]
    assert "cannot be read" in caplog.text and "refolding the partition" in caplog.text
    assert check(pg_db, reg.bootstrap, reg.topic) == []
    writer.close()


def test_a_zombie_task_of_an_old_generation_is_refused(connect, db_url) -> None:
    reg = connect("zombie")
    _jobs(reg, 6)
    records = _log(reg)
    old = _begin(db_url, reg)
    zombie = PartitionWriter(db_url, reg.topic, old.generation, engine=old.engine)
    zombie.write(reg.partition, records[:3], 0)  # the old run writes, then its driver dies
    new = _begin(db_url, reg)
    assert new.generation == old.generation + 1
    with pytest.raises(Fenced, match="a task of an old run is refused"):
        zombie.write(reg.partition, records, 1)
    with pytest.raises(Fenced):  # also through the task function an executor runs
        list(FoldTask(db_url, reg.topic, old.generation, reg.bootstrap)(iter([_arrow(records)])))
    assert _rows(db_url) == (3, 3)  # nothing of the refused batches
    assert new.commit(records, 1) == len(records) - 3
    assert check(db_url, reg.bootstrap, reg.topic) == []
    old.close()
    new.close()


def test_a_gap_and_offsets_out_of_order_are_refused(connect, pg_db) -> None:
    from registry.audit.db import migrate

    migrate(pg_db)
    reg = connect("gaps")
    _jobs(reg, 10)
    records = _log(reg)
    writer = _begin(pg_db, reg)
    task = FoldTask(pg_db, reg.topic, writer.generation, reg.bootstrap)
    _summary(task(iter([_arrow(records[:4])])))
    with pytest.raises(Gap, match="holds records in between"):
        list(task(iter([_arrow(records[6:])])))
    with pytest.raises(AuditError, match="out of order"):
        list(task(iter([_arrow([records[4], records[6], records[5]])])))
    assert _rows(pg_db) == (4, 4)
    # a hole of transaction markers only is no gap: the next record of the log follows
    assert _summary(task(iter([_arrow(records[4:])])))[0][3] == len(records) - 4
    assert check(pg_db, reg.bootstrap, reg.topic) == []
    writer.close()


def test_a_partition_written_before_migration_0006_is_adopted_once(connect, db_url) -> None:
    """Rows and progress with no snapshots (generation 0, as migration 0006 leaves them):
    the next start folds the partition once to write its snapshots, and goes on."""
    reg = connect("legacy")
    _jobs(reg, 8)
    writer = _begin(db_url, reg)
    run_plain(writer, reg.bootstrap)
    writer.close()
    with writer.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM audit_snapshots")
        conn.exec_driver_sql("UPDATE audit_progress SET generation = 0")
    clear_cache()
    reg.claim_leadership("jm-2").submit("after", b"g")  # a new term: needs the old state
    again = _begin(db_url, reg)
    _, [(snapshots,)] = query(db_url, "SELECT count(*) FROM audit_snapshots")
    assert snapshots == 1
    assert run_plain(again, reg.bootstrap) == 2  # the grant and the submit
    again.close()
    assert check(db_url, reg.bootstrap, reg.topic) == []
    _, terms = query(db_url, "SELECT epoch, accepted_writes FROM audit_terms ORDER BY epoch")
    assert terms == [(1, 8), (2, 1)]


@pytest.mark.spark
def test_namespaces_on_more_partitions_than_cores_fold_in_parallel_and_agree_with_check(
        spark, connect, pg_db) -> None:
    """Five namespaces on five Kafka partitions, a local[2] session: one micro-batch runs in
    two tasks (no exchange: ``coalesce``, and in ``run_audit`` jobreg-kafka's two groups,
    ``maxPartitions``), each folding and committing whole Kafka partitions one after the
    other, and the database agrees with the library's fold."""
    from consumers.audit_job import FoldTask, fold_plan
    from registry.audit.db import migrate

    migrate(pg_db)
    names = {}
    for i in range(200):  # namespaces that hash onto different partitions
        ns = f"par-{i}"
        names.setdefault(partition_for(ns, 8), ns)
        if len(names) == 5:
            break
    regs = [connect(ns) for ns in names.values()]
    for reg in regs:
        term = reg.claim_leadership("jm-1")
        term.submit_many([(f"job-{i}", b"g") for i in range(300)])
    whole = (spark.read.format("jobreg-kafka")
             .option("kafka.bootstrap.servers", regs[0].bootstrap)
             .option("subscribe", regs[0].topic).load())
    assert whole.rdd.getNumPartitions() >= 5  # one input partition per Kafka partition
    task = FoldTask(pg_db, regs[0].topic, 0, regs[0].bootstrap)
    assert fold_plan(whole, task, spark.sparkContext.defaultParallelism
                     ).rdd.getNumPartitions() == 2  # one task per core
    grouped = (spark.read.format("jobreg-kafka")
               .option("kafka.bootstrap.servers", regs[0].bootstrap)
               .option("subscribe", regs[0].topic).option("maxPartitions", 2).load())
    assert grouped.rdd.getNumPartitions() == 2  # what run_audit's source plans
    run = run_audit(pg_db, regs[0].bootstrap, regs[0].topic, spark=spark,
                    max_offsets_per_trigger=100_000)
    assert run.records == sum(len(_log(r)) for r in regs)
    assert check(pg_db, regs[0].bootstrap, regs[0].topic) == []
    # one micro-batch: every partition committed in batch 0
    _, progress = query(pg_db, 'SELECT "partition", batch_id FROM audit_progress '
                               "WHERE next_offset > 0 ORDER BY 1")
    assert sorted(p for p, _ in progress) == sorted(r.partition for r in regs)
    assert {b for _, b in progress} == {0}
    # a second run resumes each partition from its snapshots, on the executors
    for reg in regs:
        reg.claim_leadership("jm-2").submit("more", b"g")
    again = run_audit(pg_db, regs[0].bootstrap, regs[0].topic, spark=spark)
    assert again.records == 2 * len(regs) and again.caught_up == run.records
    assert check(pg_db, regs[0].bootstrap, regs[0].topic) == []


def test_a_new_run_waits_for_a_task_holding_the_partition_then_fences_it(connect,
                                                                          pg_db) -> None:
    """A task of the old run holds its partition's lock (mid-commit) when a new driver
    starts: the new run's generation waits for that commit, keeps its rows, and refuses the
    old run's next task."""
    import threading

    from registry.audit.db import migrate
    from registry.audit.partition import begin_run

    migrate(pg_db)
    reg = connect("held")
    _jobs(reg, 6)
    records = _log(reg)
    old = _begin(pg_db, reg)
    zombie = PartitionWriter(pg_db, reg.topic, old.generation, engine=old.engine)
    started, bumped = threading.Event(), []
    holding = old.engine.connect()
    tx = holding.begin()
    holding.exec_driver_sql(  # what a task does first: lock its partition's row
        'SELECT next_offset FROM audit_progress WHERE "partition" = %s FOR UPDATE',
        (reg.partition,))

    def new_driver() -> None:
        started.set()
        bumped.append(begin_run(old.engine, "audit", reg.topic, 8)[0])

    driver = threading.Thread(target=new_driver)
    driver.start()
    started.wait()
    # wait until PostgreSQL says the new driver waits for a lock (no sleep margin; the
    # deadline only turns a hang into a failure)
    import time

    deadline = time.monotonic() + 120
    with old.engine.connect() as watch:
        while not watch.exec_driver_sql("SELECT count(*) FROM pg_locks WHERE NOT granted"
                                        ).scalar_one():
            assert driver.is_alive() and time.monotonic() < deadline
            watch.rollback()
    assert not bumped
    tx.commit()  # the held task finishes (here: without writing)
    holding.close()
    driver.join(60)
    assert bumped == [old.generation + 1]
    with pytest.raises(Fenced):
        zombie.write(reg.partition, records, 0)
    assert _rows(pg_db) == (0, 0)
    old.close()
