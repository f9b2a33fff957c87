"""The Spark standalone cluster of the tests: :mod:`registry.dev.sparkcluster` (one place for
how a master and workers are started and stopped), under the names the tests use."""

from __future__ import annotations

from registry.dev.sparkcluster import HOST, SparkCluster, free_port, spark_home

SPARK_HOME = spark_home()

__all__ = ["HOST", "SPARK_HOME", "SparkCluster", "free_port"]
