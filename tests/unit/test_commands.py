"""Commands replay the same way: equal states, equal results, through the wire format.

A leader builds each command from its own state, as a node does (the leases it acks are
those it handed out; the leases it expires are those its timer heap says ran out), and
applies it; two replicas apply the same command after `encode_command` and
`decode_command`. After every step the three states and results must be equal; at the
end a replica rebuilt from the whole command log must be equal too.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zdmq.errors import (
    MessageIdConflict,
    MessageTooLarge,
    QueueExists,
    QueueNotFound,
    SubscriptionNotFound,
    TopicExists,
    TopicNotFound,
)
from zdmq.models import QueueSettings
from zdmq.raft.sim_queue import plain, state_view
from zdmq.server.machine import (
    CancelMessage,
    Claim,
    Command,
    DropEmpty,
    Expire,
    Housekeep,
    Meta,
    PurgeQueue,
    Push,
    PushTake,
    Settle,
    Take,
    Tie,
    Untie,
    Wake,
    apply_command,
    decode_command,
    encode_command,
)
from zdmq.server.state import (
    CreateQueue,
    CreateTopic,
    DropQueue,
    DropTopic,
    NodeState,
    Register,
    Subscribe,
    Taken,
    Unregister,
    Unsubscribe,
)

QUEUES = ("jobs", "mail", "jobs-dlq", "orders")  # orders is a FIFO queue
TOPICS = ("events", "jobs")  # "jobs" is a queue's name too: the namespaces are separate


dump = state_view


class Cluster:
    """A leader and two replicas fed the same commands (one replica through the wire)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.leader, self.direct, self.wired = NodeState(), NodeState(), NodeState()
        self.log: list[bytes] = []
        self.now = 1_000.0
        self.leases: list[tuple[str, str, str]] = []  # (queue, id, token) handed out
        self.n = 0

    def run(self, cmd: Command) -> Any:
        data = encode_command(cmd)
        assert encode_command(decode_command(data)) == data
        self.log.append(data)
        result = apply_command(self.leader, cmd)
        assert plain(apply_command(self.direct, cmd)) == plain(result)
        assert plain(apply_command(self.wired, decode_command(data))) == plain(result)
        assert dump(self.leader) == dump(self.direct) == dump(self.wired)
        return result

    def step(self, kind: int) -> None:
        rng, q = self.rng, self.rng.choice(QUEUES)
        if kind == 0:  # push, some by dedup id, some ids repeated
            items = []
            for _ in range(rng.randint(1, 4)):
                self.n += 1
                mid = f"m{rng.randint(1, self.n)}" if rng.random() < 0.2 else f"m{self.n}"
                items.append((mid, f"body {self.n}".encode(), rng.choice([None, "text/plain"])))
            dedup = rng.random() < 0.3
            if q == "orders":  # in FIFO groups, some with attributes
                pushed = [
                    (*i, dedup, 0, 0.0, 0.0, rng.choice([None, '{"a":"b"}']), rng.choice("xyz"))
                    for i in items
                ]
                cmd = Push(q, pushed, self.now, 64, 30.0)
            elif rng.random() < 0.5:
                cmd = Push(q, [(m, b, ct, dedup) for m, b, ct in items], self.now, 64, 30.0)
            else:  # with priorities, deadlines, delays and attributes
                options = [
                    (
                        rng.choice([0, 0, 2, 9]),
                        rng.choice([0.0, self.now + 2.0, self.now + 30.0]),
                        rng.choice([0.0, 0.0, 3.0]),
                        rng.choice([None, '{"a":"b"}']),
                    )
                    for _ in items
                ]
                pushed = [(*i, dedup, *o) for i, o in zip(items, options, strict=True)]
                cmd = Push(q, pushed, self.now, 64, 30.0)
            if rng.random() < 0.3:  # a stream waits with credit: the push leases for it
                limit, base = rng.randint(1, 5), f"{rng.getrandbits(48):012x}"
                retention = rng.choice([None, 50.0])
                cmd = PushTake(*cmd, limit, retention, rng.choice([5.0, 20.0]), base)
                result = self.run(cmd)
                if not isinstance(result, Exception):
                    self.leases += [(q, t.id, t.token) for t in result[1] if t.token]
                return
            self.run(cmd)
        elif kind == 1:  # pop or receive
            lease_s = rng.choice([None, 5.0, 20.0])
            token_base = f"{rng.getrandbits(48):012x}"
            taken: list[Taken] = self.run(
                Take(
                    q,
                    rng.randint(1, 3),
                    self.now,
                    rng.choice([None, 50.0]),
                    lease_s,
                    token_base,
                    rng.choice([0, 0, 2]),
                )
            )
            self.leases += [(q, t.id, t.token) for t in taken if t.token is not None]
        elif kind == 2 and self.leases:  # ack, nack or extend leases handed out
            picked = rng.sample(self.leases, min(len(self.leases), rng.randint(1, 3)))
            by_queue: dict[str, list[tuple[str, str]]] = {}
            for lq, mid, token in picked:
                by_queue.setdefault(lq, []).append((mid, token))
            for lq, leases in by_queue.items():
                action = rng.choice(["ack", "nack", "extend"])
                self.run(
                    Settle(
                        lq, action, leases, self.now, rng.choice([0.0, 3.0]), 10.0, 2, "jobs-dlq"
                    )
                )
        elif kind == 3:  # the clock moves; the leader's monitor expires what ran out
            self.now += rng.choice([-3.0, 0.5, 4.0, 11.0, 60.0])  # another member's clock
            due: dict[str, list[tuple[str, str]]] = {}
            for lq, mid, token in self.leader.due_leases(self.now):
                due.setdefault(lq, []).append((mid, token))
            for lq, leases in due.items():
                self.run(Expire(lq, leases, self.now, 2, "jobs-dlq"))
            if self.leader.delays_due(self.now):
                self.run(Wake(self.now))
        elif kind == 4:
            self.run(Housekeep(self.now, [(x, 50.0) for x in QUEUES]))
        elif kind == 5:  # metadata changes, some refused
            op = rng.choice(
                [
                    CreateQueue(q, f"inc{self.n}", self.now, QueueSettings(max_receives=2)),
                    CreateQueue(
                        q, "f", self.now, QueueSettings(fifo=True, content_based_dedup=True)
                    ),
                    DropQueue(q, "inc", self.now),
                    Register(q, rng.choice("abc"), f"m{self.n}"),
                    Unregister(q, rng.choice("abc")),
                    CreateTopic(t := rng.choice(TOPICS), self.now),
                    DropTopic(t),
                    Subscribe(t, q),
                    Subscribe(t, q),
                    Unsubscribe(t, q),
                ]
            )
            self.run(Meta([op], max_queues=2))
        elif kind == 6:
            self.run(rng.choice([PurgeQueue(q), DropEmpty(q)]))
        elif kind == 7:  # cancel a message, perhaps one delivered, leased or cancelled
            self.run(CancelMessage(q, f"m{rng.randint(1, max(self.n, 1))}"))
        elif kind == 8:  # ties: a new one with tied copies, claims, cancels
            token = f"t{rng.randint(1, 4)}"
            roll = rng.random()
            if roll < 0.4:
                copies = []
                for queue in ("jobs", "mail"):
                    self.n += 1
                    copies.append((queue, f"m{self.n}"))
                self.run(Tie(token, copies, self.now))
                for queue, mid in copies:
                    item = (mid, b"tied", None, False, 0, 0.0, 0.0, None, None, token)
                    self.run(Push(queue, [item], self.now))
            elif roll < 0.85:
                self.run(Claim(token, f"m{rng.randint(1, max(self.n, 1))}"))
            else:
                self.run(Untie(token))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.lists(st.integers(0, 8), min_size=10, max_size=120))
def test_replicas_fed_the_same_commands_agree_on_every_result_and_the_whole_state(
    seed: int, steps: list[int]
) -> None:
    c = Cluster(seed)
    for kind in steps:
        c.step(kind)
    rebuilt = NodeState()
    for data in c.log:
        apply_command(rebuilt, decode_command(data))
    assert dump(rebuilt) == dump(c.leader)


def test_a_refused_push_stores_nothing_and_returns_its_error() -> None:
    state = NodeState()
    apply_command(state, Push("jobs", [("a", b"x", None, False)], 1.0))
    before = dump(state)
    too_large = apply_command(
        state, Push("jobs", [("b", b"ok", None, False), ("c", b"x" * 9, None, False)], 2.0, 8)
    )
    assert isinstance(too_large, MessageTooLarge)
    in_use = apply_command(
        state, Push("mail", [("d", b"", None, False), ("a", b"", None, False)], 2.0)
    )
    assert isinstance(in_use, MessageIdConflict)
    assert dump(state) == before


def test_pushes_report_repeats_and_dedup_windows() -> None:
    state = NodeState()
    first = apply_command(
        state, Push("jobs", [("a", b"1", None, True), ("b", b"2", None, False)], 1.0, None, 10.0)
    )
    again = apply_command(
        state,
        Push(
            "jobs",
            [
                ("a", b"1", None, True),
                ("b", b"2", None, False),
                ("c", b"3", None, False),
                ("c", b"3", None, False),
            ],
            2.0,
            None,
            10.0,
        ),
    )
    assert (first, again) == ([False, False], [True, True, False, True])
    assert state.ready_list("jobs") == ["a", "b", "c"]


def test_leases_carry_the_tokens_of_the_command_so_every_replica_hands_out_the_same() -> None:
    state = NodeState()
    apply_command(state, Push("jobs", [(f"m{i}", b"", None, False) for i in range(3)], 1.0))
    taken = apply_command(state, Take("jobs", 3, 2.0, None, 30.0, "0123456789ab"))
    assert [t.token for t in taken] == ["0123456789ab0000", "0123456789ab0001", "0123456789ab0002"]
    assert [t.receive_count for t in taken] == [1, 1, 1]
    acked = apply_command(
        state, Settle("jobs", "ack", [("m0", "0123456789ab0000"), ("m1", "nope")], 3.0)
    )
    assert [op is not None for op in acked] == [True, False]


def test_a_push_take_stores_then_leases_from_the_head_and_a_refused_one_leases_nothing() -> None:
    state = NodeState()
    apply_command(state, Push("jobs", [("old", b"", None, False)], 1.0))
    items = [("a", b"1", None, False), ("b", b"2", None, False)]
    pushed, taken = apply_command(
        state, PushTake("jobs", items, 2.0, None, 0.0, 2, None, 30.0, "0123456789ab")
    )
    assert pushed == [False, False]
    assert [(t.id, t.token) for t in taken] == [
        ("old", "0123456789ab0000"),
        ("a", "0123456789ab0001"),
    ]
    assert state.ready_list("jobs") == ["b"]
    before = dump(state)
    refused = apply_command(
        state, PushTake("jobs", [("c", b"x" * 9, None, False)], 3.0, 8, 0.0, 5, None, 30.0, "t")
    )
    assert isinstance(refused, MessageTooLarge)
    assert dump(state) == before


def test_metadata_changes_refuse_a_second_create_and_a_drop_of_nothing() -> None:
    state = NodeState()
    create = CreateQueue("jobs", "i1", 1.0, QueueSettings(retention_s=60.0))
    assert apply_command(state, Meta([create, Register("jobs", "n1", "m1")])) == [True, True]
    assert apply_command(state, Meta([Register("jobs", "n1", "m2")])) == [False]
    assert isinstance(apply_command(state, Meta([create])), QueueExists)
    assert isinstance(apply_command(state, Meta([DropQueue("mail", "i", 1.0)])), QueueNotFound)
    assert isinstance(
        apply_command(state, Meta([CreateQueue("mail", "i2", 1.0)], max_queues=1)), Exception
    )
    assert list(state.meta) == ["jobs"] and state.meta["jobs"].nodes == {"n1": "m1"}


def test_a_command_stamped_before_the_latest_time_seen_runs_at_that_time() -> None:
    state = NodeState()
    apply_command(state, Push("jobs", [("a", b"", None, False)], 1.0))
    [t] = apply_command(state, Take("jobs", 1, 2.0, None, 5.0, "0123456789ab"))
    # Nacked at 3.0 with a 4 s delay: ready again at 7.0.
    apply_command(state, Settle("jobs", "nack", [("a", t.token)], 3.0, 4.0))
    apply_command(state, Push("jobs", [("b", b"", None, False)], 8.0))
    # A member whose clock is behind stamps 5.0: the state's time is 8.0 all the same, so
    # the delay has ended and the lease it hands out runs until 8.0 + 5.
    taken = apply_command(state, Take("jobs", 2, 5.0, None, 5.0, "ba9876543210"))
    assert [m.id for m in taken] == ["a", "b"]
    assert state.hot["a"].lease_until == 13.0 and state.clock == 8.0


def test_topic_ops_keep_their_own_namespace_and_refuse_what_does_not_apply() -> None:
    state = NodeState()
    apply_command(state, Meta([CreateQueue("jobs", "i1", 1.0)]))
    ops = [CreateTopic("jobs", 2.0), Subscribe("jobs", "a"), Subscribe("jobs", "b")]
    assert apply_command(state, Meta(ops)) == [True, True, True]
    assert apply_command(state, Meta([Subscribe("jobs", "a")])) == [False]
    assert isinstance(apply_command(state, Meta([CreateTopic("jobs", 3.0)])), TopicExists)
    assert isinstance(apply_command(state, Meta([Subscribe("mail", "a")])), TopicNotFound)
    refused = apply_command(state, Meta([Unsubscribe("jobs", "a"), Unsubscribe("jobs", "z")]))
    assert isinstance(refused, SubscriptionNotFound)
    # The unsubscribe before the refused op took effect; a second subscribe joins the end.
    assert apply_command(state, Meta([Subscribe("jobs", "a")])) == [True]
    assert list(state.topics["jobs"].subscriptions) == ["b", "a"]
    assert list(state.meta) == ["jobs"]
    assert isinstance(
        apply_command(state, Meta([CreateTopic("other", 4.0)], max_queues=1)), Exception
    )
    assert apply_command(state, Meta([DropTopic("jobs")])) == [True]
    assert state.topics == {} and list(state.meta) == ["jobs"]
    assert isinstance(apply_command(state, Meta([DropTopic("jobs")])), TopicNotFound)
    # An empty Meta is a read barrier: it changes nothing, and survives the wire.
    assert apply_command(state, Meta([])) == []
    assert decode_command(encode_command(Meta([]))) == Meta((), None)


@pytest.mark.parametrize("data", [b"", b"\x93\x01", b"\x92\x63\x00", b"\xc1", b"\x91\x02"])
def test_bytes_that_are_not_a_command_raise_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a command"):
        decode_command(data)


def test_delivery_is_by_priority_then_deadline_then_arrival_and_past_deadlines_expire() -> None:
    state = NodeState()
    items = [
        ("a", b"", None, False, 0, 0.0, 0.0, None),
        ("b", b"", None, False, 5, 0.0, 0.0, None),
        ("c", b"", None, False, 5, 9.0, 0.0, '{"k":"v"}'),
        ("d", b"", None, False, 5, 3.0, 0.0, None),
        ("e", b"", None, False, 0, 2.0, 0.0, None),
        ("f", b"", None, False, 9, 0.0, 4.0, None),  # delayed until 5.0
        ("g", b"", None, False, 1, 0.0, 0.0, None),
    ]
    apply_command(state, Push("jobs", items, 1.0))
    assert state.ready_list("jobs") == ["d", "c", "b", "g", "e", "a"]
    assert apply_command(state, Take("jobs", 1, 1.5, None, None, "", 6)) == []
    [c] = apply_command(state, Take("jobs", 1, 3.5, None, 5.0, "0123456789ab", 5))
    # d's deadline (3.0) passed: dropped unseen on the way to c, and counted.
    assert (c.id, c.priority, c.attributes) == ("c", 5, '{"k":"v"}')
    assert state.counts("jobs")["expired"] == 1 and state.counts("jobs")["delayed"] == 1
    assert apply_command(state, Housekeep(3.5, [])) == 1  # e, past 2.0
    assert state.ready_list("jobs") == ["b", "g", "a"]
    assert [t.id for t in apply_command(state, Take("jobs", 5, 6.0))] == ["f", "b", "g", "a"]
    assert state.counts("jobs")["expired"] == 2


def test_a_cancel_removes_a_waiting_message_refuses_a_leased_one_and_repeats_its_answer() -> None:
    state = NodeState()
    items = [(m, b"", None, False, 0, 0.0, delay, None) for m, delay in (("a", 0.0), ("b", 9.0))]
    apply_command(state, Push("jobs", [*items, ("c", b"", None, False)], 1.0))
    [t] = apply_command(state, Take("jobs", 1, 2.0, None, 30.0, "0123456789ab"))
    assert t.id == "a"
    verdicts = [apply_command(state, CancelMessage("jobs", m)) for m in ("a", "b", "c", "c", "x")]
    assert verdicts == ["leased", "cancelled", "cancelled", "again", "unknown"]
    assert state.stored() == 1 and list(state.cancelled) == ["b", "c"]


def test_retention_drops_old_messages_of_every_priority_and_deadline_and_no_others() -> None:
    state = NodeState()
    old = [("o0", 0, 0.0), ("o5", 5, 0.0), ("od", 2, 500.0)]
    apply_command(
        state, Push("jobs", [(m, b"", None, False, p, d, 0.0, None) for m, p, d in old], 1.0)
    )
    young = [("y0", 0, 0.0), ("y5", 5, 0.0), ("yd", 2, 500.0)]
    apply_command(
        state, Push("jobs", [(m, b"", None, False, p, d, 0.0, None) for m, p, d in young], 50.0)
    )
    assert apply_command(state, Housekeep(70.0, [("jobs", 30.0)])) == 3
    assert state.ready_list("jobs") == ["y5", "yd", "y0"]
    assert state.counts("jobs")["expired"] == 0  # retention is not a deadline
    # Nothing is due before the youngest would pass retention: the next sweep only looks.
    assert apply_command(state, Housekeep(75.0, [("jobs", 30.0)])) == 0
    assert state.queues["jobs"].retention_due == 80.0
