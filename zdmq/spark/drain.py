"""The drain job: a queue into files, acked only once the files are committed.

    spark = zdmq.spark.session("local[*]")
    result = zdmq.spark.drain(spark, "events", "out/events", config="cluster.yaml")

One Spark partition per node, the unit of zero-hop placement: task i leases node i's
messages (`zdmq-route: local`, `inflight` receives of `batch_size` at once) until the node is
drained or its share of `max_messages` is reached, and yields Arrow batches of rows
(id, body, encoding, receive_count, node, received_at). Spark's own writer writes them
(Parquet by default) in the same stage. The receipts travel back to the driver in an
accumulator, which Spark merges from successful task attempts only; after the write's job
commit succeeded, the driver acks them.

- A task that fails in Python (its own code or `transform`) releases its leases at once, so
  its retry leases the same messages again; a task whose process dies leaves leases that
  expire after `visibility_s`, and those messages wait in the queue for the next drain.
- A failed write acks nothing: the driver releases what the finished tasks leased, and
  the leases of tasks cut short expire; every message returns. A driver that dies acks
  nothing either: every lease expires.
- No duplicate in the output: a message lives on the one node its id hashes to and one task
  reads each node, keeping the first delivery of an id (a lease that ran out mid-task brings
  the message back to the same task, which skips it but keeps the newer receipt).
- Between runs, at-least-once: a message whose lease ran out before the ack (a job longer
  than `visibility_s`, or a driver that died after the commit) is drained again next time,
  with the same id; `DrainResult.ack_failed` counts those.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DataType, StructType

from zdmq.config import ClusterConfig
from zdmq.models import AckResult
from zdmq.spark import _io
from zdmq.spark._options import ReadOptions, node_shares
from zdmq.spark.datasource import (
    ZdmqDataSource,
    arrow_schema,
    check_queue,
    lease_node,
    read_schema_ddl,
)

__all__ = ["DrainResult", "ack_receipts", "drain", "register", "session"]

Transform = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def session(
    master: str = "local[*]", app_name: str = "zdmq", conf: dict[str, str] | None = None
) -> SparkSession:
    """A SparkSession set up for zdmq: workers run this interpreter (where zdmq and pyarrow
    are installed), no UI, few shuffle partitions, and the `zdmq` data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # all of it on loopback
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Makes `spark.read.format("zdmq")`, `readStream` and `write` available."""
    spark.dataSource.register(ZdmqDataSource)


@dataclass(frozen=True, slots=True)
class DrainResult:
    queue: str
    out: str
    messages: int  # rows written, one per message id
    acked: int
    ack_failed: dict[str, int] = field(default_factory=dict)  # error code -> receipts
    undecodable: int = 0  # decode=json bodies left leased (they come back, or go to the DLQ)
    per_node: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # the whole call
    ack_seconds: float = 0.0  # of which the acks after the commit

    @property
    def ok(self) -> bool:
        return not self.ack_failed and self.acked == self.messages

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


class _Collect(AccumulatorParam):
    """Accumulates per-task reports; Spark merges those of successful attempts only."""

    def zero(self, value: list[Any]) -> list[Any]:
        return []

    def addInPlace(self, a: list[Any], b: list[Any]) -> list[Any]:
        a.extend(b)
        return a


class _DrainTask:
    """The function each task runs (pickled to the executors)."""

    def __init__(
        self,
        layout: dict[str, Any],
        shares: dict[str, int | None],
        opts: ReadOptions,
        schema: pa.Schema,
        report: Any,
        transform: Transform | None,
    ) -> None:
        self.layout = layout
        self.nodes = list(shares)
        self.shares = shares
        self.opts = opts
        self.schema = schema
        self.report = report
        self.transform = transform

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for index in [i for b in batches for i in b.column(0).to_pylist()]:
            node = self.nodes[index]
            leasers: list[_io.NodeLeaser] = []
            rows = lease_node(self.layout, node, self.opts, self.schema, self.shares[node], leasers)
            try:
                yield from (self.transform(rows) if self.transform is not None else rows)
            except BaseException:
                rows.close()  # releases what this attempt leased (see lease_node)
                raise
            leaser = leasers[0]
            self.report.add([(node, leaser.receipts, len(leaser.undecodable))])


def drain(
    spark: SparkSession,
    queue: str,
    out: str | Path,
    *,
    config: str | Path | ClusterConfig = "cluster.yaml",
    fmt: str = "parquet",
    mode: str = "append",
    max_messages: int | None = None,
    batch_size: int = 100,
    inflight: int = 8,
    visibility_s: float = 300.0,
    wait_s: float = 0.0,
    decode: str = "bytes",
    json_schema: str | None = None,
    min_priority: int = 0,
    transform: Transform | None = None,
    transform_schema: str | StructType | None = None,
    write_options: dict[str, str] | None = None,
    token: str | None = None,
) -> DrainResult:
    """Drains `queue` into `out` (Spark's `fmt` writer) and acks what was written.

    `token`: the client token (else $ZDMQ_TOKEN) for a cluster with client tokens.

    `transform` maps each task's Arrow batches before they are written (same stage, so
    still acked only after the commit); give `transform_schema` if it changes the columns.
    Everything it drops is acked too: it counts as processed.
    """
    started = time.perf_counter()
    cfg = config if isinstance(config, ClusterConfig) else ClusterConfig.load(config)
    layout = _io.with_token(cfg.to_dict(), token)
    opts = ReadOptions.parse(
        {
            "queue": queue,
            "batch_size": batch_size,
            "inflight": inflight,
            "visibility_s": visibility_s,
            "wait_s": wait_s,
            "max_messages": max_messages,
            "decode": decode,
            "json_schema": json_schema,
            "min_priority": min_priority,
        }
    )
    check_queue(layout, queue)
    ddl = read_schema_ddl(opts.decode, opts.json_schema, with_receipt=False)
    rows_schema = DataType.fromDDL(ddl)
    assert isinstance(rows_schema, StructType)
    tz = spark.conf.get("spark.sql.session.timeZone") or "UTC"
    groups = _io.group_ids(layout)
    shares = node_shares(opts.max_messages, groups)
    # (node, receipts, undecodable) per finished task
    report: Accumulator[list[tuple[str, list[str], int]]] = spark.sparkContext.accumulator(
        [], _Collect()
    )
    task = _DrainTask(layout, shares, opts, arrow_schema(rows_schema, tz), report, transform)
    n = len(groups)
    df = spark.range(0, n, 1, n).mapInArrow(task, transform_schema or rows_schema)
    writer = df.write.format(fmt).mode(mode)
    if write_options:
        writer = writer.options(**write_options)
    try:
        writer.save(str(out))
    except BaseException:
        # Nothing of this job is committed: give back at once what its finished tasks
        # leased, rather than let it wait out visibility_s. (If the commit did happen and
        # only something after it failed, the messages are drained again: duplicates
        # across runs, never a loss.)
        reports = report.value
        _io.settle(layout, queue, "nack", [r for _, rs, _ in reports for r in rs])
        raise
    # The write's job committed: only now is anything acked.
    reports = report.value
    receipts = [r for _, rs, _ in reports for r in rs]
    acking = time.perf_counter()
    result = _io.settle(layout, queue, "ack", receipts)
    done = time.perf_counter()
    return DrainResult(
        queue=queue,
        out=str(out),
        messages=len(receipts),
        acked=result.done,
        ack_failed=dict(Counter(result.failed.values())),
        undecodable=sum(u for _, _, u in reports),
        per_node={node: len(rs) for node, rs, _ in reports},
        seconds=done - started,
        ack_seconds=done - acking,
    )


def ack_receipts(
    queue: str,
    receipts: Iterable[str] | DataFrame,
    *,
    config: str | Path | ClusterConfig = "cluster.yaml",
    token: str | None = None,
) -> AckResult:
    """Acks the leases a batch read took, once what they fed is committed.

    Pass the committed output read back (`spark.read.parquet(out)`, with its `receipt`
    column) or the receipts themselves: acking from what was committed is what makes a
    batch read at-least-once, whatever ran in between (shuffles, retries).
    """
    cfg = config if isinstance(config, ClusterConfig) else ClusterConfig.load(config)
    if isinstance(receipts, DataFrame):
        receipts = [r[0] for r in receipts.select("receipt").toLocalIterator() if r[0]]
    return _io.settle(_io.with_token(cfg.to_dict(), token), queue, "ack", list(receipts))
