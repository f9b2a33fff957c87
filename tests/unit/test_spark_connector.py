"""Which source the audit job reads with, and the jars of Spark's Kafka connector (issue 36,
item 1): settled before Spark starts, from the user's jars, the launch, the cache or Maven
Central, each in one line; the jars reach the driver's JVM on its command line."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from consumers.spark import (
    CONNECTOR_ARTIFACT,
    EMBEDDED_WHY,
    KafkaConnectorMissing,
    choose_source,
    connector_jars,
    connector_versions,
    launch_args,
)
from registry.errors import BrokerStartError, ConfigError
from registry.kafka_config import Kafka

CLOSURE = ["commons-pool2-2.13.1.jar", "hadoop-client-api-3.5.0.jar", "jsr305-3.0.0.jar",
           "kafka-clients-3.9.2.jar", "scala-library-2.13.15.jar", "slf4j-api-1.7.36.jar",
           "spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-tags_2.13-4.2.0.jar",
           "spark-token-provider-kafka-0-10_2.13-4.2.0.jar"]
SHIPPED = ["hadoop-client-api-3.5.0.jar", "jsr305-3.0.0.jar", "scala-library-2.13.18.jar",
           "slf4j-api-2.0.17.jar", "spark-tags_2.13-4.3.0.jar", "spark-sql_2.13-4.3.0.jar"]


@pytest.fixture
def spark_jars(tmp_path: Path) -> Path:
    folder = tmp_path / "pyspark-jars"
    folder.mkdir()
    for name in SHIPPED:
        (folder / name).touch()
    return folder


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    libs = tmp_path / "spark-kafka-4.2.0" / "libs"
    libs.mkdir(parents=True)
    for name in CLOSURE:
        (libs / name).touch()
    return libs


def test_only_the_jars_spark_does_not_ship_are_added(cache: Path, spark_jars: Path) -> None:
    kept = [Path(j).name for j in connector_jars(sorted(cache.iterdir()), spark_jars)]
    assert kept == ["commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar",
                    "spark-sql-kafka-0-10_2.13-4.2.0.jar",
                    "spark-token-provider-kafka-0-10_2.13-4.2.0.jar"]


def test_the_jars_go_on_the_jvm_s_command_line() -> None:
    assert launch_args(None, ["/a.jar", "/b.jar"], None) == "--jars /a.jar,/b.jar pyspark-shell"
    assert launch_args("--master local[3] --jars /x.jar pyspark-shell", ["/a.jar"], "g:a:1") \
        == "--master 'local[3]' --jars /x.jar,/a.jar --packages g:a:1 pyspark-shell"
    assert shlex.split(launch_args("pyspark-shell", [], None)) == ["pyspark-shell"]


def test_the_nearest_release_when_maven_central_has_none_of_this_spark(monkeypatch) -> None:
    monkeypatch.delenv("JOBREG_SPARK_KAFKA_VERSION", raising=False)
    assert connector_versions("4.3.0") == ["4.3.0", "4.2.0"]
    assert connector_versions("4.2.0") == ["4.2.0"]
    monkeypatch.setenv("JOBREG_SPARK_KAFKA_VERSION", "4.1.3")
    assert connector_versions("4.3.0") == ["4.1.3"]


class Fetcher:
    """``registry.dev.kafka.spark_kafka_jars`` as Maven Central and a cache would answer:
    ``published`` releases can be fetched, ``cached`` ones are there already."""

    def __init__(self, cache: Path, cached: set[str], published: set[str],
                 no_mvn: bool = False) -> None:
        self.cache, self.cached, self.published, self.no_mvn = cache, cached, published, no_mvn
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, version: str, download: bool) -> list[Path] | None:
        self.calls.append((version, download))
        if version in self.cached:
            return sorted(self.cache.iterdir())
        if not download:
            return None
        if self.no_mvn:
            raise BrokerStartError("mvn not found on PATH: Maven fetches Spark's Kafka "
                                   "connector from Maven Central once (apt-get install maven)")
        if version not in self.published:
            raise BrokerStartError(f"Maven could not fetch Spark's Kafka connector {version}: "
                                   "... Could not find artifact org.apache.spark:"
                                   f"spark-sql-kafka-0-10_2.13:jar:{version} in central")
        self.cached.add(version)
        return sorted(self.cache.iterdir())


@pytest.fixture(autouse=True)
def _no_launch(monkeypatch) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("JOBREG_SPARK_KAFKA_VERSION", raising=False)


def test_the_cache_is_asked_before_maven_central(cache: Path) -> None:
    fetch = Fetcher(cache, cached={"4.2.0"}, published={"4.2.0"})
    choice = choose_source("auto", "127.0.0.1:9092", spark_version="4.3.0", fetch=fetch)
    assert choice.source == "kafka" and fetch.calls == [("4.3.0", False), ("4.2.0", False)]
    assert any(j.endswith("kafka-clients-3.9.2.jar") for j in choice.jars)
    assert f"{CONNECTOR_ARTIFACT}:4.2.0" in choice.why
    assert "Maven Central has none of Spark 4.3.0" in choice.why


def test_a_fetch_tries_the_exact_release_then_the_nearest(cache: Path) -> None:
    fetch = Fetcher(cache, cached=set(), published={"4.2.0"})
    choice = choose_source("kafka", "127.0.0.1:9092", spark_version="4.3.0", fetch=fetch)
    assert choice.source == "kafka"
    assert fetch.calls[-2:] == [("4.3.0", True), ("4.2.0", True)]


def test_no_maven_auto_falls_back_and_says_why_kafka_fails_in_one_line(cache: Path) -> None:
    fetch = Fetcher(cache, cached=set(), published={"4.2.0"}, no_mvn=True)
    choice = choose_source("auto", "127.0.0.1:9092", spark_version="4.3.0", fetch=fetch)
    assert choice.source == "python" and "mvn not found on PATH" in choice.why
    assert fetch.calls[-1] == ("4.3.0", True)  # no second try: it would fail alike
    with pytest.raises(KafkaConnectorMissing, match="mvn not found.*--kafka-jars") as e:
        choose_source("kafka", "127.0.0.1:9092", spark_version="4.3.0", fetch=fetch)
    assert "\n" not in str(e.value)


def test_named_jars_need_no_maven(cache: Path, tmp_path: Path) -> None:
    fetch = Fetcher(cache, cached=set(), published=set(), no_mvn=True)
    choice = choose_source("auto", "127.0.0.1:9092", spark_version="4.3.0", fetch=fetch,
                           named_jars=str(cache))
    assert choice.source == "kafka" and fetch.calls == [] and "--kafka-jars" in choice.why
    with pytest.raises(ConfigError, match="does not exist"):
        choose_source("auto", "h:1", spark_version="4.3.0", named_jars=str(tmp_path / "x"))
    with pytest.raises(ConfigError, match="names no spark-sql-kafka-0-10_2.13 jar"):
        choose_source("auto", "h:1", spark_version="4.3.0",
                      named_jars=str(cache / "kafka-clients-3.9.2.jar"))


def test_python_and_librdkafka_only_settings(cache: Path) -> None:
    fetch = Fetcher(cache, cached={"4.2.0"}, published=set())
    assert choose_source("python", "h:1", spark_version="4.3.0", fetch=fetch).source == "python"
    assert fetch.calls == []
    rdkafka_only = Kafka("h:1", {"ssl.ca.pem": "-----BEGIN CERTIFICATE-----"})
    choice = choose_source("auto", rdkafka_only, spark_version="4.3.0", fetch=fetch)
    assert choice.source == "python" and "librdkafka" in choice.why
    with pytest.raises(ConfigError, match="--source kafka"):
        choose_source("kafka", rdkafka_only, spark_version="4.3.0", fetch=fetch)


def test_under_spark_submit_the_classpath_is_settled(cache: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    fetch = Fetcher(cache, cached={"4.2.0"}, published=set())
    choice = choose_source("auto", "h:1", spark_version="4.3.0", fetch=fetch)
    assert (choice.source, choice.jars, fetch.calls) == ("auto", (), [])


def test_auto_leaves_sparks_source_aside_on_the_embedded_broker(cache: Path) -> None:
    fetch = Fetcher(cache, cached={"4.2.0"}, published=set())
    choice = choose_source("auto", "h:1", spark_version="4.3.0", fetch=fetch, embedded=True)
    assert choice.source == "python" and choice.why == EMBEDDED_WHY and fetch.calls == []
    asked = choose_source("kafka", "h:1", spark_version="4.3.0", fetch=fetch, embedded=True)
    assert asked.source == "kafka"  # asked for by name: the user's choice

