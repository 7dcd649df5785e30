"""What Spark tasks do against zdmq: lease from one node, turn replies into Arrow, settle, push.

Runs inside Spark's Python workers (executors) and in the streaming reader's driver-side
process, so everything here pickles (a cluster layout travels as a plain dict) and every
caller brings its own event loop: a task drives one private loop with
`run_until_complete`, never a loop shared with anything else. No pyspark import here.

Leases, not pops: a task that dies leaves leases that expire, and its messages come back.
A task that fails in Python releases (nacks) what it leased at once, so its retry finds
them again without waiting for the visibility timeout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import pyarrow as pa

from zdmq import _http
from zdmq.auth import TOKEN_ENV, bearer_headers
from zdmq.client import Client
from zdmq.cluster_map import initial_map
from zdmq.config import ClusterConfig
from zdmq.errors import ZdmqError
from zdmq.models import AckResult, parse_receipt
from zdmq.routing import GROUP_HEADER, GroupRouter, members_of_view
from zdmq.spark._options import ReadOptions

__all__ = [
    "NodeLeaser",
    "RowBuilder",
    "cluster_from",
    "lease_all",
    "push_batches",
    "settle",
    "token_of",
    "with_token",
]

_ROUTE_LOCAL = {"zdmq-route": "local"}
# An empty node is polled this often while `wait_s` lasts (local receives cannot long-poll).
_IDLE_POLL_S = 0.05
# Acks and nacks of many receipts: slices of this many, this many slices at once.
_SETTLE_SLICE = 2000
_SETTLE_INFLIGHT = 8

T = TypeVar("T")


def cluster_from(layout: dict[str, Any]) -> ClusterConfig:
    return ClusterConfig.from_dict({k: v for k, v in layout.items() if k not in ("token", "map")})


def client_of(layout: dict[str, Any]) -> Client:
    """A client for the layout's cluster: routed by the map the layout carries (a
    layout read from a node, `urls`), else by its cluster file's."""
    token = token_of(layout)
    if "map" in layout:
        ssl_context = cluster_from(layout).client_ssl()
        urls = [n["url"] for n in layout["map"]["nodes"]]
        return Client(urls, token=token, ssl_context=ssl_context)
    return Client(config=cluster_from(layout), token=token)


def with_token(layout: dict[str, Any], token: str | None) -> dict[str, Any]:
    """The layout with the client token its tasks send (the `token` option, else
    $ZDMQ_TOKEN, else none): it travels with the layout to the executors."""
    token = token or os.environ.get(TOKEN_ENV) or None
    return {**layout, "token": token} if token else layout


def token_of(layout: dict[str, Any]) -> str | None:
    token = layout.get("token")
    return str(token) if token else None


def _run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return loop.run_until_complete(coro)


def group_ids(layout: dict[str, Any]) -> list[str]:
    """The replica groups (with one copy: the nodes) a queue's messages are spread over:
    fixed when the cluster is made, whatever nodes it has now."""
    if "map" in layout:
        return [g["id"] for g in layout["map"]["groups"]]
    return list(initial_map(cluster_from(layout)).groups)


def _members(layout: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    if "map" in layout:
        return members_of_view(layout["map"]["groups"])
    m = initial_map(cluster_from(layout))
    return {g: m.members(g) for g in m.groups}


class _Nodes:
    """Lease calls to the nodes of a layout, each served by the node (or, with
    replication, the replica group) it names alone: with `replication` above 1 a call
    for group `g` goes to `g`'s leader wherever it is now (zdmq/routing.py: 421 hints,
    the next member when one does not answer)."""

    def __init__(self, layout: dict[str, Any]) -> None:
        config = cluster_from(layout)
        token = token_of(layout)
        self.pool = _http.HttpPool(
            timeout_s=config.request_timeout_s + 5.0,
            headers=bearer_headers(token),
            ssl_context=config.client_ssl(),
        )
        self.urls = {n.id: n.url for n in config.nodes}
        if "map" in layout:
            self.urls.update({n["id"]: n["url"] for n in layout["map"]["nodes"]})
        self.router = (
            GroupRouter(_members(layout), nodes=self.urls) if config.replication > 1 else None
        )
        # The cluster map's epoch the calls route by (cluster.yaml's is 1): a reply that
        # names a newer one has the map fetched before the call goes on.
        self.epoch = int(layout["map"]["epoch"]) if "map" in layout else 1

    async def _follow(self, epoch: int | None, url: str) -> None:
        if epoch is None or epoch <= self.epoch or self.router is None:
            return
        try:
            view = (await _http.call(self.pool, "GET", url + "/v1/cluster")).json()
        except ZdmqError:
            return  # routed as before: 421 hints still lead to the leader
        self.urls.update({n["id"]: n["url"] for n in view["nodes"]})
        self.router.members = members_of_view(view["groups"])
        self.router.nodes = frozenset(self.urls)
        self.epoch = int(view["epoch"])

    async def receive(self, node: str, opts: ReadOptions, k: int) -> list[dict[str, Any]]:
        """One lease call of up to `k` messages, served by `node` (its group) only. Sent
        again after a failover: a lease whose reply was lost runs out, nothing is lost."""
        path = f"/v1/queues/{opts.queue}/receive"
        params = {"max": str(k), "visibility_s": repr(opts.visibility_s)}
        if opts.min_priority:
            params["min_priority"] = str(opts.min_priority)
        if self.router is None:
            reply = await _http.call(
                self.pool, "POST", self.urls[node] + path, params=params, headers=_ROUTE_LOCAL
            )
        else:
            headers = {**_ROUTE_LOCAL, GROUP_HEADER: node}

            async def send(target: str) -> _http.Reply:
                base = self.urls[target]
                try:
                    reply = await _http.call(
                        self.pool, "POST", base + path, params=params, headers=headers
                    )
                except ZdmqError as e:
                    await self._follow(e.epoch, base)
                    raise
                await self._follow(_http.reply_epoch(reply), base)
                return reply

            reply = await self.router.call(node, send)
        return list(reply.json()["messages"])

    async def close(self) -> None:
        await self.pool.close()


def _sizes(want: int, opts: ReadOptions) -> list[int]:
    """`want` messages as receive calls of at most `batch_size` each."""
    return [min(opts.batch_size, want - i) for i in range(0, want, opts.batch_size)]


async def _gather_all(calls: Sequence[Awaitable[T]]) -> tuple[list[T], BaseException | None]:
    """Runs lease calls at once and waits for every one of them: the results of those that
    succeeded, and the first error. When one fails the others' messages are leased all the
    same, so the caller records them and releases them with the rest (plain `gather` would
    raise at the first error and leave the others running, their leases unrecorded)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    error = next((r for r in results if isinstance(r, BaseException)), None)
    return [r for r in results if not isinstance(r, BaseException)], error


@dataclass(slots=True)
class Built:
    """One Arrow batch of rows, and the receipts of what it holds and what it dropped."""

    batch: pa.RecordBatch | None
    receipts: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)


class RowBuilder:
    """Wire messages -> one Arrow record batch of the read schema.

    Columns, in order: id, body, encoding, receive_count, node, received_at, priority,
    attributes, and receipt when the schema has it. `body` follows `decode`; `encoding` is
    how the body travelled ("utf-8" when the bytes are valid UTF-8, else "base64"). With
    decode=json a body that is not a JSON object of the schema is left out of the batch
    and reported undecodable. `attributes` is null for a message pushed without any.
    """

    def __init__(self, schema: pa.Schema, decode: str) -> None:
        self.schema = schema
        self.decode = decode
        self.with_receipt = "receipt" in schema.names
        self._body_type = schema.field("body").type
        self._ts_type = schema.field("received_at").type
        self._attributes_type = schema.field("attributes").type

    def build(self, msgs: Sequence[dict[str, Any]], node: str, received_at_us: int) -> Built:
        out = Built(None)
        # id, body, encoding, count, receipt, priority, attributes (None: none given)
        rows: list[tuple[str, Any, str, int, str, int, list[tuple[str, str]] | None]] = []
        for m in msgs:
            text, enc = m["body"], m.get("encoding", "utf-8")
            if self.decode == "bytes":
                body: Any = text.encode("utf-8") if enc == "utf-8" else base64.b64decode(text)
            elif self.decode == "utf-8":
                body = text
            else:
                body = _json_object(text) if enc == "utf-8" else None
                if body is None:
                    out.undecodable.append(m["receipt"])
                    continue
            attrs = m.get("attributes")
            rows.append(
                (
                    m["id"],
                    body,
                    enc,
                    int(m["receive_count"]),
                    m["receipt"],
                    int(m.get("priority", 0)),
                    list(attrs.items()) if attrs is not None else None,
                )
            )
        try:
            bodies = pa.array([r[1] for r in rows], self._body_type)
        except _ARROW_ERRORS:
            if self.decode != "json":
                raise
            # Some object does not fit the schema: keep the rows that do, one by one.
            fits = [r for r in rows if _fits(r[1], self._body_type)]
            out.undecodable.extend(r[4] for r in rows if not _fits(r[1], self._body_type))
            rows = fits
            bodies = pa.array([r[1] for r in rows], self._body_type)
        if not rows:
            return out
        out.receipts = [r[4] for r in rows]
        n = len(rows)
        arrays = [
            pa.array([r[0] for r in rows], pa.string()),
            bodies,
            pa.array([r[2] for r in rows], pa.string()),
            pa.array([r[3] for r in rows], pa.int32()),
            pa.array([node] * n, pa.string()),
            pa.array([received_at_us] * n, self._ts_type),
            pa.array([r[5] for r in rows], pa.int32()),
            pa.array([r[6] for r in rows], self._attributes_type),
        ]
        if self.with_receipt:
            arrays.append(pa.array(out.receipts, pa.string()))
        out.batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        return out


_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


def _fits(body: Any, arrow_type: pa.DataType) -> bool:
    try:
        pa.array([body], arrow_type)
    except _ARROW_ERRORS:
        return False
    return True


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class NodeLeaser:
    """Leases one node's messages of a queue in batches, as Arrow record batches.

    `batches()` yields until the node is drained (an empty round after `wait_s` of
    emptiness) or `limit` messages were leased. A message leased twice (its lease ran out
    meanwhile and it came back) is yielded once; its newest receipt is the one kept.
    """

    def __init__(
        self,
        layout: dict[str, Any],
        node: str,
        opts: ReadOptions,
        schema: pa.Schema,
        limit: int | None,
    ) -> None:
        self.layout = layout
        self.node = node
        self.opts = opts
        self.builder = RowBuilder(schema, opts.decode)
        self.limit = limit
        self.receipt_of: dict[str, str] = {}  # message id -> its newest receipt
        self.undecodable: list[str] = []
        self.leased = 0  # deliveries, repeats included

    @property
    def receipts(self) -> list[str]:
        return list(self.receipt_of.values())

    def batches(self, loop: asyncio.AbstractEventLoop) -> Iterator[pa.RecordBatch]:
        nodes = _Nodes(self.layout)
        idle_since: float | None = None
        ahead: asyncio.Task[list[dict[str, Any]]] | None = None
        try:
            while self.limit is None or len(self.receipt_of) < self.limit:
                if ahead is not None:
                    msgs, ahead = _run(loop, ahead), None
                else:
                    msgs = _run(loop, self._round(nodes))
                if not msgs:
                    now = time.monotonic()
                    idle_since = idle_since if idle_since is not None else now
                    if now - idle_since >= self.opts.wait_s:
                        return
                    _run(loop, asyncio.sleep(_IDLE_POLL_S))
                    continue
                idle_since = None
                fresh = self._dedup(msgs)
                if self.limit is None or len(self.receipt_of) < self.limit:
                    # Send the next round's receives before handing this batch to Spark:
                    # the nodes lease (and sync) while Spark writes.
                    ahead = loop.create_task(self._round(nodes))
                    _run(loop, asyncio.sleep(0))
                if fresh:
                    built = self.builder.build(fresh, self.node, time.time_ns() // 1000)
                    for r in built.undecodable:  # not acked: they come back, or dead-letter
                        self.receipt_of.pop(parse_receipt(r)[0], None)
                    self.undecodable.extend(built.undecodable)
                    if built.batch is not None:
                        yield built.batch
        finally:
            if ahead is not None:  # stopped early: record what it leased, so it is released
                # (a node that fails now: those leases expire on their own)
                with contextlib.suppress(Exception):
                    self._dedup(_run(loop, ahead))
            _run(loop, nodes.close())

    def _dedup(self, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fresh = []
        for m in msgs:
            self.leased += 1
            seen = m["id"] in self.receipt_of
            self.receipt_of[m["id"]] = m["receipt"]
            if not seen:
                fresh.append(m)
        return fresh

    async def _round(self, nodes: _Nodes) -> list[dict[str, Any]]:
        """Up to `inflight` receives at once, each of up to `batch_size` messages."""
        want = self.opts.batch_size * self.opts.inflight
        if self.limit is not None:
            want = min(want, self.limit - len(self.receipt_of))
        replies, error = await _gather_all(
            [nodes.receive(self.node, self.opts, k) for k in _sizes(want, self.opts)]
        )
        msgs = [m for msgs in replies for m in msgs]
        if error is not None:
            self._dedup(msgs)  # the task fails: these are released with the rest
            raise error
        return msgs


async def lease_all(
    layout: dict[str, Any],
    opts: ReadOptions,
    limit: int,
    schema: pa.Schema,
) -> dict[str, Built]:
    """Leases up to `limit` messages from every node at once (the streaming reader's
    driver-side step); the rows of each node as one Built.

    In rounds: each node not yet found empty is asked for an equal part of what is still
    wanted (up to `inflight` receives of `batch_size` each), so no node starves the others.
    If a node fails, what the others leased is released before the error is raised.
    """
    nodes = _Nodes(layout)
    builder = RowBuilder(schema, opts.decode)
    groups = group_ids(layout)
    got: dict[str, list[dict[str, Any]]] = {g: [] for g in groups}
    active = list(groups)

    async def node_round(node: str, want: int) -> bool:
        sizes = _sizes(min(want, opts.batch_size * opts.inflight), opts)
        replies, error = await _gather_all([nodes.receive(node, opts, k) for k in sizes])
        for msgs in replies:
            got[node].extend(msgs)
        if error is not None:
            raise error
        return all(len(msgs) == k for msgs, k in zip(replies, sizes, strict=True))

    try:
        left = limit
        while left > 0 and active:
            part = -(-left // len(active))
            wants = {n: min(part, left - part * i) for i, n in enumerate(active)}
            wants = {n: w for n, w in wants.items() if w > 0}
            before = sum(len(v) for v in got.values())
            rounds, error = await _gather_all([node_round(n, w) for n, w in wants.items()])
            if error is not None:
                raise error
            active = [n for n, more in zip(wants, rounds, strict=True) if more]
            left -= sum(len(v) for v in got.values()) - before
    except BaseException:
        # The micro-batch fails: give back at once what the nodes that answered leased.
        with contextlib.suppress(Exception):
            await _settle(
                layout, opts.queue, "nack", [m["receipt"] for v in got.values() for m in v]
            )
        raise
    finally:
        await nodes.close()
    now_us = time.time_ns() // 1000
    return {n: builder.build(msgs, n, now_us) for n, msgs in got.items() if msgs}


def settle(
    layout: dict[str, Any],
    queue: str,
    action: str,
    receipts: Sequence[str],
    loop: asyncio.AbstractEventLoop | None = None,
) -> AckResult:
    """Acks or nacks (releases) receipts; a node that cannot be reached is reported per
    receipt (`node_unavailable`), never raised: its leases simply run out."""
    if loop is not None:
        result: AckResult = loop.run_until_complete(_settle(layout, queue, action, receipts))
        return result
    return asyncio.run(_settle(layout, queue, action, receipts))


async def _settle(
    layout: dict[str, Any], queue: str, action: str, receipts: Sequence[str]
) -> AckResult:
    if not receipts:
        return AckResult(0)
    async with client_of(layout) as c:
        # Slices settled at once: each call makes one request per node, so several
        # slices keep several requests (and group commits) in flight per node.
        slices = [receipts[i : i + _SETTLE_SLICE] for i in range(0, len(receipts), _SETTLE_SLICE)]
        gate = asyncio.Semaphore(_SETTLE_INFLIGHT)

        async def one(part: Sequence[str]) -> AckResult:
            async with gate:
                return await (c.ack(queue, part) if action == "ack" else c.nack(queue, part))

        results = await asyncio.gather(*(one(p) for p in slices))
        failed: dict[str, str] = {}
        for r in results:
            failed.update(r.failed)
        return AckResult(sum(r.done for r in results), failed)


def push_batches(
    layout: dict[str, Any],
    queue: str,
    rows: Iterable[tuple[list[Any], list[str]] | tuple[list[Any], list[str], dict[str, Any]]],
    *,
    inflight: int,
) -> int:
    """Pushes (bodies, dedup ids) chunks, or (bodies, dedup ids, push_many's delivery
    options), with up to `inflight` push_many calls at once. Returns how many rows were
    pushed (duplicates the nodes dropped included)."""
    loop = asyncio.new_event_loop()
    pushed = 0
    try:

        async def go() -> None:
            async with client_of(layout) as c:
                running: set[asyncio.Future[list[str]]] = set()
                try:
                    await feed(c, running)
                finally:  # the rows failed (the task fails): stop what is still pushing
                    for t in running:
                        t.cancel()
                    await asyncio.gather(*running, return_exceptions=True)

        async def feed(c: Client, running: set[asyncio.Future[list[str]]]) -> None:
            nonlocal pushed
            for bodies, dedup_ids, *more in rows:
                if len(running) >= inflight:
                    done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        running.discard(t)
                        pushed += len(t.result())
                options: dict[str, Any] = more[0] if more else {}
                running.add(
                    asyncio.ensure_future(
                        c.push_many(queue, bodies, dedup_ids=dedup_ids, **options)
                    )
                )
            while running:
                t = running.pop()
                pushed += len(await t)

        loop.run_until_complete(go())
    finally:
        loop.close()
    return pushed
