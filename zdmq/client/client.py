"""The async Python client: zero-hop routing, a metadata cache, typed errors.

The client computes placement itself and talks to the node that owns each call, over
one keep-alive connection pool:

    push      fresh UUID -> the node that owns it                              1 call
    pop       a node from the cached metadata list, else the node a fresh UUID
              picks; if it is empty: the metadata list, then a listed node     1 to 3 calls

The metadata cache only steers guesses: a stale entry costs a call, never a wrong
answer, because an empty node says so and the metadata owner is asked again. Every
call is counted per operation in `Client.calls` for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from zdmq import _http
from zdmq.config import ClusterConfig
from zdmq.errors import NodeUnavailable
from zdmq.hashing import Placement
from zdmq.models import (
    Message,
    QueueStats,
    message_from_wire,
    message_to_wire,
    new_message_id,
    validate_queue_name,
)

__all__ = ["Body", "CallStats", "Client"]

Body = bytes | bytearray | memoryview | str
_ROUTE_LOCAL = {"zdmq-route": "local"}
# Also tells the node it was picked from the metadata list (an empty one then leaves it).
_ROUTE_LISTED = {"zdmq-route": "local", "zdmq-listed": "1"}
_TEXT = "text/plain; charset=utf-8"
_OCTET = "application/octet-stream"


@dataclass(slots=True)
class CallStats:
    """How many operations of one kind ran and how many HTTP calls they made."""

    ops: int = 0
    calls: int = 0

    @property
    def calls_per_op(self) -> float:
        return self.calls / self.ops if self.ops else 0.0


class Client:
    """`async with Client.from_config("cluster.yaml") as c:` or `Client(["http://..."])`."""

    def __init__(
        self,
        urls: Sequence[str] | str | None = None,
        *,
        config: ClusterConfig | None = None,
        timeout_s: float = 10.0,
        max_connections: int = 256,
        metadata_ttl_s: float = 2.0,
    ) -> None:
        if isinstance(urls, str):
            urls = [urls]
        if not urls and config is None:
            raise ValueError("Client needs node urls or a ClusterConfig")
        self._seed_urls = [u.rstrip("/") for u in (urls or [])]
        self._config = config
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._metadata_ttl_s = metadata_ttl_s
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, str] = {}
        self._placement: Placement | None = None
        self._max_batch = 1000
        self._max_request_bytes = 16 << 20
        self._meta: dict[str, tuple[float, list[str]]] = {}
        self.calls: defaultdict[str, CallStats] = defaultdict(CallStats)

    @classmethod
    def from_config(cls, path: str | Path = "cluster.yaml", **kw: Any) -> Client:
        return cls(config=ClusterConfig.load(path), **kw)

    # ---- lifecycle -----------------------------------------------------------------
    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=self._max_connections
            ),
            timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            skip_auto_headers=("Content-Type",),
        )
        try:
            if self._config is not None:
                c = self._config
                self._layout([(n.id, n.url) for n in c.nodes], c.partitions, c.replication)
                self._max_batch = c.limits.max_batch_messages
                self._max_request_bytes = c.limits.max_request_bytes
            else:
                await self._discover()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _layout(self, nodes: list[tuple[str, str]], partitions: int, replication: int) -> None:
        self._urls = {node_id: url.rstrip("/") for node_id, url in nodes}
        self._placement = Placement([n for n, _ in nodes], partitions, replication)

    async def _discover(self) -> None:
        assert self._session is not None
        last: Exception | None = None
        for url in self._seed_urls:
            try:
                reply = await _http.call(self._session, "GET", url + "/v1/cluster")
            except NodeUnavailable as e:
                last = e
                continue
            info = reply.json()
            self._layout(
                [(n["id"], n["url"]) for n in info["nodes"]],
                int(info["partitions"]),
                int(info["replication"]),
            )
            limits = info.get("limits", {})
            self._max_batch = int(limits.get("max_batch_messages", self._max_batch))
            self._max_request_bytes = int(limits.get("max_request_bytes", self._max_request_bytes))
            return
        raise NodeUnavailable(f"no node answered at {self._seed_urls}: {last}")

    @property
    def placement(self) -> Placement:
        assert self._placement is not None, "use the client inside `async with`"
        return self._placement

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.placement.nodes

    # ---- one counted call ------------------------------------------------------------
    async def _call(self, op: str, node_id: str, method: str, path: str, **kw: Any) -> _http.Reply:
        session = self._session
        if session is None:
            raise RuntimeError("the client is closed: use it inside `async with`")
        self.calls[op].calls += 1
        return await _http.call(session, method, self._urls[node_id] + path, **kw)

    def _begin(self, op: str) -> None:
        self.calls[op].ops += 1

    def _any_node(self) -> str:
        return random.choice(self.nodes)

    # ---- queues --------------------------------------------------------------------
    async def create_queue(self, queue: str) -> None:
        validate_queue_name(queue)
        self._begin("create_queue")
        await self._call("create_queue", self.placement.owner(queue), "PUT", f"/v1/queues/{queue}")

    async def delete_queue(self, queue: str) -> None:
        validate_queue_name(queue)
        self._begin("delete_queue")
        self._meta.pop(queue, None)
        await self._call(
            "delete_queue", self.placement.owner(queue), "DELETE", f"/v1/queues/{queue}"
        )

    async def list_queues(self) -> list[str]:
        self._begin("list_queues")
        reply = await self._call("list_queues", self._any_node(), "GET", "/v1/queues")
        return list(reply.json()["queues"])

    async def stats(self, queue: str) -> QueueStats:
        validate_queue_name(queue)
        self._begin("stats")
        reply = await self._call("stats", self.placement.owner(queue), "GET", f"/v1/queues/{queue}")
        j = reply.json()
        return QueueStats(j["queue"], int(j["messages"]), tuple(j["nodes"]), dict(j["depth"]))

    async def metadata(self, queue: str, *, op: str = "metadata") -> list[str]:
        """The nodes the queue's metadata list names (those that may hold messages)."""
        validate_queue_name(queue)
        if op == "metadata":
            self._begin(op)
        reply = await self._call(
            op, self.placement.owner(queue), "GET", f"/v1/queues/{queue}/metadata"
        )
        nodes = [e["node"] for e in reply.json()["nodes"] if e["node"] in self._urls]
        # The cache keeps its own list: pops prune it as nodes turn out empty.
        self._meta[queue] = (time.monotonic(), list(nodes))
        return nodes

    # ---- push ----------------------------------------------------------------------
    async def push(self, queue: str, body: Body, *, content_type: str | None = None) -> str:
        """Stores one message on the node its fresh id hashes to; returns the id."""
        validate_queue_name(queue)
        data, ctype = _bytes(body, content_type)
        msg_id = new_message_id()
        self._begin("push")
        await self._call(
            "push",
            self.placement.owner(msg_id),
            "POST",
            f"/v1/queues/{queue}/messages",
            data=data,
            headers={"zdmq-id": msg_id, "Content-Type": ctype},
        )
        return msg_id

    async def push_many(self, queue: str, bodies: Iterable[Body]) -> list[str]:
        """Pushes a batch: one call per owning node, in parallel.

        Each node's part is split further only where it passes the batch limits
        (`max_batch_messages` messages, `max_request_bytes` bytes of JSON).
        """
        validate_queue_name(queue)
        self._begin("push_many")
        ids: list[str] = []
        by_owner: defaultdict[str, list[bytes]] = defaultdict(list)
        for body in bodies:
            data, ctype = _bytes(body, None)
            msg_id = new_message_id()
            ids.append(msg_id)
            item = message_to_wire(msg_id, data, None if ctype == _OCTET else ctype)
            by_owner[self.placement.owner(msg_id)].append(_http.dumps(item))
        calls = [
            self._call(
                "push_many",
                owner,
                "POST",
                f"/v1/queues/{queue}/batch",
                data=chunk,
                headers=_http.JSON_HEADERS,
            )
            for owner, items in by_owner.items()
            for chunk in _batches(items, self._max_batch, self._max_request_bytes)
        ]
        await asyncio.gather(*calls)
        return ids

    # ---- pop -----------------------------------------------------------------------
    async def pop(self, queue: str) -> Message | None:
        """Removes and returns one message, or None when the queue is empty."""
        got = await self._pop(queue, 1, "pop")
        return got[0] if got else None

    async def pop_many(self, queue: str, max_messages: int = 100) -> list[Message]:
        """Removes up to `max_messages` messages from one node; [] when the queue is empty."""
        if not 1 <= max_messages <= self._max_batch:
            raise ValueError(f"max_messages must be in 1..{self._max_batch}")
        return await self._pop(queue, max_messages, "pop_many")

    async def _pop(self, queue: str, limit: int, op: str) -> list[Message]:
        validate_queue_name(queue)
        self._begin(op)
        tried: set[str] = set()
        down: set[str] = set()
        guess, from_list = self._guess(queue)
        got = await self._pop_at(op, guess, queue, limit, tried, down, listed=from_list)
        if got:
            return got
        # The guess was empty: ask the metadata list (at most twice: a node it names
        # may have emptied meanwhile) and pop at the nodes it names.
        for _ in range(2):
            listed = await self.metadata(queue, op=op)
            if not listed:
                return []
            candidates = [n for n in listed if n not in tried] or listed
            random.shuffle(candidates)
            for node_id in candidates:
                got = await self._pop_at(op, node_id, queue, limit, tried, down, listed=True)
                if got:
                    return got
            if down.intersection(listed):
                # Never call a queue empty while a node that may hold its messages is down.
                raise NodeUnavailable(
                    f"queue {queue!r}: listed node(s) {sorted(down)} did not answer"
                )
            tried.clear()
        return []

    def _guess(self, queue: str) -> tuple[str, bool]:
        """The node to try first, and whether it came from the metadata list."""
        cached = self._meta.get(queue)
        if cached is not None:
            fetched_at, nodes = cached
            if nodes and time.monotonic() - fetched_at < self._metadata_ttl_s:
                return random.choice(nodes), True
        # ZDMQ: a fresh UUID hashes to a random node.
        return self.placement.owner(str(uuid.uuid4())), False

    async def _pop_at(
        self,
        op: str,
        node_id: str,
        queue: str,
        limit: int,
        tried: set[str],
        down: set[str],
        *,
        listed: bool,
    ) -> list[Message]:
        """Pops at one node's UUID queue only; [] when it is empty or does not answer."""
        try:
            reply = await self._call(
                op,
                node_id,
                "POST",
                f"/v1/queues/{queue}/pop",
                params={"max": str(limit)},
                headers=_ROUTE_LISTED if listed else _ROUTE_LOCAL,
            )
        except NodeUnavailable:
            down.add(node_id)
            msgs: list[Message] = []
        else:
            msgs = [message_from_wire(m) for m in reply.json()["messages"]]
        if not msgs:
            tried.add(node_id)
            cached = self._meta.get(queue)
            if cached is not None and node_id in cached[1]:
                cached[1].remove(node_id)
        return msgs


def _batches(items: list[bytes], max_count: int, max_bytes: int) -> Iterator[bytes]:
    """JSON batch bodies of pre-encoded items, each within both limits."""
    envelope = len(b'{"messages":[]}')
    start, size = 0, envelope
    for i, item in enumerate(items):
        if i > start and (i - start >= max_count or size + len(item) + 1 > max_bytes):
            yield b'{"messages":[' + b",".join(items[start:i]) + b"]}"
            start, size = i, envelope
        size += len(item) + 1
    if start < len(items):
        yield b'{"messages":[' + b",".join(items[start:]) + b"]}"


def _bytes(body: Body, content_type: str | None) -> tuple[bytes, str]:
    if isinstance(body, str):
        return body.encode("utf-8"), content_type or _TEXT
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type or _OCTET
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")
