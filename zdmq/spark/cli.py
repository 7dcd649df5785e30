"""What `zdmq spark drain` and the Spark part of `zdmq demo` run (imported only by them).

`zdmq/cli.py` parses the arguments and imports this module lazily, so the rest of the CLI
works without pyspark.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from zdmq.client import Client
from zdmq.config import ClusterConfig

__all__ = ["demo_part", "drain_command"]

DEMO_SCHEMA = "event long, user string, amount long"


def drain_command(config_path: str, args: Any) -> int:
    from zdmq.spark.datasource import check_queue
    from zdmq.spark.drain import drain, session

    check_queue(ClusterConfig.load(config_path).to_dict(), args.queue)  # before the JVM starts
    spark = session(args.master, app_name=f"zdmq-drain-{args.queue}")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = drain(
            spark,
            args.queue,
            args.out,
            config=config_path,
            fmt=args.format,
            mode=args.mode,
            max_messages=args.max_messages,
            batch_size=args.batch_size,
            visibility_s=args.visibility,
            decode=args.decode,
            json_schema=args.json_schema,
        )
    finally:
        spark.stop()
    per_node = " ".join(f"{n}={c}" for n, c in sorted(result.per_node.items()))
    print(
        f"drained {result.messages} messages of {result.queue} into {result.out} "
        f"({args.format}) in {result.seconds:.2f}s ({result.rate:,.0f}/s; {per_node})"
    )
    print(
        f"acked {result.acked}" + (f"; not acked: {result.ack_failed}" if result.ack_failed else "")
    )
    if result.undecodable:
        print(f"{result.undecodable} bodies did not decode: left leased, they come back later")
    return 0 if result.ok else 1


def demo_part(config: ClusterConfig, n: int, master: str, out: str | None) -> bool:
    """Pushes `n` JSON events, drains them with Spark into Parquet (parsed), aggregates
    per user into Parquet, prints the aggregate and checks it against what was pushed."""
    from pyspark.sql import functions as F

    from zdmq.spark.drain import drain, session

    queue = f"demo-spark-{uuid.uuid4().hex[:8]}"
    events = [(i, f"u{i % 7}", (i * 37) % 101) for i in range(n)]  # event, user, amount

    async def push() -> None:
        async with Client(config=config) as c:
            await c.create_queue(queue)
            bodies = [
                json.dumps({"event": i, "user": u, "amount": a}).encode() for i, u, a in events
            ]
            for start in range(0, n, 1000):
                await c.push_many(queue, bodies[start : start + 1000])

    t0 = time.perf_counter()
    asyncio.run(push())
    print(f"spark: pushed {n} JSON events to {queue} in {time.perf_counter() - t0:.2f}s")
    base = Path(out or tempfile.mkdtemp(prefix="zdmq-demo-"))
    t0 = time.perf_counter()
    spark = session(master, app_name="zdmq-demo")
    spark.sparkContext.setLogLevel("ERROR")
    print(f"spark: session on {master} ready in {time.perf_counter() - t0:.1f}s")
    try:
        result = drain(
            spark,
            queue,
            base / "events",
            config=config,
            decode="json",
            json_schema=DEMO_SCHEMA,
            mode="overwrite",
        )
        print(
            f"spark: drained {result.messages} messages into {base / 'events'} (Parquet, parsed) "
            f"in {result.seconds:.2f}s ({result.rate:,.0f}/s), acked {result.acked} after the "
            "commit"
        )
        agg = (
            spark.read.parquet(str(base / "events"))
            .groupBy(F.col("body.user").alias("user"))
            .agg(F.count("*").alias("events"), F.sum("body.amount").alias("amount"))
            .orderBy("user")
        )
        agg.write.mode("overwrite").parquet(str(base / "per_user"))
        rows = spark.read.parquet(str(base / "per_user")).orderBy("user").collect()
    finally:
        spark.stop()

    expected: dict[str, list[int]] = {}
    for _, user, amount in events:
        acc = expected.setdefault(user, [0, 0])
        acc[0] += 1
        acc[1] += amount
    print(f"spark: per user, from {base / 'per_user'}:")
    print(f"  {'user':<6} {'events':>8} {'amount':>10}")
    for r in rows:
        print(f"  {r.user:<6} {r.events:>8} {r.amount:>10}")
    got = {r.user: [r.events, r.amount] for r in rows}
    left = asyncio.run(_depth(config, queue))
    ok = got == expected and result.ok and left == 0
    print(
        f"spark: aggregate {'matches' if got == expected else 'DIFFERS FROM'} what was pushed; "
        f"{left} messages left in the queue -> {'OK' if ok else 'FAILED'}"
    )
    return ok


async def _depth(config: ClusterConfig, queue: str) -> int:
    async with Client(config=config) as c:
        messages = (await c.stats(queue)).messages
        await c.delete_queue(queue)
        return messages
