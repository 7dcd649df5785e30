"""zdmq.raft.core membership changes, one core step at a time: learners, promotions,
removals, and the rules that keep two configurations from having disjoint majorities."""

from __future__ import annotations

import random

import pytest

from tests.unit.test_raft_core import Group
from zdmq.raft import (
    Entry,
    HardState,
    MemoryStorage,
    Message,
    MsgType,
    NotLeader,
    RaftCore,
    Role,
)
from zdmq.raft.core import CONF_PREFIX, Conf, ConfChange, ConfChangeRefused, next_change

BASE = Conf(frozenset({"n0", "n1", "n2"}))


def join(g: Group, node: str, conf: Conf) -> RaftCore:
    """Starts `node` with an empty disk and `conf`, as a host does for a group it was
    added to (it learns the rest from the leader's log)."""
    g.ids.append(node)
    g.disks[node] = MemoryStorage()
    g.applied[node] = []
    core = g.cores[node] = RaftCore(node, [], g.disks[node], random.Random(node), conf=conf)
    return core


def commit(g: Group, lead: str, change: ConfChange) -> Conf:
    """Proposes `change` on `lead` and delivers until every member applied it."""
    g[lead].propose_conf(change)
    g.deliver()
    g.tick_all(2)
    return g[lead].conf


def grown(lead: str = "n0") -> Group:
    """n0..n2 led by `lead`, with n3 added as a learner and caught up."""
    g = Group(3)
    g.elect(lead)
    g.tick_all(1)
    join(g, "n3", Conf(BASE.voters, frozenset({"n3"})))
    assert commit(g, lead, ConfChange("add_learner", "n3")) == Conf(BASE.voters, frozenset({"n3"}))
    return g


# -- the configuration entry ------------------------------------------------------------------


def test_a_configuration_round_trips_and_no_command_reads_as_one() -> None:
    conf = Conf(frozenset({"a", "b"}), frozenset({"c"}))
    data = conf.encode()
    assert data.startswith(CONF_PREFIX) and Conf.decode(data) == conf
    assert Conf.decode(None) is None
    assert Conf.decode(b"\x93\x01\x02\x03") is None  # a MessagePack array, as commands are
    assert conf.to_dict() == {"voters": ["a", "b"], "learners": ["c"]}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (ConfChange("add_learner", "n1"), "member already"),
        (ConfChange("promote", "n1"), "not a learner"),
        (ConfChange("remove", "n9"), "not a member"),
        (ConfChange("demote", "n1"), "unknown change"),
    ],
)
def test_a_change_that_does_not_apply_is_refused(change: ConfChange, why: str) -> None:
    with pytest.raises(ConfChangeRefused, match=why):
        change.applied_to(BASE)


def test_the_last_voter_cannot_be_removed() -> None:
    with pytest.raises(ConfChangeRefused, match="last voter"):
        ConfChange("remove", "a").applied_to(Conf(frozenset({"a"}), frozenset({"b"})))


# -- learners ---------------------------------------------------------------------------------


def test_a_learner_receives_and_applies_the_log_but_never_counts_toward_a_commit() -> None:
    g = grown()
    g["n0"].propose(b"a")
    g.deliver()
    g.tick_all(2)
    assert [e.data for e in g.applied["n3"]][-1] == b"a"
    assert g.log_of("n3") == g.log_of("n0")
    # With both other voters down, the learner's acknowledgement does not make a majority.
    g.down |= {"n1", "n2"}
    committed = g["n0"].log.committed
    g["n0"].propose(b"b")
    g.deliver()
    assert g["n0"].progress["n3"].match == g["n0"].log.last_index()
    assert g["n0"].log.committed == committed


def test_a_learner_never_stands_for_election() -> None:
    g = grown()
    g.down |= {"n0", "n1", "n2"}
    term = g["n3"].term
    g.tick("n3", 100)
    g.deliver()
    assert g["n3"].role is Role.FOLLOWER and g["n3"].term == term
    # Nor when a leader asks it to (a transfer names voters only).
    g.down.clear()
    with pytest.raises(ConfChangeRefused, match="not a voter"):
        g["n0"].transfer_leadership("n3")


def test_a_learner_stands_when_a_candidate_naming_it_a_voter_lacks_what_it_holds() -> None:
    g = grown()
    # n0 appends n3's promotion, which only it holds, and uses it: four voters.
    g.down |= {"n1", "n2", "n3"}
    g["n0"].propose_conf(ConfChange("promote", "n3"))
    g.deliver()
    assert g["n0"].conf.voters == {"n0", "n1", "n2", "n3"}
    # n1 leads the next term on n2's vote; its empty entry reaches the learner n3 only.
    g.down = {"n0"}
    for i in ("n1", "n2"):
        g.restart(i)  # they know no leader (no lease to keep them from voting)
    g["n1"].campaign()
    g.deliver(keep=lambda m: m.type.name.startswith(("VOTE", "PRE_VOTE")) or m.dst == "n3")
    assert g["n1"].role is Role.LEADER
    assert g["n3"].log.last_term() == g["n1"].term > g["n0"].log.last_term()
    # n1 goes. n0 needs n3's vote (three of four), which n3 refuses: its log is ahead.
    # n2 needs n0's, which n0 refuses: n0's log is ahead of n2's.
    g.down = {"n1"}
    for i in ("n0", "n2", "n3"):
        g.restart(i)
    g["n0"].campaign()
    g.deliver()
    assert g["n0"].role is not Role.LEADER
    # Asked by a candidate that names it a voter and lacks what it holds, the learner
    # stands: it wins on n0's and n2's votes, commits its log without counting itself,
    # and steps down; its log overwrote n0's uncommitted promotion.
    g.tick("n3", 2 * g["n3"].election_ticks)
    g.deliver()
    assert g["n3"].role is Role.FOLLOWER and g["n3"].log.committed == g["n3"].log.last_index()
    assert all(g[i].conf == Conf(BASE.voters, frozenset({"n3"})) for i in ("n0", "n2", "n3"))
    lead = g.elect_any()
    assert lead in ("n0", "n2")
    g[lead].propose(b"after")
    g.deliver()
    g.tick_all(2)
    assert all(g.applied[i][-1].data == b"after" for i in ("n0", "n2", "n3"))


def test_a_new_member_with_an_empty_log_grants_no_vote_not_even_to_an_empty_log() -> None:
    # On a first boot every member is a voter with an empty log: they elect as usual.
    voter = RaftCore("n2", [], MemoryStorage(), random.Random(2), store_guard=True, conf=BASE)
    voter.step(Message(MsgType.VOTE, "n1", "n2", 1, index=0, log_term=0))
    assert [m.reject for m in voter.ready().messages] == [False]
    # A learner added to a running group starts empty too, but the group has committed
    # entries: an empty candidate (a member that lost its disk, its configuration stale
    # enough to count the learner a voter) must not win on it.
    conf = Conf(BASE.voters, frozenset({"n3"}))
    learner = RaftCore("n3", [], MemoryStorage(), random.Random(3), store_guard=True, conf=conf)
    learner.step(Message(MsgType.PRE_VOTE, "n2", "n3", 1, index=0, log_term=0))
    learner.step(Message(MsgType.VOTE, "n2", "n3", 1, index=0, log_term=0))
    assert [m.reject for m in learner.ready().messages] == [True, True]


def test_a_learner_is_promoted_only_once_caught_up_and_then_counts() -> None:
    g = grown()
    g.down.add("n3")
    for k in range(3):
        g["n0"].propose(f"e{k}".encode())
    g.deliver()
    g.tick_all(2)
    with pytest.raises(ConfChangeRefused, match="not caught up"):
        g["n0"].propose_conf(ConfChange("promote", "n3"))
    g.down.clear()
    g.tick_all(2)
    voters = commit(g, "n0", ConfChange("promote", "n3")).voters
    assert voters == {"n0", "n1", "n2", "n3"}
    assert all(g[i].conf.voters == voters for i in g.ids)
    # Four voters: a majority is three. n0 and n3 alone commit nothing; with n1 they do.
    g.down |= {"n1", "n2"}
    committed = g["n0"].log.committed
    g["n0"].propose(b"x")
    g.deliver()
    assert g["n0"].log.committed == committed
    g.down.discard("n1")
    g.tick_all(2)
    assert g["n0"].log.committed == g["n0"].log.last_index()


# -- one change at a time ---------------------------------------------------------------------


def test_a_second_change_waits_for_the_first_to_commit() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(1)
    join(g, "n3", Conf(BASE.voters, frozenset({"n3"})))
    g.down |= {"n1", "n2"}  # the first change cannot commit
    g["n0"].propose_conf(ConfChange("add_learner", "n3"))
    g.deliver()
    with pytest.raises(ConfChangeRefused, match="not committed yet"):
        g["n0"].propose_conf(ConfChange("remove", "n2"))
    g.down.clear()
    g.tick_all(2)
    assert commit(g, "n0", ConfChange("remove", "n3")) == BASE


def test_a_new_leader_changes_nothing_before_it_commits_an_entry_of_its_term() -> None:
    g = Group(3)
    g["n0"].campaign()
    g.deliver(keep=lambda m: m.type.name.startswith(("VOTE", "PRE_VOTE")))
    assert g["n0"].role is Role.LEADER
    with pytest.raises(ConfChangeRefused, match="entry of its term"):
        g["n0"].propose_conf(ConfChange("remove", "n2"))
    g.tick_all(2)  # its empty entry reaches the others (its first appends were lost)
    g["n0"].propose_conf(ConfChange("remove", "n2"))
    with pytest.raises(NotLeader):
        g["n1"].propose_conf(ConfChange("remove", "n2"))


def test_a_configuration_is_used_from_its_append_and_dropped_with_its_entry() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(1)
    # n0 appends a change that only it holds, then loses the lead to n1.
    g.down |= {"n1", "n2"}
    g["n0"].propose_conf(ConfChange("remove", "n2"))
    g.deliver()
    assert g["n0"].conf.voters == {"n0", "n1"}  # in use at once, uncommitted
    g.down = {"n0"}
    lead = g.elect_any()
    g[lead].propose(b"a")
    g.deliver()
    g.down.clear()
    g.tick_all(3)
    assert g["n0"].conf == BASE  # the entry was overwritten, its configuration with it
    assert g.log_of("n0") == g.log_of(lead)


# -- removal ----------------------------------------------------------------------------------


def test_a_removed_leader_steps_down_once_the_change_commits_and_never_stands_again() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(1)
    commit(g, "n0", ConfChange("remove", "n0"))
    assert g["n0"].role is Role.FOLLOWER
    assert all(g[i].conf.voters == {"n1", "n2"} for i in ("n1", "n2"))
    lead = g.elect_any()
    assert lead in ("n1", "n2")
    g[lead].propose(b"after")
    g.deliver()
    g.tick_all(2)
    assert g.applied["n1"][-1].data == b"after" and g.applied["n2"][-1].data == b"after"
    assert g["n0"].role is Role.FOLLOWER
    assert lead not in g["n0"].progress  # it leads nothing, and nobody sends it the log


def test_a_leader_not_among_the_voters_commits_without_counting_itself() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(1)
    g["n0"].propose_conf(ConfChange("remove", "n0"))
    g.down.add("n2")
    # n0 and n1 hold the change: in the new configuration {n1, n2} that is one of two.
    g.deliver()
    assert g["n0"].role is Role.LEADER and g["n0"].log.committed < g["n0"].conf_index
    g.down.clear()
    g.tick_all(2)
    assert g["n0"].role is Role.FOLLOWER


# -- restarts and snapshots --------------------------------------------------------------------


def test_a_restarted_core_takes_its_configuration_from_the_log_after_what_it_applied() -> None:
    g = grown()
    disk = g.disks["n1"]
    applied = 1  # the state machine holds the empty entry only
    core = RaftCore("n1", [], disk, random.Random(1), applied=applied, conf=BASE)
    assert core.conf == Conf(BASE.voters, frozenset({"n3"}))
    assert core.peers == ("n0", "n1", "n2", "n3")


def test_a_snapshot_brings_its_configuration() -> None:
    disk = MemoryStorage()
    disk.set_hard_state(HardState(term=1))
    core = RaftCore("n3", [], disk, random.Random(3), conf=Conf(BASE.voters, frozenset({"n3"})))
    later = Conf(BASE.voters | {"n3"})
    assert core.restore(10, 1, "n0", conf=later)
    assert core.conf == later and core.is_voter()
    entries = (Entry(1, 11, Conf(later.voters - {"n2"}).encode()),)
    core.step(Message(MsgType.APPEND, "n0", "n3", 1, index=10, log_term=1, entries=entries))
    assert core.conf.voters == {"n0", "n1", "n3"}


def test_a_member_holding_its_own_uncommitted_removal_still_stands_and_commits_it() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(1)
    g.down |= {"n1", "n2"}
    g["n0"].propose_conf(ConfChange("remove", "n0"))
    g.deliver()
    g.tick("n0", 30)  # CheckQuorum: it steps down, its removal uncommitted
    g.deliver()  # its heartbeats meanwhile are lost
    assert g["n0"].role is not Role.LEADER and g["n0"].conf.voters == {"n1", "n2"}
    g.down.clear()
    for i in ("n1", "n2"):
        g.restart(i)  # they know no leader (no lease to keep them from voting)
    # Its log is the most up to date: n1 and n2 vote for it, not for each other.
    g["n0"].campaign()
    g.deliver()
    g.tick_all(3)
    assert all(g[i].conf.voters == {"n1", "n2"} for i in g.ids)
    assert g["n0"].role is Role.FOLLOWER and g["n0"].log.committed >= g["n0"].conf_index
    lead = g.elect_any()
    assert lead in ("n1", "n2")


def test_a_move_is_read_off_the_committed_configuration_so_a_rerun_resumes_it() -> None:
    steps = []
    conf = BASE
    while (change := next_change(conf, "n3", "n0")) is not None:
        steps.append((change.kind, change.node))
        conf = change.applied_to(conf)
    assert steps == [("add_learner", "n3"), ("promote", "n3"), ("remove", "n0")]
    assert conf == Conf(frozenset({"n1", "n2", "n3"}))
    # Rerun from any point, it goes on from there; a move already made is done.
    assert next_change(Conf(BASE.voters, frozenset({"n3"})), "n3", "n0") == ConfChange(
        "promote", "n3"
    )
    assert next_change(conf, "n3", "n0") is None
    assert next_change(BASE, None, "n2") == ConfChange("remove", "n2")
