"""The `floor` workload: what one durable one-at-a-time push costs here with no zdmq code.

    zdmq bench --workloads floor [--durability fsync os] [--floor-n 3000]

zdmq's `sequential` push row (a 100-byte POST, its commit, a 201, one at a time) is only
as fast as this machine's disk and loopback allow. This workload measures those floors
with nothing of zdmq in them, so that the row can be read against them:

    floor: sqlite commit               one INSERT + COMMIT of a 100-byte record in SQLite
                                       WAL mode (synchronous=FULL under durability fsync,
                                       OFF under os), in this process, the WAL laid out
                                       first as zdmq's storage does
    floor: bare http                   a POST of a 100-byte body answered 201 by a bare
                                       asyncio protocol server (uvloop, framing by
                                       Content-Length only) in a child process, from a bare
                                       asyncio client here over one keep-alive loopback
                                       connection: the HTTP round trip alone
    floor: bare http + sqlite commit   the same, the server committing the body (as the
                                       first row does) before it answers

Every call waits for the one before; `Knobs.floor_n` calls per row after a short untimed
warm-up. Each row gives calls/s (1 / mean latency), p50, p99 and the server's CPU per call:
this process's CPU for the first row, the child's (from /proc, in 10 ms ticks) for the
others. The databases live where `tempfile` puts them, as the clusters of `zdmq bench` do.

The server is also `python -m zdmq.bench.floor serve --durability fsync --db PATH`: it
listens on 127.0.0.1 (port 0), prints `ready PORT`, commits the bodies POSTed to
/sqlite, answers /bare without storing, and exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

from zdmq.bench.suite import Knobs, Row
from zdmq.bench.workloads import cpu_seconds, percentile, run_uvloop

__all__ = ["parse_head", "split_message", "workload_floor"]

BODY = b"x" * 100
WARMUP = 200  # untimed calls before each row (at most floor_n)
HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0
MAX_HEAD = 16 * 1024
_REPLY = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


# ---- framing: pure functions on bytes -------------------------------------------------------


def parse_head(head: bytes) -> tuple[bytes, int]:
    """The first line of a request or reply head (without its CRLF) and its Content-Length
    (0 when it has none). Raises ValueError on a length that is not a decimal number."""
    first, *lines = head.split(b"\r\n")
    length = 0
    for line in lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            value = value.strip()
            if not value.isdigit():
                raise ValueError(f"bad Content-Length {value[:40]!r}")
            length = int(value)
    return first, length


def split_message(buf: bytearray) -> tuple[bytes, bytes] | None:
    """Takes one whole message (head, body) off the front of `buf`, framed by its
    Content-Length; None (and `buf` untouched) while it is incomplete. Raises ValueError
    on a head longer than MAX_HEAD or a bad Content-Length."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD:
            raise ValueError("head too long")
        return None
    head = bytes(buf[:end])
    _, length = parse_head(head)
    if len(buf) < end + 4 + length:
        return None
    body = bytes(buf[end + 4 : end + 4 + length])
    del buf[: end + 4 + length]
    return head, body


# ---- SQLite ---------------------------------------------------------------------------------


def open_db(path: str, durability: str) -> sqlite3.Connection:
    """A one-table WAL database opened as zdmq's storage opens its own (exclusive lock,
    synchronous FULL or OFF), with the WAL laid out under fsync."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'fsync' else 'OFF'}")
    conn.execute("CREATE TABLE IF NOT EXISTS m (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    if durability == "fsync":
        _lay_out_wal(conn, path + "-wal")
    return conn


def _lay_out_wal(conn: sqlite3.Connection, wal: str) -> None:
    """What `SqliteStorage._presize_wal` does (a method of the storage, so not called from
    here): checkpoint everything, then fill the empty WAL with zeros up to its working
    size (the autocheckpoint's pages plus 64 frames of slack) and sync it, so the timed
    commits rewrite blocks the file has instead of growing it."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (page,) = conn.execute("PRAGMA page_size").fetchone()
    (pages,) = conn.execute("PRAGMA wal_autocheckpoint").fetchone()
    size = 32 + (max(pages, 0) + 64) * (24 + page)  # WAL header; frames of header + page
    fd = os.open(wal, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(size), 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def commit(conn: sqlite3.Connection, body: bytes) -> None:
    conn.execute("BEGIN")
    conn.execute("INSERT INTO m (body) VALUES (?)", (body,))
    conn.execute("COMMIT")


# ---- the server (a child process) -----------------------------------------------------------


class _Server(asyncio.Protocol):
    """Answers each POST 201; commits the body first when the path is /sqlite."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.buf = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            while (msg := split_message(self.buf)) is not None:
                first, _ = parse_head(msg[0])
                if first.startswith(b"POST /sqlite "):
                    commit(self.conn, msg[1])
                self.transport.write(_REPLY)
        except ValueError:
            self.transport.write(_BAD)
            self.transport.close()


def serve(db: str, durability: str) -> None:
    """Listens on 127.0.0.1 (a free port), prints `ready PORT`, serves until stdin closes."""
    conn = open_db(db, durability)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Server(conn), HOST, 0)
        stop = asyncio.Event()

        def on_stdin() -> None:
            if not os.read(0, 4096):  # the parent closed it, or is gone
                loop.remove_reader(0)
                stop.set()

        loop.add_reader(0, on_stdin)
        port = server.sockets[0].getsockname()[1]
        sys.stdout.write(f"ready {port}\n")
        sys.stdout.flush()
        await stop.wait()
        server.close()

    try:
        run_uvloop(main())
    finally:
        conn.close()


def _start_server(db: str, durability: str) -> tuple[subprocess.Popen[bytes], int]:
    """The server child and its port (from its `ready` line; no sleeping)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zdmq.bench.floor", "serve", "--db", db, "--durability", durability],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                raise RuntimeError(f"floor server gave no ready line in {READY_TIMEOUT_S:.0f}s")
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                raise RuntimeError(f"floor server exited ({proc.poll()}) before it was ready")
            line += chunk
        word, port = line.split()[:2]
        if word != b"ready":
            raise RuntimeError(f"floor server said {line[:200]!r}")
        return proc, int(port)
    except BaseException:
        _stop_server(proc)
        raise


def _stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stops the child by its PID and reaps it."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


# ---- the client -----------------------------------------------------------------------------


class _Client(asyncio.Protocol):
    """One keep-alive connection; one POST at a time, whose waiter gets the reply head."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: Any = None
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            msg = split_message(self.buf)
        except ValueError as e:
            self._fail(e)
            return
        if msg is not None and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(msg[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("the floor server closed the connection"))

    def _fail(self, e: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(e)

    async def post(self, request: bytes) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        head = await self.waiter
        if not head.startswith(b"HTTP/1.1 201 "):
            raise RuntimeError(f"floor server replied {head[:200]!r}")


async def _posts(port: int, path: str, warmup: int, n: int, pid: int) -> tuple[list[float], float]:
    """`warmup` untimed, then n timed POSTs of BODY on one connection, each after the
    reply to the last; their latencies and the server's CPU seconds over the timed ones."""
    request = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        path.encode(),
        HOST.encode(),
        len(BODY),
        BODY,
    )
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_connection(_Client, HOST, port)
    lat: list[float] = []
    try:
        async with asyncio.timeout(60 + 0.1 * (warmup + n)):  # ample for any disk
            for _ in range(warmup):
                await client.post(request)
            s0 = cpu_seconds([pid])
            for _ in range(n):
                t = time.perf_counter()
                await client.post(request)
                lat.append(time.perf_counter() - t)
            cpu = cpu_seconds([pid]) - s0
    finally:
        transport.close()
    return lat, cpu


# ---- the workload ---------------------------------------------------------------------------


def _row(system: str, durability: str, lat: list[float], cpu_s: float) -> Row:
    lat = sorted(lat)
    return {
        "system": system,
        "durability": durability,
        "workload": "floor",
        "variant": "1 client",
        "push_rate": len(lat) / sum(lat),
        "push_p50_ms": percentile(lat, 0.50) * 1e3,
        "push_p99_ms": percentile(lat, 0.99) * 1e3,
        "push_cpu_us": cpu_s / len(lat) * 1e6,
    }


def workload_floor(k: Knobs, durability: str, *, log: Any = print) -> list[Row]:
    """The three floor rows for this durability ("fsync" or "os"); see the module doc."""
    if durability not in ("fsync", "os"):
        raise ValueError(f"durability must be fsync or os, not {durability!r}")
    n = k.floor_n
    if n < 1:
        raise ValueError("floor_n must be at least 1")
    warmup = min(WARMUP, n)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="zdmq-floor-") as tmp:
        conn = open_db(os.path.join(tmp, "local.sqlite3"), durability)
        try:
            for _ in range(warmup):
                commit(conn, BODY)
            lat = []
            c0 = time.process_time()
            for _ in range(n):
                t = time.perf_counter()
                commit(conn, BODY)
                lat.append(time.perf_counter() - t)
            rows.append(_row("floor: sqlite commit", durability, lat, time.process_time() - c0))
        finally:
            conn.close()

        proc, port = _start_server(os.path.join(tmp, "server.sqlite3"), durability)
        log(f"floor: server pid {proc.pid} on {HOST}:{port}")
        try:
            for system, path in (
                ("floor: bare http", "/bare"),
                ("floor: bare http + sqlite commit", "/sqlite"),
            ):
                lat, cpu = run_uvloop(_posts(port, path, warmup, n, proc.pid))
                rows.append(_row(system, durability, lat, cpu))
        finally:
            _stop_server(proc)
    for r in rows:
        log(
            f"floor {durability}: {r['system']}: {r['push_rate']:,.0f}/s, "
            f"p50 {r['push_p50_ms']:.3f} ms, p99 {r['push_p99_ms']:.3f} ms, "
            f"server {r['push_cpu_us']:.0f} µs/call"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zdmq.bench.floor", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="the floor's HTTP server (started by workload_floor)")
    s.add_argument("--db", required=True, help="the SQLite file /sqlite commits to")
    s.add_argument("--durability", choices=["fsync", "os"], default="fsync")
    args = ap.parse_args(argv)
    serve(args.db, args.durability)
    return 0


if __name__ == "__main__":
    sys.exit(main())
