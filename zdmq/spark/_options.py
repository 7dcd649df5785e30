"""The options of the Spark side, checked once, and the small pure pieces the tasks share.

Everything here is plain Python: no pyspark, no sockets. The data source hands its string
options to `ReadOptions.parse` / `WriteOptions.parse`; the drain job builds the same objects
from keyword arguments, so both paths validate alike and fail with the option's name.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from zdmq.models import MAX_RECEIVE, MAX_VISIBILITY_S, MAX_WAIT_S

__all__ = [
    "DECODES",
    "MAX_MESSAGES_PER_BATCH",
    "ReadOptions",
    "WriteOptions",
    "node_shares",
    "pack_receipts",
    "unpack_receipts",
    "write_dedup_id",
]

DECODES = ("bytes", "utf-8", "json")
# A streaming micro-batch is held in the reader's process until Spark commits it: bound it.
MAX_MESSAGES_PER_BATCH = 100_000
_MAX_INFLIGHT = 32


def _int(raw: Any, name: str, lo: int, hi: int) -> int:
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ValueError(f"option {name}: expected an integer, got {raw!r}") from None
    if isinstance(raw, bool) or not lo <= value <= hi:
        raise ValueError(f"option {name}: {raw!r} is not in {lo}..{hi}")
    return value


def _float(raw: Any, name: str, lo: float, hi: float) -> float:
    try:
        value = float(str(raw).strip()) if not isinstance(raw, int | float) else float(raw)
    except ValueError:
        raise ValueError(f"option {name}: expected a number, got {raw!r}") from None
    if isinstance(raw, bool) or not lo <= value <= hi:
        raise ValueError(f"option {name}: {raw!r} is not in {lo:g}..{hi:g}")
    return value


def _lower(options: Mapping[str, Any]) -> dict[str, Any]:
    # Spark hands data sources case-insensitive options; keyword callers use snake_case.
    return {str(k).lower(): v for k, v in options.items() if v is not None}


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a task leases from a node and how rows carry the body.

    queue          the queue to read (required)
    batch_size     messages per receive call, 1..100 (100)
    inflight       receive calls in flight per node, 1..32 (8)
    visibility_s   lease length; messages come back this long after a failed or
                   abandoned read (300)
    wait_s         how long a node may stay empty before its task calls it drained
                   (0: at the first empty receive), 0..20
    max_messages   at most this many messages in all, split evenly over the nodes
    max_messages_per_batch   streaming: at most this many messages per micro-batch (10000)
    decode         the `body` column: "bytes" (binary), "utf-8" (string; bodies that are
                   not UTF-8 arrive base64, with `encoding` saying so) or "json" (parsed
                   into `json_schema`)
    json_schema    a Spark DDL schema for decode=json, e.g. "user string, amount long"
    """

    queue: str
    batch_size: int = MAX_RECEIVE
    inflight: int = 8
    visibility_s: float = 300.0
    wait_s: float = 0.0
    max_messages: int | None = None
    max_messages_per_batch: int = 10_000
    decode: str = "bytes"
    json_schema: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> ReadOptions:
        o = _lower(options)
        queue = o.get("queue")
        if not queue:
            raise ValueError('option queue: required (.option("queue", "name"))')
        decode = str(o.get("decode", "bytes")).lower()
        if decode not in DECODES:
            raise ValueError(f"option decode: expected one of {', '.join(DECODES)}, got {decode!r}")
        json_schema = o.get("json_schema")
        if decode == "json" and not json_schema:
            raise ValueError('option json_schema: required with decode=json ("a long, b string")')
        if decode != "json" and json_schema:
            raise ValueError("option json_schema: only with decode=json")
        max_messages = o.get("max_messages")
        return cls(
            queue=str(queue),
            batch_size=_int(o.get("batch_size", MAX_RECEIVE), "batch_size", 1, MAX_RECEIVE),
            inflight=_int(o.get("inflight", 8), "inflight", 1, _MAX_INFLIGHT),
            visibility_s=_float(
                o.get("visibility_s", 300.0), "visibility_s", 1.0, MAX_VISIBILITY_S
            ),
            wait_s=_float(o.get("wait_s", 0.0), "wait_s", 0.0, MAX_WAIT_S),
            max_messages=None
            if max_messages is None
            else _int(max_messages, "max_messages", 1, 1 << 62),
            max_messages_per_batch=_int(
                o.get("max_messages_per_batch", 10_000),
                "max_messages_per_batch",
                1,
                MAX_MESSAGES_PER_BATCH,
            ),
            decode=decode,
            json_schema=str(json_schema) if json_schema else None,
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """How `df.write.format("zdmq")` pushes rows.

    queue          the queue to push to (required)
    batch_size     rows per push_many call, 1..max_batch_messages (500)
    inflight       push_many calls in flight per task, 1..32 (4)
    write_id       the prefix of every row's dedup id (default: fresh per write job).
                   Give the same one to re-run a failed job within the queue's dedup
                   window without storing any row twice.
    body_column    the column that holds the body (binary or string). Default: `body`
                   if the frame has one, else each row as a JSON object.
    """

    queue: str
    batch_size: int = 500
    inflight: int = 4
    write_id: str | None = None
    body_column: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> WriteOptions:
        o = _lower(options)
        queue = o.get("queue")
        if not queue:
            raise ValueError('option queue: required (.option("queue", "name"))')
        write_id = o.get("write_id")
        if write_id is not None and not 1 <= len(str(write_id)) <= 128:
            raise ValueError("option write_id: expected 1..128 characters")
        return cls(
            queue=str(queue),
            batch_size=_int(o.get("batch_size", 500), "batch_size", 1, 100_000),
            inflight=_int(o.get("inflight", 4), "inflight", 1, _MAX_INFLIGHT),
            write_id=str(write_id) if write_id is not None else None,
            body_column=str(o["body_column"]) if o.get("body_column") else None,
        )


# Options that are not about reading or writing but about reaching the cluster.
CONNECTION_OPTIONS = ("config", "urls")
READ_OPTION_NAMES = frozenset(f.name for f in fields(ReadOptions)) | set(CONNECTION_OPTIONS)
WRITE_OPTION_NAMES = frozenset(f.name for f in fields(WriteOptions)) | set(CONNECTION_OPTIONS)


def node_shares(total: int | None, nodes: Sequence[str]) -> dict[str, int | None]:
    """`total` split over the nodes as evenly as whole numbers allow (sum == total)."""
    if total is None:
        return {n: None for n in nodes}
    base, extra = divmod(total, len(nodes))
    return {n: base + (1 if i < extra else 0) for i, n in enumerate(nodes)}


def write_dedup_id(write_id: str, partition: int, row: int) -> str:
    """The dedup id of row `row` of task partition `partition`: a retried task pushes the
    same rows under the same ids, so the nodes store each of them once."""
    return f"{write_id}/{partition}/{row}"


def pack_receipts(receipts: Sequence[str]) -> str:
    """Receipts as one compact string (they travel inside streaming offsets, as JSON)."""
    if not receipts:
        return ""
    return base64.b64encode(zlib.compress("\n".join(receipts).encode("ascii"), 6)).decode("ascii")


def unpack_receipts(packed: str) -> list[str]:
    if not packed:
        return []
    return zlib.decompress(base64.b64decode(packed)).decode("ascii").split("\n")
