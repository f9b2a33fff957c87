"""The ``jobreg`` command line.

A thin layer over the library: commands parse options, call the library and
print. Errors the library raises on purpose (:class:`RegistryError`) are shown
as one line on stderr through :func:`registry_errors`, never as a traceback.

To add a command, define it on :func:`main` (``@main.command()`` or a
``@main.group()`` such as ``bench``) and wrap its body in
``with registry_errors():``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

from registry.audit.queries import NAMED_QUERIES, NamedQuery
from registry.errors import BrokerError, ConfigError, MissingExtra, RegistryError

if TYPE_CHECKING:
    from registry.dev.brokers import BrokerChoice
    from registry.forensics import Forensics
    from registry.kafka_config import Kafka
    from registry.metrics import MetricsServer

__all__ = ["EXIT_DAMAGED", "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_USAGE", "CliError",
           "main", "registry_errors"]

EXIT_OK = 0
EXIT_ERROR = 1  # the registry, the broker or the machine reported an error
EXIT_USAGE = 2  # what was typed is wrong (click's own code for a bad command line)
EXIT_NOT_FOUND = 3  # the job (or namespace) asked about has no record
EXIT_DAMAGED = 4  # a dump is damaged or cut short (DamagedDump)


class CliError(click.ClickException):
    """An error for people: click prints ``Error: <message>`` to stderr and exits."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        # click reads self.exit_code; its stub makes it a ClassVar (its subclasses' codes)
        self.exit_code = exit_code  # type: ignore[misc]


@contextlib.contextmanager
def registry_errors(exit_code: int = EXIT_ERROR) -> Iterator[None]:
    """Turn a :class:`RegistryError` into a :class:`CliError` (message, exit code 1; a
    damaged dump, :class:`~registry.errors.DamagedDump`, exit code 4).

    Use as ``with registry_errors(): ...`` inside a command, or as a decorator
    placed below the click decorators.
    """
    from registry.errors import DamagedDump

    try:
        yield
    except DamagedDump as e:
        raise CliError(str(e), EXIT_DAMAGED) from e
    except RegistryError as e:
        raise CliError(str(e), exit_code) from e


EPILOG = (
    "Exit codes: 0 success; 1 an error from the registry, the broker, the database or the "
    "machine (unreachable broker: at once when every address refuses or does not resolve, "
    "after --timeout when none answers; a refused SASL login; missing topic; a namespace "
    "written under another partition count; a file that is not a dump; a report or dump that "
    "cannot be written or that --force would have to replace; an audit database that does not "
    "exist, is not an audit database or refuses a statement, or a PostgreSQL login that can "
    "do more than read; audit check differences, audit resurrections rows; a program the "
    "command needs that is not installed, such as the broker binary, or an extra of jobreg "
    "such as jobreg[audit] (the line names the pip install)); 2 bad usage: what was "
    "typed is wrong (unknown option, malformed job id, time, --bootstrap (it must be "
    "HOST:PORT[,HOST:PORT...]) or --command-config, no --bootstrap nor --from-file where the "
    "log is needed, a file named that does not exist or does not fit (a --from-file of "
    "another --namespace, an audit check --from-file with no dump or two of one namespace, a "
    "torture --check folder with no run), state without exactly one of --offset/--time, a "
    "grant-reader NAME that cannot be a login or a --password-file that cannot be read); 3 a "
    "job asked about (timeline, explain, report --job) that no record mentions, or a "
    "namespace with no record on the topic (a mistyped --namespace: the message lists the "
    "namespaces that have records); 4 a dump is damaged or cut short (the one line says "
    "where). Errors go to stderr, never as a traceback."
)
"""The exit codes, as ``jobreg --help`` ends and the README's CLI section says them (a test
holds the two to the same words)."""


@dataclass
class Settings:
    """The global options, shared by every command through click's context."""

    bootstrap: str | None
    namespace: str
    topic: str
    from_file: str | None
    as_json: bool
    timeout: float
    namespace_given: bool = False
    client_config: dict[str, str] = field(default_factory=dict)
    partitions: int | None = None

    @property
    def kafka(self) -> Kafka:
        """Where the log is, with the client properties of ``--command-config``."""
        from registry.kafka_config import Kafka

        return Kafka(self.bootstrap or "", self.client_config)

    def forensics(self) -> Forensics:
        """The namespace's log, from the broker or from ``--from-file``, with a progress
        bar on a terminal."""
        from registry.forensics import DumpSource, Forensics

        progress = ProgressBar.for_terminal()
        if self.from_file is not None:
            source = DumpSource(self.from_file)
            if self.namespace_given and source.namespace != self.namespace:
                raise CliError(f"{self.from_file} holds namespace {source.namespace!r}, not "
                               f"{self.namespace!r} (leave out --namespace to read it)",
                               EXIT_USAGE)
            return Forensics(source, source.namespace, progress=progress)
        if self.bootstrap is None:
            raise CliError("say where the log is: --bootstrap HOST:PORT (or $JOBREG_BOOTSTRAP), "
                           "or --from-file DUMP", EXIT_USAGE)
        return Forensics.from_broker(self.kafka, self.topic, self.namespace, self.timeout,
                                     progress=progress, require_records=True,
                                     partitions=self.partitions)

    def emit(self, what: str, payload: dict[str, Any], human: Callable[[], str]) -> None:
        """Print ``payload`` as JSON (``{"format": "jobreg.<what>/1", ...}``) under
        ``--json``, else ``human()``."""
        if self.as_json:
            click.echo(json.dumps({"format": f"jobreg.{what}/1", **payload}, indent=2,
                                  default=lambda o: o.hex() if isinstance(o, bytes) else str(o)))
        else:
            click.echo(human())


class ProgressBar:
    """A one-line progress bar on stderr for long replays: shown only when stderr is a
    terminal and only once a replay has read more than ``threshold`` records."""

    def __init__(self, stream: TextIO, threshold: int = 2000) -> None:
        self.stream = stream
        self.threshold = threshold
        self._shown = False
        self._started = time.monotonic()

    @classmethod
    def for_terminal(cls) -> ProgressBar | None:
        """A bar on stderr if stderr is a terminal, else ``None`` (nothing when piped)."""
        stream = sys.stderr
        return cls(stream) if stream.isatty() else None

    def __call__(self, records: int, fraction: float | None) -> None:
        if records <= self.threshold:
            return
        self._shown = True
        rate = records / max(1e-6, time.monotonic() - self._started)
        if fraction is None:
            line = f"replaying: {records:,} records ({rate:,.0f}/s)"
        else:
            filled = int(fraction * 30)
            line = (f"replaying [{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%} "
                    f"{records:,} records ({rate:,.0f}/s)")
        self.stream.write("\r" + line)
        if fraction is not None and fraction >= 1.0:
            self.done()
        self.stream.flush()

    def done(self) -> None:
        """End the bar's line (if one was drawn)."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False


def _check_job_id(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    from registry.keys import check_id

    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if v is None:
            continue
        try:
            check_id("job id", v)
        except RegistryError as e:
            raise click.BadParameter(str(e)) from None
    return value


def _time_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from registry.render import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


class _Main(click.Group):
    """The ``jobreg`` group: a command whose part of jobreg needs an extra that is not
    installed (:class:`~registry.errors.MissingExtra`, wherever the command imports it) ends
    in the one line that names the extra, exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MissingExtra as e:
            raise CliError(str(e)) from e


@click.group(cls=_Main, epilog=EPILOG)
@click.version_option(package_name="jobreg", prog_name="jobreg")
@click.option("--bootstrap", envvar="JOBREG_BOOTSTRAP", metavar="HOST:PORT",
              help="Kafka bootstrap servers of the registry log. [env: JOBREG_BOOTSTRAP]")
@click.option("--namespace", envvar="JOBREG_NAMESPACE", default="default", show_default=True,
              help="The namespace to read. [env: JOBREG_NAMESPACE]")
@click.option("--topic", envvar="JOBREG_TOPIC", default="jobreg", show_default=True,
              help="The registry topic. [env: JOBREG_TOPIC]")
@click.option("--from-file", "from_file", envvar="JOBREG_FROM_FILE", metavar="DUMP",
              type=click.Path(exists=True, dir_okay=False),
              help="Read a dump written by `jobreg dump` instead of a broker (no broker "
                   "needed). [env: JOBREG_FROM_FILE]")
@click.option("--command-config", "-F", "command_config", envvar="JOBREG_KAFKA_CONFIG",
              metavar="FILE", type=click.Path(dir_okay=False),
              help="A properties file of extra Kafka client settings (security.protocol, "
                   "ssl.*, sasl.*), as Kafka's tools take it; values may be ${env:NAME} or "
                   "${file:PATH}. [env: JOBREG_KAFKA_CONFIG]")
@click.option("--partitions", envvar="JOBREG_PARTITIONS", type=click.IntRange(1),
              default=None,
              help="Map namespaces to partitions with this count instead of the topic's: "
                   "the count they were written under, after partitions were added (README "
                   "\"Scaling the topic\"). [env: JOBREG_PARTITIONS]")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON (stable shapes, see the README) instead of tables.")
@click.option("--timeout", envvar="JOBREG_TIMEOUT", type=click.FloatRange(0.1, 3600),
              default=10.0, show_default=True,
              help="Seconds to wait for the broker before giving up (without progress, for "
                   "long reads). [env: JOBREG_TIMEOUT]")
@click.pass_context
def main(ctx: click.Context, bootstrap: str | None, namespace: str, topic: str,
         from_file: str | None, command_config: str | None, partitions: int | None,
         as_json: bool, timeout: float) -> None:
    """jobreg: an event-sourced job registry on a compacted Kafka log.

    The read commands (jobs, leader, terms, timeline, explain, rejected,
    quarantine, state, dump, report) replay one namespace's log from a broker
    (--bootstrap) or from a dump file (--from-file), and never write to it.

    The options below are global: they may come before the command or after it
    (jobreg --json jobs, or jobreg jobs --json).
    """
    client_config = _checked_global("command_config", command_config) \
        if command_config is not None else {}
    source = ctx.get_parameter_source("namespace")
    ctx.obj = Settings(_checked_global("bootstrap", bootstrap),
                       _checked_global("namespace", namespace), _checked_global("topic", topic),
                       from_file, as_json, timeout,
                       namespace_given=source not in (None, click.core.ParameterSource.DEFAULT),
                       client_config=client_config, partitions=partitions)


def _checked_global(name: str, value: Any) -> Any:
    """One global option's value, checked the same wherever it was given (before or after
    the command); ``command_config`` gives the properties its file holds."""
    from registry.keys import check_id
    from registry.log import check_bootstrap

    if value is None:
        return None
    hint = "--" + name.replace("_", "-")
    try:
        if name in ("namespace", "topic"):
            check_id(name, value)
        elif name == "bootstrap":
            return check_bootstrap(value)
        elif name == "command_config":
            from registry.kafka_config import load_properties

            return load_properties(value)
    except RegistryError as e:
        raise click.BadParameter(str(e), param_hint=hint) from None
    return value


def _late_global(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """A global option given after the command: it sets what it sets before the command."""
    if ctx.get_parameter_source(param.name or "") is not click.core.ParameterSource.COMMANDLINE:
        return
    settings = ctx.find_object(Settings)
    if settings is None:
        return
    name = (param.name or "").removeprefix("global_")
    checked = _checked_global(name, value)
    if name == "command_config":
        settings.client_config = checked
    else:
        setattr(settings, name, checked)
    if name == "namespace":
        settings.namespace_given = True


def _accept_global_options_anywhere(group: click.Group,
                                    globals_: list[click.Option] | None = None) -> None:
    """Let every command under ``group`` take the global options after its own name too
    (``jobreg jobs --json`` as well as ``jobreg --json jobs``), except an option the command
    has of its own (``audit check --from-file``, ``torture --bootstrap``). Given in both
    places, the one after the command wins."""
    if globals_ is None:
        globals_ = [p for p in group.params if isinstance(p, click.Option)
                    and p.name != "version"]
    for command in group.commands.values():
        taken = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        added = [g for g in globals_ if not taken & {*g.opts, *g.secondary_opts}]
        for g in added:
            command.params.append(click.Option(
                [*g.opts, f"global_{g.name}"], type=None if g.is_flag else g.type,
                is_flag=g.is_flag, metavar=g.metavar, hidden=True, expose_value=False,
                callback=_late_global))
        note = ("The global options (jobreg --help) may also come after the command: "
                + ", ".join(g.opts[0] for g in added) + ".")
        command.epilog = (command.epilog + "\n\n" if command.epilog else "") + note
        if isinstance(command, click.Group):
            _accept_global_options_anywhere(command, globals_)


pass_settings = click.make_pass_decorator(Settings)


@main.command()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port to listen on (127.0.0.1 only). Default: a free port. With --kafka, the first "
         "node's port (the others take the next ones).",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Append the broker's output to this file. Default: a temporary file removed on stop. "
         "Embedded broker only.",
)
@click.option("--kafka", "use_kafka", is_flag=True,
              help="Run Apache Kafka (KRaft, from Maven Central's jars, fetched once with "
                   "mvn into ~/.cache/jobreg) instead of the embedded broker.")
@click.option("--nodes", type=click.IntRange(1, 9), default=1, show_default=True,
              help="With --kafka: how many nodes (3: replication 3, min.insync.replicas 2).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, writable=True),
              default=None,
              help="With --kafka: keep the nodes' data and logs here (default: a temporary "
                   "directory removed on stop).")
def broker(port: int | None, log_file: str | None, use_kafka: bool, nodes: int,
           directory: str | None) -> None:
    """Run a Kafka broker for development in the foreground until Ctrl-C.

    By default the embedded broker (Tansu): it listens on 127.0.0.1 and keeps everything
    in memory, so all topics and records are lost when it stops. With --kafka, Apache
    Kafka in KRaft mode, one node or --nodes of them, on 127.0.0.1.
    """
    if not use_kafka:
        if nodes != 1:
            raise click.BadParameter("the embedded broker has one node; --nodes needs --kafka",
                                     param_hint="--nodes")
        if directory is not None:
            raise click.BadParameter("the embedded broker keeps nothing on disk; --dir needs "
                                     "--kafka", param_hint="--dir")
    elif log_file is not None:
        raise click.BadParameter("Kafka's nodes log into their own directories (--dir); "
                                 "--log-file is for the embedded broker",
                                 param_hint="--log-file")
    if use_kafka:
        from registry.dev.kafka import KAFKA_VERSION, KafkaCluster

        ports = [port + i for i in range(nodes)] if port is not None else None
        if ports is not None and ports[-1] > 65535:
            raise click.BadParameter(f"{nodes} nodes from port {port} go past 65535",
                                     param_hint="--port")
        cluster = KafkaCluster(nodes, directory=directory, ports=ports,
                               progress=lambda line: click.echo(line, err=True))

        def check_nodes() -> None:
            for node in cluster.nodes:
                if not node.is_running():
                    raise BrokerError(f"Kafka node {node.node_id} exited; its log is in "
                                      f"{node.logs}")

        replicated = ", replication 3, min.insync.replicas 2" if nodes >= 3 else ""
        _serve_in_foreground(cluster, f"Apache Kafka {KAFKA_VERSION} (KRaft, {nodes} node(s)"
                                      f"{replicated})", check_nodes)
        return

    from registry.dev.broker import EmbeddedBroker, find_tansu_binary

    with registry_errors():  # not installed: the machine's error, not a usage error
        binary = find_tansu_binary()
    embedded = EmbeddedBroker(port=port, binary=binary, log_file=log_file)
    _serve_in_foreground(embedded, "Embedded Kafka broker (Tansu, in memory: data is lost on "
                                   "stop)", embedded.ensure_running)


def _serve_in_foreground(broker: Any, banner: str, check: Callable[[], None]) -> None:
    """Start ``broker`` (an EmbeddedBroker or a KafkaCluster), say where it answers, call
    ``check`` twice a second until SIGINT or SIGTERM, then stop it."""
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop_requested.set()

    # Handlers go in before the broker starts: a SIGTERM with the default action
    # would end this process without stopping the broker.
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with registry_errors():
            broker.start()
            try:
                click.echo(banner)
                click.echo(f"bootstrap: {broker.bootstrap}")
                click.echo("Ctrl-C to stop")
                while not stop_requested.wait(0.5):
                    check()
                click.echo("stopping...", err=True)
            finally:
                broker.stop()
            click.echo("stopped", err=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, writable=True),
              default="jobreg-demo", show_default=True,
              help="Where the audit database (audit.db) and the HTML reports go.")
@click.option("--audit", "audit_engine", type=click.Choice(["spark", "plain", "none"]),
              default="spark", show_default=True,
              help="Materialize the audit views with Spark, with plain Python, or not at all.")
def demo(out_dir: str, audit_engine: str) -> None:
    """Play the seeds' incidents live on an embedded broker with coordinator processes,
    materialize the audit views, write the incident reports, check every guarantee.

    Exits 1 if any guarantee did not hold.
    """
    from registry.dev.demo import run_demo

    with registry_errors():
        verdicts = run_demo(click.echo, out_dir=out_dir, audit=audit_engine)
    if not all(v.held for v in verdicts):
        raise CliError("a guarantee did not hold (see the verdict table)")


@main.command()
@click.option("--check", is_flag=True, help="Exit 1 if the catalog is out of date.")
@click.option("--update-catalog", "update", is_flag=True,
              help="Append a new version for every .avsc whose schema is not the current one.")
@click.option("--catalog", "catalog_file", metavar="FILE",
              help="Catalog file (default: the installed catalog.json).")
@click.option("--schemas-dir", metavar="DIR", help="Folder of .avsc files (default: installed).")
def catalog(check: bool, update: bool, catalog_file: str | None,
            schemas_dir: str | None) -> None:
    """Maintain the versioned Avro schema catalog: --check, or --update-catalog.

    Exits 1 if --check finds the catalog out of date, 2 for malformed files.
    """
    from registry.wire import update_catalog

    if check == update:
        raise click.UsageError("give one of --check and --update-catalog")
    try:
        path, schemas, changes = update_catalog(catalog_file, schemas_dir, write=update)
    except (ConfigError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None
    if check:
        for change in changes:
            click.echo(f"out of date: {change}", err=True)
        if changes:
            click.echo("run: jobreg catalog --update-catalog", err=True)
            raise SystemExit(1)
        click.echo(f"{path}: up to date")
        return
    for change in changes:
        click.echo(change)
    click.echo(f"{path}: {schemas} schema(s), {len(changes)} change(s)")


@main.group()
def bench() -> None:
    """Benchmarks that print figures (nothing here is a pass/fail test)."""


@bench.command("core")
@click.option("--submits", type=click.IntRange(10), default=1000, show_default=True,
              help="Fenced submits timed one at a time.")
@click.option("--jobs", "batch_jobs", type=click.IntRange(1000), default=100_000,
              show_default=True, help="Jobs submitted in batches (also the replayed log).")
@click.option("--batch", "batch_size", type=click.IntRange(1, 10_000), default=1000,
              show_default=True, help="Jobs per batched transaction.")
def bench_core_cmd(submits: int, batch_jobs: int, batch_size: int) -> None:
    """Fenced submit latency, batched throughput, replay versus the raw consume+decode limit."""
    from registry.dev.bench import bench_core, format_table

    with registry_errors():
        result = bench_core(submits=submits, batch_jobs=batch_jobs, batch_size=batch_size,
                            progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_table(result))


@bench.command("recovery")
@click.option("--events", "log_events", type=click.IntRange(2000), default=100_000,
              show_default=True, help="Events in the log for the start-up comparison.")
def bench_recovery_cmd(log_events: int) -> None:
    """Failover time (claim -> 1,000 and 10,000 jobs adopted); start-up from scratch vs snapshot."""
    from registry.dev.bench import bench_recovery, format_recovery

    with registry_errors():
        figures = bench_recovery(log_events=log_events,
                                 progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_recovery(figures))


@bench.command("replay")
@click.option("--records", type=click.IntRange(1000), default=1_000_000, show_default=True,
              help="Records in the log replayed.")
def bench_replay_cmd(records: int) -> None:
    """Forensics throughput: state_at from the broker, dump, open_dump + state_at."""
    from registry.dev.bench import bench_replay, format_replay

    with registry_errors():
        figures = bench_replay(records=records,
                               progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_replay(figures))


def _kafka_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--kafka`` and ``--kafka-nodes N``: the benchmark runs on Apache Kafka started for it
    (:func:`_chosen_broker`)."""
    command = click.option(
        "--kafka-nodes", type=click.IntRange(1, 9), default=None, metavar="N",
        help="Run on N Apache Kafka nodes started for the run (3: topics of replication 3, "
             "min.insync.replicas 2); implies --kafka.")(command)
    return click.option(
        "--kafka", "use_kafka", is_flag=True,
        help="Run on one Apache Kafka node (KRaft, from Maven Central's jars, fetched once "
             "with mvn into ~/.cache/jobreg) started for the run, instead of the embedded "
             "broker.")(command)


def _chosen_broker(use_kafka: bool, kafka_nodes: int | None) -> BrokerChoice:
    """The broker ``--kafka`` / ``--kafka-nodes`` chose (the embedded one without them)."""
    from registry.dev.brokers import BrokerChoice

    if use_kafka or kafka_nodes is not None:
        return BrokerChoice.kafka(kafka_nodes or 1)
    return BrokerChoice.embedded()


@bench.command("audit")
@click.option("--events", type=click.IntRange(1000), default=100_000, show_default=True,
              help="Events written into each database for the throughput figures.")
@click.option("--rate", type=click.IntRange(10), default=1000, show_default=True,
              help="Events per second for the freshness figures.")
@click.option("--seconds", type=click.FloatRange(2), default=20.0, show_default=True,
              help="How long the steady load of the freshness figures lasts.")
@click.option("--namespaces", type=click.IntRange(1), default=64, show_default=True,
              help="Namespaces the events are spread over (on the topic's 8 partitions).")
@click.option("--masters", default="local[1],local[2],local[4]", show_default=True,
              help="The Spark masters of the scaling table, comma-separated: local[N]; "
                   "cluster[N], a standalone cluster of N one-core workers the run starts on "
                   "127.0.0.1 and stops; or spark://127.0.0.1:PORT for a standalone cluster "
                   "on this machine (its workers started beforehand).")
@click.option("--sources", default="python,kafka", show_default=True,
              help="The audit job's sources the Spark figures are taken with, "
                   "comma-separated: python (jobreg-kafka), kafka (Spark's connector, "
                   "fetched once from Maven Central if need be).")
@click.option("--embedded-and-kafka", "both", is_flag=True,
              help="The whole benchmark on the embedded broker, then on Apache Kafka "
                   "(one node, or --kafka-nodes N), in one run.")
@_kafka_options
def bench_audit_cmd(events: int, rate: int, seconds: float, namespaces: int,
                    masters: str, sources: str, both: bool, use_kafka: bool,
                    kafka_nodes: int | None) -> None:
    """Audit stream throughput into SQLite and PostgreSQL, freshness p50/p95 and the Spark
    processes' peak memory, plain Python next to Spark under each master (a scaling table)
    and with each source, in the same run; the log on the embedded broker, on Apache Kafka
    (--kafka, --kafka-nodes N), or on both (--embedded-and-kafka)."""
    from registry.dev.bench_audit import SOURCES, bench_audit, format_audit, format_audit_summary
    from registry.dev.brokers import BrokerChoice

    chosen = [m.strip() for m in masters.split(",") if m.strip()]
    if not chosen:
        raise click.BadParameter("name at least one Spark master", param_hint="--masters")
    from registry.dev.sparkcluster import cluster_workers

    odd = [m for m in chosen if m.startswith("cluster") and cluster_workers(m) is None]
    if odd:
        raise click.BadParameter(f"{odd[0]!r}: cluster[N] names N workers, 1 to 99",
                                 param_hint="--masters")
    picked = [x.strip() for x in sources.split(",") if x.strip()]
    if not picked or any(x not in SOURCES for x in picked):
        raise click.BadParameter(f"{sources!r}: name python, kafka or both",
                                 param_hint="--sources")
    brokers = [BrokerChoice.embedded(), BrokerChoice.kafka(kafka_nodes or 1)] if both else \
        [_chosen_broker(use_kafka, kafka_nodes)]
    runs = []
    for broker in brokers:
        with registry_errors():
            figures = bench_audit(events=events, rate=rate, seconds=seconds,
                                  namespaces=namespaces, masters=chosen, broker=broker,
                                  sources=[s for s in SOURCES if s in picked],
                                  progress=lambda msg: click.echo(f"... {msg}", err=True))
        if both and not broker.is_kafka:  # format_audit names Apache Kafka itself
            click.echo(f"the log on {broker.describe()}")
        click.echo(format_audit(figures))
        runs.append(("Kafka" if broker.is_kafka else "embedded", figures))
    if both:
        click.echo("")
        click.echo(format_audit_summary(runs))


def _store_list(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    from registry.dev.bench_peers import STORES

    names = tuple(dict.fromkeys(s.strip().lower() for s in value.split(",") if s.strip()))
    unknown = [s for s in names if s not in STORES]
    if unknown or not names:
        raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}: choose from "
                                 f"{','.join(STORES)}")
    return names


def _writer_levels(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(dict.fromkeys(int(w) for w in value.split(",") if w.strip()))
    except ValueError:
        levels = ()
    if not levels or any(not 1 <= w <= 256 for w in levels):
        raise click.BadParameter(f"{value!r}: writer counts from 1 to 256, comma-separated "
                                 "(for example 8,64)")
    return levels


@bench.command("peers")
@click.option("--submits", type=click.IntRange(10), default=1000, show_default=True,
              help="Fenced submits timed one at a time on each store.")
@click.option("--calls", type=click.IntRange(10), default=2000, show_default=True,
              help="Single-job submits per level of concurrent writers (and across the "
                   "namespaces).")
@click.option("--writers", default="8,64", show_default=True, callback=_writer_levels,
              help="Levels of concurrent writers of one leader, comma-separated.")
@click.option("--jobs", type=click.IntRange(10), default=10_000, show_default=True,
              help="Live jobs of the failover (submitted in native batches of 1,000).")
@click.option("--namespaces", type=click.IntRange(0, 256), default=16, show_default=True,
              help="jobreg: namespaces with a leader each, written at once, a leader process "
                   "each and then a thread each in one process (0: leave out).")
@click.option("--namespace-partitions", type=click.IntRange(0, 256), default=0,
              show_default=True,
              help="Partitions of the namespaces' topic, the namespaces spread evenly over "
                   "them (0: one partition per namespace).")
@click.option("--only", default="jobreg,kafka,kafka3,kafka-fsync,etcd,zookeeper",
              show_default=True, callback=_store_list,
              help="The stores to run, comma-separated: jobreg (on the embedded broker), kafka "
                   "(jobreg on one Apache Kafka node), kafka3 (three nodes, replication 3), "
                   "kafka-fsync (one node fsyncing every append), etcd, zookeeper.")
def bench_peers_cmd(submits: int, calls: int, writers: tuple[int, ...], jobs: int,
                    namespaces: int, namespace_partitions: int, only: tuple[str, ...]) -> None:
    """jobreg (on the embedded broker and on Apache Kafka: one node, three nodes, one node
    fsyncing every append) next to etcd (Kubernetes-HA-style) and ZooKeeper (Flink-style),
    started from Debian's packages on loopback, one workload on each: one writer's p50/p99,
    concurrent writers' throughput and p50/p99, a native batch of 1,000, failover, ratios,
    durability."""
    from registry.dev.bench_peers import PeersError, bench_peers, format_peers

    with registry_errors():
        try:
            figures = bench_peers(submits=submits, calls=calls, writers=writers, jobs=jobs,
                                  namespaces=namespaces, only=only,
                                  namespace_partitions=namespace_partitions,
                                  progress=lambda msg: click.echo(f"... {msg}", err=True))
        except PeersError as e:
            raise CliError(str(e)) from e
    if not figures.stores:
        raise CliError("no store could run: " + "; ".join(figures.skipped.values()))
    click.echo(format_peers(figures))


@bench.command("flink-failover")
@click.option("--runs", type=click.IntRange(1, 50), default=3, show_default=True,
              help="SIGKILLs of the leading JobManager on each backend.")
@click.option("--cancels", type=click.IntRange(0, 50), default=None,
              help="Cancel-then-kill runs on each backend (default: --runs).")
@click.option("--kafka", is_flag=True,
              help="jobreg on one Apache Kafka node instead of the embedded broker.")
@click.option("--lease", type=click.FloatRange(1.0, 60.0), default=5.0, show_default=True,
              help="jobreg's leadership lease, seconds (high-availability.jobreg.lease).")
@click.option("--only", type=click.Choice(["both", "zookeeper", "jobreg"]), default="both",
              show_default=True, help="The backends to run.")
@click.option("--kill-delay-ms", type=click.FloatRange(0, 1000), default=0.0, show_default=True,
              help="Cancel-then-kill: wait this long after the CANCELED line before the kill.")
def bench_flink_failover_cmd(runs: int, cancels: int | None, kafka: bool, lease: float,
                             only: str, kill_delay_ms: float) -> None:
    """A Flink 2.3 JobManager failover, Flink's ZooKeeper backend (Debian's ZooKeeper, 6 s
    session timeout) against jobreg's (flink-jobreg), the same job on the same machine in one
    run: seconds from the SIGKILL of the leader to the standby's leadership, to the job
    RUNNING and to its first checkpoint; then cancel-then-kill at the CANCELED log line,
    resurrections out of the runs. Needs Java 17, javac and Maven."""
    from registry.dev.bench_flink import (
        FlinkBenchError,
        bench_flink_failover,
        format_flink_failover,
    )

    backends = ("zookeeper", "jobreg") if only == "both" else (only,)
    with registry_errors():
        try:
            figures = bench_flink_failover(runs=runs, cancels=cancels, kafka=kafka,
                                           lease=lease, backends=backends,
                                           kill_delay_ms=kill_delay_ms,
                                           progress=lambda msg: click.echo(f"... {msg}",
                                                                           err=True))
        except FlinkBenchError as e:
            raise CliError(str(e)) from e
    click.echo(format_flink_failover(figures, lease=lease))


@bench.command("flink-ha")
@click.option("--kills", type=click.IntRange(1, 20), default=3, show_default=True,
              help="SIGKILLs of the leading JobManager (each after a simulated task failure).")
@click.option("--kafka", is_flag=True,
              help="jobreg on one Apache Kafka node instead of the embedded broker.")
@click.option("--lease", type=click.FloatRange(1.0, 60.0), default=5.0, show_default=True,
              help="jobreg's leadership lease, seconds (high-availability.jobreg.lease).")
@click.option("--scheduler", type=click.Choice(["both", "default", "adaptive"]),
              default="both", show_default=True, help="The schedulers to run it under.")
@click.option("--control", is_flag=True,
              help="The control: the verifier keeps what it saw in a field, not in keyed "
                   "state, so its checks must fail after the first restore (exits 1 unless "
                   "every run found violations).")
def bench_flink_ha_cmd(kills: int, kafka: bool, lease: float, scheduler: str,
                       control: bool) -> None:
    """Flink's own end-to-end HA test (test_ha_datastream.sh) on jobreg: a job that checks
    its own exactly-once state (a sequence generator and a verifier, parallelism 4),
    simulated task failures, the leading JobManager killed --kills times and started again
    each time; the job's checks, the failover times and the registry's timeline of the job by
    leader term. Exits 1 unless every run passed. Needs Java 17, javac and Maven."""
    from registry.dev.bench_flink import FlinkBenchError
    from registry.dev.bench_flink_ha import bench_flink_ha, format_flink_ha

    schedulers = ("default", "adaptive") if scheduler == "both" else (scheduler,)
    with registry_errors():
        try:
            runs = bench_flink_ha(kills=kills, kafka=kafka, lease=lease, schedulers=schedulers,
                                  control=control,
                                  progress=lambda msg: click.echo(f"... {msg}", err=True))
        except FlinkBenchError as e:
            raise CliError(str(e)) from e
    click.echo(format_flink_ha(runs))
    if not all((bool(r.violations) and r.error is None) if control else r.passed
               for r in runs):
        raise SystemExit(1)


@bench.command("soak")
@click.option("--writes", type=click.IntRange(1), default=100_000, show_default=True,
              help="Fenced writes on one namespace.")
@click.option("--window", type=click.IntRange(1), default=10_000, show_default=True,
              help="Writes per reported window.")
@click.option("--writers", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Threads calling the leader's one Term at once (1: one call at a time).")
@click.option("--jobs", type=click.IntRange(1), default=1000, show_default=True,
              help="Live jobs kept (submitted before the timed writes; churn keeps the count).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the write mix.")
@_kafka_options
@pass_settings
def bench_soak_cmd(settings: Settings, writes: int, window: int, writers: int, jobs: int,
                   seed: int, use_kafka: bool, kafka_nodes: int | None) -> None:
    """Holds up at size? Fenced writes in a realistic mix (checkpoints triggered, completed,
    failed; cancels and submits; adopts), one call at a time or from --writers threads at
    once on the leader's one Term; per window the rate, p50/p99 latency (of each call),
    failures, the client's RSS and its image's size; then a fresh client's start-up with and without a
    snapshot. On an embedded broker, on Apache Kafka started for the run (--kafka, one node;
    --kafka-nodes N), or on the global --bootstrap (a fresh topic whose deletion is asked
    afterwards). Progress on stderr, the table on stdout.

    Failed writes are counted, not fatal; the run stops early (exit 1) after 20 failures in a
    row, or when under 1 write/s succeeded for 60 s or for 3 windows in a row.
    """
    from registry.dev.bench_soak import bench_soak, format_soak

    broker = _chosen_broker(use_kafka, kafka_nodes)
    if broker.is_kafka and settings.bootstrap:
        raise click.BadParameter("--kafka starts a broker for the run and --bootstrap (or "
                                 "$JOBREG_BOOTSTRAP) names one: give one of them",
                                 param_hint="--kafka")
    with registry_errors():
        figures = bench_soak(writes=writes, window=window, writers=writers, jobs=jobs,
                             seed=seed, broker=broker,
                             bootstrap=settings.bootstrap, timeout=settings.timeout,
                             progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_soak(figures))
    if figures.stopped:
        raise SystemExit(EXIT_ERROR)


def _sizes(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(dict.fromkeys(int(n) for n in value.split(",") if n.strip()))
    except ValueError:
        sizes = ()
    if not sizes or any(not 1 <= n <= 2048 for n in sizes):
        raise click.BadParameter(f"{value!r}: records per write from 1 to 2048, "
                                 "comma-separated (for example 1,8,64,512)")
    return sizes


@bench.command("roundtrips")
@click.option("--writes", type=click.IntRange(10, 100_000), default=200, show_default=True,
              help="Timed writes per write kind and size (after 20 untimed).")
@click.option("--sizes", default="1,8,64,512", show_default=True, callback=_sizes,
              help="Records per write, comma-separated.")
@click.option("--graph-bytes", type=click.IntRange(0, 10_000), default=200, show_default=True,
              help="Inline graph of each record (a JobSubmitted as the wire encodes it).")
@click.option("--rounds", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Turns the write kinds take, each writing its share of --writes.")
@click.option("--long-batches", type=click.IntRange(0, 1_000_000), default=5000,
              show_default=True, help="Batches a long partition holds before its writes (0: "
                                      "leave the writes on a long partition out).")
@click.option("--replication", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Replication factor of the topic on the global --bootstrap's cluster.")
@_kafka_options
@pass_settings
def bench_roundtrips_cmd(settings: Settings, writes: int, sizes: tuple[int, ...],
                         graph_bytes: int, rounds: int, long_batches: int,
                         replication: int, use_kafka: bool, kafka_nodes: int | None) -> None:
    """What a write's round trips cost: a write of N records to one partition as today's
    write (an idempotent acks=all producer, then a read_committed ListOffsets confirmation,
    the probe fetch only when that does not show it), next to the Kafka transaction of before
    issue 35 with and without its confirmation, the idempotent write confirmed by the probe
    alone and unconfirmed, and variants (the confirmation's fetch, linger.ms,
    batch.num.messages, Nagle); p50/p99 and records/s with ratios from one run, the requests
    librdkafka sends (versions, round-trip times) and init_transactions.
    On an embedded broker, on Apache Kafka started for the run (--kafka, --kafka-nodes N), or
    on the global --bootstrap (a fresh topic whose deletion is asked afterwards). Progress on
    stderr, the tables on stdout."""
    from registry.dev.bench_roundtrips import bench_roundtrips, format_roundtrips

    if rounds > writes:
        raise click.BadParameter(f"{rounds} rounds for {writes} writes: at most one round "
                                 "per write", param_hint="--rounds")
    nodes = kafka_nodes if kafka_nodes is not None else (1 if use_kafka else 0)
    if nodes and settings.bootstrap:
        raise click.BadParameter("--kafka starts a cluster of its own; leave out --bootstrap "
                                 "(or leave out --kafka to use --bootstrap's)", param_hint="--kafka")
    if replication > 1 and not settings.bootstrap:
        raise click.BadParameter("--replication is for --bootstrap's cluster (the embedded "
                                 "broker has one node; --kafka-nodes sets its own)",
                                 param_hint="--replication")
    with registry_errors():
        figures = bench_roundtrips(writes=writes, sizes=sizes, graph_bytes=graph_bytes,
                                   rounds=rounds, long_batches=long_batches,
                                   replication=replication, kafka_nodes=nodes,
                                   bootstrap=settings.kafka if settings.bootstrap else None,
                                   progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_roundtrips(figures))


@bench.command("image")
@click.option("--events", type=click.IntRange(1000), default=1_000_000, show_default=True,
              help="Records to fold (the soak's mix), no broker.")
@click.option("--jobs", type=click.IntRange(1), default=1000, show_default=True,
              help="Live jobs kept.")
@click.option("--rate", type=click.IntRange(1), default=200, show_default=True,
              help="Records per second of broker time (1,000 jobs checkpointing every 10 s "
                   "write about 200/s).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the write mix.")
def bench_image_cmd(events: int, jobs: int, rate: int, seed: int) -> None:
    """Is the image bounded by live state? Folds a long synthetic log of the soak's mix (no
    broker) and prints the image's size per live job, and what the duplicate window and the
    terminal job ids add to it."""
    from registry.dev.bench_soak import bench_image, format_image

    figures = bench_image(events=events, jobs=jobs, rate=rate, seed=seed,
                          progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_image(figures))


# -- read commands: replay the log (broker or dump) and print ----------------------------------


@contextlib.contextmanager
def _reading(settings: Settings) -> Iterator[Forensics]:
    """A Forensics for a read command; errors become one line, the progress bar is ended."""
    from registry.errors import UnknownJob
    from registry.forensics import NoRecords, namespaces_on

    with registry_errors():
        f = settings.forensics()
        try:
            yield f
        except UnknownJob as e:  # report --job: exit 3, as timeline and explain
            raise CliError(str(e), EXIT_NOT_FOUND) from e
        except NoRecords as e:  # a mistyped --namespace: say which namespaces there are
            others = namespaces_on(settings.kafka, settings.topic, settings.timeout)
            raise CliError(f"{e} (namespaces with records there: "
                           f"{', '.join(others) or 'none'})", EXIT_NOT_FOUND) from e
        finally:
            if isinstance(f.progress, ProgressBar):
                f.progress.done()


def _decision_rows(decisions: list[Any], with_job: bool = True) -> str:
    from registry.render import format_time, table

    headers = ["offset", "time", "type", *(["job"] if with_job else []), "epoch", "writer",
               "outcome", "reason"]
    return table(headers, ([d.offset, format_time(d.timestamp), d.event_type,
                            *([d.job_id] if with_job else []), d.epoch, d.writer, d.outcome,
                            _why(d)] for d in decisions))


def _why(d: Any) -> str | None:
    """The table's reason: the fold's code and why for a refused or ignored record, what
    its writer said for an accepted one (the reason given to a cancel, a recovery's error,
    a checkpoint failure's Flink reason). JSON keeps the two apart (``reason``, ``detail``)."""
    if d.reason is not None:
        return f"{d.reason}: {d.detail}" if d.detail else d.reason
    said = d.detail.removeprefix("reason: ")
    return said or None


def _jobs_table(image: Any, include_terminal: bool,
                checkpointed: Mapping[str, int] | None = None) -> str:
    from registry.render import format_time, table

    views = sorted((v for v in image.jobs.values() if include_terminal or v.live),
                   key=lambda v: v.job_id)
    if not views:
        ended = sum(1 for v in image.jobs.values() if not v.live)
        return "(no jobs)" if include_terminal or not ended else (
            f"(no live jobs; {ended} ended: --all shows them)")
    checkpointed = checkpointed or {}
    headers = ["job", "status", "owner epoch", "last checkpoint", "checkpoint state at",
               "checkpoint failures", "error"]
    rows = [[v.job_id, v.status + (" (cleanup pending)" if v.dirty else ""), v.owner_epoch,
             v.checkpoints.last_completed if v.checkpoints.last_completed >= 0 else None,
             format_time(checkpointed.get(v.job_id)),
             f"{v.checkpoints.consecutive_failures}/{v.max_checkpoint_failures}"
             + (" OVER BUDGET" if v.over_budget else ""), v.error] for v in views]
    if include_terminal:  # why each ended job ended
        headers.append("reason")
        for row, v in zip(rows, views, strict=True):
            row.append(v.reason)
    return table(headers, rows)


@main.command()
@click.option("--all", "include_terminal", is_flag=True,
              help="Include terminal jobs (cancelled, finished, failed).")
@pass_settings
def jobs(settings: Settings, include_terminal: bool) -> None:
    """The namespace's jobs now: live ones, or every one with --all. For each, the last
    completed checkpoint and when the record the job's checkpoint state stands on was
    written (a live job whose checkpoint state stopped changing stands out)."""
    from registry.render import format_time, state_json

    checkpointed = _CheckpointTimes()
    with _reading(settings) as f:
        image = f.replay(on_decision=checkpointed.note)
    state = state_json(image, include_terminal=include_terminal)
    for job in state["jobs"]:
        cp = image.jobs[job["job_id"]].checkpoints.last_completed
        at = checkpointed.at.get(job["job_id"])
        job.update(last_completed_checkpoint=cp if cp >= 0 else None,
                   checkpoint_state_at=at, checkpoint_state_time=format_time(at))
    settings.emit("jobs", {"namespace": image.namespace, "last_offset": state["last_offset"],
                           "jobs": state["jobs"]},
                  lambda: _jobs_table(image, include_terminal, checkpointed.at))


class _CheckpointTimes:
    """Per job, the stamp of the newest accepted record under one of its checkpoint record
    keys (the one its checkpoint state stands on, or one written after it: never collected
    before a newer one holds the state, so present in every compacted log)."""

    def __init__(self) -> None:
        self.at: dict[str, int] = {}

    def note(self, d: Any) -> None:
        if d.job_id is not None and d.accepted and d.timestamp is not None \
                and d.timestamp >= 0 and d.key is not None and "/checkpoint/" in d.key:
            self.at[d.job_id] = d.timestamp


@main.command()
@pass_settings
def leader(settings: Settings) -> None:
    """Who leads the namespace now: epoch, leader, whether the term was revoked."""
    with _reading(settings) as f:
        image = f.replay()

    def human() -> str:
        if image.leader is None:
            return f"namespace {image.namespace!r} has never had a leader"
        state = "revoked, no leader now" if image.revoked else "leading"
        return f"epoch {image.epoch}: {image.leader} ({state})"

    settings.emit("leader", {"namespace": image.namespace, "epoch": image.epoch,
                             "leader": image.leader, "revoked": image.revoked,
                             "last_offset": image.provenance.last_offset}, human)


@main.command()
@pass_settings
def terms(settings: Settings) -> None:
    """Every leadership term: leader, how and when it started and ended (the record times of
    its grant and of the revoke or next grant, UTC), its duration, span and write counts.

    A time the log does not give (a record without a stamp) shows as "unknown".
    """
    from registry.render import table, term_json, term_times

    with _reading(settings) as f:
        found = f.terms()
    settings.emit("terms", {"namespace": f.namespace, "terms": [term_json(t) for t in found]},
                  lambda: table(["epoch", "leader", "started", "ended", "from (UTC)",
                                 "until (UTC)", "duration", "first", "last", "accepted",
                                 "rejected"],
                                ([t.epoch, t.leader, t.started, t.ended, *term_times(t),
                                  t.first_offset, t.last_offset, t.accepted, t.rejected]
                                 for t in found), right=(6, 7, 8, 9, 10))
                  if found else "(no terms)")


@main.command()
@click.argument("job", callback=_check_job_id)
@pass_settings
def timeline(settings: Settings, job: str) -> None:
    """Every record about JOB in log order, with the fold's verdict and reason.

    Exits 3 if no record mentions JOB.
    """
    from registry.render import decision_json

    with _reading(settings) as f:
        found = f.timeline(job)
    settings.emit("timeline", {"namespace": f.namespace, "job_id": job,
                               "records": [decision_json(d) for d in found]},
                  lambda: _decision_rows(found, with_job=False) if found
                  else f"no record mentions job {job!r}")
    if not found:
        raise SystemExit(EXIT_NOT_FOUND)


@main.command()
@click.argument("job", callback=_check_job_id)
@pass_settings
def explain(settings: Settings, job: str) -> None:
    """Why JOB is in its current state: the record that put it there, what was refused.

    Exits 3 if no record mentions JOB.
    """
    from registry.render import job_json

    with _reading(settings) as f:
        image, found = f.job_history(job)
        text = f.explain_from(image, found, job)
    view = image.jobs.get(job)
    settings.emit("explain", {"namespace": f.namespace, "job_id": job,
                              "job": job_json(view) if view is not None else None,
                              "explanation": text}, lambda: text)
    if not found:
        raise SystemExit(EXIT_NOT_FOUND)


@main.command()
@pass_settings
def rejected(settings: Settings) -> None:
    """Every record the fold refused, with who wrote it and why."""
    from registry.render import decision_json

    with _reading(settings) as f:
        found = f.rejected()
    settings.emit("rejected", {"namespace": f.namespace,
                               "records": [decision_json(d) for d in found]},
                  lambda: _decision_rows(found) if found else "(no refused records)")


@main.command()
@pass_settings
def quarantine(settings: Settings) -> None:
    """Every record the fold could not decode (kept in the log, without effect)."""
    from registry.render import decision_json, format_time, table

    with _reading(settings) as f:
        found = f.quarantined()
    settings.emit("quarantine", {"namespace": f.namespace,
                                 "records": [decision_json(d) for d in found]},
                  lambda: table(["offset", "time", "key", "reason", "detail"],
                                ([d.offset, format_time(d.timestamp), d.key, d.reason,
                                  d.detail] for d in found))
                  if found else "(no quarantined records)")


@main.command()
@click.option("--offset", type=click.IntRange(-1), default=None,
              help="The image after the record at this offset (-1: before any record).")
@click.option("--time", "at_time", callback=_time_option, metavar="T", default=None,
              help="The image after every record stamped at or before T (ISO 8601, UTC "
                   "unless a zone is given, or ms since the Unix epoch).")
@click.option("--all", "include_terminal", is_flag=True, help="Include terminal jobs.")
@pass_settings
def state(settings: Settings, offset: int | None, at_time: int | None,
          include_terminal: bool) -> None:
    """What the registry believed at an offset or a time: leader, epoch, jobs.

    Give exactly one of --offset and --time. Time is the broker's stamp on
    each record (LogAppendTime); the README says what that means.
    """
    from registry.render import format_time, state_json

    if (offset is None) == (at_time is None):
        raise click.UsageError("give exactly one of --offset N and --time T")
    with _reading(settings) as f:
        image = f.state_at(offset=offset, time=at_time)
    payload = {"at": {"offset": offset, "time": format_time(at_time)},
               **state_json(image, include_terminal=include_terminal)}

    def human() -> str:
        p = image.provenance
        # The last record at or before the offset asked for: offsets are not dense
        # (transaction markers take offsets, compaction removes records).
        where = (f"after offset {p.last_offset}" if p.last_offset >= 0 else "before any record")
        if offset is not None and 0 <= p.last_offset < offset:
            where += (f" (the last record at or before {offset}; offsets are not dense: "
                      "transaction markers take offsets, compaction removes records)")
        lead = ("no leader" if image.leader is None else
                f"epoch {image.epoch}, {image.leader}" + (" (revoked)" if image.revoked else ""))
        stamp = format_time(p.log_time)
        return (f"namespace {image.namespace!r} {where}"
                + (f" (stamped {stamp})" if stamp else "") + f": {lead}\n"
                + _jobs_table(image, include_terminal))

    settings.emit("state", payload, human)


_FORCE = click.option("--force", is_flag=True,
                       help="Replace the file even if it is not one jobreg wrote (by "
                            "default only a jobreg dump or report is replaced).")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, writable=True))
@_FORCE
@pass_settings
def dump(settings: Settings, file: str, force: bool) -> None:
    """Write the namespace's records to FILE (Avro container, writer schemas embedded, an
    end marker with a SHA-256 of the records; the umask's permissions).

    Every read command replays it with --from-file FILE, with no broker. An existing FILE
    is replaced only if it is a jobreg dump, or with --force.
    """
    with _reading(settings) as f:
        count = f.dump(file, topic=settings.topic if settings.from_file is None else
                       getattr(f.source, "topic", ""), force=force)
    span = (f" (offsets {count.first_offset} to {count.last_offset}: commit markers and other "
            "namespaces' records take offsets too)" if count.first_offset is not None else "")
    settings.emit("dump", {"namespace": f.namespace, "file": file, "records": int(count),
                           "first_offset": count.first_offset,
                           "last_offset": count.last_offset},
                  lambda: f"wrote {count:,} records of namespace {f.namespace!r} to {file}"
                  + span)


@main.command()
@click.option("--out", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The HTML file to write (self-contained: it makes no network request).")
@click.option("--job", "jobs_", multiple=True, callback=_check_job_id,
              help="A job to draw and explain (repeatable). Default: every job in the window.")
@click.option("--since", callback=_time_option, metavar="T", default=None,
              help="Draw records stamped at or after T (ISO 8601 or ms).")
@click.option("--until", callback=_time_option, metavar="T", default=None,
              help="Draw records stamped at or before T (ISO 8601 or ms).")
@_FORCE
@pass_settings
def report(settings: Settings, out: str, jobs_: tuple[str, ...], since: int | None,
           until: int | None, force: bool) -> None:
    """Write an incident report: one HTML file that opens with a summary of what happened,
    then the timeline as a picture (terms as bands, jobs as lanes, refused and quarantined
    records highlighted) and the explanation of every job with something to explain (or of
    each --job). An existing file is replaced only if it is a jobreg report, or with
    --force."""
    if since is not None and until is not None and since > until:
        raise click.BadParameter("--since is after --until", param_hint="--since")
    from registry.report import write_report

    with _reading(settings) as f:
        path = write_report(f, out, jobs=list(jobs_) or None, since=since, until=until,
                            force=force)
    settings.emit("report", {"namespace": f.namespace, "file": str(path)},
                  lambda: f"wrote {path}")


# -- audit: the SQL views the streaming job keeps -------------------------------------------

_DB_OPTION = click.option(
    "--db", "db_url", envvar="JOBREG_AUDIT_DB", default="sqlite:///jobreg-audit.db",
    show_default=True, metavar="URL",
    help="The audit database (SQLAlchemy URL: sqlite:///file.db or "
         "postgresql://user@host/db). [env: JOBREG_AUDIT_DB]")

def _need_bootstrap(settings: Settings) -> str:
    if settings.bootstrap is None:
        raise CliError("say where the log is: --bootstrap HOST:PORT (or $JOBREG_BOOTSTRAP)",
                       EXIT_USAGE)
    return settings.bootstrap


def _print_rows(settings: Settings, what: str, columns: list[str],
                rows: list[tuple[Any, ...]], *, truncated: bool = False) -> None:
    from registry.render import format_time, table

    # For people, times read as everywhere else (ISO 8601 UTC); JSON keeps the stored ms.
    times = {i for i, c in enumerate(columns) if c == "log_time" or c.endswith(("_time", "_at"))}

    def shown(row: tuple[Any, ...]) -> list[Any]:
        return [format_time(v) if i in times and isinstance(v, int) else v
                for i, v in enumerate(row)]

    plural = "s" * (len(rows) != 1)
    if truncated and not rows:
        count = "--limit 0: no row shown; the query has rows"
    elif truncated:
        count = f"{len(rows)} row{plural} shown; there are more: raise --limit"
    else:
        count = f"{len(rows)} row{plural}"
    settings.emit(what, {"columns": columns, "rows": [list(r) for r in rows],
                         "truncated": truncated},
                  lambda: table(columns, [shown(r) for r in rows]) + f"\n({count})"
                  if columns else "(no rows)")


@main.group()
def audit() -> None:
    """SQL audit views of the registry log, kept by a Spark Structured Streaming job."""


@audit.command("migrate")
@_DB_OPTION
@pass_settings
def audit_migrate(settings: Settings, db_url: str) -> None:
    """Create or upgrade the audit schema (alembic upgrade head)."""
    from registry.audit.db import current_revision, migrate

    with registry_errors():
        migrate(db_url)
        revision = current_revision(db_url)
    settings.emit("audit-migrate", {"db": db_url, "revision": revision},
                  lambda: f"audit database at revision {revision}")


@audit.command("run")
@_DB_OPTION
@click.option("--once/--follow", default=True, show_default=True,
              help="--once: everything in the log now, then stop (availableNow); --follow: "
                   "keep going (processing-time trigger) until Ctrl-C or SIGTERM, which let "
                   "the batch at work finish.")
@click.option("--interval", default="1 second", show_default=True,
              help="The processing-time trigger of --follow.")
@click.option("--max-offsets-per-trigger", type=click.IntRange(1), default=100_000,
              show_default=True, help="Most records per micro-batch.")
@click.option("--source", type=click.Choice(["auto", "python", "kafka"]), default="auto",
              show_default=True,
              help="kafka: Spark's built-in source (its connector from --kafka-jars, the "
                   "launch's classpath, or Maven Central, fetched once into ~/.cache/jobreg); "
                   "python: jobreg-kafka over confluent-kafka; auto: kafka when its connector "
                   "can be had. The run says which, and why, in its first line.")
@click.option("--kafka-jars", envvar="JOBREG_SPARK_KAFKA_JARS", default=None,
              metavar="PATHS",
              help="Spark's Kafka connector and its dependencies, for a machine without "
                   "Maven Central: jar files or folders of jars, comma-separated. "
                   "[env: JOBREG_SPARK_KAFKA_JARS]")
@click.option("--plain", is_flag=True,
              help="No Spark: the same fold and writes from plain Python.")
@click.option("--master", envvar="JOBREG_SPARK_MASTER", default=None,
              help="The Spark master (local[N], spark://HOST:PORT, ...). Default: what "
                   "spark-submit, PYSPARK_SUBMIT_ARGS or spark-defaults.conf says, else "
                   "local[2]. [env: JOBREG_SPARK_MASTER]")
@click.option("--spark-conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="A Spark setting (repeatable); wins over spark-defaults.conf and --conf.")
@click.option("--driver-host", default=None, metavar="HOST",
              help="The driver's address that executors connect to (spark.driver.host); "
                   "on a cluster, one the worker hosts reach.")
@click.option("--executor-timeout", type=click.FloatRange(1, 86400), default=120.0,
              show_default=True,
              help="On a cluster: seconds to wait for the first executor to register.")
@click.option("--verbose", "-v", is_flag=True,
              help="On failure, print the whole error (Spark's and Python's traces) after "
                   "the one-line cause.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="With --follow: serve the job's metrics (Prometheus) at "
                   "http://HOST:PORT/metrics while it runs (README \"Metrics\").")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="The address --metrics-port listens on.")
@pass_settings
def audit_run(settings: Settings, db_url: str, once: bool, interval: str,
              max_offsets_per_trigger: int, source: str, kafka_jars: str | None, plain: bool,
              master: str | None,
              spark_conf: tuple[str, ...], driver_host: str | None, executor_timeout: float,
              verbose: bool, metrics_port: int | None, metrics_host: str) -> None:
    """Materialize the audit tables from the topic, exactly once (migrates first, once the
    broker has answered)."""
    from registry.extras import needs
    from registry.log import topic_partitions

    with needs("audit", "jobreg audit run"):
        from sqlalchemy.engine import make_url

    _need_bootstrap(settings)
    conf: dict[str, str] = {}
    for item in spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--spark-conf")
        conf[key.strip()] = value.strip()
    if driver_host is not None:
        conf["spark.driver.host"] = driver_host
    if plain and (conf or master or kafka_jars):
        raise click.BadParameter("Spark settings without Spark", param_hint="--plain")
    if metrics_port is not None and once:
        raise click.BadParameter("metrics are served while a --follow run lasts",
                                 param_hint="--metrics-port")
    bootstrap = settings.kafka  # the address and the --command-config properties
    with registry_errors():  # the broker and the topic first: the database is not touched
        topic_partitions(settings.kafka, settings.topic, settings.timeout)  # until they answer
    try:
        shown_db = make_url(db_url).render_as_string(hide_password=True)
    except Exception:  # malformed: migrate() says so
        shown_db = db_url
    stop = threading.Event()

    def note(batch_id: int, records: int) -> None:
        if not settings.as_json:
            click.echo(f"batch {batch_id}: {records:,} records", err=True)

    # Ctrl-C, and a container's stop (SIGTERM), end a follow run between batches.
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)} if not once else {}
    server: MetricsServer | None = None
    try:
        with registry_errors():
            from consumers.audit_job import materialize

            if metrics_port is not None:
                from registry.metrics import serve

                server = serve(metrics_port, metrics_host)
                if not settings.as_json:
                    click.echo(f"metrics at http://{metrics_host}:{metrics_port}/metrics",
                               err=True)

            spark: dict[str, Any] = {}
            if not plain:
                from consumers.audit_job import choose_source
                from registry.dev.kafka import spark_kafka_jars

                def say(line: str) -> None:
                    if not settings.as_json:
                        click.echo(line, err=True)

                try:  # the connector's jars: fetched once, or named
                    choice = choose_source(source, bootstrap, named_jars=kafka_jars,
                                           fetch=lambda version, download: spark_kafka_jars(
                                               version, say, download=download))
                except ConfigError as e:  # --kafka-jars, or settings --source kafka can't pass
                    raise CliError(str(e), EXIT_USAGE) from e
                spark = {"interval": interval, "source": choice.source, "jars": choice.jars,
                         "why": choice.why, "announce": say,
                         "max_offsets_per_trigger": max_offsets_per_trigger,
                         "master": master, "spark_conf": conf,
                         "executor_timeout": executor_timeout}
            run = materialize(db_url, bootstrap, settings.topic,
                              engine="plain" if plain else "spark",
                              mode="once" if once else "follow", stop_event=stop,
                              on_batch=note, timeout=settings.timeout, **spark)
            result = {"batches": run.batches, "records": run.records,
                      "caught_up": run.caught_up, "seconds": round(run.seconds, 3),
                      "source": run.source}
            if not plain:
                result["startup_seconds"] = round(run.startup, 3)
    except CliError as e:
        detail = getattr(e.__cause__, "detail", None)  # a failed stream's whole text
        if detail:
            if verbose:
                click.echo(detail, err=True)
            else:
                raise CliError(f"{e.message} (the whole error: --verbose)",
                               e.exit_code) from e.__cause__
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.stop()
    settings.emit("audit-run", {"db": shown_db, **result},
                  lambda: f"wrote {result['records']:,} records in {result['batches']} "
                          f"batches to {shown_db} ({result['source']}, "
                          f"{result['seconds']:.1f} s"
                          + (f", of which {result['startup_seconds']:.1f} s starting Spark "
                             "before the first record: --plain skips it"
                             if "startup_seconds" in result else "") + ")")


@audit.command("query")
@click.argument("sql")
@_DB_OPTION
@click.option("--limit", type=click.IntRange(0), default=1000, show_default=True,
              help="Most rows printed.")
@pass_settings
def audit_query(settings: Settings, sql: str, db_url: str, limit: int) -> None:
    """Run one read-only SQL statement; the database itself refuses any write."""
    from registry.audit.db import query

    with registry_errors():
        columns, rows = query(db_url, sql, limit=limit + 1)  # one more: are there more?
    _print_rows(settings, "audit-query", columns, rows[:limit], truncated=len(rows) > limit)


@audit.command("check")
@_DB_OPTION
@click.option("--from-file", "dumps", multiple=True, metavar="DUMP",
              type=click.Path(exists=True, path_type=Path),
              help="Check against dumps (jobreg dump) instead of the broker: a dump file or a "
                   "directory of them (*.avro); repeatable. Each dump's namespace is checked; "
                   "namespaces with rows but no dump are listed as not checked.")
@pass_settings
def audit_check(settings: Settings, db_url: str, dumps: tuple[Path, ...]) -> None:
    """Compare the audit database with the library's fold at the same offsets; exit 1 on any
    difference.

    The log comes from the broker (--bootstrap) or from dumps (--from-file, here or before
    the command): after `jobreg demo`, whose broker is gone,
    `jobreg audit check --db sqlite:///jobreg-demo/audit.db --from-file jobreg-demo/dumps`.
    """
    from registry.audit.writer import check, check_dumps
    from registry.forensics import DumpSource

    files = [f for p in dumps for f in (sorted(p.glob("*.avro")) if p.is_dir() else [p])]
    if settings.from_file is not None:
        files.append(Path(settings.from_file))
    if dumps and not files:
        raise CliError(f"no dump (*.avro) in {', '.join(str(p) for p in dumps)}", EXIT_USAGE)
    unchecked: list[str] = []
    with registry_errors():
        if files:
            sources = [DumpSource(f) for f in files]
            twice = sorted({s.namespace for s in sources
                            if sum(t.namespace == s.namespace for t in sources) > 1})
            if twice:
                raise CliError(f"several dumps of namespace(s) {', '.join(twice)}: give one "
                               "each", EXIT_USAGE)
            diffs, unchecked = check_dumps(db_url, sources, topic=settings.topic)
        else:
            _need_bootstrap(settings)
            diffs = check(db_url, settings.kafka, settings.topic, timeout=settings.timeout,
                          partitions=settings.partitions)

    def human() -> str:
        lines = diffs or ["the audit database agrees with the fold"
                          + (f" of {len(files)} dump(s)" if files else "")]
        if unchecked:
            lines.append(f"not checked (no dump given): {', '.join(unchecked)}")
        return "\n".join(lines)

    settings.emit("audit-check", {"db": db_url, "ok": not diffs, "differences": diffs,
                                  "unchecked": unchecked}, human)
    if diffs:
        raise SystemExit(EXIT_ERROR)


def _named(name: str, named: NamedQuery) -> None:
    @audit.command(name, help=named.doc)
    @_DB_OPTION
    @pass_settings
    def command(settings: Settings, db_url: str) -> None:
        from registry.audit.db import query

        with registry_errors():
            columns, rows = query(db_url, named.sql)
        _print_rows(settings, f"audit-{name}", columns, rows)
        if named.must_be_empty and rows:
            raise SystemExit(EXIT_ERROR)


for _name, _query in NAMED_QUERIES.items():
    _named(_name, _query)


@audit.command("grant-reader")
@click.argument("name")
@_DB_OPTION
@click.option("--password-file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="JOBREG_AUDIT_READER_PASSWORD_FILE", metavar="FILE",
              help="A file holding the login's password (a Docker secret). Else "
                   "$JOBREG_AUDIT_READER_PASSWORD, else a prompt (never echoed). "
                   "[env: JOBREG_AUDIT_READER_PASSWORD_FILE]")
@pass_settings
def audit_grant_reader(settings: Settings, name: str, db_url: str,
                       password_file: Path | None) -> None:
    """Create the PostgreSQL login NAME that only reads the audit views (a member of
    jobreg_audit_reader and nothing else); run with an admin's --db. Again for a login that
    is already such a reader: sets its password. `audit query` refuses any login that can
    do more than read."""
    import os

    from registry.audit.readers import check_reader_name, grant_reader

    with registry_errors(EXIT_USAGE):
        check_reader_name(name)
    if password_file is not None:
        try:
            # stripped, as $JOBREG_AUDIT_DB_PASSWORD_FILE is read: one file serves both
            password = password_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"cannot read the password of {name!r} from {password_file}: "
                           f"{getattr(e, 'strerror', None) or e}", EXIT_USAGE) from None
    elif os.environ.get("JOBREG_AUDIT_READER_PASSWORD"):
        password = os.environ["JOBREG_AUDIT_READER_PASSWORD"]
    else:
        password = click.prompt(f"password of {name}", hide_input=True,
                                confirmation_prompt=True, err=True)
    with registry_errors():
        login = grant_reader(db_url, name, password)
    settings.emit("audit-grant-reader", {"role": login.role, "created": login.created,
                                         "url": login.url},
                  lambda: f"{'created' if login.created else 'updated the password of'} reader "
                          f"login {login.role} (a member of jobreg_audit_reader only); query "
                          f"with --db {login.url} and its password in the URL or in "
                          "$JOBREG_AUDIT_DB_PASSWORD_FILE")


# -- the fuzz campaign ------------------------------------------------------------------------


@main.command()
@click.option("--cases", type=click.IntRange(1), default=1000, show_default=True,
              help="Cases per target.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the draws (the same seed tries the same cases).")
@click.option("--target", "targets", multiple=True, type=click.Choice(["dump", "record",
                                                                        "properties"]),
              help="Fuzz only these targets (repeatable; default: all three).")
@click.option("--seconds", type=click.FloatRange(1), default=None,
              help="Stop each target when its share of this time is up (default: no limit).")
def fuzz(cases: int, seed: int, targets: tuple[str, ...], seconds: float | None) -> None:
    """The fuzz campaign: real dumps, records and --command-config files, mutated (bit flips,
    truncations, insertions, overwrites, splices) and fed to jobreg's own entry points;
    checks one line on stderr, a documented exit status, no traceback, no file written.
    Starts an embedded broker for the seed log. Progress on stderr, the figures on stdout.

    Exits 1 if any case broke a rule (each distinct finding is printed once).
    """
    from registry.dev.fuzz import TARGETS, format_result, run_campaign

    with registry_errors():
        result = run_campaign(main, cases, seed=seed, targets=targets or TARGETS,
                              seconds=seconds,
                              progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_result(result))
    if result.findings:
        raise SystemExit(EXIT_ERROR)


# -- the bounded checker of the rules ----------------------------------------------------------


@main.command()
@click.option("--depth", type=click.IntRange(1, 40), default=4, show_default=True,
              help="Histories of at most this many ops (every one up to 12).")
@click.option("--jobs", type=click.IntRange(1, 2), default=None,
              help="Job names the ops use (default: the alphabet's, 2).")
@click.option("--alphabet", type=click.Choice(["ci", "wide", "full", "ends", "calls",
                                               "copies", "checkpoints"]),
              default="ci", show_default=True,
              help="ci: CI's (raw records at the current epoch under the leader's name, one "
                   "per history); wide: raw records at every epoch under either name, one per "
                   "history; full: everything, without limits; ends: one job, junk over its "
                   "keys and re-sends, for going deep with --below; calls: two jobs, calls, "
                   "junk over the newest call's commit, for going deep below a call; copies: "
                   "ends with a raw writer's verbatim copies of its own records, over a "
                   "job's keys and under their own; checkpoints: one job's checkpoint records "
                   "and rescales under junk, two raw records, for going deep below a submit.")
@click.option("--below", default=None, metavar="OPS_JSON",
              help="Only the histories that start with these ops (a JSON list, as a "
                   "reproducer prints them), e.g. an ended job, to go deeper there.")
@click.option("--processes", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Explore the subtrees below histories of up to three ops in this many "
                   "processes.")
@click.option("--walks", type=click.IntRange(1, 10_000_000), default=None,
              help="Instead of every history: this many random histories of --depth ops "
                   "(beyond the exhaustive bound; --depth up to 40), each prefix checked "
                   "alike.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="With --walks: the seed of the random histories.")
@pass_settings
def exhaustive(settings: Settings, depth: int, jobs: int | None, alphabet: str,
               below: str | None, processes: int, walks: int | None, seed: int) -> None:
    """The bounded checker of the fold's rules (no broker): every history up to --depth ops
    (or, with --walks, that many random ones), every compaction cut the lag allows at every
    prefix, every batch split; checks the answer, that no refusal becomes an acceptance,
    that epochs and checkpoint ids only increase and that no failed or discarded checkpoint
    becomes pending again. Progress on stderr every 10 s; the counts and one reproducer per
    counterexample class on stdout (--json: as JSON).

    Exits 1 if any counterexample was found.
    """
    from registry.dev.exhaustive import explore, format_report, sample

    def progress(r: Any) -> None:
        click.echo(f"... {r.histories} histories, {r.prefixes} prefixes, {r.cuts} cuts, "
                   f"{len(r.failures)} counterexample classes", err=True)

    if walks is None and depth > 12:
        raise click.BadParameter(f"{depth} is above 12 for every history (use --walks for "
                                 "deeper random ones)", param_hint="'--depth'")
    if walks is not None and processes > 1:
        raise click.BadParameter("random walks run in one process", param_hint="'--processes'")
    prefix: list[Any] = []
    if below is not None:
        if walks is not None:
            raise click.BadParameter("random walks start from the empty history",
                                     param_hint="'--below'")
        try:
            prefix = json.loads(below)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="'--below'") from None
        if not isinstance(prefix, list) or not all(isinstance(op, list) and op
                                                    for op in prefix):
            raise click.BadParameter("a JSON list of ops (lists), as a reproducer prints "
                                     "them", param_hint="'--below'")
    if walks is not None:
        report = sample(depth, walks, seed, alphabet, jobs, progress=progress)
    else:
        try:
            report = explore(depth, alphabet, jobs, progress=progress, processes=processes,
                             below=prefix)
        except ValueError as exc:  # an op of --below the enumeration does not try there
            raise click.BadParameter(str(exc), param_hint="'--below'") from None
    if settings.as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(format_report(report))
    if report.failures:
        raise SystemExit(EXIT_ERROR)


# -- the fault campaign -----------------------------------------------------------------------


def _host_port(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    for server in value.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise click.BadParameter(f"{server.strip()!r} is not HOST:PORT")
    return value


@main.command()
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the first run (run i uses seed + i).")
@click.option("--runs", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="How many runs.")
@click.option("--seconds", type=click.FloatRange(2, 86_400), default=30.0, show_default=True,
              help="Length of each run (start-up and the final checks come on top).")
@click.option("--processes", type=click.IntRange(2, 16), default=3, show_default=True,
              help="Coordinator processes contending in every namespace.")
@click.option("--writers", type=click.IntRange(1, 32), default=4, show_default=True,
              help="Writer threads per process, sharing its Term of each namespace (1: one "
                   "call at a time per process).")
@click.option("--namespaces", type=click.IntRange(1, 8), default=2, show_default=True,
              help="Namespaces (the first two share a partition).")
@click.option("--lease", type=click.FloatRange(0.5, 60), default=2.0, show_default=True,
              help="The election's lease in seconds (the registry timeout is half of it).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, writable=True),
              default="jobreg-torture", show_default=True,
              help="Folder of the runs: histories, log, verdicts, violations, summaries.")
@click.option("--parallel", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Runs at a time (each with its own broker and folder).")
@click.option("--broker", "torture_broker", type=click.Choice(["embedded", "kafka"]),
              default="embedded", show_default=True,
              help="embedded: Tansu behind a fault proxy (broker pauses, network cuts); "
                   "kafka: three Apache Kafka nodes started here (replication 3, "
                   "min.insync.replicas 2; leader and transaction coordinator kills and "
                   "pauses, node restarts, a node cut off from the others), one cluster "
                   "per --parallel slot, reused by its runs with a fresh topic each.")
@click.option("--kafka", "torture_kafka", is_flag=True, help="Short for --broker kafka.")
@click.option("--bootstrap", "torture_bootstrap", metavar="HOST:PORT", callback=_host_port,
              help="Run against this Kafka instead of an embedded broker (client-side "
                   "faults only; a fresh topic per run, whose deletion is asked afterwards).")
@click.option("--stalls", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="The chance that a worker's thread is held (up to 0.2 s) at each stall "
                   "point of the write path and the election it reaches (registry.stalls): "
                   "interleavings inside one process; 0: none.")
@click.option("--mutate", type=click.Choice(["finding2", "finding3"]),
              help="Put a fixed defect back into the workers' jobreg, to show the campaign "
                   "catches it (issue 42: finding2, reassertions planned past groups in "
                   "flight; finding3, grants comparing epochs only). The run is then "
                   "expected to break rules.")
@click.option("--check", "check_dir", type=click.Path(exists=True, file_okay=False),
              help="Run nothing: check the run (or campaign) folder DIR again.")
@click.option("--selftest", is_flag=True,
              help="Plant each kind of violation into a synthetic run (or into --check DIR) "
                   "and show that the checker names it.")
@pass_settings
def torture(settings: Settings, seed: int, runs: int, seconds: float, processes: int,
            writers: int, namespaces: int, lease: float, out_dir: str, parallel: int,
            torture_broker: str, torture_kafka: bool, torture_bootstrap: str | None,
            stalls: float, mutate: str | None, check_dir: str | None,
            selftest: bool) -> None:
    """The fault campaign: coordinator processes (each of --writers threads calling its Term
    at once) under a nemesis (pauses, kills, a paused broker, network cuts, zombie writes,
    garbage, duplicates; on --kafka, node kills, pauses, restarts and cuts), then an independent checker over their histories and the log. A progress line per run on stderr, a summary table
    on stdout.

    Exits 1 if any run broke a rule (or, with --selftest, if a planted violation was not
    caught).
    """
    from pathlib import Path

    from registry.dev.torture import runner

    def progress(msg: str) -> None:
        click.echo(msg, err=True)

    if torture_kafka:
        torture_broker = "kafka"
    if torture_broker == "kafka" and torture_bootstrap is not None:
        raise CliError("--kafka starts its own cluster: give --bootstrap or --kafka, not both",
                       EXIT_USAGE)

    if selftest:
        from registry.dev.torture.selftest import selftest as run_selftest

        base = Path(check_dir) if check_dir else None
        if base is not None and not (base / "run.json").exists():
            raise CliError(f"{base} is not a run folder (no run.json)", EXIT_USAGE)
        rows = run_selftest(base, Path(out_dir) / "selftest")
        if settings.as_json:
            click.echo(json.dumps({"format": "jobreg.torture-selftest/1", "rows": rows},
                                  indent=2))
        else:
            from registry.render import table

            click.echo(table(["rule", "caught", "planted"],
                             ([r["rule"], {True: "yes", False: "NO", None: "-"}[r["caught"]],
                               r["planted"]] for r in rows)))
        if any(r["caught"] is False for r in rows):
            raise SystemExit(EXIT_ERROR)
        return
    with registry_errors():
        if check_dir is not None:
            summaries = runner.check_folder(check_dir, progress)
            if not summaries:
                raise CliError(f"{check_dir} holds no run (no run.json)", EXIT_USAGE)
        else:
            config = runner.CampaignConfig(
                seed=seed, runs=runs, seconds=seconds, processes=processes,
                writers=writers, namespaces=namespaces, lease=lease, out=Path(out_dir),
                bootstrap=torture_bootstrap, parallel=parallel, broker=torture_broker,
                stalls=stalls, mutate=mutate)
            summaries = runner.campaign(config, progress)
    if settings.as_json:
        click.echo(json.dumps({"format": "jobreg.torture/1", "runs": summaries}, indent=2,
                              default=str))
    else:
        click.echo(runner.format_summary(summaries))
        examples = runner.first_examples(summaries)
        if examples:
            click.echo("\nfirst violation of each rule:")
            for line in examples:
                click.echo(f"  {line}")
    if any(s["violation_count"] or s.get("runner_error") for s in summaries):
        raise SystemExit(EXIT_ERROR)


# -- Flink's high availability ------------------------------------------------------------


class _OneLineUsage(click.Command):
    """A command whose bad command line is one line on stderr (``Error: ...``), exit 2: the
    program that starts it (the Flink bridge's JVM) forwards that line as it is."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise CliError(" ".join(e.format_message().split()), EXIT_USAGE) from None


@main.command("flink-bridge", cls=_OneLineUsage)
@click.option("--contender", required=True, metavar="NAME",
              help="This Flink process's name in the election (a jobreg id).")
@click.option("--lease", type=click.FloatRange(0.5, 3600), default=5.0,
              show_default=True, help="Seconds of the lease (renewed while the JVM is alive).")
@click.option("--poll-ms", "poll_ms", type=click.IntRange(1, 60_000), default=100,
              show_default=True, help="How often watched leader information is re-read.")
@click.option("--metrics-port", "metrics_port", default=None, metavar="PORT[-PORT]",
              help="Serve jobreg's Prometheus metrics of this bridge at /metrics on the first "
                   "free port of this one or range (Flink: high-availability.jobreg."
                   "metrics-port).")
@click.option("--metrics-host", "metrics_host", default="127.0.0.1", show_default=True,
              help="The address the metrics are served on.")
@pass_settings
def flink_bridge(settings: Settings, contender: str, lease: float, poll_ms: int,
                 metrics_port: str | None, metrics_host: str) -> None:
    """Flink's high-availability services on jobreg, for one Flink process: JSON lines on
    stdin (requests) and stdout (answers, events), logs on stderr (protocol v1, README "The
    Flink bridge"). Ends with 0 at EOF on stdin, revoking a term it leads."""
    import logging

    from registry.flink_bridge import Bridge, check_namespace, die_with_parent
    from registry.keys import check_id

    if not settings.namespace_given:
        raise CliError("give --namespace (Flink's sanitized high-availability.cluster-id)",
                       EXIT_USAGE)
    if settings.bootstrap is None:
        raise CliError("give --bootstrap HOST:PORT", EXIT_USAGE)
    try:
        check_namespace(settings.namespace)
        check_id("contender", contender)
    except ConfigError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    die_with_parent()
    # The bridge's own lines and jobreg's warnings (a failed renewal) go to stderr, which the
    # JVM forwards to its log; librdkafka's (registry.kafka: a line per failed connection
    # attempt) do not: what they say reaches the JVM as the answers' and errors' one line.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(lambda record: not record.name.startswith("registry.kafka"))
    logging.getLogger("registry").addHandler(handler)
    logging.getLogger("registry").setLevel(logging.WARNING)
    from registry.client import Registry

    served = None
    collector = None
    if metrics_port is not None:
        from prometheus_client import CollectorRegistry

        from registry.metrics import serve_first

        collector = CollectorRegistry()
        try:
            served = serve_first(metrics_port, metrics_host, collector)
        except ConfigError as e:
            raise CliError(str(e), EXIT_USAGE) from None
        # (the JVM forwards the bridge's stderr to its log)
        print(f"INFO registry.flink_bridge: serving jobreg's metrics on "
              f"http://{served.host}:{served.port}/metrics", file=sys.stderr, flush=True)
    with registry_errors():
        registry = Registry.connect(settings.bootstrap, settings.namespace,
                                    topic=settings.topic, timeout=min(settings.timeout,
                                                                      lease / 2),
                                    client_config=settings.client_config,
                                    partitions=settings.partitions, metrics=collector)

    # Its own buffered stdout (flink_bridge.protocol_stdout): under PYTHONUNBUFFERED a
    # signal while the pipe is full would cut a line.
    bridge = Bridge(registry, contender, lease, poll_ms=poll_ms)

    def _terminate(signum: int, frame: object) -> None:
        # The JVM died (PR_SET_PDEATHSIG): leave as at EOF, which comes with the signal when
        # the JVM dies. Once: a second signal, or one that lands while the bridge is already
        # leaving, must not cut that short, or its revoke is never written and a standby waits
        # out the lease (test_the_bridge_dies_with_its_jvm_and_revokes[sigterm-and-eof]).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if not bridge.closing:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = bridge.run(sys.stdin.buffer)
    except SystemExit:
        code = 0
        # The signal may have landed as run()'s own close() began; closing again is harmless,
        # and no further signal can interrupt it (ignored from the first on).
        bridge.close()
    finally:
        registry.close()
        if served is not None:
            served.stop()
    raise SystemExit(code)


_accept_global_options_anywhere(main)  # last: every command is defined by now

if __name__ == "__main__":
    main(prog_name="jobreg")
