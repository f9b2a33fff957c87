# The jobreg image: the CLI, the library and the audit streaming job (Spark in local mode).
# docker-compose.yml builds it for the `audit` service.
FROM python:3.11.11-slim-bookworm

# Spark needs a JVM; procps gives Spark's scripts `ps`.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/jobreg
COPY pyproject.toml README.md ./
COPY registry ./registry
COPY consumers ./consumers
COPY schemas ./schemas
COPY migrations ./migrations
RUN pip install --no-cache-dir .

# Spark's own Kafka connector, fetched once at build time into the Ivy cache, so the
# `kafka` source is on the classpath when the job starts (no download at run time).
ENV JOBREG_SPARK_PACKAGES=org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0 \
    SPARK_LOCAL_IP=127.0.0.1
RUN python -c "from consumers.spark import spark_session; spark_session().stop()"

RUN useradd --system --uid 10001 jobreg
USER jobreg
ENTRYPOINT ["jobreg"]
CMD ["--help"]
