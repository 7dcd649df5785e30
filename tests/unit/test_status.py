"""The cluster status's parts that need no cluster: per-second rates from a node's
counters, and how the nodes' views merge (zdmq/server/status.py)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from zdmq.server import status as st


class _Counted:
    """What the sampler reads of a node: its counters."""

    def __init__(self) -> None:
        self.counters: defaultdict[str, int] = defaultdict(int)


def test_rates_are_per_second_differences_keyed_by_the_whole_second() -> None:
    a, b = _Counted(), _Counted()
    sampler = st.RateSampler(lambda: [a, b], seconds=3)
    sampler.sample(1000.0)
    a.counters["pushed"] += 10
    b.counters["pushed"] += 5
    b.counters["acked"] += 2
    sampler.sample(1001.0)
    sampler.sample(1001.4)  # the same whole second: not a sample
    a.counters["popped"] += 4
    sampler.sample(1002.0)
    rates = sampler.rates()
    assert rates["t"] == [1001, 1002]
    assert rates["push"] == [15.0, 0.0]
    assert rates["ack"] == [2.0, 0.0]
    assert rates["pop"] == [0.0, 4.0]
    # A counter that goes back (a group's state reloaded) is a rate of 0, not negative.
    a.counters["pushed"] = 0
    sampler.sample(1003.0)
    assert sampler.rates()["push"][-1] == 0.0
    # The ring keeps `seconds` rates.
    for t in range(1004, 1010):
        sampler.sample(float(t))
    assert sampler.rates()["t"] == [1007, 1008, 1009]


def test_a_missed_second_spreads_the_count_over_the_seconds_it_spans() -> None:
    n = _Counted()
    sampler = st.RateSampler(lambda: [n])
    sampler.sample(2000.01)
    n.counters["received"] += 30
    sampler.sample(2002.02)  # a second was missed (a busy loop)
    assert sampler.rates() == {
        "t": [2001, 2002],
        "push": [0.0, 0.0],
        "pop": [0.0, 0.0],
        "receive": [15.0, 15.0],
        "ack": [0.0, 0.0],
    }


def _view(rates: dict[str, Any], queues: list[dict[str, Any]], total: int) -> dict[str, Any]:
    return {"rates": rates, "queues": queues, "queues_total": total}


def test_views_merge_rates_second_by_second_and_queues_by_depth() -> None:
    now = 5000.5
    one = {"t": [4998, 4999, 5000], "push": [1, 2, 3], "pop": [0, 0, 1], "receive": [0] * 3,
           "ack": [0] * 3}  # fmt: skip
    two = {"t": [4999, 5000], "push": [10, 20], "pop": [0, 0], "receive": [5, 5], "ack": [1, 1]}
    old = {"t": [1000], "push": [99], "pop": [0], "receive": [0], "ack": [0]}  # out of the window
    rates = st._merge_rates([_view(one, [], 0), _view(two, [], 0), _view(old, [], 0)], now)
    assert rates["end"] == 5000 and rates["start"] == 5000 - st.RATE_SECONDS + 1
    assert len(rates["push"]) == st.RATE_SECONDS
    assert rates["push"][-3:] == [1, 12, 23] and sum(rates["push"]) == 36
    assert rates["receive"][-2:] == [5, 5]

    def row(q: str, node: str, depth: int) -> dict[str, Any]:
        return {"queue": q, "node": node, "depth": depth, "in_flight": 1, "delayed": 0}

    many = [row(f"q{i:03d}", "n2", i + 1) for i in range(60)]
    queues, seen, partial = st._merge_queues(
        [_view(one, [row("q059", "n1", 100), row("solo", "n1", 3)], 2), _view(two, many, 60)]
    )
    assert seen == 61 and not partial
    assert len(queues) == st.QUEUES_LISTED
    assert queues[0] == {"queue": "q059", "messages": 160, "in_flight": 2, "delayed": 0,
                         "depth": {"n1": 100, "n2": 60}}  # fmt: skip
    assert [q["messages"] for q in queues] == sorted((q["messages"] for q in queues), reverse=True)
    # A node that listed only its deepest queues makes the count a lower bound.
    assert st._merge_queues([_view(one, [row("a", "n1", 1)], 500)])[2]


def test_the_moves_progress_counts_steps_and_reckons_the_time_left() -> None:
    from zdmq.cli_status import moves_active, moves_line, moves_progress

    done = [
        {"group": "n1", "add": "n5", "remove": "n2", "done": True, "elapsed_s": 2.0},
        {"group": "n3", "add": "n5", "remove": "n1", "done": True, "elapsed_s": 4.0},
    ]
    current = {
        "group": "n4",
        "add": "n5",
        "remove": "n4",
        "step": "catching n5 up",
        "matched": 1200,
        "commit_index": 3000,
        "entries_per_s": 800.0,
        "elapsed_s": 1.0,
    }
    moves: dict[str, Any] = {
        "epoch": 7,
        "leaving": [],
        "current": current,
        "pending_steps": 2,  # the move under way, and one more
        "done": done,
        "moves_done": 2,
        "last_error": None,
    }
    assert moves_active(moves)
    p = moves_progress(moves)
    # 2 of 4 steps; 2 pending at the mean 3 s a move, less the 1 s the current one ran.
    assert (p.done, p.total, p.eta_s, p.epoch) == (2, 4, 5.0, 7)
    assert p.current == "group n4: n4 -> n5, catching n5 up, 1,200 of 3,000 entries (800/s), 1s"
    # A snapshot being pulled: its bytes and the messages the new member holds.
    pulling = {**current, "bytes": 3 << 20, "snapshot_size": 12 << 20, "bytes_per_s": 1 << 20}
    p = moves_progress({**moves, "current": {**pulling, "messages": 2500}})
    assert p.current is not None
    assert "3.0 of 12.0 MiB (1.0 MiB/s), 2,500 messages, 1s" in p.current
    # Watching from one move done on, at the rate seen meanwhile (a move in 10 s).
    p = moves_progress(moves, base=1, rate=0.1)
    assert (p.done, p.total, p.eta_s) == (1, 3, 19.0)
    line = moves_line(p)
    assert line.startswith("moves [##########          ") and "1/3, about 19s left" in line
    # No move done yet: the time left is not known.
    fresh = {**moves, "done": [], "moves_done": 0, "current": None}
    assert moves_progress(fresh).eta_s is None
    assert "time left: estimating" in moves_line(moves_progress(fresh))
    idle = {**fresh, "pending_steps": 0}
    assert not moves_active(idle) and not moves_active(None)
    assert moves_active({**idle, "leaving": ["n5"]})
    assert moves_line(moves_progress(idle)) == f"moves [{'#' * 30}] 0/0"
