"""The `zdmq` Python data source: batch read, streaming read and write (PySpark 4 API).

    spark.dataSource.register(ZdmqDataSource)        # zdmq.spark.register(spark) does this
    df = spark.read.format("zdmq").option("config", "cluster.yaml").option("queue", "q").load()
    q = spark.readStream.format("zdmq").option("queue", "q").load().writeStream...
    df.write.format("zdmq").option("queue", "q").mode("append").save()

Where each piece runs, and what it promises:

- **Batch read** (`ZdmqBatchReader`): one partition per node; each task leases that node's
  messages (`zdmq-route: local`) until the node is drained. Rows carry the `receipt`. Nothing
  is acked: the messages stay leased for `visibility_s`, then come back. Ack what your job
  committed with `zdmq.spark.ack_receipts` (read the receipts back from the committed
  output), or use `zdmq.spark.drain`, which does all of it. Every action on the frame leases
  anew, so write it once (or persist it) rather than act on it twice.
- **Streaming read** (`ZdmqStreamReader`): the driver-side reader process leases each
  micro-batch (at most `max_messages_per_batch`) and hands the rows to the tasks inside the
  partitions, so a batch replayed in the same process is the same data. Spark's `commit`
  acks a batch's leases; an offset also carries its batch's receipts (compressed), so a
  restarted query acks the last batch the previous run completed, and releases at once the
  batch it has to replay but whose rows died with the old process (replayed as empty, those
  messages are delivered again later). When no new message is there, one empty batch
  follows a batch of messages, so Spark commits that batch now rather than whenever data
  comes next (under `availableNow` it would never come). At-least-once: the sink must
  dedupe by `id`.
- **Write** (`ZdmqWriter`): each task pushes its rows in `push_many` batches with dedup ids
  `<write id>/<task partition>/<row index>`; the write id is fixed when the job is planned,
  so a retried task pushes the same ids again and the nodes store each row once (within the
  queue's `dedup_window_s`), provided the retry sees its rows in the same order (not so
  after a shuffle: sort within partitions, or give a `dedup_id` column). Not
  transactional: a failed job leaves the rows its finished tasks pushed; re-run it with the
  same `write_id` option to finish it without duplicates.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from zdmq.config import ClusterConfig
from zdmq.spark import _io
from zdmq.spark._options import (
    OPTION_COLUMNS,
    ReadOptions,
    WriteOptions,
    node_shares,
    pack_receipts,
    unpack_receipts,
    write_dedup_id,
)

__all__ = ["ZdmqDataSource", "read_schema_ddl"]


def read_schema_ddl(decode: str, json_schema: str | None, *, with_receipt: bool) -> str:
    """The rows' schema as DDL: what the data source and the drain job yield."""
    body = {"bytes": "binary", "utf-8": "string", "json": f"struct<{json_schema}>"}[decode]
    ddl = (
        f"id string, body {body}, encoding string, receive_count int, node string, "
        "received_at timestamp, priority int, attributes map<string,string>"
    )
    return ddl + (", receipt string" if with_receipt else "")


def arrow_schema(schema: StructType, timezone: str = "UTC") -> pa.Schema:
    return to_arrow_schema(schema, timezone=timezone)


def load_layout(options: dict[str, str]) -> dict[str, Any]:
    """The cluster layout, read on the driver from `config` (a cluster.yaml path, default
    ./cluster.yaml) or discovered from `urls` (comma-separated node urls). Tasks get it
    pickled, so executors need no copy of the file, only a route to every node."""
    urls = options.get("urls")
    token = options.get("token")
    if urls:
        layout = asyncio.run(_discover([u.strip() for u in urls.split(",") if u.strip()], token))
    else:
        layout = ClusterConfig.load(options.get("config") or "cluster.yaml").to_dict()
    return _io.with_token(layout, token)


async def _discover(urls: list[str], token: str | None) -> dict[str, Any]:
    from zdmq import _http
    from zdmq.auth import TOKEN_ENV, bearer_headers

    pool = _http.HttpPool(
        timeout_s=10.0, headers=bearer_headers(token or os.environ.get(TOKEN_ENV))
    )
    try:
        last: Exception | None = None
        for url in urls:
            try:
                info = (await _http.call(pool, "GET", url.rstrip("/") + "/v1/cluster")).json()
            except Exception as e:  # the next seed may answer
                last = e
                continue
            nodes = []
            for n in info["nodes"]:
                host, _, port = n["url"].removeprefix("http://").rpartition(":")
                nodes.append({"id": n["id"], "host": host.strip("[]"), "port": int(port)})
            return {
                "nodes": nodes,
                "replication": info["replication"],
                "partitions": info["partitions"],
                "limits": {k: v for k, v in info.get("limits", {}).items()},
                # The map the tasks route by: its groups (fixed) and their members now.
                "map": {k: info[k] for k in ("epoch", "nodes", "groups") if k in info},
            }
        raise ValueError(f"option urls: no node answered at {urls}: {last}")
    finally:
        await pool.close()


def check_queue(layout: dict[str, Any], queue: str) -> None:
    """Fails on the driver, before any task, if the queue does not exist (a local receive
    of an unknown queue would just look empty)."""

    async def go() -> None:
        async with _io.client_of(layout) as c:
            await c.queue_settings(queue)

    asyncio.run(go())


class _NodePartition(InputPartition):
    def __init__(self, node: str, limit: int | None) -> None:
        self.node = node
        self.limit = limit


class _RowsPartition(InputPartition):
    """Rows leased on the driver side for one micro-batch (the streaming reader)."""

    def __init__(self, node: str, batch: pa.RecordBatch) -> None:
        self.node = node
        self.batch = batch


class ZdmqDataSource(DataSource):
    """`format("zdmq")`. Options: see `zdmq.spark._options.ReadOptions` / `WriteOptions`,
    plus `config` (cluster.yaml path, read on the driver) or `urls`."""

    @classmethod
    def name(cls) -> str:
        return "zdmq"

    def schema(self) -> str:
        o = ReadOptions.parse(self.options)
        return read_schema_ddl(o.decode, o.json_schema, with_receipt=True)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ZdmqBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ZdmqStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> ZdmqWriter:
        if overwrite:
            raise ValueError("zdmq write: a queue cannot be overwritten; use mode('append')")
        return ZdmqWriter(dict(self.options), schema)


class ZdmqBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options)
        self.layout = load_layout(options)
        check_queue(self.layout, self.opts.queue)
        self.arrow = arrow_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        nodes = _io.group_ids(self.layout)
        shares = node_shares(self.opts.max_messages, nodes)
        return [_NodePartition(n, shares[n]) for n in nodes if shares[n] != 0]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _NodePartition)
        yield from lease_node(self.layout, partition.node, self.opts, self.arrow, partition.limit)


def lease_node(
    layout: dict[str, Any],
    node: str,
    opts: ReadOptions,
    schema: pa.Schema,
    limit: int | None,
    leaser_out: list[_io.NodeLeaser] | None = None,
) -> Generator[pa.RecordBatch, None, None]:
    """A task's read of one node. If the task fails (or its consumer stops early), what
    it leased is released at once so a retry finds it; on success the leases stay."""
    loop = asyncio.new_event_loop()
    leaser = _io.NodeLeaser(layout, node, opts, schema, limit)
    if leaser_out is not None:
        leaser_out.append(leaser)
    try:
        yield from leaser.batches(loop)
    except BaseException:
        _io.settle(layout, opts.queue, "nack", leaser.receipts + leaser.undecodable, loop)
        raise
    finally:
        loop.close()


# ---- streaming ---------------------------------------------------------------------------
@dataclass
class _Held:
    """A micro-batch this process leased and has not yet seen committed."""

    seq: int
    parts: dict[str, pa.RecordBatch]
    receipts: list[str]
    leased_at: float
    planned: bool = False


class ZdmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: {"run": the reader process that leased the batch, "seq": batch number,
    "n": messages in it, "receipts": its receipts, packed}. See the module docstring."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options)
        self.layout = load_layout(options)
        check_queue(self.layout, self.opts.queue)
        self.arrow = arrow_schema(schema)
        self.run = uuid.uuid4().hex
        self.held: dict[int, _Held] = {}
        self.replayed: set[tuple[str, int]] = set()
        self.budget: int | None = None  # availableNow: messages this run may still lease
        self.answered: dict[tuple[str, int], dict[str, Any]] = {}  # start -> offset given

    def initialOffset(self) -> dict[str, Any]:
        return {"run": "", "seq": 0, "n": 0, "receipts": ""}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        # The target: what is visible now. Leasing stops once that many were leased, so a
        # run ends even while producers keep pushing.
        async def visible() -> int:
            async with _io.client_of(self.layout) as c:
                return (await c.stats(self.opts.queue)).visible

        self.budget = max(0, asyncio.run(visible()))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        key = (start["run"], int(start["seq"]))
        if key in self.answered:  # asked again before planning: the same answer
            return self.answered[key]
        self._extend_held()
        # The batch is held in this process until committed: even "all available" is
        # bounded by max_messages_per_batch.
        want = self.opts.max_messages_per_batch
        if isinstance(limit, ReadMaxRows):
            want = min(want, limit.max_rows)
        if self.budget is not None:
            want = min(want, self.budget)
        seq = int(start["seq"]) + 1
        built = asyncio.run(_io.lease_all(self.layout, self.opts, want, self.arrow)) if want else {}
        receipts = [r for b in built.values() for r in b.receipts]
        # Bodies that do not decode stay leased: they come back after visibility_s (and go
        # to the dead-letter queue after max_receives, if the queue has one).
        undecodable = [r for b in built.values() for r in b.undecodable]
        if self.budget is not None:
            self.budget = max(0, self.budget - len(receipts) - len(undecodable))
        if receipts:
            parts = {n: b.batch for n, b in built.items() if b.batch is not None}
            self.held[seq] = _Held(seq, parts, receipts, time.monotonic())
            end = {
                "run": self.run,
                "seq": seq,
                "n": len(receipts),
                "receipts": pack_receipts(receipts),
            }
        elif int(start["n"]) > 0:
            # Nothing new, but the last batch held messages: one empty batch makes Spark
            # commit it now.
            end = {"run": self.run, "seq": seq, "n": 0, "receipts": ""}
        else:
            end = start
        if end is not start:
            self.answered = {key: end}
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self.answered.clear()
        if int(end["n"]) == 0:
            return []
        held = self.held.get(int(end["seq"])) if end["run"] == self.run else None
        if held is None:
            # A batch leased by an earlier reader process that did not complete: its rows
            # are gone with that process. Release its leases so the messages come back now,
            # and replay it empty.
            self.replayed.add((end["run"], int(end["seq"])))
            _io.settle(self.layout, self.opts.queue, "nack", unpack_receipts(end["receipts"]))
            return []
        held.planned = True
        return [_RowsPartition(n, b) for n, b in sorted(held.parts.items())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _RowsPartition)
        yield partition.batch

    def commit(self, end: dict[str, Any]) -> None:
        seq = int(end["seq"])
        if end["run"] == self.run:
            done = [h for s, h in self.held.items() if s <= seq]
            for h in done:
                del self.held[h.seq]
            ack = [r for h in done if h.planned for r in h.receipts]
            release = [r for h in done if not h.planned for r in h.receipts]
            _io.settle(self.layout, self.opts.queue, "ack", ack)
            _io.settle(self.layout, self.opts.queue, "nack", release)
        elif (end["run"], seq) not in self.replayed and int(end["n"]) > 0:
            # A batch an earlier process leased and Spark completed (it is in the commit
            # log) but that process never saw committed: ack it from the offset.
            _io.settle(self.layout, self.opts.queue, "ack", unpack_receipts(end["receipts"]))

    def stop(self) -> None:
        # Batches never planned were never processed: give them back now. (PySpark runs
        # this only when the reader process ends cleanly; otherwise they expire.)
        unplanned = [r for h in self.held.values() if not h.planned for r in h.receipts]
        _io.settle(self.layout, self.opts.queue, "nack", unplanned)

    def _extend_held(self) -> None:
        """Keeps the leases of batches waiting for their commit (an idle stream commits late)."""
        now = time.monotonic()
        old = [h for h in self.held.values() if now - h.leased_at > self.opts.visibility_s / 3]
        if not old:
            return

        async def go() -> None:
            async with _io.client_of(self.layout) as c:
                await c.extend(
                    self.opts.queue, [r for h in old for r in h.receipts], self.opts.visibility_s
                )

        asyncio.run(go())
        for h in old:
            h.leased_at = now


# ---- write -------------------------------------------------------------------------------
@dataclass
class _Pushed(WriterCommitMessage):
    partition: int
    rows: int


class ZdmqWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = WriteOptions.parse(options)
        self.layout = load_layout(options)
        check_queue(self.layout, self.opts.queue)
        # Fixed here, on the driver, once per job: every attempt of a task shares it.
        self.write_id = self.opts.write_id or uuid.uuid4().hex
        names = schema.fieldNames()
        self.body_column = self.opts.body_column or ("body" if "body" in names else None)
        if self.body_column is not None:
            if self.body_column not in names:
                raise ValueError(f"option body_column: no column {self.body_column!r} in {names}")
            body_type = schema[self.body_column].dataType
            if not isinstance(body_type, BinaryType | StringType):
                raise ValueError(
                    f"option body_column: column {self.body_column!r} is "
                    f"{body_type.simpleString()}, expected binary or string"
                )
        self.dedup_column = "dedup_id" if "dedup_id" in names else None
        # With a body column, these columns carry each row's delivery options.
        self.option_columns = (
            [c for c in OPTION_COLUMNS if c in names] if self.body_column is not None else []
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        rows = 0

        def chunks() -> Iterator[tuple[list[Any], list[str], dict[str, Any]]]:
            nonlocal rows
            for batch in iterator:
                bodies = self._bodies(batch)
                options = self._options(batch)
                if self.dedup_column is not None:
                    dedup = batch.column(self.dedup_column).to_pylist()
                    if None in dedup:  # str(None) would make every such row one message
                        raise ValueError(
                            f"column dedup_id: null in row {rows + dedup.index(None)} of "
                            f"partition {partition}"
                        )
                    dedup = [str(d) for d in dedup]
                else:
                    dedup = [
                        write_dedup_id(self.write_id, partition, rows + i)
                        for i in range(len(bodies))
                    ]
                rows += len(bodies)
                size = self.opts.batch_size
                for i in range(0, len(bodies), size):
                    part = {
                        k: v[i : i + size] if isinstance(v, list) else v for k, v in options.items()
                    }
                    yield bodies[i : i + size], dedup[i : i + size], part

        _io.push_batches(self.layout, self.opts.queue, chunks(), inflight=self.opts.inflight)
        return _Pushed(partition, rows)

    def _options(self, batch: pa.RecordBatch) -> dict[str, Any]:
        """push_many's delivery options for a batch of rows: the write options, or per row
        where the frame has an option column (a null row takes the write option)."""
        o = self.opts
        options: dict[str, Any] = {"priority": o.priority, "ttl_s": o.ttl_s, "delay_s": o.delay_s}
        for name in self.option_columns:
            values = batch.column(name).to_pylist()
            if name == "attributes":
                options[name] = [dict(v) if v is not None else None for v in values]
            else:
                default = options[name]
                options[name] = [default if v is None else v for v in values]
        return options

    def _bodies(self, batch: pa.RecordBatch) -> list[Any]:
        import orjson

        if self.body_column is not None:
            return [b if b is not None else b"" for b in batch.column(self.body_column).to_pylist()]
        fields = [f for f in batch.schema.names if f != self.dedup_column]
        return [
            orjson.dumps({k: r[k] for k in fields}, default=str)
            for r in batch.select(fields).to_pylist()
        ]

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        return None
