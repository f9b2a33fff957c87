"""Where a Spark session's settings come from (issue 28, items 1 and 3): the standard places
first, loopback only for local masters, jobreg shipped to executors; and a failed stream's
error reduced to its cause in one line."""

from __future__ import annotations

import pytest

from consumers.audit_job import root_cause
from consumers.spark import DAEMON_CONF, LOCAL_CONF, is_local, session_conf


@pytest.mark.parametrize(("master", "local"), [
    ("local", True), ("local[2]", True), ("local[*]", True), ("local[2,3]", True),
    ("spark://127.0.0.1:7077", False), ("yarn", False), ("k8s://https://h:443", False)])
def test_is_local(master: str, local: bool) -> None:
    assert is_local(master) is local


def test_a_local_master_defaults_to_loopback_and_the_preloading_daemon() -> None:
    conf = session_conf("local[2]", {})
    assert {k: conf[k] for k in LOCAL_CONF} == LOCAL_CONF
    assert conf["spark.python.daemon.module"] == DAEMON_CONF["spark.python.daemon.module"]


def test_a_cluster_master_gets_no_loopback_and_spark_s_own_daemon() -> None:
    conf = session_conf("spark://10.0.0.1:7077", {})
    assert not set(LOCAL_CONF) & set(conf)
    assert "spark.python.daemon.module" not in conf


def test_the_launch_settings_win_over_the_defaults_and_the_options_over_both() -> None:
    """spark-defaults.conf / --conf (what SparkConf() reads after the JVM started) are not
    overwritten; --spark-conf / --driver-host (extra_conf) win over everything."""
    launched = {"spark.driver.host": "10.1.1.1", "spark.sql.shuffle.partitions": "64"}
    conf = session_conf("local[2]", launched)
    assert "spark.driver.host" not in conf and "spark.sql.shuffle.partitions" not in conf
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    conf = session_conf("local[2]", launched, {"spark.driver.host": "10.2.2.2"})
    assert conf["spark.driver.host"] == "10.2.2.2"


def test_shipped_code_reaches_the_daemon() -> None:
    """A zip on --py-files is put on the Python daemon's path (by its name in the executor's
    working directory) and the preloading daemon is used; a packed environment
    (spark.archives) has jobreg installed; a PYTHONPATH the user set stays."""
    launched = {"spark.submit.pyFiles": "file:/tmp/dist/jobreg.zip,/x/other.py"}
    conf = session_conf("spark://h:7077", launched)
    assert conf["spark.executorEnv.PYTHONPATH"] == "jobreg.zip"
    assert conf["spark.python.daemon.module"] == "consumers.spark_daemon"
    conf = session_conf("spark://h:7077", {**launched, "spark.executorEnv.PYTHONPATH": "/p"})
    assert "spark.executorEnv.PYTHONPATH" not in conf
    conf = session_conf("spark://h:7077", {"spark.archives": "env.tar.gz#environment"})
    assert conf["spark.python.daemon.module"] == "consumers.spark_daemon"
    conf = session_conf("spark://h:7077", {"spark.python.daemon.module": "pyspark.daemon",
                                           "spark.archives": "env.tar.gz#environment"})
    assert "spark.python.daemon.module" not in conf


# A failed query's text as Spark 4.3 gives it (shortened): the JVM's wrapper, a stage
# failure, the Python worker's traceback with the source's error, then JVM frames.
FAILED = """[STREAM_FAILED] Query [id = 6c1, runId = 9e2] terminated with exception: \
An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/v/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
py4j.protocol.Py4JJavaError: An error occurred while calling o331.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 \
failed 4 times, most recent failure: Lost task 0.3 in stage 3.0 (TID 9) (10.200.0.2 executor 1): \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/w/consumers/kafka_source.py", line 700, in read_partition
    raise KafkaUnavailableError(
consumers.kafka_source.KafkaUnavailableError: reading jobreg[3] offsets 0..120 from \
10.200.0.1:9092: nothing arrived for 120000 ms (option kafkaConsumer.pollTimeoutMs); last error: none
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:624)
""" + "\tat org.apache.spark.scheduler.Task.run(Task.scala:147)\n" * 60


def test_a_failed_stream_s_error_is_its_cause_in_one_line() -> None:
    cause = root_cause(FAILED)
    assert cause.startswith("consumers.kafka_source.KafkaUnavailableError: reading jobreg[3]")
    assert cause.endswith("last error: none") and "\n" not in cause


def test_a_java_only_error_gives_its_innermost_cause() -> None:
    text = ("org.apache.spark.SparkException: Job aborted\n\tat a.b(C.java:1)\n"
            "Caused by: java.io.IOException: outer\n\tat x\n"
            "Caused by: java.net.ConnectException: Connection refused: /127.0.0.1:35367\n")
    assert root_cause(text) == "java.net.ConnectException: Connection refused: /127.0.0.1:35367"
    assert root_cause("something odd\nhappened") == "something odd"
    assert root_cause("") == "(no message)"
