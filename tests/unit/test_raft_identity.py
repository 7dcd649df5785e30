"""zdmq.raft.identity: the peer book and the rule that lifts a probation."""

from __future__ import annotations

from zdmq.raft.identity import PeerBook, caught_up, judge_ack


def test_a_first_sighting_records_and_a_new_identity_puts_the_peer_on_probation() -> None:
    book = PeerBook()
    assert book.see("b", "b1", {"g": 5, "h": 2}) == []  # first boot: nothing recorded
    assert book.identities == {"b": "b1"} and book.probation == {}
    assert book.see("b", "b1", {"g": 6}) == []
    assert book.take_changes() == ({"b": "b1"}, {})
    assert sorted(book.see("b", "b2", {"g": 7, "h": 3})) == ["g", "h"]
    assert book.on_probation("g", ["a", "b", "c"]) == frozenset({"b"})
    assert book.since("g", "b") == 7 and book.since("h", "b") == 3
    book.lift("h", "b")
    assert book.on_probation("h", ["a", "b"]) == frozenset()
    assert book.take_changes() == ({"b": "b2"}, {("g", "b"): 7, ("h", "b"): None})
    assert not book.has_changes()
    # A late message of the old store is one more replacement: probation again.
    assert book.see("b", "b1", {"g": 9}) == ["g"] and book.since("g", "b") == 9


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
