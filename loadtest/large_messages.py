"""1 MiB messages through one node: rate and the node's CPU per message.

A loop of `push_many` of 4 bodies, `receive` of 4 and `ack` of 4, one client, against a
fresh one-node cluster per run. `--profile FILE` samples the node with py-spy (raw
collapsed stacks; summarise them with profile_push.summarize).

    .venv/bin/python loadtest/large_messages.py --durability fsync memory --runs 3

Runs against whichever zdmq is first on the import path (PYTHONPATH=/other/tree).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zdmq import Client
from zdmq.bench.workloads import cpu_seconds
from zdmq.local import LocalCluster

BATCH = 4


async def _flow(config: str, messages: int, size: int) -> float:
    async with Client.from_config(config) as c:
        await c.create_queue("big")
        body = os.urandom(size)
        t0 = time.monotonic()
        for _ in range(messages // BATCH):
            await c.push_many("big", [body] * BATCH)
            got = await c.receive("big", BATCH)
            while len(got) < BATCH:
                got += await c.receive("big", BATCH - len(got))
            assert all(m.body == body for m in got)
            await c.ack("big", [m.receipt for m in got])
        return messages // BATCH * BATCH / (time.monotonic() - t0)


def one_run(durability: str, messages: int, size: int, profile: Path | None) -> tuple[float, float]:
    """(msgs/s, node CPU ms per message) of one run on a fresh node."""
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster.ephemeral(d, nodes=1, durability=durability)
        with cluster:
            cluster.start()
            pids = [p.pid for p in cluster.nodes.values() if p.pid is not None]
            spy = None
            if profile is not None:
                spy_bin = Path(sys.executable).with_name("py-spy")
                argv = [str(spy_bin), "record", "--pid", str(pids[0]), "-r", "500", "-f", "raw"]
                spy = subprocess.Popen(
                    [*argv, "-o", str(profile), "--nonblocking"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1)
            c0 = cpu_seconds(pids)
            rate = asyncio.run(_flow(str(cluster.config_path), messages, size))
            cpu = cpu_seconds(pids) - c0
            if spy is not None:
                spy.send_signal(2)
                spy.wait(timeout=30)
    return rate, cpu / messages * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--durability", nargs="+", default=["fsync"])
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", type=Path, help="py-spy raw output of the last run")
    args = ap.parse_args()
    print("durability  run  msgs/s  MiB/s  node CPU ms/msg")
    for r in range(args.runs):
        for dur in args.durability:
            last = r == args.runs - 1
            rate, ms = one_run(dur, args.messages, args.size, args.profile if last else None)
            print(f"{dur:10}  {r + 1:3}  {rate:6.1f}  {rate * args.size / 2**20:5.1f}  {ms:15.2f}")


if __name__ == "__main__":
    main()
