"""Consumers of the registry log that run outside the client library.

* :mod:`consumers.kafka_source`: ``jobreg-kafka``, a PySpark data source (streaming and
  batch) that reads one Kafka topic through confluent-kafka with the option names and
  output schema of Spark's built-in ``kafka`` source.
* :mod:`consumers.spark`: :func:`spark_session` (a session set up for this project, local
  or on a cluster, its settings from Spark's standard places first, with ``jobreg-kafka``
  registered), :func:`kafka_format_available`, :func:`read_stream`
  (Spark's ``kafka`` source when its connector is on the classpath, else ``jobreg-kafka``).
* :mod:`consumers.audit_job`: the audit streaming job.

The names below are imported on first use, so importing this package does not import
pyspark.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "KafkaConnectorMissing",
    "KafkaDataLossError",
    "KafkaOptionError",
    "KafkaSource",
    "KafkaSourceError",
    "KafkaUnavailableError",
    "kafka_format_available",
    "read_stream",
    "spark_session",
]

_WHERE = {
    "KafkaConnectorMissing": "consumers.spark",
    "kafka_format_available": "consumers.spark",
    "read_stream": "consumers.spark",
    "spark_session": "consumers.spark",
    "KafkaDataLossError": "consumers.kafka_source",
    "KafkaOptionError": "consumers.kafka_source",
    "KafkaSource": "consumers.kafka_source",
    "KafkaSourceError": "consumers.kafka_source",
    "KafkaUnavailableError": "consumers.kafka_source",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'consumers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
