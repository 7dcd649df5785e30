"""Core benchmark: the async client against a local cluster of real node processes.

    .venv/bin/python loadtest/bench_core.py [--nodes 1 4] [--durability fsync os] [--n 3000]

Workloads (100-byte messages):
  seq-push / seq-pop   one call at a time, waiting for each acknowledgement (RDSQ's (a))
  conc-push / conc-pop 32 calls in flight from one client process
  batch-push/batch-pop push_many / pop_many of 100
Beside them, in the same run, the floor this disk sets: raw 100-byte append + fsync
per message. Prints a table, writes JSON to loadtest/results/. Stops its own nodes.
The peers (RabbitMQ, Redis, NATS) come with the benchmark issue.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from zdmq import Client
from zdmq.local import LocalCluster

BODY = b"x" * 100


def raw_fsync_rate(n: int = 3000) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(dir=".") as f:
        lat = []
        t0 = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            os.write(f.fileno(), BODY)
            os.fsync(f.fileno())
            lat.append(time.perf_counter() - t)
        dt = time.perf_counter() - t0
    return {"rate": n / dt, "p50_ms": statistics.median(lat) * 1e3}


async def _timed_seq(n: int, op: Any) -> dict[str, float]:
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        await op()
        lat.append(time.perf_counter() - t)
    dt = time.perf_counter() - t0
    lat.sort()
    return {
        "rate": n / dt,
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
    }


async def _timed_conc(n: int, concurrency: int, op: Any) -> dict[str, float]:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await op()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"rate": n / (time.perf_counter() - t0)}


async def run_workloads(config_path: Path, n: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    async with Client.from_config(config_path) as c:
        q = "bench"
        await c.create_queue(q)

        async def push() -> None:
            await c.push(q, BODY)

        async def pop() -> None:
            assert await c.pop(q) is not None

        out["seq-push"] = await _timed_seq(n, push)
        out["seq-pop"] = await _timed_seq(n, pop)
        out["conc-push"] = await _timed_conc(n * 3, 32, push)
        out["conc-pop"] = await _timed_conc(n * 3, 32, pop)
        batches = max(n // 10, 10)
        t0 = time.perf_counter()
        for _ in range(batches):
            await c.push_many(q, [BODY] * 100)
        out["batch-push"] = {"rate": batches * 100 / (time.perf_counter() - t0)}
        t0 = time.perf_counter()
        got = 0
        while got < batches * 100:
            got += len(await c.pop_many(q, 100))
        out["batch-pop"] = {"rate": got / (time.perf_counter() - t0)}

        # At-least-once: a receive and its ack, each a durable write.
        async def receive_ack() -> None:
            [m] = await c.receive(q, 1)
            assert (await c.ack(q, m.receipt)).ok

        for _ in range(n // 100 + 1):
            await c.push_many(q, [BODY] * 100)
        out["seq-recv+ack"] = await _timed_seq(n, receive_ack)
        for _ in range(3 * n // 100 + 1):
            await c.push_many(q, [BODY] * 100)
        out["conc-recv+ack"] = await _timed_conc(n * 3, 32, receive_ack)
        for _ in range(batches):
            await c.push_many(q, [BODY] * 100)
        t0 = time.perf_counter()
        got = 0
        while got < batches * 100:
            msgs = await c.receive(q, 100)
            assert (await c.ack(q, [m.receipt for m in msgs])).ok
            got += len(msgs)
        out["batch-recv+ack"] = {"rate": got / (time.perf_counter() - t0)}
        await c.delete_queue(q)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--durability", nargs="+", default=["fsync", "os"])
    ap.add_argument("--n", type=int, default=3000, help="messages per sequential workload")
    args = ap.parse_args()

    floor = raw_fsync_rate()
    rate, p50 = floor["rate"], floor["p50_ms"]
    print(f"raw 100-byte append+fsync on this disk: {rate:,.0f}/s p50 {p50:.3f} ms")
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "raw_fsync": floor,
        "runs": [],
    }
    cols = ("nodes", "durability", "workload", "msgs/s", "p50 ms", "p99 ms")
    print("{:>5} {:>10} {:>14} {:>10} {:>8} {:>8}".format(*cols))
    for nodes in args.nodes:
        for durability in args.durability:
            with (
                tempfile.TemporaryDirectory() as d,
                LocalCluster.ephemeral(d, nodes=nodes, durability=durability) as cluster,
            ):
                res = asyncio.run(run_workloads(cluster.config_path, args.n))
            for name, r in res.items():
                p50 = f"{r['p50_ms']:.3f}" if "p50_ms" in r else "-"
                p99 = f"{r['p99_ms']:.3f}" if "p99_ms" in r else "-"
                print(
                    f"{nodes:>5} {durability:>10} {name:>14} {r['rate']:>10,.0f} {p50:>8} {p99:>8}"
                )
                results["runs"].append(
                    {"nodes": nodes, "durability": durability, "workload": name, **r}
                )
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"bench_core-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
