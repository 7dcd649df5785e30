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

from zdmq.models import (
    MAX_DELAY_S,
    MAX_PRIORITY,
    MAX_RECEIVE,
    MAX_TTL_S,
    MAX_VISIBILITY_S,
    MAX_WAIT_S,
)

__all__ = [
    "DECODES",
    "MAX_MESSAGES_PER_BATCH",
    "OPTION_COLUMNS",
    "ReadOptions",
    "WriteOptions",
    "node_shares",
    "pack_receipts",
    "unpack_receipts",
    "write_dedup_id",
]

DECODES = ("bytes", "utf-8", "json")
# The columns a frame with a body column may give its rows' delivery options in.
OPTION_COLUMNS = ("priority", "ttl_s", "delay_s", "attributes")
# A streaming micro-batch is held in the reader's process until Spark commits it: bound it.
MAX_MESSAGES_PER_BATCH = 100_000
_MAX_INFLIGHT = 32


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
    min_priority   lease only messages of this priority or more, 0..9 (0: all)
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
    min_priority: int = 0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> ReadOptions:
        o = _Given(cls, options)
        decode = o.choice("decode", DECODES)
        json_schema = o.text("json_schema") or None
        if decode == "json" and not json_schema:
            raise ValueError('option json_schema: required with decode=json ("a long, b string")')
        if decode != "json" and json_schema:
            raise ValueError("option json_schema: only with decode=json")
        return cls(
            queue=o.queue(),
            batch_size=o.integer("batch_size", 1, MAX_RECEIVE),
            inflight=o.integer("inflight", 1, _MAX_INFLIGHT),
            visibility_s=o.number("visibility_s", 1.0, MAX_VISIBILITY_S),
            wait_s=o.number("wait_s", 0.0, MAX_WAIT_S),
            max_messages=o.integer("max_messages", 1, 1 << 62) if o.given("max_messages") else None,
            max_messages_per_batch=o.integer("max_messages_per_batch", 1, MAX_MESSAGES_PER_BATCH),
            decode=decode,
            json_schema=json_schema,
            min_priority=o.integer("min_priority", 0, MAX_PRIORITY),
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """How `df.write.format("zdmq")` pushes rows.

    queue          the queue to push to (required)
    batch_size     rows per push_many call, 1..100000 (500); the client splits a call
                   by owning node and by the cluster's max_batch_messages
    inflight       push_many calls in flight per task, 1..32 (4)
    write_id       the prefix of every row's dedup id, 1..128 characters (default: fresh
                   per write job). Give the same one to re-run a failed job within the
                   queue's dedup window without storing any row twice.
    body_column    the column that holds the body (binary or string). Default: `body`
                   if the frame has one, else each row as a JSON object.
    priority       every row's priority, 0..9 (0)
    ttl_s          every row's deadline, as seconds from its push (none)
    delay_s        every row's delay, 0..900 (none)
    With a body column, the columns `priority` (int), `ttl_s`, `delay_s` (numbers) and
    `attributes` (map<string,string>), when the frame has them, give each row its own
    (a null takes the option's value).
    """

    queue: str
    batch_size: int = 500
    inflight: int = 4
    write_id: str | None = None
    body_column: str | None = None
    priority: int = 0
    ttl_s: float | None = None
    delay_s: float | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> WriteOptions:
        o = _Given(cls, options)
        write_id = o.text("write_id")
        if write_id is not None and not 1 <= len(write_id) <= 128:
            raise ValueError(f"option write_id: expected 1..128 characters, got {len(write_id)}")
        return cls(
            queue=o.queue(),
            batch_size=o.integer("batch_size", 1, 100_000),
            inflight=o.integer("inflight", 1, _MAX_INFLIGHT),
            write_id=write_id,
            body_column=o.text("body_column") or None,
            priority=o.integer("priority", 0, MAX_PRIORITY),
            ttl_s=o.number("ttl_s", 0.001, MAX_TTL_S) if o.given("ttl_s") else None,
            delay_s=o.number("delay_s", 0.0, MAX_DELAY_S) if o.given("delay_s") else None,
        )


# Not read here: how to reach the cluster (datasource.load_layout reads `config`,
# `urls` and `token`), and the `path` Spark passes along with load(path) / save(path).
_PASSED_THROUGH = frozenset({"config", "urls", "path", "token"})


class _Given:
    """Options as given, read one at a time: names are case-insensitive (Spark hands data
    sources lowercased names, keyword callers use snake_case), an unknown name is refused
    (a typo fails the query instead of being ignored), a missing one takes its field's
    default, and every error names the option."""

    def __init__(self, cls: type[ReadOptions | WriteOptions], options: Mapping[str, Any]) -> None:
        self.defaults = {f.name: f.default for f in fields(cls)}
        self.values = {str(k).lower(): v for k, v in options.items() if v is not None}
        known = self.defaults.keys() | _PASSED_THROUGH
        for name in self.values:
            if name not in known:
                raise ValueError(f"unknown option {name!r} (known: {', '.join(sorted(known))})")

    def given(self, name: str) -> bool:
        return name in self.values

    def _raw(self, name: str) -> Any:
        return self.values.get(name, self.defaults[name])

    def queue(self) -> str:
        queue = self.values.get("queue")
        if not queue:
            raise ValueError('option queue: required (.option("queue", "name"))')
        return str(queue)

    def text(self, name: str) -> str | None:
        raw = self._raw(name)
        return None if raw is None else str(raw)

    def choice(self, name: str, allowed: Sequence[str]) -> str:
        value = str(self._raw(name)).lower()
        if value not in allowed:
            raise ValueError(f"option {name}: expected one of {', '.join(allowed)}, got {value!r}")
        return value

    def integer(self, name: str, lo: int, hi: int) -> int:
        value: int = self._parse(name, int, lo, hi)
        return value

    def number(self, name: str, lo: float, hi: float) -> float:
        value: float = self._parse(name, float, lo, hi)
        return value

    def _parse(self, name: str, kind: type[int] | type[float], lo: float, hi: float) -> Any:
        # Spark hands every option as a string; str() first makes keyword callers' values
        # take the same path (and refuses True or 2.5 for an integer).
        raw = self._raw(name)
        try:
            value = kind(str(raw).strip())
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"option {name}: expected {what}, got {raw!r}") from None
        if not lo <= value <= hi:  # also refuses nan
            raise ValueError(f"option {name}: {raw!r} is not in {lo}..{hi}")
        return value


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
