"""The async Python client: zero-hop routing, a metadata cache, typed errors.

The client computes placement itself and talks to the node that owns each call, over
one keep-alive connection pool:

    push      fresh UUID (or uuid5 of a dedup id) -> the node that owns it     1 call
    pop       a node from the cached metadata list, else the node a fresh UUID
    receive   picks; if it is empty: the metadata list, then a listed node     1 to 3 calls
              (+1 long poll on the metadata owner when `wait_s` > 0 and it was empty)
    ack/nack  grouped by the node each receipt's message id hashes to          1 per node
    extend
    cancel    the node the message id hashes to                               1 call

The metadata cache only steers guesses: a stale entry costs a call, never a wrong
answer, because an empty node says so and the metadata owner is asked again. Every
call is counted per operation in `Client.calls` for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from zdmq import _http
from zdmq.auth import TOKEN_ENV, bearer_headers
from zdmq.backup import GroupBackup, fetch_backup
from zdmq.client.stream import NodeStream
from zdmq.cluster_map import initial_map
from zdmq.config import ClusterConfig
from zdmq.errors import InternalError, NodeUnavailable, ZdmqError
from zdmq.hashing import Placement
from zdmq.models import (
    BATCH_CONTENT_TYPE,
    MAX_PRIORITY,
    MAX_RECEIVE,
    MAX_WAIT_S,
    SETTLED_KEY,
    AckResult,
    Message,
    Published,
    QueueSettings,
    QueueStats,
    ReceivedMessage,
    attributes_header,
    copy_message_id,
    decode_attributes,
    decode_batch,
    dedup_message_id,
    delivery_options,
    encode_attributes,
    encode_batch,
    group_key,
    group_receipts,
    message_from_wire,
    message_to_wire,
    messages_of_batch,
    new_message_id,
    new_message_ids,
    received_from_wire,
    received_of_batch,
    validate_content_type,
    validate_group,
    validate_message_id,
    validate_queue_name,
)
from zdmq.routing import GROUP_HEADER, GroupRouter, group_members, members_of_view
from zdmq.streaming import MAX_CREDIT

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from zdmq.client.consumer import Consumer, Handler

__all__ = ["Body", "CallStats", "Client"]

Body = bytes | bytearray | memoryview | str
# Batches travel as binary frames (docs/api.md): bodies as they are, no JSON, no base64.
_FRAME = {"Content-Type": BATCH_CONTENT_TYPE}
_ACCEPT = {"Accept": BATCH_CONTENT_TYPE}
_ROUTE_LOCAL = {"zdmq-route": "local", **_ACCEPT}
# Also tells the node it was picked from the metadata list (an empty one then leaves it).
_ROUTE_LISTED = {"zdmq-route": "local", "zdmq-listed": "1", **_ACCEPT}
_TEXT = "text/plain; charset=utf-8"

_OCTET = "application/octet-stream"

T = TypeVar("T")


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
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`token`: the client token sent as `Authorization: Bearer` on every call (else
        $ZDMQ_TOKEN, else none: a cluster without `auth.client_tokens` needs none).
        `ssl_context`: how https:// nodes are verified (default: the config's `tls.ca`,
        else the system's trust store)."""
        if isinstance(urls, str):
            urls = [urls]
        if not urls and config is None:
            raise ValueError("Client needs node urls or a ClusterConfig")
        self._seed_urls = [u.rstrip("/") for u in (urls or [])]
        self._config = config
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._metadata_ttl_s = metadata_ttl_s
        self._token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        if ssl_context is None and config is not None:
            ssl_context = config.client_ssl()
        self._ssl = ssl_context
        self._session: _http.HttpPool | None = None
        self._urls: dict[str, str] = {}
        self._node_ids: list[str] = []  # the nodes of the cluster map routed by
        self._placement: Placement | None = None
        self._router: GroupRouter | None = None
        # The cluster map's epoch this client routes by; a reply naming a newer one has
        # the client fetch the map again (`_follow`), one fetch at a time.
        self._epoch = 0
        self._refetch: asyncio.Future[None] | None = None
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
        self._session = _http.HttpPool(
            timeout_s=self._timeout_s,
            limit_per_host=self._max_connections,
            headers=bearer_headers(self._token),
            ssl_context=self._ssl,
        )
        try:
            if self._config is not None:
                c = self._config
                initial = initial_map(c).to_dict()
                for n, node in zip(initial["nodes"], c.nodes, strict=True):
                    n["url"] = node.url
                self._layout(initial)
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

    def _layout(self, info: Mapping[str, Any]) -> None:
        """Routes by the cluster map `info` (`GET /v1/cluster`'s form): a key's group is
        fixed, the nodes that lead it and where they listen follow the map."""
        nodes = info["nodes"]
        partitions, replication = int(info["partitions"]), int(info["replication"])
        # A node that left keeps its URL: a call under way may still reach it.
        self._urls = {**self._urls, **{n["id"]: n["url"].rstrip("/") for n in nodes}}
        self._node_ids = [n["id"] for n in nodes]
        groups = info.get("groups")
        if groups is None:  # a node that predates the map: one group per node, its ring
            ids = [n["id"] for n in nodes]
            members = dict(group_members(ids, replication))
        else:
            members = members_of_view(groups)
        self._placement = Placement(list(members), partitions, replication)
        if replication > 1:
            if self._router is None:
                self._router = GroupRouter(members, nodes=self._urls)
            else:  # what it learned of leaders stays
                self._router.members = members
                self._router.nodes = frozenset(self._urls)
        self._epoch = int(info.get("epoch", 0))

    async def _discover(self) -> None:
        assert self._session is not None
        last: Exception | None = None
        for url in self._seed_urls:
            try:
                reply = await _http.call(self._session, "GET", url + "/v1/cluster")
            except NodeUnavailable as e:
                last = e
                continue
            _read("discover", url, reply, self._learn)
            return
        raise NodeUnavailable(f"no node answered at {self._seed_urls}: {last}")

    def _learn(self, info: Any) -> None:
        """Takes the layout and limits of a `/v1/cluster` reply."""
        self._layout(info)
        limits = info.get("limits", {})
        self._max_batch = int(limits.get("max_batch_messages", self._max_batch))
        self._max_request_bytes = int(limits.get("max_request_bytes", self._max_request_bytes))

    async def _follow(self, epoch: int | None) -> None:
        """A node replied under the map of `epoch`: if that is newer than this client's,
        fetches the map (from that node's cluster, any node) before going on."""
        if epoch is None or epoch <= self._epoch or self._session is None:
            return
        if self._refetch is None or self._refetch.done():
            self._refetch = asyncio.ensure_future(self._fetch_map(epoch))
        await asyncio.shield(self._refetch)

    async def _fetch_map(self, epoch: int) -> None:
        assert self._session is not None
        for url in list(dict.fromkeys(self._urls.values())):
            try:
                reply = await _http.call(self._session, "GET", url + "/v1/cluster")
                info = reply.json()
            except (ZdmqError, ValueError):
                continue
            if int(info.get("epoch", 0)) >= epoch:
                self._learn(info)
                return
        log.warning("no node gave the cluster map of epoch %d; routing by %d", epoch, self._epoch)

    @property
    def epoch(self) -> int:
        """The epoch of the cluster map this client routes by."""
        return self._epoch

    @property
    def placement(self) -> Placement:
        assert self._placement is not None, "use the client inside `async with`"
        return self._placement

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.placement.nodes

    # ---- one counted call ------------------------------------------------------------
    async def _call(
        self, op: str, node_id: str, method: str, path: str, *, once: bool = False, **kw: Any
    ) -> _http.Reply:
        """One call to node `node_id`; with replication, to the leader of replica group
        `node_id`, wherever it is now (zdmq/routing.py). A call that must not run twice
        (`once`: a pop) is sent again only where it surely did not run."""
        session = self._session
        if session is None:
            raise RuntimeError("the client is closed: use it inside `async with`")
        stats = self.calls[op]
        router = self._router
        if router is None:
            stats.calls += 1
            return await self._sent(_http.call(session, method, self._urls[node_id] + path, **kw))
        headers = {**(kw.pop("headers", None) or {}), GROUP_HEADER: node_id}

        def send(target: str) -> Awaitable[_http.Reply]:
            stats.calls += 1
            call = _http.call(session, method, self._urls[target] + path, headers=headers, **kw)
            return self._sent(call)

        return await router.call(node_id, send, once=once)

    async def _sent(self, call: Awaitable[_http.Reply]) -> _http.Reply:
        """`call`'s reply; a reply (or an error) served under a newer cluster map has
        the client take that map first, so a retry routes by it."""
        try:
            reply = await call
        except ZdmqError as e:
            await self._follow(e.epoch)
            raise
        await self._follow(_http.reply_epoch(reply))
        return reply

    def _begin(self, op: str) -> None:
        self.calls[op].ops += 1

    def _any_node(self) -> str:
        return random.choice(self.nodes)

    # ---- queues --------------------------------------------------------------------
    async def create_queue(
        self,
        queue: str,
        *,
        visibility_timeout_s: float | None = None,
        max_receives: int | None = None,
        dead_letter_queue: str | None = None,
        retention_s: float | None = None,
        dedup_window_s: float | None = None,
        max_message_bytes: int | None = None,
        fifo: bool = False,
        content_based_dedup: bool = False,
    ) -> QueueSettings:
        """Creates a queue; settings left out take their defaults. Returns the settings.

        `fifo`: a FIFO queue (every message pushed with a `group`; see `push`);
        `content_based_dedup` (FIFO queues): a message without a dedup id is
        deduplicated by a hash of its body, inside the dedup window."""
        validate_queue_name(queue)
        given = {
            "visibility_timeout_s": visibility_timeout_s,
            "max_receives": max_receives,
            "dead_letter_queue": dead_letter_queue,
            "retention_s": retention_s,
            "dedup_window_s": dedup_window_s,
            "max_message_bytes": max_message_bytes,
            "fifo": fifo or None,
            "content_based_dedup": content_based_dedup or None,
        }
        settings = {k: v for k, v in given.items() if v is not None}
        QueueSettings.from_wire(settings)  # bad settings fail here, before any call
        self._begin("create_queue")
        reply = await self._call(
            "create_queue",
            self.placement.owner(queue),
            "PUT",
            f"/v1/queues/{queue}",
            data=_http.dumps(settings),
            headers=_http.JSON_HEADERS,
        )
        return QueueSettings(**reply.json()["settings"])

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
        owner = self.placement.owner(queue)
        reply = await self._call("stats", owner, "GET", f"/v1/queues/{queue}")
        return _read(
            "stats",
            owner,
            reply,
            lambda j: QueueStats(
                j["queue"],
                int(j["messages"]),
                tuple(j["nodes"]),
                dict(j["depth"]),
                int(j.get("in_flight", 0)),
                int(j.get("delayed", 0)),
                int(j.get("dead_lettered", 0)),
                int(j.get("expired", 0)),
            ),
        )

    async def queue_settings(self, queue: str) -> QueueSettings:
        """The settings the queue was created with."""
        validate_queue_name(queue)
        self._begin("queue_settings")
        owner = self.placement.owner(queue)
        reply = await self._call("queue_settings", owner, "GET", f"/v1/queues/{queue}/metadata")
        return _read("queue_settings", owner, reply, lambda j: QueueSettings(**j["settings"]))

    async def metadata(self, queue: str, *, op: str = "metadata") -> list[str]:
        """The nodes the queue's metadata list names (those that may hold messages)."""
        validate_queue_name(queue)
        if op == "metadata":
            self._begin(op)
        owner = self.placement.owner(queue)
        reply = await self._call(op, owner, "GET", f"/v1/queues/{queue}/metadata")
        listed = _read(op, owner, reply, lambda j: [str(e["node"]) for e in j["nodes"]])
        nodes = [n for n in listed if n in self.placement.nodes]
        # The cache keeps its own list: pops prune it as nodes turn out empty.
        self._meta[queue] = (time.monotonic(), list(nodes))
        return nodes

    # ---- push ----------------------------------------------------------------------
    async def push(
        self,
        queue: str,
        body: Body,
        *,
        content_type: str | None = None,
        dedup_id: str | None = None,
        priority: int = 0,
        deadline: float | None = None,
        ttl_s: float | None = None,
        delay_s: float | None = None,
        attributes: Mapping[str, str] | None = None,
        group: str | None = None,
    ) -> str:
        """Stores one message on the node its id hashes to; returns the id.

        `group` (a FIFO queue's message, which needs one): the message goes to the node
        that owns the group, which draws its id there (or derives it from `dedup_id`, or
        from the body's hash on a queue with `content_based_dedup`). Such a message takes
        no priority, deadline, ttl_s or delay_s.

        With `dedup_id` the id is derived from it (uuid5 of queue and dedup_id), so a
        retry lands on the same node and, inside the queue's dedup window, stores
        nothing and returns the original id. A `content_type` that is not a media type
        (`validate_content_type`) raises InvalidMessage before anything is sent.

        `priority` (0..9, higher first), `deadline` (unix seconds) or `ttl_s` (seconds
        from now; not both), `delay_s` (0..900: invisible until then) and `attributes`
        (up to 16 string pairs, returned with every delivery) are checked here first
        (BadRequest, InvalidAttributes).
        """
        validate_queue_name(queue)
        if content_type is not None:
            validate_content_type(content_type)
        data, ctype = _bytes(body, content_type)
        headers = {"Content-Type": ctype}
        delivery_options(
            priority=priority, deadline=deadline, ttl_s=ttl_s, delay_s=delay_s, now=time.time()
        )
        attrs = encode_attributes(dict(attributes) if attributes is not None else None)
        if priority:
            headers["zdmq-priority"] = str(priority)
        if deadline is not None:
            headers["zdmq-deadline"] = repr(float(deadline))
        if ttl_s is not None:
            headers["zdmq-ttl-s"] = repr(float(ttl_s))
        if delay_s:
            headers["zdmq-delay-s"] = repr(float(delay_s))
        if attrs is not None:
            headers["zdmq-attributes"] = attributes_header(attrs)
        if group is not None:
            validate_group(group)
            headers["zdmq-message-group"] = group
            if dedup_id is not None:
                headers["zdmq-dedup-id"] = dedup_id
            self._begin("push")
            home = self.placement.owner(group_key(queue, group))
            reply = await self._call(
                "push", home, "POST", f"/v1/queues/{queue}/messages", data=data, headers=headers
            )
            return _read("push", home, reply, lambda j: str(j["id"]))
        if dedup_id is not None:
            msg_id = dedup_message_id(queue, dedup_id)
            headers["zdmq-dedup-id"] = dedup_id
        else:
            msg_id = new_message_id()
            headers["zdmq-id"] = msg_id
        self._begin("push")
        await self._call(
            "push",
            self.placement.owner(msg_id),
            "POST",
            f"/v1/queues/{queue}/messages",
            data=data,
            headers=headers,
        )
        return msg_id

    async def push_many(
        self,
        queue: str,
        bodies: Iterable[Body],
        *,
        dedup_ids: Sequence[str | None] | None = None,
        priority: int | Sequence[int] = 0,
        deadline: float | Sequence[float | None] | None = None,
        ttl_s: float | Sequence[float | None] | None = None,
        delay_s: float | Sequence[float | None] | None = None,
        attributes: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None = None,
        groups: str | Sequence[str] | None = None,
    ) -> list[str]:
        """Pushes a batch: one call per owning node, in parallel. The fresh messages of a
        batch share one node, drawn at random (new_message_ids), so without dedup ids a
        batch is one call.

        `groups` (a FIFO queue's messages): one group for all, or one per message; each
        message goes to the node that owns its group, which draws its id (as `push`).
        One call stores its part in order, so a group's messages of one push_many keep
        the order of `bodies`.

        Each node's part is split further only where it passes the batch limits
        (`max_batch_messages` messages, `max_request_bytes` bytes of the frame).
        `dedup_ids`, when given, pairs a dedup id (or None) with each body. The delivery
        options (as for `push`) are one value for every message, or a sequence of one
        value (or None) per message.
        """
        validate_queue_name(queue)
        self._begin("push_many")
        ids: list[str] = []
        # Per owner: (id, or None when the node derives it from the dedup id), body,
        # content type (None: octets), dedup id, then the delivery options.
        by_owner: defaultdict[str, list[_Item]] = defaultdict(list)
        bodies = list(bodies)
        n = len(bodies)
        if dedup_ids is not None and len(dedup_ids) != n:
            raise ValueError("dedup_ids must pair one dedup id (or None) with each body")
        options = _options_each(n, priority, deadline, ttl_s, delay_s, attributes)
        if groups is not None:
            each = [validate_group(g) for g in _each(groups, n, "groups")]
            return await self._push_many_groups(queue, bodies, dedup_ids, options, each)
        owner_of = self.placement.owner
        fresh = iter(self._fresh_ids(n - _given(dedup_ids)))
        for i, body in enumerate(bodies):
            data, ctype = _bytes(body, None)
            dedup_id = dedup_ids[i] if dedup_ids is not None else None
            extra = options[i] if options is not None else _PLAIN
            item: _Item
            if dedup_id is None:
                msg_id = next(fresh)
                item = (msg_id, data, None if ctype == _OCTET else ctype, None, *extra)
            else:
                msg_id = dedup_message_id(queue, dedup_id)
                item = (None, data, None if ctype == _OCTET else ctype, dedup_id, *extra)
            ids.append(msg_id)
            by_owner[owner_of(msg_id)].append(item)

        async def push_part(owner: str, part: Sequence[_Item]) -> None:
            reply = await self._call(
                "push_many",
                owner,
                "POST",
                f"/v1/queues/{queue}/batch",
                data=_push_frame(part),
                headers=_FRAME,
            )
            _check_pushed(reply, len(part), owner)

        calls = [
            push_part(owner, items[start:end])
            for owner, items in by_owner.items()
            for start, end in _batches(
                [_item_bytes(item) for item in items], self._max_batch, self._max_request_bytes
            )
        ]
        await asyncio.gather(*calls)
        return ids

    async def _push_many_groups(
        self,
        queue: str,
        bodies: list[Body],
        dedup_ids: Sequence[str | None] | None,
        options: list[_Options] | None,
        groups: list[str],
    ) -> list[str]:
        """push_many of a FIFO queue's messages: a call to each group owner, its ids
        from the reply."""
        owner_of = self.placement.owner
        by_owner: defaultdict[str, list[int]] = defaultdict(list)
        items: list[_Item] = []
        for i, body in enumerate(bodies):
            data, ctype = _bytes(body, None)
            dedup_id = dedup_ids[i] if dedup_ids is not None else None
            extra = options[i] if options is not None else _PLAIN
            items.append((None, data, None if ctype == _OCTET else ctype, dedup_id, *extra))
            by_owner[owner_of(group_key(queue, groups[i]))].append(i)
        ids: list[str] = [""] * len(bodies)

        async def push_part(owner: str, part: list[int]) -> None:
            reply = await self._call(
                "push_many",
                owner,
                "POST",
                f"/v1/queues/{queue}/batch",
                data=_push_frame([items[i] for i in part], [groups[i] for i in part]),
                headers=_FRAME,
            )
            _check_pushed(reply, len(part), owner)
            for i, mid in zip(part, reply.json()["ids"], strict=True):
                ids[i] = mid

        sizes = [_item_bytes(item) + 4 + len(g) for item, g in zip(items, groups, strict=True)]

        async def push_owner(owner: str, part: list[int]) -> None:
            # One part after another: a group's messages are stored in their order.
            runs = _batches([sizes[i] for i in part], self._max_batch, self._max_request_bytes)
            for start, end in runs:
                await push_part(owner, part[start:end])

        await asyncio.gather(*(push_owner(o, part) for o, part in by_owner.items()))
        return ids

    def _fresh_ids(self, n: int) -> list[str]:
        """Ids for `n` fresh messages of a push_many: each run of up to a batch's worth
        shares one node, drawn at random (new_message_ids), so it goes in one call."""
        ids: list[str] = []
        for start in range(0, n, self._max_batch):
            ids += new_message_ids(min(self._max_batch, n - start), self.placement.owner)
        return ids

    # ---- topics and broadcast --------------------------------------------------------
    # A topic's calls go to the group that owns its name (docs/design.md, Topics): that
    # group's leader keeps its subscriptions and fans every publish out.
    async def create_topic(self, topic: str) -> None:
        validate_queue_name(topic)
        self._begin("create_topic")
        await self._call("create_topic", self.placement.owner(topic), "PUT", f"/v1/topics/{topic}")

    async def delete_topic(self, topic: str) -> None:
        """Deletes a topic and its subscriptions; the subscribed queues stay."""
        validate_queue_name(topic)
        self._begin("delete_topic")
        await self._call(
            "delete_topic", self.placement.owner(topic), "DELETE", f"/v1/topics/{topic}"
        )

    async def list_topics(self) -> list[str]:
        self._begin("list_topics")
        reply = await self._call("list_topics", self._any_node(), "GET", "/v1/topics")
        return list(reply.json()["topics"])

    async def subscriptions(self, topic: str) -> list[str]:
        """The queues subscribed to `topic`, in the order they subscribed."""
        validate_queue_name(topic)
        self._begin("subscriptions")
        reply = await self._call(
            "subscriptions", self.placement.owner(topic), "GET", f"/v1/topics/{topic}"
        )
        return list(reply.json()["subscriptions"])

    async def subscribe(
        self, topic: str, queue: str, *, settings: QueueSettings | None = None
    ) -> bool:
        """Subscribes `queue` to `topic`, creating the queue (with `settings`) if it does
        not exist; every publish that starts after this returns stores a copy in it.
        Returns whether the subscription is new."""
        validate_queue_name(topic)
        validate_queue_name(queue)
        body: dict[str, Any] = {"queue": queue}
        if settings is not None:
            body["settings"] = settings.to_wire()
        self._begin("subscribe")
        reply = await self._call(
            "subscribe",
            self.placement.owner(topic),
            "POST",
            f"/v1/topics/{topic}/subscriptions",
            data=_http.dumps(body),
            headers=_http.JSON_HEADERS,
        )
        return bool(reply.json()["subscribed"])

    async def unsubscribe(self, topic: str, queue: str) -> int:
        """Ends the subscription and purges the queue's pending messages (the queue
        stays); returns how many were purged."""
        validate_queue_name(topic)
        validate_queue_name(queue)
        self._begin("unsubscribe")
        reply = await self._call(
            "unsubscribe",
            self.placement.owner(topic),
            "DELETE",
            f"/v1/topics/{topic}/subscriptions/{queue}",
        )
        return int(reply.json()["purged"])

    async def publish(
        self,
        topic: str,
        body: Body,
        *,
        content_type: str | None = None,
        dedup_id: str | None = None,
    ) -> Published:
        """Stores a copy of one message in every queue subscribed to `topic`; returns
        once every copy is stored. With `dedup_id` a retry stores no copy twice (and the
        client retries a call whose outcome is unknown); without one a retry may."""
        validate_queue_name(topic)
        if content_type is not None:
            validate_content_type(content_type)
        data, ctype = _bytes(body, content_type)
        headers = {"Content-Type": ctype}
        if dedup_id is not None:
            copy_message_id(topic, topic, dedup_id)  # a bad dedup id fails here
            headers["zdmq-dedup-id"] = dedup_id
        self._begin("publish")
        reply = await self._call(
            "publish",
            self.placement.owner(topic),
            "POST",
            f"/v1/topics/{topic}/messages",
            data=data,
            headers=headers,
            once=dedup_id is None,
        )
        return Published.from_wire(reply.json())

    async def publish_many(
        self,
        topic: str,
        bodies: Iterable[Body],
        *,
        dedup_ids: Sequence[str | None] | None = None,
    ) -> Published:
        """Publishes a batch (at most `max_batch_messages`, one call): a copy of every
        message in every subscribed queue. `dedup_ids` pairs a dedup id (or None) with
        each body, as in push_many."""
        validate_queue_name(topic)
        bodies = list(bodies)
        if dedup_ids is not None and len(dedup_ids) != len(bodies):
            raise ValueError("dedup_ids must pair one dedup id (or None) with each body")
        items = []
        for body in bodies:
            data, ctype = _bytes(body, None)
            items.append((data, None if ctype == _OCTET else ctype))
        frame = encode_batch(
            bodies=[b for b, _ in items],
            content_types=[c for _, c in items] if any(c for _, c in items) else None,
            dedup_ids=list(dedup_ids) if dedup_ids is not None else None,
        )
        self._begin("publish_many")
        reply = await self._call(
            "publish_many",
            self.placement.owner(topic),
            "POST",
            f"/v1/topics/{topic}/batch",
            data=frame,
            headers=_FRAME,
            once=dedup_ids is None or None in dedup_ids,
        )
        return Published.from_wire(reply.json())

    async def broadcast(
        self,
        queues: Sequence[str],
        body: Body,
        *,
        content_type: str | None = None,
        dedup_id: str | None = None,
    ) -> Published:
        """Stores a copy of one message in each of `queues`, in one call. Every queue
        must exist: otherwise QueueNotFound, and nothing is stored."""
        for q in queues:
            validate_queue_name(q)
        data, ctype = _bytes(body, content_type)
        message = message_to_wire("", data, ctype)
        message.pop("id", None)
        payload: dict[str, Any] = {"queues": list(queues), **message}
        if dedup_id is not None:
            payload["dedup_id"] = dedup_id
        self._begin("broadcast")
        reply = await self._call(
            "broadcast",
            self._any_node(),
            "POST",
            "/v1/broadcast",
            data=_http.dumps(payload),
            headers=_http.JSON_HEADERS,
            once=dedup_id is None,
        )
        return Published.from_wire(reply.json())

    # ---- the cluster's nodes ------------------------------------------------------------
    async def cluster_map(self) -> dict[str, Any]:
        """The cluster map as a node serves it (`GET /v1/cluster`); the client routes by
        it from then on."""
        self._begin("cluster")
        reply = await self._call("cluster", self._any_node(), "GET", "/v1/cluster")
        info = _read("cluster", "any", reply, dict)
        if int(info.get("epoch", 0)) > self._epoch:
            self._learn(info)
        return info

    async def add_node(self, node_id: str, address: str) -> dict[str, Any]:
        """Adds node `node_id` (running, listening on `address`, "host:port") to the
        cluster; replicas then move to it until the nodes hold even shares. Needs a token
        with admin on every queue. Idempotent. Returns `{"changed", "epoch", "map"}`."""
        body = {"id": node_id, "address": address}
        return await self._cluster_change("add_node", "POST", "/v1/cluster/nodes", body)

    async def remove_node(self, node_id: str) -> dict[str, Any]:
        """Drains node `node_id`: its replicas move to the others, then it leaves the map
        (and may be stopped). Idempotent."""
        return await self._cluster_change(
            "remove_node", "DELETE", f"/v1/cluster/nodes/{node_id}", None
        )

    async def replace_node(self, old: str, new: str, address: str) -> dict[str, Any]:
        """Node `new` (running at `address`) takes `old`'s place: `old`'s replicas are
        rebuilt on it from the other members (`old` may be dead). Idempotent."""
        body = {"id": new, "address": address}
        path = f"/v1/cluster/nodes/{old}/replace"
        return await self._cluster_change("replace_node", "POST", path, body)

    async def moves(self) -> dict[str, Any]:
        """The moves under way and done (`GET /v1/cluster/moves`)."""
        self._begin("moves")
        reply = await self._call("moves", self._any_node(), "GET", "/v1/cluster/moves")
        return _read("moves", "any", reply, dict)

    async def _cluster_change(self, op: str, method: str, path: str, body: Any) -> dict[str, Any]:
        self._begin(op)
        kw: dict[str, Any] = {}
        if body is not None:
            kw = {"data": _http.dumps(body), "headers": _http.JSON_HEADERS}
        reply = await self._call(op, self._any_node(), method, path, **kw)
        result = _read(op, "any", reply, dict)
        await self._follow(int(result.get("epoch", 0)))
        return result

    # ---- backups ---------------------------------------------------------------------
    async def backup(self, directory: str | Path) -> list[GroupBackup]:
        """A consistent copy of every replica group's state (each node's, with one copy),
        fetched from the group's leader into `directory` as `group-<g>.sqlite3`, with
        `backup.json` describing it (zdmq/client/backup.py). Needs a token with admin on
        every queue. Consistent per group, each copied at its own moment."""
        self._begin("backup")
        path = Path(directory)

        def get(group: str, params: Mapping[str, Any]) -> Awaitable[_http.Reply]:
            return self._call("backup", group, "GET", f"/v1/backup/{group}", params=params)

        p = self.placement
        layout = {
            "nodes": [{"id": n, "url": self._urls.get(n, "")} for n in p.nodes],
            "partitions": p.partitions,
            "replication": p.replication,
        }
        return await fetch_backup(get, list(p.nodes), path, layout)

    # ---- tied messages ---------------------------------------------------------------
    async def push_tied(
        self,
        queues: Sequence[str],
        body: Body,
        *,
        content_type: str | None = None,
        attributes: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> tuple[str, dict[str, str]]:
        """Stores a copy of one message in each of `queues` under one tie: the first
        receive or pop of any copy cancels the others (docs/api.md, "Tied messages").
        Returns the tie's token (for `cancel_tied`) and each queue's copy id. A given
        `token` makes the call idempotent: a retry with it stores no copy twice."""
        for q in queues:
            validate_queue_name(q)
        data, ctype = _bytes(body, content_type)
        attrs = encode_attributes(dict(attributes) if attributes is not None else None)
        messages = []
        for q in queues:
            m = message_to_wire("", data, ctype)
            m.pop("id", None)
            m["queue"] = q
            if attrs is not None:
                m["attributes"] = decode_attributes(attrs)
            messages.append(m)
        payload: dict[str, Any] = {"messages": messages}
        if token is not None:
            payload["token"] = token
        self._begin("push_tied")
        home = self.placement.owner(token) if token is not None else self._any_node()
        reply = await self._call(
            "push_tied",
            home,
            "POST",
            "/v1/tied",
            data=_http.dumps(payload),
            headers=_http.JSON_HEADERS,
            once=token is None,
        )
        j = reply.json()
        return str(j["token"]), {c["queue"]: c["id"] for c in j["copies"]}

    async def cancel_tied(self, token: str) -> str | None:
        """Cancels tie `token`: every copy not yet delivered is deleted and none is
        delivered from now on. Returns the id of the copy that was delivered, or None;
        TieNotFound (a ZdmqError) when there is no such tie."""
        self._begin("cancel_tied")
        reply = await self._call(
            "cancel_tied", self.placement.owner(token), "DELETE", f"/v1/tied/{token}"
        )
        delivered = reply.json().get("delivered")
        return str(delivered) if delivered is not None else None

    # ---- pop and receive -------------------------------------------------------------
    async def pop(
        self, queue: str, *, wait_s: float = 0.0, min_priority: int = 0
    ) -> Message | None:
        """Removes and returns one message, or None when the queue is empty.

        With `wait_s` > 0 an empty queue is watched that long for a message to arrive
        on any node (long polling). With `min_priority` only messages of that priority
        or more are taken. A node delivers its best messages first (priority, then
        deadline, then arrival); there is no order across nodes.
        """
        got = await self._take(queue, 1, "pop", wait_s=wait_s, min_priority=min_priority)
        return got[0] if got else None

    async def pop_many(
        self,
        queue: str,
        max_messages: int = 100,
        *,
        wait_s: float = 0.0,
        min_priority: int = 0,
    ) -> list[Message]:
        """Removes up to `max_messages` messages from one node; [] when the queue is empty."""
        if not 1 <= max_messages <= self._max_batch:
            raise ValueError(f"max_messages must be in 1..{self._max_batch}")
        return await self._take(
            queue, max_messages, "pop_many", wait_s=wait_s, min_priority=min_priority
        )

    async def receive(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_s: float | None = None,
        wait_s: float = 0.0,
        min_priority: int = 0,
    ) -> list[ReceivedMessage]:
        """Leases up to `max_messages` messages (at-least-once): each stays invisible for
        `visibility_s` (default: the queue's visibility timeout) until acked, nacked,
        extended or expired. [] when nothing arrives within `wait_s`. With
        `min_priority`, only messages of that priority or more."""
        if not 1 <= max_messages <= MAX_RECEIVE:
            raise ValueError(f"max_messages must be in 1..{MAX_RECEIVE}")
        got = await self._take(
            queue,
            max_messages,
            "receive",
            receive=True,
            lease_s=visibility_s,
            wait_s=wait_s,
            min_priority=min_priority,
        )
        return got

    @property
    def node_ids(self) -> list[str]:
        """The nodes of the cluster map this client routes by."""
        return list(self._node_ids)

    async def open_stream(
        self,
        node_id: str,
        queue: str,
        *,
        credit: int,
        visibility_s: float | None = None,
        min_priority: int = 0,
    ) -> NodeStream:
        """A consumer's stream to one node (docs/api.md, "Streams"): the node leases and
        sends the messages of the groups it leads while the stream holds credit. Raises
        the node's refusal (QueueNotFound, Forbidden, ...) or NodeUnavailable."""
        validate_queue_name(queue)
        if not 0 <= credit <= MAX_CREDIT:
            raise ValueError(f"credit must be in 0..{MAX_CREDIT}")
        return await NodeStream.open(
            node_id,
            self._urls[node_id],
            queue,
            credit=credit,
            visibility_s=visibility_s,
            min_priority=min_priority,
            headers=bearer_headers(self._token),
            ssl_context=self._ssl,
            timeout_s=self._timeout_s,
        )

    async def cancel(self, queue: str, message_id: str) -> None:
        """Removes a message not yet delivered (ready or delayed), on the node its id
        hashes to. MessageNotFound if the queue holds no such message waiting (never
        stored, or delivered); MessageLeased if it is received and not yet settled. A
        repeated cancel of a message a cancel removed succeeds again."""
        validate_queue_name(queue)
        validate_message_id(message_id)
        self._begin("cancel")
        await self._call(
            "cancel",
            self.placement.owner(message_id),
            "DELETE",
            f"/v1/queues/{queue}/messages/{message_id}",
        )

    async def ack(self, queue: str, receipts: str | Iterable[str]) -> AckResult:
        """Deletes leased messages. A receipt whose lease ended (expired, nacked, acked)
        is reported in `failed` as `lease_expired` and changes nothing."""
        return await self._settle(queue, "ack", receipts, {})

    async def nack(
        self, queue: str, receipts: str | Iterable[str], *, delay_s: float = 0.0
    ) -> AckResult:
        """Releases leased messages: visible again after `delay_s` (or dead-lettered
        once they were received `max_receives` times)."""
        return await self._settle(queue, "nack", receipts, {"delay_s": delay_s})

    async def extend(
        self, queue: str, receipts: str | Iterable[str], visibility_s: float
    ) -> AckResult:
        """Keeps leases for `visibility_s` more seconds from now (a heartbeat)."""
        return await self._settle(queue, "extend", receipts, {"visibility_s": visibility_s})

    def consume(
        self,
        queue: str,
        handler: Handler | None = None,
        **options: Any,
    ) -> Consumer:
        """A consumer loop over leases: `async for msg in client.consume(queue, ...)`.

        See `zdmq.client.consumer.Consumer` for the options and the shutdown rules.
        """
        from zdmq.client.consumer import Consumer

        return Consumer(self, queue, handler, **options)

    async def _settle(
        self, queue: str, action: str, receipts: str | Iterable[str], extra: dict[str, Any]
    ) -> AckResult:
        validate_queue_name(queue)
        receipts = [receipts] if isinstance(receipts, str) else list(receipts)
        self._begin(action)
        if not receipts:
            return AckResult(0)
        by_owner, failed = group_receipts(receipts, self.placement.owner)
        key = SETTLED_KEY[action]
        # A frame holds the receipts; the numbers go in the query string.
        params = {k: repr(float(v)) for k, v in extra.items()} if _numbers(extra) else None

        async def on(owner: str, refs: list[tuple[str, str, str]]) -> int:
            part = [r for r, _, _ in refs]
            done = 0
            for start in range(0, len(part), self._max_batch):
                chunk = part[start : start + self._max_batch]
                if params is not None:
                    data, headers = encode_batch(receipts=chunk), _FRAME
                else:  # values the node must refuse: it says why
                    data, headers = _http.dumps({"receipts": chunk, **extra}), _http.JSON_HEADERS
                try:
                    reply = await self._call(
                        action,
                        owner,
                        "POST",
                        f"/v1/queues/{queue}/{action}",
                        data=data,
                        headers=headers,
                        params=params,
                    )
                except NodeUnavailable as e:
                    failed.update((r, e.code) for r in chunk)
                    continue
                refused, took = _read(
                    action,
                    owner,
                    reply,
                    lambda j: ({f["receipt"]: f["code"] for f in j["failed"]}, int(j[key])),
                )
                failed.update(refused)
                done += took
            return done

        done = await asyncio.gather(*(on(o, part) for o, part in by_owner.items()))
        return AckResult(sum(done), failed)

    async def _take(
        self,
        queue: str,
        limit: int,
        op: str,
        *,
        receive: bool = False,
        lease_s: float | None = None,
        wait_s: float = 0.0,
        min_priority: int = 0,
    ) -> list[Any]:
        """Messages (ReceivedMessage with `receive`, else Message) from up to three calls."""
        validate_queue_name(queue)
        if not 0 <= wait_s <= MAX_WAIT_S:
            raise ValueError(f"wait_s must be in 0..{MAX_WAIT_S:g}")
        if not 0 <= min_priority <= MAX_PRIORITY:
            raise ValueError(f"min_priority must be in 0..{MAX_PRIORITY}")
        self._begin(op)
        params = {"max": str(limit)}
        if lease_s is not None:
            params["visibility_s"] = repr(float(lease_s))
        if min_priority:
            params["min_priority"] = str(min_priority)
        kind = "receive" if receive else "pop"
        started = time.monotonic()
        tried: set[str] = set()
        down: set[str] = set()
        guess, from_list = self._guess(queue)
        got = await self._take_at(op, kind, guess, queue, params, tried, down, listed=from_list)
        if got:
            return got
        # The guess was empty: ask the metadata list (at most twice: a node it names
        # may have emptied meanwhile) and take at the nodes it names.
        for _ in range(2):
            listed = await self.metadata(queue, op=op)
            candidates = [n for n in listed if n not in tried] or listed
            random.shuffle(candidates)
            for node_id in candidates:
                got = await self._take_at(
                    op, kind, node_id, queue, params, tried, down, listed=True
                )
                if got:
                    return got
            if down.intersection(listed):
                # Never call a queue empty while a node that may hold its messages is down.
                raise NodeUnavailable(
                    f"queue {queue!r}: listed node(s) {sorted(down)} did not answer"
                )
            if not listed:
                break
            tried.clear()
        remaining = wait_s - (time.monotonic() - started)
        if remaining <= 0:
            return []
        # Long poll on the metadata owner: it hears when any node gets visible messages.
        reply = await self._call(
            op,
            self.placement.owner(queue),
            "POST",
            f"/v1/queues/{queue}/{kind}",
            params={**params, "wait_s": f"{remaining:.6f}"},  # repr may give 19 decimals
            headers=_ACCEPT,
            timeout_s=remaining + self._timeout_s,
            once=kind == "pop",
        )
        return _messages(reply, receive, op, self.placement.owner(queue))

    def _guess(self, queue: str) -> tuple[str, bool]:
        """The node to try first, and whether it came from the metadata list."""
        cached = self._meta.get(queue)
        if cached is not None:
            fetched_at, nodes = cached
            if nodes and time.monotonic() - fetched_at < self._metadata_ttl_s:
                return random.choice(nodes), True
        # ZDMQ: a fresh UUID hashes to a random node.
        return self.placement.owner(str(uuid.uuid4())), False

    async def _take_at(
        self,
        op: str,
        kind: str,
        node_id: str,
        queue: str,
        params: dict[str, str],
        tried: set[str],
        down: set[str],
        *,
        listed: bool,
    ) -> list[Any]:
        """Pops or receives at one node's UUID queue only; [] when it is empty or down."""
        try:
            reply = await self._call(
                op,
                node_id,
                "POST",
                f"/v1/queues/{queue}/{kind}",
                params=params,
                headers=_ROUTE_LISTED if listed else _ROUTE_LOCAL,
                once=kind == "pop",
            )
        except NodeUnavailable as e:
            if kind == "pop" and not e.unsent:
                # The pop may have taken messages before the call failed: say so rather
                # than go on to another node (they would be lost without a word).
                raise
            down.add(node_id)
            msgs: list[Any] = []
        else:
            msgs = _messages(reply, kind == "receive", op, node_id)
        if not msgs:
            tried.add(node_id)
            cached = self._meta.get(queue)
            if cached is not None and node_id in cached[1]:
                cached[1].remove(node_id)
        return msgs


# id, body, content type, dedup id, priority, deadline, ttl_s, delay_s, attributes
_Item = tuple[str | None, bytes, str | None, str | None, int, float, float, float, str | None]
_Options = tuple[int, float, float, float, str | None]
_PLAIN: _Options = (0, 0.0, 0.0, 0.0, None)


def _each(value: Any, n: int, name: str) -> list[Any]:
    """One value per message: `value` itself for all, or its items (a sequence of n)."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if len(value) != n:
            raise ValueError(f"{name} must pair one value with each body")
        return list(value)
    return [value] * n


def _options_each(
    n: int, priority: Any, deadline: Any, ttl_s: Any, delay_s: Any, attributes: Any
) -> list[_Options] | None:
    """Each message's checked (priority, deadline, ttl_s, delay_s, attributes) of a
    push_many (0 for none), or None when no message has any."""
    if not priority and deadline is None and ttl_s is None and not delay_s and not attributes:
        return None
    now = time.time()
    out: list[_Options] = []
    attrs_each = (
        [attributes] * n if attributes is None or isinstance(attributes, Mapping) else attributes
    )
    if len(attrs_each) != n:
        raise ValueError("attributes must pair one mapping (or None) with each body")
    for p, d, t, delay, attrs in zip(
        _each(priority, n, "priority"),
        _each(deadline, n, "deadline"),
        _each(ttl_s, n, "ttl_s"),
        _each(delay_s, n, "delay_s"),
        attrs_each,
        strict=True,
    ):
        delivery_options(priority=p, deadline=d, ttl_s=t, delay_s=delay, now=now)
        encoded = encode_attributes(dict(attrs) if attrs is not None else None)
        out.append((p or 0, float(d or 0.0), float(t or 0.0), float(delay or 0.0), encoded))
    return out


def _given(dedup_ids: Sequence[str | None] | None) -> int:
    """How many messages of a push_many carry a dedup id."""
    return 0 if dedup_ids is None else sum(d is not None for d in dedup_ids)


def _item_bytes(item: _Item) -> int:
    """An upper bound on what one message adds to a push frame."""
    _, body, ctype, dedup_id, *_, attrs = item
    return (
        88
        + len(body)
        + (len(ctype) * 4 if ctype else 0)
        + (len(dedup_id) * 4 if dedup_id else 0)
        + (len(attrs) * 4 if attrs else 0)
    )


def _push_frame(items: Sequence[_Item], groups: Sequence[str] | None = None) -> bytes:
    ids, bodies, ctypes, dedup_ids, prios, deadlines, ttls, delays, attrs = zip(*items, strict=True)
    return encode_batch(
        ids=ids,
        bodies=bodies,
        content_types=ctypes,
        dedup_ids=dedup_ids,
        priorities=prios,
        deadlines=deadlines,
        ttls=ttls,
        delays=delays,
        attributes=attrs,
        groups=groups,
    )


def _batches(sizes: list[int], max_count: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) of runs of items, each within both limits: at most `max_count` items
    and `max_bytes` bytes (a frame's 12-byte head included), unless one item alone is
    larger."""
    envelope = 12
    start, size = 0, envelope
    for i, n in enumerate(sizes):
        if i > start and (i - start >= max_count or size + n > max_bytes):
            yield start, i
            start, size = i, envelope
        size += n
    if start < len(sizes):
        yield start, len(sizes)


def _unreadable(op: str, node_id: str, problem: object) -> InternalError:
    """The error for a 2xx reply that is not what the call answers: a bug on that node
    (or a peer that is not a zdmq node), which no retry fixes."""
    return InternalError(f"{op}: node {node_id} sent a reply zdmq cannot read: {problem}")


def _read(op: str, node_id: str, reply: _http.Reply, read: Callable[[Any], T]) -> T:
    """`read` applied to a JSON reply; InternalError naming the call and the node when the
    reply is not JSON of the shape `read` expects."""
    try:
        return read(reply.json())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise _unreadable(op, node_id, e) from e


def _check_pushed(reply: _http.Reply, sent: int, node_id: str) -> None:
    """A batch push's reply names one id per message sent."""
    got = _read("push_many", node_id, reply, lambda j: len(j["ids"]))
    if got != sent:
        raise _unreadable("push_many", node_id, f"{got} ids for {sent} messages")


def _messages(
    reply: _http.Reply, receive: bool, op: str, node_id: str
) -> list[Message] | list[ReceivedMessage]:
    """The messages of a pop or receive reply from `node_id`; InternalError naming the call
    and the node when the reply cannot be read (a malformed frame or JSON)."""
    try:
        return _read_messages(reply, receive)
    except (ZdmqError, ValueError, KeyError, TypeError) as e:
        # A pop's messages were removed before the node replied: they are lost. A
        # receive's come back when their leases run out.
        raise _unreadable(op, node_id, e) from e


def _read_messages(reply: _http.Reply, receive: bool) -> list[Message] | list[ReceivedMessage]:
    """The messages of a pop or receive reply: a batch frame, or JSON from a node that
    answers JSON."""
    if not reply.headers.get("content-type", "").startswith(BATCH_CONTENT_TYPE):
        items = reply.json()["messages"]
        if receive:
            return [received_from_wire(m) for m in items]
        return [message_from_wire(m) for m in items]
    b = decode_batch(reply.body)
    return received_of_batch(b) if receive else messages_of_batch(b)


def _numbers(extra: dict[str, Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in extra.values())


def _bytes(body: Body, content_type: str | None) -> tuple[bytes, str]:
    if isinstance(body, str):
        return body.encode("utf-8"), content_type or _TEXT
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type or _OCTET
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")
