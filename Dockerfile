# The jobreg image: the CLI, the library and the audit streaming job, and Spark itself (the
# pyspark package): docker-compose.yml builds it for the `audit` service (the job's driver)
# and runs the Spark standalone master and workers from it (pyspark/bin/spark-class), so the
# executors have jobreg and its dependencies installed.
FROM python:3.11.11-slim-bookworm

# Spark needs a JVM; procps gives Spark's scripts `ps`.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/jobreg
COPY pyproject.toml README.md requirements.lock ./
COPY registry ./registry
COPY consumers ./consumers
COPY schemas ./schemas
COPY migrations ./migrations
# The parts the image runs (README "Install": the audit job on Spark, the HTML report, a
# schema registry codec), at the versions requirements.lock pins: the lock is a constraint
# here, so its test tools are not installed.
RUN pip install --no-cache-dir -c requirements.lock '.[spark,report,schemaregistry]'

# Spark's own Kafka connector, fetched once at build time into the Ivy cache, so the
# `kafka` source is on the classpath when the job starts (no download at run time).
# (A local master, for the fetch only: spark_session binds a local driver to 127.0.0.1 by
# itself; a cluster's driver takes its address from --driver-host or spark.driver.host.)
ENV JOBREG_SPARK_PACKAGES=org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
RUN python -c "from consumers.spark import spark_session; spark_session(master='local[1]').stop()"

RUN useradd --system --uid 10001 jobreg
USER jobreg
ENTRYPOINT ["jobreg"]
CMD ["--help"]
