"""The floor under a durable one-at-a-time push: bare asyncio protocols plus one commit.

    .venv/bin/python loadtest/push_floor.py [--n 3000] [--rounds 3] [--durability fsync]

Three ways to do what workload (a)'s push does (a 100-byte POST, its commit, a 201),
timed in interleaved rounds so that a shared machine's load falls on all of them alike:

- `bare`: an asyncio protocol server that frames by Content-Length, INSERTs the body
  into SQLite (WAL, `synchronous=FULL` under fsync, OFF under os, autocommit: one
  transaction per row, the WAL laid out first as zdmq's storage does) and answers 201
  after the commit; a bare asyncio protocol client. No routing, no node state, no ids:
  the least a Python server and client on uvloop can do per push on this machine.
- `bare-nocommit`: the same without the INSERT: what the two processes and the loopback
  round trip cost alone.
- `zdmq`: a one-node `LocalCluster` and `Client.push`, as `zdmq bench` and
  `profile_push.py` run them.

Prints per round and kind: pushes/s (1 / mean latency), p50, p99, and the server's CPU per
push; then the median of the rounds. zdmq's p50 minus bare's is what zdmq's own code
(HTTP, handler, state, storage, client) adds; bare's p50 is what is left when all of it
is gone. Runs against whichever zdmq is first on the import path.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_stack import _BareClient as BareClient
from http_stack import _BareServer as BareServer
from profile_push import latency_row

from zdmq.bench.workloads import cpu_seconds
from zdmq.client import Client
from zdmq.local import LocalCluster
from zdmq.models import new_message_id

BODY = b"x" * 100


def _open_db(directory: str, durability: str) -> sqlite3.Connection:
    conn = sqlite3.connect(os.path.join(directory, "floor.sqlite3"), isolation_level=None)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'fsync' else 'OFF'}")
    conn.execute("CREATE TABLE m (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    fd = os.open(os.path.join(directory, "floor.sqlite3-wal"), os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(5 << 20), 0)  # as SqliteStorage._presize_wal does
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return conn


class _BareServer(BareServer):
    """http_stack's bare server, storing each body first (one autocommit INSERT) when
    it has a database."""

    def __init__(self, conn: sqlite3.Connection | None) -> None:
        self.conn = conn

    def handle(self, body: bytes) -> None:
        if self.conn is not None:
            self.conn.execute("INSERT INTO m (body) VALUES (?)", (body,))


def _serve(sock: socket.socket, directory: str | None, durability: str) -> None:
    conn = _open_db(directory, durability) if directory is not None else None

    async def main() -> None:
        await asyncio.get_running_loop().create_server(lambda: _BareServer(conn), sock=sock)
        await asyncio.Event().wait()

    uvloop.run(main())


class _BareClient(BareClient):
    """http_stack's bare client, pushing BODY and expecting 201 replies."""

    def __init__(self, zdmq: bool) -> None:
        self.zdmq = zdmq  # send what Client.push sends: a content type and a fresh id

    def check(self, head: bytes) -> None:
        if not head.startswith(b"HTTP/1.1 201 "):
            raise RuntimeError(f"unexpected reply {head[:200]!r}")

    async def push(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        extra = b""
        if self.zdmq:
            extra = b"Content-Type: application/octet-stream\r\nzdmq-id: %s\r\n" % (
                new_message_id().encode()
            )
        self.t.write(
            b"POST /v1/queues/push-floor/messages HTTP/1.1\r\nHost: x\r\n%s"
            b"Content-Length: %d\r\n\r\n" % (extra, len(BODY)) + BODY
        )
        await self.waiter


async def _bare_pushes(port: int, n: int, zdmq: bool = False) -> list[float]:
    transport, proto = await asyncio.get_running_loop().create_connection(
        lambda: _BareClient(zdmq), "127.0.0.1", port
    )
    lat = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            await proto.push()
            lat.append(time.perf_counter() - t)
    finally:
        transport.close()
    return lat


async def _zdmq_pushes(config: Path, n: int, create: bool = False) -> list[float]:
    lat = []
    async with Client.from_config(config) as c:
        if create:
            await c.create_queue("push-floor")
        for _ in range(n):
            t = time.perf_counter()
            await c.push("push-floor", BODY)
            lat.append(time.perf_counter() - t)
    return lat


# kind: (server, client)
KINDS = {
    "bare-nocommit": ("bare, no commit", "bare"),
    "bare": ("bare", "bare"),
    "bare/zdmq-client": ("bare", "zdmq"),
    "zdmq-node/bare-client": ("zdmq", "bare"),
    "zdmq": ("zdmq", "zdmq"),
}


def _config(directory: str, port: int) -> Path:
    """A cluster file naming the bare server as the only node, for zdmq's client."""
    path = Path(directory) / "bare-cluster.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "nodes": [{"id": "bare", "host": "127.0.0.1", "port": port}],
                "replication": 1,
                "partitions": 16,
                "data_dir": str(Path(directory) / "unused"),
            }
        )
    )
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="timed pushes per kind and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--durability", choices=("fsync", "os"), default="fsync")
    args = ap.parse_args()
    if not 1 <= args.n <= 100_000 or not 1 <= args.rounds <= 20:
        raise SystemExit("--n must be in 1..100,000 and --rounds in 1..20")
    warm = 1500  # past the WAL's first checkpoint: both stores in their steady state
    ctx = mp.get_context("spawn")
    rows: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="zdmq-push-floor-") as tmp:
        ports: dict[str, tuple[int, int]] = {}  # server -> (port, pid)
        procs = []
        try:
            for server, directory in (("bare, no commit", None), ("bare", tmp)):
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                sock.listen(16)
                proc = ctx.Process(target=_serve, args=(sock, directory, args.durability))
                proc.daemon = True
                proc.start()
                procs.append((proc, sock))
                assert proc.pid is not None
                ports[server] = (sock.getsockname()[1], proc.pid)
                for _ in range(200):  # until it answers
                    try:
                        socket.create_connection(("127.0.0.1", ports[server][0]), 0.1).close()
                        break
                    except OSError:
                        time.sleep(0.05)
            bare_config = _config(tmp, ports["bare"][0])
            cluster = LocalCluster.ephemeral(
                os.path.join(tmp, "zdmq"), nodes=1, replication=1, durability=args.durability
            )
            with cluster:
                node = next(iter(cluster.nodes.values()))
                assert node.pid is not None and node.url is not None
                ports["zdmq"] = (int(node.url.rsplit(":", 1)[1]), node.pid)
                uvloop.run(_zdmq_pushes(cluster.config_path, warm, create=True))
                for server in ("bare, no commit", "bare"):
                    uvloop.run(_bare_pushes(ports[server][0], warm))
                print(f"durability {args.durability}, {args.n} pushes per kind and round")
                print(
                    "| round | kind | push/s | p50 ms | p99 ms | server CPU µs/push "
                    "| client CPU µs/push |"
                )
                print("|---|---|---|---|---|---|---|")
                for r in range(args.rounds):
                    for kind, (server, client) in KINDS.items():
                        port, pid = ports[server]
                        if client == "bare":
                            run = _bare_pushes(port, args.n, zdmq=server == "zdmq")
                        else:
                            config = cluster.config_path if server == "zdmq" else bare_config
                            run = _zdmq_pushes(config, args.n)
                        s0, c0 = cpu_seconds([pid]), time.process_time()
                        lat = uvloop.run(run)
                        row = latency_row(lat, cpu_seconds([pid]) - s0, time.process_time() - c0)
                        rows[kind].append(row)
                        print(f"| {r + 1} | {kind} | {_cells(row)}", flush=True)
        finally:
            for proc, sock in procs:
                proc.kill()
                proc.join()
                sock.close()
    for kind, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| median of {len(rs)} | {kind} | {_cells(med)}")
    return 0


def _cells(r: dict[str, float]) -> str:
    return (
        f"{r['rate']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['srv_us']:.0f} "
        f"| {r['cli_us']:.0f} |"
    )


if __name__ == "__main__":
    raise SystemExit(main())
