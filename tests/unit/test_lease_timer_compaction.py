"""The lease timer heap stays bounded under settled leases, and expiry is unchanged.

An acked, nacked or extended lease leaves its (id, token) pair on NodeState's timer heap
until the lease's old end; with a long visibility timeout that used to grow with rate x
visibility. The heap is now rebuilt with its live pairs once it may hold more than
`lease_timers_floor` pairs and twice the live ones. Pure: NodeState driven by hand, time
given by the test.
"""

from __future__ import annotations

import random
from itertools import count

from zdmq.server.state import NodeState

T0 = 1000.0
LONG_VIS = 43_200.0  # the longest visibility a queue may have: 12 hours
FLOOR = NodeState.lease_timers_floor


class _Tokens:
    def __init__(self) -> None:
        self._n = count(1)

    def __call__(self) -> str:
        return f"t{next(self._n)}"


def _cycle(state: NodeState, tokens: _Tokens, n: int, now: float, keep: int = 0) -> list[str]:
    """Pushes n messages, leases them in one receive, acks all but the first `keep`;
    returns the receipts (id.token) still leased."""
    base = f"m{now:.3f}-"
    state.push_many("jobs", [(f"{base}{i}", b"x", None, 0.0) for i in range(n)], now=now)
    got, _ = state.lease("jobs", n, now=now, visibility_s=LONG_VIS, new_token=tokens)
    assert len(got) == n
    for t in got[keep:]:
        assert t.token is not None
        assert state.ack("jobs", t.id, t.token, now) is not None
    return [f"{t.id}.{t.token}" for t in got[:keep]]


def test_fifty_thousand_receive_and_ack_cycles_keep_the_timer_heap_bounded() -> None:
    state, tokens = NodeState(), _Tokens()
    most = 0
    for i in range(50_000):
        _cycle(state, tokens, 1, T0 + i * 0.001)
        if i % 97 == 0:
            most = max(most, state.lease_timer_pairs())
    most = max(most, state.lease_timer_pairs())
    # Nothing is leased: at most the floor's worth of stale pairs, and the open entry.
    assert most <= FLOOR + 2, most
    assert state.counts("jobs")["in_flight"] == 0
    assert state.due_leases(T0 + 2 * LONG_VIS) == []


def test_batched_receives_partly_acked_keep_the_live_leases_and_expire_exactly_them() -> None:
    state, tokens = NodeState(), _Tokens()
    live: list[str] = []
    most = 0
    # 5,000 receives of 10: nine acked, one left leased, each receive one timer entry.
    for i in range(5_000):
        live += _cycle(state, tokens, 10, T0 + i * 0.01, keep=1)
        if i % 31 == 0:
            most = max(most, state.lease_timer_pairs())
    pairs = state.lease_timer_pairs()
    assert state.counts("jobs")["in_flight"] == len(live) == 5_000
    # 50,000 pairs were scheduled; twice the live ones (and the floor) bound what is kept.
    assert max(most, pairs) <= 2 * len(live) + FLOOR, (most, pairs)
    assert pairs < 20_000
    assert state.due_leases(T0 + LONG_VIS - 0.001) == []
    # Expiry hands out exactly the leases never acked, oldest first, each once.
    due = state.due_leases(T0 + 2 * LONG_VIS)
    assert [f"{mid}.{token}" for _, mid, token in due] == live
    for queue, mid, token in due:
        assert state.requeue(queue, mid, token, T0 + 2 * LONG_VIS, expired=True) is not None
    assert state.counts("jobs") == {
        "ready": 5_000,
        "in_flight": 0,
        "delayed": 0,
        "dead_lettered": 0,
        "expired": 0,
    }
    assert state.lease_timer_pairs() == 0


def test_heartbeats_on_long_leases_keep_the_timer_heap_bounded() -> None:
    state, tokens = NodeState(), _Tokens()
    now = T0
    state.push_many("jobs", [(f"m{i}", b"x", None, 0.0) for i in range(100)], now=now)
    got, _ = state.lease("jobs", 100, now=now, visibility_s=LONG_VIS, new_token=tokens)
    most = 0
    for _ in range(500):  # each extends all 100: 50,000 pairs, all but 100 stale
        now += 1.0
        for t in got:
            assert t.token is not None
            assert state.extend("jobs", t.id, t.token, now, LONG_VIS) is not None
        most = max(most, state.lease_timer_pairs())
    assert most <= FLOOR + 200, most
    # The last extension is what counts: nothing is due before it ends, all of it then.
    assert state.due_leases(now + LONG_VIS - 0.001) == []
    due = state.due_leases(now + LONG_VIS)
    assert sorted(mid for _, mid, _ in due) == sorted(t.id for t in got)


def _replay(seed: int, floor: int) -> tuple[list[object], int]:
    """A random run of receives, acks, nacks, extends and expiries on two queues:
    everything the state answered, in order, and the most pairs its timer heap held."""
    rnd = random.Random(seed)
    state, tokens = NodeState(), _Tokens()
    state.lease_timers_floor = floor
    held: list[tuple[str, str, str]] = []  # (queue, id, token) the run believes it holds
    log: list[object] = []
    now, pushed, most = T0, 0, 0
    for step in range(6_000):
        if step % 50 == 0:
            most = max(most, state.lease_timer_pairs())
        now += rnd.choice((0.0, 0.001, 0.25, 3.0))
        queue = rnd.choice(("a", "b"))
        roll = rnd.random()
        if roll < 0.25:
            k = rnd.randint(1, 8)
            state.push_many(
                queue, [(f"{queue}{pushed + i}", b"", None, 0.0) for i in range(k)], now=now
            )
            pushed += k
        elif roll < 0.5:
            vis = rnd.choice((1.0, 5.0, 60.0, LONG_VIS))
            got, _ = state.lease(
                queue, rnd.randint(1, 10), now=now, visibility_s=vis, new_token=tokens
            )
            log.append(("lease", [(t.id, t.token) for t in got]))
            held += [(queue, t.id, t.token) for t in got if t.token is not None]
        elif held and roll < 0.85:
            q, mid, token = held.pop(rnd.randrange(len(held)))
            what = rnd.random()
            if what < 0.5:
                log.append(("ack", mid, state.ack(q, mid, token, now)))
            elif what < 0.75:
                log.append(
                    ("nack", mid, state.requeue(q, mid, token, now, delay_s=rnd.choice((0.0, 2.0))))
                )
            else:
                log.append(
                    ("extend", mid, state.extend(q, mid, token, now, rnd.choice((0.5, 30.0))))
                )
                held.append((q, mid, token))
        else:
            due = state.due_leases(now, limit=rnd.randint(1, 20))
            log.append(("due", due))
            for q, mid, token in due:
                if rnd.random() < 0.2:
                    state.recheck(mid)
                else:
                    log.append(("expire", mid, state.requeue(q, mid, token, now, expired=True)))
    log.append(("end", state.due_leases(now + 10 * LONG_VIS, limit=1 << 30)))
    log.append([state.find(mid) for mid in sorted(state.hot)])
    log.append({q: state.counts(q) for q in ("a", "b")})
    return log, most


def test_compaction_changes_nothing_due_leases_or_any_planner_answers() -> None:
    for seed in range(3):
        compacted, most = _replay(seed, floor=8)
        reference, most_kept = _replay(seed, floor=1 << 62)
        assert compacted == reference, seed
        # The reference kept its stale pairs; the compacting state dropped them.
        assert most < most_kept, (seed, most, most_kept)
