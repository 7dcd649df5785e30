"""A node's queue state as plain objects: UUID queues, leases, metadata lists.

Every durable change to a node's state is one *operation* (a small named tuple)
applied by `NodeState.apply`. The same operation is what storage writes in its group
commit and what replication will ship to a replica, so memory, disk and replicas change
by the same steps. Nothing here awaits, opens files, reads the clock or touches
sockets: every planner takes `now` (wall-clock seconds) from its caller, so tests drive
time by hand.

Per queue a node holds:
  * a UUID queue (`LocalQueue`): its *ready* messages in delivery order (priority, then
    deadline, then the order they became ready). Those of priority 0 without a deadline,
    most traffic, are `LocalQueue.ready`: flat arrays of sequence number and arrival time
    (16 bytes a message); the others are kept apart and merged at take time (see
    LocalQueue). An index of their ids (`NodeState.ready_ids`, a 128-bit int per id)
    serves duplicate checks;
  * its leased messages (`LocalQueue.leased`): received, invisible until acked, released
    or expired; and its delayed ones (`LocalQueue.delayed`): nacked with a delay; these
    few have a `StoredMessage` each with their delivery state (`NodeState.hot`);
  * `first_uuid`: the id that created the UUID queue (ZDMQ's firstUUID).
Bodies, content types and receive counts stay in storage, in a row per message: `apply`
hands every op to the state's `rows` (storage), and a planner that delivers messages
reads their rows by sequence number. A state built without storage keeps its rows in
the process (`MemoryRows`). So a node
holds about 100 bytes a ready message in memory, whatever its size.
As the metadata owner of a queue (the primary of partition(queue name)) it also holds
the queue's *metadata list* (`QueueMeta.nodes`) and settings; as the metadata owner of
a topic's name, the topic and its subscriptions (`TopicMeta`).

A message's life:
    Push -> ready (or delayed, with a delay) -> Lease -> leased -> Remove (ack)
                                     -> Requeue (nack, expiry) -> ready or delayed
                                     -> DeadLetter (past max_receives) -> ready in the DLQ
    ready or delayed -> Cancel; ready -> Remove(expired) once past its deadline
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
from array import array
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from zdmq.models import QueueSettings

__all__ = [
    "CANCELS_KEPT",
    "TIES_KEPT",
    "TOMBSTONES_KEPT",
    "Cancel",
    "Claimed",
    "CreateQueue",
    "CreateTopic",
    "DeadLetter",
    "DropQueue",
    "DropTopic",
    "Extend",
    "ForgetDedup",
    "Lease",
    "LocalQueue",
    "MemoryRows",
    "MessageView",
    "NodeState",
    "Op",
    "Purge",
    "Push",
    "PushOptions",
    "QueueMeta",
    "ReadyQueue",
    "Register",
    "Remove",
    "Requeue",
    "Row",
    "Rows",
    "StoredMessage",
    "Subscribe",
    "Taken",
    "TieRecord",
    "Tied",
    "TopicMeta",
    "Unregister",
    "Unsubscribe",
    "Untied",
    "id_key",
]

# A metadata owner keeps the tombstones of its last this many deleted queues (about 100
# bytes each). A node that returns after more deletes than this on one owner finds an
# older deleted queue unknown rather than deleted: it keeps those messages (an orphaned
# queue, adopted if the name is created again) instead of purging them.
TOMBSTONES_KEPT = 10_000
# A node keeps the ids of its last this many cancelled messages (about 150 bytes each), so
# that a repeated cancel of one of them answers as the first did.
CANCELS_KEPT = 10_000
# A group keeps its last this many ties (about 300 bytes each for three copies); a copy of
# an older tie finds its tie unknown when delivered (docs/design.md §18).
TIES_KEPT = 1_000_000


# ---- operations ------------------------------------------------------------------------
# priority, deadline, visible_at, attributes, FIFO group (or None), tie token (or None)
PushOptions = tuple[int, float, float, str | None, str | None, str | None]


class CreateQueue(NamedTuple):
    queue: str
    incarnation: str
    created_at: float
    settings: QueueSettings = QueueSettings()


class DropQueue(NamedTuple):
    """Removes the metadata list of a queue (on its metadata owner) and leaves a tombstone:
    the record that the queue was deleted, which tells a repair sweep to purge it."""

    queue: str
    incarnation: str = ""
    deleted_at: float = 0.0


class Register(NamedTuple):
    queue: str
    node: str
    first_uuid: str


class Unregister(NamedTuple):
    queue: str
    node: str


class CreateTopic(NamedTuple):
    """Creates a topic (on the metadata owner of its name; topics and queues are separate
    namespaces, so a topic may share its name with a queue)."""

    topic: str
    created_at: float


class DropTopic(NamedTuple):
    """Removes a topic and its subscriptions (the subscribed queues stay)."""

    topic: str


class Subscribe(NamedTuple):
    """Adds `queue` to the subscriptions of `topic`: a publish stores a copy there."""

    topic: str
    queue: str


class Unsubscribe(NamedTuple):
    topic: str
    queue: str


class Push(NamedTuple):
    queue: str
    id: str
    seq: int
    body: bytes
    content_type: str | None
    enqueued_at: float = 0.0
    # > 0: a dedup record keeps the id until then, even after the message is gone.
    dedup_until: float = 0.0
    # None for a message without delivery options (most), else (priority 0..9, deadline
    # or 0: never delivered from then on, visible_at: delayed until then if later than
    # enqueued_at, attributes: a JSON object of strings or None, group: the FIFO group
    # of a message of a FIFO queue or None, tie: the token of the tie of a tied copy or
    # None).
    options: PushOptions | None = None


class Remove(NamedTuple):
    """Deletes one stored message: a pop, an ack, a message past its retention, or
    (`expired`) one past its deadline, counted in the queue's `expired`."""

    queue: str
    id: str
    seq: int
    expired: bool = False


class Cancel(NamedTuple):
    """Deletes a message that is ready or delayed (never a leased one) at its sender's
    request, and records its id among the last `CANCELS_KEPT` cancelled ones, so that
    a repeated cancel answers as the first did."""

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
    everything stored so far, and a reload rebuilds that order (see finish_restore). A
    message of a FIFO group keeps its seq (`new_seq` is `seq`): it goes back to the head
    of its group, whose order is its messages' seqs.
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


class Tied(NamedTuple):
    """Records a tie (on the group that owns its token): the copies (queue, id) stored
    under `token`, of which at most one is delivered (the first to claim it)."""

    token: str
    copies: tuple[tuple[str, str], ...]
    created_at: float


class Claimed(NamedTuple):
    """Copy `id` of tie `token` won its claim: it alone may be delivered."""

    token: str
    id: str


class Untied(NamedTuple):
    """Tie `token` is cancelled: no copy of it may be delivered from now on."""

    token: str


class ForgetDedup(NamedTuple):
    """Drops the dedup records whose window ended before `before`."""

    before: float


Op = (
    CreateQueue
    | DropQueue
    | Register
    | Unregister
    | CreateTopic
    | DropTopic
    | Subscribe
    | Unsubscribe
    | Push
    | Remove
    | Cancel
    | Purge
    | Lease
    | Extend
    | Requeue
    | DeadLetter
    | ForgetDedup
    | Tied
    | Claimed
    | Untied
)


# ---- state -----------------------------------------------------------------------------
class Row(NamedTuple):
    """What a node's storage keeps of a message beside its place in the queues."""

    id: str
    body: bytes
    content_type: str | None
    receive_count: int
    attributes: str | None = None
    priority: int = 0
    group: str | None = None
    tie: str | None = None


class Rows(Protocol):
    """Where a state's message rows live: storage (SqliteStorage), or the process."""

    def read(self, seqs: Sequence[int]) -> dict[int, Row]:
        """The rows of messages `seqs`, by sequence number (missing ones left out)."""

    def write(self, op: Op) -> None:
        """Takes every op the state applies, in order."""


class Taken(NamedTuple):
    """A message a planner took off a ready queue: popped, or leased under `token`."""

    id: str
    body: bytes
    content_type: str | None
    receive_count: int
    token: str | None = None
    attributes: str | None = None
    priority: int = 0
    group: str | None = None
    tie: str | None = None  # the token of the tie this copy belongs to


def id_key(mid: str) -> int | str:
    """The key of a message id in the index of ready messages.

    A node only stores canonical UUIDs (it checks them first), kept as their 128-bit
    number: 48 bytes instead of an 85-byte string. Other strings (unit tests name
    their messages "a", "b") are kept as they are.
    """
    if len(mid) == 36:
        try:
            return int(mid.replace("-", ""), 16)
        except ValueError:
            pass
    return mid


class MemoryRows:
    """The message rows of a state that has no storage behind it (`durability: memory`
    and unit tests): kept in the process and changed by the same ops."""

    def __init__(self) -> None:
        self._rows: dict[int, Row] = {}

    def read(self, seqs: Sequence[int]) -> dict[int, Row]:
        rows = self._rows
        return {seq: rows[seq] for seq in seqs if seq in rows}

    def write(self, op: Op) -> None:
        rows, kind = self._rows, type(op)
        if kind is Push:
            assert isinstance(op, Push)
            o = op.options
            if o is None:
                rows[op.seq] = Row(op.id, op.body, op.content_type, 0)
            else:
                rows[op.seq] = Row(op.id, op.body, op.content_type, 0, o[3], o[0], o[4], o[5])
        elif kind is Remove or kind is Cancel:
            assert isinstance(op, Remove | Cancel)
            rows.pop(op.seq, None)
        elif kind is Lease:
            assert isinstance(op, Lease)
            rows[op.seq] = rows[op.seq]._replace(receive_count=op.receive_count)
        elif kind is Requeue:
            assert isinstance(op, Requeue)
            rows[op.new_seq] = rows.pop(op.seq)
        elif kind is DeadLetter:
            assert isinstance(op, DeadLetter)
            # In the dead-letter queue a FIFO message is in no group.
            rows[op.new_seq] = rows.pop(op.seq)._replace(receive_count=0, group=None)
        elif kind is Purge:
            assert isinstance(op, Purge)
            for seq in op.seqs:
                rows.pop(seq, None)


class StoredMessage:
    """A message that is not ready: leased, or waiting out a delay. Its body stays in
    storage; ready messages have no object at all (see ReadyQueue)."""

    __slots__ = (
        "deadline",
        "enqueued_at",
        "group",
        "lease",
        "lease_until",
        "origin",
        "priority",
        "queue",
        "receive_count",
        "seq",
        "visible_at",
    )

    def __init__(
        self,
        queue: str,
        seq: int,
        enqueued_at: float,
        receive_count: int,
        priority: int = 0,
        deadline: float = 0.0,
    ) -> None:
        self.queue = queue
        self.seq = seq
        self.enqueued_at = enqueued_at
        self.receive_count = receive_count
        self.priority = priority
        self.deadline = deadline
        self.lease: str | None = None  # the current lease's token
        self.lease_until = 0.0
        self.visible_at = 0.0
        self.origin: str | None = None  # the queue it was dead-lettered from
        self.group: str | None = None  # its FIFO group (held busy while it is not ready)


class ReadyQueue:
    """The ready messages of one UUID queue in order, as two flat arrays: sequence
    number and enqueued_at, 16 bytes a message. The head moves forward; the arrays are
    trimmed once it has passed half of them."""

    __slots__ = ("head", "seqs", "times")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.times = array("d")
        self.head = 0  # the index in the arrays of the first message

    def __len__(self) -> int:
        return len(self.seqs) - self.head

    def __bool__(self) -> bool:
        return len(self.seqs) > self.head

    def __iter__(self) -> Iterator[int]:
        """The sequence numbers, head first (a copy: callers may change the queue)."""
        return iter(self.seqs[self.head :])

    def at(self, i: int) -> tuple[int, float]:
        """(seq, enqueued_at) of the i-th message from the head."""
        j = self.head + i
        return self.seqs[j], self.times[j]

    def append(self, seq: int, enqueued_at: float) -> None:
        self.seqs.append(seq)
        self.times.append(enqueued_at)

    def remove(self, seq: int) -> float:
        """Takes `seq` out (at the head in O(1), elsewhere in O(n)); its enqueued_at."""
        h, seqs = self.head, self.seqs
        if h < len(seqs) and seqs[h] == seq:
            t = self.times[h]
            self.head = h + 1
            if self.head == len(seqs):
                self.seqs, self.times, self.head = array("q"), array("d"), 0
            elif self.head >= 1024 and self.head * 2 >= len(seqs):
                del seqs[: self.head]
                del self.times[: self.head]
                self.head = 0
            return t
        i = seqs.index(seq, h)
        t = self.times[i]
        del seqs[i]
        del self.times[i]
        return t


# One ready message in delivery order, as `LocalQueue.ordered` walks them:
# (seq, enqueued_at, priority, deadline; 0.0 for none).
Ready = tuple[int, float, int, float]


class LocalQueue:
    """This node's UUID queue of one queue, with its leased and delayed messages.

    Ready messages are delivered by priority (high first), then deadline (earliest first;
    none after every deadline), then the order they became ready. Most traffic has one
    priority and no deadline: those messages (priority 0, no deadline) are `ready`, an
    arrival-ordered ReadyQueue as cheap as a queue can be. The others are kept apart:
    those without a deadline in a ReadyQueue per priority (`levels`), those with one in
    a heap (`timed`) of (-priority, deadline, join, seq), `join` counting the order they
    became ready. `placed` maps the seq of each message not in `ready` to
    (priority, deadline, enqueued_at): it says where a message is, and a `timed` entry
    whose seq it no longer holds is stale (skipped; seqs are never reused). A take
    merges them (`ordered`); while `placed` is empty it reads `ready` alone, as a queue
    without priorities always does.

    The ready messages of a FIFO queue are kept by group instead: `groups` maps each
    group with ready messages to their seqs in push order (a deque), `gseq` maps each of
    those seqs to (group, enqueued_at). A group is *busy* while one of its messages is
    not ready (leased, or waiting out a nack's delay): `busy` maps it to that message's
    id, and nothing else of the group is delivered meanwhile. `free` is a heap of
    (head seq, group) of the groups that are not busy, whose head is that seq: a take
    walks it, oldest head first, so groups take turns in the order their heads were
    pushed. An entry whose group has become busy or whose head has changed is stale
    (skipped and dropped); so the heap's live entries follow from `groups` and `busy`
    alone, which is what a reload rebuilds.
    """

    __slots__ = (
        "busy",
        "delayed",
        "first_uuid",
        "free",
        "groups",
        "gseq",
        "leased",
        "levels",
        "origins",
        "placed",
        "ready",
        "retention_due",
        "timed",
    )

    def __init__(self) -> None:
        self.ready = ReadyQueue()
        self.levels: dict[int, ReadyQueue] = {}
        self.timed: list[tuple[int, float, int, int]] = []
        self.placed: dict[int, tuple[int, float, float]] = {}
        self.leased: set[str] = set()
        self.delayed: set[str] = set()
        # The queue each ready message came from, for the ready ones that were
        # dead-lettered into this queue (seq -> origin); empty but in DLQs.
        self.origins: dict[int, str] = {}
        self.first_uuid: str | None = None
        # The earliest time a ready message of this queue can be past retention, as far
        # as the last retention check knows (0: check at the next sweep).
        self.retention_due = 0.0
        # FIFO groups (see the class's doc).
        self.groups: dict[str, deque[int]] = {}
        self.gseq: dict[int, tuple[str, float]] = {}
        self.busy: dict[str, str] = {}
        self.free: list[tuple[int, str]] = []

    def ready_count(self) -> int:
        return len(self.ready) + len(self.placed) + len(self.gseq)

    def holds(self) -> int:
        """Every message of the queue on this node, visible or not."""
        return (
            len(self.ready)
            + len(self.placed)
            + len(self.gseq)
            + len(self.leased)
            + len(self.delayed)
        )

    def deliverable(self) -> bool:
        """Whether a take would find a message now: a ready one outside FIFO groups, or
        the head of a group that is not busy."""
        return bool(self.ready) or bool(self.placed) or self.free_head() is not None

    # ---- FIFO groups ----------------------------------------------------------------
    def join_group(self, group: str, seq: int, enqueued_at: float) -> None:
        """Ready message `seq` joins `group` in seq order: at the tail when pushed, at
        the head when it comes back from a lease."""
        dq = self.groups.get(group)
        if dq is None:
            dq = self.groups[group] = deque()
        if not dq or seq > dq[-1]:
            dq.append(seq)
        elif seq < dq[0]:
            dq.appendleft(seq)
        else:
            dq.insert(bisect_left(dq, seq), seq)
        self.gseq[seq] = (group, enqueued_at)
        if dq[0] == seq and group not in self.busy:
            heapq.heappush(self.free, (seq, group))

    def _leave_group(self, seq: int) -> float | None:
        """Takes ready message `seq` out of its group; its enqueued_at, or None when it is
        in no group."""
        g = self.gseq.pop(seq, None)
        if g is None:
            return None
        group, enqueued_at = g
        dq = self.groups[group]
        if dq[0] == seq:
            dq.popleft()
            if dq and group not in self.busy:
                heapq.heappush(self.free, (dq[0], group))
        else:
            dq.remove(seq)
        if not dq:
            del self.groups[group]
        return enqueued_at

    def group_of(self, seq: int) -> str | None:
        """The group of ready message `seq`, None outside FIFO groups."""
        g = self.gseq.get(seq) if self.gseq else None
        return g[0] if g is not None else None

    def hold_group(self, group: str, mid: str) -> None:
        """`group` is busy while message `mid` is not ready."""
        self.busy[group] = mid

    def release_group(self, group: str) -> None:
        """`group` is no longer busy: its head may be delivered."""
        if self.busy.pop(group, None) is not None:
            dq = self.groups.get(group)
            if dq:
                heapq.heappush(self.free, (dq[0], group))

    def _live(self, entry: tuple[int, str]) -> bool:
        seq, group = entry
        dq = self.groups.get(group)
        return dq is not None and dq[0] == seq and group not in self.busy

    def free_head(self) -> tuple[int, str] | None:
        """The live `free` entry with the oldest head (stale ones on top are dropped)."""
        free = self.free
        while free and not self._live(free[0]):
            heapq.heappop(free)
        return free[0] if free else None

    def free_groups(self) -> Iterator[tuple[int, str]]:
        """The live `free` entries, oldest head first, without changing the heap (the
        queue must not change while this runs)."""
        free = self.free
        if len(free) > 64 and len(free) > 2 * len(self.groups):
            self.free = free = sorted(e for e in free if self._live(e))
        frontier = [(free[0], 0)] if free else []
        n = len(free)
        seen: set[str] = set()  # an entry can be on the heap twice
        while frontier:
            entry, i = heapq.heappop(frontier)
            if entry[1] not in seen and self._live(entry):
                seen.add(entry[1])
                yield entry
            for j in (2 * i + 1, 2 * i + 2):
                if j < n:
                    heapq.heappush(frontier, (free[j], j))

    def join(self, seq: int, enqueued_at: float, priority: int, deadline: float, n: int) -> None:
        """A message becomes ready; `n` orders it among those with a deadline."""
        if not priority and not deadline:
            self.ready.append(seq, enqueued_at)
            return
        self.placed[seq] = (priority, deadline, enqueued_at)
        if deadline:
            heapq.heappush(self.timed, (-priority, deadline, n, seq))
        else:
            level = self.levels.get(priority)
            if level is None:
                level = self.levels[priority] = ReadyQueue()
            level.append(seq, enqueued_at)

    def leave(self, seq: int) -> tuple[float, int, float]:
        """Takes ready message `seq` out; its (enqueued_at, priority, deadline)."""
        if self.gseq:
            t = self._leave_group(seq)
            if t is not None:
                return t, 0, 0.0
        placed = self.placed.pop(seq, None) if self.placed else None
        if placed is None:
            return self.ready.remove(seq), 0, 0.0
        priority, deadline, enqueued_at = placed
        if deadline:
            timed = self.timed
            while timed and timed[0][3] not in self.placed:
                heapq.heappop(timed)
            if len(timed) > 64 and len(timed) > 2 * len(self.placed):
                self.timed = [e for e in timed if e[3] in self.placed]
                heapq.heapify(self.timed)
        else:
            level = self.levels[priority]
            level.remove(seq)
            if not level:
                del self.levels[priority]
        return enqueued_at, priority, deadline

    def _timed_in_order(self) -> Iterator[tuple[int, float, int, int]]:
        """The live entries of `timed` in order, without changing the heap: a walk of
        its tree, smallest first (O(log k) an entry)."""
        timed, placed = self.timed, self.placed
        if not timed:
            return
        frontier = [(timed[0], 0)]
        n = len(timed)
        while frontier:
            entry, i = heapq.heappop(frontier)
            if entry[3] in placed:
                yield entry
            for j in (2 * i + 1, 2 * i + 2):
                if j < n:
                    heapq.heappush(frontier, (timed[j], j))

    def ordered(self) -> Iterator[Ready]:
        """The ready messages in delivery order, lazily (the queue must not change while
        this runs)."""
        placed = self.placed
        levels = sorted(self.levels, reverse=True)
        if self.ready:
            levels.append(0)
        timed = self._timed_in_order()
        t = next(timed, None)
        for p in levels:
            while t is not None and -t[0] >= p:
                seq = t[3]
                yield seq, placed[seq][2], -t[0], t[1]
                t = next(timed, None)
            rq = self.levels[p] if p else self.ready
            seqs, times = rq.seqs, rq.times
            for j in range(rq.head, len(seqs)):
                yield seqs[j], times[j], p, 0.0
        while t is not None:
            seq = t[3]
            yield seq, placed[seq][2], -t[0], t[1]
            t = next(timed, None)
        if self.gseq:  # FIFO groups' messages, in push order
            gseq = self.gseq
            for seq in sorted(gseq):
                yield seq, gseq[seq][1], 0, 0.0


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


class TopicMeta:
    """A topic, kept by the metadata owner of its name: its subscriptions (queue names)
    in the order they were made."""

    __slots__ = ("created_at", "name", "subscriptions")

    def __init__(self, name: str, created_at: float) -> None:
        self.name = name
        self.created_at = created_at
        self.subscriptions: dict[str, None] = {}


class TieRecord:
    """A tie: its copies (queue, id), the copy that won its claim (None: none yet) and
    whether it was cancelled."""

    __slots__ = ("cancelled", "copies", "created_at", "winner")

    def __init__(self, copies: tuple[tuple[str, str], ...], created_at: float) -> None:
        self.copies = copies
        self.created_at = created_at
        self.winner: str | None = None
        self.cancelled = False


class MessageView(NamedTuple):
    """Everything about one stored message, for tests and diagnostics (`NodeState.find`)."""

    queue: str
    seq: int
    body: bytes
    content_type: str | None
    enqueued_at: float
    receive_count: int
    lease: str | None
    lease_until: float
    visible_at: float
    origin: str | None


# A planner's verdict on one receipt.
ACKED = "ok"
LEASE_EXPIRED = "lease_expired"


class NodeState:
    """The queues of one node. `rows` is where message rows live: `apply` hands it every
    op, and planners read the rows of the messages they deliver from it. Without it the
    state keeps its rows in the process (MemoryRows)."""

    # The lease timer heap is rebuilt without its stale pairs once it may hold more than
    # this many pairs, and more than twice the live ones it kept last time.
    lease_timers_floor = 4096

    def __init__(self, rows: Rows | None = None) -> None:
        self.queues: dict[str, LocalQueue] = {}
        # Messages that are not ready (leased or delayed), by id.
        self.hot: dict[str, StoredMessage] = {}
        # Ready messages: id key -> queue (their order is in each queue's ReadyQueue).
        self.ready_ids: dict[int | str, str] = {}
        self.meta: dict[str, QueueMeta] = {}
        # Topics whose name this node is the metadata owner of (a namespace of their own).
        self.topics: dict[str, TopicMeta] = {}
        # Deleted queues (on their metadata owner): name -> (incarnation, deleted_at), oldest
        # first, at most TOMBSTONES_KEPT. Only a queue named here is purged by a sweep.
        self.tombstones: dict[str, tuple[str, float]] = {}
        # Dedup records: id -> (queue, until), with a heap to forget them in time order.
        self.dedup: dict[str, tuple[str, float]] = {}
        self._dedup_heap: list[tuple[float, str]] = []
        # Lease expiries and delay ends; an entry the message no longer matches is stale
        # and skipped. A lease entry is (until, n, [(id, token), ...]): the leases of one
        # receive end at the same moment and share an entry, so a batch costs one heap
        # push and one pop, not one a message (n orders entries of the same moment).
        self._lease_timers: list[tuple[float, int, list[tuple[str, str]]]] = []
        self._last_lease_timer: tuple[float, int, list[tuple[str, str]]] | None = None
        self._lease_timer_n = 0
        # A lease acked, nacked or extended leaves its pair on the heap until its old end:
        # with a long visibility that is rate x visibility pairs. So the pairs put on the
        # heap are counted (an upper bound: a pair is counted when its entry closes, and
        # not uncounted when due_leases takes it), and past both lease_timers_floor and
        # twice the live pairs the last rebuild kept, the heap is rebuilt with its live
        # pairs only. Each rebuild is paid for by at least as many pairs pushed since the
        # last one: O(1) a lease, and only when an entry opens (once a receive).
        self._lease_timer_pairs = 0
        self._lease_timers_max = 0
        self._delay_timers: list[tuple[float, int, str]] = []
        # Ready messages being restored:
        # (ready_at, seq, queue, enqueued_at, origin, priority, deadline, group).
        self._restoring: list[
            tuple[float, int, str, float, str | None, int, float, str | None]
        ] = []
        # Messages held in dead-letter queues, by the queue they came from.
        self.dead_lettered: Counter[str] = Counter()
        # Messages dropped unseen past their deadline, by queue (until it is purged).
        self.expired: Counter[str] = Counter()
        # The last CANCELS_KEPT cancelled ids, oldest first: id -> queue.
        self.cancelled: dict[str, str] = {}
        # Ties whose token this group owns, oldest first (at most TIES_KEPT).
        self.ties: dict[str, TieRecord] = {}
        # Deadlines of ready messages: (deadline, seq, queue); stale once the message
        # left ready (its queue's `placed` no longer holds the seq).
        self._deadlines: list[tuple[float, int, str]] = []
        self._joins = 0  # counts messages with a deadline becoming ready (their order)
        self.next_seq = 1
        # The latest time a command applied here was stamped with (machine.py keeps it
        # from going back).
        self.clock = 0.0
        self.rows: Rows = rows if rows is not None else MemoryRows()

    # ---- the one mutation entry point --------------------------------------------------
    def apply(self, op: Op) -> None:
        applier = _APPLIERS.get(type(op))
        if applier is None:  # pragma: no cover - programmer error
            raise AssertionError(f"unknown op {op!r}")
        applier(self, op)
        self.rows.write(op)

    def _apply_push(self, op: Push) -> None:
        queue, mid, seq, _, _, enqueued_at, dedup_until, options = op
        lq = self.queues.get(queue)
        if lq is None:
            lq = self.queues[queue] = LocalQueue()
        ready = lq.ready
        if ready.head == len(ready.seqs) and not lq.holds():
            lq.first_uuid = mid  # the UUID queue was empty
        if options is None:  # the common case: ready, FIFO
            ready.seqs.append(seq)
            ready.times.append(enqueued_at)
            self.ready_ids[id_key(mid)] = queue
            if dedup_until > 0:
                self.dedup[mid] = (queue, dedup_until)
                heapq.heappush(self._dedup_heap, (dedup_until, mid))
            if seq >= self.next_seq:
                self.next_seq = seq + 1
            return
        priority, deadline, visible_at, _, group, _ = options
        if group is not None:  # a FIFO queue's (no priority, deadline or delay)
            lq.join_group(group, seq, enqueued_at)
            self.ready_ids[id_key(mid)] = queue
        elif visible_at > enqueued_at:  # delayed from the start
            m = self.hot[mid] = StoredMessage(queue, seq, enqueued_at, 0, priority, deadline)
            m.visible_at = visible_at
            lq.delayed.add(mid)
            heapq.heappush(self._delay_timers, (visible_at, seq, mid))
        elif priority or deadline:
            self._join(lq, queue, seq, enqueued_at, priority, deadline)
            self.ready_ids[id_key(mid)] = queue
        else:
            ready.seqs.append(seq)
            ready.times.append(enqueued_at)
            self.ready_ids[id_key(mid)] = queue
        if dedup_until > 0:
            self.dedup[mid] = (queue, dedup_until)
            heapq.heappush(self._dedup_heap, (dedup_until, mid))
        if seq >= self.next_seq:
            self.next_seq = seq + 1

    def _apply_lease(self, op: Lease) -> None:
        queue, mid, seq, token, until, count = op
        lq = self.queues[queue]
        m = self._heat(lq, queue, mid, seq, count)  # a lease takes a ready message
        lq.leased.add(mid)
        m.lease, m.lease_until = token, until
        self._lease_timer(until, mid, token)

    def _apply_extend(self, op: Extend) -> None:
        m = self.hot[op.id]
        assert m.lease is not None
        m.lease_until = op.until
        self._lease_timer(op.until, op.id, m.lease)

    def _apply_requeue(self, op: Requeue) -> None:
        m = self.hot[op.id]
        lq = self.queues[op.queue]
        self._unlink(lq, op.id, m)
        m.lease, m.lease_until, m.visible_at = None, 0.0, op.visible_at
        self._resequence(m, op.new_seq)
        lq.delayed.add(op.id)
        heapq.heappush(self._delay_timers, (op.visible_at, op.new_seq, op.id))

    def _apply_dead_letter(self, op: DeadLetter) -> None:
        m = self.hot.pop(op.id)
        lq = self.queues[op.queue]
        self._unlink(lq, op.id, m)
        if m.group is not None:  # the move releases the group; in the DLQ it has none
            lq.release_group(m.group)
            m.group = None
        self._forget_if_empty(op.queue)
        self._origin_gone(m.origin)
        self._resequence(m, op.new_seq)
        self.dead_lettered[op.queue] += 1
        dlq = self._local(op.dlq)
        if not dlq.holds():
            dlq.first_uuid = op.id
        self._join(dlq, op.dlq, op.new_seq, op.moved_at, m.priority, m.deadline)
        dlq.origins[op.new_seq] = op.queue
        self.ready_ids[id_key(op.id)] = op.dlq

    def _apply_remove(self, op: Remove | Cancel) -> None:
        lq = self.queues[op.queue]
        gone = self.hot.pop(op.id, None)
        if gone is None:
            del self.ready_ids[id_key(op.id)]
            lq.leave(op.seq)
            if lq.origins:
                self._origin_gone(lq.origins.pop(op.seq, None))
        else:
            if gone.lease is not None:
                lq.leased.discard(op.id)
            else:
                lq.delayed.discard(op.id)
            if gone.origin is not None:
                self._origin_gone(gone.origin)
            if gone.group is not None:
                lq.release_group(gone.group)
        if type(op) is Remove:
            if op.expired:
                self.expired[op.queue] += 1
        else:
            self.restore_cancel(op.id, op.queue)

    def restore_cancel(self, mid: str, queue: str) -> None:
        """Records that `mid` was cancelled, dropping the oldest record past the bound."""
        cancelled = self.cancelled
        cancelled.pop(mid, None)
        cancelled[mid] = queue
        while len(cancelled) > CANCELS_KEPT:
            del cancelled[next(iter(cancelled))]

    def _apply_purge(self, op: Purge) -> None:
        purged = self.queues.pop(op.queue, None)
        if purged is not None:
            for mid in (*purged.leased, *purged.delayed):
                held = self.hot.pop(mid, None)
                if held is not None:
                    self._origin_gone(held.origin)
            for origin in purged.origins.values():
                self._origin_gone(origin)
            if purged.ready_count():
                # One pass over the index: a purge is rare, ready messages are many.
                self.ready_ids = {k: q for k, q in self.ready_ids.items() if q != op.queue}
        for mid in [k for k, (q, _) in self.dedup.items() if q == op.queue]:
            del self.dedup[mid]
        self.expired.pop(op.queue, None)

    def _apply_forget_dedup(self, op: ForgetDedup) -> None:
        heap = self._dedup_heap
        while heap and heap[0][0] < op.before:
            until, mid = heapq.heappop(heap)
            rec = self.dedup.get(mid)
            if rec is not None and rec[1] == until:
                del self.dedup[mid]

    def _apply_tied(self, op: Tied) -> None:
        ties = self.ties
        ties[op.token] = TieRecord(tuple((q, mid) for q, mid in op.copies), op.created_at)
        while len(ties) > TIES_KEPT:
            del ties[next(iter(ties))]

    def _apply_claimed(self, op: Claimed) -> None:
        self.ties[op.token].winner = op.id

    def _apply_untied(self, op: Untied) -> None:
        self.ties[op.token].cancelled = True

    def restore_tie(
        self,
        token: str,
        copies: tuple[tuple[str, str], ...],
        created_at: float,
        winner: str | None,
        cancelled: bool,
    ) -> None:
        tie = self.ties[token] = TieRecord(copies, created_at)
        tie.winner, tie.cancelled = winner, cancelled

    def claim(self, token: str, mid: str) -> str:
        """Copy `mid` of tie `token` claims its delivery: "won" (the first claim, or this
        copy's again), "lost" (another copy won, or the tie was cancelled) or "unknown"
        (no such tie: never made, or forgotten past TIES_KEPT)."""
        tie = self.ties.get(token)
        if tie is None:
            return "unknown"
        if tie.winner == mid:
            return "won"
        if tie.winner is not None or tie.cancelled or all(mid != c[1] for c in tie.copies):
            return "lost"
        self.apply(Claimed(token, mid))
        return "won"

    def _apply_register(self, op: Register) -> None:
        self.meta[op.queue].nodes.setdefault(op.node, op.first_uuid)

    def _apply_unregister(self, op: Unregister) -> None:
        meta = self.meta.get(op.queue)
        if meta is not None:
            meta.nodes.pop(op.node, None)

    def _apply_create(self, op: CreateQueue) -> None:
        self.meta[op.queue] = QueueMeta(op.queue, op.incarnation, op.created_at, op.settings)
        self.tombstones.pop(op.queue, None)

    def _apply_drop(self, op: DropQueue) -> None:
        self.meta.pop(op.queue, None)
        self.restore_tombstone(op.queue, op.incarnation, op.deleted_at)

    def _apply_create_topic(self, op: CreateTopic) -> None:
        self.topics[op.topic] = TopicMeta(op.topic, op.created_at)

    def _apply_drop_topic(self, op: DropTopic) -> None:
        self.topics.pop(op.topic, None)

    def _apply_subscribe(self, op: Subscribe) -> None:
        self.topics[op.topic].subscriptions[op.queue] = None

    def _apply_unsubscribe(self, op: Unsubscribe) -> None:
        topic = self.topics.get(op.topic)
        if topic is not None:
            topic.subscriptions.pop(op.queue, None)

    def restore_tombstone(self, queue: str, incarnation: str, deleted_at: float) -> None:
        """Records that `queue` was deleted, dropping the oldest tombstone past the bound."""
        tombstones = self.tombstones
        tombstones.pop(queue, None)  # a second delete of the name moves it to the end
        tombstones[queue] = (incarnation, deleted_at)
        while len(tombstones) > TOMBSTONES_KEPT:
            del tombstones[next(iter(tombstones))]

    def _heat(
        self, lq: LocalQueue, queue: str, mid: str, seq: int, receive_count: int = 0
    ) -> StoredMessage:
        """Takes a ready message out of its ready queue into `hot` (it leaves ready); a
        FIFO group's message holds its group busy."""
        del self.ready_ids[id_key(mid)]
        group = lq.group_of(seq)
        if group is not None:
            lq.hold_group(group, mid)
        enqueued_at, priority, deadline = lq.leave(seq)
        m = self.hot[mid] = StoredMessage(
            queue, seq, enqueued_at, receive_count, priority, deadline
        )
        m.group = group
        if lq.origins:
            m.origin = lq.origins.pop(seq, None)
        return m

    def _cool(self, lq: LocalQueue, mid: str, m: StoredMessage) -> None:
        """A delayed message becomes ready: it leaves `hot` for the ready queue."""
        del self.hot[mid]
        lq.delayed.discard(mid)
        if m.group is not None:  # back at the head of its group, which it frees
            lq.release_group(m.group)
            lq.join_group(m.group, m.seq, m.enqueued_at)
        else:
            self._join(lq, m.queue, m.seq, m.enqueued_at, m.priority, m.deadline)
        lq.retention_due = 0.0  # an older message may now be ready
        if m.origin is not None:
            lq.origins[m.seq] = m.origin
        self.ready_ids[id_key(mid)] = m.queue

    def _join(
        self,
        lq: LocalQueue,
        queue: str,
        seq: int,
        enqueued_at: float,
        priority: int,
        deadline: float,
    ) -> None:
        """A message becomes ready in `lq` (see LocalQueue.join)."""
        if deadline:
            self._joins += 1
            heapq.heappush(self._deadlines, (deadline, seq, queue))
        lq.join(seq, enqueued_at, priority, deadline, self._joins)

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
        """Takes a message that is not ready out of leased / delayed."""
        if m.lease is not None:
            lq.leased.discard(mid)
        else:
            lq.delayed.discard(mid)

    def _forget_if_empty(self, queue: str) -> None:
        lq = self.queues.get(queue)
        if lq is not None and not lq.holds():
            lq.first_uuid = None

    def _origin_gone(self, origin: str | None) -> None:
        if origin is not None:
            self.dead_lettered[origin] -= 1
            if self.dead_lettered[origin] <= 0:
                del self.dead_lettered[origin]

    # ---- restore (storage replays a row per message) ----------------------------------------
    def restore(
        self,
        queue: str,
        mid: str,
        seq: int,
        *,
        enqueued_at: float,
        receive_count: int,
        lease: str | None,
        lease_until: float,
        visible_at: float,
        origin: str | None,
        now: float,
        priority: int = 0,
        deadline: float = 0.0,
        group: str | None = None,
    ) -> None:
        """Rebuilds one stored message's place and delivery state, as of `now` (its
        body stays in storage). `group` is its FIFO group (ignored once dead-lettered).

        Call `finish_restore` after the last one: it queues the ready messages up.
        """
        lq = self._local(queue)
        if lq.first_uuid is None:  # the oldest message it holds
            lq.first_uuid = mid
        if origin is not None:
            self.dead_lettered[origin] += 1
            group = None
        if lease is not None or visible_at > now:
            m = self.hot[mid] = StoredMessage(
                queue, seq, enqueued_at, receive_count, priority, deadline
            )
            m.origin = origin
            if group is not None:
                m.group = group
                lq.hold_group(group, mid)
            if lease is not None:
                m.lease, m.lease_until = lease, lease_until
                lq.leased.add(mid)
                self._lease_timer(lease_until, mid, lease)
            else:
                m.visible_at = visible_at
                lq.delayed.add(mid)
                heapq.heappush(self._delay_timers, (visible_at, seq, mid))
        else:
            # A message is ready from its push, or from the end of its last delay.
            ready_at = visible_at if visible_at > 0 else enqueued_at
            self._restoring.append(
                (ready_at, seq, queue, enqueued_at, origin, priority, deadline, group)
            )
            self.ready_ids[id_key(mid)] = queue
        if seq >= self.next_seq:
            self.next_seq = seq + 1

    def finish_restore(self) -> None:
        """Queues restored ready messages in the order they became ready.

        Live, a message joins the tail of its UUID queue when it is pushed, when its
        delay ends (`wake` takes them in (visible_at, seq) order, before a push at the
        same moment) or when it is moved to a dead-letter queue (its `enqueued_at` is the
        move). A requeue or a move gives the message a fresh seq, so among messages ready
        at the same moment seq is the order they joined in. Sorting by (that moment, seq)
        rebuilds the live order, of each priority and of the messages with a deadline.
        A FIFO group's messages are in seq order whatever the order they join in.
        """
        self._restoring.sort(key=lambda r: (r[0], r[1]))
        for _, seq, queue, enqueued_at, origin, priority, deadline, group in self._restoring:
            lq = self.queues[queue]
            if group is not None:
                lq.join_group(group, seq, enqueued_at)
            elif priority or deadline:
                self._join(lq, queue, seq, enqueued_at, priority, deadline)
            else:
                lq.ready.append(seq, enqueued_at)
            if origin is not None:
                lq.origins[seq] = origin
        self._restoring.clear()

    def restore_dedup(self, mid: str, queue: str, until: float) -> None:
        self.dedup[mid] = (queue, until)
        heapq.heappush(self._dedup_heap, (until, mid))

    # ---- planners: decide, apply, and return the ops to persist --------------------------
    def holder(self, mid: str) -> str | None:
        """The queue that holds message `mid` on this node, or None."""
        m = self.hot.get(mid)
        if m is not None:
            return m.queue
        return self.ready_ids.get(id_key(mid))

    def is_duplicate(self, mid: str, now: float) -> bool:
        """Whether a push of `mid` repeats one already stored or inside its dedup window."""
        return self.holder(mid) is not None or self.in_dedup_window(mid, now)

    def in_dedup_window(self, mid: str, now: float) -> bool:
        """Whether a dedup record still keeps `mid` (stored or gone)."""
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
        # The caller has checked that `msg_id` is not stored (holder / is_duplicate).
        [op] = self.push_many(queue, [(msg_id, body, content_type, dedup_window_s)], now=now)
        return op

    def push_many(
        self,
        queue: str,
        messages: Iterable[tuple[str, bytes, str | None, float]],
        *,
        now: float = 0.0,
    ) -> list[Push]:
        """Pushes messages (id, body, content type, dedup window in seconds or 0) in
        order, all arriving at `now`. The caller has checked that none is stored."""
        self.wake(now)  # what became ready before now queues ahead of these messages
        apply_push, write = self._apply_push, self.rows.write  # apply(op), inlined
        ops: list[Push] = []
        for mid, body, content_type, window in messages:
            op = Push(
                queue, mid, self.next_seq, body, content_type, now, now + window if window else 0.0
            )
            apply_push(op)
            write(op)
            ops.append(op)
        return ops

    def push_options(
        self,
        queue: str,
        messages: Iterable[tuple[Any, ...]],
        *,
        now: float = 0.0,
    ) -> list[Push]:
        """As `push_many`, each message with its delivery options too: (id, body, content
        type, dedup window, priority, deadline or 0, delay in seconds, attributes, FIFO
        group or None, tie token or None: these two may be left out)."""
        self.wake(now)
        ops: list[Push] = []
        for m in messages:
            mid, body, content_type, window, priority, deadline, delay_s, attrs = m[:8]
            group = m[8] if len(m) > 8 else None
            tie = m[9] if len(m) > 9 else None
            visible_at = now + delay_s if delay_s > 0 else 0.0
            options = (
                (priority, deadline, visible_at, attrs, group, tie)
                if priority
                or deadline
                or visible_at
                or attrs is not None
                or group is not None
                or tie is not None
                else None
            )
            op = Push(
                queue,
                mid,
                self.next_seq,
                body,
                content_type,
                now,
                now + window if window else 0.0,
                options,
            )
            self.apply(op)
            ops.append(op)
        return ops

    def _take_ready(
        self,
        queue: str,
        limit: int,
        now: float,
        retention_s: float | None,
        ops: list[Op],
        deliver: Callable[[int, Row], tuple[Op, Taken]],
        min_priority: int = 0,
        once: bool = False,
    ) -> list[Taken]:
        """Takes up to `limit` ready messages from the head, reading their rows, and
        drops those past retention on the way. `deliver` makes the op of each message
        taken (this applies it) and what the caller gets. `once`: at most one message
        of each FIFO group (a lease busies its group)."""
        lq = self.queues.get(queue)
        out: list[Taken] = []
        if lq is None:
            return out
        self.wake(now)
        if lq.groups:
            return self._take_groups(
                lq, queue, limit, now, retention_s, ops, deliver, min_priority, once
            )
        if lq.placed or min_priority:
            return self._take_ordered(
                lq, queue, limit, now, retention_s, ops, deliver, min_priority
            )
        ready = lq.ready
        head, end = ready.head, len(ready.seqs)
        if head == end:
            return out
        # Decide from the times in memory which messages go, then read their rows.
        stop = min(end, head + limit)
        oldest = now - retention_s if retention_s is not None else None
        expired: set[int] | None = None  # those past retention
        if oldest is None or min(ready.times[head:stop]) >= oldest:
            seqs = ready.seqs[head:stop].tolist()  # nothing to drop
        else:
            plan = self._plan_with_retention(ready, limit, oldest)
            seqs = [seq for seq, _ in plan]
            expired = {seq for seq, gone in plan if gone}
        rows = self._rows(seqs)
        appliers, write = _APPLIERS, self.rows.write  # apply(op), inlined
        for seq in seqs:  # in order: each one is at the head when applied
            row = rows[seq]
            if expired is not None and seq in expired:
                op: Op = Remove(queue, row.id, seq)
            else:
                op, taken = deliver(seq, row)
                out.append(taken)
            appliers[type(op)](self, op)
            write(op)
            ops.append(op)
        return out

    def _take_ordered(
        self,
        lq: LocalQueue,
        queue: str,
        limit: int,
        now: float,
        retention_s: float | None,
        ops: list[Op],
        deliver: Callable[[int, Row], tuple[Op, Taken]],
        min_priority: int,
    ) -> list[Taken]:
        """`_take_ready` of a queue with priorities or deadlines: the ready messages in
        delivery order (LocalQueue.ordered), of priority `min_priority` or more; those
        past their deadline (dropped, counted expired) or retention go on the way."""
        oldest = now - retention_s if retention_s is not None else None
        plan: list[tuple[int, int]] = []  # (seq, 0 deliver / 1 retention / 2 deadline)
        wanted = 0
        gseq = lq.gseq
        for seq, enqueued_at, priority, deadline in lq.ordered():
            if priority < min_priority or wanted >= limit or len(plan) >= limit + 10_000:
                break
            if seq in gseq:  # FIFO groups' messages come last, and go by _take_groups
                break
            if deadline and deadline <= now:
                plan.append((seq, 2))
            elif oldest is not None and enqueued_at < oldest:
                plan.append((seq, 1))
            else:
                plan.append((seq, 0))
                wanted += 1
        return self._carry_out(queue, plan, ops, deliver)

    def _carry_out(
        self,
        queue: str,
        plan: list[tuple[int, int]],
        ops: list[Op],
        deliver: Callable[[int, Row], tuple[Op, Taken]],
    ) -> list[Taken]:
        """Applies a take's plan, in order: (seq, 0) is delivered, (seq, 1) dropped past
        retention, (seq, 2) dropped past its deadline (counted expired)."""
        out: list[Taken] = []
        if not plan:
            return out
        rows = self._rows([seq for seq, _ in plan])
        for seq, why in plan:
            row = rows[seq]
            if why:
                op: Op = Remove(queue, row.id, seq, why == 2)
            else:
                op, taken = deliver(seq, row)
                out.append(taken)
            self.apply(op)
            ops.append(op)
        return out

    def _take_groups(
        self,
        lq: LocalQueue,
        queue: str,
        limit: int,
        now: float,
        retention_s: float | None,
        ops: list[Op],
        deliver: Callable[[int, Row], tuple[Op, Taken]],
        min_priority: int,
        once: bool,
    ) -> list[Taken]:
        """`_take_ready` of a FIFO queue: the heads of the groups that are not busy,
        oldest head first. With `once` (a lease) one message a group; else (a pop) a
        group's next message competes with the other heads in push order. A head past
        retention is dropped and its group's next message considered. Messages outside
        any group (moved here from another queue as its dead-letter queue) follow."""
        out: list[Taken] = []
        if min_priority > 0:  # FIFO messages all have priority 0
            return out
        oldest = now - retention_s if retention_s is not None else None
        plan: list[tuple[int, int]] = []  # (seq, 0 deliver / 1 retention)
        wanted = 0
        groups, gseq = lq.groups, lq.gseq
        merge: list[tuple[int, str, int]] = []  # (seq, group, index in the group)
        heads = lq.free_groups()
        head = next(heads, None)
        while wanted < limit and len(plan) < limit + 10_000:
            if head is not None and (not merge or head[0] < merge[0][0]):
                (seq, group), i = head, 0
                head = next(heads, None)
            elif merge:
                seq, group, i = heapq.heappop(merge)
            else:
                break
            dq = groups[group]
            if oldest is not None and gseq[seq][1] < oldest:
                plan.append((seq, 1))
            else:
                plan.append((seq, 0))
                wanted += 1
                if once:
                    continue
            if i + 1 < len(dq):
                heapq.heappush(merge, (dq[i + 1], group, i + 1))
        out = self._carry_out(queue, plan, ops, deliver)
        if wanted < limit and (lq.ready or lq.placed):
            out += self._take_ordered(
                lq, queue, limit - wanted, now, retention_s, ops, deliver, min_priority
            )
        return out

    @staticmethod
    def _plan_with_retention(
        ready: ReadyQueue, limit: int, oldest: float
    ) -> list[tuple[int, bool]]:
        """(seq, past retention) from the head until `limit` are not past it."""
        plan: list[tuple[int, bool]] = []
        wanted, i, n = 0, 0, len(ready)
        while i < n and wanted < limit:
            seq, enqueued_at = ready.at(i)
            expired = enqueued_at < oldest
            plan.append((seq, expired))
            wanted += not expired
            i += 1
        return plan

    def _rows(self, seqs: Sequence[int]) -> dict[int, Row]:
        rows = self.rows.read(seqs)
        if len(rows) != len(seqs):
            missing = [s for s in seqs if s not in rows]
            raise AssertionError(f"storage lost the rows of ready messages {missing[:5]}")
        return rows

    def pop(
        self,
        queue: str,
        limit: int,
        *,
        now: float = 0.0,
        retention_s: float | None = None,
        min_priority: int = 0,
    ) -> tuple[list[Taken], list[Op]]:
        """Removes up to `limit` ready messages from the head of this node's UUID queue.

        Returns the messages and every op to persist (their removals, and the removal
        of any message found past its retention on the way).
        """

        def pop_one(seq: int, row: Row) -> tuple[Op, Taken]:
            taken = Taken(row[0], row[1], row[2], row[3], None, row[4], row[5], row.group, row.tie)
            return Remove(queue, row.id, seq), taken

        ops: list[Op] = []
        got = self._take_ready(queue, limit, now, retention_s, ops, pop_one, min_priority)
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
        min_priority: int = 0,
    ) -> tuple[list[Taken], list[Op]]:
        """Leases up to `limit` ready messages (each Taken carries its token) and
        returns the ops to persist."""
        until = now + visibility_s

        def lease_one(seq: int, row: Row) -> tuple[Op, Taken]:
            token, count = new_token(), row.receive_count + 1
            taken = Taken(row[0], row[1], row[2], count, token, row[4], row[5], row.group, row.tie)
            return Lease(queue, row.id, seq, token, until, count), taken

        ops: list[Op] = []
        got = self._take_ready(
            queue, limit, now, retention_s, ops, lease_one, min_priority, once=True
        )
        return got, ops

    def current_lease(self, queue: str, mid: str, token: str, now: float) -> StoredMessage | None:
        """The message if `token` is its lease and the lease has not run out by `now`."""
        m = self.hot.get(mid)
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
        m = self.hot.get(mid)
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
            new_seq = m.seq if m.group is not None else self.next_seq
            op = Requeue(queue, mid, m.seq, now + delay_s, new_seq)
        self.apply(op)
        if type(op) is Requeue:
            self.wake(now)
        return op

    def delays_due(self, now: float) -> bool:
        """Whether some delayed message may be due by `now` (`wake` would look)."""
        timers = self._delay_timers
        return bool(timers) and timers[0][0] <= now

    def dedup_due(self, now: float) -> bool:
        """Whether some dedup record's window ended before `now` (`forget_dedup` would act)."""
        heap = self._dedup_heap
        return bool(heap) and heap[0][0] < now

    def wake(self, now: float) -> set[str]:
        """Delayed messages whose time has come become ready; returns their queues."""
        timers, hot = self._delay_timers, self.hot
        woken: set[str] = set()
        while timers and timers[0][0] <= now:
            when, _, mid = heapq.heappop(timers)
            m = hot.get(mid)
            if m is None or m.lease is not None or m.visible_at != when:
                continue
            lq = self.queues[m.queue]
            if mid in lq.delayed:
                self._cool(lq, mid, m)
                woken.add(m.queue)
        return woken

    def due_leases(self, now: float, limit: int = 10_000) -> list[tuple[str, str, str]]:
        """(queue, id, token) of leases that ran out by `now`, oldest first.

        Takes them off the timer heap: the monitor requeues each, or hands it back
        with `recheck` when it cannot yet.
        """
        timers, hot = self._lease_timers, self.hot
        out: list[tuple[str, str, str]] = []
        while timers and timers[0][0] <= now and len(out) < limit:
            when, n, leases = heapq.heappop(timers)
            self._close_lease_timer()  # no lease joins an entry off the heap
            due = list(leases)
            while timers and timers[0][0] == when:
                due += heapq.heappop(timers)[2]
            due.sort()  # leases ending at the same moment: by id
            for i, (mid, token) in enumerate(due):
                if len(out) >= limit:
                    heapq.heappush(timers, (when, n, due[i:]))  # the rest, next time
                    break
                m = hot.get(mid)
                if m is not None and m.lease == token and m.lease_until == when:
                    out.append((m.queue, mid, token))
        return out

    def recheck(self, mid: str) -> None:
        """Puts a leased message's expiry back on the timer heap."""
        m = self.hot.get(mid)
        if m is not None and m.lease is not None:
            self._lease_timer(m.lease_until, mid, m.lease)

    def _lease_timer(self, until: float, mid: str, token: str) -> None:
        """Schedules lease `token` of `mid` to be looked at when it ends, at `until`."""
        last = self._last_lease_timer
        if last is not None:
            if last[0] == until:
                last[2].append((mid, token))
                return
            self._close_lease_timer()
        pairs = self._lease_timer_pairs
        if pairs > self._lease_timers_max and pairs > self.lease_timers_floor:
            self._compact_lease_timers()
        self._lease_timer_n += 1
        entry = (until, self._lease_timer_n, [(mid, token)])
        heapq.heappush(self._lease_timers, entry)
        self._last_lease_timer = entry

    def _close_lease_timer(self) -> None:
        """No more leases join the last entry: its pairs are counted."""
        last = self._last_lease_timer
        if last is not None:
            self._lease_timer_pairs += len(last[2])
            self._last_lease_timer = None

    def _compact_lease_timers(self) -> None:
        """Rebuilds the lease timer heap with the pairs still live (the message still
        holds that lease, ending at that entry's time): the pairs due_leases would skip
        are dropped, and entries keep their (until, n), so due_leases hands out the same
        leases in the same order as before."""
        self._close_lease_timer()
        hot = self.hot
        kept: list[tuple[float, int, list[tuple[str, str]]]] = []
        pairs = 0
        for entry in self._lease_timers:
            when, _, leases = entry
            live = [
                (mid, token)
                for mid, token in leases
                if (m := hot.get(mid)) is not None and m.lease == token and m.lease_until == when
            ]
            if live:
                if len(live) < len(leases):
                    leases[:] = live
                kept.append(entry)
                pairs += len(live)
        heapq.heapify(kept)
        self._lease_timers = kept
        self._lease_timer_pairs = pairs
        self._lease_timers_max = 2 * pairs

    def next_timer(self) -> float | None:
        """When the earliest lease expiry or delay end is due (stale entries included)."""
        heads = [h[0][0] for h in (self._lease_timers, self._delay_timers) if h]
        return min(heads) if heads else None

    def expired_by_retention(
        self, queue: str, now: float, retention_s: float, limit: int = 10_000
    ) -> list[Remove]:
        """Removes ready messages at the head of the UUID queue older than `retention_s`.

        A queue is looked at again only once its head can have expired: the check records
        when that is (`LocalQueue.retention_due`), so a sweep over many queues whose heads
        are young costs a comparison each. A message that becomes ready again with an older
        `enqueued_at` (a requeue, a delay's end) resets that time.
        """
        lq = self.queues.get(queue)
        ops: list[Remove] = []
        if lq is None or now < lq.retention_due:
            return ops
        if lq.placed or lq.gseq:
            return self._expired_by_retention_placed(lq, queue, now, retention_s, limit)
        oldest, ready = now - retention_s, lq.ready
        n = 0
        while n < len(ready) and n < limit and ready.at(n)[1] < oldest:
            n += 1
        if n == 0:
            # Pushes arrive in time order, so nothing here expires before the head does.
            lq.retention_due = (ready.at(0)[1] if ready else now) + retention_s
            return ops
        seqs = [ready.at(i)[0] for i in range(n)]
        rows = self._rows(seqs)
        for seq in seqs:
            op = Remove(queue, rows[seq].id, seq)
            self.apply(op)
            ops.append(op)
        return ops

    def _expired_by_retention_placed(
        self, lq: LocalQueue, queue: str, now: float, retention_s: float, limit: int
    ) -> list[Remove]:
        """`expired_by_retention` of a queue with priorities, deadlines or FIFO groups:
        the heads of its ReadyQueues and of its groups, and every message with a
        deadline (a heap is not in time order)."""
        oldest = now - retention_s
        seqs: list[int] = []
        due = now + retention_s
        for rq in (lq.ready, *lq.levels.values()):
            i = 0
            while i < len(rq) and len(seqs) < limit and rq.at(i)[1] < oldest:
                seqs.append(rq.at(i)[0])
                i += 1
            if i < len(rq):
                due = min(due, rq.at(i)[1] + retention_s)
        gseq = lq.gseq
        for group in sorted(lq.groups):
            for seq in lq.groups[group]:
                enqueued_at = gseq[seq][1]
                if enqueued_at >= oldest or len(seqs) >= limit:
                    due = min(due, enqueued_at + retention_s)
                    break
                seqs.append(seq)
        for _, deadline, _, seq in lq.timed:
            placed = lq.placed.get(seq)
            if placed is None or placed[1] != deadline:
                continue
            if placed[2] < oldest and len(seqs) < limit:
                seqs.append(seq)
            else:
                due = min(due, placed[2] + retention_s)
        ops: list[Remove] = []
        if not seqs:
            lq.retention_due = due
            return ops
        rows = self._rows(seqs)
        for seq in seqs:
            op = Remove(queue, rows[seq].id, seq)
            self.apply(op)
            ops.append(op)
        return ops

    def deadlines_due(self, now: float) -> bool:
        """Whether some ready message may be past its deadline by `now`."""
        heap = self._deadlines
        return bool(heap) and heap[0][0] <= now

    def expired_by_deadline(self, now: float, limit: int = 10_000) -> list[Remove]:
        """Removes ready messages whose deadline is `now` or earlier (counted expired)."""
        heap = self._deadlines
        ops: list[Remove] = []
        found: list[tuple[str, int]] = []
        while heap and heap[0][0] <= now and len(found) < limit:
            deadline, seq, queue = heapq.heappop(heap)
            lq = self.queues.get(queue)
            placed = lq.placed.get(seq) if lq is not None else None
            if placed is not None and placed[1] == deadline:
                found.append((queue, seq))
        if not found:
            return ops
        rows = self._rows([seq for _, seq in found])
        for queue, seq in found:
            op = Remove(queue, rows[seq].id, seq, True)
            self.apply(op)
            ops.append(op)
        return ops

    def cancel(self, queue: str, mid: str) -> str:
        """Cancels message `mid` of `queue` if it is ready or delayed. Its verdict:
        "cancelled", "leased", "again" (cancelled before, the record kept) or "unknown"."""
        m = self.hot.get(mid)
        if m is not None:
            if m.queue != queue:
                return "unknown"
            if m.lease is not None:
                return "leased"
            self.apply(Cancel(queue, mid, m.seq))
            return "cancelled"
        if self.ready_ids.get(id_key(mid)) != queue:
            return "again" if self.cancelled.get(mid) == queue else "unknown"
        lq = self.queues[queue]
        for seq, *_ in lq.ordered():
            if self._rows([seq])[seq].id == mid:
                break
        else:  # pragma: no cover - the index and the queue disagree
            raise AssertionError(f"message {mid} is indexed as ready in {queue} but is not there")
        self.apply(Cancel(queue, mid, seq))
        return "cancelled"

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
        seqs: tuple[int, ...] = ()
        if lq is not None:
            hot = self.hot
            seqs = (
                *lq.ready,
                *lq.placed,
                *lq.gseq,
                *(hot[mid].seq for mid in (*lq.leased, *lq.delayed)),
            )
        op = Purge(queue, seqs)
        self.apply(op)
        return op

    # ---- queries ------------------------------------------------------------------------
    def stored(self) -> int:
        """How many messages this node stores, in every queue."""
        return len(self.ready_ids) + len(self.hot)

    def lease_timer_pairs(self) -> int:
        """The (id, token) pairs on the lease timer heap, live or stale (for tests and
        diagnostics; O(entries))."""
        return sum(len(leases) for _, _, leases in self._lease_timers)

    def some_id(self, queue: str) -> str | None:
        """The id of some message of `queue` on this node (its firstUUID if it has one)."""
        lq = self.queues.get(queue)
        if lq is None or not lq.holds():
            return None
        if lq.first_uuid is not None:
            return lq.first_uuid
        for mid in (*lq.leased, *lq.delayed):
            return mid
        seq = next(lq.ordered())[0]
        return self._rows([seq])[seq].id

    def find(self, mid: str) -> MessageView | None:
        """Everything about message `mid`: for tests and diagnostics (reads storage;
        O(queue length) for a ready message)."""
        m = self.hot.get(mid)
        if m is not None:
            row = self._rows([m.seq])[m.seq]
            return MessageView(
                m.queue,
                m.seq,
                row.body,
                row.content_type,
                m.enqueued_at,
                m.receive_count,
                m.lease,
                m.lease_until,
                m.visible_at,
                m.origin,
            )
        queue = self.ready_ids.get(id_key(mid))
        if queue is None:
            return None
        lq = self.queues[queue]
        for seq, enqueued_at, *_ in lq.ordered():
            row = self._rows([seq])[seq]
            if row.id == mid:
                origin = lq.origins.get(seq)
                return MessageView(
                    queue,
                    seq,
                    row.body,
                    row.content_type,
                    enqueued_at,
                    row.receive_count,
                    None,
                    0.0,
                    0.0,
                    origin,
                )
        raise AssertionError(f"message {mid} is indexed as ready in {queue} but is not there")

    def ready_list(self, queue: str) -> list[str]:
        """The ids of the ready messages of `queue` in order (reads storage)."""
        lq = self.queues.get(queue)
        if lq is None or not lq.ready_count():
            return []
        seqs = [seq for seq, *_ in lq.ordered()]
        rows = self._rows(seqs)
        return [rows[seq].id for seq in seqs]

    def depth(self, queue: str) -> int:
        """Every message of `queue` this node holds (ready, leased or delayed)."""
        lq = self.queues.get(queue)
        return lq.holds() if lq is not None else 0

    def counts(self, queue: str) -> dict[str, int]:
        lq = self.queues.get(queue)
        if lq is None:
            ready = leased = delayed = 0
        else:
            ready, leased, delayed = lq.ready_count(), len(lq.leased), len(lq.delayed)
        return {
            "ready": ready,
            "in_flight": leased,
            "delayed": delayed,
            "dead_lettered": self.dead_lettered.get(queue, 0),
            "expired": self.expired.get(queue, 0),
        }


# How `NodeState.apply` applies each kind of op.
_APPLIERS: dict[type, Callable[[NodeState, Any], None]] = {
    Push: NodeState._apply_push,
    Lease: NodeState._apply_lease,
    Remove: NodeState._apply_remove,
    Cancel: NodeState._apply_remove,
    Extend: NodeState._apply_extend,
    Requeue: NodeState._apply_requeue,
    DeadLetter: NodeState._apply_dead_letter,
    Purge: NodeState._apply_purge,
    ForgetDedup: NodeState._apply_forget_dedup,
    Tied: NodeState._apply_tied,
    Claimed: NodeState._apply_claimed,
    Untied: NodeState._apply_untied,
    Register: NodeState._apply_register,
    Unregister: NodeState._apply_unregister,
    CreateQueue: NodeState._apply_create,
    DropQueue: NodeState._apply_drop,
    CreateTopic: NodeState._apply_create_topic,
    DropTopic: NodeState._apply_drop_topic,
    Subscribe: NodeState._apply_subscribe,
    Unsubscribe: NodeState._apply_unsubscribe,
}
