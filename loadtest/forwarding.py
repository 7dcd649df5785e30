"""What a caller that does not route (curl, Locust's "any node", another language) costs
the cluster: JSON batches through one node of a 4-node cluster, which forwards each
message's share to the node that owns it.

One caller process pushes `--messages` 100-byte messages in JSON batches of `--batch`
through node n1, `--inflight` batches at a time, then receives them in batches through
n1 and acks each batch through n1. Prints msgs/s for each phase and the nodes' CPU
(user+system, all nodes) per message. Runs against whichever zdmq is first on the
import path (PYTHONPATH=/other/tree measures another checkout).

    .venv/bin/python loadtest/forwarding.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from zdmq import _http
from zdmq.bench.workloads import cpu_seconds
from zdmq.local import LocalCluster


async def _flow(url: str, messages: int, batch: int, inflight: int) -> tuple[float, float]:
    q = "forwarded"
    pool = _http.HttpPool()
    try:
        await _http.call(pool, "PUT", f"{url}/v1/queues/{q}")
        body = {"messages": [{"body": "x" * 100, "encoding": "utf-8"}] * batch}
        left = messages // batch

        async def pusher() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await _http.call(pool, "POST", f"{url}/v1/queues/{q}/batch", json=body)

        t0 = time.monotonic()
        await asyncio.gather(*(pusher() for _ in range(inflight)))
        t1 = time.monotonic()
        got = 0

        async def receiver() -> None:
            nonlocal got
            while got < messages:
                reply = await _http.call(
                    pool, "POST", f"{url}/v1/queues/{q}/receive", params={"max": str(batch)}
                )
                msgs = reply.json()["messages"]
                if not msgs:
                    continue
                got += len(msgs)
                receipts = {"receipts": [m["receipt"] for m in msgs]}
                await _http.call(pool, "POST", f"{url}/v1/queues/{q}/ack", json=receipts)

        await asyncio.gather(*(receiver() for _ in range(inflight)))
        t2 = time.monotonic()
        return messages / (t1 - t0), messages / (t2 - t1)
    finally:
        await pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--durability", default="fsync")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    print("run  push msgs/s  recv+ack msgs/s  node CPU µs/msg (push + recv+ack)")
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="zdmq-fwd-") as d:
            cluster = LocalCluster.ephemeral(d, nodes=args.nodes, durability=args.durability)
            with cluster:
                pids = [p.pid for p in cluster.nodes.values() if p.pid is not None]
                url = cluster.config.node("n1").url
                c0 = cpu_seconds(pids)
                push, recv = asyncio.run(_flow(url, args.messages, args.batch, args.inflight))
                cpu = (cpu_seconds(pids) - c0) / args.messages * 1e6
        rows.append((push, recv, cpu))
        print(f"{run + 1:3}  {push:11,.0f}  {recv:15,.0f}  {cpu:8.1f}")
    med = [statistics.median(c) for c in zip(*rows, strict=True)]
    print(f"med  {med[0]:11,.0f}  {med[1]:15,.0f}  {med[2]:8.1f}")


if __name__ == "__main__":
    main()
