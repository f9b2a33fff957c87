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


# The executor kill: ``JOBREG_TEST_KILL_EXECUTOR_AFTER_ROWS=N`` and ``JOBREG_TEST_KILL_ONCE=
# FILE`` in a Spark executor's environment (``spark.executorEnv.*``). Once the audit tables
# hold N rows or more, inside the task's transaction (rows written, nothing committed), the
# first task to get there writes the pid of its executor's JVM into FILE (created exclusively:
# the retried task does not kill again), SIGKILLs that JVM, then itself, as a lost executor
# dies. Only executors commit (PostgreSQL), so only they get here.
_EXECUTOR_AFTER = os.environ.get("JOBREG_TEST_KILL_EXECUTOR_AFTER_ROWS")
if _EXECUTOR_AFTER:
    import signal

    from sqlalchemy import func, select

    from registry.audit import partition
    from registry.audit.models import AuditRecord

    _insert_executor_rows = partition.PartitionWriter._insert_rows

    def _executor_jvm():
        """The nearest ancestor of this process that is an executor's JVM."""
        pid = os.getppid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        raise RuntimeError("no executor JVM above this Python worker")

    def _insert_rows_then_kill_executor(self, bulk, conn, rows):
        _insert_executor_rows(self, bulk, conn, rows)
        total = conn.execute(select(func.count()).select_from(partition._table(AuditRecord))
                             ).scalar_one()
        if not rows.records or total < int(_EXECUTOR_AFTER):
            return
        try:
            marker = os.open(os.environ["JOBREG_TEST_KILL_ONCE"],
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # killed once already: this is the retry
            return
        jvm = _executor_jvm()
        os.write(marker, str(jvm).encode())
        os.close(marker)
        os.kill(jvm, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    partition.PartitionWriter._insert_rows = _insert_rows_then_kill_executor
