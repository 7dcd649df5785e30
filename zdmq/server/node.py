"""The node service: ZDMQ's protocol over the node state, storage and peer calls.

`Node` decides; `NodeState` (pure) holds; storage makes each change durable before the
reply; peers are other nodes reached over HTTP. The HTTP routes (`app.py`, `routes/`) only
parse requests and call these methods.

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
import contextlib
import logging
import os
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import orjson

from zdmq import _http
from zdmq.auth import NodeSigner, node_secret
from zdmq.config import ClusterConfig
from zdmq.errors import (
    BadRequest,
    FifoConflict,
    InternalError,
    Misrouted,
    NodeUnavailable,
    NotLeader,
    QueueExists,
    QueueLimitReached,
    QueueNotFound,
    StorageFailed,
    TopicExists,
    TopicNotFound,
    ZdmqError,
)
from zdmq.hashing import Placement
from zdmq.logs import REQUEST_ID_HEADER, request_id
from zdmq.models import (
    BATCH_CONTENT_TYPE,
    MAX_RECEIVE,
    QueueSettings,
    decode_batch,
    group_key,
    make_receipt,
    message_from_wire,
)
from zdmq.server.heap import Heap
from zdmq.server.machine import (
    CancelMessage,
    Claim,
    Command,
    DropEmpty,
    Expire,
    Housekeep,
    Meta,
    PurgeQueue,
    Push,
    PushTake,
    Settle,
    Take,
    Tie,
    Untie,
    Wake,
    apply_command,
)
from zdmq.server.state import (
    CreateQueue,
    CreateTopic,
    DeadLetter,
    DropQueue,
    DropTopic,
    NodeState,
    Op,
    Register,
    Subscribe,
    Taken,
    Unregister,
    Unsubscribe,
)
from zdmq.server.storage import Storage
from zdmq.server.topology import Topology

if TYPE_CHECKING:
    from zdmq.server.metrics import NodeMetrics
    from zdmq.server.replicas import Member

__all__ = ["FORWARDED_HEADER", "LISTED_HEADER", "ROUTE_HEADER", "Delivery", "Node", "PushItem"]

log = logging.getLogger("zdmq.node")

# Set on node-to-node calls: the receiver must act locally and never forward again.
FORWARDED_HEADER = "zdmq-forwarded"
# `zdmq-route: local` asks a node to act only on its own UUID queue (the client's pops).
ROUTE_HEADER = "zdmq-route"
# `zdmq-listed: 1` on a local pop: the caller chose this node from the metadata list.
LISTED_HEADER = "zdmq-listed"

T = TypeVar("T")


class PushItem(NamedTuple):
    id: str
    body: bytes
    content_type: str | None
    dedup: bool = False  # the id came from a dedup_id: repeats inside the window are dropped
    priority: int = 0  # 0..9, higher first
    deadline: float = 0.0  # unix seconds; 0: none
    delay_s: float = 0.0  # invisible for this long after the push
    attributes: str | None = None  # a JSON object of string keys and values
    group: str | None = None  # the FIFO group (a FIFO queue's message: every one has one)
    tie: str | None = None  # the tie token of a tied copy


class Delivery(NamedTuple):
    """One message handed out by a pop (receipt None) or a receive (leased)."""

    id: str
    body: bytes
    content_type: str | None
    receipt: str | None = None
    receive_count: int = 0
    attributes: str | None = None  # a JSON object of string keys and values
    priority: int = 0
    group: str | None = None


class Taker(Protocol):
    """A consumer's stream waiting with credit (routes/streams.py): a push here leases
    for it in the push's own command (`PushTake`), so the messages go out after one
    commit rather than two."""

    lease_s: float | None
    min_priority: int

    def reserve(self, most: int) -> int:
        """Sets aside up to `most` of its credit; 0 when it takes nothing now."""

    def hand(self, got: list[Delivery], reserved: int) -> None:
        """What a push leased with the credit `reserve` set aside (the rest goes back)."""


# How often the lease monitor looks at the clock at most, and how often it sweeps
# retention and dedup records.
MONITOR_TICK_S = 0.05
HOUSEKEEPING_S = 1.0
# How long the monitor leaves a queue alone after it could not learn its settings.
MONITOR_RETRY_S = 1.0


class QueueLocks:
    """An asyncio.Lock per queue name, kept only while some task holds or waits for it,
    so a node that has seen a million queue names come and go keeps none of their locks.

    `async with locks(queue):` holds the queue's lock.
    """

    def __init__(self) -> None:
        self._held: dict[str, _HeldLock] = {}

    def __call__(self, queue: str) -> _HeldLock:
        held = self._held.get(queue)
        if held is None:
            held = self._held[queue] = _HeldLock(self._held, queue)
        return held

    def __len__(self) -> int:
        return len(self._held)


class _HeldLock:
    """The lock of one queue and how many tasks hold or wait for it; the last one out
    takes it off the map."""

    __slots__ = ("_key", "_lock", "_map", "_users")

    def __init__(self, held: dict[str, _HeldLock], key: str) -> None:
        self._map, self._key = held, key
        self._lock = asyncio.Lock()
        self._users = 0

    async def __aenter__(self) -> None:
        self._users += 1
        try:
            await self._lock.acquire()
        except BaseException:  # cancelled while waiting
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        self._users -= 1
        if self._users == 0 and self._map.get(self._key) is self:
            del self._map[self._key]


class OwnerBatches:
    """Calls of one kind to metadata owners, batched per owner: one call in flight to
    each owner at a time, and every item added meanwhile (one per queue) goes with the
    next call. Under load that is a call per round trip rather than per queue: many
    sparse queues registering, unregistering or turning non-empty at once (the scale
    workload's sparse rows, docs/benchmarks.md) cost a request and a commit per batch on
    the owner.

    `send(owner, {queue: value})` makes the call and returns a result per queue (or the
    exception that queue failed with); an exception it raises fails the whole batch.
    """

    def __init__(
        self,
        spawn: Callable[[Awaitable[Any]], None],
        send: Callable[[str, dict[str, Any]], Awaitable[Mapping[str, Any]]],
    ) -> None:
        self._spawn = spawn
        self._send = send
        self._waiting: dict[str, dict[str, tuple[Any, asyncio.Future[Any]]]] = {}
        self._busy: set[str] = set()  # owners with a call in flight

    def add(self, owner: str, queue: str, value: Any = None) -> asyncio.Future[Any]:
        """Queues `queue` for `owner`'s next call; the future of its result. A queue
        already waiting keeps its place (and value) and shares its future."""
        waiting = self._waiting.setdefault(owner, {})
        held = waiting.get(queue)
        if held is not None:
            return held[1]
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        waiting[queue] = (value, fut)
        if owner not in self._busy:
            self._busy.add(owner)
            self._spawn(self._run(owner))
        return fut

    async def _run(self, owner: str) -> None:
        try:
            while batch := self._waiting.pop(owner, None):
                try:
                    results = await self._send(owner, {q: v for q, (v, _) in batch.items()})
                except Exception as e:  # every waiter gets what the call raised
                    for _, fut in batch.values():
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for q, (_, fut) in batch.items():
                    if fut.done():
                        continue  # its caller gave up
                    r = results.get(q)
                    if isinstance(r, BaseException):
                        fut.set_exception(r)
                    else:
                        fut.set_result(r)
        finally:
            self._busy.discard(owner)


class Node:
    def __init__(
        self,
        config: ClusterConfig,
        node_id: str,
        storage: Storage,
        *,
        secret: bytes | None = None,
        member: Member | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.config = config
        # With replication, the replica groups of this process (replicas.py): this Node is
        # then one group's (its id is the group's), its changes go through the group's
        # log, and its calls to other groups reach their leaders wherever they are.
        self.member = member
        # The cluster's node secret: it signs every call this node makes to another.
        self.secret = secret if secret is not None else node_secret(config)
        self.id = node_id
        # The cluster map (zdmq/server/topology.py): its groups are fixed, so is where
        # every key lives; the URLs of the nodes follow the map.
        self.topology = topology if topology is not None else Topology(config)
        self.group_ids = self.topology.map.groups
        self.placement = Placement(self.group_ids, config.partitions, config.replication)
        self.urls = self.topology.urls
        self.storage = storage
        self.state: NodeState = NodeState()
        self._locks = QueueLocks()
        self._session: _http.HttpPool | None = None
        self.started_at = time.time()
        self.counters: dict[str, int] = defaultdict(int)
        #: The node process's metrics (zdmq/server/metrics.py), None when they are off.
        self.metrics: NodeMetrics | None = None
        # Settings of the queues this node stores messages of, as their metadata owners
        # reported them (runtime cache: filled by register, sweep and metadata replies).
        self.settings: dict[str, QueueSettings] = {}
        # The incarnation of each queue whose settings the last repair sweep brought (the
        # owner leaves those out of the next sweep's reply while the incarnation holds).
        self._swept: dict[str, str] = {}
        # Queues this node holds messages of whose metadata owner does not know them and
        # recorded no delete (see _orphan): kept, not purged; counted as orphaned_queues.
        self._orphaned: set[str] = set()
        # The queues this node is known to be on the metadata list of, with the queue's
        # incarnation: runtime knowledge, so after a restart every queue registers again
        # before its next push here.
        self._registered: dict[str, str] = {}
        self._term = -1  # the term in which this replica group's node last led
        # Calls to other metadata owners, batched per owner (values: firstUUIDs, -, -).
        self._registrations = OwnerBatches(self._spawn, self._send_registrations)
        self._unregistrations = OwnerBatches(self._spawn, self._send_unregistrations)
        self._ready_notices = OwnerBatches(self._spawn, self._send_ready)
        self.heap = Heap()
        # (messages moved at the last housekeeping round, at the last heap release)
        self._heap_marks = (0, 0)
        # Long polling, on the metadata owner: a version per queue that moves whenever a
        # node reports it has visible messages, and the event its waiters sleep on.
        self._ready_version: defaultdict[str, int] = defaultdict(int)
        # Per queue: a count of the times this node's own UUID queue gained messages to
        # deliver, and the event its consumers' streams wait on (stream.py).
        self.local_version: defaultdict[str, int] = defaultdict(int)
        self._local_events: dict[str, asyncio.Event] = {}
        # Per queue: the streams waiting on this node with credit, for pushes to lease for.
        self.takers: defaultdict[str, list[Taker]] = defaultdict(list)
        self._ready_nodes: dict[str, dict[str, int]] = {}
        self._ready_events: dict[str, asyncio.Event] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._monitor_retry_at: dict[str, float] = {}
        # Emptied UUID queues waiting out `unregister_grace_s` before they unregister.
        self._drop_timers: dict[str, asyncio.TimerHandle] = {}
        self._new_token = _tokens().__next__

    # ---- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        self.state = await asyncio.to_thread(self.storage.load)
        if self.member is not None:
            self._session = self.member.pool
            return
        # Idle connections are dropped well before the other nodes close them.
        self._session = node_pool(self.config, self.secret, self.id)

    async def stop(self) -> None:
        for timer in self._drop_timers.values():
            timer.cancel()
        self._drop_timers.clear()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._session is not None and self.member is None:
            await self._session.close()
        await self.storage.close()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        """Forgets a finished background task, logging what it failed with (a bug: the
        tasks handle the errors they expect)."""
        self._background.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("background task failed", exc_info=e)

    async def execute(self, cmd: Command) -> Any:
        """Runs `cmd` against this node's state (machine.py) and returns its result once
        what it changed is committed; an error it returns is raised. Every change to the
        state goes through here."""
        self._check_storage()
        if self.member is not None:
            result = await self.member.propose(self.id, cmd)
        else:
            result = apply_command(self.state, cmd)
            await self.storage.barrier()
        if isinstance(result, ZdmqError):
            raise result
        return result

    @property
    def leading(self) -> bool:
        """Whether this node serves: always, unless it is a replica group that another
        member leads now. A member that starts to lead forgets what it knew of its
        registrations: another leader may have changed them meanwhile."""
        member = self.member
        if member is None:
            return True
        if not member.leads(self.id):
            return False
        term = member.term(self.id)
        if term != self._term:
            self._term = term
            self._registered.clear()
            self._swept.clear()
        return True

    def check_leading(self) -> None:
        """Raises NotLeader (421, naming the leader) unless this node serves now."""
        if not self.leading:
            assert self.member is not None
            raise self.member.not_leader(self.id)

    # ---- peers ---------------------------------------------------------------------
    async def peer_call(
        self, node_id: str, method: str, path: str, *, json: Any = None, **kw: Any
    ) -> _http.Reply:
        assert self._session is not None
        headers = {FORWARDED_HEADER: self.id, **kw.pop("headers", {})}
        rid = request_id.get()
        if rid is not None:  # the request being served, if any: its id goes along
            headers[REQUEST_ID_HEADER] = rid
        if self.member is not None:
            return await self.member.call(node_id, method, path, json=json, headers=headers, **kw)
        kw.pop("once", None)
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
    async def create_queue(self, queue: str, settings: QueueSettings | None = None) -> str:
        settings = settings or QueueSettings()
        if queue in self.state.meta:
            raise QueueExists(f"queue {queue!r} already exists")
        if len(self.state.meta) >= self.config.limits.max_queues:
            raise QueueLimitReached(
                f"{self.id} keeps the metadata of {len(self.state.meta)} queues, its limit"
            )
        dlq = settings.dead_letter_queue
        if dlq is not None:
            # The dead-letter queue must exist already: 404, as for any queue a call names
            # that does not exist. The queue itself does not exist yet, so it cannot be one.
            if dlq == queue:
                raise QueueNotFound(
                    f"dead_letter_queue: queue {dlq!r} does not exist yet (a queue cannot be "
                    "its own dead-letter queue)"
                )
            try:
                await self.metadata_via_owner(dlq)
            except QueueNotFound:
                raise QueueNotFound(
                    f"dead_letter_queue: queue {dlq!r} does not exist; create it first"
                ) from None
            if queue in self.state.meta:  # created meanwhile
                raise QueueExists(f"queue {queue!r} already exists")
        op = CreateQueue(queue, uuid.uuid4().hex, time.time(), settings)
        await self.execute(Meta((op,), self.config.limits.max_queues))
        log.info("queue %s created", queue, extra={"event": "queue_created", "queue": queue})
        return op.incarnation

    async def drop_queue(self, queue: str) -> None:
        if queue not in self.state.meta:
            raise QueueNotFound(f"queue {queue!r} does not exist")
        op = DropQueue(queue, self.state.meta[queue].incarnation, time.time())
        await self.execute(Meta((op,)))
        log.info("queue %s deleted", queue, extra={"event": "queue_deleted", "queue": queue})
        self._signal_ready(queue)  # waiters wake and find the queue gone
        self._ready_version.pop(queue, None)
        self._ready_nodes.pop(queue, None)
        # Every node may hold messages or a stale registration: tell them all. A node that
        # is down purges on restart, when its repair sweep learns the queue is gone.
        await asyncio.gather(
            *(self._purge_on(n, queue) for n in self.group_ids), return_exceptions=True
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
            "settings": meta.settings.to_wire(),
            "nodes": [{"node": n, "first_uuid": f} for n, f in meta.nodes.items()],
        }

    async def register(self, queue: str, node_id: str, first_uuid: str) -> dict[str, Any]:
        meta = self.state.meta.get(queue)
        if meta is None:
            raise QueueNotFound(f"queue {queue!r} does not exist")
        if node_id not in meta.nodes:
            await self.execute(Meta((Register(queue, node_id, first_uuid),)))
        return {"incarnation": meta.incarnation, "settings": meta.settings.to_wire()}

    async def unregister(self, queue: str, node_id: str) -> None:
        await self.unregister_many([queue], node_id)

    async def unregister_many(self, queues: Sequence[str], node_id: str) -> None:
        """Takes `node_id` off the metadata lists of `queues` (those it is on), in one
        commit."""
        ops: list[Unregister] = []
        for queue in queues:
            meta = self.state.meta.get(queue)
            if meta is not None and node_id in meta.nodes:
                ops.append(Unregister(queue, node_id))
        if ops:
            await self.execute(Meta(ops))

    def nodes_ready(self, queues: Sequence[str], node_id: str) -> None:
        """A node reports it has visible messages of `queues` (a batch of notices)."""
        for queue in queues:
            self.node_ready(queue, node_id)

    async def sweep(
        self,
        node_id: str,
        queues: dict[str, str],
        known: Mapping[str, str] | None = None,
        *,
        repair: bool = True,
    ) -> dict[str, Any]:
        """Registers `node_id` for each queue it holds messages of (`repair`: the repair
        sweep's call, counted and logged as repairs; else a batch of registrations).

        Returns the queues that do not exist (`missing`), those of them this owner
        recorded a delete of (`deleted`: a tombstone; the others it does not know, for
        instance after it lost its disk), and the settings of the rest, except those whose
        incarnation the caller already knows (`known`: queue -> incarnation): a queue's
        settings never change within an incarnation.
        """
        missing: list[str] = []
        deleted: list[str] = []
        settings: dict[str, Any] = {}
        incarnations: dict[str, str] = {}
        ops: list[Register] = []
        known = known or {}
        for queue, first_uuid in queues.items():
            meta = self.state.meta.get(queue)
            if meta is None:
                missing.append(queue)
                if queue in self.state.tombstones:
                    deleted.append(queue)
                continue
            if known.get(queue) != meta.incarnation:
                settings[queue] = meta.settings.to_wire()
                incarnations[queue] = meta.incarnation
            if node_id not in meta.nodes:
                ops.append(Register(queue, node_id, first_uuid))
        if ops:
            await self.execute(Meta(ops))
            if repair:
                log.info("repair sweep re-registered %s for %d queue(s)", node_id, len(ops))
                self.counters["repair_registrations"] += len(ops)
        return {
            "missing": missing,
            "deleted": deleted,
            "settings": settings,
            "incarnations": incarnations,
        }

    # ---- topics (on the metadata owner of the topic's name) ---------------------------
    async def create_topic(self, topic: str) -> None:
        if topic in self.state.topics:
            raise TopicExists(f"topic {topic!r} already exists")
        await self.execute(Meta((CreateTopic(topic, time.time()),), self.config.limits.max_queues))

    async def drop_topic(self, topic: str) -> None:
        """Deletes a topic and its subscriptions; the subscribed queues and the copies
        they hold stay (they are ordinary queues)."""
        if topic not in self.state.topics:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        await self.execute(Meta((DropTopic(topic),)))

    def topic(self, topic: str) -> dict[str, Any]:
        meta = self.state.topics.get(topic)
        if meta is None:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        return {
            "topic": topic,
            "created_at": meta.created_at,
            "subscriptions": list(meta.subscriptions),
        }

    def owned_topics(self) -> list[str]:
        return list(self.state.topics)

    async def subscribe(
        self, topic: str, queue: str, settings: QueueSettings | None
    ) -> tuple[bool, bool]:
        """Subscribes `queue` to `topic`, creating the queue (with `settings`) if it does
        not exist. Returns (whether the subscription is new, whether the queue is). Once
        this returns, every publish reads the subscription: a publish reads the topic
        through a commit of its own (`publish_targets`)."""
        if topic not in self.state.topics:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        if settings is not None and settings.fifo:
            raise BadRequest("settings: a topic's queue is not a FIFO queue (fifo: false)")
        created = False
        try:
            meta = await self.metadata_via_owner(queue)
            if meta["settings"].get("fifo"):
                raise FifoConflict(
                    f"queue {queue!r} is a FIFO queue: a topic's copies have no group, so it "
                    "cannot subscribe"
                )
        except QueueNotFound:
            wire = (settings or QueueSettings()).to_wire()

            async def local() -> None:
                await self.create_queue(queue, settings)

            try:
                await self._on_owner(
                    queue, local, "PUT", f"/v1/queues/{queue}", wire, lambda _: None
                )
                created = True
            except QueueExists:  # created meanwhile: subscribe it as it is
                pass
        [added] = await self.execute(Meta((Subscribe(topic, queue),)))
        return bool(added), created

    async def unsubscribe(self, topic: str, queue: str) -> tuple[int, list[str]]:
        """Ends the subscription of `queue` to `topic` and purges the queue's messages
        (its pending copies) on every node; the queue stays. Returns how many messages
        were purged and the nodes that did not answer (they keep theirs)."""
        await self.execute(Meta((Unsubscribe(topic, queue),)))
        ids = self.group_ids

        async def purge_on(node_id: str) -> int:
            if node_id == self.id:
                return await self.purge_local(queue)
            reply = await self.peer_call(node_id, "POST", f"/v1/internal/queues/{queue}/purge")
            return int(reply.json().get("purged", 0))

        results = await asyncio.gather(*(purge_on(n) for n in ids), return_exceptions=True)
        unavailable = [n for n, r in zip(ids, results, strict=True) if isinstance(r, Exception)]
        return sum(r for r in results if isinstance(r, int)), unavailable

    async def publish_targets(self, topic: str) -> list[str]:
        """The subscriptions of `topic` as of now. With replication the leader reads them
        after a commit of its own in its term (an empty Meta), so it has applied every
        subscribe that returned before, even just after it took over."""
        if self.member is not None:
            await self.execute(Meta(()))
        meta = self.state.topics.get(topic)
        if meta is None:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        return list(meta.subscriptions)

    async def list_topics(self) -> list[str]:
        async def owned_by(node_id: str) -> list[str]:
            if node_id == self.id:
                return self.owned_topics()
            reply = await self.peer_call(node_id, "GET", "/v1/internal/owned-topics")
            return list(reply.json()["topics"])

        results = await asyncio.gather(*(owned_by(n) for n in self.group_ids))
        return sorted(t for ts in results for t in ts)

    # ---- long polling (metadata owner side) ------------------------------------------
    def node_ready(self, queue: str, node_id: str) -> None:
        """A node reports it has visible messages of `queue`: wake the waiters."""
        if queue in self.state.meta:
            self._ready_nodes.setdefault(queue, {})[node_id] = self._ready_version[queue] + 1
            self._signal_ready(queue)

    def _signal_ready(self, queue: str) -> None:
        self._ready_version[queue] += 1
        ev = self._ready_events.pop(queue, None)
        if ev is not None:
            ev.set()

    async def _wait_ready(self, queue: str, since: int, timeout_s: float) -> None:
        """Returns once `queue`'s ready version moves past `since`, or after `timeout_s`."""
        if self._ready_version.get(queue, 0) != since:
            return
        ev = self._ready_events.get(queue)
        if ev is None:
            ev = self._ready_events[queue] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout_s)

    def owned_queues(self) -> list[str]:
        return list(self.state.meta)

    # ---- storage node side --------------------------------------------------------
    async def _ensure_registered(self, queue: str, first_uuid: str) -> None:
        async with self._locks(queue):
            if queue in self._registered:
                return
            owner = self.meta_owner(queue)
            if owner == self.id:
                reply = await self.register(queue, self.id, first_uuid)
            else:
                reply = await self._register_at(owner, queue, first_uuid)
            self.counters["registrations"] += 1
            self.settings[queue] = QueueSettings(**reply["settings"])
            self._registered[queue] = str(reply["incarnation"])

    async def _register_at(self, owner: str, queue: str, first_uuid: str) -> dict[str, Any]:
        """Registers this node for `queue` with its metadata owner, another node, in the
        next batch of registrations to that owner (OwnerBatches). Returns the queue's
        incarnation and settings, as `register` does."""
        result: dict[str, Any] = await self._registrations.add(owner, queue, first_uuid)
        return result

    async def _send_registrations(self, owner: str, queues: dict[str, Any]) -> dict[str, Any]:
        self.counters["registration_calls"] += 1
        reply = await self.peer_call(
            owner, "POST", "/v1/internal/register", json={"node": self.id, "queues": queues}
        )
        result = reply.json()
        answers: dict[str, Any] = {
            q: {"incarnation": result["incarnations"][q], "settings": s}
            for q, s in result["settings"].items()
        }
        for q in result["missing"]:
            answers[q] = QueueNotFound(f"queue {q!r} does not exist")
        return answers

    async def _send_unregistrations(self, owner: str, queues: dict[str, Any]) -> dict[str, Any]:
        self.counters["unregistration_calls"] += 1
        await self.peer_call(
            owner, "POST", "/v1/internal/unregister", json={"node": self.id, "queues": list(queues)}
        )
        return {}

    async def _send_ready(self, owner: str, queues: dict[str, Any]) -> dict[str, Any]:
        self.counters["ready_calls"] += 1
        self.counters["ready_notices"] += len(queues)
        try:
            await self.peer_call(
                owner, "POST", "/v1/internal/ready", json={"node": self.id, "queues": list(queues)}
            )
        except ZdmqError as e:  # a lost notice costs a waiter only its wait
            log.debug("ready notice for %d queue(s) to %s failed: %s", len(queues), owner, e)
        return {}

    async def queue_settings(self, queue: str) -> QueueSettings:
        """The settings of `queue`, from the cache or its metadata owner."""
        cached = self.settings.get(queue)
        if cached is not None:
            return cached
        meta = await self.metadata_via_owner(queue)
        settings = self.settings[queue] = QueueSettings(**meta["settings"])
        return settings

    async def push_local(self, queue: str, items: Sequence[PushItem]) -> list[bool]:
        """Stores messages this node owns (their ids hash here); replies after commit.

        Returns, per item, whether it was a duplicate that stored nothing.
        """
        state = self.state
        self._check_storage()
        while queue not in self._registered:
            await self._ensure_registered(queue, items[0].id)
        # No await between the registration check and the push: an unregister can only
        # run on an empty UUID queue under the lock, so it cannot interleave here.
        settings = self.settings[queue]
        self._check_groups(queue, settings, items)
        lq = state.queues.get(queue)
        was_empty = lq is None or not lq.deliverable()
        taker, reserved = self._taker(queue)
        now = time.time()
        if taker is None:
            duplicate: list[bool] = await self.execute(
                Push(queue, items, now, settings.max_message_bytes, settings.dedup_window_s)
            )
        else:
            got: list[Delivery] = []
            try:
                vis = taker.lease_s if taker.lease_s is not None else settings.visibility_timeout_s
                duplicate, leased = await self.execute(
                    PushTake(
                        queue,
                        items,
                        now,
                        settings.max_message_bytes,
                        settings.dedup_window_s,
                        reserved,
                        settings.retention_s,
                        vis,
                        self._new_token()[:12],
                        taker.min_priority,
                    )
                )
                got = await self._leased(queue, leased)
            finally:
                taker.hand(got, reserved)
        stored = duplicate.count(False)
        self.counters["pushed"] += stored
        self.counters["duplicates"] += len(items) - stored
        if self.metrics is not None:
            self.metrics.count("pushed", queue, stored)
        lq = state.queues.get(queue)
        if was_empty and lq is not None and lq.deliverable():
            self._notify_ready(queue)
        elif stored:
            self._local_ready(queue)
        return duplicate

    def _taker(self, queue: str) -> tuple[Taker | None, int]:
        """A stream waiting on `queue` here with credit, and the credit it set aside
        (in turns, when several wait)."""
        takers = self.takers.get(queue) or []
        for i, taker in enumerate(takers):
            reserved = taker.reserve(MAX_RECEIVE)
            if reserved > 0:
                takers.append(takers.pop(i))  # the next push tries the others first
                return taker, reserved
        return None, 0

    def _check_groups(self, queue: str, settings: QueueSettings, items: Sequence[PushItem]) -> None:
        """A FIFO queue's messages each have a group that this node owns, and no
        priority, deadline or delay; other queues' messages have no group."""
        if not settings.fifo:
            if any([item.group is not None for item in items]):
                raise FifoConflict(
                    f"queue {queue!r} is not a FIFO queue: its messages take no group"
                )
            return
        owner = self.placement.owner
        for item in items:
            if item.group is None:
                raise FifoConflict(f"queue {queue!r} is a FIFO queue: every message needs a group")
            if item.priority or item.deadline or item.delay_s:
                raise FifoConflict(
                    f"queue {queue!r} is a FIFO queue: its messages take no priority, "
                    "deadline, ttl_s or delay_s"
                )
            if owner(group_key(queue, item.group)) != self.id:
                raise Misrouted(f"group {item.group!r} of {queue!r} belongs to another node")

    def _notify_ready(self, queue: str) -> None:
        """Tells the metadata owner this node has visible messages (long polls wake).

        Fire and forget, in the next batch of notices to that owner (OwnerBatches): a
        notice that fails costs a waiter only its wait, never a message.
        """
        self._local_ready(queue)
        owner = self.meta_owner(queue)
        if owner == self.id:
            self.node_ready(queue, self.id)
        else:
            self._ready_notices.add(owner, queue)

    def _local_ready(self, queue: str) -> None:
        """This node's UUID queue of `queue` may have gained deliverable messages: the
        streams waiting on it look again."""
        self.local_version[queue] += 1
        ev = self._local_events.pop(queue, None)
        if ev is not None:
            ev.set()

    def local_event(self, queue: str) -> asyncio.Event:
        """Set the next time this node's UUID queue of `queue` may have gained messages
        to deliver (one event per queue, shared by its waiters)."""
        ev = self._local_events.get(queue)
        if ev is None:
            ev = self._local_events[queue] = asyncio.Event()
        return ev

    def _check_storage(self) -> None:
        # Once a commit failed, memory may be ahead of disk: change nothing more.
        if self.storage.failed is not None:
            raise StorageFailed(f"{self.id}: storage failed: {self.storage.failed}")

    async def take_local(
        self,
        queue: str,
        limit: int,
        *,
        lease_s: float | None = None,
        receive: bool = False,
        listed: bool = False,
        min_priority: int = 0,
    ) -> list[Delivery]:
        """Pops (or, with `receive`, leases) up to `limit` messages of this node's UUID
        queue; [] when it has no visible message.

        A receive leases for `lease_s`, or the queue's visibility timeout when None.
        `listed`: the caller came here because the metadata list names this node, so an
        empty node must leave the list even if it holds no UUID queue for `queue` (a
        crash between registering and storing, or a lost unregister, leaves such entries).
        """
        self._check_storage()
        if queue in self._orphaned:  # kept for when it is created again, not served
            raise QueueNotFound(f"queue {queue!r} does not exist")
        state = self.state
        lq = state.queues.get(queue)
        now = time.time()
        # (A FIFO queue whose groups all have a message out has nothing to take: no
        # command for nothing.)
        if lq is not None and (lq.deliverable() or (lq.delayed and state.delays_due(now))):
            settings = self.settings.get(queue)
            if settings is None:
                try:
                    settings = await self.queue_settings(queue)
                except NodeUnavailable:
                    if receive:
                        raise
            retention = settings.retention_s if settings is not None else None
            now = time.time()
            out: list[Delivery]
            if receive:
                assert settings is not None
                vis = lease_s if lease_s is not None else settings.visibility_timeout_s
                cmd = Take(queue, limit, now, retention, vis, self._new_token()[:12], min_priority)
                out = await self._leased(queue, await self.execute(cmd))
                if out:
                    return out
            else:
                popped: list[Taken] = await self.execute(
                    Take(queue, limit, now, retention, None, "", min_priority)
                )
                out = [
                    Delivery(
                        t.id, t.body, t.content_type, None, 0, t.attributes, t.priority, t.group
                    )
                    for t in popped
                ]
                self.counters["popped"] += len(out)
                if self.metrics is not None:
                    self.metrics.count("popped", queue, len(out))
                if any([t.tie is not None for t in popped]):
                    out = await self._claim_ties(queue, popped, out, False)
                if out:
                    return out
            lq = state.queues.get(queue)
        # Registered or not: after a restart this node knows none of its registrations
        # (runtime knowledge) while the owner's durable list may still name it.
        emptied = lq is not None and not lq.holds()
        if emptied and self.config.unregister_grace_s > 0:
            self._drop_later(queue)
        elif emptied or (lq is None and listed):
            await self._drop_empty(queue)
        return []

    async def _leased(self, queue: str, leased: list[Taken]) -> list[Delivery]:
        """The deliveries of messages a command leased (tied ones claimed first)."""
        # Every leased one has a token.
        out = [
            Delivery(
                t.id,
                t.body,
                t.content_type,
                make_receipt(t.id, t.token or ""),
                t.receive_count,
                t.attributes,
                t.priority,
                t.group,
            )
            for t in leased
        ]
        self.counters["received"] += len(out)
        if self.metrics is not None:
            self.metrics.count("received", queue, len(out))
        if any([t.tie is not None for t in leased]):
            out = await self._claim_ties(queue, leased, out, True)
        return out

    # ---- tied messages -------------------------------------------------------------
    async def _claim_ties(
        self, queue: str, taken: list[Taken], out: list[Delivery], receive: bool
    ) -> list[Delivery]:
        """Claims each tied copy of a take before it is handed out (docs/design.md §18):
        a copy that wins (or whose tie is unknown: forgotten) goes out and the tie's other
        copies are cancelled; one that loses is dropped (a leased one acked away); one
        whose claim's outcome is unknown is not handed out: a leased one is nacked (it
        comes back and claims again: a claim of the winning copy wins again), a popped
        one is lost with the pop (at-most-once)."""
        tied = [i for i, t in enumerate(taken) if t.tie is not None]
        verdicts = await asyncio.gather(
            *(self.claim(taken[i].tie or "", taken[i].id) for i in tied), return_exceptions=True
        )
        drop: set[int] = set()
        lost: list[tuple[str, str]] = []
        back: list[tuple[str, str]] = []
        for i, verdict in zip(tied, verdicts, strict=True):
            t = taken[i]
            if isinstance(verdict, BaseException):
                if not isinstance(verdict, ZdmqError):
                    raise verdict
                log.warning("claim of %s (tie %s) failed: %s", t.id, t.tie, verdict)
                drop.add(i)
                back.append((t.id, t.token or ""))
                self.counters["claims_unknown"] += 1
            elif verdict[0] == "lost":
                drop.add(i)
                lost.append((t.id, t.token or ""))
                self.counters["claims_lost"] += 1
            else:
                self.counters["claims_won"] += 1
                others = [(q, mid) for q, mid in verdict[1] if mid != t.id]
                if others:
                    self._spawn(self._cancel_copies(others))
        if receive and lost:
            await self.execute(Settle(queue, "ack", lost, time.time()))
        if receive and back:
            await self.execute(Settle(queue, "nack", back, time.time(), 1.0))
        return [d for i, d in enumerate(out) if i not in drop]

    async def claim(self, token: str, mid: str) -> tuple[str, list[tuple[str, str]]]:
        """Claims copy `mid` of tie `token` on the group that owns the token: its verdict
        ("won", "lost" or "unknown") and the tie's copies (queue, id)."""
        owner = self.placement.owner(token)
        if owner == self.id:
            return await self.claim_local(token, mid)
        reply = await self.peer_call(
            owner, "POST", "/v1/internal/claim", json={"token": token, "id": mid}
        )
        j = reply.json()
        return str(j["verdict"]), [(str(q), str(i)) for q, i in j["copies"]]

    async def claim_local(self, token: str, mid: str) -> tuple[str, list[tuple[str, str]]]:
        self._check_storage()
        verdict: str = await self.execute(Claim(token, mid))
        tie = self.state.ties.get(token)
        return verdict, list(tie.copies) if tie is not None else []

    async def tie_local(self, token: str, copies: Sequence[tuple[str, str]]) -> bool:
        """Records tie `token` (this group owns it); False if it was recorded already."""
        self._check_storage()
        made: bool = await self.execute(Tie(token, list(copies), time.time()))
        return made

    async def untie_local(self, token: str) -> tuple[list[list[str]], str | None] | None:
        self._check_storage()
        result: tuple[list[list[str]], str | None] | None = await self.execute(Untie(token))
        return result

    async def cancel_anywhere(self, queue: str, mid: str) -> str:
        """Cancels message `mid` of `queue` on the group that owns its id: the verdict of
        CancelMessage."""
        owner = self.placement.owner(mid)
        if owner == self.id:
            return await self.cancel_local(queue, mid)
        reply = await self.peer_call(owner, "DELETE", f"/v1/queues/{queue}/messages/{mid}")
        return "cancelled" if reply.status == 204 else "unknown"

    async def _cancel_copies(self, copies: Sequence[tuple[str, str]]) -> list[str]:
        """Cancels tied copies that lost (they would lose their claims anyway: this only
        spares them a delivery attempt); each one's verdict, or its error's code."""

        async def one(queue: str, mid: str) -> str:
            try:
                return await self.cancel_anywhere(queue, mid)
            except ZdmqError as e:
                return e.code

        return list(await asyncio.gather(*(one(q, mid) for q, mid in copies)))

    def _drop_later(self, queue: str) -> None:
        """Unregisters the emptied UUID queue of `queue` once `unregister_grace_s` has
        passed, if it is still empty then: a queue that empties and refills keeps its
        registration instead of paying an unregister and a register (a call and a commit
        on the metadata owner each) every time it runs dry. Meanwhile the list names this
        empty node, which costs a pop guided by the list one more call."""
        if queue not in self._drop_timers:
            loop = asyncio.get_running_loop()
            grace = self.config.unregister_grace_s
            self._drop_timers[queue] = loop.call_later(grace, self._drop_due, queue)

    def _drop_due(self, queue: str) -> None:
        del self._drop_timers[queue]
        lq = self.state.queues.get(queue)
        if lq is not None and not lq.holds() and self.leading:
            self._spawn(self._drop_empty(queue))

    async def settle_local(
        self,
        queue: str,
        action: str,
        leases: Sequence[tuple[str, str, str]],
        *,
        delay_s: float = 0.0,
        visibility_s: float = 0.0,
    ) -> tuple[int, dict[str, str]]:
        """Acks, nacks or extends leases (receipt, id, token) of messages stored here.

        Returns how many took effect and, per receipt that did not, why. The first of
        ack / nack / expiry to reach a lease wins; the rest report `lease_expired`.
        """
        self._check_storage()
        state = self.state
        dlq: str | None = None
        max_receives: int | None = None
        if action == "nack":
            settings = await self.queue_settings(queue)
            max_receives = settings.max_receives
            dlq = await self._dead_letter_target(queue, settings, [mid for _, mid, _ in leases])
        lq = state.queues.get(queue)
        was_empty = lq is None or not lq.deliverable()
        cmd = Settle(
            queue,
            action,
            [(mid, token) for _, mid, token in leases],
            time.time(),
            delay_s,
            visibility_s,
            max_receives,
            dlq,
        )
        results: list[Op | None] = await self.execute(cmd)
        failed = {
            lease[0]: "lease_expired"
            for lease, op in zip(leases, results, strict=True)
            if op is None
        }
        ops = [op for op in results if op is not None]
        self.counters[action + "ed"] += len(ops)
        if self.metrics is not None and action != "extend":
            self.metrics.count(action + "ed", queue, len(ops))
        self._after_requeue(queue, was_empty, ops)
        return len(ops), failed

    def _after_requeue(self, queue: str, was_empty: bool, ops: Sequence[Op]) -> None:
        dlqs = {op.dlq for op in ops if isinstance(op, DeadLetter)}
        moved = sum(1 for op in ops if isinstance(op, DeadLetter))
        self.counters["dead_lettered"] += moved
        if moved and self.metrics is not None:
            self.metrics.count("dead_lettered", queue, moved)
        lq = self.state.queues.get(queue)
        if was_empty and lq is not None and lq.deliverable():
            self._notify_ready(queue)
        for dlq in dlqs:
            self._notify_ready(dlq)

    async def _dead_letter_target(
        self, queue: str, settings: QueueSettings, mids: Sequence[str]
    ) -> str | None:
        """The dead-letter queue some of `mids` may move to as their lease ends, with
        this node registered with it first; None when none of them has reached
        `max_receives`, or when the DLQ cannot take messages (deleted, or its metadata
        owner is down): they are then requeued in `queue` instead, never dropped.
        """
        dlq, limit = settings.dead_letter_queue, settings.max_receives
        hot = self.state.hot
        if dlq is None or limit is None:
            return None
        if not any((m := hot.get(mid)) is not None and m.receive_count >= limit for mid in mids):
            return None
        try:
            while dlq not in self._registered:
                await self._ensure_registered(dlq, mids[0])
        except ZdmqError as e:
            log.warning("dead-letter queue %s of %s is unavailable: %s", dlq, queue, e)
            self.counters["dead_letter_failed"] += 1
            return None
        return dlq

    # ---- the lease monitor ---------------------------------------------------------
    async def monitor_once(self, now: float, housekeeping: bool) -> None:
        """Requeues (or dead-letters) expired leases and wakes delayed messages; with
        `housekeeping`, also drops messages past retention and forgets old dedup records."""
        state = self.state
        if self.storage.failed is not None:
            return
        if state.delays_due(now):
            for queue in await self.execute(Wake(now)):
                self._notify_ready(queue)
        by_queue: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)
        for queue, mid, token in state.due_leases(now):
            by_queue[queue].append((mid, token))
        for queue, due in by_queue.items():
            if self._monitor_retry_at.get(queue, 0.0) > now:
                for mid, _ in due:
                    state.recheck(mid)
                continue
            try:
                settings = await self.queue_settings(queue)
                dlq = await self._dead_letter_target(queue, settings, [mid for mid, _ in due])
            except ZdmqError as e:
                log.warning("lease monitor: %s: %s; retrying in %gs", queue, e, MONITOR_RETRY_S)
                self._monitor_retry_at[queue] = now + MONITOR_RETRY_S
                for mid, _ in due:
                    state.recheck(mid)
                continue
            self._monitor_retry_at.pop(queue, None)
            lq = state.queues.get(queue)
            was_empty = lq is None or not lq.deliverable()
            ops = await self.execute(Expire(queue, due, now, settings.max_receives, dlq))
            self.counters["expired"] += len(ops)
            if self.metrics is not None:
                self.metrics.count("expired", queue, len(ops))
            self._after_requeue(queue, was_empty, ops)
        if housekeeping:
            self._release_heap_when_idle()
            settings_of = self.settings.get
            retention = [
                (queue, known.retention_s)
                for queue, lq in state.queues.items()
                if now >= lq.retention_due and (known := settings_of(queue)) is not None
            ]
            if retention or state.dedup_due(now) or state.deadlines_due(now):
                dropped = await self.execute(Housekeep(now, retention))
                self.counters["retention_dropped"] += dropped

    def _release_heap_when_idle(self) -> None:
        """Gives freed memory back to the kernel once no message has moved for a
        housekeeping round since some did (see zdmq/server/heap.py)."""
        c = self.counters
        mark = c["pushed"] + c["popped"] + c["received"]
        last, released = self._heap_marks
        if mark == last and mark != released:
            self.heap.release()
            c["heap_releases"] += 1
            released = mark
        self._heap_marks = (mark, released)

    async def monitor_loop(self) -> None:
        last_housekeeping = 0.0
        while True:
            now = time.time()
            housekeeping = now - last_housekeeping >= HOUSEKEEPING_S
            if housekeeping:
                last_housekeeping = now
            try:
                if self.leading:  # a follower's state changes only by its group's log
                    with _unless_deposed():  # handing over, or deposed mid-round
                        await self.monitor_once(now, housekeeping)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep monitoring whatever one round hit
                log.exception("lease monitor round failed")
            due = self.state.next_timer()
            sleep = MONITOR_TICK_S if due is None else min(MONITOR_TICK_S, due - time.time())
            await asyncio.sleep(max(sleep, 0.005))

    async def _drop_empty(self, queue: str) -> None:
        """ZDMQ's empty step: drop the UUID queue, reset firstUUID, leave the metadata list.
        (A replica group's node that stopped leading meanwhile leaves it to the leader.)"""
        async with self._locks(queue):
            with _unless_deposed():
                lq = self.state.queues.get(queue)
                if lq is not None:
                    if lq.holds():
                        return  # a message arrived, or some are leased or delayed
                    await self.execute(DropEmpty(queue))
                self._registered.pop(queue, None)
                self.counters["unregistrations"] += 1
                owner = self.meta_owner(queue)
                try:
                    if owner == self.id:
                        await self.unregister(queue, self.id)
                    else:  # in the next batch of unregistrations to that owner
                        await self._unregistrations.add(owner, queue)
                except ZdmqError as e:
                    # Harmless: a listed empty node costs a later pop one more call.
                    log.warning("unregister %s from %s failed: %s", self.id, queue, e)

    async def purge_local(self, queue: str) -> int:
        timer = self._drop_timers.pop(queue, None)
        if timer is not None:
            timer.cancel()
        if self.metrics is not None:
            self.metrics.forget_queue(queue)
        async with self._locks(queue):
            self.settings.pop(queue, None)
            self._registered.pop(queue, None)
            n: int = await self.execute(PurgeQueue(queue))
            return n

    async def cancel_local(self, queue: str, mid: str) -> str:
        """Cancels message `mid` (this node owns its id) unless it is leased: the
        verdict of CancelMessage."""
        self._check_storage()
        verdict: str = await self.execute(CancelMessage(queue, mid))
        if verdict == "cancelled":
            self.counters["cancelled"] += 1
        return verdict

    def depth(self, queue: str) -> dict[str, int]:
        counts = self.state.counts(queue)
        counts["depth"] = self.state.depth(queue)
        return counts

    # ---- cluster-wide operations any node serves ------------------------------------
    async def routed_take(
        self,
        queue: str,
        limit: int,
        *,
        receive: bool = False,
        lease_s: float | None = None,
        wait_s: float = 0.0,
        min_priority: int = 0,
    ) -> list[Delivery]:
        """A pop or receive on behalf of a caller that does not route itself (curl,
        Locust), or a client's long poll: here, then the nodes the metadata list names.

        With `wait_s`, waiting happens on the queue's metadata owner, which hears from
        every node that gets visible messages: a non-owner forwards the wait there.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        owner = self.meta_owner(queue)
        kind = "receive" if receive else "pop"
        params = {"max": str(limit)}
        if lease_s is not None:
            params["visibility_s"] = repr(lease_s)
        if min_priority:
            params["min_priority"] = str(min_priority)
        while True:
            version = self._ready_version.get(queue, 0)
            got = await self.take_local(
                queue, limit, lease_s=lease_s, receive=receive, min_priority=min_priority
            )
            if got:
                return got
            meta = await self.metadata_via_owner(queue)
            nodes = [e["node"] for e in meta["nodes"] if e["node"] != self.id]
            random.shuffle(nodes)
            # Nodes that reported visible messages since the last look go first.
            fresh = self._ready_nodes.get(queue, {})
            nodes.sort(key=lambda n: -fresh.get(n, 0))
            down: list[str] = []
            for node_id in nodes:
                try:
                    reply = await self.peer_call(
                        node_id,
                        "POST",
                        f"/v1/queues/{queue}/{kind}",
                        params=params,
                        headers={ROUTE_HEADER: "local", LISTED_HEADER: "1", **_ACCEPT_FRAME},
                        once=not receive,
                    )
                except NodeUnavailable as e:
                    if not receive and not e.unsent:
                        # The pop may have taken messages before the call failed: say so
                        # rather than go on to another node (they would be lost unseen).
                        raise
                    log.warning("%s at %s failed: %s", kind, node_id, e)
                    down.append(node_id)
                    continue
                msgs = _deliveries_of(reply)
                if msgs:
                    return msgs
            if down:
                # Never call a queue empty while a node that may hold its messages is down.
                raise NodeUnavailable(f"queue {queue!r}: listed node(s) {down} did not answer")
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            if owner != self.id:
                params["wait_s"] = repr(remaining)
                reply = await self.peer_call(
                    owner,
                    "POST",
                    f"/v1/queues/{queue}/{kind}",
                    params=params,
                    headers={ROUTE_HEADER: "owner", **_ACCEPT_FRAME},
                    once=not receive,
                    timeout_s=remaining + self.config.request_timeout_s,
                )
                return _deliveries_of(reply)
            await self._wait_ready(queue, version, remaining)

    async def metadata_via_owner(self, queue: str) -> dict[str, Any]:
        async def local() -> dict[str, Any]:
            return self.metadata(queue)

        return await self._on_owner(
            queue, local, "GET", f"/v1/queues/{queue}/metadata", None, lambda j: j
        )

    async def stats(self, queue: str) -> dict[str, Any]:
        """Depth per node, asked of every node (a node down is reported, not guessed)."""
        meta = await self.metadata_via_owner(queue)

        async def depth_on(node_id: str) -> dict[str, int]:
            if node_id == self.id:
                return self.depth(queue)
            reply = await self.peer_call(node_id, "GET", f"/v1/internal/queues/{queue}/depth")
            return {k: int(v) for k, v in reply.json().items()}

        ids = self.group_ids
        results = await asyncio.gather(*(depth_on(n) for n in ids), return_exceptions=True)
        depth: dict[str, int] = {}
        totals: defaultdict[str, int] = defaultdict(int)
        unavailable: list[str] = []
        for node_id, r in zip(ids, results, strict=True):
            if isinstance(r, BaseException):
                unavailable.append(node_id)
                continue
            if r["depth"]:
                depth[node_id] = r["depth"]
            for key in ("in_flight", "delayed", "dead_lettered", "expired"):
                totals[key] += r.get(key, 0)
        return {
            "queue": queue,
            "messages": sum(depth.values()),
            "in_flight": totals["in_flight"],
            "delayed": totals["delayed"],
            "dead_lettered": totals["dead_lettered"],
            "expired": totals["expired"],
            "nodes": sorted(depth),
            "depth": depth,
            "registered": [e["node"] for e in meta["nodes"]],
            "settings": meta["settings"],
            "unavailable": unavailable,
        }

    async def list_queues(self) -> list[str]:
        async def owned_by(node_id: str) -> list[str]:
            if node_id == self.id:
                return self.owned_queues()
            reply = await self.peer_call(node_id, "GET", "/v1/internal/owned-queues")
            return list(reply.json()["queues"])

        results = await asyncio.gather(*(owned_by(n) for n in self.group_ids))
        return sorted(q for qs in results for q in qs)

    # ---- repair sweep -------------------------------------------------------------
    async def repair_once(self) -> int:
        """Re-registers every non-empty UUID queue with its metadata owner.

        Returns how many owners could not be reached (the sweep tries again later).
        """
        by_owner: defaultdict[str, dict[str, str]] = defaultdict(dict)
        # The incarnations whose settings this node holds: the owner leaves them out.
        known: defaultdict[str, dict[str, str]] = defaultdict(dict)
        swept, self._swept = self._swept, {}
        for queue in self.state.queues:
            first = self.state.some_id(queue)
            if first is not None:
                owner = self.meta_owner(queue)
                by_owner[owner][queue] = first
                incarnation = swept.get(queue)
                if incarnation is not None and queue in self.settings:
                    known[owner][queue] = self._swept[queue] = incarnation
        failures = 0
        for owner, queues in by_owner.items():
            try:
                if owner == self.id:
                    result = await self.sweep(self.id, queues, known[owner])
                else:
                    reply = await self.peer_call(
                        owner,
                        "POST",
                        "/v1/internal/sweep",
                        json={"node": self.id, "queues": queues, "incarnations": known[owner]},
                    )
                    result = reply.json()
            except ZdmqError as e:
                failures += 1
                log.debug("repair sweep: %s unreachable: %s", owner, e)
                continue
            incarnations = result.get("incarnations", {})
            for queue, settings in result.get("settings", {}).items():
                self.settings[queue] = QueueSettings(**settings)
                if queue in incarnations:
                    self._swept[queue] = str(incarnations[queue])
            deleted = set(result.get("deleted", ()))
            missing = set(result["missing"])
            for queue in queues:
                if queue in deleted:
                    # Deleted while this node was away: its messages go with it.
                    self._orphaned.discard(queue)
                    n = await self.purge_local(queue)
                    if n:
                        log.info("repair sweep purged %d message(s) of deleted queue %s", n, queue)
                elif queue in missing:
                    self._orphan(queue, owner)
                elif queue in self._orphaned:
                    self._orphaned.discard(queue)
                    log.info(
                        "queue %s exists again on %s: this node's %d message(s) of it rejoin it",
                        queue,
                        owner,
                        self.state.depth(queue),
                    )
        # A queue this node no longer holds messages of is no longer its orphan.
        held = self.state.queues
        self._orphaned = {q for q in self._orphaned if q in held and held[q].holds()}
        self.counters["orphaned_queues"] = len(self._orphaned)
        return failures

    def _orphan(self, queue: str, owner: str) -> None:
        """The metadata owner does not know `queue`, which this node holds messages of, and
        recorded no delete of it (it lost its disk, or the delete is older than its
        tombstones). The messages stay stored, never purged on a guess: they rejoin the
        queue when it is created again, and a delete of it then purges them. Meanwhile
        the UUID queue counts as unregistered, so pushes here register first and are
        refused with 404 while the queue does not exist."""
        self._registered.pop(queue, None)
        if queue not in self._orphaned:
            self._orphaned.add(queue)
            log.warning(
                "metadata owner %s does not know queue %s and recorded no delete of it: "
                "keeping this node's %d message(s) of it until it is created again",
                owner,
                queue,
                self.state.depth(queue),
            )

    async def repair_loop(self) -> None:
        while True:
            try:
                if self.leading:
                    await self.repair_once()
            except Exception:  # keep sweeping whatever one round hit
                log.exception("repair sweep failed")
            await asyncio.sleep(self.config.repair_interval_s)


def node_pool(
    config: ClusterConfig,
    secret: bytes,
    node_id: str,
    *,
    timeout_s: float | None = None,
    limit_per_host: int = 64,
) -> _http.HttpPool:
    """The pool a node calls other nodes with: signed as `node_id`, over the cluster's
    TLS if it has one, its idle connections dropped well before the other nodes close
    them; `timeout_s` defaults to the cluster's `request_timeout_s`."""
    return _http.HttpPool(
        timeout_s=config.request_timeout_s if timeout_s is None else timeout_s,
        limit_per_host=limit_per_host,
        idle_s=min(30.0, config.limits.idle_timeout_s / 2),
        sign=NodeSigner(secret, node_id),
        ssl_context=config.client_ssl(),
    )


@contextlib.contextmanager
def _unless_deposed() -> Iterator[None]:
    """Swallows what a group's node that lost its leadership meets (NotLeader, or the
    unknown outcome of a proposal it made while leading): the step is the new leader's."""
    try:
        yield
    except (NotLeader, NodeUnavailable) as e:
        log.debug("a background step stopped: %s", e)


def _tokens() -> Iterator[str]:
    """Lease tokens: 16 random hex digits each (64 bits from os.urandom), drawn 64 at a
    time, since one urandom call for a batch costs about what one costs for a token.
    The node takes them with the generator's `__next__`, the cheapest call there is."""
    while True:
        h = os.urandom(8 * 64).hex()
        yield from [h[i : i + 16] for i in range(0, len(h), 16)]


_ACCEPT_FRAME = {"Accept": BATCH_CONTENT_TYPE}


def _deliveries_of(reply: _http.Reply) -> list[Delivery]:
    """The messages of another node's pop or receive reply: a batch frame, or JSON."""
    if not reply.headers.get("content-type", "").startswith(BATCH_CONTENT_TYPE):
        return [_delivery_from_wire(m) for m in reply.json()["messages"]]
    b = decode_batch(reply.body)
    n, ids, bodies = b.count, b.ids, b.bodies
    if not n:
        return []
    if ids is None or bodies is None or None in ids:
        raise InternalError("a pop or receive reply frame from a node without ids or bodies")
    return list(
        map(
            Delivery._make,
            zip(
                ids,
                bodies,
                b.content_types or [None] * n,
                b.receipts or [None] * n,
                b.receive_counts or [0] * n,
                b.attributes or [None] * n,
                b.priorities or [0] * n,
                b.groups or [None] * n,
                strict=True,
            ),
        )
    )


def _delivery_from_wire(item: dict[str, Any]) -> Delivery:
    m = message_from_wire(item)
    receipt, count = item.get("receipt"), int(item.get("receive_count", 0))
    attrs = item.get("attributes")
    return Delivery(
        m.id,
        m.body,
        m.content_type,
        receipt,
        count,
        orjson.dumps(attrs).decode() if attrs else None,
        int(item.get("priority", 0)),
        m.group,
    )
