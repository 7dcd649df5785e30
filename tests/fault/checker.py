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
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
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
