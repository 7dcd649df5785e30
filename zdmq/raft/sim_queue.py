"""The queue on top of the simulated Raft group (zdmq/raft/sim.py): clients, and the
checker of what they were told.

Every entry the simulation proposes is a command of zdmq/server/machine.py, and every
simulated node applies the entries it applies to its own `NodeState` (the one a real
member keeps per group), rebuilt from its durable state after a restart or a snapshot
install. Clients push new ids (half of them with a priority, a deadline, a delay or
attributes; some to the FIFO queue `f`, each in one of a few groups), pop and receive
(some with a `min_priority`; some from `f`), ack and nack the leases they hold,
cancel messages and change topics; the proposing node's monitor expires the leases that ran out by
its state and its sweep drops what passed its deadline (as a leader's do). A client's
call is answered when the node it proposed to applies its entry: `ok` with that node's
result; `fail` if another entry took its index (it can then never commit) or no node
took it; unknown if the node went down first.

At the end, once every node applied the same entries (sim.py checks that), the checker
replays them on a fresh `NodeState` and requires:

- every `ok` call's entry is committed, and its result is the one the replay gives at
  that entry (the proposer's state agreed with every other replica's), and no `fail`
  call's entry is committed;
- every node's state equals the replay's, whatever restarts and snapshots it went
  through;
- nothing acknowledged is lost: an id whose push was `ok` is still stored, or an entry
  removed it (a pop, an ack);
- no pop is delivered twice: an id an `ok` pop handed out is never handed out again;
- no ack or cancel is undone: an id whose ack, or cancel, was `ok` is never delivered by
  a call that started after its answer, and is not stored at the end;
- FIFO groups hold: every message a committed pop or receive of `f` hands out is the
  oldest message of its group `f` still stores (by committed push order), and no other
  message of its group is leased or waiting out a nack's delay at that moment: so ok
  deliveries of a group come in push order (a redelivery of the one in flight aside)
  and never two leases of one group are live at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from zdmq.raft.core import CONF_PREFIX
from zdmq.raft.storage import Entry
from zdmq.server.machine import (
    CancelMessage,
    Command,
    Expire,
    Housekeep,
    Meta,
    MetaOp,
    Push,
    PushTake,
    Settle,
    Take,
    Wake,
    apply_command,
    decode_command,
    encode_command,
)
from zdmq.server.state import (
    CreateTopic,
    DropTopic,
    NodeState,
    StoredMessage,
    Subscribe,
    Taken,
    Unsubscribe,
)

__all__ = ["QueueClients", "replay", "state_view"]

QUEUE = "q"
DLQ = "q-dlq"
FIFO = "f"  # a FIFO queue: its messages in GROUPS
GROUPS = ("a", "b", "c")
#: Deliveries after which an ended lease moves the message to the dead-letter queue.
MAX_RECEIVES = 2


def state_view(state: NodeState) -> Any:
    """Everything replicas of one group must agree on, as plain values."""
    seqs = [e[0] for lq in state.queues.values() for e in lq.ordered()]
    seqs += [m.seq for m in state.hot.values()]
    return (
        {
            q: (
                list(lq.ordered()),
                sorted(lq.leased),
                sorted(lq.delayed),
                lq.first_uuid,
                lq.origins,
                {g: list(dq) for g, dq in sorted(lq.groups.items())},
                sorted(lq.busy.items()),
                list(lq.free_groups()),
            )
            for q, lq in state.queues.items()
        },
        {
            mid: [getattr(m, name) for name in StoredMessage.__slots__]
            for mid, m in state.hot.items()
        },
        dict(state.ready_ids),
        {q: (m.incarnation, m.settings, list(m.nodes.items())) for q, m in state.meta.items()},
        dict(state.tombstones),
        {t: (m.created_at, list(m.subscriptions)) for t, m in state.topics.items()},
        dict(state.dedup),
        dict(state.dead_lettered),
        dict(state.expired),
        dict(state.cancelled),
        [(t, r.copies, r.winner, r.cancelled, r.created_at) for t, r in state.ties.items()],
        state.next_seq,
        state.rows.read(sorted(seqs)),
    )


def plain(result: Any) -> Any:
    """A command's result as a value (errors do not compare equal as objects)."""
    return (type(result), str(result)) if isinstance(result, Exception) else result


def is_command(e: Entry) -> bool:
    """Whether `e` carries a command of the state machine (not an empty entry or a
    configuration of the group)."""
    return e.data is not None and not e.data.startswith(CONF_PREFIX)


def replay(entries: list[Entry] | tuple[Entry, ...]) -> NodeState:
    """A state machine that applied `entries` (what a node rebuilds at a start)."""
    state = NodeState()
    for e in entries:
        if is_command(e):
            assert e.data is not None
            apply_command(state, decode_command(e.data))
    return state


def stored_ids(state: NodeState) -> set[str]:
    ids = {mid for mid, _ in state.hot.items()}
    for lq in state.queues.values():
        rows = state.rows.read([e[0] for e in lq.ordered()])
        ids.update(row.id for row in rows.values())
    return ids


@dataclass(slots=True)
class _Call:
    kind: str  # push | push_take | pop | receive | ack | nack | expire | wake | ...
    data: bytes
    cmd: Command
    start: int
    status: str = "invoked"  # then ok | fail | unknown
    end: int = 0
    result: Any = None


@dataclass(slots=True)
class QueueCounts:
    calls: int = 0
    ok: int = 0
    failed: int = 0
    unknown: int = 0
    pushed: int = 0  # ids of ok pushes
    delivered: int = 0  # ids handed out by ok pops and receives
    fifo_delivered: int = 0  # of them, from the FIFO queue
    acked: int = 0  # ids of ok acks that took effect
    cancelled: int = 0  # ok cancels that removed a message
    dead_lettered: int = 0


@dataclass
class QueueClients:
    """The clients of one simulated group's queue; `seed` gives them their own stream,
    so the group's faults are those of the seed without them."""

    seed: int
    rng: random.Random = field(init=False)
    calls: list[_Call] = field(default_factory=list)
    by_data: dict[bytes, int] = field(default_factory=dict)
    #: (node, index) -> [(term, call)] proposed there and not yet answered.
    pending: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)
    #: Leases handed out by ok receives and not yet acked or nacked by a client.
    leases: list[tuple[str, str, str]] = field(default_factory=list)
    ids: int = 0
    #: The deadline each id was pushed with (a message may vanish once it passes).
    deadlines: dict[str, float] = field(default_factory=dict)
    cancels: set[str] = field(default_factory=set)
    fifo_ids: set[str] = field(default_factory=set)  # the ids pushed to FIFO

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}/queue")

    # ---- calls -------------------------------------------------------------------------
    def command(self, step: int, state: NodeState) -> tuple[int, bytes]:
        """A client's next call, to be proposed at `step` to the node whose state is
        `state` (for the expiries its monitor would propose): (call id, entry data)."""
        rng = self.rng
        n = len(self.calls)
        now = step + n * 1e-6  # unique: no two entries carry the same bytes
        r = rng.random()
        kind = "push"
        cmd: Command | None = None
        floor = rng.choice([0, 0, 0, 3])  # min_priority
        if r < 0.15:
            kind = "pop"
            q = rng.choice([DLQ, QUEUE, QUEUE, FIFO])
            cmd = Take(q, rng.randint(1, 3), now, None, None, "", floor)
        elif r < 0.35:
            kind = "receive"
            q = rng.choice([DLQ, QUEUE, QUEUE, FIFO, FIFO])
            lease_s = rng.choice([10.0, 120.0, 400.0])
            cmd = Take(q, rng.randint(1, 3), now, None, lease_s, f"c{n}.", floor)
        elif r < 0.7 and self.leases:
            picked = rng.sample(self.leases, min(len(self.leases), rng.randint(1, 3)))
            q = picked[0][0]
            held = [(mid, token) for lq, mid, token in picked if lq == q]
            if rng.random() < 0.8:
                kind = "ack"
                cmd = Settle(q, "ack", held, now)
            else:
                kind = "nack"
                delay = rng.choice([0.0, 5.0])
                cmd = Settle(q, "nack", held, now, delay, 0.0, MAX_RECEIVES, _dlq(q))
            self.leases = [x for x in self.leases if x not in picked or x[0] != q]
        elif r < 0.8:
            due = sorted(
                (m.queue, mid, m.lease)
                for mid, m in state.hot.items()
                if m.lease is not None and m.lease_until <= now
            )
            if due:
                kind = "expire"
                q = due[0][0]
                held = [(mid, token) for lq, mid, token in due if lq == q]
                cmd = Expire(q, held, now, MAX_RECEIVES, _dlq(q))
            elif state.delays_due(now):
                kind = "wake"
                cmd = Wake(now)
        elif r < 0.85 and self.ids:
            # Each id once: an entry's bytes are unique (the simulation checks that no
            # entry is applied twice by its data).
            mid = f"m{rng.randint(max(1, self.ids - 20), self.ids)}"
            if mid not in self.cancels:
                self.cancels.add(mid)
                kind = "cancel"
                cmd = CancelMessage(FIFO if mid in self.fifo_ids else QUEUE, mid)
        elif r < 0.88:
            kind = "housekeep"  # the leader's sweep: drops what passed its deadline
            cmd = Housekeep(now, [])
        elif r < 0.92:
            # Topics: a change to one of two topics, some refused (made twice, dropped or
            # unsubscribed when absent), after the creation of a topic of its own (which
            # makes the entry's bytes unique).
            kind = "topic"
            t = rng.choice(["t1", "t2"])
            changes: list[MetaOp] = [
                CreateTopic(t, now),
                DropTopic(t),
                Subscribe(t, QUEUE),
                Unsubscribe(t, QUEUE),
            ]
            change = rng.choice(changes)
            cmd = Meta((CreateTopic(f"t.{n}", now), change))
        items: list[tuple[Any, ...]] = []
        if cmd is None and rng.random() < 0.3:  # to the FIFO queue, in groups
            for _ in range(rng.randint(1, 3)):
                self.ids += 1
                attributes = rng.choice([None, '{"k":"v"}'])
                group = rng.choice(GROUPS)
                items.append((f"m{self.ids}", b"", None, False, 0, 0.0, 0.0, attributes, group))
                self.fifo_ids.add(f"m{self.ids}")
            cmd = Push(FIFO, items, now)
        if cmd is None:
            for _ in range(rng.randint(1, 3)):
                self.ids += 1
                mid = f"m{self.ids}"
                if rng.random() < 0.5:
                    items.append((mid, b"", None, False))
                else:  # a priority, a deadline, a delay, attributes
                    priority = rng.choice([0, 0, 3, 9])
                    deadline = rng.choice([0.0, 0.0, now + 20.0, now + 200.0])
                    delay = rng.choice([0.0, 0.0, 15.0])
                    attributes = rng.choice([None, '{"k":"v"}'])
                    items.append((mid, b"", None, False, priority, deadline, delay, attributes))
                    if deadline:
                        self.deadlines[mid] = deadline
            cmd = Push(QUEUE, items, now)
        if kind == "push" and rng.random() < 0.25:  # a stream waits: the push leases for it
            kind = "push_take"
            assert isinstance(cmd, Push)
            lease_s = rng.choice([10.0, 120.0])
            cmd = PushTake(*cmd, rng.randint(1, 3), None, lease_s, f"s{n}.", floor)
        data = encode_command(cmd)
        self.calls.append(_Call(kind, data, cmd, step))
        self.by_data[data] = n
        return n, data

    def filler(self, step: int) -> bytes:
        """An entry no client waits for (the simulation's own proposals)."""
        return encode_command(Wake(step + len(self.by_data) * 1e-6 + 0.5))

    def proposed(self, call: int, node: str, index: int, term: int) -> None:
        self.pending.setdefault((node, index), []).append((term, call))

    def refused(self, call: int, step: int) -> None:
        """No node took the call (not the leader, no usable hint): it did nothing."""
        self._answer(call, "fail", step)

    def applied(self, node: str, e: Entry, result: Any, step: int) -> None:
        """`node` applied `e` with `result`: the calls proposed there at `e.index` hear."""
        waiting = self.pending.pop((node, e.index), None)
        for term, call in waiting or ():
            if term == e.term:
                self._answer(call, "ok", step, result)
            else:
                self._answer(call, "fail", step)

    def went_down(self, node: str, step: int) -> None:
        """`node` stopped: what its callers were waiting for, they never hear."""
        for key in [k for k in self.pending if k[0] == node]:
            for _, call in self.pending.pop(key):
                self._answer(call, "unknown", step)

    def _answer(self, call: int, status: str, step: int, result: Any = None) -> None:
        c = self.calls[call]
        c.status, c.end, c.result = status, step, result
        if status == "ok" and c.kind == "push_take" and isinstance(result, tuple):
            assert isinstance(c.cmd, PushTake)
            self.leases += [(c.cmd.queue, t.id, t.token) for t in result[1] if t.token is not None]
        if status == "ok" and c.kind == "receive" and isinstance(result, list):
            assert isinstance(c.cmd, Take)
            # (A client answered from another entry than its own, in the tests that break
            # the answer rule, may hold anything: only leases are kept.)
            self.leases += [
                (c.cmd.queue, t.id, t.token)
                for t in result
                if isinstance(t, Taken) and t.token is not None
            ]

    # ---- the check ---------------------------------------------------------------------
    def check(self, sequence: list[Entry], states: dict[str, NodeState]) -> list[str]:
        """What went wrong, given the entries every node applied and each node's state."""
        for key in list(self.pending):
            for _, call in self.pending.pop(key):
                self._answer(call, "unknown", 0)
        problems: list[str] = []
        truth = NodeState()
        results: dict[bytes, Any] = {}
        removed: set[str] = set()
        order: dict[str, list[str]] = {}  # FIFO group -> its ids in committed push order
        for e in sequence:
            if e.data is None or not is_command(e):
                continue
            cmd = decode_command(e.data)
            if type(cmd) is PushTake:
                # Its push, then its take, each checked as they are on their own.
                pushed_part = apply_command(truth, cmd.push())
                if isinstance(pushed_part, Exception):
                    results[e.data] = pushed_part
                    continue
                _track_fifo(cmd.push(), pushed_part, order)
                before = _fifo_view(truth, order, max(cmd.now, truth.clock))
                taken = apply_command(truth, cmd.take())
                results[e.data] = (pushed_part, taken)
                if cmd.queue == FIFO:
                    problems += _fifo_problems(before, taken, e.index)
                continue
            if type(cmd) is Take and cmd.queue == FIFO:
                before = _fifo_view(truth, order, max(cmd.now, truth.clock))
            result = results[e.data] = apply_command(truth, cmd)
            if type(cmd) is Push:
                _track_fifo(cmd, result, order)
            elif type(cmd) is Take and cmd.queue == FIFO:
                problems += _fifo_problems(before, result, e.index)
            if type(cmd) is Take and cmd.lease_s is None:
                removed.update(t.id for t in result)
            elif type(cmd) is Settle and cmd.action == "ack":
                removed.update(
                    mid for (mid, _), op in zip(cmd.leases, result, strict=True) if op is not None
                )
            elif type(cmd) is CancelMessage and result == "cancelled":
                removed.add(cmd.id)
        for node, state in states.items():
            if state_view(state) != state_view(truth):
                problems.append(f"{node}'s state is not the one its applied entries make")
        told: list[_Call] = []  # ok calls told what the committed entry gives
        for c in self.calls:
            if c.status == "ok" and c.data not in results:
                problems.append(f"an ok {c.kind} ({c.data!r}) is not committed")
            elif c.status == "ok" and plain(results[c.data]) != plain(c.result):
                problems.append(
                    f"an ok {c.kind} was told {c.result!r}, the committed entry gives "
                    f"{results[c.data]!r}"
                )
            elif c.status == "fail" and c.data in results:
                problems.append(f"a failed {c.kind} ({c.data!r}) took effect")
            elif c.status == "ok":
                told.append(c)
        stored = stored_ids(truth)
        pushed = {
            item[0]
            for c in told
            if c.kind in ("push", "push_take")
            for (item, repeat) in zip(c.cmd.items, _pushed(c), strict=True)  # type: ignore[union-attr]
            if not repeat
        }
        expired = {mid for mid, d in self.deadlines.items() if d <= truth.clock}
        lost = pushed - stored - removed - expired
        if lost:
            problems.append(f"acknowledged pushes lost: {sorted(lost)[:5]}")
        # id -> the step the ok pop that handed it out, or its ok ack, was answered
        popped: dict[str, int] = {}
        acked: dict[str, int] = {}
        cancelled: dict[str, int] = {}
        for c in told:
            if c.kind == "pop":
                for t in c.result:
                    if t.id in popped:
                        problems.append(f"{t.id} popped twice")
                    popped[t.id] = c.end
            elif c.kind == "ack":
                for (mid, _), op in zip(c.cmd.leases, c.result, strict=True):  # type: ignore[union-attr]
                    if op is not None:
                        acked[mid] = c.end
            elif c.kind == "cancel" and c.result == "cancelled":
                cancelled[c.cmd.id] = c.end  # type: ignore[union-attr]
        for c in told:
            if c.kind not in ("pop", "receive", "push_take"):
                continue
            for t in _delivered(c):
                if t.id in popped and c.start > popped[t.id]:
                    problems.append(f"{t.id} delivered again after an ok pop")
                if t.id in acked and c.start > acked[t.id]:
                    problems.append(f"{t.id} delivered after its ack was answered")
                if t.id in cancelled and c.start > cancelled[t.id]:
                    problems.append(f"{t.id} delivered after its cancel was answered")
        undone = (set(acked) | set(cancelled)) & stored
        if undone:
            problems.append(f"acked or cancelled ids stored at the end: {sorted(undone)[:5]}")
        return problems

    def counts(self) -> QueueCounts:
        k = QueueCounts(calls=len(self.calls))
        for c in self.calls:
            if c.status == "ok":
                k.ok += 1
                if c.kind in ("push", "push_take"):
                    k.pushed += sum(1 for repeat in _pushed(c) if not repeat)
                if c.kind in ("pop", "receive", "push_take"):
                    k.delivered += len(_delivered(c))
                    if c.cmd.queue == FIFO:  # type: ignore[union-attr]
                        k.fifo_delivered += len(_delivered(c))
                elif c.kind == "ack":
                    k.acked += sum(1 for op in c.result if op is not None)
                elif c.kind == "cancel":
                    k.cancelled += c.result == "cancelled"
                if c.kind in ("nack", "expire"):
                    k.dead_lettered += sum(
                        1 for op in c.result if op is not None and type(op).__name__ == "DeadLetter"
                    )
            elif c.status == "fail":
                k.failed += 1
            else:
                k.unknown += 1
        return k


def _pushed(c: _Call) -> list[bool]:
    """An ok push's result (of a push_take, its push's)."""
    return list(c.result[0] if c.kind == "push_take" else c.result)


def _delivered(c: _Call) -> list[Any]:
    """What an ok pop, receive or push_take handed out."""
    return list(c.result[1] if c.kind == "push_take" else c.result)


def _track_fifo(cmd: Push, result: Any, order: dict[str, list[str]]) -> None:
    """Records the FIFO messages a committed push stored, in push order per group."""
    if cmd.queue != FIFO or not isinstance(result, list):
        return
    for item, repeat in zip(cmd.items, result, strict=True):
        if not repeat:
            order.setdefault(item[8], []).append(item[0])


def _dlq(queue: str) -> str | None:
    return DLQ if queue in (QUEUE, FIFO) else None


def _fifo_view(
    state: NodeState, order: dict[str, list[str]], now: float
) -> dict[str, tuple[list[str], list[str]]]:
    """Per FIFO group: its messages still stored in FIFO in push order, and those of
    them that are out at `now`: leased, or waiting out a delay that ends after `now`."""
    view: dict[str, tuple[list[str], list[str]]] = {}
    hot = state.hot
    for group, ids in order.items():
        held = [mid for mid in ids if state.holder(mid) == FIFO]
        out = [
            mid
            for mid in held
            if mid in hot and (hot[mid].lease is not None or hot[mid].visible_at > now)
        ]
        view[group] = (held, out)
    return view


def _fifo_problems(
    before: dict[str, tuple[list[str], list[str]]], taken: list[Any], index: int
) -> list[str]:
    """What a take from the FIFO queue at entry `index` broke, given `_fifo_view` before
    it: a group's messages go in push order, none while one of them is out, and a
    receive leases one a group."""
    problems: list[str] = []
    by_group: dict[str, list[Any]] = {}
    for t in taken:
        by_group.setdefault(t.group, []).append(t)
    for group, got in by_group.items():
        held, out = before.get(group, ([], []))
        ids = [t.id for t in got]
        if out:
            problems.append(f"entry {index} delivered {ids} while {out} of its group were out")
        elif ids != held[: len(ids)]:
            problems.append(f"entry {index} delivered {ids} of group {group}, not {held[:3]}")
        if len(got) > 1 and got[0].token is not None:
            problems.append(f"entry {index} leased {ids}, all of group {group}")
    return problems
