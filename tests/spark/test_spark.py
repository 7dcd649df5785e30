"""The Spark side against a real 4-node cluster and a real local SparkSession (local[2,2]).

Covers issue 5's acceptance: the drain job (every id once, identical bodies; a task that
fails on its first attempt), the streaming read (availableNow, stopped half way, restarted
while producers push), the write (a retried task stores nothing twice), and the batch read
with JSON decoding acked from its committed output.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql import functions as F

import zdmq
import zdmq.spark
from tests.helpers import unique
from zdmq.local import LocalCluster

pytestmark = pytest.mark.spark


# ---- helpers --------------------------------------------------------------------------------
def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _create_and_push(cfg: Path, queue: str, bodies: list[bytes]) -> list[str]:
    async with zdmq.Client.from_config(cfg) as c:
        await c.create_queue(queue)
        ids: list[str] = []
        for start in range(0, len(bodies), 2000):
            ids += await c.push_many(queue, bodies[start : start + 2000])
        return ids


async def _stats(cfg: Path, queue: str) -> zdmq.QueueStats:
    async with zdmq.Client.from_config(cfg) as c:
        return await c.stats(queue)


def stats(cluster: LocalCluster, queue: str) -> zdmq.QueueStats:
    return run(_stats(cluster.config_path, queue))


def bodies_of(n: int) -> list[bytes]:
    """JSON events, with every 97th body raw binary that is not UTF-8."""
    out = []
    for i in range(n):
        if i % 97 == 0:
            out.append(bytes([0xFF, 0xFE, i % 256]) + os.urandom(i % 50))
        else:
            out.append(f'{{"event": {i}, "user": "u{i % 13}", "amount": {i % 100}}}'.encode())
    return out


def counters(cluster: LocalCluster) -> Counter[str]:
    async def go() -> Counter[str]:
        from zdmq import _http

        pool = _http.HttpPool()
        total: Counter[str] = Counter()
        try:
            for url in cluster.urls:
                total.update((await _http.call(pool, "GET", url + "/v1/health")).json()["counters"])
        finally:
            await pool.close()
        return total

    return run(go())


# ---- the drain job ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n", [20_000, pytest.param(100_000, marks=pytest.mark.slow, id="100000-acceptance")]
)
def test_drain_writes_every_pushed_id_exactly_once_with_identical_bodies_and_acks_them(
    spark: Any, cluster: LocalCluster, tmp_path: Path, n: int
) -> None:
    q = unique("drain")
    bodies = bodies_of(n)
    expected = dict(zip(run(_create_and_push(cluster.config_path, q, bodies)), bodies, strict=True))
    result = zdmq.spark.drain(spark, q, tmp_path / "out", config=cluster.config_path)
    assert result.ok and result.messages == n and result.acked == n, result
    assert sum(result.per_node.values()) == n and set(result.per_node) == set(cluster.nodes)

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    ids = [r.id for r in rows]
    assert len(ids) == n and set(ids) == set(expected)  # every id, exactly once
    assert all(bytes(r.body) == expected[r.id] for r in rows)  # bodies byte for byte
    assert {r.encoding for r in rows} == {"utf-8", "base64"}
    assert all(r.receive_count == 1 for r in rows)
    placement = cluster.config.node_ids
    assert all(r.node in placement for r in rows)
    left = stats(cluster, q)
    assert left.messages == 0 and left.in_flight == 0


class FailFirstAttemptOf:
    """A test-only transform: on its first attempt, the task of `node` raises after passing
    `after` rows downstream (a real task failure, which Spark retries)."""

    def __init__(self, node: str, after: int) -> None:
        self.node = node
        self.after = after

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        passed = 0
        for batch in batches:
            if batch.num_rows and batch.column("node")[0].as_py() == self.node:
                if ctx.attemptNumber() == 0 and passed >= self.after:
                    raise RuntimeError(f"injected failure in the task of {self.node}")
                passed += batch.num_rows
            yield batch


def test_drain_whose_task_fails_on_its_first_attempt_writes_every_id_once_and_leaves_no_lease(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    q = unique("drain-fail")
    n = 8000
    bodies = bodies_of(n)
    expected = dict(zip(run(_create_and_push(cluster.config_path, q, bodies)), bodies, strict=True))
    result = zdmq.spark.drain(
        spark,
        q,
        tmp_path / "out",
        config=cluster.config_path,
        transform=FailFirstAttemptOf("n2", after=600),
    )
    assert result.ok and result.messages == n, result

    rows = spark.read.parquet(str(tmp_path / "out")).select("id", "body", "node", "receive_count")
    got = rows.collect()
    assert len(got) == n and {r.id for r in got} == set(expected)
    assert all(bytes(r.body) == expected[r.id] for r in got)
    # The failed attempt leased n2's first rows and released them; the retry leased them again.
    again = [r for r in got if r.receive_count == 2]
    assert len(again) >= 600 and {r.node for r in again} == {"n2"}
    left = stats(cluster, q)
    assert left.messages == 0 and left.in_flight == 0


# ---- the data source: streaming ---------------------------------------------------------------
def test_stream_available_now_stopped_half_way_and_restarted_as_producers_push_sinks_every_id(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    q = unique("stream")
    cfg = cluster.config_path
    pushed: list[str] = run(_create_and_push(cfg, q, [f"m{i}".encode() for i in range(6000)]))
    lock = threading.Lock()
    stop_producing = threading.Event()

    def producer() -> None:
        async def go() -> None:
            async with zdmq.Client.from_config(cfg) as c:
                for round_ in range(30):  # bounded: at most 3,000 more messages
                    if stop_producing.is_set():
                        return
                    ids = await c.push_many(q, [f"p{round_}-{i}".encode() for i in range(100)])
                    with lock:
                        pushed.extend(ids)
                    await asyncio.sleep(0.1)

        run(go())

    def start() -> Any:
        return (
            spark.readStream.format("zdmq")
            .option("config", str(cfg))
            .option("queue", q)
            .option("max_messages_per_batch", "1000")
            .option("visibility_s", "8")
            .load()
            .writeStream.format("parquet")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .option("path", str(tmp_path / "sink"))
            .trigger(availableNow=True)
            .start()
        )

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        query = start()
        deadline = time.monotonic() + 120
        while query.isActive and (query.lastProgress or {}).get("batchId", -1) < 2:
            assert time.monotonic() < deadline, "the first run made no progress"
            time.sleep(0.05)
        stopped_half_way = query.isActive
        query.stop()  # half way: later batches (and perhaps one running) never complete
        start().awaitTermination()  # restarted from the checkpoint, producers still pushing
    finally:
        stop_producing.set()
        thread.join()
    assert stopped_half_way, "the first run finished before it could be stopped half way"
    # Runs until the queue is empty. Leases a stopped run took but Spark never logged come
    # back after visibility_s (8 s), so a run may find nothing visible yet: wait for them.
    deadline = time.monotonic() + 90
    while (s := stats(cluster, q)).messages:
        assert time.monotonic() < deadline, f"the queue never emptied: {s}"
        if s.visible:
            start().awaitTermination()
        else:
            time.sleep(0.2)

    ids = [r.id for r in spark.read.parquet(str(tmp_path / "sink")).select("id").collect()]
    assert set(ids) == set(pushed)  # nothing lost, nothing foreign
    duplicates = len(ids) - len(set(ids))
    assert duplicates <= 2000, duplicates  # at most the batches a stop cut short
    assert stats(cluster, q).in_flight == 0


# ---- the data source: write -------------------------------------------------------------------
class FailFirstAttemptOfPartition0:
    """A test-only map: partition 0's first attempt raises once `after` of its rows went
    through and the queue holds that many (so the writer did push them first)."""

    def __init__(self, after: int, config: Path, queue: str) -> None:
        self.after = after
        self.config = config
        self.queue = queue

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        passed = 0
        for batch in batches:
            if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and passed >= self.after:
                deadline = time.monotonic() + 60
                while run(_stats(self.config, self.queue)).messages < self.after:
                    assert time.monotonic() < deadline, "the writer never pushed"
                    time.sleep(0.05)
                raise RuntimeError("injected failure in write partition 0")
            passed += batch.num_rows
            yield batch


def test_write_of_50000_rows_with_a_task_retried_stores_each_row_exactly_once(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("write")
    run(_create_and_push(cluster.config_path, q, []))
    dups_before = counters(cluster)["duplicates"]
    n = 50_000
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2000")
    df = (
        spark.range(0, n, 1, 2)
        .selectExpr("concat('row-', cast(id as string)) as body")
        .mapInArrow(FailFirstAttemptOfPartition0(8000, cluster.config_path, q), "body string")
    )
    (
        df.write.format("zdmq")
        .option("config", str(cluster.config_path))
        .option("queue", q)
        .option("batch_size", "1000")
        .mode("append")
        .save()
    )
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert stats(cluster, q).messages == n
    # The failed attempt had pushed rows; the retry pushed them again and the nodes dropped them.
    assert counters(cluster)["duplicates"] - dups_before >= 1000

    async def pop_all() -> list[bytes]:
        async with zdmq.Client.from_config(cluster.config_path) as c:
            out: list[bytes] = []
            while batch := await c.pop_many(q, 1000):
                out += [m.body for m in batch]
            return out

    assert Counter(run(pop_all())) == Counter(f"row-{i}".encode() for i in range(n))


def test_write_pushes_rows_without_a_body_column_as_json_objects(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("write-json")
    run(_create_and_push(cluster.config_path, q, []))
    df = spark.createDataFrame([(1, "a"), (2, "b")], "n long, s string")
    df.write.format("zdmq").option("config", str(cluster.config_path)).option("queue", q).mode(
        "append"
    ).save()

    async def pop_all() -> list[bytes]:
        async with zdmq.Client.from_config(cluster.config_path) as c:
            out: list[bytes] = []
            while batch := await c.pop_many(q, 10):  # one node per pop
                out += [m.body for m in batch]
            return out

    import orjson

    assert sorted(orjson.loads(b)["n"] for b in run(pop_all())) == [1, 2]


# ---- the data source: batch read ----------------------------------------------------------------
def test_batch_read_decodes_json_into_the_schema_and_acks_from_the_committed_output(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    q = unique("read-json")
    events = [f'{{"user": "u{i % 5}", "amount": {i}}}'.encode() for i in range(2000)]
    run(_create_and_push(cluster.config_path, q, [*events, b"not json", b"\xff\x00"]))
    df = (
        spark.read.format("zdmq")
        .option("config", str(cluster.config_path))
        .option("queue", q)
        .option("decode", "json")
        .option("json_schema", "user string, amount long")
        .load()
    )
    assert df.schema["body"].dataType.simpleString() == "struct<user:string,amount:bigint>"
    df.write.parquet(str(tmp_path / "out"))
    leased = stats(cluster, q)
    assert leased.in_flight == 2002 and leased.visible == 0  # read leases, acks nothing

    committed = spark.read.parquet(str(tmp_path / "out"))
    totals = committed.groupBy("body.user").agg(F.sum("body.amount").alias("total")).collect()
    per_user = {r.user: r.total for r in totals}
    assert per_user == {f"u{k}": sum(i for i in range(2000) if i % 5 == k) for k in range(5)}
    result = zdmq.spark.ack_receipts(q, committed, config=cluster.config_path)
    assert result.ok and result.done == 2000
    # The two bodies that are not JSON objects were not written and stay leased (they come
    # back after visibility_s, or go to a dead-letter queue after max_receives).
    left = stats(cluster, q)
    assert left.messages == 2 and left.in_flight == 2


def test_bad_options_fail_before_any_task_and_name_the_option(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("opts")
    run(_create_and_push(cluster.config_path, q, [b"x"]))

    def reader(**options: str) -> Any:
        return spark.read.format("zdmq").options(config=str(cluster.config_path), **options)

    with pytest.raises(Exception, match="option decode"):
        reader(queue=q, decode="xml").load().collect()
    with pytest.raises(Exception, match="option json_schema"):
        reader(queue=q, decode="json").load().collect()
    with pytest.raises(Exception, match="unknown option 'visibility'"):
        reader(queue=q, visibility="3").load().collect()
    with pytest.raises(Exception, match=r"queue_not_found|does not exist"):
        reader(queue=unique("missing")).load().collect()
    assert stats(cluster, q).in_flight == 0
