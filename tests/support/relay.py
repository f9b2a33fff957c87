"""A loopback TCP relay in front of the embedded broker: the base of the tests' terminating
proxies (TLS in :mod:`support.tls`, SASL in :mod:`support.sasl_proxy`).

It listens on a free port of 127.0.0.1; the broker behind it advertises that port
(``EmbeddedBroker(advertised_port=relay.port)``), so its Metadata and FindCoordinator answers
send every later connection of a client through the relay too, as a load balancer's address
would be advertised in front of Kafka. Each accepted connection is opened (:meth:`Relay.open`:
a subclass terminates TLS there), connected to :attr:`Relay.target` on 127.0.0.1, handed to
:meth:`Relay.relay` (by default a byte pipe each way), and closed by :meth:`Relay.stop`.
Every thread is a daemon.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """Accepts on 127.0.0.1:``port`` and relays each connection to 127.0.0.1:``target`` (set
    it once the broker behind it listens). Stopped by :meth:`stop`."""

    name = "relay"

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.target: int | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name=self.name).start()

    def open(self, raw: socket.socket) -> socket.socket | None:
        """The client's end of an accepted connection, ready for Kafka bytes (``None``: drop
        it; the subclass closed it)."""
        return raw

    def relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Move the bytes of one connection until either side ends it."""
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        pump(upstream, client)

    def stop(self) -> None:
        """Stop accepting and close every connection (idempotent)."""
        with self._lock:
            self._stopped = True
            self._server.close()
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self._server.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        client = self.open(raw)
        if client is None:
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target or 1))
        except OSError:
            client.close()
            return
        with self._lock:
            if self._stopped:
                client.close()
                upstream.close()
                return
            self._open += [client, upstream]
        try:
            self.relay(client, upstream)
        finally:
            close(client, upstream)


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends; then shut both down."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def close(*sockets: socket.socket) -> None:
    """Shut down and close ``sockets``, whatever state they are in."""
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()
