"""A small fault-injecting TCP proxy (stdlib only, threads): the campaign's network faults.

The tests' network faults use it too (``tests/unit/test_faultproxy.py`` tests it alone).

:class:`FaultProxy` listens on ``127.0.0.1`` and forwards every connection to a
target address. On demand it breaks the network between the two sides:

* :meth:`FaultProxy.blackhole`: a stalled network. Connections stay open but no
  byte moves in either direction; new connections are accepted (and connected to
  the target) but stall too. Nothing is dropped: the proxy stops reading, so the
  bytes wait in the kernel's socket buffers (plus at most one chunk per direction
  already read) and are delivered, in order, by :meth:`FaultProxy.heal`. An end of
  stream (a FIN) is held back the same way; a reset is not (see below).
* :meth:`FaultProxy.cut`: every open connection is reset now (both legs are closed
  with ``SO_LINGER`` 0, so the peers see ``ECONNRESET`` rather than a polite end of
  stream) and new connections are accepted and reset at once, until
  :meth:`FaultProxy.heal`. Bytes in flight on a cut connection are lost, as they
  would be.
* :meth:`FaultProxy.interrupt`: a fault now and :meth:`FaultProxy.heal` after a
  delay, from a background thread.

Each connection is two pump threads, one per direction, moving bytes between
non-blocking sockets with bounded (50 ms) waits, so a fault or :meth:`stop`
takes effect within about 50 ms. If one side resets its connection (an error
rather than an end of stream), both legs are closed at once, even during a
blackhole. Every thread is a daemon, is named ``faultproxy-<port>-...`` and is
joined by :meth:`FaultProxy.stop`.

Typical use, with the embedded broker advertising the proxy's address::

    with FaultProxy(None) as proxy:  # the target is set once the broker listens
        with EmbeddedBroker(advertised_port=proxy.port) as broker:
            proxy.target = ("127.0.0.1", broker.listen_port)
            ...  # clients use broker.bootstrap, i.e. the proxy
            proxy.interrupt(1.0, "cut").join()
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["FaultProxy"]

_HOST = "127.0.0.1"
_TICK = 0.05  # the longest any thread waits before re-checking faults and stop()
_CHUNK = 65536
_CONNECT_TIMEOUT = 2.0
_MODES = ("cut", "blackhole")
_READ = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL
_WRITE = select.POLLOUT | select.POLLERR | select.POLLHUP | select.POLLNVAL


class _Closed(Exception):
    """The connection was closed (by a fault, stop(), or the other pump)."""


def _nodelay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _reset(sock: socket.socket) -> None:
    """Close *sock* so that the peer sees a reset (RST), not an end of stream."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Connection:
    """One client connection and its upstream leg."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._pumps_left = 2

    def close(self, *, reset: bool = False) -> None:
        """Close both legs (idempotent); *reset* makes the peers see RST."""
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
            for sock in (self.client, self.upstream):
                if reset:
                    _reset(sock)
                else:
                    sock.close()
        self.proxy._forget(self)

    def pump_done(self) -> None:
        with self._lock:
            self._pumps_left -= 1
            last = self._pumps_left == 0
        if last:
            self.close()

    def pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Move bytes from *source* to *sink* until an end of stream, an error or a close."""
        proxy = self.proxy
        try:
            while True:
                proxy._wait_flowing(self)
                if not self._wait(source, _READ):
                    continue
                try:
                    data = source.recv(_CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                if not data:  # end of stream: pass it on (after a blackhole heals)
                    proxy._wait_flowing(self)
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)
                    return
                view = memoryview(data)
                while view:
                    proxy._wait_flowing(self)
                    if not self._wait(sink, _WRITE):
                        continue
                    try:
                        sent = sink.send(view)
                    except (BlockingIOError, InterruptedError):
                        continue
                    view = view[sent:]
                    proxy._count(sent)
        except _Closed:
            pass
        except OSError:  # a reset or another error on either leg: close the connection
            self.close()
        finally:
            self.pump_done()

    def _wait(self, sock: socket.socket, events: int) -> bool:
        """Wait up to one tick for *events* on *sock*; raise _Closed once the connection is."""
        if self.closed.is_set() or self.proxy._stopping.is_set():
            raise _Closed
        fd = sock.fileno()
        if fd < 0:
            raise _Closed
        poller = select.poll()
        poller.register(fd, events)
        return bool(poller.poll(_TICK * 1000))


class FaultProxy:
    """Forwards TCP connections from 127.0.0.1:<port> to a target (host, port), with faults on demand.

    :param target: where to forward to; may be ``None`` and set later through
        :attr:`target` (connections accepted meanwhile are closed at once).
    :param port: the port to listen on (``127.0.0.1`` only); ``None`` picks a
        free one at :meth:`start`.
    """

    def __init__(self, target: tuple[str, int] | None, *, port: int | None = None) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535 or None, got {port!r}")
        self._target = target
        self._requested_port = port
        self._port: int | None = port
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._threads: list[threading.Thread] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False  # cut
        self._generation = 0  # bumped by every fault and heal (see interrupt())
        self._stopping = threading.Event()
        self._started = False
        self._bytes = 0
        self._accepted = 0
        self._ids = itertools.count(1)

    # -- state -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The listening port (known once :meth:`start` has bound it, if it was ``None``)."""
        if self._port is None:
            raise RuntimeError("the proxy has no port yet: call start() first")
        return self._port

    @property
    def address(self) -> str:
        """``"127.0.0.1:<port>"``."""
        return f"{_HOST}:{self.port}"

    @property
    def target(self) -> tuple[str, int] | None:
        """Where new connections are forwarded to (settable; open connections keep theirs)."""
        return self._target

    @target.setter
    def target(self, target: tuple[str, int] | None) -> None:
        self._target = target

    @property
    def connections(self) -> int:
        """Client connections currently open (forwarding or stalled)."""
        with self._lock:
            return len(self._connections)

    @property
    def accepted(self) -> int:
        """Client connections accepted so far, including those reset during a cut."""
        with self._lock:
            return self._accepted

    @property
    def bytes_forwarded(self) -> int:
        """Bytes delivered so far, both directions together."""
        with self._lock:
            return self._bytes

    @property
    def mode(self) -> str:
        """``"flowing"``, ``"blackhole"`` or ``"cut"``."""
        with self._lock:
            if self._refusing:
                return "cut"
            return "flowing" if self._flowing.is_set() else "blackhole"

    def __repr__(self) -> str:
        where = self.address if self._port is not None else f"{_HOST}:<auto>"
        return f"<FaultProxy {where} -> {self._target} {self.mode}>"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen and start accepting; returns ``self``."""
        with self._lock:
            if self._started:
                raise RuntimeError("a FaultProxy can be started only once")
            self._started = True
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((_HOST, self._requested_port or 0))
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._spawn("accept", self._accept_loop)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection; join every thread (idempotent).

        :raises RuntimeError: a thread is still alive after *timeout* seconds.
        """
        self._stopping.set()
        self._flowing.set()  # wake anything waiting for a heal
        listener = self._listener
        if listener is not None:
            listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.close()
        # Join until no thread is left: the accept thread may start the pumps of a
        # connection it was opening (they exit at once: the proxy is stopping).
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                alive = [
                    t for t in self._threads if t.is_alive() and t is not threading.current_thread()
                ]
            if not alive or time.monotonic() >= deadline:
                break
            for thread in alive:
                thread.join(max(0.0, deadline - time.monotonic()))
        if alive:
            names = [t.name for t in alive]
            raise RuntimeError(f"FaultProxy threads still alive after {timeout:g}s: {names}")

    def __enter__(self) -> FaultProxy:
        if not self._started:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------

    def blackhole(self) -> None:
        """Stall every connection, open and new, in both directions, until :meth:`heal`."""
        with self._lock:
            self._generation += 1
            self._flowing.clear()

    def cut(self) -> None:
        """Reset every open connection now; reset new ones at once until :meth:`heal`."""
        with self._lock:
            self._generation += 1
            self._refusing = True
            connections = list(self._connections)
        for conn in connections:
            conn.close(reset=True)

    def heal(self) -> None:
        """Forward normally again; bytes stalled by a blackhole are delivered in order."""
        with self._lock:
            self._generation += 1
            self._refusing = False
            self._flowing.set()

    def interrupt(self, seconds: float, mode: str = "cut") -> threading.Thread:
        """Apply *mode* (``"cut"`` or ``"blackhole"``) now and :meth:`heal` after *seconds*.

        The heal runs in the returned (started, daemon) thread. It is skipped if
        another fault or heal happened meanwhile (that call now decides the state),
        or if the proxy is stopped first.
        """
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        getattr(self, mode)()
        with self._lock:
            generation = self._generation

        def heal_later() -> None:
            if self._stopping.wait(seconds):
                return
            with self._lock:
                if self._generation != generation:
                    return
            self.heal()

        return self._spawn("heal", heal_later)

    # -- internals ---------------------------------------------------------------------

    def _spawn(self, role: str, target: Callable[..., object], *args: Any) -> threading.Thread:
        thread = threading.Thread(
            target=target, args=args, name=f"faultproxy-{self._port}-{role}", daemon=True
        )
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    def _count(self, sent: int) -> None:
        with self._lock:
            self._bytes += sent

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _wait_flowing(self, conn: _Connection) -> None:
        """Return once bytes may flow; raise _Closed if *conn* or the proxy closes first."""
        while not self._flowing.wait(_TICK):
            if conn.closed.is_set() or self._stopping.is_set():
                raise _Closed
        if conn.closed.is_set() or self._stopping.is_set():
            raise _Closed

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        poller = select.poll()
        poller.register(listener.fileno(), select.POLLIN)
        while not self._stopping.is_set():
            if not poller.poll(_TICK * 1000):
                continue
            try:
                client, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # the listener was closed by stop()
                return
            with self._lock:
                self._accepted += 1
                refusing = self._refusing
            if refusing or self._target is None:
                _reset(client)
                continue
            self._open(client)

    def _open(self, client: socket.socket) -> None:
        target = self._target
        assert target is not None
        try:
            upstream = socket.create_connection(target, timeout=_CONNECT_TIMEOUT)
        except OSError:
            _reset(client)  # the target is down: so is the proxied service
            return
        for sock in (client, upstream):
            _nodelay(sock)
            sock.setblocking(False)
        conn = _Connection(self, client, upstream)
        with self._lock:
            # A cut or stop() that ran while we connected upstream must not miss this one.
            if self._refusing or self._stopping.is_set():
                refused = True
            else:
                refused = False
                self._connections.add(conn)
        if refused:
            conn.closed.set()
            _reset(client)
            _reset(upstream)
            return
        n = next(self._ids)
        self._spawn(f"c{n}-up", conn.pump, client, upstream)
        self._spawn(f"c{n}-down", conn.pump, upstream, client)
