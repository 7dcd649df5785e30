"""zdmq.raft.core in-process: the cases of the Raft paper, one core step at a time."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from zdmq.raft import (
    Entry,
    HardState,
    MemoryStorage,
    Message,
    MsgType,
    NotLeader,
    RaftCore,
    Ready,
    Role,
)
from zdmq.raft.core import SENT_BEFORE_PERSIST


class Group:
    """Cores over a lossless in-order network the test controls; each driver persists at once."""

    def __init__(
        self,
        n: int,
        logs: dict[str, list[int]] | None = None,
        terms: dict[str, int] | None = None,
        **kw: object,
    ) -> None:
        self.ids = [f"n{i}" for i in range(n)]
        self.kw = kw
        self.disks: dict[str, MemoryStorage] = {}
        for i in self.ids:
            disk = MemoryStorage()
            terms_of_log = (logs or {}).get(i, [])
            # An entry's data names its term and index, so equal positions hold equal data.
            disk.append(
                [Entry(t, k + 1, f"{t}@{k + 1}".encode()) for k, t in enumerate(terms_of_log)]
            )
            disk.set_hard_state(HardState(term=(terms or {}).get(i, max(terms_of_log, default=0))))
            self.disks[i] = disk
        self.cores = {i: self._core(i) for i in self.ids}
        self.applied: dict[str, list[Entry]] = {i: [] for i in self.ids}
        self.queue: list[Message] = []
        self.down: set[str] = set()
        self.sent: list[Message] = []

    def _core(self, i: str) -> RaftCore:
        return RaftCore(i, self.ids, self.disks[i], random.Random(i), **self.kw)  # type: ignore[arg-type]

    def __getitem__(self, i: str) -> RaftCore:
        return self.cores[i]

    def restart(self, i: str) -> None:
        self.cores[i] = self._core(i)
        self.applied[i] = []

    def drive(self) -> None:
        """Take every core's Ready: persist, queue its messages, apply, advance."""
        for i, core in self.cores.items():
            while core.has_ready():
                rd = core.ready()
                self.disks[i].append(rd.entries)
                if rd.hard_state is not None:
                    self.disks[i].set_hard_state(rd.hard_state)
                self.sent.extend(rd.messages)
                self.queue.extend(rd.messages)
                self.applied[i].extend(rd.committed)
                core.advance(rd)

    def deliver(self, keep: Callable[[Message], bool] = lambda m: True, limit: int = 10_000) -> int:
        """Deliver queued messages (and those they cause) until none is left; return how many."""
        count = 0
        self.drive()
        while self.queue and count < limit:
            m = self.queue.pop(0)
            if m.src in self.down or m.dst in self.down or not keep(m):
                continue
            self.cores[m.dst].step(m)
            count += 1
            self.drive()
        return count

    def tick(self, i: str, times: int = 1) -> None:
        for _ in range(times):
            self.cores[i].tick()

    def tick_all(self, times: int = 1) -> None:
        for _ in range(times):
            for i in self.ids:
                if i not in self.down:
                    self.cores[i].tick()
            self.deliver()

    def elect(self, i: str) -> None:
        self.cores[i].campaign()
        self.deliver()
        assert self.cores[i].role is Role.LEADER

    def elect_any(self) -> str:
        """Tick the nodes that are up until one of them leads, and return it."""
        for _ in range(100):
            self.tick_all()
            if self.leaders():
                return self.leaders()[0]
        raise AssertionError("no leader")

    def log_of(self, i: str) -> list[tuple[int, bytes | None]]:
        core = self.cores[i]
        return [(e.term, e.data) for e in core.log.slice(1, core.log.last_index() + 1)]

    def leaders(self) -> list[str]:
        return [i for i, c in self.cores.items() if c.role is Role.LEADER and i not in self.down]


# -- election ---------------------------------------------------------------------------


def persist(disk: MemoryStorage, rd: Ready) -> None:
    disk.append(rd.entries)
    if rd.hard_state is not None:
        disk.set_hard_state(rd.hard_state)


def test_a_single_node_elects_itself_and_commits_once_persisted() -> None:
    disk = MemoryStorage()
    core = RaftCore("a", ["a"], disk, random.Random(0))
    core.campaign()
    assert core.role is Role.LEADER and core.term == 1
    rd = core.ready()
    assert [e.data for e in rd.entries] == [None]
    # Its own log counts toward a commit only once persisted.
    assert rd.hard_state == HardState(term=1, vote="a", commit=0)
    assert rd.committed == ()
    persist(disk, rd)
    core.advance(rd)
    assert core.log.committed == 1
    index = core.propose(b"x")
    rd = core.ready()
    assert rd.entries == (Entry(1, index, b"x"),) and rd.committed == (Entry(1, 1, None),)
    assert rd.hard_state == HardState(term=1, vote="a", commit=1)
    persist(disk, rd)
    core.advance(rd)
    assert core.ready().committed == (Entry(1, index, b"x"),)


def test_an_election_times_out_and_elects_one_leader_that_all_follow() -> None:
    g = Group(3)
    for _ in range(30):
        g.tick_all()
        if g.leaders():
            break
    assert len(g.leaders()) == 1
    lead = g.leaders()[0]
    assert all(g[i].leader == lead and g[i].term == g[lead].term for i in g.ids)
    # The leader's empty entry commits and everyone applies it.
    g.tick_all(3)
    assert all([e.data for e in g.applied[i]] == [None] for i in g.ids)


def test_votes_go_to_the_first_asker_of_a_term_and_persist_before_the_answer() -> None:
    g = Group(3, pre_vote=False)
    g["n0"].campaign()
    g.drive()
    vote_to_n1 = next(m for m in g.queue if m.dst == "n1")
    g["n1"].step(vote_to_n1)
    rd = g["n1"].ready()
    # The grant and the vote it records leave together: persist, then send.
    assert rd.hard_state == HardState(term=1, vote="n0", commit=0)
    assert [(m.type, m.reject) for m in rd.messages] == [(MsgType.VOTE_RESP, False)]
    g["n1"].advance(rd)
    # A second candidate of the same term is refused.
    g["n1"].step(Message(MsgType.VOTE, "n2", "n1", 1, index=0, log_term=0))
    assert [m.reject for m in g["n1"].ready().messages] == [True]


def test_a_split_vote_elects_no_one_and_a_later_term_elects_one() -> None:
    g = Group(4, pre_vote=False)
    g["n0"].campaign()
    g["n1"].campaign()
    g.drive()
    # n2 hears n0 first and n3 hears n1 first: 2 votes each, 3 needed.
    g.queue.sort(key=lambda m: (m.src, m.dst) not in {("n0", "n2"), ("n1", "n3")})
    g.deliver()
    assert g.leaders() == []
    assert g["n0"].term == g["n1"].term == 1
    for _ in range(60):
        g.tick_all()
        if g.leaders():
            break
    assert len(g.leaders()) == 1
    assert g[g.leaders()[0]].term >= 2


def test_a_vote_needs_a_log_at_least_as_up_to_date() -> None:
    g = Group(3, logs={"n0": [1], "n1": [1, 2], "n2": [1, 2]}, terms={"n0": 2})
    g["n0"].campaign()
    g.deliver()
    assert g["n0"].role is not Role.LEADER
    g.elect("n1")


# -- log replication ----------------------------------------------------------------------


def test_entries_replicate_and_commit_on_a_majority() -> None:
    g = Group(3)
    g.elect("n0")
    for k in range(5):
        g["n0"].propose(f"e{k}".encode())
    g.deliver()
    g.tick_all(2)
    want = [(1, None)] + [(1, f"e{k}".encode()) for k in range(5)]
    assert all(g.log_of(i) == want for i in g.ids)
    assert all([(e.term, e.data) for e in g.applied[i]] == want for i in g.ids)


def test_a_leader_counts_its_own_entry_toward_a_commit_only_once_persisted() -> None:
    # Its appends may leave before its own write is durable; a follower's acknowledgement
    # that arrives meanwhile makes one copy of two, not a majority of three.
    g = Group(3)
    g.elect("n0")
    g.tick_all(2)
    lead = g["n0"]
    index = lead.propose(b"x")
    rd = lead.ready()
    assert [e.index for e in rd.entries] == [index]
    appends = [m for m in rd.messages if m.type is MsgType.APPEND]
    assert {m.dst for m in appends} == {"n1", "n2"} and all(
        m.type in SENT_BEFORE_PERSIST for m in appends
    )
    g["n1"].step(next(m for m in appends if m.dst == "n1"))
    ack = next(m for m in g["n1"].ready().messages if m.type is MsgType.APPEND_RESP)
    assert ack.index == index and ack.type not in SENT_BEFORE_PERSIST
    lead.step(ack)
    assert lead.log.committed == index - 1  # not persisted here yet
    persist(g.disks["n0"], rd)
    lead.advance(rd)
    assert lead.log.committed == index
    assert [e.data for e in lead.ready().committed] == [b"x"]


def test_a_leader_does_not_send_a_message_only_to_announce_a_commit() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(2)
    g["n0"].propose(b"x")
    g.deliver()
    assert g["n0"].log.committed == 2 and g["n1"].log.committed == 1
    g.tick("n0")  # the next heartbeat (or append) carries it
    g.deliver()
    assert g["n1"].log.committed == g["n2"].log.committed == 2


def test_a_leaders_heartbeats_for_a_slow_write_change_nothing() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(2)
    lead = g["n0"]
    lead.propose(b"x")
    before = (lead.term, lead.log.committed, dict(lead.progress), lead.has_ready())
    beats = lead.heartbeats()
    assert sorted(m.dst for m in beats) == ["n1", "n2"]
    assert all(m.type is MsgType.HEARTBEAT and m.term == lead.term for m in beats)
    assert all(m.commit == min(lead.progress[m.dst].match, lead.log.committed) for m in beats)
    assert (lead.term, lead.log.committed, dict(lead.progress), lead.has_ready()) == before
    assert g["n1"].heartbeats() == []


def test_a_restarted_core_takes_what_its_state_machine_applied_as_committed() -> None:
    # Applied while the commit index that covered it was not yet written.
    disk = MemoryStorage()
    disk.append([Entry(1, 1, None), Entry(1, 2, b"a"), Entry(1, 3, b"b")])
    disk.set_hard_state(HardState(term=1, vote="n0", commit=1))
    core = RaftCore("n1", ["n0", "n1", "n2"], disk, random.Random(0), applied=2)
    assert core.log.committed == 2 and core.ready().committed == ()


def test_a_follower_rejects_an_append_whose_previous_entry_does_not_match() -> None:
    g = Group(3, logs={"n1": [1, 1]}, terms={"n1": 2})
    f = g["n1"]
    f.step(Message(MsgType.APPEND, "n0", "n1", 2, index=2, log_term=2, entries=()))
    (resp,) = f.ready().messages
    assert resp.type is MsgType.APPEND_RESP and resp.reject and resp.index == 2
    assert resp.reject_hint == 2 and resp.log_term == 1  # the last index of term <= 2
    f.step(Message(MsgType.APPEND, "n0", "n1", 2, index=5, log_term=2, entries=()))
    (resp,) = f.ready().messages
    assert resp.reject and resp.reject_hint == 2  # past its end: its last index


def test_conflicting_entries_are_overwritten_and_matching_ones_kept() -> None:
    # Figure 7 style: n0 leads term 4; n1 lacks entries, n2 holds an uncommitted tail of
    # term 2 that conflicts, n3 holds the leader's prefix.
    logs = {
        "n0": [1, 1, 3, 3, 3],
        "n1": [1, 1],
        "n2": [1, 1, 2, 2, 2, 2, 2, 2],
        "n3": [1, 1, 3, 3],
    }
    g = Group(5, logs=logs, terms={"n0": 3, "n1": 3, "n2": 3, "n3": 3, "n4": 3})
    g.elect("n0")
    g["n0"].propose(b"new")
    g.deliver()
    g.tick_all(2)
    want = g.log_of("n0")
    assert [t for t, _ in want] == [1, 1, 3, 3, 3, 4, 4]
    for i in g.ids:
        assert g.log_of(i) == want, i
    assert g["n0"].log.committed == 7


def test_a_rejection_hint_skips_a_whole_conflicting_term_in_one_round_trip() -> None:
    logs = {"n0": [1] + [3] * 3, "n1": [1] + [3] * 3, "n2": [1] + [2] * 50}
    g = Group(3, logs=logs, terms={"n0": 3, "n1": 3, "n2": 3})
    g.elect("n0")
    g.deliver()
    rejects = [m for m in g.sent if m.type is MsgType.APPEND_RESP and m.reject]
    assert len(rejects) <= 2, rejects
    assert [t for t, _ in g.log_of("n2")] == [1, 3, 3, 3, 4]


def test_duplicated_and_reordered_appends_never_truncate_a_follower() -> None:
    g = Group(3, terms={"n1": 1})
    f = g["n1"]
    one = Message(MsgType.APPEND, "n0", "n1", 1, index=0, log_term=0, entries=(Entry(1, 1, b"a"),))
    two = Message(MsgType.APPEND, "n0", "n1", 1, index=1, log_term=1, entries=(Entry(1, 2, b"b"),))
    for m in (one, two, one, two, one):
        f.step(m)
    assert g.log_of("n1") == [(1, b"a"), (1, b"b")]
    acks = [m.index for m in f.ready().messages]
    assert acks == [1, 2, 1, 2, 1] and f.log.committed == 0


def test_a_follower_commits_no_further_than_the_entries_the_leader_vouched_for() -> None:
    # n1 holds a stale tail of term 2; the term-3 leader's append matches only entry 1.
    g = Group(3, logs={"n1": [1, 2, 2]}, terms={"n1": 3})
    f = g["n1"]
    f.step(Message(MsgType.APPEND, "n0", "n1", 3, index=1, log_term=1, entries=(), commit=3))
    assert f.log.committed == 1


# -- terms and stepping down ------------------------------------------------------------


def test_a_stale_leader_steps_down_on_a_higher_term_and_then_answers_nothing_as_leader() -> None:
    g = Group(3)
    g.elect("n0")
    g.down.add("n0")
    new = g.elect_any()
    assert g[new].term == 2 and g["n0"].role is Role.LEADER  # n0 has not heard yet
    stale_index = g["n0"].propose(b"lost")
    g.down.discard("n0")
    g.deliver()  # n0's append at term 1 is answered with term 2
    assert g["n0"].role is Role.FOLLOWER and g["n0"].term == 2
    g.tick_all(2)
    with pytest.raises(NotLeader) as e:
        g["n0"].propose(b"x")
    assert (e.value.leader, e.value.term) == (new, 2)
    # n0's uncommitted entry of term 1 is overwritten by the new leader's log.
    assert g.log_of("n0") == g.log_of(new)
    assert (1, b"lost") not in g.log_of("n0") and stale_index == 2
    g["n0"].tick()
    assert all(m.type is not MsgType.HEARTBEAT for m in g["n0"].ready().messages)


def test_a_message_of_an_older_term_changes_nothing() -> None:
    g = Group(3)
    g.elect("n0")
    g.down.add("n0")
    g.elect_any()
    before = (g["n2"].term, g["n2"].leader, g.log_of("n2"))
    g["n2"].step(
        Message(MsgType.APPEND, "n0", "n2", 1, index=2, log_term=1, entries=(Entry(1, 3, b"z"),))
    )
    assert (g["n2"].term, g["n2"].leader, g.log_of("n2")) == before
    (resp,) = g["n2"].ready().messages
    assert resp.term == 2  # tells the stale leader the term


# -- the commit rule (5.4.2, Figure 8) --------------------------------------------------


def test_a_leader_does_not_commit_an_old_term_entry_by_counting_replicas() -> None:
    # Figure 8 (c): n0 held entry 2 of term 2 and now leads term 4; n4 holds entry 2 of
    # term 3, which it appended as leader of term 3 and never replicated.
    # n4 saw term 4 start (it lost that election). No leases, so n4 may win at once later.
    logs = {"n0": [1, 2], "n1": [1, 2], "n2": [1], "n3": [1], "n4": [1, 3]}
    terms = {"n0": 3, "n1": 3, "n2": 3, "n3": 3, "n4": 4}
    g = Group(5, logs=logs, terms=terms, max_entries_per_msg=1, check_quorum=False)
    g.down.add("n4")

    def hold(m: Message) -> bool:
        # n3 hears nothing; n2 gets entry 2 but not yet the leader's entry 3 (term 4).
        with_3 = any(e.index == 3 for e in m.entries)
        to_n2_with_3 = m.dst == "n2" and with_3 and g["n2"].log.last_index() == 2
        return "n3" not in (m.src, m.dst) and not to_n2_with_3

    g["n0"].campaign()
    g.deliver(keep=hold)
    lead = g["n0"]
    assert lead.role is Role.LEADER and lead.term == 4
    assert [g.log_of(i)[1] for i in ("n0", "n1", "n2")] == [(2, b"2@2")] * 3
    assert g.log_of("n2") == [(1, b"1@1"), (2, b"2@2")]
    assert lead.log.committed == 0  # a majority holds entry 2, but it is of term 2
    # Why: if n0 fails now, n4 (last term 3) can still win n2 and n3 and overwrite entry 2.
    g.down = {"n0"}
    g.queue.clear()
    g.elect("n4")
    g.deliver()
    assert all(g.log_of(i)[1] == (3, b"3@2") for i in ("n1", "n2", "n3", "n4"))


def test_old_term_entries_commit_with_the_first_entry_of_the_current_term() -> None:
    logs = {"n0": [1, 2], "n1": [1, 2], "n2": [1], "n3": [1], "n4": [1, 3]}
    terms = {"n0": 3, "n1": 3, "n2": 3, "n3": 3, "n4": 4}
    g = Group(5, logs=logs, terms=terms, max_entries_per_msg=1)
    g.down.add("n4")
    g.elect("n0")
    g.deliver()
    assert g["n0"].log.committed == 3  # entry 2 (term 2) with entry 3 (term 4)
    g.tick_all()  # the followers hear of the commit with the next heartbeat
    assert [e.term for e in g.applied["n1"]] == [1, 2, 4]


# -- PreVote and CheckQuorum ------------------------------------------------------------


def test_pre_vote_keeps_an_isolated_node_from_raising_its_term_or_disrupting_the_leader() -> None:
    g = Group(3)
    g.elect("n0")
    g.down.add("n2")
    for _ in range(100):
        g["n2"].tick()
        g.drive()
        g.tick_all()
    assert g["n2"].term == 1 and g["n2"].role is Role.PRE_CANDIDATE
    g.down.clear()
    g.queue.clear()
    g.tick_all(30)
    assert g.leaders() == ["n0"] and all(g[i].term == 1 for i in g.ids)


def test_without_pre_vote_an_isolated_node_raises_its_term() -> None:
    g = Group(3, pre_vote=False)
    g.elect("n0")
    g.down.add("n2")
    for _ in range(100):
        g["n2"].tick()
        g.drive()
    assert g["n2"].term > 3


def test_a_follower_that_hears_its_leader_ignores_votes_of_a_higher_term() -> None:
    g = Group(3)
    g.elect("n0")
    g.drive()
    g["n1"].step(Message(MsgType.VOTE, "n2", "n1", 5, index=9, log_term=5))
    assert g["n1"].term == 1 and g["n1"].ready().messages == ()


def test_check_quorum_steps_a_leader_down_once_it_hears_from_no_majority() -> None:
    g = Group(3)
    g.elect("n0")
    g.tick_all(25)
    assert g["n0"].role is Role.LEADER  # hearing from everyone, it stays
    g.down.update({"n1", "n2"})
    g.queue.clear()
    for _ in range(g["n0"].election_ticks * 2):
        g["n0"].tick()
        g.drive()
    assert g["n0"].role is Role.FOLLOWER and g["n0"].term == 1
    with pytest.raises(NotLeader) as e:
        g["n0"].propose(b"x")
    assert e.value.leader is None and e.value.term == 1


def test_check_quorum_keeps_a_leader_that_hears_from_a_bare_majority() -> None:
    g = Group(3)
    g.elect("n0")
    g.down.add("n2")
    g.tick_all(50)
    assert g.leaders() == ["n0"]


# -- proposals and hints --------------------------------------------------------------------


def test_a_proposal_to_a_follower_raises_not_leader_with_the_leader_and_term() -> None:
    g = Group(3)
    with pytest.raises(NotLeader) as e:
        g["n1"].propose(b"x")
    assert (e.value.leader, e.value.term) == (None, 0)
    g.elect("n0")
    g.tick_all()
    with pytest.raises(NotLeader) as e:
        g["n1"].propose(b"x")
    assert (e.value.leader, e.value.term) == ("n0", 1)


def test_leadership_transfers_to_a_caught_up_follower() -> None:
    g = Group(3)
    g.elect("n0")
    g["n0"].propose(b"a")
    g.down.add("n1")  # n1 falls behind first
    g.deliver()
    g.down.clear()
    g["n0"].transfer_leadership("n1")
    with pytest.raises(NotLeader) as e:
        g["n0"].propose(b"b")
    assert e.value.leader == "n1"
    g.deliver()
    assert g.leaders() == ["n1"] and g["n1"].term == 2
    assert g["n0"].role is Role.FOLLOWER
    g.tick_all(2)
    assert [d for _, d in g.log_of("n1")] == [None, b"a", None]


# -- restart ------------------------------------------------------------------------------


def test_a_restarted_core_keeps_its_term_vote_and_log_and_reapplies_from_the_start() -> None:
    g = Group(3)
    g.elect("n0")
    g["n0"].propose(b"a")
    g.deliver()
    g.tick_all(2)
    g.restart("n1")
    core = g["n1"]
    assert (core.term, core.vote) == (1, "n0")
    assert core.log.committed == 2 and core.role is Role.FOLLOWER
    rd: Ready = core.ready()
    assert [e.data for e in rd.committed] == [None, b"a"]


def test_a_follower_that_lost_its_log_is_caught_up_again_from_the_first_entry() -> None:
    g = Group(3)
    g.elect("n0")
    for k in range(4):
        g["n0"].propose(f"e{k}".encode())
    g.deliver()
    g.tick_all(2)
    assert g["n0"].progress["n1"].match == 5
    # n1 comes back with an empty disk: the leader still believes it holds 5 entries,
    # until it learns that n1's store is a new one (zdmq/raft/identity.py).
    g.disks["n1"] = MemoryStorage()
    g.restart("n1")
    g["n0"].forget_progress("n1")
    g.tick_all(3)  # heartbeats claim commit 5: n1 must not commit past its empty log
    assert g.log_of("n1") == g.log_of("n0")
    assert [e.data for e in g.applied["n1"]] == [None] + [f"e{k}".encode() for k in range(4)]
    assert g["n0"].progress["n1"].match == 5


def test_a_late_rejection_of_an_append_does_not_reset_a_followers_progress() -> None:
    g = Group(3)
    g.elect("n0")
    for k in range(3):
        g["n0"].propose(f"e{k}".encode())
    g.deliver()
    pr = g["n0"].progress["n1"]
    assert pr.match == 4
    # The rejection of an append sent ahead of the follower (prev 5, when its log ended
    # at 2) arrives after the follower acknowledged up to 4: it says nothing now.
    late = Message(MsgType.APPEND_RESP, "n1", "n0", 1, index=5, reject=True, reject_hint=2)
    g["n0"].step(late)
    assert (pr.match, pr.next) == (4, 5)  # it probes from what it knows matches


def test_the_package_exports_exactly_its_public_names() -> None:
    import zdmq.raft

    assert len(set(zdmq.raft.__all__)) == len(zdmq.raft.__all__)
    assert all(getattr(zdmq.raft, name) is not None for name in zdmq.raft.__all__)
    assert {n for n in vars(zdmq.raft) if not n.startswith("_")} - {
        "core",
        "driver",
        "identity",
        "sim",
        "sim_queue",
        "sqlite_storage",
        "storage",
    } == set(zdmq.raft.__all__)
