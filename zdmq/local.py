"""Start, stop, kill, pause and restart node processes on this host.

Used by `zdmq up`, `zdmq demo` and the test harness. Each node is a real
`python -m zdmq.server` process; readiness is its readiness line on stdout (`READY ...`,
or a JSON object under JSON logs: `zdmq.logs.parse_ready_line` reads both), never a
sleep. `LocalCluster.ephemeral` binds every node's listening socket on 127.0.0.1:0
here, writes a cluster file with the ports the kernel chose, and hands each socket
down to its node (`--listen-fd`), so there is no window in which a port could be taken.
The cluster keeps its copy of each socket for its whole life: a killed node's port
stays bound (calls to it wait rather than being refused) until the node restarts, or
until `release_port` closes it (calls are then refused, as a crashed host's would be).

With replication, a node started (or restarted) is ready once it also leads its own
replica group again, as it does within a second or so of catching up (the group's
leader hands it back), so a call made to it right after is served and not sent away with
a 421: `start`, `start_node` and `restart` wait for that too, whenever a majority of the
group's members runs (without one, no member can lead).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from zdmq.cluster_map import ClusterMap, initial_map
from zdmq.config import ClusterConfig
from zdmq.logs import parse_ready_line
from zdmq.server.topology import MAP_FILE

__all__ = ["LocalCluster", "NodeProcess"]

STDOUT_LINES_KEPT = 100  # of each node's stdout, across its restarts


class NodeProcess:
    def __init__(self, node_id: str, argv: list[str], log_path: Path, fd: int | None) -> None:
        self.node_id = node_id
        self.argv = argv
        self.log_path = log_path
        self.fd = fd
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = threading.Event()
        self.url: str | None = None
        # The last lines the node printed on stdout (its readiness line, nothing else).
        self.stdout_lines: deque[str] = deque(maxlen=STDOUT_LINES_KEPT)
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.ready.clear()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                pass_fds=(self.fd,) if self.fd is not None else (),
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            self.stdout_lines.append(line)
            ready = parse_ready_line(line)
            if ready is not None:
                self.url = ready[1]
                self.ready.set()
        proc.stdout.close()

    def wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        # Wake up on READY, or notice the process died before it.
        deadline_step = 0.05
        waited = 0.0
        while not self.ready.wait(deadline_step):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"node {self.node_id} exited with {self.proc.returncode} before READY:\n"
                    + self.log_tail()
                )
            waited += deadline_step
            if waited >= timeout_s:
                raise TimeoutError(
                    f"node {self.node_id} not ready after {timeout_s}s:\n" + self.log_tail()
                )

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int | None:
        """Waits for the process to exit (killing it after `timeout_s`), and for what it
        printed on stdout to be read."""
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout_s)
        if self._reader is not None:
            self._reader.join(timeout_s)
        return code


class LocalCluster:
    """The node processes of one cluster file, all on this host."""

    def __init__(
        self,
        config_path: str | Path,
        *,
        node_ids: Iterable[str] | None = None,
        sockets: dict[str, socket.socket] | None = None,
        log_dir: Path | None = None,
        python: str = sys.executable,
    ) -> None:
        self.config_path = Path(config_path).resolve()
        self.config = ClusterConfig.load(self.config_path)
        self._sockets = sockets or {}
        log_dir = log_dir or self.config.data_dir
        ids = list(node_ids) if node_ids is not None else list(self.config.node_ids)
        self.nodes: dict[str, NodeProcess] = {}
        for node_id in ids:
            sock = self._sockets.get(node_id)
            argv = [python, "-m", "zdmq.server", "--config", str(self.config_path)]
            argv += ["--node", node_id]
            fd = None
            if sock is not None:
                fd = sock.fileno()
                argv += ["--listen-fd", str(fd)]
            self.nodes[node_id] = NodeProcess(node_id, argv, log_dir / f"{node_id}.log", fd)

    @classmethod
    def ephemeral(
        cls,
        directory: str | Path,
        *,
        nodes: int = 4,
        replication: int = 1,
        partitions: int = 256,
        durability: str = "fsync",
        **extra: Any,
    ) -> LocalCluster:
        """A fresh cluster in `directory` on loopback ports the kernel picks."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        sockets: dict[str, socket.socket] = {}
        entries = []
        for i in range(1, nodes + 1):
            node_id = f"n{i}"
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(1024)
            s.set_inheritable(True)
            sockets[node_id] = s
            entries.append({"id": node_id, "host": "127.0.0.1", "port": s.getsockname()[1]})
        raw = {
            "nodes": entries,
            "replication": min(replication, nodes),
            "partitions": partitions,
            "data_dir": str(directory / "data"),
            "durability": durability,
            **extra,
        }
        path = directory / "cluster.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return cls(path, sockets=sockets, log_dir=directory / "logs")

    def joining(self, node_id: str, python: str = sys.executable) -> str:
        """A node the cluster file does not list, on a loopback port the kernel picks,
        set up to run (`start_node`) and join the running cluster (`zdmq node
        --address`). Returns its address ("host:port"), for `zdmq cluster add-node`."""
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} is set up already")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1024)
        s.set_inheritable(True)
        self._sockets[node_id] = s
        address = f"127.0.0.1:{s.getsockname()[1]}"
        argv = [python, "-m", "zdmq.server", "--config", str(self.config_path)]
        argv += ["--node", node_id, "--address", address, "--listen-fd", str(s.fileno())]
        log_path = next(iter(self.nodes.values())).log_path.parent / f"{node_id}.log"
        self.nodes[node_id] = NodeProcess(node_id, argv, log_path, s.fileno())
        return address

    # ---- verbs ---------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        for n in self.nodes.values():
            if not n.running:
                n.start()
        for n in self.nodes.values():
            n.wait_ready(timeout_s)
        for node_id in self.nodes:
            self.wait_leading(node_id, timeout_s)
        return self

    def start_node(self, node_id: str, timeout_s: float = 60.0) -> None:
        n = self.nodes[node_id]
        n.start()
        n.wait_ready(timeout_s)
        self.wait_leading(node_id, timeout_s)

    def cluster_map(self, node_id: str) -> ClusterMap:
        """The cluster map node `node_id` holds, as its data directory keeps it (the
        map cluster.yaml makes until the node learned a newer one)."""
        path = self.config.node_data_dir(node_id) / MAP_FILE
        try:
            return ClusterMap.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return initial_map(self.config)

    def wait_leading(self, node_id: str, timeout_s: float = 60.0) -> None:
        """With replication: waits until `node_id` leads the replica groups it is the
        preferred leader of (by the cluster map it holds), those of them a majority of
        whose members runs here (returns at once when there are none)."""
        config = self.config
        if config.replication <= 1:
            return
        url = self.url(node_id) + "/v1/health"
        ctx = config.client_ssl()
        deadline = time.monotonic() + timeout_s
        seen: object = None  # the last health reply, or why there was none
        running: list[str] = []
        while True:
            m = self.cluster_map(node_id)
            wanted = []
            for g in m.groups:
                members = m.members(g)
                if members[0] != node_id:
                    continue
                running = [n for n in members if n in self.nodes and self.nodes[n].running]
                if 2 * len(running) > len(members):
                    wanted.append(g)
            if not wanted:
                return
            try:
                with urllib.request.urlopen(url, timeout=5, context=ctx) as r:
                    groups = json.loads(r.read()).get("groups", {})
                seen = {g: groups.get(g) for g in wanted}
                if all(groups.get(g, {}).get("role") == "leader" for g in wanted):
                    return
            except (OSError, ValueError) as e:
                seen = repr(e)  # not answering yet, or busy: asked again
            if time.monotonic() > deadline:
                others = "".join(
                    f"\n--- {n}:\n{self.nodes[n].log_tail()}" for n in running if n != node_id
                )
                raise TimeoutError(
                    f"node {node_id} does not lead its replica groups {wanted} after "
                    f"{timeout_s}s (its health says {seen}):\n{self.nodes[node_id].log_tail()}"
                    f"{others}"
                )
            time.sleep(0.05)

    def url(self, node_id: str) -> str:
        """Where node `node_id` listens (a joined node: once it has started)."""
        if node_id in self.config.node_ids:
            return self.config.node(node_id).url
        url = self.nodes[node_id].url
        assert url is not None, f"{node_id} has not started"
        return url

    def kill(self, node_id: str) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        n = self.nodes[node_id]
        n.signal(signal.SIGKILL)
        n.wait(10)

    def release_port(self, node_id: str) -> None:
        """Closes the cluster's copy of a stopped node's listening socket: calls to the
        port are refused from now on, and the node, if started again, binds the port
        itself."""
        n = self.nodes[node_id]
        if n.running:
            raise RuntimeError(f"{node_id} is running: stop or kill it first")
        sock = self._sockets.pop(node_id, None)
        if sock is None:
            return
        sock.close()
        i = n.argv.index("--listen-fd")
        self.nodes[node_id] = NodeProcess(node_id, n.argv[:i] + n.argv[i + 2 :], n.log_path, None)

    def stop_node(self, node_id: str, timeout_s: float = 10.0) -> int | None:
        n = self.nodes[node_id]
        n.signal(signal.SIGTERM)
        return n.wait(timeout_s)

    def pause(self, node_id: str) -> None:
        self.nodes[node_id].signal(signal.SIGSTOP)

    def resume(self, node_id: str) -> None:
        self.nodes[node_id].signal(signal.SIGCONT)

    def restart(self, node_id: str, timeout_s: float = 60.0) -> None:
        n = self.nodes[node_id]
        if n.running:
            self.stop_node(node_id)
        self.start_node(node_id, timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        for n in self.nodes.values():
            n.signal(signal.SIGCONT)
            n.signal(signal.SIGINT)  # every node at once: no hand-over (nobody would take it)
        for n in self.nodes.values():
            n.wait(timeout_s)

    def close(self) -> None:
        self.stop()
        for s in self._sockets.values():
            s.close()

    @property
    def urls(self) -> list[str]:
        listed = self.config.node_ids
        return [
            self.config.node(i).url if i in listed else (n.url or "") for i, n in self.nodes.items()
        ]

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
