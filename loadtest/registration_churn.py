"""How many metadata-list registrations a steady flow costs (the unregister grace).

Producers push one at a time and consumers receive (long polling) and ack at once on a
4-node cluster, so each node's UUID queue keeps running dry and refilling. Prints, per
`unregister_grace_s`, the registrations and unregistrations the nodes made per 1,000
messages (from their `/v1/health` counters), the rate, the client's receive calls per
message and the nodes' CPU per message.

    .venv/bin/python loadtest/registration_churn.py --grace 0 1 0 1 --messages 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request

from zdmq import Client
from zdmq.bench.workloads import cpu_seconds
from zdmq.config import ClusterConfig
from zdmq.local import LocalCluster


async def _flow(config: str, messages: int, producers: int, consumers: int) -> tuple[float, float]:
    q = "churn"
    async with Client.from_config(config) as c:
        await c.create_queue(q)
        per = messages // producers
        done = 0

        async def produce() -> None:
            for _ in range(per):
                await c.push(q, b"x" * 100)

        async def consume() -> None:
            nonlocal done
            while done < per * producers:
                got = await c.receive(q, 10, wait_s=0.5)
                done += len(got)
                if got:
                    await c.ack(q, [m.receipt for m in got])

        t0 = time.monotonic()
        await asyncio.gather(
            *(produce() for _ in range(producers)), *(consume() for _ in range(consumers))
        )
        rate = per * producers / (time.monotonic() - t0)
        return rate, c.calls["receive"].calls / (per * producers)


def _counters(config: str) -> dict[str, int]:
    totals = {"registrations": 0, "unregistrations": 0}
    for node in ClusterConfig.load(config).nodes:
        with urllib.request.urlopen(node.url + "/v1/health", timeout=10) as r:
            counters = json.load(r)["counters"]
        for k in totals:
            totals[k] += int(counters.get(k, 0))
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grace", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--durability", default="fsync")
    args = ap.parse_args()
    print("grace_s  msgs/s  reg/1k msgs  unreg/1k msgs  receive calls/msg  node µs/msg")
    for grace in args.grace:
        with tempfile.TemporaryDirectory() as d:
            cluster = LocalCluster.ephemeral(
                d, nodes=4, durability=args.durability, unregister_grace_s=grace
            )
            with cluster:
                cluster.start()
                pids = [p.pid for p in cluster.nodes.values() if p.pid is not None]
                cfg = str(cluster.config_path)
                c0 = cpu_seconds(pids)
                rate, rcalls = asyncio.run(
                    _flow(cfg, args.messages, args.producers, args.consumers)
                )
                cpu = cpu_seconds(pids) - c0
                counts = _counters(cfg)
            per_k = 1000 / args.messages
            print(
                f"{grace:7g}  {rate:6,.0f}  {counts['registrations'] * per_k:11.1f}  "
                f"{counts['unregistrations'] * per_k:13.1f}  {rcalls:17.2f}  "
                f"{cpu / args.messages * 1e6:11.0f}"
            )


if __name__ == "__main__":
    main()
