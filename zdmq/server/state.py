"""A node's queue state as plain objects: UUID queues, bodies, metadata lists.

Every change to a node's state is one *operation* (a small named tuple) applied by
`NodeState.apply`. The same operation is what storage writes in its group commit and
what replication will ship to a replica, so memory, disk and replicas change by the
same steps. Nothing here awaits, opens files or touches sockets.

Per queue a node holds:
  * a UUID queue (`LocalQueue.ids`): the ids of the messages it stores, in arrival order;
  * the bodies, keyed by id (`NodeState.messages`);
  * `first_uuid`: the id that created the UUID queue (ZDMQ's firstUUID).
As the metadata owner of a queue (the primary of partition(queue name)) it also holds
the queue's *metadata list* (`QueueMeta.nodes`): the nodes that hold its messages.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

__all__ = [
    "CreateQueue",
    "DropQueue",
    "LocalQueue",
    "NodeState",
    "Op",
    "Purge",
    "Push",
    "QueueMeta",
    "Register",
    "Remove",
    "StoredMessage",
    "Unregister",
]


# ---- operations ------------------------------------------------------------------------
class CreateQueue(NamedTuple):
    queue: str
    incarnation: str
    created_at: float


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


class Remove(NamedTuple):
    """Deletes one stored message (a pop's removal)."""

    queue: str
    id: str
    seq: int


class Purge(NamedTuple):
    """Drops this node's UUID queue of `queue` and every body in it."""

    queue: str
    seqs: tuple[int, ...]


Op = CreateQueue | DropQueue | Register | Unregister | Push | Remove | Purge


# ---- state -----------------------------------------------------------------------------
class StoredMessage:
    __slots__ = ("body", "content_type", "queue", "seq")

    def __init__(self, queue: str, seq: int, body: bytes, content_type: str | None) -> None:
        self.queue = queue
        self.seq = seq
        self.body = body
        self.content_type = content_type


class LocalQueue:
    """This node's UUID queue of one queue."""

    __slots__ = ("first_uuid", "ids", "incarnation", "registered")

    def __init__(self) -> None:
        self.ids: deque[str] = deque()
        self.first_uuid: str | None = None
        # Whether the metadata owner is known to list this node for the queue, and
        # under which incarnation of the queue. Runtime knowledge, not persisted: after
        # a restart every non-empty queue registers again.
        self.registered = False
        self.incarnation: str | None = None


class QueueMeta:
    """The metadata list of one queue, kept by its metadata owner."""

    __slots__ = ("created_at", "incarnation", "name", "nodes")

    def __init__(self, name: str, incarnation: str, created_at: float) -> None:
        self.name = name
        self.incarnation = incarnation
        self.created_at = created_at
        # node id -> firstUUID of that node's UUID queue, in registration order.
        self.nodes: dict[str, str] = {}


class NodeState:
    def __init__(self) -> None:
        self.queues: dict[str, LocalQueue] = {}
        self.messages: dict[str, StoredMessage] = {}
        self.meta: dict[str, QueueMeta] = {}
        self.next_seq = 1

    # ---- the one mutation entry point --------------------------------------------------
    def apply(self, op: Op) -> None:
        if type(op) is Push:
            lq = self.queues.get(op.queue)
            if lq is None:
                lq = self.queues[op.queue] = LocalQueue()
            if not lq.ids:
                lq.first_uuid = op.id
            lq.ids.append(op.id)
            self.messages[op.id] = StoredMessage(op.queue, op.seq, op.body, op.content_type)
            if op.seq >= self.next_seq:
                self.next_seq = op.seq + 1
        elif type(op) is Remove:
            del self.messages[op.id]
            ids = self.queues[op.queue].ids
            if ids[0] == op.id:
                ids.popleft()
            else:
                ids.remove(op.id)
        elif type(op) is Purge:
            lq = self.queues.pop(op.queue, None)
            if lq is not None:
                for mid in lq.ids:
                    self.messages.pop(mid, None)
        elif type(op) is Register:
            meta = self.meta[op.queue]
            meta.nodes.setdefault(op.node, op.first_uuid)
        elif type(op) is Unregister:
            m = self.meta.get(op.queue)
            if m is not None:
                m.nodes.pop(op.node, None)
        elif type(op) is CreateQueue:
            self.meta[op.queue] = QueueMeta(op.queue, op.incarnation, op.created_at)
        elif type(op) is DropQueue:
            self.meta.pop(op.queue, None)
        else:  # pragma: no cover - programmer error
            raise AssertionError(f"unknown op {op!r}")

    # ---- planners: decide, apply, and return the ops to persist --------------------------
    def push(self, queue: str, msg_id: str, body: bytes, content_type: str | None) -> Push:
        assert msg_id not in self.messages, "caller checks for a duplicate id"
        op = Push(queue, msg_id, self.next_seq, body, content_type)
        self.apply(op)
        return op

    def pop(self, queue: str, limit: int) -> list[tuple[str, StoredMessage, Remove]]:
        """Removes up to `limit` messages from the head of this node's UUID queue."""
        lq = self.queues.get(queue)
        out: list[tuple[str, StoredMessage, Remove]] = []
        if lq is None:
            return out
        ids, messages = lq.ids, self.messages
        while ids and len(out) < limit:
            mid = ids.popleft()
            m = messages.pop(mid)
            out.append((mid, m, Remove(queue, mid, m.seq)))
        return out

    def purge(self, queue: str) -> Purge | None:
        lq = self.queues.get(queue)
        if lq is None:
            return None
        op = Purge(queue, tuple(self.messages[mid].seq for mid in lq.ids))
        self.apply(op)
        return op

    def depth(self, queue: str) -> int:
        lq = self.queues.get(queue)
        return len(lq.ids) if lq is not None else 0
