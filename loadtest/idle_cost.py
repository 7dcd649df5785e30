"""What an idle cluster costs per queue it holds.

Starts a fresh cluster, creates `--queues` queues, pushes `--per-queue` messages into each
(so every node holds a UUID queue of most of them), lets the pushes settle, then measures
the nodes' CPU (user+system from /proc) over `--idle` seconds in which no client calls.
Prints the share of one core the idle nodes use, per queue count. With `--profile`,
py-spy samples the first node during the idle window of the last queue count and the
script prints its heaviest functions.

    .venv/bin/python loadtest/idle_cost.py --queues 1 10000 --idle 20 [--profile]

Runs against whichever zdmq is first on the import path (PYTHONPATH=/other/tree measures
another checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_push import _start_spy, _stop_spy, summarize

from zdmq import Client
from zdmq.bench.workloads import cpu_seconds
from zdmq.local import LocalCluster


async def _fill(config: str, queues: int, per_queue: int) -> None:
    async with Client.from_config(config) as c:
        names = [f"idle-{i}" for i in range(queues)]
        sem = asyncio.Semaphore(32)

        async def one(name: str) -> None:
            async with sem:
                await c.create_queue(name)
                await c.push_many(name, [b"x" * 100] * per_queue)

        await asyncio.gather(*(one(n) for n in names))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queues", type=int, nargs="+", default=[1, 10_000])
    ap.add_argument("--per-queue", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds measured")
    ap.add_argument("--settle", type=float, default=6.0, help="seconds before measuring")
    ap.add_argument("--durability", default="fsync")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/idle_cost"))
    args = ap.parse_args()
    print("queues  nodes  idle s  node CPU s  % of a core (all nodes)")
    for k, queues in enumerate(args.queues):
        with tempfile.TemporaryDirectory(prefix="zdmq-idle-") as d:
            cluster = LocalCluster.ephemeral(d, nodes=args.nodes, durability=args.durability)
            with cluster:
                cluster.start()
                pids = [p.pid for p in cluster.nodes.values() if p.pid is not None]
                asyncio.run(_fill(str(cluster.config_path), queues, args.per_queue))
                time.sleep(args.settle)
                spy = None
                if args.profile and k == len(args.queues) - 1:
                    args.out.mkdir(parents=True, exist_ok=True)
                    spy = _start_spy(pids[0], args.out / "node.raw", 200, "cpu")
                c0, t0 = cpu_seconds(pids), time.monotonic()
                time.sleep(args.idle)
                cpu, wall = cpu_seconds(pids) - c0, time.monotonic() - t0
                if spy is not None:
                    _stop_spy(spy)
        print(f"{queues:6,}  {args.nodes:5}  {wall:6.1f}  {cpu:10.2f}  {100 * cpu / wall:8.1f}")
    if args.profile:
        print(summarize(args.out / "node.raw", 25))


if __name__ == "__main__":
    main()
