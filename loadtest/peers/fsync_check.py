"""Counts the server's flushes per push, to check each row's durability label.

    .venv/bin/python loadtest/peers/fsync_check.py [--n 500] [--only NAME ...]

For each row of peer_specs(peers.json): attaches `strace -f -c` to the row's server pids
(every thread), pushes N messages one at a time (each waits for its confirm), detaches and
prints how many fsync / fdatasync / sync_file_range / msync calls and writes the server made;
then the same for N messages in push_batch(100) calls, and for N receive(1) + ack cycles
(--op push|batch|ack|all).
A row labelled "fsync" must show about one flush per push when pushes are sequential
(RabbitMQ classic also writes its queue index and message store, so it may show more); an
"os" row far fewer. Needs strace (apt-get install strace) and root (ptrace). Only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

from check_drivers import drop  # noqa: E402
from peer_drivers import peer_specs  # noqa: E402

from zdmq.bench.driver import SystemSpec, open_driver  # noqa: E402

FLUSH_CALLS = ("fsync", "fdatasync", "sync_file_range", "msync")
WRITE_CALLS = ("write", "pwrite64", "writev", "pwritev")
ATTACH_LIMIT_S = 10.0


def parse_strace_summary(text: str) -> dict[str, int]:
    """`strace -c` table -> {syscall: calls}."""
    counts = {}
    for line in text.splitlines():
        cols = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(cols) >= 5 and re.fullmatch(r"[\d.]+", cols[0]) and cols[-1] != "total":
            counts[cols[-1]] = int(cols[3])
    return counts


async def count_flushes(spec: SystemSpec, n: int, op: str) -> dict[str, int]:
    """Server syscalls during n sequential pushes (op "push"), n messages in sequential
    push_batch(100) calls (op "batch"), or n sequential receive(1) + ack cycles (op "ack",
    on n messages pushed beforehand)."""
    queue = f"fsync-{uuid.uuid4().hex[:8]}"
    d = open_driver(spec, queue)
    await d.open()
    await d.reset()
    # lazily created files, channels and consumers exist before counting
    await d.push(b"warm-up")
    got = await d.receive(1, wait_s=2.0)
    await d.ack([t for _, t in got])
    if op == "ack":
        for i in range(0, n, 100):
            await d.push_batch([f"fsync-check-{j}".encode() for j in range(i, min(n, i + 100))])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "strace.txt"
        cmd = [
            "strace",
            "-f",
            "-c",
            "-o",
            str(out),
            "-e",
            "trace=" + ",".join(FLUSH_CALLS + WRITE_CALLS),
        ]
        for pid in spec.server_pids:
            cmd += ["-p", str(pid)]
        proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
        try:
            # strace says "Process N attached [with K threads]" once per pid (older
            # versions once per thread): wait for each pid's line
            assert proc.stderr is not None
            attached = 0
            async with asyncio.timeout(ATTACH_LIMIT_S):
                while attached < len(spec.server_pids):
                    line = await proc.stderr.readline()
                    if not line:
                        raise RuntimeError("strace exited before it attached")
                    attached += b"attached" in line
            if op == "push":
                for i in range(n):
                    await d.push(f"fsync-check-{i}".encode())
            elif op == "batch":
                for i in range(0, n, 100):
                    await d.push_batch(
                        [f"fsync-check-{j}".encode() for j in range(i, min(n, i + 100))]
                    )
            else:
                done = 0
                while done < n:
                    got = await d.receive(1, wait_s=2.0)
                    if not got:
                        raise RuntimeError(f"only {done} of {n} came back")
                    await d.ack([t for _, t in got])
                    done += len(got)
        finally:
            proc.send_signal(signal.SIGINT)
            await asyncio.wait_for(proc.communicate(), 30)
        counts = parse_strace_summary(out.read_text())
    await drop(d)
    await d.close()
    return counts


async def main() -> int:
    default_json = Path(os.environ.get("PEERS_DIR", "/tmp/zdmq-peers")) / "peers.json"
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers-json", default=str(default_json))
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--op", choices=["push", "batch", "ack", "all"], default="all")
    args = ap.parse_args()
    if shutil.which("strace") is None:
        print("strace is not installed (apt-get install -y strace)")
        return 1
    specs = peer_specs(args.peers_json)
    if args.only:
        specs = [s for s in specs if s.name in args.only]
    ops = ["push", "batch", "ack"] if args.op == "all" else [args.op]
    print(f"{args.n} ops one at a time, server syscalls counted by strace -f -c")
    print("push: push(1) and its confirm; batch: push_batch(100) per 100; ack: receive(1) + ack(1)")
    print(f"{'row':24} {'label':6} {'op':5} {'flushes':>8} {'per op':>7} {'writes':>7}  detail")
    for spec in specs:
        for op in ops:
            counts = await count_flushes(spec, args.n, op)
            flushes = sum(counts.get(c, 0) for c in FLUSH_CALLS)
            writes = sum(counts.get(c, 0) for c in WRITE_CALLS)
            detail = ", ".join(f"{c} {counts[c]}" for c in FLUSH_CALLS if counts.get(c))
            print(
                f"{spec.name:24} {spec.durability:6} {op:5} {flushes:8d} "
                f"{flushes / args.n:7.2f} {writes:7d}  {detail}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
