"""The Spark side against a real 4-node cluster and a real local SparkSession (local[2,2]).

Pins the guarantees of docs/spark.md: the drain job (every id once, identical bodies; a
task that fails on its first attempt; a killed worker; a failed job commit), the streaming
read (availableNow, stopped half way, restarted while producers push), the write (a retried
task stores nothing twice), and the batch read with JSON decoding acked from its committed
output.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import DataType, StructType

import zdmq
import zdmq.spark
from tests.helpers import unique
from zdmq.hashing import Placement
from zdmq.local import LocalCluster
from zdmq.spark import _io
from zdmq.spark._options import ReadOptions
from zdmq.spark.datasource import arrow_schema, read_schema_ddl

pytestmark = pytest.mark.spark


# ---- helpers --------------------------------------------------------------------------------
def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _create_and_push(cfg: Path, queue: str, bodies: list[bytes]) -> list[str]:
    async with zdmq.Client.from_config(cfg) as c:
        await c.create_queue(queue)
        # Batches of 25, 40 at a time: a batch's fresh messages share one node, and the
        # tests count on every node holding a share (task 1 reads node 2's).
        ids: list[str] = []
        for start in range(0, len(bodies), 1000):
            chunk = bodies[start : start + 1000]
            parts = [c.push_many(queue, chunk[i : i + 25]) for i in range(0, len(chunk), 25)]
            for part in await asyncio.gather(*parts):
                ids += part
        return ids


async def _stats(cfg: Path, queue: str) -> zdmq.QueueStats:
    async with zdmq.Client.from_config(cfg) as c:
        return await c.stats(queue)


def pushed(cluster: LocalCluster, queue: str, bodies: list[bytes]) -> dict[str, bytes]:
    """Creates `queue` and pushes `bodies`: message id -> body."""
    ids = run(_create_and_push(cluster.config_path, queue, bodies))
    return dict(zip(ids, bodies, strict=True))


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


def owner_of(cluster: LocalCluster, message_id: str) -> str:
    c = cluster.config
    return Placement(list(c.node_ids), c.partitions, c.replication).owner(message_id)


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
    "n", [5_000, pytest.param(100_000, marks=pytest.mark.slow, id="100000-messages")]
)
def test_drain_writes_every_pushed_id_exactly_once_with_identical_bodies_and_acks_them(
    spark: Any, cluster: LocalCluster, tmp_path: Path, n: int
) -> None:
    q = unique("drain")
    expected = pushed(cluster, q, bodies_of(n))
    result = zdmq.spark.drain(spark, q, tmp_path / "out", config=cluster.config_path)
    assert result.ok and result.messages == n and result.acked == n, result
    assert sum(result.per_node.values()) == n and set(result.per_node) == set(cluster.nodes)

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    ids = [r.id for r in rows]
    assert len(ids) == n and set(ids) == set(expected)  # every id, exactly once
    assert all(bytes(r.body) == expected[r.id] for r in rows)  # bodies byte for byte
    assert {r.encoding for r in rows} == {"utf-8", "base64"}
    assert all(r.receive_count == 1 for r in rows)
    assert all(r.node == owner_of(cluster, r.id) for r in rows)  # each task read its node
    left = stats(cluster, q)
    assert left.messages == 0 and left.in_flight == 0


class FailFirstAttempt:
    """A test-only mapInArrow function (or drain transform): the first attempt of task
    partition `partition` fails once `after` of its rows went through. It raises (a task
    failure, which Spark retries), or with `kill` its Python worker exits on the spot, as
    a killed executor process would: no Python cleanup runs. With `pushed_to` (cluster
    file, queue) it first waits until that queue holds `after` messages, so that a writer
    downstream did push them."""

    def __init__(
        self, partition: int, after: int, *, kill: bool = False, pushed_to: Any = None
    ) -> None:
        self.partition = partition
        self.after = after
        self.kill = kill
        self.pushed_to = pushed_to

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        failing = ctx.partitionId() == self.partition and ctx.attemptNumber() == 0
        passed = 0
        for batch in batches:
            if failing and passed >= self.after:
                if self.pushed_to is not None:
                    deadline = time.monotonic() + 60
                    while run(_stats(*self.pushed_to)).messages < self.after:
                        assert time.monotonic() < deadline, "the writer never pushed"
                        time.sleep(0.05)
                if self.kill:
                    os._exit(1)
                raise RuntimeError(f"injected failure in task partition {self.partition}")
            passed += batch.num_rows
            yield batch


def test_drain_whose_task_fails_on_its_first_attempt_writes_every_id_once_and_leaves_no_lease(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    q = unique("drain-fail")
    n = 8000
    expected = pushed(cluster, q, bodies_of(n))
    result = zdmq.spark.drain(
        spark,
        q,
        tmp_path / "out",
        config=cluster.config_path,
        transform=FailFirstAttempt(1, after=600),  # task 1 leases node 2
    )
    assert result.ok and result.messages == n, result

    rows = spark.read.parquet(str(tmp_path / "out")).select("id", "body", "node", "receive_count")
    got = rows.collect()
    assert len(got) == n and {r.id for r in got} == set(expected)
    assert all(bytes(r.body) == expected[r.id] for r in got)
    # The failed attempt leased n2's first rows and released them; the retry leased them again.
    again = [r for r in got if r.receive_count == 2]
    assert len(again) >= 600 and {r.node for r in again} == {cluster.config.node_ids[1]}
    assert all(r.receive_count == 1 for r in got if r.node != cluster.config.node_ids[1])
    left = stats(cluster, q)
    assert left.messages == 0 and left.in_flight == 0


def test_drain_whose_worker_is_killed_acks_only_what_it_wrote_and_leaves_the_rest_leased(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    q = unique("drain-kill")
    n = 3000
    expected = pushed(cluster, q, [f"k{i}".encode() for i in range(n)])
    # The first attempt of task 1 dies with its worker after 300 rows: no Python cleanup
    # runs, so it releases nothing, and its rows are in no committed file.
    result = zdmq.spark.drain(
        spark,
        q,
        tmp_path / "out",
        config=cluster.config_path,
        inflight=1,  # batches of 100 rows, so that 300 are three of them
        transform=FailFirstAttempt(1, after=300, kill=True),
    )
    rows = spark.read.parquet(str(tmp_path / "out")).select("id", "body", "node").collect()
    assert result.ok and result.messages == result.acked == len(rows), result
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)) and set(ids) <= set(expected)
    assert all(bytes(r.body) == expected[r.id] for r in rows)
    # What the killed attempt leased stays leased until visibility_s, unacked: exactly the
    # messages not written, all of them on the node of task 1.
    left = stats(cluster, q)
    assert left.messages == left.in_flight == n - len(rows) >= 300, left
    unwritten = set(expected) - set(ids)
    assert {owner_of(cluster, i) for i in unwritten} == {cluster.config.node_ids[1]}


class FailingCommitSink(DataSource):
    """A test-only sink whose tasks succeed and whose job commit fails."""

    @classmethod
    def name(cls) -> str:
        return "zdmq_test_failing_commit"

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        return _FailToCommit()


@dataclass
class _Counted(WriterCommitMessage):
    rows: int


class _FailToCommit(DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _Counted(sum(1 for _ in iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        raise RuntimeError("injected job commit failure")


def test_drain_whose_job_fails_to_commit_acks_nothing_and_releases_every_lease_at_once(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    q = unique("drain-no-commit")
    n = 1000
    expected = pushed(cluster, q, [f"c{i}".encode() for i in range(n)])
    spark.dataSource.register(FailingCommitSink)
    with pytest.raises(Exception, match="injected job commit failure"):
        zdmq.spark.drain(
            spark, q, tmp_path / "never", config=cluster.config_path, fmt=FailingCommitSink.name()
        )
    left = stats(cluster, q)  # every task finished: the driver released all they leased
    assert left.messages == n and left.in_flight == 0 and left.visible == n, left

    async def receive_all() -> list[zdmq.ReceivedMessage]:
        async with zdmq.Client.from_config(cluster.config_path) as c:
            out: list[zdmq.ReceivedMessage] = []
            while batch := await c.receive(q, 100):
                out += batch
            return out

    back = run(receive_all())  # each once more, leased by the drain before
    assert sorted(m.id for m in back) == sorted(expected)
    assert {m.receive_count for m in back} == {2}


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


def test_stream_batch_that_fails_on_one_node_releases_what_the_other_nodes_leased(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("lease-fail")
    run(_create_and_push(cluster.config_path, q, [f"f{i}".encode() for i in range(400)]))
    opts = ReadOptions.parse({"queue": q, "inflight": "1"})  # one receive call per node
    ddl = read_schema_ddl("bytes", None, with_receipt=True)
    schema = arrow_schema(cast(StructType, DataType.fromDDL(ddl)))

    def fail_once_the_others_leased(node: socket.socket) -> None:
        conn, _ = node.accept()
        with conn:  # closed without a reply: that node's receive fails
            conn.recv(65536)
            deadline = time.monotonic() + 30
            while stats(cluster, q).in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.01)

    with socket.create_server(("127.0.0.1", 0)) as node:
        layout = cluster.config.to_dict()
        layout["nodes"][-1]["port"] = node.getsockname()[1]
        thread = threading.Thread(target=fail_once_the_others_leased, args=(node,))
        thread.start()
        try:
            with pytest.raises(zdmq.NodeUnavailable):
                run(_io.lease_all(layout, opts, 400, schema))
        finally:
            thread.join()
    left = stats(cluster, q)  # the three nodes that answered leased, and were released
    assert left.messages == 400 and left.in_flight == 0, left


# ---- the data source: write -------------------------------------------------------------------
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
        .mapInArrow(
            FailFirstAttempt(0, after=8000, pushed_to=(cluster.config_path, q)), "body string"
        )
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

    got = sorted((orjson.loads(b) for b in run(pop_all())), key=lambda o: o["n"])
    assert got == [{"n": 1, "s": "a"}, {"n": 2, "s": "b"}]


def test_write_gives_rows_their_priority_delay_and_attributes_from_options_and_columns(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("write-options")
    run(_create_and_push(cluster.config_path, q, []))
    df = spark.createDataFrame(
        [(b"low", None, None), (b"high", 9, {"k": "v"}), (b"mid", 4, None)],
        "body binary, priority int, attributes map<string,string>",
    )
    df.coalesce(1).write.format("zdmq").option("config", str(cluster.config_path)).option(
        "queue", q
    ).option("priority", "2").option("ttl_s", "600").mode("append").save()

    async def pop_all() -> list[tuple[bytes, int, dict[str, str]]]:
        async with zdmq.Client.from_config(cluster.config_path) as c:
            out: list[tuple[bytes, int, dict[str, str]]] = []
            while batch := await c.pop_many(q, 10):
                out += [(m.body, m.priority, m.attributes) for m in batch]
            return out

    # Rows have dedup ids (their ids spread over the nodes): priority orders each node's.
    got = sorted(run(pop_all()), key=lambda m: -m[1])
    assert got == [(b"high", 9, {"k": "v"}), (b"mid", 4, {}), (b"low", 2, {})]


def test_write_run_again_with_the_same_write_id_stores_nothing_twice(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("write-again")
    run(_create_and_push(cluster.config_path, q, []))
    df = spark.range(0, 300, 1, 3).selectExpr("concat('r', cast(id as string)) as body")
    write_id = unique("w")
    for _ in range(2):
        df.write.format("zdmq").options(
            config=str(cluster.config_path), queue=q, write_id=write_id, batch_size="50"
        ).mode("append").save()
    assert stats(cluster, q).messages == 300
    df.write.format("zdmq").options(config=str(cluster.config_path), queue=q).mode(
        "append"
    ).save()  # a new write id: a new job, new messages
    assert stats(cluster, q).messages == 600


def test_write_refuses_a_null_dedup_id_and_a_body_column_that_is_not_binary_or_string(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("write-bad")
    run(_create_and_push(cluster.config_path, q, []))

    def writer(df: Any) -> Any:
        return df.write.format("zdmq").options(config=str(cluster.config_path), queue=q)

    rows = spark.createDataFrame(
        [("a", "d1"), ("b", None), ("c", None)], "body string, dedup_id string"
    ).coalesce(1)
    with pytest.raises(Exception, match="column dedup_id: null in row 1 of partition 0"):
        writer(rows).mode("append").save()
    with pytest.raises(Exception, match="option body_column: column 'id' is bigint"):
        writer(spark.range(3)).option("body_column", "id").mode("append").save()
    with pytest.raises(Exception, match="unknown option 'decode'"):
        writer(rows).option("decode", "json").mode("append").save()
    with pytest.raises(Exception, match="cannot be overwritten"):
        writer(rows).mode("overwrite").save()
    assert stats(cluster, q).messages == 0  # nothing pushed


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


def test_batch_read_yields_priority_and_attributes_and_takes_a_minimum_priority(
    spark: Any, cluster: LocalCluster
) -> None:
    q = unique("read-priority")
    run(_create_and_push(cluster.config_path, q, []))

    def attributes(i: int) -> dict[str, str] | None:
        return {"i": str(i), "odd": "yes"} if i % 2 else None

    async def push() -> None:
        async with zdmq.Client.from_config(cluster.config_path) as c:
            await asyncio.gather(
                *(
                    c.push(q, b"m%d" % i, priority=i % 10, attributes=attributes(i))
                    for i in range(60)
                )
            )

    run(push())

    def read(**options: str) -> list[Any]:
        df = spark.read.format("zdmq").options(config=str(cluster.config_path), queue=q)
        rows: list[Any] = df.options(**options).load().collect()
        return rows

    high = read(min_priority="7")
    rest = read()
    for rows, want in ((high, range(7, 10)), (rest, range(0, 7))):
        got = sorted(int(bytes(r.body)[1:]) for r in rows)
        assert got == [i for i in range(60) if i % 10 in want]
        for r in rows:
            i = int(bytes(r.body)[1:])
            assert r.priority == i % 10
            assert (dict(r.attributes) if r.attributes is not None else None) == attributes(i)
    with pytest.raises(Exception, match="option min_priority"):
        read(min_priority="10")


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
