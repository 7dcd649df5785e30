"""A cluster whose nodes each run in a network namespace of their own, and partitions
between them.

`NetnsCluster` makes, for a cluster of N nodes, with a random suffix so that parallel runs
never meet:

- a bridge `zbr-<suffix>` in the host's namespace, address 10.77.X.254/24 (X drawn so that
  no route of the host overlaps, one run at a time under a lock file), through which this
  process (the workload's clients) reaches every node;
- per node, a namespace `zdmq<i>-<suffix>` with a veth pair: `eth0` inside, 10.77.X.i/24,
  the other end `zv<i>-<suffix>` on the bridge; and an nftables table `inet zdmq` whose
  `input` chain the partitions fill;
- a cluster.yaml naming every node by its 10.77 address: nodes off loopback need a named
  node secret (`auth.node_secret_file`, mode 0600) and client tokens (`auth.client_tokens`,
  one admin token, `NetnsCluster.token`); with `tls=True` also a `tls` block: a CA made
  for the run and one certificate naming every node's address (the namespaces share one
  file system, so every "host" reads the same file at the `tls` paths);
- the nodes, started by `zdmq.local.LocalCluster` as `ip netns exec <ns> python -m
  zdmq.server ...` (ip execs the node, so the PID it keeps is the node's own).

A partition drops, inside each node's namespace, every packet arriving from a node on the
other side (an nftables `ip saddr` rule on input): packets vanish, connections hang, as on a
cut network. The bridge address stays reachable from every node, so clients reach every side.
`heal()` empties the rules.

`close()` (also on a failed start) stops the nodes, deletes the namespaces (their rules go
with them), the veth pairs and the bridge, and checks that none is left. Without root, `ip`
or `nft`, or when a namespace cannot be made, entering raises `NetnsUnavailable` with the
reason (tests skip on it).
"""

from __future__ import annotations

import fcntl
import os
import random
import secrets
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml

from tests.helpers import make_ca_and_cert
from zdmq.local import LocalCluster

PORT = 7701
SUBNET_LOCK = Path(tempfile.gettempdir()) / "zdmq-netns-subnet.lock"
TABLE = """
table inet zdmq {
    chain input { type filter hook input priority 0; policy accept; }
}
"""


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here; the message says why."""


def _run(*argv: str, input_: str | None = None) -> str:
    done = subprocess.run(argv, input=input_, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def unavailable_reason() -> str | None:
    """Why namespaces with nftables cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (apt-get install iproute2 nftables)"
    return None


class NetnsCluster:
    def __init__(
        self,
        directory: str | Path,
        *,
        nodes: int = 4,
        replication: int = 1,
        partitions: int = 256,
        durability: str = "fsync",
        tls: bool = False,
        **extra: Any,
    ) -> None:
        """`tls`: the nodes serve HTTPS, with a CA made for the run and a certificate
        naming every node's address (`NetnsCluster.ssl_context()` trusts it)."""
        if not 1 <= nodes <= 250:
            raise ValueError("1..250 nodes")
        self.directory = Path(directory)
        self.n = nodes
        self.tls = tls
        self.settings = {
            "replication": min(replication, nodes),
            "partitions": partitions,
            "durability": durability,
            **extra,
        }
        self.suffix = secrets.token_hex(3)
        self.bridge = f"zbr-{self.suffix}"
        self.token = secrets.token_hex(16)
        self.node_ids = [f"n{i}" for i in range(1, nodes + 1)]
        self.namespaces = {nid: f"zdmq{i}-{self.suffix}" for i, nid in enumerate(self.node_ids, 1)}
        self.veths = [f"zv{i}-{self.suffix}" for i in range(1, nodes + 1)]
        self.subnet = ""
        self.addresses: dict[str, str] = {}
        self.cluster: LocalCluster | None = None
        self._made_ns: list[str] = []
        self._made_links: list[str] = []

    # ---- setup -----------------------------------------------------------------------
    def __enter__(self) -> NetnsCluster:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsUnavailable(reason)
        try:
            self._network()
            self.cluster = self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _free_subnet(self) -> str:
        used = _run("ip", "-4", "route", "show", "table", "all") + _run("ip", "-4", "addr")
        free = [x for x in range(1, 255) if f"10.77.{x}." not in used]
        if not free:
            raise NetnsUnavailable("no free 10.77.x.0/24 subnet")
        return f"10.77.{random.choice(free)}"

    def _network(self) -> None:
        # Runs in parallel (pytest-xdist's workers, other checkouts) each draw a subnet:
        # one at a time from the draw until the bridge holds it, so two never draw one.
        with open(SUBNET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = self._free_subnet()
            try:
                _run("ip", "netns", "add", self.namespaces[self.node_ids[0]])
            except subprocess.CalledProcessError as e:
                raise NetnsUnavailable(f"ip netns add failed: {e.stderr.strip()}") from e
            self._made_ns.append(self.namespaces[self.node_ids[0]])
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self._made_links.append(self.bridge)
            _run("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, nid in enumerate(self.node_ids, 1):
            ns, veth = self.namespaces[nid], self.veths[i - 1]
            if ns not in self._made_ns:
                _run("ip", "netns", "add", ns)
                self._made_ns.append(ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            self._made_links.append(veth)
            _run("ip", "link", "set", f"{veth}p", "netns", ns)
            _run("ip", "-n", ns, "link", "set", f"{veth}p", "name", "eth0")
            addr = f"{self.subnet}.{i}"
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            self._nft(nid, TABLE)
            self.addresses[nid] = addr

    def _start(self) -> LocalCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        secret = self.directory / "node.secret"
        secret.write_text(secrets.token_hex(32) + "\n")
        secret.chmod(0o600)
        if self.tls:
            certs = self.directory / "tls"
            certs.mkdir(exist_ok=True)
            hosts = [self.addresses[n] for n in self.node_ids]
            self.settings["tls"] = make_ca_and_cert(certs, hosts)
        raw = {
            "nodes": [{"id": n, "host": self.addresses[n], "port": PORT} for n in self.node_ids],
            **self.settings,
            "data_dir": str(self.directory / "data"),
            "auth": {
                "node_secret_file": str(secret),
                "client_tokens": [
                    {"name": "fault", "token": self.token, "rights": {"": ["admin"]}}
                ],
            },
        }
        path = self.directory / "cluster.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        cluster = LocalCluster(path, log_dir=self.directory / "logs")
        for nid, node in cluster.nodes.items():
            node.argv = ["ip", "netns", "exec", self.namespaces[nid], *node.argv]
        self.cluster = cluster
        return cluster.start()

    @property
    def urls(self) -> list[str]:
        assert self.cluster is not None
        return self.cluster.urls

    def ssl_context(self) -> ssl.SSLContext | None:
        """What verifies the nodes' certificates (None without `tls`)."""
        assert self.cluster is not None
        return self.cluster.config.client_ssl()

    # ---- partitions ------------------------------------------------------------------
    def _nft(self, node_id: str, script: str) -> None:
        _run("ip", "netns", "exec", self.namespaces[node_id], "nft", "-f", "-", input_=script)

    def partition(self, groups: Sequence[Sequence[str]]) -> None:
        """Each node hears only the nodes of its own group (and the bridge: the clients)."""
        side = {n: i for i, g in enumerate(groups) for n in g}
        if sorted(side) != sorted(self.node_ids):
            raise ValueError(f"groups must cover every node once: {groups}")
        for nid in self.node_ids:
            others = [self.addresses[o] for o in self.node_ids if side[o] != side[nid]]
            script = "flush chain inet zdmq input\n"
            if others:
                script += f"add rule inet zdmq input ip saddr {{ {', '.join(others)} }} drop\n"
            self._nft(nid, script)

    def isolate(self, node_id: str) -> list[list[str]]:
        groups = [[node_id], [n for n in self.node_ids if n != node_id]]
        self.partition(groups)
        return groups

    def random_halves(self, rng: random.Random) -> list[list[str]]:
        ids = list(self.node_ids)
        rng.shuffle(ids)
        groups = [sorted(ids[: len(ids) // 2]), sorted(ids[len(ids) // 2 :])]
        self.partition(groups)
        return groups

    def heal(self) -> None:
        for nid in self.addresses:
            self._nft(nid, "flush chain inet zdmq input\n")

    def rules(self, node_id: str) -> str:
        return _run("ip", "netns", "exec", self.namespaces[node_id], "nft", "list", "ruleset")

    # ---- teardown --------------------------------------------------------------------
    def close(self) -> None:
        """Stops the nodes and removes every namespace and link this cluster made; raises
        if one is still there afterwards."""
        errors: list[str] = []
        if self.cluster is not None:
            try:
                self.cluster.close()
            except Exception as e:
                errors.append(f"stopping the nodes: {e}")
        for link in reversed(self._made_links):
            try:
                _run("ip", "link", "del", link)
            except subprocess.CalledProcessError as e:
                if "Cannot find device" not in e.stderr:  # a veth goes with its namespace
                    errors.append(f"ip link del {link}: {e.stderr.strip()}")
        for ns in reversed(self._made_ns):
            try:
                _run("ip", "netns", "del", ns)
            except subprocess.CalledProcessError as e:
                errors.append(f"ip netns del {ns}: {e.stderr.strip()}")
        self._made_ns.clear()
        self._made_links.clear()
        left = self.leftovers()
        if left or errors:
            raise RuntimeError(f"network namespace cleanup: left {left}; errors {errors}")

    def leftovers(self) -> list[str]:
        """Namespaces and links of this cluster that exist now."""
        names = set(_run("ip", "netns", "list").split()) | set(
            _run("ip", "-o", "link", "show").replace("@", ":").replace(":", " ").split()
        )
        return sorted(
            n for n in [*self.namespaces.values(), self.bridge, *self.veths] if n in names
        )


def started_or_skip(directory: Path, **kw: Any) -> Iterator[NetnsCluster]:
    """For a fixture: a started NetnsCluster (`kw` as for NetnsCluster), or the test
    skipped, saying why, where namespaces cannot be made; closed afterwards, and checked
    to leave nothing behind."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"partition tests need network namespaces: {reason}")
    c = NetnsCluster(directory, **kw)
    try:
        c.__enter__()
    except NetnsUnavailable as e:
        pytest.skip(f"partition tests need network namespaces: {e}")
    try:
        yield c
    finally:
        c.close()
    assert c.leftovers() == []
