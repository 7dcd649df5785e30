"""What one durable commit costs on this disk: SQLite WAL vs a plain append vs a preallocated log.

    .venv/bin/python loadtest/storage_floor.py [--n 3000] [--dir .]

One 100-byte record at a time, each made durable before the next:
  sqlite WAL FULL      BEGIN; INSERT one row; COMMIT (zdmq's storage: synchronous=FULL)
  append + fdatasync   os.write to a file opened O_APPEND, then fdatasync
  prealloc + fdatasync pwrite into a preallocated file (its size never changes), fdatasync
No zdmq code runs here; it measures the floor a storage engine sits on (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time


def _report(name: str, lat: list[float]) -> None:
    lat.sort()
    n = len(lat)
    print(
        f"| {name} | {n / sum(lat):,.0f} | {lat[n // 2] * 1e6:.0f} | "
        f"{lat[int(n * 0.99)] * 1e6:.0f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--dir", default=".", help="a folder on the disk to measure")
    args = ap.parse_args()
    body = b"x" * 100
    print("| commit | per second | p50 µs | p99 µs |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        conn = sqlite3.connect(os.path.join(d, "t.sqlite3"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE m (seq INTEGER PRIMARY KEY, id TEXT, body BLOB)")
        lat = []
        for i in range(args.n):
            t = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute("INSERT INTO m VALUES (?, ?, ?)", (i, f"{i:036d}", body))
            conn.execute("COMMIT")
            lat.append(time.perf_counter() - t)
        conn.close()
        _report("sqlite WAL FULL", lat)

        fd = os.open(os.path.join(d, "append.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        lat = []
        for _ in range(args.n):
            t = time.perf_counter()
            os.write(fd, body)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        os.close(fd)
        _report("append + fdatasync", lat)

        fd = os.open(os.path.join(d, "prealloc.log"), os.O_RDWR | os.O_CREAT)
        os.posix_fallocate(fd, 0, args.n * 4096)
        os.fsync(fd)
        lat = []
        for i in range(args.n):
            t = time.perf_counter()
            os.pwrite(fd, body, i * 4096)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        os.close(fd)
        _report("prealloc + fdatasync", lat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
