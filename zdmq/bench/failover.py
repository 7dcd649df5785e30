"""Failover time: from a kill -9 of a group's leader to the group's first acknowledged write.

A 4-node local cluster with `replication: 3` (fsync). For each kill: one client pushes one
message at a time into the victim node's own group (dedup ids that hash there), the
victim is killed with SIGKILL, and the time from the kill to the first push acknowledged
after it is the failover time. The victim then restarts, and the next kill waits until
every group is led by its preferred node again. Victims go round the nodes.

    python -m zdmq.bench.failover --kills 20 [--timeout-s 1.0] [--out failover.json]

It prints each kill's time and the p50, p99 and max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from zdmq import Client, ZdmqError
from zdmq.hashing import Placement
from zdmq.local import LocalCluster
from zdmq.models import dedup_message_id

__all__ = ["main", "measure"]


def _settled(cluster: LocalCluster) -> bool:
    """Every node up sees every group led by its own node."""
    for node_id in cluster.nodes:
        try:
            url = cluster.config.node(node_id).url + "/v1/health"
            with urllib.request.urlopen(url, timeout=2) as r:
                groups = json.load(r)["groups"]
        except (OSError, ValueError, KeyError):
            return False
        if any(g["leader"] != gid for gid, g in groups.items()):
            return False
    return True


async def _wait_settled(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(_settled, cluster):
        if time.monotonic() > deadline:
            raise RuntimeError("the groups did not settle on their preferred leaders")
        await asyncio.sleep(0.2)


async def _one_kill(
    cluster: LocalCluster, client: Client, queue: str, victim: str, dedups: list[str]
) -> float:
    """Seconds from killing `victim` to the first push into its group acknowledged after."""
    killed_at: float | None = None
    first_ack: float | None = None
    n = 0

    async def writer() -> None:
        nonlocal n, first_ack
        while first_ack is None:
            n += 1
            started = time.monotonic()
            try:
                # Each is a proposal in the group's log (a repeat stores nothing, once
                # its entry commits).
                await client.push(queue, b"x" * 100, dedup_id=dedups[n % len(dedups)])
            except ZdmqError:
                continue
            if killed_at is not None and started >= killed_at:  # sent after the kill
                first_ack = time.monotonic()

    task = asyncio.create_task(writer())
    await asyncio.sleep(0.5)
    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.kill, victim)
    await asyncio.wait_for(task, 60)
    assert first_ack is not None
    await asyncio.to_thread(cluster.start_node, victim)
    await _wait_settled(cluster)
    return first_ack - killed_at


async def measure(kills: int, timeout_s: float = 1.0, *, log: Any = print) -> list[float]:
    """Failover times (s) of `kills` kills on a fresh cluster in a temporary directory."""
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster.ephemeral(d, nodes=4, replication=3)
        try:
            cluster.start()
            await _wait_settled(cluster)
            times: list[float] = []
            async with Client.from_config(cluster.config_path, timeout_s=timeout_s) as client:
                queue = "failover"
                await client.create_queue(queue)
                nodes = list(cluster.config.node_ids)
                for i in range(kills):
                    victim = nodes[i % len(nodes)]
                    ids = _group_ids(client.placement, queue, victim)
                    took = await _one_kill(cluster, client, queue, victim, ids)
                    times.append(took)
                    log(f"kill {i + 1}/{kills}: {victim}: first write after {took:.2f} s")
            return times
        finally:
            cluster.close()


def _group_ids(placement: Placement, queue: str, node: str) -> list[str]:
    """Dedup ids whose message ids land in `node`'s group: a push by each is one write there."""
    out: list[str] = []
    i = 0
    while len(out) < 200:
        i += 1
        if placement.owner(dedup_message_id(queue, f"{node}-{i}")) == node:
            out.append(f"{node}-{i}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zdmq.bench.failover", description=__doc__)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=1.0, help="the client's call timeout")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    times = asyncio.run(measure(args.kills, args.timeout_s))
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    summary = {
        "kills": len(times),
        "p50_s": round(statistics.median(times), 3),
        "p99_s": round(p99, 3),
        "max_s": round(max(times), 3),
        "times_s": [round(t, 3) for t in times],
    }
    print(json.dumps(summary))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
