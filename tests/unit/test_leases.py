"""NodeState's delivery planners: leases, ack / nack / extend, expiry, dead letters, dedup.

Pure: every planner takes `now` from the test, so time moves only when a test says so
(no sleeps, no clock). Times are plain seconds from an arbitrary origin.
"""

from __future__ import annotations

import pytest

from zdmq.server.state import (
    DeadLetter,
    Extend,
    ForgetDedup,
    Lease,
    MessageView,
    NodeState,
    Op,
    Purge,
    Push,
    Remove,
    Requeue,
)

from .views import all_ids, where

T0 = 1000.0  # when the messages of a test are pushed and first leased
VIS = 30.0  # the visibility timeout the tests lease with
EMPTY = {"ready": 0, "in_flight": 0, "delayed": 0, "dead_lettered": 0, "expired": 0}


class _Tokens:
    """Lease tokens t1, t2, ... in the order the planner asks for them."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"t{self.n}"


def _state(queue: str = "jobs", ids: tuple[str, ...] = ("a", "b"), now: float = T0) -> NodeState:
    state = NodeState()
    for mid in ids:
        state.push(queue, mid, mid.encode(), None, now=now)
    return state


def _lease(
    state: NodeState,
    tokens: _Tokens,
    limit: int = 1,
    *,
    queue: str = "jobs",
    now: float = T0,
    visibility_s: float = VIS,
) -> list[tuple[str, str]]:
    """(id, token) of each message the planner leased."""
    got, _ = state.lease(queue, limit, now=now, visibility_s=visibility_s, new_token=tokens)
    return [(t.id, t.token) for t in got]


def _find(state: NodeState, mid: str) -> MessageView:
    m = state.find(mid)
    assert m is not None, f"{mid} is not stored"
    return m


# ---- lease -----------------------------------------------------------------------------
def test_a_lease_makes_the_message_invisible_and_counts_the_delivery() -> None:
    state, tokens = _state(), _Tokens()
    seq_a = _find(state, "a").seq
    got, ops = state.lease("jobs", 1, now=T0, visibility_s=VIS, new_token=tokens)
    [taken] = got
    assert (taken.id, taken.token, taken.body, taken.receive_count) == ("a", "t1", b"a", 1)
    assert ops == [Lease("jobs", "a", seq_a, "t1", T0 + VIS, 1)]
    m = _find(state, "a")
    assert (m.lease, m.lease_until, m.receive_count) == ("t1", T0 + VIS, 1)
    assert where(state) == (["b"], {"a"}, set())
    assert state.counts("jobs") == {**EMPTY, "ready": 1, "in_flight": 1}
    # Invisible, not gone: the queue still holds it.
    assert state.depth("jobs") == 2
    assert _lease(state, tokens, 10) == [("b", "t2")]
    assert state.lease("jobs", 10, now=T0, visibility_s=VIS, new_token=tokens) == ([], [])


def test_a_lease_takes_at_most_the_limit_in_arrival_order() -> None:
    state, tokens = _state(ids=("a", "b", "c", "d")), _Tokens()
    assert _lease(state, tokens, 3) == [("a", "t1"), ("b", "t2"), ("c", "t3")]
    assert where(state) == (["d"], {"a", "b", "c"}, set())


def test_a_lease_of_an_unknown_queue_is_empty_and_asks_for_no_token() -> None:
    tokens = _Tokens()
    assert NodeState().lease("nope", 5, now=T0, visibility_s=VIS, new_token=tokens) == ([], [])
    assert tokens.n == 0


def test_each_delivery_increments_the_receive_count() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    for count in (1, 2, 3):
        now = T0 + 100 * count
        [(_, token)] = _lease(state, tokens, now=now)
        assert _find(state, "a").receive_count == count
        assert state.requeue("jobs", "a", token, now + 1) is not None


# ---- ack -------------------------------------------------------------------------------
def test_an_ack_with_the_current_token_removes_the_message() -> None:
    state, tokens = _state(), _Tokens()
    seq_a = _find(state, "a").seq
    [(_, token)] = _lease(state, tokens)
    assert state.ack("jobs", "a", token, T0 + VIS - 0.001) == Remove("jobs", "a", seq_a)
    assert state.find("a") is None
    assert where(state) == (["b"], set(), set())
    assert state.counts("jobs") == {**EMPTY, "ready": 1}


def test_a_second_ack_of_the_same_receipt_returns_none() -> None:
    state, tokens = _state(), _Tokens()
    [(_, token)] = _lease(state, tokens)
    assert state.ack("jobs", "a", token, T0 + 1) is not None
    assert state.ack("jobs", "a", token, T0 + 2) is None
    assert state.depth("jobs") == 1


@pytest.mark.parametrize(
    "late_s", [0.0, 0.001, 1000.0], ids=["at_until", "just_after", "long_after"]
)
def test_an_ack_at_or_after_lease_until_returns_none_before_the_monitor_runs(
    late_s: float,
) -> None:
    state, tokens = _state(), _Tokens()
    [(_, token)] = _lease(state, tokens)
    assert state.ack("jobs", "a", token, T0 + VIS + late_s) is None
    # Nothing requeued it yet, but the lease is lost: the message stays, still leased.
    assert _find(state, "a").lease == token
    assert where(state) == (["b"], {"a"}, set())


def test_an_ack_with_a_wrong_token_queue_or_id_returns_none() -> None:
    state, tokens = _state(), _Tokens()
    state.push("other", "c", b"c", None, now=T0)
    [(_, token)] = _lease(state, tokens)
    assert state.ack("jobs", "a", "t999", T0 + 1) is None
    assert state.ack("other", "a", token, T0 + 1) is None
    assert state.ack("jobs", "b", token, T0 + 1) is None  # ready, never leased
    assert state.ack("jobs", "zzz", token, T0 + 1) is None
    assert _find(state, "a").lease == token
    assert state.depth("jobs") == 2


# ---- nack ------------------------------------------------------------------------------
def test_a_nack_makes_the_message_visible_again_at_once() -> None:
    state, tokens = _state(), _Tokens()
    seq_a = _find(state, "a").seq
    [(_, token)] = _lease(state, tokens)
    fresh = state.next_seq
    assert state.requeue("jobs", "a", token, T0 + 10) == Requeue("jobs", "a", seq_a, T0 + 10, fresh)
    assert _find(state, "a").seq == fresh  # it queues up again behind everything stored
    m = _find(state, "a")
    assert (m.lease, m.lease_until) == (None, 0.0)
    # Ready again, behind the message that waited.
    assert where(state) == (["b", "a"], set(), set())
    assert state.counts("jobs") == {**EMPTY, "ready": 2}
    # The old receipt is dead; the next delivery is a new lease with a new token.
    assert state.ack("jobs", "a", token, T0 + 11) is None
    assert _lease(state, tokens, 2, now=T0 + 11) == [("b", "t2"), ("a", "t3")]
    assert _find(state, "a").receive_count == 2


def test_a_nack_with_a_delay_keeps_the_message_hidden_until_wake_passes_visible_at() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    seq_a = _find(state, "a").seq
    [(_, token)] = _lease(state, tokens)
    op = state.requeue("jobs", "a", token, T0 + 10, delay_s=5)
    assert op == Requeue("jobs", "a", seq_a, T0 + 15, state.next_seq - 1)
    assert where(state) == ([], set(), {"a"})
    assert state.counts("jobs") == {**EMPTY, "delayed": 1}
    assert state.depth("jobs") == 1
    assert state.next_timer() == T0 + 15
    # Not visible before its time, not to a lease either.
    assert _lease(state, tokens, now=T0 + 14.999) == []
    assert state.wake(T0 + 14.999) == set()
    assert state.wake(T0 + 15) == {"jobs"}
    assert where(state) == (["a"], set(), set())
    assert state.wake(T0 + 100) == set()  # woken once
    assert _lease(state, tokens, now=T0 + 15) == [("a", "t2")]


def test_a_lease_wakes_delayed_messages_whose_time_has_come() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, token)] = _lease(state, tokens)
    state.requeue("jobs", "a", token, T0 + 1, delay_s=5)
    assert _lease(state, tokens, now=T0 + 6) == [("a", "t2")]


def test_wake_reports_every_queue_that_got_visible_messages() -> None:
    state, tokens = NodeState(), _Tokens()
    for q, delay in (("q1", 5), ("q2", 7), ("q3", 50)):
        state.push(q, f"{q}-m", b"", None, now=T0)
        [(mid, token)] = _lease(state, tokens, queue=q)
        state.requeue(q, mid, token, T0, delay_s=delay)
    assert state.wake(T0 + 10) == {"q1", "q2"}
    assert [state.counts(q)["delayed"] for q in ("q1", "q2", "q3")] == [0, 0, 1]


# ---- extend ----------------------------------------------------------------------------
def test_extend_moves_the_deadline_from_now() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    seq_a = _find(state, "a").seq
    [(_, token)] = _lease(state, tokens)
    assert state.extend("jobs", "a", token, T0 + 20, 60) == Extend("jobs", "a", seq_a, T0 + 80)
    assert _find(state, "a").lease_until == T0 + 80
    # The old deadline no longer ends the lease.
    assert state.due_leases(T0 + VIS) == []
    assert state.ack("jobs", "a", token, T0 + 79) is not None


def test_extend_can_shorten_a_lease() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, token)] = _lease(state, tokens)
    assert state.extend("jobs", "a", token, T0 + 1, 2) is not None
    assert state.due_leases(T0 + 3) == [("jobs", "a", token)]


def test_an_expired_lease_cannot_be_extended() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, token)] = _lease(state, tokens)
    assert state.extend("jobs", "a", token, T0 + VIS, 60) is None
    assert state.extend("jobs", "a", token, T0 + VIS + 5, 60) is None
    assert _find(state, "a").lease_until == T0 + VIS
    assert state.extend("jobs", "a", "t999", T0 + 1, 60) is None


# ---- expiry ----------------------------------------------------------------------------
def test_due_leases_returns_expired_leases_only_once_oldest_first() -> None:
    state, tokens = _state(ids=("a", "b", "c")), _Tokens()
    [(_, ta)] = _lease(state, tokens, visibility_s=10)
    [(_, tb)] = _lease(state, tokens, visibility_s=20)
    [(_, tc)] = _lease(state, tokens, visibility_s=5)
    assert state.due_leases(T0 + 4.999) == []
    assert state.due_leases(T0 + 10) == [("jobs", "c", tc), ("jobs", "a", ta)]
    assert state.due_leases(T0 + 10) == []
    assert state.due_leases(T0 + 1000) == [("jobs", "b", tb)]
    assert state.due_leases(T0 + 1000) == []
    # Handing them out changed nothing: the planner that requeues them does.
    assert where(state) == ([], {"a", "b", "c"}, set())


def test_due_leases_hands_out_at_most_the_limit_and_keeps_the_rest() -> None:
    state, tokens = _state(ids=("a", "b", "c")), _Tokens()
    leased = _lease(state, tokens, 3)
    due = state.due_leases(T0 + VIS, limit=2) + state.due_leases(T0 + VIS, limit=2)
    assert due == [("jobs", mid, token) for mid, token in leased]


def test_recheck_puts_a_due_lease_back_for_the_next_look() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, token)] = _lease(state, tokens)
    assert state.due_leases(T0 + VIS) == [("jobs", "a", token)]
    state.recheck("a")
    assert state.next_timer() == T0 + VIS
    assert state.due_leases(T0 + VIS) == [("jobs", "a", token)]
    # Recheck of a message that is not leased (or not held) puts nothing back.
    state.requeue("jobs", "a", token, T0 + VIS, expired=True)
    state.recheck("a")
    state.recheck("nope")
    assert state.due_leases(T0 + 10_000) == []


def test_the_expiry_requeue_refuses_a_lease_that_is_still_running() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    seq_a = _find(state, "a").seq
    [(_, token)] = _lease(state, tokens)
    assert state.requeue("jobs", "a", token, T0 + VIS - 0.001, expired=True) is None
    assert where(state) == ([], {"a"}, set())
    op = state.requeue("jobs", "a", token, T0 + VIS, expired=True)
    assert op == Requeue("jobs", "a", seq_a, T0 + VIS, state.next_seq - 1)
    assert where(state) == (["a"], set(), set())


def test_a_nack_refuses_a_lease_that_has_expired() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, token)] = _lease(state, tokens)
    assert state.requeue("jobs", "a", token, T0 + VIS) is None
    assert state.requeue("jobs", "a", token, T0 + VIS + 1, delay_s=60) is None
    assert where(state) == ([], {"a"}, set())
    # Expiry does it, without the nack's delay.
    assert state.requeue("jobs", "a", token, T0 + VIS + 1, expired=True) is not None
    assert where(state) == (["a"], set(), set())


def test_a_lease_of_zero_seconds_is_due_at_once_and_cannot_be_acked() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, token)] = _lease(state, tokens, visibility_s=0)
    assert state.ack("jobs", "a", token, T0) is None
    assert state.due_leases(T0) == [("jobs", "a", token)]


@pytest.mark.parametrize("first", ["ack", "nack", "expiry"])
def test_the_first_of_ack_nack_and_expiry_to_reach_a_lease_wins(first: str) -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, token)] = _lease(state, tokens)
    early, late = T0 + 1, T0 + VIS + 1

    def ack() -> Op | None:
        return state.ack("jobs", "a", token, early)

    def nack() -> Op | None:
        return state.requeue("jobs", "a", token, early)

    def expiry() -> Op | None:
        return state.requeue("jobs", "a", token, late, expired=True)

    planners = {"ack": ack, "nack": nack, "expiry": expiry}
    assert planners.pop(first)() is not None
    before = where(state)
    for loser in planners.values():
        assert loser() is None
    assert where(state) == before
    # The lease's timer is stale now: the monitor finds nothing to do.
    assert state.due_leases(T0 + 10_000) == []


def test_an_old_receipt_cannot_touch_the_next_lease_of_the_same_message() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    [(_, old)] = _lease(state, tokens)
    state.requeue("jobs", "a", old, T0 + VIS, expired=True)
    [(_, new)] = _lease(state, tokens, now=T0 + VIS)
    now = T0 + VIS + 1
    assert state.ack("jobs", "a", old, now) is None
    assert state.extend("jobs", "a", old, now, 60) is None
    assert state.requeue("jobs", "a", old, now) is None
    assert _find(state, "a").lease == new
    assert state.ack("jobs", "a", new, now) is not None


# ---- dead letters ----------------------------------------------------------------------
def _deliver_and_fail(state: NodeState, tokens: _Tokens, now: float, *, expire: bool) -> Op | None:
    """Leases `a`, then ends the lease by nack or by expiry, with max_receives=2 -> dead."""
    [(mid, token)] = _lease(state, tokens, now=now)
    assert mid == "a"
    at = now + VIS if expire else now + 1
    return state.requeue(
        "jobs", "a", token, at, expired=expire, max_receives=2, dead_letter_queue="dead"
    )


@pytest.mark.parametrize("expire", [False, True], ids=["nack", "expiry"])
def test_past_max_receives_the_message_moves_to_the_dead_letter_queue_with_its_id(
    expire: bool,
) -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    state.push("dead", "older", b"", None, now=T0)
    assert type(_deliver_and_fail(state, tokens, T0, expire=expire)) is Requeue
    seq_a = _find(state, "a").seq
    moved_at = T0 + 100 + (VIS if expire else 1)
    op = _deliver_and_fail(state, tokens, T0 + 100, expire=expire)
    assert op == DeadLetter("jobs", "a", seq_a, "dead", moved_at, state.next_seq - 1)

    m = _find(state, "a")
    assert (m.queue, m.origin, m.receive_count, m.lease, m.seq, m.body) == (
        "dead",
        "jobs",
        0,
        None,
        op.new_seq,  # it joined the DLQ's tail
        b"a",
    )
    assert m.enqueued_at == moved_at
    # In the DLQ's ready ids, behind what it held; in no part of the source queue.
    assert where(state, "dead") == (["older", "a"], set(), set())
    assert where(state, "jobs") == ([], set(), set())
    assert state.depth("jobs") == 0 and state.depth("dead") == 2
    assert state.counts("jobs") == {**EMPTY, "dead_lettered": 1, "expired": 0}
    assert state.counts("dead") == {**EMPTY, "ready": 2}
    assert state.queues["jobs"].first_uuid is None
    # The old lease is over in the source queue; the DLQ delivers it afresh.
    assert state.due_leases(T0 + 10_000) == []
    _lease(state, tokens, queue="dead", now=T0 + 200)
    [(mid, token)] = _lease(state, tokens, queue="dead", now=T0 + 200)
    assert (mid, _find(state, "a").receive_count) == ("a", 1)
    assert state.ack("dead", "a", token, T0 + 201) is not None
    # Gone from the DLQ: no longer counted against its origin.
    assert state.counts("jobs") == EMPTY


def test_a_message_dead_lettered_into_an_empty_queue_becomes_its_first_uuid() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    _deliver_and_fail(state, tokens, T0, expire=False)
    _deliver_and_fail(state, tokens, T0 + 100, expire=False)
    assert state.queues["dead"].first_uuid == "a"


def test_below_max_receives_or_without_a_dlq_a_failed_delivery_is_requeued() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    for i in range(3):
        [(_, token)] = _lease(state, tokens, now=T0 + 10 * i)
        op = state.requeue("jobs", "a", token, T0 + 10 * i + 1, max_receives=1)
        assert type(op) is Requeue
    [(_, token)] = _lease(state, tokens, now=T0 + 100)
    op = state.requeue("jobs", "a", token, T0 + 101, max_receives=5, dead_letter_queue="dead")
    assert type(op) is Requeue
    assert _find(state, "a").receive_count == 4
    assert "dead" not in state.queues


def test_purging_the_dead_letter_queue_uncounts_its_messages_from_their_origin() -> None:
    state, tokens = _state(ids=("a",)), _Tokens()
    _deliver_and_fail(state, tokens, T0, expire=False)
    _deliver_and_fail(state, tokens, T0 + 100, expire=False)
    assert state.counts("jobs")["dead_lettered"] == 1
    seq_a = _find(state, "a").seq
    assert state.purge("dead") == Purge("dead", (seq_a,))
    assert state.counts("jobs") == EMPTY
    assert all_ids(state) == set()


# ---- dedup -----------------------------------------------------------------------------
def test_a_dedup_id_is_a_duplicate_inside_its_window_even_after_the_message_is_gone() -> None:
    state = NodeState()
    op = state.push("jobs", "d1", b"x", None, now=T0, dedup_window_s=300)
    assert op == Push("jobs", "d1", op.seq, b"x", None, T0, T0 + 300)
    assert state.is_duplicate("d1", T0)
    state.pop("jobs", 1, now=T0 + 1)
    assert state.find("d1") is None
    assert state.is_duplicate("d1", T0 + 299.999)
    assert not state.is_duplicate("d1", T0 + 300)
    assert not state.is_duplicate("other", T0)


def test_forget_dedup_drops_records_past_their_window_and_keeps_the_rest() -> None:
    state = NodeState()
    state.push("jobs", "d1", b"", None, now=T0, dedup_window_s=100)
    state.push("jobs", "d2", b"", None, now=T0, dedup_window_s=200)
    state.pop("jobs", 10, now=T0)
    # Not past the end of any window yet: nothing to forget, no op to persist.
    assert state.forget_dedup(T0 + 100) is None
    assert state.forget_dedup(T0 + 150) == ForgetDedup(T0 + 150)
    assert set(state.dedup) == {"d2"}
    # Forgotten means forgotten, whatever time a later push claims.
    assert not state.is_duplicate("d1", T0)
    assert state.is_duplicate("d2", T0 + 150)
    assert state.forget_dedup(T0 + 150) is None


def test_a_push_without_a_window_is_a_duplicate_only_while_it_is_stored() -> None:
    state = NodeState()
    op = state.push("jobs", "m", b"", None, now=T0)
    assert op.dedup_until == 0.0
    assert state.is_duplicate("m", T0)
    state.pop("jobs", 1, now=T0)
    assert not state.is_duplicate("m", T0)
    assert state.dedup == {}
    assert state.forget_dedup(T0 + 10_000) is None


def test_a_dedup_id_can_be_pushed_again_once_its_record_is_forgotten() -> None:
    state = NodeState()
    state.push("jobs", "d1", b"first", None, now=T0, dedup_window_s=10)
    state.pop("jobs", 1, now=T0)
    state.forget_dedup(T0 + 11)
    assert not state.is_duplicate("d1", T0 + 11)
    state.push("jobs", "d1", b"second", None, now=T0 + 11, dedup_window_s=10)
    assert state.is_duplicate("d1", T0 + 20)
    # The new record's window, not the forgotten one's, decides.
    assert state.forget_dedup(T0 + 12) is None
    assert state.dedup["d1"] == ("jobs", T0 + 21)


# ---- purge -----------------------------------------------------------------------------
def test_purge_drops_ready_leased_and_delayed_messages_and_the_queues_dedup_records() -> None:
    state, tokens = NodeState(), _Tokens()
    seqs = [
        state.push("jobs", mid, b"", None, now=T0, dedup_window_s=300).seq
        for mid in ("ready", "leased", "delayed")
    ]
    state.push("keep", "k", b"", None, now=T0, dedup_window_s=300)
    # Leases go head first: "ready" is leased and put back behind the others.
    [(_, t_ready)] = _lease(state, tokens)
    state.requeue("jobs", "ready", t_ready, T0)
    _lease(state, tokens)  # "leased"
    [(mid, t_delayed)] = _lease(state, tokens)
    state.requeue("jobs", mid, t_delayed, T0, delay_s=60)
    assert where(state) == (["ready"], {"leased"}, {"delayed"})

    # Requeues gave "ready" and "delayed" fresh seqs; the purge names the current ones.
    seqs = sorted(_find(state, mid).seq for mid in ("ready", "leased", "delayed"))
    op = state.purge("jobs")
    assert op is not None and op.queue == "jobs"
    assert sorted(op.seqs) == seqs
    assert all_ids(state) == {"k"}
    assert set(state.dedup) == {"k"}
    assert "jobs" not in state.queues
    assert state.counts("jobs") == EMPTY
    assert not state.is_duplicate("ready", T0 + 1)
    assert state.is_duplicate("k", T0 + 1)
    # Timers of the purged messages are stale: nothing comes back.
    assert state.due_leases(T0 + 10_000) == []
    assert state.wake(T0 + 10_000) == set()
    assert state.counts("keep") == {**EMPTY, "ready": 1}


def test_purge_of_a_queue_that_holds_only_dedup_records_drops_them() -> None:
    state = NodeState()
    state.push("jobs", "d1", b"", None, now=T0, dedup_window_s=300)
    state.pop("jobs", 1, now=T0)
    assert state.purge("jobs") == Purge("jobs", ())
    assert state.dedup == {}
    assert state.purge("jobs") is None


# ---- retention -------------------------------------------------------------------------
def test_pop_drops_ready_messages_past_retention_and_returns_their_removes() -> None:
    state = NodeState()
    seqs = {
        mid: state.push("jobs", mid, mid.encode(), None, now=at).seq
        for mid, at in (("old", T0), ("edge", T0 + 50), ("new", T0 + 60))
    }
    # Retention 100 s at T0 + 150: "old" is past it, "edge" is exactly at it and stays.
    got, ops = state.pop("jobs", 1, now=T0 + 150, retention_s=100)
    assert [t.id for t in got] == ["edge"]
    assert ops == [Remove("jobs", "old", seqs["old"]), Remove("jobs", "edge", seqs["edge"])]
    assert state.ready_list("jobs") == ["new"]
    assert all_ids(state) == {"new"}


def test_without_retention_pop_keeps_messages_of_any_age() -> None:
    state = NodeState()
    state.push("jobs", "ancient", b"", None, now=0.0)
    got, _ = state.pop("jobs", 1, now=T0 * 1000)
    assert [t.id for t in got] == ["ancient"]


def test_lease_drops_ready_messages_past_retention_but_not_leased_ones() -> None:
    state, tokens = NodeState(), _Tokens()
    for mid in ("leased", "old"):
        state.push("jobs", mid, b"", None, now=T0)
    state.push("jobs", "new", b"", None, now=T0 + 100)
    seq = {mid: _find(state, mid).seq for mid in all_ids(state)}
    _lease(state, tokens, visibility_s=1000)
    got, ops = state.lease(
        "jobs", 5, now=T0 + 150, visibility_s=VIS, new_token=tokens, retention_s=100
    )
    assert [(t.id, t.token) for t in got] == [("new", "t2")]
    assert ops == [
        Remove("jobs", "old", seq["old"]),
        Lease("jobs", "new", seq["new"], "t2", T0 + 150 + VIS, 1),
    ]
    assert where(state) == ([], {"leased", "new"}, set())


def test_expired_by_retention_removes_old_ready_messages_from_the_head() -> None:
    state, tokens = NodeState(), _Tokens()
    # At T0 + 150 with retention 100, m3 (T0 + 50) is exactly at the limit and stays.
    for i, at in enumerate((T0, T0 + 10, T0 + 20, T0 + 50)):
        state.push("jobs", f"m{i}", b"", None, now=at)
    seq = {mid: _find(state, mid).seq for mid in all_ids(state)}
    _lease(state, tokens, visibility_s=10_000)  # m0: leased, so not dropped
    assert state.expired_by_retention("jobs", T0 + 150, 100, limit=1) == [
        Remove("jobs", "m1", seq["m1"])
    ]
    assert state.expired_by_retention("jobs", T0 + 150, 100) == [Remove("jobs", "m2", seq["m2"])]
    assert state.expired_by_retention("jobs", T0 + 150, 100) == []
    assert where(state) == (["m3"], {"m0"}, set())
    assert state.expired_by_retention("nope", T0 + 150, 100) == []


def test_a_retention_check_is_not_repeated_before_the_head_can_expire() -> None:
    state = NodeState()
    state.push("jobs", "a", b"", None, now=T0)
    state.push("jobs", "b", b"", None, now=T0 + 50)
    assert state.expired_by_retention("jobs", T0 + 10, 100) == []
    # The head (a) cannot expire before T0 + 100: the queue is not looked at until then.
    assert state.queues["jobs"].retention_due == T0 + 100
    assert state.expired_by_retention("jobs", T0 + 99, 100) == []
    seq_a = _find(state, "a").seq
    assert state.expired_by_retention("jobs", T0 + 101, 100) == [Remove("jobs", "a", seq_a)]
    assert state.expired_by_retention("jobs", T0 + 101, 100) == []
    assert state.queues["jobs"].retention_due == T0 + 150


def test_a_message_ready_again_with_an_older_push_time_is_checked_at_the_next_sweep() -> None:
    state, tokens = NodeState(), _Tokens()
    state.push("jobs", "a", b"", None, now=T0)
    state.push("jobs", "b", b"", None, now=T0 + 50)
    [(_, token)] = _lease(state, tokens, visibility_s=1000)  # a
    assert state.expired_by_retention("jobs", T0 + 60, 100) == []  # head b: due at T0 + 150
    assert state.requeue("jobs", "a", token, T0 + 60) is not None  # a: ready behind b
    assert _lease(state, tokens, now=T0 + 70, visibility_s=1000) == [("b", "t2")]
    # a (pushed at T0) is the head now and past retention at T0 + 120.
    seq_a = _find(state, "a").seq
    assert state.expired_by_retention("jobs", T0 + 120, 100) == [Remove("jobs", "a", seq_a)]


# ---- counts, timers and replay ---------------------------------------------------------
def test_counts_report_ready_in_flight_delayed_and_dead_lettered() -> None:
    state, tokens = _state(ids=("a", "b", "c", "d", "e")), _Tokens()
    assert state.counts("nope") == EMPTY
    _lease(state, tokens)  # a: in flight
    [(_, tb)] = _lease(state, tokens)
    state.requeue("jobs", "b", tb, T0 + 1, delay_s=60)  # b: delayed
    [(_, tc)] = _lease(state, tokens)
    state.requeue("jobs", "c", tc, T0 + 1, max_receives=1, dead_letter_queue="dead")  # c: dead
    assert state.counts("jobs") == {
        "ready": 2,
        "in_flight": 1,
        "delayed": 1,
        "dead_lettered": 1,
        "expired": 0,
    }
    assert state.depth("jobs") == 4
    assert state.counts("dead") == {**EMPTY, "ready": 1}
    assert state.depth("dead") == 1


def test_next_timer_is_the_earliest_lease_end_or_delay_end() -> None:
    state, tokens = _state(ids=("a", "b")), _Tokens()
    assert state.next_timer() is None
    _lease(state, tokens, visibility_s=50)
    assert state.next_timer() == T0 + 50
    [(_, tb)] = _lease(state, tokens, visibility_s=50)
    state.requeue("jobs", "b", tb, T0 + 1, delay_s=9)
    assert state.next_timer() == T0 + 10


def _snapshot(state: NodeState) -> dict[str, object]:
    return {
        "queues": {
            q: (state.ready_list(q), set(lq.leased), set(lq.delayed))
            for q, lq in state.queues.items()
            if lq.holds()
        },
        "messages": {mid: _find(state, mid) for mid in all_ids(state)},
        "dead_lettered": dict(state.dead_lettered),
        "dedup": dict(state.dedup),
    }


def test_replaying_the_returned_ops_rebuilds_the_same_state() -> None:
    # What storage persists and replication ships is the ops: they must carry every change.
    state, tokens = NodeState(), _Tokens()
    ops: list[Op] = []
    for i in range(6):
        ops.append(state.push("jobs", f"m{i}", b"%d" % i, None, now=T0 + i, dedup_window_s=50))
    got, lease_ops = state.lease("jobs", 4, now=T0 + 10, visibility_s=VIS, new_token=tokens)
    ops += lease_ops
    (m0, t0), (m1, t1), (m2, t2), (m3, t3) = [(t.id, t.token or "") for t in got]
    for op in (
        state.ack("jobs", m0, t0, T0 + 11),
        state.requeue("jobs", m1, t1, T0 + 11, delay_s=100),
        state.extend("jobs", m2, t2, T0 + 11, 500),
        state.requeue("jobs", m3, t3, T0 + 12, max_receives=1, dead_letter_queue="dead"),
    ):
        assert op is not None
        ops.append(op)
    popped, pop_ops = state.pop("jobs", 10, now=T0 + 13, retention_s=8.5)
    assert [t.id for t in popped] == ["m5"]  # m4 (T0 + 4) is past retention
    ops += pop_ops
    forget = state.forget_dedup(T0 + 52)  # the records of m0 and m1
    assert forget is not None
    ops.append(forget)

    replica = NodeState()
    for persisted in ops:
        replica.apply(persisted)
    replica.wake(T0 + 52)
    assert _snapshot(replica) == _snapshot(state)
