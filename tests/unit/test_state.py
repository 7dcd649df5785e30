"""NodeState: UUID queues, bodies, firstUUID and metadata lists, driven by plain calls."""

from __future__ import annotations

import pytest

import zdmq.server.state as state_module
from zdmq.server.state import (
    CreateQueue,
    DropQueue,
    NodeState,
    Purge,
    Push,
    Register,
    Remove,
    Unregister,
)

from .views import all_ids


def _ids(n: int, prefix: str = "m") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def _push_all(state: NodeState, queue: str, ids: list[str]) -> list[Push]:
    return [state.push(queue, mid, mid.encode(), None) for mid in ids]


def _pop_ids(state: NodeState, queue: str, limit: int) -> list[str]:
    got, _ = state.pop(queue, limit)
    return [t.id for t in got]


def test_pop_returns_messages_in_push_order() -> None:
    state = NodeState()
    ids = _ids(10)
    _push_all(state, "jobs", ids)
    first, _ = state.pop("jobs", 3)
    rest, _ = state.pop("jobs", 100)
    got = first + rest
    assert [t.id for t in got] == ids
    assert [t.body for t in got] == [mid.encode() for mid in ids]
    assert state.pop("jobs", 1) == ([], [])
    assert state.depth("jobs") == 0
    assert all_ids(state) == set()
    assert state.stored() == 0


def test_pop_takes_at_most_the_limit() -> None:
    state = NodeState()
    _push_all(state, "jobs", _ids(5))
    got, ops = state.pop("jobs", 2)
    assert len(got) == len(ops) == 2
    assert state.depth("jobs") == 3


def test_pop_returns_the_remove_op_that_persists_it() -> None:
    state = NodeState()
    push = state.push("jobs", "a", b"body", "text/plain")
    [taken], [op] = state.pop("jobs", 1)
    assert (taken.id, taken.body, taken.content_type, taken.receive_count) == (
        "a",
        b"body",
        "text/plain",
        0,
    )
    assert op == Remove("jobs", "a", push.seq)


def test_queues_keep_separate_fifo_orders() -> None:
    state = NodeState()
    for i in range(5):
        state.push("a", f"a{i}", b"", None)
        state.push("b", f"b{i}", b"", None)
    assert _pop_ids(state, "b", 10) == [f"b{i}" for i in range(5)]
    assert _pop_ids(state, "a", 10) == [f"a{i}" for i in range(5)]


def test_pop_of_an_unknown_queue_is_empty() -> None:
    assert NodeState().pop("nope", 10) == ([], [])
    assert NodeState().depth("nope") == 0


def test_push_assigns_increasing_sequence_numbers() -> None:
    state = NodeState()
    ops = _push_all(state, "jobs", _ids(3)) + _push_all(state, "other", _ids(2, "o"))
    assert [op.seq for op in ops] == [1, 2, 3, 4, 5]
    assert ops[0] == Push("jobs", "m000", 1, b"m000", None)


def test_replayed_pushes_move_the_next_sequence_past_the_highest_seen() -> None:
    state = NodeState()
    state.apply(Push("jobs", "x", 41, b"", None))
    state.apply(Push("jobs", "y", 7, b"", None))
    assert state.push("jobs", "z", b"", None).seq == 42


def test_first_uuid_is_the_first_push_into_an_empty_uuid_queue() -> None:
    state = NodeState()
    _push_all(state, "jobs", ["first", "second", "third"])
    assert state.queues["jobs"].first_uuid == "first"
    state.pop("jobs", 1)
    # Not empty yet: firstUUID stays the id that created the UUID queue.
    assert state.queues["jobs"].first_uuid == "first"
    state.pop("jobs", 10)
    _push_all(state, "jobs", ["fourth", "fifth"])
    assert state.queues["jobs"].first_uuid == "fourth"


def test_first_uuid_resets_after_a_purge_and_a_refill() -> None:
    state = NodeState()
    _push_all(state, "jobs", ["a", "b"])
    state.purge("jobs")
    _push_all(state, "jobs", ["c"])
    assert state.queues["jobs"].first_uuid == "c"


def test_purge_drops_the_uuid_queue_and_every_body_of_that_queue_only() -> None:
    state = NodeState()
    pushes = _push_all(state, "jobs", _ids(4))
    _push_all(state, "keep", _ids(2, "k"))
    op = state.purge("jobs")
    assert op == Purge("jobs", tuple(p.seq for p in pushes))
    assert "jobs" not in state.queues
    assert all_ids(state) == {"k000", "k001"}
    assert state.depth("jobs") == 0
    assert state.depth("keep") == 2


def test_purge_of_an_unknown_queue_returns_no_op() -> None:
    assert NodeState().purge("nope") is None


def test_remove_of_a_non_head_id_keeps_the_others_in_order() -> None:
    state = NodeState()
    pushes = _push_all(state, "jobs", ["a", "b", "c", "d"])
    state.apply(Remove("jobs", "c", pushes[2].seq))
    assert "c" not in all_ids(state)
    assert state.ready_list("jobs") == ["a", "b", "d"]
    state.apply(Remove("jobs", "a", pushes[0].seq))
    assert _pop_ids(state, "jobs", 10) == ["b", "d"]


def test_create_register_unregister_and_drop_shape_the_metadata_list() -> None:
    state = NodeState()
    state.apply(CreateQueue("jobs", "inc-1", 1700000000.0))
    meta = state.meta["jobs"]
    assert (meta.name, meta.incarnation, meta.created_at, meta.nodes) == (
        "jobs",
        "inc-1",
        1700000000.0,
        {},
    )
    state.apply(Register("jobs", "n3", "u3"))
    state.apply(Register("jobs", "n1", "u1"))
    # A second registration keeps the node's original firstUUID and position.
    state.apply(Register("jobs", "n3", "u3-later"))
    assert list(meta.nodes.items()) == [("n3", "u3"), ("n1", "u1")]
    state.apply(Unregister("jobs", "n3"))
    assert list(meta.nodes.items()) == [("n1", "u1")]
    state.apply(Unregister("jobs", "n9"))  # not listed: nothing to do
    state.apply(DropQueue("jobs"))
    assert "jobs" not in state.meta


def test_unregister_and_drop_of_an_unknown_queue_do_nothing() -> None:
    state = NodeState()
    state.apply(Unregister("nope", "n1"))
    state.apply(DropQueue("nope"))
    assert state.meta == {}


def test_create_again_replaces_the_metadata_with_a_new_incarnation() -> None:
    state = NodeState()
    state.apply(CreateQueue("jobs", "inc-1", 1.0))
    state.apply(Register("jobs", "n1", "u1"))
    state.apply(DropQueue("jobs"))
    state.apply(CreateQueue("jobs", "inc-2", 2.0))
    assert state.meta["jobs"].incarnation == "inc-2"
    assert state.meta["jobs"].nodes == {}


def test_metadata_and_uuid_queues_are_independent() -> None:
    state = NodeState()
    state.apply(CreateQueue("jobs", "inc", 1.0))
    _push_all(state, "jobs", ["a"])
    state.apply(DropQueue("jobs"))
    # Dropping the metadata list leaves this node's messages to the purge that follows.
    assert state.depth("jobs") == 1


def test_a_drop_leaves_a_tombstone_that_a_create_of_the_name_removes() -> None:
    state = NodeState()
    state.apply(CreateQueue("jobs", "inc-1", 1.0))
    state.apply(DropQueue("jobs", "inc-1", 5.0))
    assert state.tombstones == {"jobs": ("inc-1", 5.0)}
    state.apply(CreateQueue("jobs", "inc-2", 6.0))
    assert state.tombstones == {}


def test_the_oldest_tombstones_go_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "TOMBSTONES_KEPT", 3)
    state = NodeState()
    for i in range(5):
        state.apply(CreateQueue(f"q{i}", f"inc-{i}", float(i)))
        state.apply(DropQueue(f"q{i}", f"inc-{i}", 10.0 + i))
    assert list(state.tombstones) == ["q2", "q3", "q4"]
    # Deleted again, a name becomes the newest tombstone.
    state.apply(CreateQueue("q2", "inc-2b", 20.0))
    state.apply(DropQueue("q2", "inc-2b", 21.0))
    assert list(state.tombstones) == ["q3", "q4", "q2"]
