"""The node service: ZDMQ's protocol over the node state, storage and peer calls.

`Node` decides; `NodeState` (pure) holds; storage makes each change durable before the
reply; peers are other nodes reached over HTTP. The HTTP app (`app.py`) only parses
requests and calls these methods.

Registration invariant (why no message is ever stranded): a node registers with a
queue's metadata owner *before* it stores the first message of its UUID queue, and
unregisters only while that UUID queue is empty, both under the queue's lock. So the
metadata list is always a superset of the nodes that hold messages; a crash between
the two steps leaves at worst a listed node that is empty, which the next pop there
removes. A periodic repair sweep re-registers every non-empty UUID queue all the same,
in case a metadata owner lost an update (and, after a restart, purges the UUID queues
of queues deleted while this node was down).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp

from zdmq import _http
from zdmq.config import ClusterConfig
from zdmq.errors import (
    MessageIdConflict,
    NodeUnavailable,
    QueueExists,
    QueueLimitReached,
    QueueNotFound,
    StorageFailed,
    ZdmqError,
)
from zdmq.hashing import Placement
from zdmq.models import message_from_wire
from zdmq.server.state import (
    CreateQueue,
    DropQueue,
    LocalQueue,
    NodeState,
    Op,
    Register,
    StoredMessage,
    Unregister,
)
from zdmq.server.storage import Storage

__all__ = ["FORWARDED_HEADER", "LISTED_HEADER", "ROUTE_HEADER", "Node"]

log = logging.getLogger("zdmq.node")

# Set on node-to-node calls: the receiver must act locally and never forward again.
FORWARDED_HEADER = "zdmq-forwarded"
# `zdmq-route: local` asks a node to act only on its own UUID queue (the client's pops).
ROUTE_HEADER = "zdmq-route"
# `zdmq-listed: 1` on a local pop: the caller chose this node from the metadata list.
LISTED_HEADER = "zdmq-listed"

T = TypeVar("T")
PushItem = tuple[str, bytes, str | None]  # (id, body, content type)


class Node:
    def __init__(self, config: ClusterConfig, node_id: str, storage: Storage) -> None:
        self.config = config
        self.id = node_id
        self.me = config.node(node_id)
        self.placement = Placement(config.node_ids, config.partitions, config.replication)
        self.urls = {n.id: n.url for n in config.nodes}
        self.storage = storage
        self.state: NodeState = NodeState()
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._session: aiohttp.ClientSession | None = None
        self.started_at = time.time()
        self.counters: dict[str, int] = defaultdict(int)

    # ---- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        self.state = await asyncio.to_thread(self.storage.load)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, limit_per_host=64),
            timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
        )

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.storage.close()

    async def commit(self, ops: Sequence[Op]) -> None:
        if ops:
            await self.storage.submit(ops)

    # ---- peers ---------------------------------------------------------------------
    async def peer_call(
        self, node_id: str, method: str, path: str, *, json: Any = None, **kw: Any
    ) -> _http.Reply:
        assert self._session is not None
        headers = {FORWARDED_HEADER: self.id, **kw.pop("headers", {})}
        return await _http.call(
            self._session, method, self.urls[node_id] + path, json=json, headers=headers, **kw
        )

    def meta_owner(self, queue: str) -> str:
        return self.placement.owner(queue)

    async def _on_owner(
        self,
        queue: str,
        local: Callable[[], Awaitable[T]],
        method: str,
        path: str,
        body: Any,
        decode: Callable[[Any], T],
    ) -> T:
        owner = self.meta_owner(queue)
        if owner == self.id:
            return await local()
        reply = await self.peer_call(owner, method, path, json=body)
        return decode(reply.json())

    # ---- metadata owner side ------------------------------------------------------
    async def create_queue(self, queue: str) -> str:
        if queue in self.state.meta:
            raise QueueExists(f"queue {queue!r} already exists")
        if len(self.state.meta) >= self.config.limits.max_queues:
            raise QueueLimitReached(
                f"{self.id} keeps the metadata of {len(self.state.meta)} queues, its limit"
            )
        op = CreateQueue(queue, uuid.uuid4().hex, time.time())
        self.state.apply(op)
        await self.commit([op])
        return op.incarnation

    async def drop_queue(self, queue: str) -> None:
        if queue not in self.state.meta:
            raise QueueNotFound(f"queue {queue!r} does not exist")
        op = DropQueue(queue)
        self.state.apply(op)
        await self.commit([op])
        # Every node may hold messages or a stale registration: tell them all. A node that
        # is down purges on restart, when its repair sweep learns the queue is gone.
        await asyncio.gather(
            *(self._purge_on(n, queue) for n in self.config.node_ids), return_exceptions=True
        )

    async def _purge_on(self, node_id: str, queue: str) -> None:
        if node_id == self.id:
            await self.purge_local(queue)
        else:
            await self.peer_call(node_id, "POST", f"/v1/internal/queues/{queue}/purge")

    def metadata(self, queue: str) -> dict[str, Any]:
        meta = self.state.meta.get(queue)
        if meta is None:
            raise QueueNotFound(f"queue {queue!r} does not exist")
        return {
            "queue": queue,
            "incarnation": meta.incarnation,
            "nodes": [{"node": n, "first_uuid": f} for n, f in meta.nodes.items()],
        }

    async def register(self, queue: str, node_id: str, first_uuid: str) -> str:
        meta = self.state.meta.get(queue)
        if meta is None:
            raise QueueNotFound(f"queue {queue!r} does not exist")
        if node_id not in meta.nodes:
            op = Register(queue, node_id, first_uuid)
            self.state.apply(op)
            await self.commit([op])
        return meta.incarnation

    async def unregister(self, queue: str, node_id: str) -> None:
        meta = self.state.meta.get(queue)
        if meta is not None and node_id in meta.nodes:
            op = Unregister(queue, node_id)
            self.state.apply(op)
            await self.commit([op])

    async def sweep(self, node_id: str, queues: dict[str, str]) -> list[str]:
        """Registers `node_id` for each queue it holds messages of; returns the unknown ones."""
        missing: list[str] = []
        ops: list[Op] = []
        for queue, first_uuid in queues.items():
            meta = self.state.meta.get(queue)
            if meta is None:
                missing.append(queue)
            elif node_id not in meta.nodes:
                op = Register(queue, node_id, first_uuid)
                self.state.apply(op)
                ops.append(op)
        if ops:
            log.info("repair sweep re-registered %s for %d queue(s)", node_id, len(ops))
            self.counters["repair_registrations"] += len(ops)
        await self.commit(ops)
        return missing

    def owned_queues(self) -> list[str]:
        return list(self.state.meta)

    # ---- storage node side --------------------------------------------------------
    async def _ensure_registered(self, queue: str, first_uuid: str) -> None:
        async with self._locks[queue]:
            lq = self.state.queues.get(queue)
            if lq is not None and lq.registered:
                return
            incarnation = await self._on_owner(
                queue,
                lambda: self.register(queue, self.id, first_uuid),
                "POST",
                f"/v1/internal/queues/{queue}/register",
                {"node": self.id, "first_uuid": first_uuid},
                lambda j: str(j["incarnation"]),
            )
            lq = self.state.queues.get(queue)
            if lq is None:
                lq = self.state.queues[queue] = LocalQueue()
            lq.registered = True
            lq.incarnation = incarnation

    async def push_local(self, queue: str, items: Sequence[PushItem]) -> list[str]:
        """Stores messages this node owns (their ids hash here); replies after commit."""
        state = self.state
        self._check_storage()
        lq = state.queues.get(queue)
        while lq is None or not lq.registered:
            await self._ensure_registered(queue, items[0][0])
            lq = state.queues.get(queue)
        # No await between the registration check and the appends: an unregister can
        # only run on an empty UUID queue under the lock, so it cannot interleave here.
        # Check the whole batch before changing anything: a refused batch stores nothing.
        for mid, _, _ in items:
            stored = state.messages.get(mid)
            if stored is not None and stored.queue != queue:
                raise MessageIdConflict(f"message id {mid} is in use by another queue")
        ops: list[Op] = []
        for mid, body, ctype in items:
            if mid in state.messages:
                continue  # the same id pushed twice: store it once
            ops.append(state.push(queue, mid, body, ctype))
        self.counters["pushed"] += len(ops)
        await self.commit(ops)
        return [mid for mid, _, _ in items]

    def _check_storage(self) -> None:
        # Once a commit failed, memory may be ahead of disk: change nothing more.
        if self.storage.failed is not None:
            raise StorageFailed(f"{self.id}: storage failed: {self.storage.failed}")

    async def pop_local(
        self, queue: str, limit: int, *, listed: bool = False
    ) -> list[tuple[str, StoredMessage]]:
        """Pops up to `limit` messages from this node's UUID queue; [] when it is empty.

        `listed`: the caller came here because the metadata list names this node, so an
        empty node must leave the list even if it holds no UUID queue for `queue` (a
        crash between registering and storing, or a lost unregister, leaves such entries).
        """
        self._check_storage()
        popped = self.state.pop(queue, limit)
        if popped:
            self.counters["popped"] += len(popped)
            await self.commit([op for _, _, op in popped])
            return [(mid, m) for mid, m, _ in popped]
        lq = self.state.queues.get(queue)
        # Registered or not: after a restart `registered` is False (runtime knowledge)
        # while the owner's durable list may still name this node.
        if (lq is not None and not lq.ids) or (lq is None and listed):
            await self._drop_empty(queue)
        return []

    async def _drop_empty(self, queue: str) -> None:
        """ZDMQ's empty step: drop the UUID queue, reset firstUUID, leave the metadata list."""
        async with self._locks[queue]:
            lq = self.state.queues.get(queue)
            if lq is not None:
                if lq.ids:
                    return
                del self.state.queues[queue]
            try:
                await self._on_owner(
                    queue,
                    lambda: self.unregister(queue, self.id),
                    "POST",
                    f"/v1/internal/queues/{queue}/unregister",
                    {"node": self.id},
                    lambda j: None,
                )
            except ZdmqError as e:
                # Harmless: a listed empty node costs a later pop one more call.
                log.warning("unregister %s from %s failed: %s", self.id, queue, e)

    async def purge_local(self, queue: str) -> int:
        async with self._locks[queue]:
            n = self.state.depth(queue)
            op = self.state.purge(queue)
            if op is not None:
                await self.commit([op])
            return n

    def depth(self, queue: str) -> int:
        return self.state.depth(queue)

    # ---- cluster-wide operations any node serves ------------------------------------
    async def routed_pop(self, queue: str, limit: int) -> list[tuple[str, StoredMessage]]:
        """A pop on behalf of a caller that does not route itself (curl, Locust)."""
        got = await self.pop_local(queue, limit)
        if got:
            return got
        meta = await self.metadata_via_owner(queue)
        nodes = [e["node"] for e in meta["nodes"] if e["node"] != self.id]
        random.shuffle(nodes)
        down: list[str] = []
        for node_id in nodes:
            try:
                reply = await self.peer_call(
                    node_id,
                    "POST",
                    f"/v1/queues/{queue}/pop",
                    params={"max": str(limit)},
                    headers={ROUTE_HEADER: "local", LISTED_HEADER: "1"},
                )
            except NodeUnavailable as e:
                log.warning("pop at %s failed: %s", node_id, e)
                down.append(node_id)
                continue
            msgs = [message_from_wire(m) for m in reply.json()["messages"]]
            if msgs:
                return [(m.id, StoredMessage(queue, 0, m.body, m.content_type)) for m in msgs]
        if down:
            # Never call a queue empty while a node that may hold its messages is down.
            raise NodeUnavailable(f"queue {queue!r}: listed node(s) {down} did not answer")
        return []

    async def metadata_via_owner(self, queue: str) -> dict[str, Any]:
        async def local() -> dict[str, Any]:
            return self.metadata(queue)

        return await self._on_owner(
            queue, local, "GET", f"/v1/queues/{queue}/metadata", None, lambda j: j
        )

    async def stats(self, queue: str) -> dict[str, Any]:
        """Depth per node, asked of every node (a node down is reported, not guessed)."""
        meta = await self.metadata_via_owner(queue)

        async def depth_on(node_id: str) -> int:
            if node_id == self.id:
                return self.depth(queue)
            reply = await self.peer_call(node_id, "GET", f"/v1/internal/queues/{queue}/depth")
            return int(reply.json()["depth"])

        ids = self.config.node_ids
        results = await asyncio.gather(*(depth_on(n) for n in ids), return_exceptions=True)
        depth: dict[str, int] = {}
        unavailable: list[str] = []
        for node_id, r in zip(ids, results, strict=True):
            if isinstance(r, BaseException):
                unavailable.append(node_id)
            elif r:
                depth[node_id] = r
        return {
            "queue": queue,
            "messages": sum(depth.values()),
            "nodes": sorted(depth),
            "depth": depth,
            "registered": [e["node"] for e in meta["nodes"]],
            "unavailable": unavailable,
        }

    async def list_queues(self) -> list[str]:
        async def owned_by(node_id: str) -> list[str]:
            if node_id == self.id:
                return self.owned_queues()
            reply = await self.peer_call(node_id, "GET", "/v1/internal/owned-queues")
            return list(reply.json()["queues"])

        results = await asyncio.gather(*(owned_by(n) for n in self.config.node_ids))
        return sorted(q for qs in results for q in qs)

    # ---- repair sweep -------------------------------------------------------------
    async def repair_once(self) -> int:
        """Re-registers every non-empty UUID queue with its metadata owner.

        Returns how many owners could not be reached (the sweep tries again later).
        """
        by_owner: defaultdict[str, dict[str, str]] = defaultdict(dict)
        for queue, lq in self.state.queues.items():
            if lq.ids:
                by_owner[self.meta_owner(queue)][queue] = lq.first_uuid or lq.ids[0]
        failures = 0
        for owner, queues in by_owner.items():
            try:
                if owner == self.id:
                    missing = await self.sweep(self.id, queues)
                else:
                    reply = await self.peer_call(
                        owner,
                        "POST",
                        "/v1/internal/sweep",
                        json={"node": self.id, "queues": queues},
                    )
                    missing = list(reply.json()["missing"])
            except ZdmqError as e:
                failures += 1
                log.debug("repair sweep: %s unreachable: %s", owner, e)
                continue
            for queue in missing:
                # Deleted while this node was away: its messages go with it.
                n = await self.purge_local(queue)
                if n:
                    log.info("repair sweep purged %d message(s) of deleted queue %s", n, queue)
        return failures

    async def repair_loop(self) -> None:
        while True:
            try:
                await self.repair_once()
            except Exception:  # keep sweeping whatever one round hit
                log.exception("repair sweep failed")
            await asyncio.sleep(self.config.repair_interval_s)
