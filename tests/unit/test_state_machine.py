"""A node's queue state machine against a plain reference model, driven by hypothesis.

`_NodeMachine` holds a real `NodeState` whose every planned op is committed to a real
`SqliteStorage` (a file in a temp directory), and drives it with random push / receive /
ack / nack / extend / pop / clock / monitor / restart steps. After every step it compares
the node with `_Model`, a few plain dicts written from the delivery rules below
(docs/design.md §9 and §10), not from zdmq's code. Where the rules leave an order open
(messages that become ready at one moment), the model picks the node's tie-break and
says so.

Queues: `jobs` dead-letters a message into `jobs-dlq` at the end of its 2nd delivery,
`mail` at the end of its 1st; `jobs-dlq` requeues; `fifo` is a FIFO queue (its messages
in groups, no priority, deadline or delay) that dead-letters into `jobs-dlq` at the end of
a 2nd delivery. The model's rules:

* a push appends to its queue's ready list (with a delay, it waits out the delay
  first); a push by dedup id stores nothing while the id is held anywhere or its dedup
  record is live (`until > now`);
* ready messages are delivered by priority (high first), then deadline (earliest
  first, none last), then the order they joined the ready list;
* a receive (or pop) takes up to k ready messages of priority `min_priority` or more in
  that order, dropping (and counting as expired) those whose deadline is `now` or
  earlier on the way; a receive leases each until `now + visibility_s` and counts one
  more delivery; the housekeeping pass drops every ready message past its deadline;
* a cancel removes a ready or delayed message and remembers its id (a repeat answers
  "again"); a leased one stays ("leased");
* a lease is live while `now < until`: an ack, nack or extend takes effect only on a
  live lease of that queue and token, otherwise it is a no-op (`lease_expired`), so the
  first of ack / nack / expiry wins and an ack at or after `until` fails;
* ending a lease (nack, or expiry by the monitor) of a message delivered
  `max_receives` times moves it to the tail of the dead-letter queue (count 0, origin
  kept, so `dead_lettered` counts it for its origin); otherwise it waits `delay_s`
  (0: ready at once, at the tail);
* the monitor expires every lease with `until <= now`, earliest first, ties by id;
* a delayed message joins the tail of its queue once its delay has ended, at the next
  moment the node looks at the clock for delays: a push, the end of a lease (nack or
  expiry), and, as the node calls `wake` there, before a receive or pop and at the start
  of a monitor pass. What became ready before a push or a move to the dead-letter queue
  queues ahead of it; those whose delays end at one moment go in the order they were
  pushed or requeued;
* in `fifo`, a group is busy while one of its messages is leased or delayed; a receive
  takes the oldest ready message of each group that is not busy (one a group), those
  heads oldest first; a pop takes the first ready messages, in push order, of the groups
  that are not busy (several of a group in turn); a requeued message keeps its place in
  push order (the head of its group); a message moved to the dead-letter queue leaves
  its group;
* a restart (after a last monitor wake) changes nothing: every op was committed, and
  `load()` must rebuild the same state, ready order included.

The clock is fake (`now` only moves forward by `advance`) and every planner gets it.
`SqliteStorage.load` reads `time.time()` once, to split delayed from ready messages; the
restart step patches that read with the fake `now`, as a real restart reads the same
clock as the planners did.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from zdmq.models import QueueSettings, dedup_message_id
from zdmq.server import storage as storage_module
from zdmq.server.state import (
    CreateQueue,
    DeadLetter,
    Extend,
    NodeState,
    Op,
    Remove,
    Requeue,
    id_key,
)
from zdmq.server.storage import SqliteStorage

JOBS, MAIL, DLQ, FIFO = "jobs", "mail", "jobs-dlq", "fifo"
QUEUES = (JOBS, MAIL, DLQ, FIFO)
SETTINGS = {
    JOBS: QueueSettings(max_receives=2, dead_letter_queue=DLQ, dedup_window_s=3.0),
    MAIL: QueueSettings(max_receives=1, dead_letter_queue=DLQ, dedup_window_s=3.0),
    DLQ: QueueSettings(dedup_window_s=3.0),
    FIFO: QueueSettings(max_receives=2, dead_letter_queue=DLQ, dedup_window_s=3.0, fifo=True),
}
# Every time and duration is a multiple of 0.25 s, so sums are exact in binary floats.
START = 1_700_000_000.0
DEDUP_KEYS = ("k0", "k1", "k2")
# Strategies shared by rules; each shrinks towards its first, most ordinary value.
VISIBILITIES = st.sampled_from([2.0, 1.0, 4.0, 0.5, 0.0])
DELAYS = st.sampled_from([0.0, 0.5, 1.5, 3.0])
MISROUTE = st.sampled_from([None] * 5 + [JOBS, MAIL, DLQ])  # None: the receipt's own queue
FORGED = st.integers(0, 7).map(lambda n: n == 7)
PICK = st.integers(0, 15)
QUEUE = st.sampled_from([JOBS, MAIL, DLQ, JOBS, FIFO, FIFO])  # jobs and fifo most
GROUP = st.sampled_from(["g1", "g2", "g3"])


def _note(what: str) -> None:
    """Counts an outcome for `--hypothesis-show-statistics` (no-op in a replayed case)."""
    if currently_in_test_context():
        event(what)


class Receipt(NamedTuple):
    queue: str
    id: str
    token: str


# ---- the reference model -----------------------------------------------------------------
@dataclass
class _Msg:
    queue: str
    body: bytes
    content_type: str | None
    enqueued_at: float
    stamp: int  # when it was last pushed, requeued or moved, as a count of those events
    where: str = "ready"  # ready | leased | delayed
    count: int = 0
    token: str | None = None
    until: float = 0.0
    visible_at: float = 0.0
    origin: str | None = None
    priority: int = 0
    deadline: float = 0.0
    attributes: str | None = None
    group: str | None = None
    order: int = 0  # its place in push order (FIFO groups deliver in it)


@dataclass
class _Model:
    msgs: dict[str, _Msg] = field(default_factory=dict)
    ready: dict[str, list[str]] = field(default_factory=lambda: {q: [] for q in QUEUES})
    dedup: dict[str, tuple[str, float]] = field(default_factory=dict)
    events: int = 0  # pushes, requeues and moves so far
    expired: Counter[str] = field(default_factory=Counter)
    cancelled: dict[str, str] = field(default_factory=dict)

    def is_duplicate(self, mid: str, now: float) -> bool:
        rec = self.dedup.get(mid)
        return mid in self.msgs or (rec is not None and rec[1] > now)

    def push(
        self,
        queue: str,
        mid: str,
        body: bytes,
        ctype: str | None,
        now: float,
        window: float,
        options: tuple[int, float, float, str | None] = (0, 0.0, 0.0, None),
        group: str | None = None,
    ) -> None:
        assert mid not in self.msgs
        self.wake(now)  # what became ready before now queues ahead of the new message
        self.events += 1
        priority, deadline, delay_s, attrs = options
        m = self.msgs[mid] = _Msg(queue, body, ctype, now, self.events)
        m.priority, m.deadline, m.attributes = priority, deadline, attrs
        m.group, m.order = group, self.events
        if delay_s > 0:
            m.where, m.visible_at = "delayed", now + delay_s
        else:
            self.ready[queue].append(mid)
        if window > 0:
            self.dedup[mid] = (queue, now + window)

    def wake(self, now: float) -> None:
        due = sorted(
            (m.visible_at, m.stamp, mid)
            for mid, m in self.msgs.items()
            if m.where == "delayed" and m.visible_at <= now
        )
        for _, _, mid in due:
            m = self.msgs[mid]
            m.where = "ready"
            self.ready[m.queue].append(mid)

    def ordered(self, queue: str) -> list[str]:
        """The ready messages of `queue` in delivery order (a FIFO queue's in push order)."""
        ready = self.ready[queue]
        if SETTINGS[queue].fifo:
            return sorted(ready, key=lambda mid: self.msgs[mid].order)

        def key(i: int) -> tuple[int, float, int]:
            m = self.msgs[ready[i]]
            return -m.priority, m.deadline or float("inf"), i

        return [ready[i] for i in sorted(range(len(ready)), key=key)]

    def take(
        self,
        queue: str,
        limit: int,
        now: float = 0.0,
        min_priority: int = 0,
        lease: bool = False,
    ) -> list[str]:
        if SETTINGS[queue].fifo:
            return self._take_fifo(queue, limit, min_priority, lease)
        got: list[str] = []
        for mid in self.ordered(queue):
            m = self.msgs[mid]
            if m.priority < min_priority or len(got) >= limit:
                break
            self.ready[queue].remove(mid)
            if m.deadline and m.deadline <= now:
                del self.msgs[mid]
                self.expired[queue] += 1
            else:
                got.append(mid)
        return got

    def _take_fifo(self, queue: str, limit: int, min_priority: int, lease: bool) -> list[str]:
        if min_priority > 0:
            return []
        busy = {m.group for m in self.msgs.values() if m.queue == queue and m.where != "ready"}
        got: list[str] = []
        for mid in self.ordered(queue):
            group = self.msgs[mid].group
            if len(got) >= limit or group in busy:
                continue
            got.append(mid)
            if lease:
                busy.add(group)
        for mid in got:
            self.ready[queue].remove(mid)
        return got

    def expire_deadlines(self, now: float) -> None:
        for q, ready in self.ready.items():
            for mid in list(ready):
                m = self.msgs[mid]
                if m.deadline and m.deadline <= now:
                    ready.remove(mid)
                    del self.msgs[mid]
                    self.expired[q] += 1

    def cancel(self, queue: str, mid: str) -> str:
        m = self.msgs.get(mid)
        if m is None or m.queue != queue:
            return "again" if self.cancelled.get(mid) == queue else "unknown"
        if m.where == "leased":
            return "leased"
        self.remove(mid)
        self.cancelled.pop(mid, None)
        self.cancelled[mid] = queue
        return "cancelled"

    def lease(self, mid: str, token: str, until: float) -> None:
        m = self.msgs[mid]
        m.where, m.token, m.until, m.count = "leased", token, until, m.count + 1

    def live(self, queue: str, mid: str, token: str, now: float) -> bool:
        m = self.msgs.get(mid)
        return (
            m is not None
            and m.queue == queue
            and m.where == "leased"
            and m.token == token
            and now < m.until
        )

    def remove(self, mid: str) -> None:
        m = self.msgs.pop(mid)
        if m.where == "ready":
            self.ready[m.queue].remove(mid)

    def end_lease(self, mid: str, now: float, delay_s: float) -> str:
        """Ends a live or expired lease; returns "dead_letter" or "requeue"."""
        m = self.msgs[mid]
        cfg = SETTINGS[m.queue]
        m.token, m.until = None, 0.0
        self.events += 1
        m.stamp = self.events
        if cfg.max_receives is not None and m.count >= cfg.max_receives:
            assert cfg.dead_letter_queue is not None
            # Like a push, what became ready before now queues ahead of the moved message.
            self.wake(now)
            m.origin, m.queue = m.queue, cfg.dead_letter_queue
            m.where, m.count, m.enqueued_at = "ready", 0, now
            m.group = None
            self.ready[m.queue].append(mid)
            return "dead_letter"
        m.where, m.visible_at = "delayed", now + delay_s
        self.wake(now)
        return "requeue"

    def due_leases(self, now: float) -> list[tuple[str, str, str]]:
        due = sorted(
            (m.until, mid) for mid, m in self.msgs.items() if m.where == "leased" and m.until <= now
        )
        out = []
        for _, mid in due:
            m = self.msgs[mid]
            assert m.token is not None
            out.append((m.queue, mid, m.token))
        return out

    def live_leases(self, now: float) -> list[Receipt]:
        """The receipts of the leases still running at `now`, by message id."""
        return [
            Receipt(m.queue, mid, m.token)
            for mid, m in sorted(self.msgs.items())
            if m.where == "leased" and m.token is not None and now < m.until
        ]

    def forget_dedup(self, now: float) -> None:
        self.dedup = {mid: rec for mid, rec in self.dedup.items() if rec[1] >= now}

    def view(self) -> dict[str, Any]:
        """The model in the same shape as `_observe` gives the node."""
        by = {w: {q: 0 for q in QUEUES} for w in ("leased", "delayed")}
        origins: Counter[str] = Counter()
        for m in self.msgs.values():
            if m.where != "ready":
                by[m.where][m.queue] += 1
            if m.origin is not None:
                origins[m.origin] += 1
        return {
            "ready": {q: self.ordered(q) for q in QUEUES},
            "leased": {
                mid: (m.queue, m.token, m.until, m.count)
                for mid, m in self.msgs.items()
                if m.where == "leased"
            },
            "delayed": {
                mid: (m.queue, m.visible_at) for mid, m in self.msgs.items() if m.where == "delayed"
            },
            "messages": {
                mid: (m.queue, m.body, m.content_type, m.enqueued_at, m.count, m.origin)
                for mid, m in self.msgs.items()
            },
            "dedup": dict(self.dedup),
            "cancelled": dict(self.cancelled),
            "counts": {
                q: {
                    "ready": len(self.ready[q]),
                    "in_flight": by["leased"][q],
                    "delayed": by["delayed"][q],
                    "dead_lettered": origins[q],
                    "expired": self.expired[q],
                }
                for q in QUEUES
            },
            "depth": {q: len(self.ready[q]) + by["leased"][q] + by["delayed"][q] for q in QUEUES},
        }


# ---- what the node holds, in comparable form ---------------------------------------------
def _observe(state: NodeState) -> dict[str, Any]:
    """The node's delivery state; fails on a message lost, duplicated or in two places."""
    placed: Counter[str] = Counter()
    ready: dict[str, list[str]] = {q: [] for q in QUEUES}
    leased: dict[str, tuple[str, str | None, float, int]] = {}
    delayed: dict[str, tuple[str, float]] = {}
    n_ready = 0
    for q, lq in state.queues.items():
        ready_ids = state.ready_list(q)
        n_ready += len(ready_ids)
        held = (*ready_ids, *lq.leased, *lq.delayed)
        assert q in QUEUES or not held, f"messages in unknown queue {q!r}: {held}"
        placed.update(held)
        for mid in ready_ids:
            assert mid not in state.hot, f"{mid} is ready in {q!r} and also leased or delayed"
            indexed = state.ready_ids.get(id_key(mid))
            assert indexed == q, f"{mid} is ready in {q!r} but indexed in {indexed!r}"
        for mid in (*lq.leased, *lq.delayed):
            m = state.hot.get(mid)
            assert m is not None, f"{mid} is listed in {q!r} but has no stored message"
            assert m.queue == q, f"{mid} is listed in {q!r} but says it is in {m.queue!r}"
            assert (m.lease is not None) == (mid in lq.leased), f"{mid}: lease {m.lease!r}"
        if q in QUEUES:
            ready[q] = ready_ids
        for mid in lq.leased:
            m = state.hot[mid]
            leased[mid] = (q, m.lease, m.lease_until, m.receive_count)
        for mid in lq.delayed:
            delayed[mid] = (q, state.hot[mid].visible_at)
    twice = sorted(mid for mid, n in placed.items() if n > 1)
    assert not twice, f"messages in two places: {twice}"
    nowhere = sorted(set(state.hot) - set(placed))
    assert not nowhere, f"stored messages in no queue: {nowhere}"
    assert len(state.ready_ids) == n_ready, "the index of ready ids names messages in no queue"
    views = {mid: state.find(mid) for mid in placed}
    return {
        "ready": ready,
        "leased": leased,
        "delayed": delayed,
        "messages": {
            mid: (m.queue, m.body, m.content_type, m.enqueued_at, m.receive_count, m.origin)
            for mid, m in views.items()
            if m is not None
        },
        "dedup": dict(state.dedup),
        "cancelled": dict(state.cancelled),
        "counts": {q: state.counts(q) for q in QUEUES},
        "depth": {q: state.depth(q) for q in QUEUES},
    }


def _differences(expected: dict[str, Any], got: dict[str, Any]) -> str:
    lines = []
    for part in expected:
        if expected[part] == got[part]:
            continue
        want, have = expected[part], got[part]
        for key in sorted(set(want) | set(have)):
            if want.get(key) != have.get(key):
                lines.append(f"  {part}[{key}]: expected {want.get(key)!r}, got {have.get(key)!r}")
    return "\n".join(lines)


# ---- the machine -------------------------------------------------------------------------
class _NodeMachine(RuleBasedStateMachine):
    receipts = Bundle("receipts")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="zdmq-state-machine-"))
        self.path = self.dir / "zdmq.sqlite3"
        self.loop = asyncio.new_event_loop()
        self.storage = SqliteStorage(self.path, fsync=False)
        self.state = self.storage.load()
        self.model = _Model()
        self.now = START
        self.pushed = 0
        self.tokens = 0
        self.issued: set[str] = set()
        self.dirty = False  # whether anything was committed since the last (re)start

    def teardown(self) -> None:
        try:
            self._run(self.storage.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- plumbing ------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        self.loop.run_until_complete(coro)

    def _commit(self, ops: list[Op]) -> None:
        if not ops:
            return

        async def submit() -> None:
            await self.storage.submit(ops)

        self._run(submit())
        self.dirty = True

    def _new_token(self) -> str:
        self.tokens += 1
        return f"t{self.tokens:05d}"

    def _wake(self) -> None:
        """A moment the node looks at the clock for delayed messages."""
        self.state.wake(self.now)
        self.model.wake(self.now)

    def _reload(self) -> NodeState:
        self.storage = SqliteStorage(self.path, fsync=False)
        # load() splits delayed from ready messages by time.time(): give it our clock.
        with mock.patch.object(storage_module, "time", SimpleNamespace(time=lambda: self.now)):
            return self.storage.load()

    @initialize()
    def create_queues(self) -> None:
        ops: list[Op] = [CreateQueue(q, f"inc-{q}", START, SETTINGS[q]) for q in QUEUES]
        for op in ops:
            self.state.apply(op)
        self._commit(ops)

    # ---- rules ---------------------------------------------------------------------------
    @rule(
        queue=QUEUE,
        dedup_key=st.sampled_from([None, None, *DEDUP_KEYS]),
        batch=st.integers(1, 3),
        ctype=st.sampled_from([None, "text/plain"]),
        priority=st.sampled_from([0, 0, 3, 7, 3]),
        ttl_s=st.sampled_from([0.0, 0.0, 2.0, 1.0, 4.0]),
        delay_s=st.sampled_from([0.0, 0.0, 0.0, 1.0, 0.5]),
        attrs=st.sampled_from([None, '{"k":"v"}']),
        groups=st.lists(GROUP, min_size=3, max_size=3),
    )
    def push(
        self,
        queue: str,
        dedup_key: str | None,
        batch: int,
        ctype: str | None,
        priority: int = 0,
        ttl_s: float = 0.0,
        delay_s: float = 0.0,
        attrs: str | None = None,
        groups: tuple[str, ...] = ("g1", "g1", "g1"),
    ) -> None:
        """A batch of pushes at one `now` in one commit, each with a fresh id, or all with
        one dedup id (uuid5 of queue and key): then the batch stores it at most once.
        Each has the batch's priority, deadline (`now + ttl_s`), delay and attributes;
        in the FIFO queue, none of those but attributes, and each its group."""
        fifo = SETTINGS[queue].fifo
        if fifo:
            priority, ttl_s, delay_s = 0, 0.0, 0.0
        options = (priority, self.now + ttl_s if ttl_s else 0.0, delay_s, attrs)
        ops: list[Op] = []
        for _ in range(batch):
            self.pushed += 1
            body = f"body {self.pushed}".encode()
            if dedup_key is None:
                mid, window = f"m{self.pushed:05d}", 0.0
            else:
                mid, window = dedup_message_id(queue, dedup_key), SETTINGS[queue].dedup_window_s
            duplicate = self.state.is_duplicate(mid, self.now)
            assert duplicate == self.model.is_duplicate(mid, self.now), (
                f"is_duplicate({mid}) at {self.now - START}: node says {duplicate}"
            )
            if duplicate:  # the node's rule: a repeat stores nothing
                _note("push by dedup id: duplicate")
                continue
            group = groups[self.pushed % len(groups)] if fifo else None
            ops += self.state.push_options(
                queue, [(mid, body, ctype, window, *options, group)], now=self.now
            )
            self.model.push(queue, mid, body, ctype, self.now, window, options, group)
        self._commit(ops)

    @precondition(lambda self: self.model.msgs)  # no message yet: only push and advance
    @rule(
        target=receipts,
        queue=QUEUE,
        limit=st.integers(1, 3),
        visibility_s=VISIBILITIES,
        min_priority=st.sampled_from([0, 0, 0, 3, 5]),
    )
    def receive(self, queue: str, limit: int, visibility_s: float, min_priority: int = 0) -> Any:
        self._wake()
        got, ops = self.state.lease(
            queue,
            limit,
            now=self.now,
            visibility_s=visibility_s,
            new_token=self._new_token,
            retention_s=None,
            min_priority=min_priority,
        )
        self._commit(ops)
        expected = self.model.take(queue, limit, self.now, min_priority, lease=True)
        assert [t.id for t in got] == expected, f"received {got}, expected {expected}"
        out = []
        for t in got:
            mid, token = t.id, t.token
            assert token is not None and token not in self.issued, f"token {token} reused"
            self.issued.add(token)
            self.model.lease(mid, token, self.now + visibility_s)
            want = self.model.msgs[mid]
            assert (t.body, t.receive_count) == (want.body, want.count), mid
            assert (t.priority, t.attributes) == (want.priority, want.attributes), mid
            assert t.group == want.group, mid
            out.append(Receipt(queue, mid, token))
        return multiple(*out)

    # Receipts come from two places: any receipt ever issued (`receipts`: current, run
    # out, or stale after a nack, expiry or ack), or a lease still running (`pick`), so
    # that enough of them take effect. A few go to the wrong queue or carry a forged token.
    @rule(receipt=receipts, queue=MISROUTE, forged=FORGED)
    def ack(self, receipt: Receipt, queue: str | None, forged: bool) -> None:
        self._ack(receipt, queue, forged)

    @precondition(lambda self: self.model.live_leases(self.now))
    @rule(pick=PICK, queue=MISROUTE, forged=FORGED)
    def ack_a_live_lease(self, pick: int, queue: str | None, forged: bool) -> None:
        self._ack(self._live(pick), queue, forged)

    @rule(receipt=receipts, queue=MISROUTE, delay_s=DELAYS)
    def nack(self, receipt: Receipt, queue: str | None, delay_s: float) -> None:
        self._nack(receipt, queue, delay_s)

    @precondition(lambda self: self.model.live_leases(self.now))
    @rule(pick=PICK, queue=MISROUTE, delay_s=DELAYS)
    def nack_a_live_lease(self, pick: int, queue: str | None, delay_s: float) -> None:
        self._nack(self._live(pick), queue, delay_s)

    @rule(receipt=receipts, visibility_s=VISIBILITIES)
    def extend(self, receipt: Receipt, visibility_s: float) -> None:
        self._extend(receipt, visibility_s)

    @precondition(lambda self: self.model.live_leases(self.now))
    @rule(pick=PICK, visibility_s=VISIBILITIES)
    def extend_a_live_lease(self, pick: int, visibility_s: float) -> None:
        self._extend(self._live(pick), visibility_s)

    def _live(self, pick: int) -> Receipt:
        live = self.model.live_leases(self.now)
        return live[pick % len(live)]

    def _ack(self, receipt: Receipt, queue: str | None, forged: bool) -> None:
        queue = queue or receipt.queue
        token = receipt.token + "x" if forged else receipt.token
        verdict = self.model.live(queue, receipt.id, token, self.now)
        op = self.state.ack(queue, receipt.id, token, self.now)
        assert (op is not None) == verdict, f"ack {receipt} in {queue}: got {op}, want {verdict}"
        _note(f"ack: {'done' if verdict else 'lease_expired'}")
        if op is not None:
            assert isinstance(op, Remove) and (op.queue, op.id) == (queue, receipt.id), op
            self._commit([op])
            self.model.remove(receipt.id)

    def _nack(self, receipt: Receipt, queue: str | None, delay_s: float) -> None:
        queue = queue or receipt.queue
        cfg = SETTINGS[queue]
        verdict = self.model.live(queue, receipt.id, receipt.token, self.now)
        op = self.state.requeue(
            queue,
            receipt.id,
            receipt.token,
            self.now,
            delay_s=delay_s,
            expired=False,
            max_receives=cfg.max_receives,
            dead_letter_queue=cfg.dead_letter_queue,
        )
        assert (op is not None) == verdict, f"nack {receipt} in {queue}: got {op}, want {verdict}"
        if op is None:
            _note("nack: lease_expired")
            return
        self._commit([op])
        outcome = self.model.end_lease(receipt.id, self.now, delay_s)
        _note(f"nack: {outcome}")
        self._check_end(op, outcome, delay_s)

    def _extend(self, receipt: Receipt, visibility_s: float) -> None:
        queue, mid, token = receipt
        verdict = self.model.live(queue, mid, token, self.now)
        op = self.state.extend(queue, mid, token, self.now, visibility_s)
        assert (op is not None) == verdict, f"extend {receipt}: got {op}, want {verdict}"
        _note(f"extend: {'done' if verdict else 'lease_expired'}")
        if op is not None:
            assert isinstance(op, Extend) and op.until == self.now + visibility_s, op
            self._commit([op])
            self.model.msgs[mid].until = self.now + visibility_s

    @precondition(lambda self: self.model.msgs)  # no message yet: only push and advance
    @rule(queue=QUEUE, limit=st.integers(1, 2), min_priority=st.sampled_from([0, 0, 4]))
    def pop(self, queue: str, limit: int, min_priority: int = 0) -> None:
        self._wake()
        got, ops = self.state.pop(
            queue, limit, now=self.now, retention_s=None, min_priority=min_priority
        )
        self._commit(ops)
        expected = self.model.take(queue, limit, self.now, min_priority)
        assert [t.id for t in got] == expected, f"popped {got}, expected {expected}"
        for t in got:
            assert t.body == self.model.msgs.pop(t.id).body, t.id

    @precondition(lambda self: self.model.msgs or self.model.cancelled)
    @rule(queue=QUEUE, pick=PICK)
    def cancel(self, queue: str, pick: int) -> None:
        """Cancels a stored or an already cancelled message (in its queue, or not)."""
        known = sorted({*self.model.msgs, *self.model.cancelled})
        mid = known[pick % len(known)]
        verdict = self.state.cancel(queue, mid)
        assert verdict == self.model.cancel(queue, mid), f"cancel {mid} in {queue}: {verdict}"
        _note(f"cancel: {verdict}")
        if verdict == "cancelled":
            self._commit([Remove(queue, mid, 0)])  # the op is written already: commit it

    @rule(dt=st.sampled_from([0.5, 0.25, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: self.model.msgs)  # no message yet: only push and advance
    @rule(housekeeping=st.booleans())
    def run_monitor(self, housekeeping: bool) -> None:
        """The lease monitor: wakes delayed messages, requeues or dead-letters expired
        leases, and with `housekeeping` forgets dedup records whose window has ended."""
        self._wake()
        due = self.state.due_leases(self.now)
        expected = self.model.due_leases(self.now)
        # A lease extended to the same `until` has two timer entries and may be listed
        # twice; the second requeue is a no-op, as in the node's monitor.
        distinct = list(dict.fromkeys(due))
        assert distinct == expected, f"due leases {due}, expected {expected}"
        ops: list[Op] = []
        done: set[tuple[str, str, str]] = set()
        for queue, mid, token in due:
            cfg = SETTINGS[queue]
            op = self.state.requeue(
                queue,
                mid,
                token,
                self.now,
                expired=True,
                max_receives=cfg.max_receives,
                dead_letter_queue=cfg.dead_letter_queue,
            )
            if (queue, mid, token) in done:
                assert op is None, f"lease {mid}/{token} expired twice: {op}"
                continue
            done.add((queue, mid, token))
            assert op is not None, f"due lease {mid}/{token} was not requeued"
            ops.append(op)
            outcome = self.model.end_lease(mid, self.now, 0.0)
            _note(f"expiry: {outcome}")
            self._check_end(op, outcome, 0.0)
        if housekeeping:
            ops += self.state.expired_by_deadline(self.now)
            self.model.expire_deadlines(self.now)
            forget = self.state.forget_dedup(self.now)
            if forget is not None:
                ops.append(forget)
            self.model.forget_dedup(self.now)
        self._commit(ops)

    @precondition(lambda self: self.dirty and self.model.msgs)
    @rule()
    def restart(self) -> None:
        """Close the storage and load a fresh state from the file: nothing may change."""
        self._wake()  # the node's last monitor pass before it stops
        before = _observe(self.state)
        for part in ("leased", "delayed"):
            if before[part]:
                _note(f"restart with {part} messages")
        meta_before = {
            q: (m.incarnation, m.created_at, m.settings) for q, m in self.state.meta.items()
        }
        self._run(self.storage.close())
        self.state = self._reload()
        self.dirty = False
        after = _observe(self.state)
        assert after == before, "reloaded state differs from the state before the restart:\n" + (
            _differences(before, after)
        )
        meta_after = {
            q: (m.incarnation, m.created_at, m.settings) for q, m in self.state.meta.items()
        }
        assert meta_after == meta_before
        seqs = [m.seq for m in self.state.hot.values()]
        seqs += [seq for lq in self.state.queues.values() for seq in lq.ready]
        assert self.state.next_seq > max(seqs, default=0)

    def _check_end(self, op: Op, verdict: str, delay_s: float) -> None:
        if verdict == "dead_letter":
            assert isinstance(op, DeadLetter), f"expected a DeadLetter: {op}"
            assert (op.dlq, op.moved_at) == (DLQ, self.now), op
        else:
            assert isinstance(op, Requeue), f"expected a Requeue: {op}"
            assert op.visible_at == self.now + delay_s, op

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def node_matches_model(self) -> None:
        expected, got = self.model.view(), _observe(self.state)
        assert got == expected, f"node differs from the model at now={self.now - START}:\n" + (
            _differences(expected, got)
        )


_SETTINGS = settings(
    max_examples=250,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestTheQueueStateMachineMatchesTheReferenceModelThroughRestarts(_NodeMachine.TestCase):
    """250 random runs of up to 50 steps (about 10 s when nothing differs).

    `pytest --hypothesis-show-statistics` counts the outcomes each run reached."""

    settings = _SETTINGS


@pytest.mark.slow
class TestTheQueueStateMachineMatchesTheReferenceModelOverLongRuns(_NodeMachine.TestCase):
    settings = settings(_SETTINGS, max_examples=1500, stateful_step_count=100)


# ---- fixed sequences: ready orders that a restart must rebuild --------------------------------
def _started() -> _NodeMachine:
    machine = _NodeMachine()
    machine.create_queues()
    machine.node_matches_model()
    return machine


def test_messages_nacked_in_one_instant_keep_their_ready_order_through_a_restart() -> None:
    """A nack of m2 then m1 (one batch: one `now`) leaves [m2, m1]. Their timestamps tie,
    so a reload must order them by something else (the fresh seq of each requeue)."""
    machine = _started()
    try:
        machine.push(queue=JOBS, dedup_key=None, batch=1, ctype=None)
        machine.push(queue=JOBS, dedup_key=None, batch=1, ctype=None)
        first, second = machine.receive(queue=JOBS, limit=2, visibility_s=1.0).values
        machine.nack(receipt=second, queue=None, delay_s=0.0)
        machine.nack(receipt=first, queue=None, delay_s=0.0)
        machine.node_matches_model()
        machine.restart()
        machine.node_matches_model()
    finally:
        machine.teardown()


def test_a_dead_lettered_message_queues_behind_one_whose_delay_ended_earlier() -> None:
    """A DLQ message whose delay ended at t=0.5 is ready ahead of a message moved into the
    DLQ at t=1, live and after a reload: `requeue` wakes due delayed messages before it
    moves a message to the DLQ, so the live order is the one a reload rebuilds."""
    machine = _started()
    try:
        machine.push(queue=JOBS, dedup_key=None, batch=1, ctype=None)
        (job,) = machine.receive(queue=JOBS, limit=1, visibility_s=4.0).values
        machine.nack(receipt=job, queue=None, delay_s=0.0)
        (job,) = machine.receive(queue=JOBS, limit=1, visibility_s=4.0).values
        machine.push(queue=DLQ, dedup_key=None, batch=1, ctype=None)
        (dead,) = machine.receive(queue=DLQ, limit=1, visibility_s=4.0).values
        machine.nack(receipt=dead, queue=None, delay_s=0.5)
        machine.advance(dt=1.0)
        machine.nack(receipt=job, queue=None, delay_s=0.0)  # its 2nd delivery: to the DLQ
        machine.node_matches_model()
        machine.restart()
        machine.node_matches_model()
    finally:
        machine.teardown()
