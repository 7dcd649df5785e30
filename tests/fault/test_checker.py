"""The total-queue checker on small made-up histories, one per category."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault.checker import (
    acked_during,
    check,
    check_fifo,
    cut_changes,
    fault_windows,
    pair,
)
from tests.fault.history import History


def push(h: History, p: str, msg_id: str, outcome: str = "ok", payload: str | None = None) -> None:
    value = {"id": msg_id, "payload": payload or f"body-{msg_id}"}
    h.invoke(p, "push", value)
    getattr(h, outcome)(p, "push", value)


def receive(h: History, p: str, *ids: str, f: str = "receive") -> None:
    h.invoke(p, f, {"max": 10})
    h.ok(p, f, [{"id": i, "payload": f"body-{i}", "receipt": f"{i}.r"} for i in ids])


def ack(h: History, p: str, *ids: str, failed: tuple[str, ...] = ()) -> None:
    h.invoke(p, "ack", {"ids": [*ids, *failed]})
    h.ok(p, "ack", {"acked": list(ids), "failed": list(failed)})


def test_clean_history_has_nothing_to_report() -> None:
    h = History()
    push(h, "p1", "a")
    push(h, "p1", "b")
    receive(h, "c1", "a", "b")
    ack(h, "c1", "a", "b")
    r = check(h)
    assert r.counts()["acknowledged"] == 2 and r.counts()["delivered"] == 2
    assert not (r.lost or r.duplicated or r.unexpected or r.resurrected or r.recovered)
    assert r.problems() == []


def test_lost_is_acknowledged_but_never_delivered() -> None:
    h = History()
    push(h, "p1", "a")
    push(h, "p1", "b")
    receive(h, "c1", "a")
    r = check(h)
    assert r.lost == {"b"}
    assert r.problems() == []


def test_a_failed_push_that_is_never_delivered_is_not_lost() -> None:
    h = History()
    push(h, "p1", "a", "fail")
    push(h, "p1", "b", "info")
    r = check(h)
    assert r.lost == set() and r.attempted == {"a", "b"} and r.acknowledged == set()


def test_duplicated_counts_every_delivery() -> None:
    h = History()
    push(h, "p1", "a")
    receive(h, "c1", "a")  # lease expired, delivered again
    receive(h, "c2", "a")
    receive(h, "c2", "a", f="drain")
    r = check(h)
    assert r.duplicated == {"a": 3} and r.deliveries == 3
    assert r.resurrected == set()  # never acked in between
    assert r.problems() == []


def test_unexpected_is_delivered_but_never_pushed() -> None:
    h = History()
    push(h, "p1", "a")
    receive(h, "c1", "a", "zzz")
    r = check(h)
    assert r.unexpected == {"zzz"}
    assert r.problems() == []


def test_resurrected_is_delivered_after_a_successful_ack() -> None:
    h = History()
    push(h, "p1", "a")
    push(h, "p1", "b")
    receive(h, "c1", "a", "b")
    ack(h, "c1", "a", failed=("b",))  # b's ack refused: b may come back
    receive(h, "c2", "a", "b")
    r = check(h)
    assert r.resurrected == {"a"}
    assert r.duplicated == {"a": 2, "b": 2}
    assert r.problems() == []


def test_resurrected_after_a_pop() -> None:
    h = History()
    push(h, "p1", "a")
    receive(h, "c1", "a", f="pop")
    receive(h, "c2", "a", f="drain")
    assert check(h).resurrected == {"a"}


def test_a_delivery_that_began_before_the_ack_ended_is_not_resurrected() -> None:
    h = History()
    push(h, "p1", "a")
    receive(h, "c1", "a")
    h.invoke("c1", "ack", {"ids": ["a"]})
    h.invoke("c2", "receive", {"max": 1})  # concurrent with the ack
    h.ok("c1", "ack", {"acked": ["a"], "failed": []})
    h.ok("c2", "receive", [{"id": "a", "payload": "body-a", "receipt": "a.r2"}])
    r = check(h)
    assert r.resurrected == set() and r.duplicated == {"a": 2}


def test_a_push_of_unknown_outcome_after_the_ack_makes_a_new_copy_not_a_resurrection() -> None:
    h = History()
    push(h, "p1", "a")
    receive(h, "c1", "a")
    ack(h, "c1", "a")
    push(h, "p1", "a", "info")  # a retry with the same dedup id stored a fresh copy
    receive(h, "c2", "a")
    r = check(h)
    assert r.resurrected == set() and r.duplicated == {"a": 2}


def test_recovered_is_an_unknown_push_that_was_delivered() -> None:
    h = History()
    push(h, "p1", "a", "info")
    push(h, "p1", "b", "info")
    push(h, "p2", "c", "info")
    push(h, "p2", "c")  # retried and acknowledged: not recovered
    receive(h, "c1", "a", "c")
    r = check(h)
    assert r.recovered == {"a"} and r.acknowledged == {"c"} and r.lost == set()
    assert r.problems() == []


def test_an_invoke_with_no_completion_is_unknown() -> None:
    h = History()
    h.invoke("p1", "push", {"id": "a", "payload": "body-a"})
    receive(h, "c1", "a")
    ops, _ = pair(h)
    assert ops[0].type == "info"
    assert check(h).recovered == {"a"}


def test_delivered_after_a_certain_failure() -> None:
    h = History()
    push(h, "p1", "a", "fail")
    receive(h, "c1", "a")
    r = check(h)
    assert r.delivered_after_fail == {"a"} and r.problems() == []


def test_corrupt_body() -> None:
    h = History()
    push(h, "p1", "a", payload="right")
    receive(h, "c1", "a")  # delivers "body-a"
    assert check(h).corrupt == {"a"}


def test_unknown_pops_bound_the_losses_they_explain() -> None:
    h = History()
    push(h, "p1", "a")
    h.invoke("c1", "pop", {"max": 5})
    h.info("c1", "pop", None)
    r = check(h)
    assert r.lost == {"a"} and r.unknown_pop_capacity == 5


def test_failed_or_unknown_receives_deliver_nothing() -> None:
    h = History()
    push(h, "p1", "a")
    h.invoke("c1", "receive", {"max": 1})
    h.info("c1", "receive", None)
    h.invoke("c1", "receive", {"max": 1})
    h.fail("c1", "receive", None)
    r = check(h)
    assert r.delivered == set() and r.lost == {"a"}
    assert r.ops == {"push:ok": 1, "receive:info": 1, "receive:fail": 1}


def test_nemesis_notes_are_reported_not_paired() -> None:
    h = History()
    h.invoke("p1", "push", {"id": "a", "payload": "body-a"})
    h.note("nemesis", "nemesis", {"fault": "kill", "node": "n2"})
    h.ok("p1", "push", {"id": "a", "payload": "body-a"})
    r = check(h)
    assert r.nemesis == [{"fault": "kill", "node": "n2"}] and r.acknowledged == {"a"}
    assert "nemesis: {'fault': 'kill', 'node': 'n2'}" in r.text()


def test_a_process_with_two_open_ops_is_a_broken_history() -> None:
    h = History()
    h.invoke("p1", "push", {"id": "a", "payload": "x"})
    h.invoke("p1", "push", {"id": "b", "payload": "y"})
    with pytest.raises(ValueError, match="still open"):
        check(h)


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    h = History()
    push(h, "p1", "a")
    receive(h, "c1", "a")
    ack(h, "c1", "a")
    h.dump(tmp_path / "h.jsonl")
    again = History.load(tmp_path / "h.jsonl")
    assert list(again) == list(h)
    assert check(again).counts() == check(h).counts()


def test_problems_spots_a_report_that_does_not_add_up() -> None:
    h = History()
    push(h, "p1", "a")
    r = check(h)
    r.lost = set()
    assert r.problems() == ["lost is not acknowledged minus delivered"]


# ---- fault windows and partitions ------------------------------------------------------------

MEMBERS = {"n1": ("n1", "n2", "n3"), "n2": ("n2", "n3", "n4"), "n3": ("n3", "n4", "n1")}


def group_of(msg_id: str) -> str:
    return msg_id.split("/")[0]  # the tests' ids name their group: "n1/a"


def pushed_by(h: History, p: str, msg_id: str, node: str) -> None:
    value = {"id": msg_id, "payload": f"body-{msg_id}"}
    h.invoke(p, "push", value)
    h.ok(p, "push", {**value, "node": node})


def test_fault_windows_pair_each_fault_with_its_end() -> None:
    h = History()
    h.note("nemesis", "nemesis", {"fault": "kill", "node": "n1"})
    h.note("nemesis", "nemesis", {"fault": "pause", "node": "n2"})
    h.note("nemesis", "nemesis", {"fault": "resumed", "node": "n2"})
    h.note("nemesis", "nemesis", {"fault": "restarted", "node": "n1"})
    h.note("nemesis", "nemesis", {"fault": "partition", "groups": [["n1"], ["n2", "n3"]]})
    h.note("nemesis", "nemesis", {"fault": "heal"})
    h.note("nemesis", "nemesis", {"fault": "lose_disk", "node": "n3"})
    windows = fault_windows(h)
    assert [(w.fault, w.node) for w in windows] == [
        ("kill", "n1"),
        ("pause", "n2"),
        ("partition", None),
        ("lose_disk", "n3"),
    ]
    assert windows[2].sides == (("n1",), ("n2", "n3"))
    assert windows[0].end > windows[1].end and windows[3].end == float("inf")


def test_acked_during_counts_the_pushes_whose_ok_came_inside() -> None:
    h = History()
    push(h, "p1", "before")
    h.note("nemesis", "nemesis", {"fault": "kill", "node": "n1"})
    h.invoke("p2", "push", {"id": "straddles", "payload": "x"})
    push(h, "p1", "inside")
    push(h, "p1", "failed", "fail")
    h.ok("p2", "push", {"id": "straddles", "payload": "x"})
    h.note("nemesis", "nemesis", {"fault": "restarted", "node": "n1"})
    push(h, "p1", "after")
    (window,) = fault_windows(h)
    assert sorted(op.invoke_value["id"] for op in acked_during(h, window)) == [
        "inside",
        "straddles",
    ]


def test_cut_changes_flag_a_minority_side_only_for_calls_inside_the_cut() -> None:
    h = History()
    h.invoke("p1", "push", {"id": "n1/early", "payload": "body-n1/early"})
    h.note("nemesis", "nemesis", {"fault": "partition", "groups": [["n1"], ["n2", "n3", "n4"]]})
    h.ok("p1", "push", {"id": "n1/early", "payload": "body-n1/early", "node": "n1"})
    pushed_by(h, "p1", "n1/a", "n2")  # n2, n3 hold a majority of group n1
    pushed_by(h, "p1", "n3/b", "n1")  # n1 alone: no majority of group n3
    h.invoke("c1", "receive", {"max": 10})
    h.ok("c1", "receive", [{"id": "n2/c", "payload": "body-n2/c", "receipt": "r", "node": "n1"}])
    h.invoke("c1", "ack", {"ids": ["n1/a", "n3/d"]})
    h.ok("c1", "ack", {"acked": ["n1/a"], "failed": ["n3/d"], "node": "n3"})
    pushed_by(h, "p2", "n1/e", "n1")
    h.invoke("p3", "push", {"id": "n1/late", "payload": "body-n1/late"})
    h.note("nemesis", "nemesis", {"fault": "heal"})
    h.ok("p3", "push", {"id": "n1/late", "payload": "body-n1/late", "node": "n1"})
    changes = cut_changes(h, {**MEMBERS, "n4": ("n4", "n1", "n2")}, group_of)
    seen = {(c.op.f, c.msg_id, c.node, c.majority) for c in changes}
    assert seen == {
        ("push", "n1/a", "n2", True),
        ("push", "n3/b", "n1", False),
        ("receive", "n2/c", "n1", False),
        ("ack", "n1/a", "n3", True),
        ("push", "n1/e", "n1", False),
    }
    assert "no majority" in str(next(c for c in changes if c.msg_id == "n3/b"))


# ---- the FIFO checker ------------------------------------------------------------------------
def fifo_receive(h: History, p: str, *payloads: str) -> None:
    """A receive of messages `<group>:<n>` (their id is their payload)."""
    h.invoke(p, "receive", {"max": 10})
    h.ok(
        p,
        "receive",
        [{"id": x, "payload": x, "receipt": f"{x}.r", "group": x.split(":")[0]} for x in payloads],
    )


def test_a_fifo_history_in_order_one_at_a_time_is_clean() -> None:
    h = History()
    fifo_receive(h, "c1", "a:0", "b:0")
    ack(h, "c1", "a:0", "b:0")
    fifo_receive(h, "c2", "a:1")
    ack(h, "c2", "a:1")
    r = check_fifo(h, visibility_s=30)
    assert r.problems() == [] and r.acked == {"a:0", "b:0", "a:1"} and r.deliveries == 3


def test_a_later_message_before_the_earlier_one_is_acked_is_out_of_order() -> None:
    h = History()
    fifo_receive(h, "c1", "a:0")
    fifo_receive(h, "c2", "a:1")  # a:0 is still held by c1
    ack(h, "c1", "a:0")
    ack(h, "c2", "a:1")
    r = check_fifo(h, visibility_s=30)
    assert any("a:1 delivered" in p and "before a:0" in p for p in r.out_of_order)
    assert any("a:1 held" in p for p in r.overlapping)


def test_a_skipped_message_is_out_of_order_and_a_lease_that_ran_out_is_not_overlap() -> None:
    h = History()
    fifo_receive(h, "c1", "a:1")  # a:0 never delivered
    r = check_fifo(h, visibility_s=30)
    assert r.out_of_order and not r.overlapping
    h = History()
    fifo_receive(h, "c1", "a:0")  # held until the lease runs out: no ack
    fifo_receive(h, "c2", "a:0")  # redelivered after the visibility timeout
    ack(h, "c2", "a:0")
    assert check_fifo(h, visibility_s=0.0).problems() == []
    assert check_fifo(h, visibility_s=30).overlapping  # within it: two holds at once


def test_a_fifo_message_delivered_after_its_ack_is_resurrected() -> None:
    h = History()
    fifo_receive(h, "c1", "a:0")
    ack(h, "c1", "a:0")
    fifo_receive(h, "c2", "a:0")
    assert check_fifo(h, visibility_s=30).resurrected
