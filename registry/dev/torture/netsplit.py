"""Network namespaces for the nodes of a Kafka cluster, so that one node can be cut off.

Every node of a :class:`~registry.dev.kafka.KafkaCluster` listens on 127.0.0.1 by default,
where nothing can separate one node's traffic from another's: this machine has no
iptables or nftables, and its kernel loads no ``tc`` actions. So each node runs in a
network namespace of its own (:class:`NodeNetwork`), and a cut is a routing change inside
the namespaces this module made, nothing else::

    host namespace                hub namespace              node namespaces
    jrt<tag> 10.A.B.254/24 ==veth== tohost --+
                                        br0 (bridge) --veth-- eth0 10.A.B.1/24  (node 1)
                                            |        --veth-- eth0 10.A.B.2/24  (node 2)
                                            |        --veth-- eth0 10.A.B.3/24  (node 3)

* The nodes reach each other across the hub's bridge; clients (the runner, the workers) reach
  every node from the host namespace over the one host veth. The addresses are private
  (``10.A.B.0/24``, a /24 no address or route of the host overlaps); packets are bridged, never
  forwarded, so nothing outside these namespaces and that veth can reach a node.
* :meth:`NodeNetwork.cut` adds ``blackhole`` routes: in the cut node's namespace one to each
  other node, in every other node's namespace one to the cut node. No packet crosses between
  the cut node and the rest of the cluster in either direction (a connection attempt fails,
  an open connection's segments vanish); clients still reach every node, the cut one
  included: a leader cut off from its followers and from the controller quorum still takes
  client requests, the case a partition is about.
* :meth:`NodeNetwork.heal` deletes exactly the routes :meth:`cut` added;
  :meth:`NodeNetwork.close` deletes the namespaces and the host veth.

Needs root and iproute2's ``ip`` (:func:`unavailable` says why not, in one line).
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import random
import shutil
import subprocess
import threading
import uuid

from registry.errors import BrokerStartError

__all__ = ["NodeNetwork", "unavailable"]


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or ``None`` if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip"
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BrokerStartError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def _taken_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                         check=False).stdout
    out += subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                          text=True, check=False).stdout
    nets = []
    for word in out.split():
        if word[:1].isdigit() and "." in word:
            try:
                nets.append(ipaddress.IPv4Network(word, strict=False))
            except ValueError:
                continue
    return nets


def _free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    taken = [n for n in _taken_networks() if n.prefixlen > 0]
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{rng.randint(100, 199)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise BrokerStartError("no free private /24 under 10.100.0.0/9 for the node namespaces")


class NodeNetwork:
    """``nodes`` network namespaces bridged together and to this one (module docstring).

    :attr:`hosts` and :attr:`names` are each node's address and namespace, in node order
    (node ``i + 1`` is index ``i``), to give :class:`~registry.dev.kafka.KafkaCluster` as
    ``hosts`` and ``netns``.
    """

    def __init__(self, nodes: int) -> None:
        self.size = nodes
        self.tag = uuid.uuid4().hex[:6]
        self.hub = f"jrt-{self.tag}-hub"
        self.names = [f"jrt-{self.tag}-n{i + 1}" for i in range(nodes)]
        self.host_if = f"jrt{self.tag}"
        self.subnet = _free_subnet(random.Random())
        base = self.subnet.network_address
        self.hosts = [str(base + i + 1) for i in range(nodes)]
        self.host_ip = str(base + 254)
        self._cut: set[int] = set()
        self._made: list[str] = []
        self._lock = threading.Lock()

    def start(self) -> NodeNetwork:
        """Make the namespaces, the bridge and the veths; on any failure undo what was made."""
        why = unavailable()
        if why is not None:
            raise BrokerStartError(why)
        try:
            _ip("netns", "add", self.hub)
            self._made.append(self.hub)
            _ip("link", "add", "br0", "type", "bridge", netns=self.hub)
            _ip("link", "set", "br0", "up", netns=self.hub)
            _ip("link", "set", "lo", "up", netns=self.hub)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", "tohost", "netns",
                self.hub)
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("link", "set", "tohost", "master", "br0", netns=self.hub)
            _ip("link", "set", "tohost", "up", netns=self.hub)
            for i, (name, host) in enumerate(zip(self.names, self.hosts, strict=True)):
                _ip("netns", "add", name)
                self._made.append(name)
                _ip("link", "add", f"e{i + 1}", "type", "veth", "peer", "name", "eth0",
                    "netns", name, netns=self.hub)
                _ip("link", "set", f"e{i + 1}", "master", "br0", netns=self.hub)
                _ip("link", "set", f"e{i + 1}", "up", netns=self.hub)
                _ip("addr", "add", f"{host}/24", "dev", "eth0", netns=name)
                _ip("link", "set", "eth0", "up", netns=name)
                _ip("link", "set", "lo", "up", netns=name)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)  # a campaign that ends abruptly leaves no namespace
        return self

    def cut(self, index: int) -> None:
        """Cut node ``index`` (0-based) off from the other nodes, both ways; clients still
        reach it. Idempotent."""
        with self._lock:
            if index in self._cut:
                return
            self._cut.add(index)
            for other in range(self.size):
                if other != index:
                    _ip("route", "add", "blackhole", f"{self.hosts[other]}/32",
                        netns=self.names[index])
                    _ip("route", "add", "blackhole", f"{self.hosts[index]}/32",
                        netns=self.names[other])

    def heal(self, index: int) -> None:
        """Delete the routes :meth:`cut` added for node ``index``. Idempotent."""
        with self._lock:
            if index not in self._cut:
                return
            self._cut.discard(index)
            for other in range(self.size):
                if other != index:
                    for route, ns in ((self.hosts[other], self.names[index]),
                                      (self.hosts[index], self.names[other])):
                        subprocess.run(["ip", "netns", "exec", ns, "ip", "route", "del",
                                        "blackhole", f"{route}/32"], capture_output=True,
                                       check=False)

    def heal_all(self) -> None:
        for index in sorted(self._cut):
            self.heal(index)

    @property
    def cut_off(self) -> frozenset[int]:
        """The indexes of the nodes cut off now."""
        return frozenset(self._cut)

    def close(self) -> None:
        """Delete the host veth and every namespace this object made (their veths go with
        them). Idempotent; the node processes must have ended first."""
        atexit.unregister(self.close)
        if not self._made:
            return
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        self._made.clear()
        self._cut.clear()

    def __enter__(self) -> NodeNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
