"""zdmq.raft.identity: the peer book and the rule that lifts a probation."""

from __future__ import annotations

from zdmq.raft.core import Conf
from zdmq.raft.identity import (
    LiftReport,
    PeerBook,
    caught_up,
    judge_ack,
    readded,
    report_current,
)


def test_a_first_sighting_records_and_a_new_identity_puts_the_peer_on_probation() -> None:
    book = PeerBook()
    assert book.see("b", "b1", {"g": 5, "h": 2}) == []  # first boot: nothing recorded
    assert book.identities == {"b": "b1"} and book.probation == {}
    assert book.see("b", "b1", {"g": 6}) == []
    assert book.take_changes() == ({"b": "b1"}, {}, {})
    assert sorted(book.see("b", "b2", {"g": 7, "h": 3})) == ["g", "h"]
    assert book.on_probation("g", ["a", "b", "c"]) == frozenset({"b"})
    assert book.since("g", "b") == 7 and book.since("h", "b") == 3
    book.lift("h", "b")
    assert book.on_probation("h", ["a", "b"]) == frozenset()
    assert book.take_changes() == (
        {"b": "b2"},
        {("g", "b"): 7, ("h", "b"): None},
        {("h", "b"): "b2"},  # lifted in h: b2 is cleared there
    )
    assert book.reportable("h", "b") == "b2" and book.reportable("g", "b") is None
    assert not book.has_changes()
    # A late message of the old store is one more replacement: probation again.
    assert book.see("b", "b1", {"g": 9, "h": 4}) == ["g", "h"] and book.since("g", "b") == 9
    assert book.reportable("h", "b") is None and book.cleared == {}


def test_a_learners_replaced_store_is_cleared_where_it_learns_and_reportable() -> None:
    book = PeerBook()
    book.see("b", "b1", {"g": 1})
    assert book.see("b", "b2", {"g": 4}, learning=["h"]) == ["g"]  # votes in g, learns in h
    assert book.on_probation("h", ["b"]) == frozenset() and book.since("g", "b") == 4
    assert book.reportable("h", "b") == "b2" and book.reportable("g", "b") is None


def test_a_peer_that_left_a_group_is_forgotten_there_and_everywhere_once_it_shares_none() -> None:
    book = PeerBook()
    book.see("b", "b1", {"g": 1, "h": 1})
    book.see("b", "b2", {"g": 5, "h": 5})
    book.lift("h", "b")
    book.take_changes()
    book.forget("g", "b", last=False)  # it left g; h still has it
    assert book.since("g", "b") is None and book.identities == {"b": "b2"}
    book.forget("h", "b", last=True)
    assert book.probation == {} and book.cleared == {} and book.identities == {}
    assert book.take_changes() == ({"b": None}, {("g", "b"): None}, {("h", "b"): None})
    # A late message of the store that left records nothing; a store of b that joins
    # again is a first sighting, not a replaced store, and the one that left is then one.
    assert book.see("b", "b2", {"g": 9}) == [] and book.identities == {}
    assert book.see("b", "b3", {"g": 9}) == [] and book.probation == {}
    assert book.see("b", "b2", {"g": 9}) == ["g"]


def test_a_snapshot_that_names_a_voter_a_learner_shows_it_removed_and_added_again() -> None:
    # A node whose committed configuration had b and c voting installs a snapshot in
    # which b learns: its entries removed b and added it again (a voter becomes a learner
    # no other way). c, a voter in both, may or may not have left meanwhile: not known.
    before = Conf(frozenset({"a", "b", "c"}), frozenset({"d"}))
    after = Conf(frozenset({"a", "c", "d"}), frozenset({"b"}))
    assert readded(before, after) == frozenset({"b"})
    assert readded(before, before) == frozenset()
    # Forgotten as at its removal, b's store that joined again is a first sighting.
    book = PeerBook()
    book.see("b", "b1", {"g": 1})
    for peer in readded(before, after):
        book.forget("g", peer, last=True)
    assert book.see("b", "b2", {}, learning=["g"]) == [] and book.probation == {}


def test_a_probation_lifts_only_for_a_leader_that_committed_in_its_term_since() -> None:
    ok = {"leading": True, "term": 4, "commit": 10, "commit_term": 4, "ack_term": 4}
    assert caught_up(9, acked=10, **ok)
    assert not caught_up(9, acked=9, **ok)  # the peer does not hold the commit index yet
    assert not caught_up(10, acked=12, **ok)  # nothing committed since the replacement
    assert not caught_up(9, acked=10, **{**ok, "leading": False})
    assert not caught_up(9, acked=10, **{**ok, "commit_term": 3})  # an older term's commit
    assert not caught_up(9, acked=10, **{**ok, "ack_term": 3})  # an answer of another term


def test_a_quiet_leader_nudges_the_commit_index_once_the_peer_holds_its_whole_log() -> None:
    kw = {"leading": True, "term": 4, "commit_term": 4, "ack_term": 4}
    assert judge_ack(10, commit=10, last_index=10, acked=10, **kw) == "nudge"
    assert judge_ack(10, commit=10, last_index=11, acked=11, **kw) is None  # in flight
    assert judge_ack(10, commit=10, last_index=10, acked=8, **kw) is None  # behind
    assert judge_ack(10, commit=11, last_index=11, acked=11, **kw) == "lift"
    assert judge_ack(10, commit=10, last_index=10, acked=10, **{**kw, "leading": False}) is None


def test_a_lift_report_counts_only_from_the_current_leader_on_the_recorded_store() -> None:
    r = LiftReport("a", "g", "b", "b2", 12, 4)
    assert report_current(r, term=4, leader="a")
    assert not report_current(r, term=5, leader="a")  # a deposed leader's (or an old) report
    assert not report_current(r, term=4, leader=None)
    assert not report_current(r, term=4, leader="c")
    assert not report_current(r, term=3, leader="a")  # a term this node has not reached
    assert not report_current(r, term=4, leader="a", probation={"a"})  # a replaced sender
    book = PeerBook()
    book.see("b", "b1", {"g": 1})
    book.see("b", "b2", {"g": 12, "h": 3})
    assert not book.lift_reported(LiftReport("a", "g", "b", "b1", 20, 4))  # an older store
    assert not book.lift_reported(LiftReport("a", "g", "b", "b2", 11, 4))  # behind `since`
    assert book.on_probation("g", ["b"]) == frozenset({"b"})
    assert book.lift_reported(r)
    assert book.on_probation("g", ["b"]) == frozenset()
    assert book.on_probation("h", ["b"]) == frozenset({"b"})  # only the report's group
    assert not book.lift_reported(r)  # nothing left to lift
    assert book.take_changes() == (
        {"b": "b2"},
        {("g", "b"): None, ("h", "b"): 3},
        {("g", "b"): "b2"},
    )
    assert book.reportable("g", "b") == "b2" and book.reportable("h", "b") is None
