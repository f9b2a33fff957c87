"""Crash injection for the exactly-once tests, outside the product: a test puts this folder
first on ``PYTHONPATH`` of a process it starts, with ``JOBREG_TEST_KILL_AFTER_ROWS=N``.
Python imports it at start-up in that process and in every Python process it starts (a Spark
job's Python workers inherit ``PYTHONPATH`` through the JVM). Once the audit tables hold N
rows or more, inside the transaction that wrote them (rows written, nothing committed), the
writer SIGKILLs the first such process (the test's subprocess: the driver of a Spark job) and
itself, as a crashed job would die.
"""

import os

_AFTER = os.environ.get("JOBREG_TEST_KILL_AFTER_ROWS")
if _AFTER:
    import signal

    os.environ.setdefault("JOBREG_TEST_KILL_PID", str(os.getpid()))  # the first process

    from sqlalchemy import func, select

    from registry.audit import partition
    from registry.audit.models import AuditRecord

    _insert_rows = partition.PartitionWriter._insert_rows

    def _insert_rows_then_die(self, bulk, conn, rows):
        _insert_rows(self, bulk, conn, rows)
        total = conn.execute(select(func.count()).select_from(partition._table(AuditRecord))
                             ).scalar_one()
        if rows.records and total >= int(_AFTER):
            first = int(os.environ["JOBREG_TEST_KILL_PID"])
            if first != os.getpid():
                os.kill(first, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    partition.PartitionWriter._insert_rows = _insert_rows_then_die
