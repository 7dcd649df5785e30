"""The total-queue checker: what a history says became of every message (after Jepsen's
`total-queue`).

`check(history)` pairs each invoke with its completion and sorts every message id:

- attempted: some push of it was invoked; acknowledged: some push of it answered ok.
- delivered: a receive, pop or drain handed it to a consumer (ok completions only).
- lost: acknowledged, never delivered.
- duplicated: delivered more than once (with how often).
- unexpected: delivered, never pushed.
- resurrected: delivered by a call that began after an ack (or a pop) of it had already
  completed, and after every push of it that could still store it had ended: a message the
  queue had taken back and then handed out again.
- recovered: every push of it had an unknown outcome (`info`), and it was delivered.
- delivered_after_fail: every push of it failed for certain (`fail`), yet it was delivered.
- corrupt: a delivery whose body differs from what was pushed under its id.

Pops are at-most-once: a pop whose outcome is unknown may have removed messages that no one
recorded, so `unknown_pop_capacity` (the most messages those pops could have taken) bounds
the losses such pops explain. Receives whose outcome is unknown lose nothing: their leases
expire and the messages come back.

Fault windows (`fault_windows`) come from the nemesis's notes: a kill until the restart, a
pause until the resume, a partition until the heal. Two questions are asked of them:

- `acked_during(events, window)`: the pushes acknowledged while the fault held (with
  replication, every window must have some: each group keeps a majority).
- `cut_changes(events, members, group_of)`: every change a 2xx reply reported (a push
  stored, a message leased or popped, an ack taken) by a call that began and ended while a
  partition held, with the node that answered, and whether that node's side held a majority
  of the replica group that keeps the message. A side without one can commit nothing for
  that group, so any change it reports is a broken guarantee.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fault.history import FAIL, INFO, INVOKE, OK, Event

DELIVERING = ("receive", "pop", "drain")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: its invoke and its completion (`info` at `inf` when none came)."""

    process: str
    f: str
    type: str
    invoke_value: Any
    value: Any
    start: float
    end: float


def pair(events: Iterable[Event]) -> tuple[list[Op], list[Event]]:
    """Operations in invoke order, and the one-event notes (nemesis actions)."""
    pending: dict[str, Event] = {}
    ops: list[tuple[int, Op]] = []
    notes: list[Event] = []
    for e in events:
        if e.type == INVOKE:
            if e.process in pending:
                raise ValueError(f"process {e.process} invoked {e.f} with an op still open")
            pending[e.process] = e
            continue
        inv = pending.pop(e.process, None)
        if inv is None:
            notes.append(e)
            continue
        if inv.f != e.f:
            raise ValueError(f"process {e.process}: {inv.f} invoked, {e.f} completed")
        ops.append((inv.index, Op(e.process, e.f, e.type, inv.value, e.value, inv.time, e.time)))
    for inv in pending.values():  # never completed: unknown, with no end
        ops.append((inv.index, Op(inv.process, inv.f, INFO, inv.value, None, inv.time, math.inf)))
    ops.sort(key=lambda t: t[0])
    return [op for _, op in ops], notes


@dataclass
class Report:
    attempted: set[str] = field(default_factory=set)
    acknowledged: set[str] = field(default_factory=set)
    delivered: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    duplicated: dict[str, int] = field(default_factory=dict)
    unexpected: set[str] = field(default_factory=set)
    resurrected: set[str] = field(default_factory=set)
    recovered: set[str] = field(default_factory=set)
    delivered_after_fail: set[str] = field(default_factory=set)
    corrupt: set[str] = field(default_factory=set)
    deliveries: int = 0
    unknown_pop_capacity: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    nemesis: list[Any] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "attempted": len(self.attempted),
            "acknowledged": len(self.acknowledged),
            "delivered": len(self.delivered),
            "deliveries": self.deliveries,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "unexpected": len(self.unexpected),
            "resurrected": len(self.resurrected),
            "recovered": len(self.recovered),
            "delivered_after_fail": len(self.delivered_after_fail),
            "corrupt": len(self.corrupt),
            "unknown_pop_capacity": self.unknown_pop_capacity,
        }

    def problems(self) -> list[str]:
        """Broken invariants of the report itself (empty when its counts add up)."""
        out = []
        if not self.acknowledged <= self.attempted:
            out.append("an acknowledged push was never attempted")
        if self.lost != self.acknowledged - self.delivered:
            out.append("lost is not acknowledged minus delivered")
        parts = [
            self.delivered & self.acknowledged,
            self.recovered,
            self.delivered_after_fail,
            self.unexpected,
        ]
        if sum(map(len, parts)) != len(self.delivered) or set().union(*parts) != self.delivered:
            out.append("delivered is not acknowledged + recovered + after-fail + unexpected")
        if len(self.delivered) + sum(n - 1 for n in self.duplicated.values()) != self.deliveries:
            out.append("deliveries do not add up to delivered plus duplicates")
        if not self.resurrected <= set(self.duplicated):
            out.append("a resurrected message was delivered only once")
        return out

    def text(self, limit: int = 10) -> str:
        lines = ["checker: " + " ".join(f"{k}={v}" for k, v in self.counts().items())]
        lines.append("ops: " + " ".join(f"{k}={v}" for k, v in sorted(self.ops.items())))
        for name in ("lost", "unexpected", "resurrected", "recovered", "corrupt"):
            ids = sorted(getattr(self, name))
            if ids:
                more = f" (+{len(ids) - limit} more)" if len(ids) > limit else ""
                lines.append(f"{name}: {', '.join(ids[:limit])}{more}")
        if self.duplicated:
            top = sorted(self.duplicated.items(), key=lambda kv: -kv[1])[:limit]
            lines.append("duplicated (times): " + ", ".join(f"{i}x{n}" for i, n in top))
        for note in self.nemesis:
            lines.append(f"nemesis: {note}")
        return "\n".join(lines)


def check(events: Iterable[Event]) -> Report:
    ops, notes = pair(events)
    r = Report(nemesis=[n.value for n in notes if n.f == "nemesis"])
    r.ops = dict(Counter(f"{op.f}:{op.type}" for op in ops))

    pushes: defaultdict[str, list[Op]] = defaultdict(list)
    payloads: defaultdict[str, set[Any]] = defaultdict(set)
    # When the queue took each message back: the end of an ok ack naming it, of an ok pop.
    taken: defaultdict[str, list[float]] = defaultdict(list)
    got: list[tuple[str, Any, Op]] = []

    for op in ops:
        if op.f == "push":
            msg_id = op.invoke_value["id"]
            r.attempted.add(msg_id)
            pushes[msg_id].append(op)
            payloads[msg_id].add(op.invoke_value.get("payload"))
            if op.type == OK:
                r.acknowledged.add(msg_id)
                answered = (op.value or {}).get("got")
                if answered is not None and answered != msg_id:
                    r.corrupt.add(msg_id)
        elif op.f in DELIVERING:
            if op.type == INFO and op.f == "pop":
                r.unknown_pop_capacity += int((op.invoke_value or {}).get("max", 1))
            if op.type != OK:
                continue
            for d in op.value or ():
                got.append((d["id"], d.get("payload"), op))
                if op.f == "pop":
                    taken[d["id"]].append(op.end)
        elif op.f == "ack" and op.type == OK:
            for msg_id in (op.value or {}).get("acked", ()):
                taken[msg_id].append(op.end)

    times = Counter(msg_id for msg_id, _, _ in got)
    r.deliveries = len(got)
    r.delivered = set(times)
    r.duplicated = {i: n for i, n in times.items() if n > 1}
    r.lost = r.acknowledged - r.delivered
    r.unexpected = r.delivered - r.attempted
    for msg_id in r.delivered & r.attempted - r.acknowledged:
        if any(p.type == INFO for p in pushes[msg_id]):
            r.recovered.add(msg_id)
        else:
            assert all(p.type == FAIL for p in pushes[msg_id])
            r.delivered_after_fail.add(msg_id)

    for msg_id, payload, op in got:
        if msg_id in payloads and payload not in payloads[msg_id]:
            r.corrupt.add(msg_id)
        for t in taken.get(msg_id, ()):
            if op.start <= t:
                continue
            # A push still able to store the message after it was taken makes this a new copy.
            repushed = any(p.start < op.end and _effect_end(p) > t for p in pushes[msg_id])
            if not repushed:
                r.resurrected.add(msg_id)
    return r


def _effect_end(op: Op) -> float:
    """Until when a push could still have stored its message: its end if ok or fail, never
    known if its outcome is unknown."""
    return math.inf if op.type == INFO else op.end


# ---- fault windows ------------------------------------------------------------------------

# The note that starts a fault, and the note that ends it.
_ENDS = {"kill": "restarted", "lose_disk": "restarted empty", "pause": "resumed"}


@dataclass(frozen=True, slots=True)
class Window:
    """One fault, from the note that began it to the note that ended it (`inf`: never
    ended). `sides` is a partition's groups of nodes; `node` the victim of the others."""

    fault: str
    start: float
    end: float
    node: str | None = None
    sides: tuple[tuple[str, ...], ...] = ()


def fault_windows(events: Iterable[Event]) -> list[Window]:
    _, notes = pair(events)
    opened: dict[str, tuple[str, Event]] = {}  # node (or "net") -> fault and its note
    done: list[Window] = []
    for e in notes:
        if e.f != "nemesis" or not isinstance(e.value, dict):
            continue
        fault, node = e.value.get("fault"), e.value.get("node")
        if fault in _ENDS:
            opened[node] = (fault, e)
        elif fault == "partition":
            opened["net"] = (fault, e)
        elif fault == "heal" and "net" in opened:
            _, began = opened.pop("net")
            sides = tuple(tuple(side) for side in began.value["groups"])
            done.append(Window("partition", began.time, e.time, sides=sides))
        elif node in opened and _ENDS[opened[node][0]] == fault:
            began_fault, began = opened.pop(node)
            done.append(Window(began_fault, began.time, e.time, node=node))
    for key, (fault, began) in opened.items():
        sides = tuple(tuple(side) for side in began.value.get("groups", ()))
        node = None if key == "net" else key
        done.append(Window(fault, began.time, math.inf, node=node, sides=sides))
    return sorted(done, key=lambda w: w.start)


def acked_during(events: Iterable[Event], window: Window) -> list[Op]:
    """The pushes acknowledged (their ok came) while `window`'s fault held."""
    ops, _ = pair(events)
    return [
        op
        for op in ops
        if op.f == "push" and op.type == OK and window.start <= op.end <= window.end
    ]


@dataclass(frozen=True, slots=True)
class Change:
    """A change a 2xx reply reported during a partition: `op` changed message `msg_id`
    (kept by replica group `group`), answered by `node`, whose side held a majority of
    the group's members or not (`majority`)."""

    op: Op
    msg_id: str
    group: str
    node: str
    side: tuple[str, ...]
    majority: bool

    def __str__(self) -> str:
        return (
            f"{self.op.process} {self.op.f} ok of {self.msg_id} (group {self.group}) answered "
            f"by {self.node} on side {list(self.side)}"
            f"{'' if self.majority else ', which holds no majority of the group'}"
        )


def cut_changes(
    events: Iterable[Event],
    members: Mapping[str, Sequence[str]],
    group_of: Callable[[str], str],
) -> list[Change]:
    """Every change reported by a call that began and ended inside a partition (see the
    module's docstring). `members`: each replica group's members; `group_of(msg_id)`: the
    group that keeps a message."""
    events = list(events)
    ops, _ = pair(events)
    cuts = [w for w in fault_windows(events) if w.sides]
    out: list[Change] = []
    for op in ops:
        if op.type != OK:
            continue
        for w in cuts:
            if not (w.start <= op.start and op.end <= w.end):
                continue
            for node, msg_id in _changed(op):
                side = next(s for s in w.sides if node in s)
                group = group_of(msg_id)
                held = sum(m in side for m in members[group])
                out.append(Change(op, msg_id, group, node, side, 2 * held > len(members[group])))
    return out


def _changed(op: Op) -> list[tuple[str, str]]:
    """(node that answered, message id) for each change `op`'s ok reported."""
    value = op.value
    if op.f == "push":
        return [(value["node"], op.invoke_value["id"])] if "node" in (value or {}) else []
    if op.f in DELIVERING:
        return [(d["node"], d["id"]) for d in value or () if "node" in d]
    if op.f == "ack" and "node" in (value or {}):
        return [(value["node"], i) for i in value.get("acked", ())]
    return []


# ---- FIFO groups -----------------------------------------------------------------------------
@dataclass
class FifoReport:
    """What `check_fifo` found: deliveries and acks seen, and every broken rule."""

    deliveries: int = 0
    redeliveries: int = 0
    acked: set[str] = field(default_factory=set)  # payloads whose ack was ok
    delivered: set[str] = field(default_factory=set)  # payloads delivered at least once
    out_of_order: list[str] = field(default_factory=list)
    overlapping: list[str] = field(default_factory=list)
    resurrected: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return [*self.out_of_order[:10], *self.overlapping[:10], *self.resurrected[:10]]


def check_fifo(events: Iterable[Event], visibility_s: float) -> FifoReport:
    """Checks a FIFO workload's history (payloads `<group>:<n>`, n the push order).

    - In order: when a receive answers with message n of a group, every earlier message of
      that group has an ack (ok and taking effect, or of unknown outcome) invoked before
      that answer: a later message is never delivered before an earlier one is acked. (A
      redelivery of the message in flight, its lease run out, is allowed.)
    - One at a time: each delivery's client-side hold, from the receive's answer to the
      invoke of its ack, or to the receive's invoke plus the visibility timeout if that is
      earlier (the lease cannot have ended before then), lies inside the node's lease. So
      the holds of one group's deliveries never overlap.
    - Nothing comes back: no receive that began after an ok ack of a message ended
      delivers it again.
    """
    ops, _ = pair(events)
    report = FifoReport()
    payload_of: dict[str, str] = {}
    for op in ops:
        if op.f == "receive" and op.type == OK:
            for d in op.value:
                payload_of[d["id"]] = d["payload"]
    # Per payload: the times acks of it were invoked (ok and taking effect, or unknown),
    # and when the first ok one ended.
    ack_invokes: defaultdict[str, list[float]] = defaultdict(list)
    acked_at: dict[str, float] = {}
    next_ack: dict[tuple[str, int], Op] = {}  # (process, index of its receive) -> its ack
    last_receive: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.f == "receive":
            last_receive[op.process] = i
        elif op.f == "ack":
            if op.process in last_receive:
                next_ack[(op.process, last_receive.pop(op.process))] = op
            if op.type == FAIL:
                continue
            took = set(op.value["acked"]) if op.type == OK else set(op.invoke_value["ids"])
            for mid in took:
                payload = payload_of.get(mid)
                if payload is None:
                    continue
                ack_invokes[payload].append(op.start)
                if op.type == OK:
                    report.acked.add(payload)
                    acked_at[payload] = min(acked_at.get(payload, math.inf), op.end)
    # Per group: for each n, the latest of the first ack invokes of messages 0..n-1 (and
    # which message that is): message n may go once that time has passed.
    prefix: dict[str, list[tuple[float, str]]] = {}

    def acked_by(group: str, n: int) -> tuple[float, str]:
        table = prefix.get(group)
        if table is None:
            table = prefix[group] = [(-math.inf, "")]
        while len(table) <= n:
            m = len(table) - 1
            first = min(ack_invokes.get(f"{group}:{m}", [math.inf]))
            table.append(max(table[-1], (first, f"{group}:{m}")))
        return table[n]

    holds: defaultdict[str, list[tuple[float, float, str]]] = defaultdict(list)
    seen = report.delivered
    for i, op in enumerate(ops):
        if op.f != "receive" or op.type != OK:
            continue
        ack = next_ack.get((op.process, i))
        for d in op.value:
            payload = d["payload"]
            group, n = payload.rsplit(":", 1)
            report.deliveries += 1
            report.redeliveries += payload in seen
            seen.add(payload)
            if d.get("group") != group:
                report.out_of_order.append(f"{payload} delivered with group {d.get('group')}")
            if acked_at.get(payload, math.inf) < op.start:
                report.resurrected.append(f"{payload} delivered again after its ack")
            latest, earlier = acked_by(group, int(n))
            if latest >= op.end:
                report.out_of_order.append(
                    f"{payload} delivered at {op.end:.3f} before {earlier} was acked"
                )
            end = op.start + visibility_s
            if ack is not None:
                end = min(end, ack.start)
            holds[group].append((op.end, end, payload))
    for spans in holds.values():
        spans.sort()
        reach, holder = -math.inf, ""
        for start, end, payload in spans:
            if start < reach:
                report.overlapping.append(
                    f"{payload} held from {start:.3f} while {holder} was held until {reach:.3f}"
                )
            if end > reach:
                reach, holder = end, payload
    return report
