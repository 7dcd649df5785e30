"""A node's queue state as plain objects: UUID queues, bodies, leases, metadata lists.

Every durable change to a node's state is one *operation* (a small named tuple)
applied by `NodeState.apply`. The same operation is what storage writes in its group
commit and what replication will ship to a replica, so memory, disk and replicas change
by the same steps. Nothing here awaits, opens files, reads the clock or touches
sockets: every planner takes `now` (wall-clock seconds) from its caller, so tests drive
time by hand.

Per queue a node holds:
  * a UUID queue (`LocalQueue.ids`): the ids of its *ready* messages, in arrival order;
  * its leased messages (`LocalQueue.leased`): received, invisible until acked, released
    or expired; and its delayed ones (`LocalQueue.delayed`): nacked with a delay;
  * the bodies and per-message delivery state, keyed by id (`NodeState.messages`);
  * `first_uuid`: the id that created the UUID queue (ZDMQ's firstUUID).
As the metadata owner of a queue (the primary of partition(queue name)) it also holds
the queue's *metadata list* (`QueueMeta.nodes`) and settings.

A message's life:
    Push -> ready -> Lease -> leased -> Remove (ack)
                                     -> Requeue (nack, expiry) -> ready or delayed
                                     -> DeadLetter (past max_receives) -> ready in the DLQ
The first of ack / nack / expiry to reach a lease wins: each names the lease token, and
a planner acts only while the message still carries that token, so later ones are
no-ops the caller reports as `lease_expired`. Expiry is decided by the clock, not by
when the monitor runs: an ack at or after `lease_until` loses even if the monitor has
not requeued the message yet.

Clock transitions: a delayed message becomes ready when `now` passes its
`visible_at`. That needs no operation of its own: `visible_at` is stored, so a replay
reaches the same state by asking the same question at load time.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable
from typing import NamedTuple

from zdmq.models import QueueSettings

__all__ = [
    "CreateQueue",
    "DeadLetter",
    "DropQueue",
    "Extend",
    "ForgetDedup",
    "Lease",
    "LocalQueue",
    "NodeState",
    "Op",
    "Purge",
    "Push",
    "QueueMeta",
    "Register",
    "Remove",
    "Requeue",
    "StoredMessage",
    "Unregister",
]


# ---- operations ------------------------------------------------------------------------
class CreateQueue(NamedTuple):
    queue: str
    incarnation: str
    created_at: float
    settings: QueueSettings = QueueSettings()


class DropQueue(NamedTuple):
    """Removes the metadata list of a queue (on its metadata owner)."""

    queue: str


class Register(NamedTuple):
    queue: str
    node: str
    first_uuid: str


class Unregister(NamedTuple):
    queue: str
    node: str


class Push(NamedTuple):
    queue: str
    id: str
    seq: int
    body: bytes
    content_type: str | None
    enqueued_at: float = 0.0
    # > 0: a dedup record keeps the id until then, even after the message is gone.
    dedup_until: float = 0.0


class Remove(NamedTuple):
    """Deletes one stored message: a pop, an ack, or a message past its retention."""

    queue: str
    id: str
    seq: int


class Purge(NamedTuple):
    """Drops this node's UUID queue of `queue`, every message in it and its dedup records."""

    queue: str
    seqs: tuple[int, ...]


class Lease(NamedTuple):
    """A delivery: the message is invisible until `until` under lease `token`."""

    queue: str
    id: str
    seq: int
    token: str
    until: float
    receive_count: int


class Extend(NamedTuple):
    queue: str
    id: str
    seq: int
    until: float


class Requeue(NamedTuple):
    """Ends a lease (nack, release or expiry); the message is visible again at `visible_at`.

    The message takes a fresh sequence number, `new_seq`: it queues up again behind
    everything stored so far, and a reload rebuilds that order (see finish_restore).
    """

    queue: str
    id: str
    seq: int
    visible_at: float
    new_seq: int


class DeadLetter(NamedTuple):
    """Moves a message past `max_receives` to the dead-letter queue `dlq`, in one step.

    The id stays the same, so the message stays on this node: the move is one local
    transaction and the message is never in both queues, never in neither.
    """

    queue: str
    id: str
    seq: int
    dlq: str
    moved_at: float
    new_seq: int  # as for Requeue: it joins the DLQ's tail


class ForgetDedup(NamedTuple):
    """Drops the dedup records whose window ended before `before`."""

    before: float


Op = (
    CreateQueue
    | DropQueue
    | Register
    | Unregister
    | Push
    | Remove
    | Purge
    | Lease
    | Extend
    | Requeue
    | DeadLetter
    | ForgetDedup
)


# ---- state -----------------------------------------------------------------------------
class StoredMessage:
    __slots__ = (
        "body",
        "content_type",
        "enqueued_at",
        "lease",
        "lease_until",
        "origin",
        "queue",
        "receive_count",
        "seq",
        "visible_at",
    )

    def __init__(
        self,
        queue: str,
        seq: int,
        body: bytes,
        content_type: str | None,
        enqueued_at: float = 0.0,
    ) -> None:
        self.queue = queue
        self.seq = seq
        self.body = body
        self.content_type = content_type
        self.enqueued_at = enqueued_at
        self.receive_count = 0
        self.lease: str | None = None  # the current lease's token
        self.lease_until = 0.0
        self.visible_at = 0.0
        self.origin: str | None = None  # the queue it was dead-lettered from


class LocalQueue:
    """This node's UUID queue of one queue, with its leased and delayed messages."""

    __slots__ = ("delayed", "first_uuid", "ids", "incarnation", "leased", "registered")

    def __init__(self) -> None:
        self.ids: deque[str] = deque()  # ready, in arrival order
        self.leased: set[str] = set()
        self.delayed: set[str] = set()
        self.first_uuid: str | None = None
        # Whether the metadata owner is known to list this node for the queue, and
        # under which incarnation of the queue. Runtime knowledge, not persisted: after
        # a restart every non-empty queue registers again.
        self.registered = False
        self.incarnation: str | None = None

    def holds(self) -> int:
        """Every message of the queue on this node, visible or not."""
        return len(self.ids) + len(self.leased) + len(self.delayed)


class QueueMeta:
    """The metadata list of one queue, kept by its metadata owner."""

    __slots__ = ("created_at", "incarnation", "name", "nodes", "settings")

    def __init__(
        self, name: str, incarnation: str, created_at: float, settings: QueueSettings
    ) -> None:
        self.name = name
        self.incarnation = incarnation
        self.created_at = created_at
        self.settings = settings
        # node id -> firstUUID of that node's UUID queue, in registration order.
        self.nodes: dict[str, str] = {}


# A planner's verdict on one receipt.
ACKED = "ok"
LEASE_EXPIRED = "lease_expired"


class NodeState:
    def __init__(self) -> None:
        self.queues: dict[str, LocalQueue] = {}
        self.messages: dict[str, StoredMessage] = {}
        self.meta: dict[str, QueueMeta] = {}
        # Dedup records: id -> (queue, until), with a heap to forget them in time order.
        self.dedup: dict[str, tuple[str, float]] = {}
        self._dedup_heap: list[tuple[float, str]] = []
        # Lease expiries (until, id, token) and delay ends (visible_at, id); an entry
        # the message no longer matches is stale and skipped.
        self._lease_timers: list[tuple[float, str, str]] = []
        self._delay_timers: list[tuple[float, int, str]] = []
        # Ready messages being restored: (ready_at, seq, queue, id); see finish_restore.
        self._restoring: list[tuple[float, int, str, str]] = []
        # Messages held in dead-letter queues, by the queue they came from.
        self.dead_lettered: Counter[str] = Counter()
        self.next_seq = 1

    # ---- the one mutation entry point --------------------------------------------------
    def apply(self, op: Op) -> None:
        kind = type(op)
        if kind is Push:
            assert isinstance(op, Push)
            lq = self._local(op.queue)
            if not lq.holds():
                lq.first_uuid = op.id
            lq.ids.append(op.id)
            self.messages[op.id] = StoredMessage(
                op.queue, op.seq, op.body, op.content_type, op.enqueued_at
            )
            if op.dedup_until > 0:
                self.dedup[op.id] = (op.queue, op.dedup_until)
                heapq.heappush(self._dedup_heap, (op.dedup_until, op.id))
            if op.seq >= self.next_seq:
                self.next_seq = op.seq + 1
        elif kind is Lease:
            assert isinstance(op, Lease)
            m = self.messages[op.id]
            lq = self.queues[op.queue]
            self._unlink(lq, op.id, m)
            lq.leased.add(op.id)
            m.lease, m.lease_until, m.receive_count = op.token, op.until, op.receive_count
            heapq.heappush(self._lease_timers, (op.until, op.id, op.token))
        elif kind is Extend:
            assert isinstance(op, Extend)
            m = self.messages[op.id]
            assert m.lease is not None
            m.lease_until = op.until
            heapq.heappush(self._lease_timers, (op.until, op.id, m.lease))
        elif kind is Requeue:
            assert isinstance(op, Requeue)
            m = self.messages[op.id]
            lq = self.queues[op.queue]
            self._unlink(lq, op.id, m)
            m.lease, m.lease_until, m.visible_at = None, 0.0, op.visible_at
            self._resequence(m, op.new_seq)
            lq.delayed.add(op.id)
            heapq.heappush(self._delay_timers, (op.visible_at, op.new_seq, op.id))
        elif kind is DeadLetter:
            assert isinstance(op, DeadLetter)
            m = self.messages[op.id]
            self._unlink(self.queues[op.queue], op.id, m)
            self._forget_if_empty(op.queue)
            self._origin_gone(m)
            m.queue, m.origin = op.dlq, op.queue
            m.receive_count, m.lease, m.lease_until, m.visible_at = 0, None, 0.0, 0.0
            m.enqueued_at = op.moved_at
            self._resequence(m, op.new_seq)
            self.dead_lettered[op.queue] += 1
            dlq = self._local(op.dlq)
            if not dlq.holds():
                dlq.first_uuid = op.id
            dlq.ids.append(op.id)
        elif kind is Remove:
            assert isinstance(op, Remove)
            m = self.messages.pop(op.id)
            self._unlink(self.queues[op.queue], op.id, m)
            self._origin_gone(m)
        elif kind is Purge:
            assert isinstance(op, Purge)
            gone = self.queues.pop(op.queue, None)
            if gone is not None:
                for mid in (*gone.ids, *gone.leased, *gone.delayed):
                    held = self.messages.pop(mid, None)
                    if held is not None:
                        self._origin_gone(held)
            for mid in [k for k, (q, _) in self.dedup.items() if q == op.queue]:
                del self.dedup[mid]
        elif kind is ForgetDedup:
            assert isinstance(op, ForgetDedup)
            heap = self._dedup_heap
            while heap and heap[0][0] < op.before:
                until, mid = heapq.heappop(heap)
                rec = self.dedup.get(mid)
                if rec is not None and rec[1] == until:
                    del self.dedup[mid]
        elif kind is Register:
            assert isinstance(op, Register)
            self.meta[op.queue].nodes.setdefault(op.node, op.first_uuid)
        elif kind is Unregister:
            assert isinstance(op, Unregister)
            meta = self.meta.get(op.queue)
            if meta is not None:
                meta.nodes.pop(op.node, None)
        elif kind is CreateQueue:
            assert isinstance(op, CreateQueue)
            self.meta[op.queue] = QueueMeta(op.queue, op.incarnation, op.created_at, op.settings)
        elif kind is DropQueue:
            assert isinstance(op, DropQueue)
            self.meta.pop(op.queue, None)
        else:  # pragma: no cover - programmer error
            raise AssertionError(f"unknown op {op!r}")

    def _resequence(self, m: StoredMessage, new_seq: int) -> None:
        m.seq = new_seq
        if new_seq >= self.next_seq:
            self.next_seq = new_seq + 1

    def _local(self, queue: str) -> LocalQueue:
        lq = self.queues.get(queue)
        if lq is None:
            lq = self.queues[queue] = LocalQueue()
        return lq

    @staticmethod
    def _unlink(lq: LocalQueue, mid: str, m: StoredMessage) -> None:
        """Takes a message out of whichever of ready / leased / delayed holds it."""
        if m.lease is not None:
            lq.leased.discard(mid)
        elif mid in lq.delayed:
            lq.delayed.discard(mid)
        elif lq.ids and lq.ids[0] == mid:
            lq.ids.popleft()
        else:
            lq.ids.remove(mid)

    def _forget_if_empty(self, queue: str) -> None:
        lq = self.queues.get(queue)
        if lq is not None and not lq.holds():
            lq.first_uuid = None

    def _origin_gone(self, m: StoredMessage) -> None:
        if m.origin is not None:
            self.dead_lettered[m.origin] -= 1
            if self.dead_lettered[m.origin] <= 0:
                del self.dead_lettered[m.origin]

    # ---- restore (storage replays a row per message) ----------------------------------------
    def restore(
        self,
        push: Push,
        *,
        receive_count: int,
        lease: str | None,
        lease_until: float,
        visible_at: float,
        origin: str | None,
        now: float,
    ) -> None:
        """Rebuilds one stored message and its delivery state, as of `now`.

        Call `finish_restore` after the last one: it queues the ready messages up.
        """
        lq = self._local(push.queue)
        if lq.first_uuid is None:  # the oldest message it holds
            lq.first_uuid = push.id
        m = StoredMessage(push.queue, push.seq, push.body, push.content_type, push.enqueued_at)
        m.receive_count, m.origin = receive_count, origin
        self.messages[push.id] = m
        if origin is not None:
            self.dead_lettered[origin] += 1
        if lease is not None:
            m.lease, m.lease_until = lease, lease_until
            lq.leased.add(push.id)
            heapq.heappush(self._lease_timers, (lease_until, push.id, lease))
        elif visible_at > now:
            m.visible_at = visible_at
            lq.delayed.add(push.id)
            heapq.heappush(self._delay_timers, (visible_at, push.seq, push.id))
        else:
            # A message is ready from its push, or from the end of its last delay.
            ready_at = visible_at if visible_at > 0 else push.enqueued_at
            self._restoring.append((ready_at, push.seq, push.queue, push.id))
        if push.seq >= self.next_seq:
            self.next_seq = push.seq + 1

    def finish_restore(self) -> None:
        """Queues restored ready messages in the order they became ready.

        Live, a message joins the tail of its UUID queue when it is pushed, when its
        delay ends (`wake` takes them in (visible_at, seq) order, before a push at the
        same moment) or when it is moved to a dead-letter queue (its `enqueued_at` is the
        move). A requeue or a move gives the message a fresh seq, so among messages ready
        at the same moment seq is the order they joined in. Sorting by (that moment, seq)
        rebuilds the live order.
        """
        for _, _, queue, mid in sorted(self._restoring):
            self.queues[queue].ids.append(mid)
        self._restoring.clear()

    def restore_dedup(self, mid: str, queue: str, until: float) -> None:
        self.dedup[mid] = (queue, until)
        heapq.heappush(self._dedup_heap, (until, mid))

    # ---- planners: decide, apply, and return the ops to persist --------------------------
    def is_duplicate(self, mid: str, now: float) -> bool:
        """Whether a push of `mid` repeats one already stored or inside its dedup window."""
        if mid in self.messages:
            return True
        rec = self.dedup.get(mid)
        return rec is not None and rec[1] > now

    def push(
        self,
        queue: str,
        msg_id: str,
        body: bytes,
        content_type: str | None,
        *,
        now: float = 0.0,
        dedup_window_s: float = 0.0,
    ) -> Push:
        assert msg_id not in self.messages, "caller checks for a duplicate id"
        self.wake(now)  # what became ready before now queues ahead of this message
        dedup_until = now + dedup_window_s if dedup_window_s > 0 else 0.0
        op = Push(queue, msg_id, self.next_seq, body, content_type, now, dedup_until)
        self.apply(op)
        return op

    def _take_ready(
        self, queue: str, limit: int, now: float, retention_s: float | None, ops: list[Op]
    ) -> list[tuple[str, StoredMessage]]:
        """Up to `limit` ready messages from the head; drops those past retention."""
        lq = self.queues.get(queue)
        out: list[tuple[str, StoredMessage]] = []
        if lq is None:
            return out
        self.wake(now)
        ids, messages = lq.ids, self.messages
        oldest = now - retention_s if retention_s is not None else None
        i = 0
        while i < len(ids) and len(out) < limit:
            mid = ids[i]
            m = messages[mid]
            if oldest is not None and m.enqueued_at < oldest:
                op = Remove(queue, mid, m.seq)
                self.apply(op)  # removes ids[i]; the next one slides into place
                ops.append(op)
                continue
            out.append((mid, m))
            i += 1
        return out

    def pop(
        self, queue: str, limit: int, *, now: float = 0.0, retention_s: float | None = None
    ) -> tuple[list[tuple[str, StoredMessage]], list[Op]]:
        """Removes up to `limit` ready messages from the head of this node's UUID queue.

        Returns the messages and every op to persist (their removals, and the removal
        of any message found past its retention on the way).
        """
        ops: list[Op] = []
        got = self._take_ready(queue, limit, now, retention_s, ops)
        for mid, m in got:
            op = Remove(queue, mid, m.seq)
            self.apply(op)
            ops.append(op)
        return got, ops

    def lease(
        self,
        queue: str,
        limit: int,
        *,
        now: float,
        visibility_s: float,
        new_token: Callable[[], str],
        retention_s: float | None = None,
    ) -> tuple[list[tuple[str, StoredMessage, str]], list[Op]]:
        """Leases up to `limit` ready messages: (id, message, token) and the ops to persist."""
        ops: list[Op] = []
        got = self._take_ready(queue, limit, now, retention_s, ops)
        out: list[tuple[str, StoredMessage, str]] = []
        for mid, m in got:
            token = new_token()
            op = Lease(queue, mid, m.seq, token, now + visibility_s, m.receive_count + 1)
            self.apply(op)
            ops.append(op)
            out.append((mid, m, token))
        return out, ops

    def current_lease(self, queue: str, mid: str, token: str, now: float) -> StoredMessage | None:
        """The message if `token` is its lease and the lease has not run out by `now`."""
        m = self.messages.get(mid)
        if m is None or m.queue != queue or m.lease != token or m.lease_until <= now:
            return None
        return m

    def ack(self, queue: str, mid: str, token: str, now: float) -> Remove | None:
        m = self.current_lease(queue, mid, token, now)
        if m is None:
            return None
        op = Remove(queue, mid, m.seq)
        self.apply(op)
        return op

    def extend(
        self, queue: str, mid: str, token: str, now: float, visibility_s: float
    ) -> Extend | None:
        m = self.current_lease(queue, mid, token, now)
        if m is None:
            return None
        op = Extend(queue, mid, m.seq, now + visibility_s)
        self.apply(op)
        return op

    def requeue(
        self,
        queue: str,
        mid: str,
        token: str,
        now: float,
        *,
        delay_s: float = 0.0,
        expired: bool = False,
        max_receives: int | None = None,
        dead_letter_queue: str | None = None,
    ) -> Requeue | DeadLetter | None:
        """Ends lease `token`: a nack (`expired=False`, the lease must still run) or the
        monitor's requeue of a lease that ran out (`expired=True`).

        Past `max_receives` deliveries the message moves to `dead_letter_queue` instead
        (the caller has made sure this node is registered with it).
        """
        m = self.messages.get(mid)
        if m is None or m.queue != queue or m.lease != token:
            return None
        if expired != (m.lease_until <= now):
            return None
        self.wake(now)  # what became ready before now queues ahead of this message
        op: Requeue | DeadLetter
        if (
            max_receives is not None
            and dead_letter_queue is not None
            and m.receive_count >= max_receives
        ):
            op = DeadLetter(queue, mid, m.seq, dead_letter_queue, now, self.next_seq)
        else:
            op = Requeue(queue, mid, m.seq, now + delay_s, self.next_seq)
        self.apply(op)
        if type(op) is Requeue:
            self.wake(now)
        return op

    def wake(self, now: float) -> set[str]:
        """Delayed messages whose time has come become ready; returns their queues."""
        timers, messages = self._delay_timers, self.messages
        woken: set[str] = set()
        while timers and timers[0][0] <= now:
            when, _, mid = heapq.heappop(timers)
            m = messages.get(mid)
            if m is None or m.lease is not None or m.visible_at != when:
                continue
            lq = self.queues[m.queue]
            if mid in lq.delayed:
                lq.delayed.discard(mid)
                lq.ids.append(mid)
                woken.add(m.queue)
        return woken

    def due_leases(self, now: float, limit: int = 10_000) -> list[tuple[str, str, str]]:
        """(queue, id, token) of leases that ran out by `now`, oldest first.

        Takes them off the timer heap: the monitor requeues each, or hands it back
        with `recheck` when it cannot yet.
        """
        timers, messages = self._lease_timers, self.messages
        out: list[tuple[str, str, str]] = []
        while timers and timers[0][0] <= now and len(out) < limit:
            when, mid, token = heapq.heappop(timers)
            m = messages.get(mid)
            if m is not None and m.lease == token and m.lease_until == when:
                out.append((m.queue, mid, token))
        return out

    def recheck(self, mid: str) -> None:
        """Puts a leased message's expiry back on the timer heap."""
        m = self.messages.get(mid)
        if m is not None and m.lease is not None:
            heapq.heappush(self._lease_timers, (m.lease_until, mid, m.lease))

    def next_timer(self) -> float | None:
        """When the earliest lease expiry or delay end is due (stale entries included)."""
        heads = [h[0][0] for h in (self._lease_timers, self._delay_timers) if h]
        return min(heads) if heads else None

    def expired_by_retention(
        self, queue: str, now: float, retention_s: float, limit: int = 10_000
    ) -> list[Remove]:
        """Removes ready messages at the head of the UUID queue older than `retention_s`."""
        lq = self.queues.get(queue)
        ops: list[Remove] = []
        if lq is None:
            return ops
        oldest = now - retention_s
        while lq.ids and len(ops) < limit:
            mid = lq.ids[0]
            m = self.messages[mid]
            if m.enqueued_at >= oldest:
                break
            op = Remove(queue, mid, m.seq)
            self.apply(op)
            ops.append(op)
        return ops

    def forget_dedup(self, now: float) -> ForgetDedup | None:
        if not self._dedup_heap or self._dedup_heap[0][0] >= now:
            return None
        op = ForgetDedup(now)
        self.apply(op)
        return op

    def purge(self, queue: str) -> Purge | None:
        lq = self.queues.get(queue)
        has_dedup = any(q == queue for q, _ in self.dedup.values())
        if lq is None and not has_dedup:
            return None
        held = (*lq.ids, *lq.leased, *lq.delayed) if lq is not None else ()
        op = Purge(queue, tuple(self.messages[mid].seq for mid in held))
        self.apply(op)
        return op

    # ---- queries ------------------------------------------------------------------------
    def depth(self, queue: str) -> int:
        """Every message of `queue` this node holds (ready, leased or delayed)."""
        lq = self.queues.get(queue)
        return lq.holds() if lq is not None else 0

    def counts(self, queue: str) -> dict[str, int]:
        lq = self.queues.get(queue)
        if lq is None:
            ready = leased = delayed = 0
        else:
            ready, leased, delayed = len(lq.ids), len(lq.leased), len(lq.delayed)
        return {
            "ready": ready,
            "in_flight": leased,
            "delayed": delayed,
            "dead_lettered": self.dead_lettered.get(queue, 0),
        }
