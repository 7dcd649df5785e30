"""Drain throughput: the Spark drain job on local[2] against the plain async client.

    .venv/bin/python loadtest/spark_drain_bench.py --messages 100000 --runs 3

Starts its own 4-node cluster on loopback ports (replication 2, `--durability`, fsync by
default), then for each run pushes the same number of 100-byte messages to a fresh queue
twice and drains it:

- client: `zdmq.Client.receive(q, 100)` + `ack` in `--concurrency` workers until empty
  (at-least-once, the same leases and acks the Spark job uses);
- spark: `zdmq.spark.drain` into Parquet on `--master` (local[2]), acked after the commit,
  in a SparkSession started (and warmed by one small drain) before the clock starts.

Prints medians and every sample, the ratio spark/client, and writes JSON under
loadtest/results/. Bounded: `--messages` per run, `--runs` runs, then it stops its cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zdmq
import zdmq.spark
from zdmq.local import LocalCluster


async def push(cfg: Path, queue: str, n: int, size: int) -> None:
    async with zdmq.Client.from_config(cfg) as c:
        await c.create_queue(queue)
        body = b"x" * size
        for start in range(0, n, 5000):
            await c.push_many(queue, [body] * min(5000, n - start))


async def client_drain(cfg: Path, queue: str, concurrency: int) -> tuple[int, float]:
    async with zdmq.Client.from_config(cfg) as c:
        done = 0
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal done
            while msgs := await c.receive(queue, 100, visibility_s=300):
                result = await c.ack(queue, [m.receipt for m in msgs])
                done += result.done

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
        assert (await c.stats(queue)).messages == 0
        return done, seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--durability", default="fsync", choices=["fsync", "os", "memory"])
    ap.add_argument("--concurrency", type=int, default=8, help="client receive workers")
    ap.add_argument("--inflight", type=int, default=8, help="spark: receives in flight per task")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results"))
    args = ap.parse_args(argv)

    samples: dict[str, list[float]] = {"client": [], "spark": []}
    with (
        tempfile.TemporaryDirectory(prefix="zdmq-spark-bench-") as tmp,  # cluster and Parquet
        LocalCluster.ephemeral(Path(tmp) / "cluster", nodes=4, durability=args.durability) as cl,
    ):
        work = Path(tmp)
        cfg = cl.config_path
        spark = zdmq.spark.session(args.master, app_name="zdmq-spark-bench")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            asyncio.run(push(cfg, "warmup", 2000, args.size))
            zdmq.spark.drain(spark, "warmup", str(work / "warmup"), config=cfg)
            for run in range(args.runs):
                q = f"client-{run}"
                asyncio.run(push(cfg, q, args.messages, args.size))
                n, s = asyncio.run(client_drain(cfg, q, args.concurrency))
                assert n == args.messages, (n, args.messages)
                samples["client"].append(n / s)
                q = f"spark-{run}"
                asyncio.run(push(cfg, q, args.messages, args.size))
                result = zdmq.spark.drain(
                    spark, q, str(work / q), config=cfg, inflight=args.inflight
                )
                assert result.ok and result.messages == args.messages, result
                samples["spark"].append(result.rate)
                print(
                    f"run {run + 1}: client {samples['client'][-1]:,.0f} msgs/s, "
                    f"spark {result.rate:,.0f} msgs/s ({result.seconds:.2f}s, "
                    f"acks {result.ack_seconds:.2f}s)",
                    flush=True,
                )
        finally:
            spark.stop()
    client, sp = statistics.median(samples["client"]), statistics.median(samples["spark"])
    print(f"\n{args.messages:,} x {args.size} B, 4 nodes ({args.durability}), {args.runs} runs")
    print(f"  client receive+ack x{args.concurrency}: {client:>10,.0f} msgs/s (median)")
    print(f"  spark drain on {args.master}:        {sp:>10,.0f} msgs/s (median)")
    print(f"  ratio spark/client: {sp / client:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"spark-drain-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "samples": samples,
                "median": {"client": client, "spark": sp},
                "ratio": sp / client,
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
            },
            indent=2,
        )
    )
    print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
