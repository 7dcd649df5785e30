"""Commands: every change to a node's queue state, as a value that replays the same way.

A node never changes its `NodeState` directly. It builds a *command* (a small named
tuple holding everything the change depends on: the time, the queue's settings, the
lease tokens to hand out) and runs it with `apply_command`, which checks it against the
state, applies the ops it leads to and returns its result. Nothing a command does
depends on the clock, on randomness or on anything outside the command and the state,
so applying the same commands in the same order to two equal states gives equal states
and equal results. That is what lets a replica group agree: the commands are the
entries of the group's log (`encode_command` / `decode_command` make them bytes), every
member applies them as they commit, and the member that proposed one replies with its
result.

A command that cannot take effect (a message too large, an id in use by another
queue, a queue that exists already) changes nothing and returns the error rather than
raising it: an error is a result like any other, the same on every replica.

    Push        store messages (duplicates and dedup windows decided here)
    Take        pop or lease messages from the head of a UUID queue
    PushTake    a Push, then a lease (a stream waiting with credit: one commit for both)
    Settle      ack, nack or extend leases
    Expire      requeue (or dead-letter) leases that ran out
    Wake        delayed messages whose time has come become ready
    Housekeep   drop messages past retention, forget ended dedup records
    Meta        metadata-owner changes: create, drop, register, unregister; create and
                drop topics, subscribe and unsubscribe queues
    PurgeQueue  drop this node's share of a queue
    DropEmpty   forget an emptied UUID queue (ZDMQ's empty step)
    Tie, Claim, Untie   a tie's record (on the group that owns its token), the first
                claim of one of its copies, its cancel
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import count
from typing import Any, NamedTuple

import msgpack

from zdmq.errors import (
    MessageIdConflict,
    MessageTooLarge,
    QueueExists,
    QueueLimitReached,
    QueueNotFound,
    SubscriptionNotFound,
    TopicExists,
    TopicNotFound,
    ZdmqError,
)
from zdmq.models import QueueSettings
from zdmq.server.state import (
    CreateQueue,
    CreateTopic,
    DeadLetter,
    DropQueue,
    DropTopic,
    NodeState,
    Op,
    Register,
    Remove,
    Requeue,
    Subscribe,
    Taken,
    Tied,
    Unregister,
    Unsubscribe,
    Untied,
)

__all__ = [
    "CancelMessage",
    "Claim",
    "Command",
    "DropEmpty",
    "Expire",
    "Housekeep",
    "Meta",
    "PurgeQueue",
    "Push",
    "PushTake",
    "Settle",
    "Take",
    "Tie",
    "Untie",
    "Wake",
    "apply_command",
    "decode_command",
    "encode_command",
    "lease_tokens",
]


# ---- commands --------------------------------------------------------------------------
class Push(NamedTuple):
    """Stores `items` (id, body, content type, dedup, and optionally priority, deadline,
    delay_s, attributes and a FIFO group: see `push_options`) in `queue`, all arriving
    at `now`.

    Result: per item, whether it was a repeat that stored nothing (an id stored already,
    the same id twice in the batch, or a dedup id inside its window); or the error that
    refused the whole batch (nothing stored).
    """

    queue: str
    items: Sequence[tuple[Any, ...]]
    now: float
    max_message_bytes: int | None = None
    dedup_window_s: float = 0.0


class Take(NamedTuple):
    """Pops (`lease_s` None) or leases for `lease_s` up to `limit` messages from the head
    of this node's UUID queue of `queue`, dropping those past `retention_s` on the way.

    Result: the `Taken` messages; a leased one carries its token, the i-th drawn from
    `token_base` (see `lease_tokens`).
    """

    queue: str
    limit: int
    now: float
    retention_s: float | None = None
    lease_s: float | None = None
    token_base: str = ""
    min_priority: int = 0  # only messages of this priority or more


class PushTake(NamedTuple):
    """A Push, then a Take that leases (`lease_s`) up to `limit` messages of the same
    queue at the same time: a push that a waiting stream's credit takes at once.

    Result: (the Push's result, the `Taken` messages); or the error that refused the
    push (nothing stored, nothing leased).
    """

    queue: str
    items: Sequence[tuple[Any, ...]]
    now: float
    max_message_bytes: int | None
    dedup_window_s: float
    limit: int
    retention_s: float | None
    lease_s: float
    token_base: str
    min_priority: int = 0

    def push(self) -> Push:
        return Push(self.queue, self.items, self.now, self.max_message_bytes, self.dedup_window_s)

    def take(self) -> Take:
        return Take(
            self.queue,
            self.limit,
            self.now,
            self.retention_s,
            self.lease_s,
            self.token_base,
            self.min_priority,
        )


class Settle(NamedTuple):
    """Acks, nacks (`delay_s`; past `max_receives`, a move to `dlq`) or extends (by
    `visibility_s`) the leases (id, token) of `queue`.

    Result: per lease, the op that took effect, or None when the lease had ended (the
    first of ack, nack and expiry wins).
    """

    queue: str
    action: str  # "ack" | "nack" | "extend"
    leases: Sequence[tuple[str, str]]
    now: float
    delay_s: float = 0.0
    visibility_s: float = 0.0
    max_receives: int | None = None
    dlq: str | None = None


class Expire(NamedTuple):
    """Requeues the leases (id, token) of `queue` that ran out by `now` (to `dlq` past
    `max_receives`). Result: the ops that took effect."""

    queue: str
    leases: Sequence[tuple[str, str]]
    now: float
    max_receives: int | None = None
    dlq: str | None = None


class Wake(NamedTuple):
    """Delayed messages due by `now` become ready. Result: the queues that got some."""

    now: float


class Housekeep(NamedTuple):
    """Drops ready messages older than their queue's retention (`retention`: queue ->
    retention_s) and those past their deadline by `now` (counted expired), and forgets
    dedup records whose window ended by `now`. Result: the number of messages dropped."""

    now: float
    retention: Sequence[tuple[str, float]]


MetaOp = (
    CreateQueue
    | DropQueue
    | Register
    | Unregister
    | CreateTopic
    | DropTopic
    | Subscribe
    | Unsubscribe
)


class Meta(NamedTuple):
    """Metadata-owner changes, in order: `CreateQueue` (refused if the queue exists or
    the owner keeps `max_queues` already), `DropQueue` (refused if it does not exist),
    `Register` (a no-op if listed) and `Unregister` (a no-op if not listed); for topics
    `CreateTopic` (refused if the topic exists or the owner keeps `max_queues` topics
    already), `DropTopic` (refused if it does not exist), `Subscribe` (refused if the
    topic does not exist, a no-op if subscribed) and `Unsubscribe` (refused if not
    subscribed). A Meta without ops changes nothing: a publish runs one to read the
    subscriptions as of a commit in the leader's term.

    Result: per op, whether it changed anything; or the error of the first refused
    op (the ops before it took effect, none after it).
    """

    ops: Sequence[MetaOp]
    max_queues: int | None = None


class PurgeQueue(NamedTuple):
    """Drops this node's UUID queue of `queue`, its messages and dedup records. Result:
    how many messages it held."""

    queue: str


class DropEmpty(NamedTuple):
    """Forgets this node's UUID queue of `queue` if it holds nothing (its firstUUID goes
    with it). Result: whether it did."""

    queue: str


class CancelMessage(NamedTuple):
    """Deletes message `id` of `queue` unless it is leased now. Result: "cancelled",
    "again" (cancelled before: its id is among the last CANCELS_KEPT cancelled),
    "leased" or "unknown" (never stored, or delivered)."""

    queue: str
    id: str


class Tie(NamedTuple):
    """Records tie `token` with its copies (queue, id), before any copy is stored.
    Result: True, or False when the token is recorded already (a retry)."""

    token: str
    copies: Sequence[tuple[str, str]]
    now: float


class Claim(NamedTuple):
    """Copy `id` of tie `token` claims its delivery; the first claim wins. Result: "won"
    (also for the winner's claim again), "lost" (another copy won, or the tie was
    cancelled) or "unknown" (no such tie)."""

    token: str
    id: str


class Untie(NamedTuple):
    """Cancels tie `token`: no copy of it wins a claim from now on. Result: (copies, the
    copy that had won or None), or None when there is no such tie."""

    token: str


Command = (
    Push
    | Take
    | PushTake
    | Settle
    | Expire
    | Wake
    | Housekeep
    | Meta
    | PurgeQueue
    | DropEmpty
    | CancelMessage
    | Tie
    | Claim
    | Untie
)


def lease_tokens(base: str) -> Callable[[], str]:
    """The lease tokens of one `Take`: `base` followed by 4 hex digits counting up, so
    every replica hands out the same tokens. `base` is random, drawn by the proposer."""
    return (f"{base}{i:04x}" for i in count()).__next__


# ---- applying --------------------------------------------------------------------------
def apply_command(state: NodeState, cmd: Command) -> Any:
    """Applies `cmd` to `state` and returns its result (an error is returned, not raised).

    The state's clock never goes back: a command stamped earlier than the latest time the
    state has seen (another member's clock, a clock stepped back) runs at that latest
    time. So delays end, leases run out and messages queue up in one order on every
    replica, whichever members' clocks stamped the commands.
    """
    now = getattr(cmd, "now", None)
    if now is not None:
        if now < state.clock:
            cmd = cmd._replace(now=state.clock)  # type: ignore[call-arg]
        else:
            state.clock = now
    return _APPLY[type(cmd)](state, cmd)


def _push(state: NodeState, c: Push) -> list[bool] | ZdmqError:
    queue, items, now, limit = c.queue, c.items, c.now, c.max_message_bytes
    holder = state.holder
    holders = [holder(item[0]) for item in items]
    fresh = holders.count(None) == len(holders)
    # Check the whole batch before changing anything: a refused batch stores nothing.
    if not fresh or (limit is not None and max([len(i[1]) for i in items]) > limit):
        for item, held in zip(items, holders, strict=True):  # the first problem
            mid, body, _, dedup = item[:4]
            if limit is not None and len(body) > limit:
                return MessageTooLarge(
                    f"message of {len(body)} bytes is over queue {queue!r}'s {limit}-byte limit"
                )
            if held is not None and held != queue and not dedup:
                return MessageIdConflict(f"message id {mid} is in use by another queue")
    plain = not any([len(i) > 4 and (i[4] or i[5] or i[6] or i[7] or any(i[8:])) for i in items])
    if fresh and not any([i[3] for i in items]) and len({i[0] for i in items}) == len(items):
        # The common case: new ids, each once, no dedup windows.
        if plain:
            state.push_many(queue, [(i[0], i[1], i[2], 0.0) for i in items], now=now)
        else:
            state.push_options(queue, [(*i[:3], 0.0, *_options(i)) for i in items], now=now)
        return [False] * len(items)
    duplicate: list[bool] = []
    stored: set[str] = set()  # the same id twice in one batch is stored once
    for item, held in zip(items, holders, strict=True):
        mid, body, content_type, dedup = item[:4]
        if held is not None or mid in stored or (dedup and state.in_dedup_window(mid, now)):
            duplicate.append(True)  # a retry or the same id twice: store it once
            continue
        duplicate.append(False)
        stored.add(mid)
        window = c.dedup_window_s if dedup else 0.0
        state.push_options(queue, [(mid, body, content_type, window, *_options(item))], now=now)
    return duplicate


def _options(
    item: Sequence[Any],
) -> tuple[int, float, float, str | None, str | None, str | None]:
    """(priority, deadline, delay_s, attributes, group, tie) of a Push item (defaults if
    it has none)."""
    if len(item) == 4:
        return 0, 0.0, 0.0, None, None, None
    group = item[8] if len(item) > 8 else None
    return item[4], item[5], item[6], item[7], group, item[9] if len(item) > 9 else None


def _take(state: NodeState, c: Take) -> list[Taken]:
    if c.lease_s is None:
        popped, _ = state.pop(
            c.queue, c.limit, now=c.now, retention_s=c.retention_s, min_priority=c.min_priority
        )
        return popped
    leased, _ = state.lease(
        c.queue,
        c.limit,
        now=c.now,
        visibility_s=c.lease_s,
        new_token=lease_tokens(c.token_base),
        retention_s=c.retention_s,
        min_priority=c.min_priority,
    )
    return leased


def _push_take(state: NodeState, c: PushTake) -> tuple[list[bool], list[Taken]] | ZdmqError:
    pushed = _push(state, c.push())
    if isinstance(pushed, ZdmqError):
        return pushed
    return pushed, _take(state, c.take())


def _settle(state: NodeState, c: Settle) -> list[Op | None]:
    queue, now = c.queue, c.now
    out: list[Op | None] = []
    for mid, token in c.leases:
        if c.action == "ack":
            out.append(state.ack(queue, mid, token, now))
        elif c.action == "extend":
            out.append(state.extend(queue, mid, token, now, c.visibility_s))
        else:
            out.append(
                state.requeue(
                    queue,
                    mid,
                    token,
                    now,
                    delay_s=c.delay_s,
                    max_receives=c.max_receives,
                    dead_letter_queue=c.dlq,
                )
            )
    return out


def _expire(state: NodeState, c: Expire) -> list[Requeue | DeadLetter]:
    out: list[Requeue | DeadLetter] = []
    for mid, token in c.leases:
        op = state.requeue(
            c.queue,
            mid,
            token,
            c.now,
            expired=True,
            max_receives=c.max_receives,
            dead_letter_queue=c.dlq,
        )
        if op is not None:
            out.append(op)
    return out


def _wake(state: NodeState, c: Wake) -> set[str]:
    return state.wake(c.now)


def _housekeep(state: NodeState, c: Housekeep) -> int:
    dropped: list[Remove] = []
    for queue, retention_s in c.retention:
        dropped += state.expired_by_retention(queue, c.now, retention_s)
    dropped += state.expired_by_deadline(c.now)
    state.forget_dedup(c.now)
    return len(dropped)


def _cancel(state: NodeState, c: CancelMessage) -> str:
    return state.cancel(c.queue, c.id)


def _meta(state: NodeState, c: Meta) -> list[bool] | ZdmqError:
    done: list[bool] = []
    for op in c.ops:
        if isinstance(op, CreateTopic | DropTopic | Subscribe | Unsubscribe):
            refused = _topic_op(state, op, c.max_queues)
            if isinstance(refused, ZdmqError):
                return refused
            if refused:
                state.apply(op)
            done.append(refused)
            continue
        meta = state.meta.get(op.queue)
        if type(op) is CreateQueue:
            if meta is not None:
                return QueueExists(f"queue {op.queue!r} already exists")
            if c.max_queues is not None and len(state.meta) >= c.max_queues:
                return QueueLimitReached(
                    f"this node keeps the metadata of {len(state.meta)} queues, its limit"
                )
        elif type(op) is DropQueue:
            if meta is None:
                return QueueNotFound(f"queue {op.queue!r} does not exist")
        elif isinstance(op, Register):
            if meta is None or op.node in meta.nodes:
                done.append(False)
                continue
        elif isinstance(op, Unregister) and (meta is None or op.node not in meta.nodes):
            done.append(False)
            continue
        state.apply(op)
        done.append(True)
    return done


def _topic_op(
    state: NodeState, op: CreateTopic | DropTopic | Subscribe | Unsubscribe, max_topics: int | None
) -> bool | ZdmqError:
    """Whether a topic op changes anything (True: apply it), or the error refusing it."""
    topic = state.topics.get(op.topic)
    if type(op) is CreateTopic:
        if topic is not None:
            return TopicExists(f"topic {op.topic!r} already exists")
        if max_topics is not None and len(state.topics) >= max_topics:
            return QueueLimitReached(
                f"this node keeps the metadata of {len(state.topics)} topics, its limit"
            )
        return True
    if topic is None:
        return TopicNotFound(f"topic {op.topic!r} does not exist")
    if type(op) is Subscribe:
        return op.queue not in topic.subscriptions
    if type(op) is Unsubscribe and op.queue not in topic.subscriptions:
        return SubscriptionNotFound(f"queue {op.queue!r} is not subscribed to topic {op.topic!r}")
    return True


def _purge(state: NodeState, c: PurgeQueue) -> int:
    n = state.depth(c.queue)
    state.purge(c.queue)
    return n


def _drop_empty(state: NodeState, c: DropEmpty) -> bool:
    lq = state.queues.get(c.queue)
    if lq is None or lq.holds():
        return False
    del state.queues[c.queue]
    return True


def _tie(state: NodeState, c: Tie) -> bool:
    if c.token in state.ties:
        return False
    state.apply(Tied(c.token, tuple((q, mid) for q, mid in c.copies), c.now))
    return True


def _claim(state: NodeState, c: Claim) -> str:
    return state.claim(c.token, c.id)


def _untie(state: NodeState, c: Untie) -> tuple[list[list[str]], str | None] | None:
    tie = state.ties.get(c.token)
    if tie is None:
        return None
    if not tie.cancelled:
        state.apply(Untied(c.token))
    return [list(copy) for copy in tie.copies], tie.winner


_APPLY: dict[type, Callable[[NodeState, Any], Any]] = {
    Push: _push,
    Take: _take,
    Settle: _settle,
    Expire: _expire,
    Wake: _wake,
    Housekeep: _housekeep,
    Meta: _meta,
    PurgeQueue: _purge,
    DropEmpty: _drop_empty,
    CancelMessage: _cancel,
    Tie: _tie,
    Claim: _claim,
    Untie: _untie,
    PushTake: _push_take,  # (new kinds go last: a kind's tag is its place here)
}


# ---- the wire (a log entry) ------------------------------------------------------------
# A command is a msgpack array: its tag, then its fields in order. Meta's ops are
# arrays too (their tag, then their fields; a queue's settings as a map).
_TAGS: dict[type, int] = {kind: i for i, kind in enumerate(_APPLY, start=1)}
_KINDS: dict[int, type] = {i: kind for kind, i in _TAGS.items()}
_OP_TAGS: dict[type, int] = {
    CreateQueue: 1,
    DropQueue: 2,
    Register: 3,
    Unregister: 4,
    CreateTopic: 5,
    DropTopic: 6,
    Subscribe: 7,
    Unsubscribe: 8,
}
_OP_KINDS: dict[int, type] = {i: kind for kind, i in _OP_TAGS.items()}


def encode_command(cmd: Command) -> bytes:
    if type(cmd) is Meta:
        ops = [_encode_op(op) for op in cmd.ops]
        return msgpack.packb([_TAGS[Meta], ops, cmd.max_queues])
    return msgpack.packb([_TAGS[type(cmd)], *cmd])


def decode_command(data: bytes) -> Command:
    """The command `encode_command` made; ValueError if `data` is not one."""
    try:
        tag, *fields = msgpack.unpackb(data, use_list=False)
        kind = _KINDS[tag]
        if kind is Meta:
            ops, max_queues = fields
            return Meta(tuple(_decode_op(op) for op in ops), max_queues)
        return kind(*fields)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise ValueError(f"not a command: {type(e).__name__}: {e}") from None


def _encode_op(op: MetaOp) -> list[Any]:
    if type(op) is CreateQueue:
        return [
            _OP_TAGS[CreateQueue],
            op.queue,
            op.incarnation,
            op.created_at,
            op.settings.to_wire(),
        ]
    return [_OP_TAGS[type(op)], *op]


def _decode_op(raw: Sequence[Any]) -> MetaOp:
    tag, *fields = raw
    kind = _OP_KINDS[tag]
    if kind is CreateQueue:
        queue, incarnation, created_at, settings = fields
        return CreateQueue(queue, incarnation, created_at, QueueSettings(**settings))
    return kind(*fields)
