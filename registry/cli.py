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
import signal
import threading
from collections.abc import Iterator

import click

from registry.errors import RegistryError

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "CliError", "main", "registry_errors"]

EXIT_OK = 0
EXIT_ERROR = 1  # the registry or the broker reported an error
EXIT_USAGE = 2  # bad command line (click's own code), or no broker binary installed


class CliError(click.ClickException):
    """An error for people: click prints ``Error: <message>`` to stderr and exits."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def registry_errors(exit_code: int = EXIT_ERROR) -> Iterator[None]:
    """Turn a :class:`RegistryError` into a :class:`CliError` (message, exit code 1).

    Use as ``with registry_errors(): ...`` inside a command, or as a decorator
    placed below the click decorators.
    """
    try:
        yield
    except RegistryError as e:
        raise CliError(str(e), exit_code) from e


@click.group(
    epilog="Exit codes: 0 ok; 1 error reported by the registry or the broker; "
    "2 usage error (or the broker binary is not installed)."
)
@click.version_option(package_name="jobreg", prog_name="jobreg")
def main() -> None:
    """jobreg: an event-sourced job registry on a compacted Kafka log."""


@main.command()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port to listen on (127.0.0.1 only). Default: a free port.",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Append the broker's output to this file. Default: a temporary file removed on stop.",
)
def broker(port: int | None, log_file: str | None) -> None:
    """Run an embedded Kafka broker (Tansu) in the foreground until Ctrl-C.

    For development and tests only: it listens on 127.0.0.1 and keeps everything
    in memory, so all topics and records are lost when it stops.
    """
    from registry.broker import EmbeddedBroker, find_tansu_binary

    with registry_errors(EXIT_USAGE):
        binary = find_tansu_binary()

    stop_requested = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop_requested.set()

    # Handlers go in before the broker starts: a SIGTERM with the default action
    # would end this process without stopping the broker.
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with registry_errors():
            embedded = EmbeddedBroker(port=port, binary=binary, log_file=log_file).start()
            try:
                click.echo("Embedded Kafka broker (Tansu, in memory: data is lost on stop)")
                click.echo(f"bootstrap: {embedded.bootstrap}")
                click.echo("Ctrl-C to stop")
                while not stop_requested.wait(0.5):
                    embedded.ensure_running()
                click.echo("stopping...", err=True)
            finally:
                embedded.stop()
            click.echo("stopped", err=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@main.command()
def demo() -> None:
    """Play the seeds' incidents live on an embedded broker and check every guarantee.

    Exits 1 if any guarantee did not hold.
    """
    from registry.demo import run_demo

    with registry_errors():
        verdicts = run_demo(click.echo)
    if not all(v.held for v in verdicts):
        raise CliError("a guarantee did not hold (see the verdict table)")


@main.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def catalog(args: tuple[str, ...]) -> None:
    """Maintain the versioned Avro schema catalog: --check, or --update-catalog.

    Exits 1 if --check finds the catalog out of date, 2 for malformed files.
    """
    from registry.codec import main as catalog_main

    raise SystemExit(catalog_main(list(args)))


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
    from registry.bench import bench_core, format_table

    with registry_errors():
        result = bench_core(submits=submits, batch_jobs=batch_jobs, batch_size=batch_size,
                            progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_table(result))


@bench.command("recovery")
@click.option("--events", "log_events", type=click.IntRange(2000), default=100_000,
              show_default=True, help="Events in the log for the start-up comparison.")
def bench_recovery_cmd(log_events: int) -> None:
    """Failover time (claim -> 1,000 and 10,000 jobs adopted); start-up from scratch vs snapshot."""
    from registry.bench import bench_recovery, format_recovery

    with registry_errors():
        figures = bench_recovery(log_events=log_events,
                                 progress=lambda msg: click.echo(f"... {msg}", err=True))
    click.echo(format_recovery(figures))


if __name__ == "__main__":
    main(prog_name="jobreg")
