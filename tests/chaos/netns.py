"""A network of its own for a chaos cluster: a network namespace per node, each with a veth to
one bridge in the root namespace, and nftables rules that drop what a partition cuts.

    lab = NetworkLab("rc1a2b", ["controller-100", "broker-0", "broker-1"]).create()
    cmd = [*lab.exec_prefix("broker-0"), "python3", ...]   # the node runs in its namespace
    lab.ip("broker-0")                                      # 10.<n>.0.11, its only address
    lab.drop("broker-0", "broker-1")                        # one way: 0's packets to 1 vanish
    lab.heal()                                              # every rule gone
    lab.remove()                                            # namespaces, bridge, table gone

Nodes reach each other only through the harness's proxies, which listen on the bridge's
address in the root namespace: every node advertises its proxy (brokers and controllers), so
what a node sends to another enters the root namespace, where the inet family's input hook
sees it and :meth:`drop` matches its source address and the destination's proxy ports. (No
packet is bridged from one namespace to another: a host's own firewall, Docker's FORWARD
policy among them, would decide those.) Packets are dropped, not refused: a connection across
a partition hangs until its timeouts fire, as on a real network. The harness process (the
clients) stays in the root namespace and reaches every node.

Names carry the lab's prefix (unique per schedule), so :meth:`remove` deletes only what this
lab made, and it is safe to call twice. Needs root (``ip netns``, ``nft``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")
    return result


class NetworkLab:
    """The namespaces, veths, bridge and nftables table of one cluster."""

    def __init__(self, prefix: str, nodes: Sequence[str], subnet: int = 201) -> None:
        if len(prefix) > 8:
            raise ValueError("a lab prefix has at most 8 characters (interface names: 15)")
        self.prefix = prefix
        self.nodes = list(nodes)
        self.subnet = subnet
        self.bridge = f"{prefix}br"
        self.table = f"chaos_{prefix}"
        #: per node, the proxy ports that lead to it (the inet rules match them)
        self.proxy_ports: dict[str, set[int]] = {n: set() for n in nodes}
        self.created = False

    # --- names ----------------------------------------------------------------------------

    def namespace(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def _veth(self, node: str) -> str:
        return f"{self.prefix}v{self.nodes.index(node)}"

    @property
    def bridge_ip(self) -> str:
        return f"10.{self.subnet}.0.1"

    def ip(self, node: str) -> str:
        return f"10.{self.subnet}.0.{10 + self.nodes.index(node)}"

    def exec_prefix(self, node: str) -> list[str]:
        """What runs a command in the node's namespace (``ip netns exec`` execs the command,
        so the process keeps the pid the harness signals)."""
        return ["ip", "netns", "exec", self.namespace(node)]

    # --- lifecycle ------------------------------------------------------------------------

    def create(self) -> NetworkLab:
        self.created = True  # from the first command on: remove() undoes a half-made lab
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for node in self.nodes:
            ns, veth = self.namespace(node), self._veth(node)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip(node)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("nft", "add", "table", "inet", self.table)
        _run(
            "nft", "add", "chain", "inet", self.table, "input",
            "{ type filter hook input priority 0 ; }",
        )  # fmt: skip
        return self

    def remove(self) -> None:
        if not self.created:
            return
        _run("nft", "delete", "table", "inet", self.table, check=False)
        for node in self.nodes:  # a namespace takes its end of the veth pair with it
            _run("ip", "netns", "del", self.namespace(node), check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        self.created = False

    # --- faults ---------------------------------------------------------------------------

    def drop(self, src: str, dst: str) -> None:
        """Drop every packet ``src`` sends to ``dst`` (to its proxies)."""
        ports = sorted(self.proxy_ports[dst])
        if ports:
            _run(
                "nft", "add", "rule", "inet", self.table, "input", "ip", "saddr", self.ip(src),
                "tcp", "dport", "{ " + ", ".join(map(str, ports)) + " }", "drop",
            )  # fmt: skip

    def cut(self, side: Iterable[str], other: Iterable[str], *, both_ways: bool = True) -> None:
        """Drop what each node of ``side`` sends to each of ``other`` (and back)."""
        others = list(other)
        for a in side:
            for b in others:
                self.drop(a, b)
                if both_ways:
                    self.drop(b, a)

    def heal(self) -> None:
        if not self.created:
            return
        _run("nft", "flush", "chain", "inet", self.table, "input")
