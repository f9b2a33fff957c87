"""Tests of the fault-injecting TCP proxy (registry/dev/torture/proxy.py) with plain sockets.

An echo server on 127.0.0.1 stands behind the proxy. Every wait is bounded and
every thread (the proxy's, the echo server's, the tests' own) is joined.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from registry.dev.torture.proxy import FaultProxy

TIMEOUT = 5.0  # the longest any single wait in these tests may take


class EchoServer:
    """Echoes every byte back; an end of stream from the client ends the connection."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.accepted = 0
        self._spawn(self._accept_loop)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, name="echo-server", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._spawn(self._echo, conn)

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        with conn:
            while not self.stopping.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    conn.sendall(data)
                except TimeoutError:  # the client stopped reading (a blackhole): keep trying
                    continue
                except OSError:
                    return

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        for thread in self.threads:
            thread.join(TIMEOUT)
        assert not any(t.is_alive() for t in self.threads)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", echo.port)) as p:
        yield p


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, size: int, timeout: float = TIMEOUT) -> bytes:
    deadline = time.monotonic() + timeout
    data = bytearray()
    while len(data) < size:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"end of stream after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


def nothing_arrives(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        data = sock.recv(1)
    except TimeoutError:
        return True
    raise AssertionError(f"expected silence, got {data!r}")


def is_closed_by_peer(sock: socket.socket, timeout: float = TIMEOUT) -> bool:
    """True once the peer has ended or reset the connection (bounded by *timeout*)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionError:  # reset: what a cut does
        return True


def is_refused(proxy: FaultProxy) -> bool:
    """True if a new connection is reset: at connect (the reset can beat the handshake's
    end on loopback) or at the first read."""
    try:
        sock = connect(proxy)
    except ConnectionError:
        return True
    with sock:
        return is_closed_by_peer(sock)


def wait_until(condition, timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def proxy_threads(proxy: FaultProxy) -> list[str]:
    prefix = f"faultproxy-{proxy.port}-"
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


# -- forwarding ----------------------------------------------------------------------------


def test_forwards_both_ways(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        for message in (b"hello", b"x" * 100_000, bytes(range(256))):
            sock.sendall(message)
            assert recv_exactly(sock, len(message)) == message
        assert wait_until(lambda: proxy.connections == 1)
        # (counted just after each send returns, so maybe a moment after the echo arrives)
        assert wait_until(lambda: proxy.bytes_forwarded == 2 * (5 + 100_000 + 256))
        # An end of stream travels too: the echo server sees it and closes its side.
        sock.shutdown(socket.SHUT_WR)
        assert is_closed_by_peer(sock)
    assert wait_until(lambda: proxy.connections == 0)
    assert echo.accepted == 1


def test_many_connections_at_once(proxy: FaultProxy) -> None:
    socks = [connect(proxy) for _ in range(10)]
    try:
        for i, sock in enumerate(socks):
            sock.sendall(f"conn {i}".encode())
        for i, sock in enumerate(socks):
            assert recv_exactly(sock, len(f"conn {i}")) == f"conn {i}".encode()
        assert proxy.connections == 10
    finally:
        for sock in socks:
            sock.close()
    assert wait_until(lambda: proxy.connections == 0)


def test_listens_on_loopback_only(proxy: FaultProxy) -> None:
    assert proxy.address == f"127.0.0.1:{proxy.port}"
    assert proxy._listener.getsockname()[0] == "127.0.0.1"


def test_explicit_port(echo: EchoServer) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with FaultProxy(("127.0.0.1", echo.port), port=port) as proxy, connect(proxy) as sock:
        assert proxy.port == port
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"


def test_target_set_after_start(echo: EchoServer) -> None:
    with FaultProxy(None) as proxy:
        assert is_refused(proxy)  # no target yet: accepted and reset
        proxy.target = ("127.0.0.1", echo.port)
        with connect(proxy) as sock:
            sock.sendall(b"ping")
            assert recv_exactly(sock, 4) == b"ping"


def test_target_down_closes_the_client(echo: EchoServer) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]  # nothing listens there once probe is closed
    with FaultProxy(("127.0.0.1", dead)) as proxy:
        assert is_refused(proxy)
        assert proxy.connections == 0


# -- blackhole -------------------------------------------------------------------------


def test_blackhole_stalls_then_heal_delivers_everything_in_order(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"before")
        assert recv_exactly(sock, 6) == b"before"

        proxy.blackhole()
        assert proxy.mode == "blackhole"
        # From a thread: sendall may block on a stalled network once the socket buffers
        # (up to tens of MB on loopback with autotuning) are full.
        payload = b"".join(i.to_bytes(4, "big") for i in range(500_000))  # 2 MB, ordered
        sent = threading.Event()

        def send() -> None:
            sock.sendall(payload)
            sent.set()

        sender = threading.Thread(target=send, name="test-sender", daemon=True)
        sender.start()
        try:
            assert nothing_arrives(sock, 0.5)
            assert proxy.connections == 1  # the connection stays open
            stalled_at = proxy.bytes_forwarded
            time.sleep(0.1)
            assert proxy.bytes_forwarded == stalled_at

            proxy.heal()
            assert proxy.mode == "flowing"
            assert recv_exactly(sock, len(payload), timeout=10) == payload
        finally:
            sender.join(TIMEOUT)
        assert sent.is_set()


def test_blackhole_stalls_new_connections_too(proxy: FaultProxy, echo: EchoServer) -> None:
    proxy.blackhole()
    with connect(proxy) as sock:  # accepted
        sock.sendall(b"hello")
        assert nothing_arrives(sock, 0.3)
        assert proxy.connections == 1
        proxy.heal()
        assert recv_exactly(sock, 5) == b"hello"


def test_blackhole_holds_back_an_end_of_stream(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"abc")
        assert recv_exactly(sock, 3) == b"abc"
        proxy.blackhole()
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert nothing_arrives(sock, 0.3)
        proxy.heal()
        assert recv_exactly(sock, 10) == b"last words"
        assert is_closed_by_peer(sock)


# -- cut -----------------------------------------------------------------------------------


def test_cut_closes_connections_and_refuses_new_ones_until_heal(proxy: FaultProxy) -> None:
    a, b = connect(proxy), connect(proxy)
    try:
        for sock in (a, b):
            sock.sendall(b"hi")
            assert recv_exactly(sock, 2) == b"hi"
        assert proxy.connections == 2

        proxy.cut()
        assert proxy.mode == "cut"
        assert is_closed_by_peer(a) and is_closed_by_peer(b)
        assert proxy.connections == 0

        for _ in range(3):  # each new connection is accepted, then reset at once
            assert is_refused(proxy)
        assert proxy.connections == 0

        proxy.heal()
        with connect(proxy) as sock:
            sock.sendall(b"again")
            assert recv_exactly(sock, 5) == b"again"
    finally:
        a.close()
        b.close()


def test_cut_of_a_blackholed_connection(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.blackhole()
        sock.sendall(b"lost")
        proxy.cut()
        assert is_closed_by_peer(sock)
    proxy.heal()
    with connect(proxy) as sock:
        sock.sendall(b"fresh")
        assert recv_exactly(sock, 5) == b"fresh"  # nothing of the cut connection leaks in


# -- interrupt -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["cut", "blackhole"])
def test_interrupt_heals_by_itself(proxy: FaultProxy, mode: str) -> None:
    started = time.monotonic()
    healer = proxy.interrupt(0.3, mode)
    assert isinstance(healer, threading.Thread) and healer.daemon
    assert proxy.mode == mode
    healer.join(TIMEOUT)
    assert not healer.is_alive()
    assert time.monotonic() - started >= 0.3
    assert proxy.mode == "flowing"
    with connect(proxy) as sock:
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"


def test_interrupt_blackhole_delivers_after_the_heal(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        healer = proxy.interrupt(0.3, "blackhole")
        sent_at = time.monotonic()
        sock.sendall(b"held")
        assert recv_exactly(sock, 4) == b"held"
        assert time.monotonic() - sent_at >= 0.25
        healer.join(TIMEOUT)


def test_a_later_fault_wins_over_a_pending_heal(proxy: FaultProxy) -> None:
    healer = proxy.interrupt(0.2, "blackhole")
    proxy.cut()  # decided after the interrupt: the timer must not heal it
    healer.join(TIMEOUT)
    assert proxy.mode == "cut"
    proxy.heal()


def test_interrupt_validates_its_arguments(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="mode"):
        proxy.interrupt(1.0, "drop")
    with pytest.raises(ValueError, match="seconds"):
        proxy.interrupt(-1.0)
    assert proxy.mode == "flowing"


# -- stop ------------------------------------------------------------------------------------


def test_stop_leaves_no_thread_behind(echo: EchoServer) -> None:
    proxy = FaultProxy(("127.0.0.1", echo.port)).start()
    socks = [connect(proxy) for _ in range(3)]
    try:
        socks[0].sendall(b"x")
        assert recv_exactly(socks[0], 1) == b"x"
        proxy.blackhole()
        socks[1].sendall(b"stalled bytes")  # a pump thread holds or waits for these
        proxy.interrupt(60, "blackhole")  # a heal thread that would wait a minute
        assert wait_until(lambda: proxy.connections == 3)
        # accept + two pumps per connection + heal (the pumps start just after the count)
        assert wait_until(lambda: len(proxy_threads(proxy)) == 1 + 2 * 3 + 1)
        started = time.monotonic()
        proxy.stop()
        assert time.monotonic() - started < 1.0
        assert proxy_threads(proxy) == []
        for sock in socks:
            assert is_closed_by_peer(sock)
        proxy.stop()  # idempotent
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT).close()
    finally:
        for sock in socks:
            sock.close()
        proxy.stop()


def test_context_manager_stops(echo: EchoServer) -> None:
    with FaultProxy(("127.0.0.1", echo.port)) as proxy, connect(proxy) as sock:
        sock.sendall(b"x")
        assert recv_exactly(sock, 1) == b"x"
    assert proxy_threads(proxy) == []


def test_start_twice_is_an_error(proxy: FaultProxy) -> None:
    with pytest.raises(RuntimeError, match="once"):
        proxy.start()


def test_port_is_validated() -> None:
    with pytest.raises(ValueError, match="port"):
        FaultProxy(("127.0.0.1", 1), port=70000)
    with pytest.raises(RuntimeError, match="start"):
        _ = FaultProxy(("127.0.0.1", 1)).port


def test_no_file_descriptor_leaks(echo: EchoServer) -> None:
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        pytest.skip("needs /proc")
    before = len(os.listdir(fd_dir))
    with FaultProxy(("127.0.0.1", echo.port)) as proxy:
        for _ in range(5):
            with connect(proxy) as sock:
                sock.sendall(b"x")
                assert recv_exactly(sock, 1) == b"x"
        proxy.cut()
        assert is_refused(proxy)
        proxy.heal()
    assert wait_until(lambda: len(os.listdir(fd_dir)) <= before)
