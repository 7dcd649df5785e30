"""What `zdmq spark drain` and the Spark part of `zdmq demo` run (imported only by them).

`zdmq/cli.py` parses the arguments and imports this module lazily, so the rest of the CLI
works without pyspark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zdmq.client import Client
from zdmq.config import ClusterConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["demo_part", "drain_command"]

DEMO_SCHEMA = "event long, user string, amount long"


def drain_command(config_path: str, queue: str, out: str, master: str, **options: Any) -> int:
    """`zdmq spark drain`: `options` are `zdmq.spark.drain`'s keyword arguments."""
    from zdmq.spark.datasource import check_queue
    from zdmq.spark.drain import drain

    check_queue(ClusterConfig.load(config_path).to_dict(), queue)  # before the JVM starts
    with _spark(master, f"zdmq-drain-{queue}") as spark:
        result = drain(spark, queue, out, config=config_path, **options)
    per_node = " ".join(f"{n}={c}" for n, c in sorted(result.per_node.items()))
    print(
        f"drained {result.messages} messages of {result.queue} into {result.out} "
        f"({options.get('fmt', 'parquet')}) in {result.seconds:.2f}s ({result.rate:,.0f}/s; "
        f"{per_node})"
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

    from zdmq.spark.drain import drain

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
    with _spark(master, "zdmq-demo") as spark:
        print(f"spark: session on {master} ready in {time.perf_counter() - t0:.1f}s")
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
    left = asyncio.run(_count_and_delete(config, queue))
    ok = got == expected and result.ok and left == 0
    print(
        f"spark: aggregate {'matches' if got == expected else 'DIFFERS FROM'} what was pushed; "
        f"{left} messages left in the queue -> {'OK' if ok else 'FAILED'}"
    )
    return ok


@contextlib.contextmanager
def _spark(master: str, app_name: str) -> Iterator[SparkSession]:
    """A zdmq SparkSession that logs errors only, stopped on the way out."""
    from zdmq.spark.drain import session

    spark = session(master, app_name=app_name)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


async def _count_and_delete(config: ClusterConfig, queue: str) -> int:
    async with Client(config=config) as c:
        messages = (await c.stats(queue)).messages
        await c.delete_queue(queue)
        return messages
