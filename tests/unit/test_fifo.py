"""FIFO groups in a node's state: one message of a group in flight at a time, delivered in
push order, back at the head of its group after a nack or an expiry; and a reload
rebuilds the groups exactly (their order, which are busy, which head goes next)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zdmq.raft.sim_queue import state_view
from zdmq.server.machine import (
    CancelMessage,
    Command,
    Expire,
    Housekeep,
    Push,
    Settle,
    Take,
    apply_command,
    decode_command,
    encode_command,
)
from zdmq.server.state import DeadLetter, NodeState, Requeue, Taken
from zdmq.server.storage import SqliteStorage

Q = "orders"


def _push(state: NodeState, now: float, *pairs: tuple[str, str], dedup: bool = False) -> Any:
    """Pushes (id, group) pairs, in order."""
    items = tuple((mid, mid.encode(), None, dedup, 0, 0.0, 0.0, None, g) for mid, g in pairs)
    return _run(state, Push(Q, items, now, None, 60.0))


def _run(state: NodeState, cmd: Command) -> Any:
    data = encode_command(cmd)
    assert encode_command(decode_command(data)) == data
    return apply_command(state, decode_command(data))


def _receive(state: NodeState, now: float, n: int = 10, lease_s: float = 30.0) -> list[Taken]:
    got: list[Taken] = _run(state, Take(Q, n, now, None, lease_s, f"t{now:g}."))
    return got


def _ids(got: list[Taken]) -> list[str]:
    return [t.id for t in got]


def test_a_receive_takes_one_head_per_group_and_a_group_waits_for_its_ack() -> None:
    s = NodeState()
    _push(s, 1.0, ("a1", "A"), ("b1", "B"), ("a2", "A"), ("c1", "C"), ("b2", "B"))
    got = _receive(s, 2.0)
    assert _ids(got) == ["a1", "b1", "c1"]  # oldest head first, one per group
    assert [t.group for t in got] == ["A", "B", "C"]
    assert _receive(s, 3.0) == []  # every group has a message in flight
    a1 = got[0]
    [op] = _run(s, Settle(Q, "ack", [(a1.id, a1.token or "")], 4.0))
    assert op is not None
    assert _ids(_receive(s, 5.0)) == ["a2"]  # the ack released A only
    assert s.counts(Q) == {
        "ready": 1,
        "in_flight": 3,
        "delayed": 0,
        "dead_lettered": 0,
        "expired": 0,
    }


def test_a_nack_and_an_expiry_put_the_message_back_at_the_head_of_its_group() -> None:
    s = NodeState()
    _push(s, 1.0, ("a1", "A"), ("a2", "A"), ("a3", "A"))
    [a1] = _receive(s, 2.0, lease_s=5.0)
    [op] = _run(s, Settle(Q, "nack", [("a1", a1.token or "")], 3.0))
    assert type(op) is Requeue and op.new_seq == op.seq  # keeps its place
    [again] = _receive(s, 4.0, lease_s=5.0)
    assert again.id == "a1" and again.receive_count == 2
    # The lease runs out (at 9.0): the monitor's Expire puts it back at the head again.
    assert s.due_leases(10.0) == [(Q, "a1", again.token)]
    [op] = _run(s, Expire(Q, [("a1", again.token or "")], 10.0))
    assert type(op) is Requeue
    assert _ids(_receive(s, 11.0)) == ["a1"]


def test_a_nack_with_a_delay_keeps_the_group_busy_until_it_is_visible_again() -> None:
    s = NodeState()
    _push(s, 1.0, ("a1", "A"), ("a2", "A"), ("b1", "B"))
    got = _receive(s, 2.0)
    _run(s, Settle(Q, "nack", [("a1", got[0].token or "")], 3.0, 10.0))
    _run(s, Settle(Q, "ack", [("b1", got[1].token or "")], 3.0))
    assert _receive(s, 5.0) == []  # a2 waits behind the delayed a1
    assert _ids(_receive(s, 14.0)) == ["a1"]


def test_the_move_to_the_dead_letter_queue_releases_the_group() -> None:
    s = NodeState()
    _push(s, 1.0, ("a1", "A"), ("a2", "A"))
    [a1] = _receive(s, 2.0)
    [op] = _run(s, Settle(Q, "nack", [("a1", a1.token or "")], 3.0, 0.0, 0.0, 1, "dlq"))
    assert type(op) is DeadLetter
    assert _ids(_receive(s, 4.0)) == ["a2"]  # the next one goes on
    dlq: list[Taken] = _run(s, Take("dlq", 10, 5.0, None, 30.0, "d."))
    assert _ids(dlq) == ["a1"]


def test_a_pop_takes_group_heads_in_push_order_across_groups() -> None:
    s = NodeState()
    _push(s, 1.0, ("a1", "A"), ("b1", "B"), ("a2", "A"), ("a3", "A"), ("b2", "B"))
    got: list[Taken] = _run(s, Take(Q, 4, 3.0))
    assert _ids(got) == ["a1", "b1", "a2", "a3"]
    # A leased head holds its group back from a pop too.
    _push(s, 4.0, ("a4", "A"))
    [b2] = _receive(s, 5.0, n=1)
    assert b2.id == "a4" or b2.id == "b2"
    rest: list[Taken] = _run(s, Take(Q, 10, 6.0))
    assert _ids(rest) == [m for m in ("a4", "b2") if m != b2.id]


def test_a_cancel_of_a_head_lets_the_next_one_go_and_retention_drops_old_heads() -> None:
    s = NodeState()
    _push(s, 1.0, ("a1", "A"), ("a2", "A"))
    _push(s, 50.0, ("a3", "A"), ("b1", "B"))
    assert _run(s, CancelMessage(Q, "a1")) == "cancelled"
    assert _run(s, Housekeep(60.0, [(Q, 30.0)])) == 1  # a2 is past retention, a3 is not
    assert _ids(_receive(s, 61.0)) == ["a3", "b1"]


def test_dedup_ids_store_a_group_message_once_inside_the_window() -> None:
    s = NodeState()
    assert _push(s, 1.0, ("d1", "A"), dedup=True) == [False]
    [d1] = _receive(s, 2.0)
    _run(s, Settle(Q, "ack", [("d1", d1.token or "")], 3.0))
    assert _push(s, 4.0, ("d1", "A"), dedup=True) == [True]  # gone, but inside the window
    assert _receive(s, 5.0) == []


async def test_a_reload_rebuilds_groups_busy_ones_and_the_next_heads(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "s.sqlite3", fsync=True)
    s = storage.load()
    _push(s, 1.0, ("a1", "A"), ("b1", "B"), ("a2", "A"), ("c1", "C"), ("c2", "C"))
    got = _receive(s, 2.0, n=2, lease_s=1000.0)  # a1, b1 leased
    _run(s, Settle(Q, "nack", [("b1", got[1].token or "")], 3.0))  # b1 back at B's head
    assert _ids(_run(s, Take(Q, 1, 4.0))) == ["b1"]  # the oldest free head: b1 again
    _push(s, 5.0, ("b2", "B"))
    await storage.barrier()
    live = state_view(s)
    await storage.close()
    reopened = SqliteStorage(tmp_path / "s.sqlite3", fsync=True)
    try:
        r = reopened.load()
        r.clock = s.clock
        assert state_view(r) == live
        # The heads of B and C go next (A is busy with a1), C's being older.
        assert _ids(_receive(r, 6.0)) == ["c1", "b2"]
        await reopened.barrier()
    finally:
        await reopened.close()
