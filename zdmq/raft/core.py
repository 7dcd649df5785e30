"""One member of a Raft group as a pure, deterministic state machine.

`RaftCore` never awaits, opens a socket, reads a clock or draws its own random numbers:
its driver feeds it `tick()` (one unit of logical time), `step(message)` (a message
from a peer), `propose(data)` and `campaign()` / `transfer_leadership(to)`, and then
takes a `Ready`:

    rd = core.ready()
    send(m for m in rd.messages if m.type in SENT_BEFORE_PERSIST)       # 1. may go at once
    storage.append(rd.entries); storage.set_hard_state(rd.hard_state)   # 2. persist
    send(m for m in rd.messages if m.type not in SENT_BEFORE_PERSIST)   # 3. then the rest
    apply(rd.committed)                                                 # 4. apply
    core.advance(rd)

Persisting before sending is what makes a vote or an acknowledgement a promise: no
answer leaves the node that depends on state a crash could lose. A leader's own
messages (appends, heartbeats: `SENT_BEFORE_PERSIST`) may leave before its write is
durable, so the followers write their copies while the leader writes its own (Raft
thesis, 10.2.1): the leader counts its own log toward a commit only as far as the
driver has persisted it (`advance`), so a crash that loses its unsynced write loses
nothing committed. The entries a `Ready` hands out for applying are committed *and*
persisted locally, so they may be applied before the `Ready` they come in is persisted;
the commit index the hard state records may then trail what the state machine applied
(the driver passes `applied`, and the core takes it as committed when it restarts).
A leader does not send a message only to announce a new commit index: the followers
learn it from the next append or heartbeat.

What it does (Raft, Ongaro and Ousterhout 2014, with etcd-io/raft's refinements):
  * Leader election with randomised election timeouts, drawn from an injected
    `random.Random` in [election_ticks, 2 * election_ticks).
  * PreVote: a node whose timeout fires first asks whether it could win at term + 1
    without raising its own term, so a node cut off from the group cannot disrupt a
    stable leader when it returns.
  * CheckQuorum: a leader that has not heard from a majority within an election
    timeout steps down, and a follower that heard from its leader within one ignores
    (pre-)votes (the leader's lease), unless the leader itself asked it to campaign
    (`transfer_leadership`).
  * Log replication with the log-matching check, conflicting suffixes overwritten (never
    entries that match), and fast backtracking: a rejection carries a hint (the last
    index at which the follower's term is at most the leader's), so one round trip skips
    a whole term.
  * A leader commits only entries of its own term by counting replicas (section 5.4.2);
    earlier entries commit with them. It appends an empty entry when its term starts so
    that happens without waiting for a proposal.
  * A leader that steps down (a higher term, a lost quorum) is a follower from that
    moment: `propose` raises `NotLeader` carrying the leader it knows of and its term.

Members whose storage may be new (see zdmq/raft/identity.py for the rule that sets these):
  * `probation`: peers whose grants and acknowledgements this core does not count,
    because their store was replaced (a lost disk) and may lack entries their earlier
    store acknowledged. A grant from one counts as a rejection, its matched index
    is left out when the leader counts replicas to commit, CheckQuorum does not
    count it as heard from, and it gets no vote (its log may be short of what it once
    held, so "at least as up to date as mine" proves nothing). It is still replicated
    to (that is how it catches up).
  * `store_guard` (constructor option), for stores that may be new:
    - a core whose log is empty grants a (pre-)vote only to a candidate whose log is
      empty too. An empty log may be a lost one, and "the candidate is at least as up
      to date as I am" then says nothing. On a cluster's first boot every log is
      empty, so elections run as usual. A core whose log is empty and that is no voter
      of its configuration grants none: it is a new member of a running group (a
      learner is added only once something is committed), not a first boot, and two
      empty logs agreeing there would elect a store that lost the group's log.
    - `proven` (persisted by the driver, with `told`): a store is proven once it has
      held everything up to a commit index its leader made in its own term (or, as
      leader, committed in its term). Until then it keeps in `told` the highest
      (commit index, that leader's term) a leader's message announced, and grants a
      vote, or campaigns, only for a log at least as up to date as that (a log whose
      last term is above that leader's holds it; one whose last term is that
      leader's holds it if it reaches the index). A wiped store that got part of the
      log back thus vouches only for a candidate holding all it was told is
      committed. `proven` and `told` are tracked with the guard off too.

Log compaction and snapshots (Raft section 7, as etcd-io/raft does them):
  * The driver compacts the log (`Storage.compact`) up to an index its state machine
    holds durably; the core reads where the log starts from `Storage.snapshot()`.
  * A leader that must send a follower entries it has compacted sends `SNAPSHOT`
    instead (the index and term its log starts after), and waits for the follower's
    answer (at most one a heartbeat). The follower's core does not hold the state: it
    records the request (`take_snapshot_request`), its driver pulls a snapshot of the
    state from the leader and calls `restore(index, term)`. A snapshot at or below the
    commit index is stale and ignored; one whose entry this log holds at the same term
    only moves the commit index (the log goes on from there); otherwise the core drops
    its log, starts it after the snapshot, answers the leader as to an append up to
    the snapshot's index, and the driver installs the state and resets the stored log
    (`Storage.restore`) before the core takes another input.

Membership changes (Raft thesis §4.1, with learners as etcd-io/raft has them):
  * A group's configuration (`Conf`: its voters and its learners) changes only through
    its log, one member at a time (`propose_conf`): add a learner, promote a learner to
    voter, or remove a member. A learner receives the log (and snapshots) but never
    votes, campaigns or counts toward a commit, so a new member holds the group's
    committed state before it can vote.
  * Every member uses the newest configuration its log holds, committed or not, from the
    moment the entry is appended; an entry that is overwritten takes its configuration
    with it.
  * A leader proposes a change only once it has committed an entry of its own term (the
    fix of the single-server change bug, Ongaro 2015) and while no other change is
    uncommitted, so two configurations in use at once differ by one voter and any
    majority of one intersects any majority of the other.
  * A leader that is not a voter of its configuration replicates and commits without
    counting itself, and steps down once that configuration is committed.
  * A learner stands for election once when a candidate asks for its vote (so the
    candidate's configuration, holding a promotion the learner's log lacks, names it a
    voter) and it refuses because its own log is more up to date. That candidate cannot
    win without it, and the learner may hold the only copy of the newest entries (those
    of a leader that reached no other member before going down); the voters of the
    learner's own configuration elect it or not as any candidate, it commits its log
    and steps down. Without this, such a group elects no one.
  * The driver gives the core the configuration its state machine held at `applied`
    (it records them as it applies them, and a snapshot carries one: `restore`).

Not built yet: linearizable reads.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from zdmq.raft.identity import judge_ack
from zdmq.raft.storage import Entry, HardState, SnapshotMeta, Storage

__all__ = [
    "CONF_PREFIX",
    "SENT_BEFORE_PERSIST",
    "Conf",
    "ConfChange",
    "ConfChangeRefused",
    "Message",
    "MsgType",
    "NotCommitted",
    "NotLeader",
    "Progress",
    "RaftCore",
    "Ready",
    "Role",
    "next_change",
]

#: Entries one append message carries at most, unless the core is given another limit.
MAX_ENTRIES_PER_MSG = 64
#: The entries' bytes one append message carries at most (but always at least one entry).
MAX_BYTES_PER_MSG = 1 << 20


#: The first bytes of a configuration entry's data. 0xc1 is the one byte MessagePack never
#: uses, so no command of the state machine (MessagePack, zdmq/server/machine.py) starts so.
CONF_PREFIX = b"\xc1raft-conf:"


@dataclass(frozen=True, slots=True)
class Conf:
    """A group's configuration: who votes, and who only receives the log."""

    voters: frozenset[str]
    learners: frozenset[str] = frozenset()

    def members(self) -> frozenset[str]:
        return self.voters | self.learners

    def encode(self) -> bytes:
        """The data of the log entry that makes this the configuration."""
        return CONF_PREFIX + self.to_json().encode()

    @staticmethod
    def decode(data: bytes | None) -> Conf | None:
        """The configuration an entry's data carries, or None for any other entry."""
        if data is None or not data.startswith(CONF_PREFIX):
            return None
        return Conf.from_json(data[len(CONF_PREFIX) :].decode())

    def to_dict(self) -> dict[str, list[str]]:
        return {"voters": sorted(self.voters), "learners": sorted(self.learners)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Conf:
        body = json.loads(text)
        return Conf(frozenset(body["voters"]), frozenset(body["learners"]))


@dataclass(frozen=True, slots=True)
class ConfChange:
    """One member's change: "add_learner", "promote" (learner to voter) or "remove"."""

    kind: str
    node: str

    def applied_to(self, conf: Conf) -> Conf:
        """The configuration after this change; ConfChangeRefused if it does not apply."""
        node, voters, learners = self.node, conf.voters, conf.learners
        if self.kind == "add_learner":
            if node in voters or node in learners:
                raise ConfChangeRefused(f"{node} is a member already")
            return Conf(voters, learners | {node})
        if self.kind == "promote":
            if node not in learners:
                raise ConfChangeRefused(f"{node} is not a learner")
            return Conf(voters | {node}, learners - {node})
        if self.kind == "remove":
            if node not in voters and node not in learners:
                raise ConfChangeRefused(f"{node} is not a member")
            if voters == {node}:
                raise ConfChangeRefused(f"{node} is the last voter")
            return Conf(voters - {node}, learners - {node})
        raise ConfChangeRefused(f"unknown change {self.kind!r}")


def next_change(conf: Conf, add: str | None, remove: str | None) -> ConfChange | None:
    """The next single change of a replica move (`add` in, `remove` out, either may be
    None) from the group's committed configuration `conf`: add `add` as a learner, promote
    it, then remove `remove`; None once done. A move resumed after a crash, or rerun,
    takes up where the log stands: each step is read off the configuration, not
    remembered."""
    if add is not None and add not in conf.members():
        return ConfChange("add_learner", add)
    if add is not None and add in conf.learners:
        return ConfChange("promote", add)
    if remove is not None and remove in conf.members():
        return ConfChange("remove", remove)
    return None


class ConfChangeRefused(Exception):
    """A configuration change the leader does not propose now (see `propose_conf`)."""


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class MsgType(enum.Enum):
    PRE_VOTE = "pre_vote"
    PRE_VOTE_RESP = "pre_vote_resp"
    VOTE = "vote"
    VOTE_RESP = "vote_resp"
    APPEND = "append"
    APPEND_RESP = "append_resp"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_RESP = "heartbeat_resp"
    TIMEOUT_NOW = "timeout_now"
    #: The leader compacted the entries this follower needs: install a snapshot.
    SNAPSHOT = "snapshot"


@dataclass(frozen=True, slots=True)
class Message:
    """A message between two cores of a group.

    The meaning of `index` and `log_term` depends on the type:
      * PRE_VOTE / VOTE: the candidate's last index and the term of that entry.
      * APPEND: the index and term of the entry just before `entries`.
      * APPEND_RESP: accepted, the follower's last matching index; rejected, the `index`
        of the APPEND it rejects, with the hint in `reject_hint` and `log_term` (the
        follower's term at the hint).
      * SNAPSHOT: the index and term the leader's log starts after (what the snapshot
        the follower pulls holds at least).
    """

    type: MsgType
    src: str
    dst: str
    term: int
    index: int = 0
    log_term: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    #: A vote asked for at the leader's request (leadership transfer): bypasses the lease.
    force: bool = False


#: The messages a driver may send before it persists the `Ready` that holds them: only a
#: leader sends these, and they promise nothing about its own log (see the module doc).
SENT_BEFORE_PERSIST = frozenset({MsgType.APPEND, MsgType.HEARTBEAT})


class NotLeader(Exception):
    """A proposal reached a core that is not the leader (or is handing leadership over)."""

    def __init__(self, leader: str | None, term: int) -> None:
        super().__init__(f"not the leader; leader {leader!r} at term {term}")
        self.leader = leader
        self.term = term


class NotCommitted(NotLeader):
    """A proposal's entry was never committed: another leader's entry took its index in
    the committed log (so the command did not take effect, and may be sent again)."""


@dataclass(frozen=True, slots=True)
class Ready:
    """A batch of work for the driver, in order: persist, send, apply, then `advance`."""

    #: The hard state to persist, or None if it has not changed since the last batch.
    hard_state: HardState | None
    #: Entries to persist; the first one's index may overwrite (truncate) stored entries.
    entries: tuple[Entry, ...]
    #: Messages to send once `entries` and `hard_state` are persisted.
    messages: tuple[Message, ...]
    #: Entries now committed (and persisted), to apply in order.
    committed: tuple[Entry, ...]
    #: Who the core thinks leads, its role and term (volatile; not to persist).
    leader: str | None
    role: Role
    term: int

    def __bool__(self) -> bool:
        return bool(self.hard_state or self.entries or self.messages or self.committed)


@dataclass(slots=True)
class Progress:
    """The leader's view of one follower's log."""

    match: int = 0
    next: int = 1
    #: Probing sends one append at a time until the follower's log position is known;
    #: replicating pipelines appends, moving `next` ahead optimistically.
    probing: bool = True
    #: Waiting for the answer to the one append a probe sends.
    paused: bool = False
    #: Heard from since the last CheckQuorum round.
    active: bool = False


@dataclass(slots=True)
class _Log:
    """Persisted entries (in storage) plus those not yet persisted (`unstable`).

    `unstable[0]` sits at index `offset`; stored entries at or after `offset` are
    overwritten by the driver when it persists `unstable`.
    """

    storage: Storage
    offset: int
    unstable: list[Entry] = field(default_factory=list)
    committed: int = 0
    applied: int = 0
    #: The snapshot this core restored, until the storage holds it too.
    restored: SnapshotMeta = field(default_factory=SnapshotMeta)

    def snapshot(self) -> SnapshotMeta:
        """Where the log starts: the entries up to this index are compacted."""
        stored = self.storage.snapshot()
        return stored if stored.index >= self.restored.index else self.restored

    def last_index(self) -> int:
        return self.offset + len(self.unstable) - 1

    def last_term(self) -> int:
        return self.term_at(self.last_index())

    def term_at(self, index: int) -> int:
        """The term at `index`, or -1 past the end of the log or before its snapshot."""
        if index >= self.offset:
            i = index - self.offset
            return self.unstable[i].term if i < len(self.unstable) else -1
        snap = self.snapshot()
        if index <= snap.index:
            return snap.term if index == snap.index else -1
        return self.storage.term_at(index)

    def matches(self, index: int, term: int) -> bool:
        return self.term_at(index) == term

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries lo..hi-1 (after the snapshot)."""
        out: list[Entry] = []
        if lo < self.offset:
            out = self.storage.entries(lo, min(hi, self.offset))
        if hi > self.offset:
            out.extend(self.unstable[max(lo, self.offset) - self.offset : hi - self.offset])
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries starting at entries[0].index, dropping what follows it."""
        first = entries[0].index
        assert self.committed < first <= self.last_index() + 1, (first, self.committed)
        if first <= self.offset:
            self.offset = first
            self.unstable = list(entries)
        else:
            del self.unstable[first - self.offset :]
            self.unstable.extend(entries)

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first of `entries` this log lacks or holds at another term, or 0."""
        for e in entries:
            if not self.matches(e.index, e.term):
                return e.index
        return 0

    def hint_at_or_before(self, index: int, term: int) -> int:
        """The largest index <= `index` whose term is <= `term` (etcd's findConflictByTerm),
        not looking past the snapshot (whose entries are committed: the leader has them)."""
        index = min(index, self.last_index())
        floor = self.snapshot().index
        while index > floor and self.term_at(index) > term:
            index -= 1
        return index

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) is at least as recent as this one."""
        mine = self.last_term()
        return last_term > mine or (last_term == mine and last_index >= self.last_index())

    def commit_to(self, index: int) -> bool:
        if index <= self.committed:
            return False
        assert index <= self.last_index(), (index, self.last_index())
        self.committed = index
        return True

    def stable_to(self, index: int, term: int) -> None:
        """The driver persisted entries up to `index` (the last at `term`)."""
        i = index - self.offset
        if 0 <= i < len(self.unstable) and self.unstable[i].term == term:
            del self.unstable[: i + 1]
            self.offset = index + 1

    def to_apply(self) -> list[Entry]:
        hi = min(self.committed, self.offset - 1)
        return self.slice(self.applied + 1, hi + 1) if hi > self.applied else []


class RaftCore:
    """One member of a Raft group; see the module docstring for its driver's loop."""

    def __init__(
        self,
        node_id: str,
        peers: Iterable[str],
        storage: Storage,
        rng: random.Random,
        *,
        election_ticks: int = 10,
        heartbeat_ticks: int = 1,
        applied: int = 0,
        max_entries_per_msg: int = MAX_ENTRIES_PER_MSG,
        max_bytes_per_msg: int = MAX_BYTES_PER_MSG,
        pre_vote: bool = True,
        check_quorum: bool = True,
        store_guard: bool = False,
        proven: bool = True,
        told: tuple[int, int] = (0, 0),
        conf: Conf | None = None,
    ) -> None:
        """`peers` are the voters (this member among them) unless `conf`, the group's
        configuration as of `applied`, is given."""
        self.id = node_id
        assert election_ticks > heartbeat_ticks >= 1
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        assert max_entries_per_msg >= 1
        self.max_entries_per_msg = max_entries_per_msg
        self.max_bytes_per_msg = max_bytes_per_msg
        self.pre_vote = pre_vote
        self.check_quorum = check_quorum
        self._rng = rng
        hard = storage.hard_state()
        self.term = hard.term
        self.vote = hard.vote
        self.log = _Log(storage, offset=storage.last_index() + 1)
        assert hard.commit <= self.log.last_index()
        # The state machine may have applied committed entries whose commit index was
        # not yet persisted (they were persisted, and committed, when it applied them).
        assert storage.snapshot().index <= applied <= self.log.last_index(), (
            applied,
            self.log.last_index(),
        )
        self.log.committed = max(hard.commit, applied)
        self.log.applied = applied
        # The configurations in use: the one at `applied`, then each configuration entry
        # of the log after it, in log order; the last is the one in use.
        base = conf or Conf(frozenset(peers) | {node_id})
        self._confs: list[tuple[int, Conf]] = [(applied, base)]
        if applied < self.log.last_index():
            for e in self.log.slice(applied + 1, self.log.last_index() + 1):
                c = Conf.decode(e.data)
                if c is not None:
                    self._confs.append((e.index, c))
        self.peers: tuple[str, ...] = ()
        self._voters: frozenset[str] = frozenset()
        self._persisted_hard = hard
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        self._use_conf()
        # As leader: the index of the empty entry that opened its term. Once that is
        # committed, so is everything an earlier leader committed (Raft, section 8).
        self.term_start = 0
        self.progress: dict[str, Progress] = {}
        self._votes: dict[str, bool] = {}
        self._transferee: str | None = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._random_timeout()
        self._msgs: list[Message] = []
        # As follower: the index up to which an append of this term showed this log to
        # match the leader's (a heartbeat's commit is taken only up to there).
        self._matched = 0
        # As follower: the leader's last SNAPSHOT request not yet taken by the driver.
        self._snapshot_request: Message | None = None
        # A member that may not stand (`_may_stand`) refused a candidate naming it a voter
        # whose log is behind its own: it stands at its next timeout (`campaign`).
        self._called = False
        #: Elections this member started (terms it stood as candidate in), for metrics.
        self.elections = 0
        #: Peers whose votes and acknowledgements are not counted (set by the driver).
        self.probation: frozenset[str] = frozenset()
        self.store_guard = store_guard
        #: Whether this store has held a leader's own-term commit (see the module doc).
        self.proven = proven
        #: While not proven: the highest (commit index, its leader's term) announced.
        self.told = told

    @property
    def conf(self) -> Conf:
        """The configuration in use: the newest this log holds, committed or not."""
        return self._confs[-1][1]

    @property
    def conf_index(self) -> int:
        """The index of the entry that made `conf` the configuration (or at most the
        applied index it was given at)."""
        return self._confs[-1][0]

    @property
    def committed_conf(self) -> Conf:
        """The newest configuration this log holds at or below the commit index."""
        committed = self.log.committed
        return next((c for i, c in reversed(self._confs) if i <= committed), self._confs[0][1])

    def is_voter(self) -> bool:
        return self.id in self._voters

    @property
    def transferee(self) -> str | None:
        """The member this leader is handing leadership to, if any."""
        return self._transferee

    @property
    def leader_silent_ticks(self) -> int:
        """Ticks since this member last heard from the leader it follows (0 as leader)."""
        return 0 if self.role is Role.LEADER else self._election_elapsed

    # -- the driver's inputs --------------------------------------------------------------

    def tick(self) -> None:
        """One unit of logical time."""
        self._election_elapsed += 1
        if self.role is not Role.LEADER:
            if self._election_elapsed >= self._timeout:
                self.campaign()
            return
        self._heartbeat_elapsed += 1
        if self._election_elapsed >= self.election_ticks:
            self._election_elapsed = 0
            self._transferee = None
            if self.check_quorum:
                voters = self._voters
                heard = sum(
                    1
                    for p, pr in self.progress.items()
                    if p in voters and (p == self.id or (pr.active and p not in self.probation))
                )
                if heard < self._quorum():
                    self._become_follower(self.term, None)
                    return
                for p, pr in self.progress.items():
                    pr.active = p == self.id
        if self._heartbeat_elapsed >= self.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            for p in self._others():
                pr = self.progress[p]
                self._send(MsgType.HEARTBEAT, p, commit=min(pr.match, self.log.committed))

    def propose(self, data: bytes) -> int:
        """Append `data` to the log as leader; returns its index. Raises `NotLeader`."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader, self.term)
        if self._transferee is not None:
            raise NotLeader(self._transferee, self.term)
        index = self.log.last_index() + 1
        self._append([Entry(self.term, index, data)])
        self._maybe_commit()
        self._broadcast_append()
        return index

    def propose_conf(self, change: ConfChange) -> int:
        """As leader, appends the configuration `change` makes of the one in use; returns
        its index. Raises `NotLeader`, or `ConfChangeRefused` while this leader has not
        committed an entry of its term, while another change is uncommitted, for a
        change that does not apply, and for a promotion of a learner whose log is not
        caught up to the commit index (it could not help commit yet)."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader, self.term)
        if self._transferee is not None:
            raise NotLeader(self._transferee, self.term)
        log = self.log
        if log.committed < self.term_start:
            raise ConfChangeRefused("the leader has not committed an entry of its term yet")
        if self.conf_index > log.committed:
            raise ConfChangeRefused("another configuration change is not committed yet")
        new = change.applied_to(self.conf)
        if change.kind == "promote" and self.progress[change.node].match < log.committed:
            raise ConfChangeRefused(f"{change.node} is not caught up to the commit index")
        index = log.last_index() + 1
        self._append([Entry(self.term, index, new.encode())])
        self._maybe_commit()
        self._broadcast_append()
        return index

    def step_down(self) -> None:
        """As leader, becomes a follower of no known leader in the same term (the driver
        does so after its node stalled for longer than a follower's lease: another may
        have been elected meanwhile, and a read served from this member's state could
        miss what that one committed). The group elects again, this member perhaps."""
        if self.role is Role.LEADER:
            self._become_follower(self.term, None)

    def heartbeats(self) -> list[Message]:
        """As leader, the heartbeats a tick sends, for a driver to send while this core
        waits for its `Ready` to be persisted (a long write must not look like a dead
        leader to the followers). Changes nothing and reads no storage; [] if not leader."""
        if self.role is not Role.LEADER:
            return []
        return [
            Message(
                MsgType.HEARTBEAT,
                self.id,
                p,
                self.term,
                commit=min(self.progress[p].match, self.log.committed),
            )
            for p in self._others()
        ]

    def forget_progress(self, peer: str) -> None:
        """As leader, forgets what `peer`'s log was known to hold (its store was replaced):
        it is probed again from the end of this log."""
        if self.role is Role.LEADER and peer in self.progress and peer != self.id:
            old = self.progress[peer]
            self.progress[peer] = Progress(next=self.log.last_index() + 1, active=old.active)

    def take_snapshot_request(self) -> Message | None:
        """The leader's latest request (a `SNAPSHOT` message) that this follower install
        a snapshot, once: its driver pulls the snapshot from `src` and calls `restore`."""
        m, self._snapshot_request = self._snapshot_request, None
        return m

    def restore(
        self, index: int, term: int, leader: str | None = None, conf: Conf | None = None
    ) -> bool:
        """A snapshot of the group's state at (`index`, `term`), committed, is here.

        Returns True when the driver must install it: the core dropped its log, which
        now starts after `index` (committed and applied up to it), and answers `leader`
        (if given) as to an append up to `index`; before the core takes another input
        the driver installs the state and calls `Storage.restore`; `conf` is the
        configuration the snapshot holds (None: the one in use). Returns False when
        there is nothing to install: the snapshot is stale (at or below the commit
        index), or this log holds its entry at the same term (it only moves the commit
        index; the entries apply from the log), or this core is not a follower (it has
        started an election since it asked)."""
        log = self.log
        if index <= log.committed or self.role is not Role.FOLLOWER:
            return False
        if log.matches(index, term):
            log.commit_to(index)
            if leader is not None:
                self._send(MsgType.APPEND_RESP, leader, index=index)
            return False
        log.unstable = []
        log.offset = index + 1
        log.restored = SnapshotMeta(index, term)
        log.committed = log.applied = index
        self._confs = [(index, conf or self.conf)]
        self._use_conf()
        self._matched = max(self._matched, index)
        # The storage holds (term, vote, index) once the driver restores it.
        self._persisted_hard = self._persisted_hard._replace(commit=index)
        if leader is not None:
            self._send(MsgType.APPEND_RESP, leader, index=index)
        return True

    def append_empty(self) -> int:
        """As leader, appends an empty entry (as at the start of a term), so the commit
        index moves when there is nothing else to commit; returns its index."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader, self.term)
        index = self.log.last_index() + 1
        self._append([Entry(self.term, index, None)])
        self._maybe_commit()
        self._broadcast_append()
        return index

    def judge_probation_ack(self, since: int, m: Message) -> str | None:
        """The identity rule's verdict (`identity.judge_ack`) on `m`, an accepted append
        acknowledgement from a peer on probation since `since`, as this core stands:
        "lift", "nudge" (the empty entry is appended here) or None."""
        commit = self.log.committed
        verdict = judge_ack(
            since,
            leading=self.role is Role.LEADER,
            term=self.term,
            commit=commit,
            commit_term=self.log.term_at(commit),
            last_index=self.log.last_index(),
            ack_term=m.term,
            acked=m.index,
        )
        if verdict == "nudge":
            self.append_empty()
        return verdict

    def campaign(self) -> None:
        """Start an election now (after a PreVote round if PreVote is on)."""
        if self.role is Role.LEADER:
            return
        called, self._called = self._called, False
        if not self._may_stand() and not called:
            # A learner, or a member removed: it does not stand, but it timed out: it
            # knows no leader (so no lease), and votes for a candidate that holds a newer
            # configuration naming it a voter.
            self.leader = None
            self._election_elapsed = 0
            return
        if not self._vouches_for(self.log.last_index(), self.log.last_term()):
            # It may not stand, but it timed out: it knows no leader (so no lease).
            self.leader = None
            self._election_elapsed = 0
            return
        if self.pre_vote:
            self._become_pre_candidate()
        else:
            self._become_candidate()

    def transfer_leadership(self, to: str) -> None:
        """As leader, hand leadership to `to` once its log is caught up (TimeoutNow)."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader, self.term)
        if to not in self._voters:
            raise ConfChangeRefused(f"{to} is not a voter of the group")
        if to == self.id:
            return
        self._transferee = to  # given up at the next CheckQuorum round if not done by then
        pr = self.progress[to]
        if pr.match == self.log.last_index():
            self._send(MsgType.TIMEOUT_NOW, to)
        else:
            self._send_append(to, even_if_empty=True)

    def step(self, m: Message) -> None:
        """Take one message from a peer."""
        assert m.dst == self.id, m
        # A message from outside this member's configuration is taken (a leader this
        # member's stale configuration does not name yet, a candidate with a newer one);
        # only voters' votes count, and a leader hears only from its members.
        if m.term > self.term:
            if m.type in (MsgType.PRE_VOTE, MsgType.VOTE):
                in_lease = (
                    self.check_quorum
                    and self.leader is not None
                    and self._election_elapsed < self.election_ticks
                )
                if in_lease and not m.force:
                    return  # a leader was heard from recently: no election now
            if m.type is MsgType.PRE_VOTE or (m.type is MsgType.PRE_VOTE_RESP and not m.reject):
                pass  # a PreVote round never changes anyone's term
            elif m.type in (MsgType.APPEND, MsgType.HEARTBEAT, MsgType.SNAPSHOT):
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, None)
        elif m.term < self.term:
            if m.type in (MsgType.APPEND, MsgType.HEARTBEAT, MsgType.SNAPSHOT):
                # A stale leader: tell it the term so it steps down.
                self._send(MsgType.APPEND_RESP, m.src)
            elif m.type is MsgType.PRE_VOTE:
                self._send(MsgType.PRE_VOTE_RESP, m.src, reject=True)
            return

        if m.type in (MsgType.PRE_VOTE, MsgType.VOTE):
            self._handle_vote(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    # -- the driver's output --------------------------------------------------------------

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def has_ready(self) -> bool:
        return bool(
            self._msgs
            or self.log.unstable
            or self.hard_state() != self._persisted_hard
            or self.log.to_apply()
        )

    def ready(self) -> Ready:
        hard = self.hard_state()
        rd = Ready(
            hard_state=hard if hard != self._persisted_hard else None,
            entries=tuple(self.log.unstable),
            messages=tuple(self._msgs),
            committed=tuple(self.log.to_apply()),
            leader=self.leader,
            role=self.role,
            term=self.term,
        )
        self._msgs = []
        return rd

    def advance(self, rd: Ready) -> None:
        """The driver persisted, sent and applied everything in `rd`."""
        if rd.hard_state is not None:
            self._persisted_hard = rd.hard_state
        if rd.entries:
            last = rd.entries[-1]
            self.log.stable_to(last.index, last.term)
            if self.role is Role.LEADER:
                self._maybe_commit()  # its own log now counts as far as it is persisted
        if rd.committed:
            self.log.applied = rd.committed[-1].index
            if len(self._confs) > 1:
                self._conf_committed()

    # -- roles ----------------------------------------------------------------------------

    def _become_follower(self, term: int, leader: str | None) -> None:
        if term > self.term:
            self.term = term
            self.vote = None
        self.role = Role.FOLLOWER
        self.leader = leader
        self._reset()

    def _become_pre_candidate(self) -> None:
        self.role = Role.PRE_CANDIDATE
        self.leader = None
        self._reset()
        self._poll(MsgType.PRE_VOTE, self.term + 1)

    def _become_candidate(self, force: bool = False) -> None:
        self.term += 1
        self.elections += 1
        self.vote = self.id
        self.role = Role.CANDIDATE
        self.leader = None
        self._reset()
        self._poll(MsgType.VOTE, self.term, force)

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE
        self.role = Role.LEADER
        self.leader = self.id
        self._reset()
        last = self.log.last_index()
        self.progress = {p: Progress(next=last + 1, active=p == self.id) for p in self.peers}
        self.term_start = last + 1
        self._append([Entry(self.term, last + 1, None)])
        self._maybe_commit()
        self._broadcast_append()

    def _reset(self) -> None:
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._random_timeout()
        self._votes = {}
        self._transferee = None
        self._matched = 0
        if self.role is not Role.LEADER:
            self.progress = {}

    def _poll(self, kind: MsgType, term: int, force: bool = False) -> None:
        self._votes = {self.id: True} if self.id in self._voters else {}
        if self._tally() == "won":
            self._won(kind)
            return
        for p in sorted(self._voters - {self.id}):
            self._msgs.append(
                Message(
                    kind,
                    self.id,
                    p,
                    term,
                    index=self.log.last_index(),
                    log_term=self.log.last_term(),
                    force=force,
                )
            )

    def _won(self, kind: MsgType) -> None:
        if kind is MsgType.PRE_VOTE:
            self._become_candidate()
        else:
            self._become_leader()

    def _tally(self) -> str:
        granted = sum(self._votes.values())
        if granted >= self._quorum():
            return "won"
        if len(self._votes) - granted > len(self._voters) - self._quorum():
            return "lost"
        return "pending"

    # -- message handling -----------------------------------------------------------------

    def _handle_vote(self, m: Message) -> None:
        pre = m.type is MsgType.PRE_VOTE
        can_vote = (
            self.vote == m.src
            or (self.vote is None and self.leader is None)
            or (pre and m.term > self.term)
        )
        resp = MsgType.PRE_VOTE_RESP if pre else MsgType.VOTE_RESP
        if (
            m.src in self.probation
            or (
                self.store_guard
                and self.log.last_index() == 0
                and (m.index > 0 or self.id not in self._voters)
            )
            or not self._vouches_for(m.index, m.log_term)
        ):
            can_vote = False
        behind = not self.log.is_up_to_date(m.index, m.log_term)
        if can_vote and not behind:
            # A granted PreVote answers at the asked-for term, so the candidate counts it.
            self._msgs.append(Message(resp, self.id, m.src, m.term))
            if not pre:
                self.vote = m.src
                self._election_elapsed = 0
        else:
            if behind and not self._may_stand():
                # The candidate's configuration names this member a voter (it asks for
                # its vote), and it lacks entries this log holds: it may not win without
                # this vote, and this member, a learner in its own log, never stands. It
                # stands once (`campaign`): see `_may_stand`.
                self._called = True
            self._send(resp, m.src, reject=True)

    def _step_follower(self, m: Message) -> None:
        if m.type is MsgType.APPEND:
            self._election_elapsed = 0
            self.leader = m.src
            self._handle_append(m)
        elif m.type is MsgType.HEARTBEAT:
            self._election_elapsed = 0
            self.leader = m.src
            # The leader sends the commit index capped at what it believes this log
            # matches; after a restart, or a lost disk, that belief may be stale, so the
            # commit is taken only as far as an append of this term showed the logs
            # match, and a rejecting answer asks the leader for an append.
            matched = max(self._matched, self.log.committed)
            self.log.commit_to(min(m.commit, matched))
            self._heard_commit(m)
            self._send(MsgType.HEARTBEAT_RESP, m.src, reject=m.commit > matched)
        elif m.type is MsgType.SNAPSHOT:
            self._election_elapsed = 0
            self.leader = m.src
            self._heard_commit(m)
            if m.index <= self.log.committed:
                # Held already (a late request): answer as to an append.
                self._send(MsgType.APPEND_RESP, m.src, index=self.log.committed)
            else:
                self._snapshot_request = m
        elif (
            m.type is MsgType.TIMEOUT_NOW
            and self._may_stand()
            and self._vouches_for(self.log.last_index(), self.log.last_term())
        ):
            self._become_candidate(force=True)

    def _step_candidate(self, m: Message) -> None:
        if m.type in (MsgType.APPEND, MsgType.HEARTBEAT, MsgType.SNAPSHOT):
            # A leader of this term exists (for a pre-candidate: of this term or later).
            self._become_follower(m.term, m.src)
            self._step_follower(m)
            return
        want = MsgType.PRE_VOTE_RESP if self.role is Role.PRE_CANDIDATE else MsgType.VOTE_RESP
        if m.type is not want:
            return
        if m.src not in self._voters:
            return
        self._votes.setdefault(m.src, not m.reject and m.src not in self.probation)
        outcome = self._tally()
        if outcome == "won":
            self._won(MsgType.PRE_VOTE if want is MsgType.PRE_VOTE_RESP else MsgType.VOTE)
        elif outcome == "lost":
            self._become_follower(self.term, None)

    def _handle_append(self, m: Message) -> None:
        log = self.log
        if m.index < log.committed:
            # Everything up to our commit index matches the leader's log already.
            self._send(MsgType.APPEND_RESP, m.src, index=log.committed)
            return
        if log.matches(m.index, m.log_term):
            last_new = m.index + len(m.entries)
            conflict = log.find_conflict(m.entries)
            if conflict:
                self._append(m.entries[conflict - m.index - 1 :])
            log.commit_to(min(m.commit, last_new))
            self._matched = max(self._matched, last_new)
            self._heard_commit(m)
            self._send(MsgType.APPEND_RESP, m.src, index=last_new)
            return
        hint = log.hint_at_or_before(m.index, m.log_term)
        self._send(
            MsgType.APPEND_RESP,
            m.src,
            index=m.index,
            reject=True,
            reject_hint=hint,
            log_term=log.term_at(hint),
        )

    def _step_leader(self, m: Message) -> None:
        pr = self.progress.get(m.src)
        if pr is None:
            return  # not a member (any more)
        pr.active = True
        if m.type is MsgType.APPEND_RESP:
            if m.reject:
                if pr.probing and m.index != pr.next - 1:
                    return  # answers an older probe
                if not pr.probing and m.index <= pr.match:
                    return  # stale
                # Skip back past the follower's conflicting term in one step.
                probe = m.reject_hint
                if m.log_term > 0:
                    probe = self.log.hint_at_or_before(m.reject_hint, m.log_term)
                pr.next = max(min(m.index, probe + 1), pr.match + 1)
                pr.probing = True
                pr.paused = False
                self._send_append(m.src)
                return
            pr.paused = False
            if m.index > pr.match:
                pr.match = m.index
                pr.next = max(pr.next, m.index + 1)
                pr.probing = False
                self._maybe_commit()  # the followers hear of it with the next message
                if self.role is not Role.LEADER:
                    return  # it committed a configuration that leaves it out
                if pr.next <= self.log.last_index():
                    self._send_append(m.src)
            if m.src == self._transferee and pr.match == self.log.last_index():
                self._send(MsgType.TIMEOUT_NOW, m.src)
        elif m.type is MsgType.HEARTBEAT_RESP:
            pr.paused = False
            if pr.match < self.log.last_index() or m.reject:
                # Empty if `next` ran ahead over a lost append: the follower's rejection
                # then moves `next` back.
                self._send_append(m.src, even_if_empty=True)

    def _heard_commit(self, m: Message) -> None:
        """A leader's message announced commit index `m.commit` (see `proven`)."""
        if self.proven or m.commit == 0:
            return
        if self.log.committed >= m.commit and self.log.term_at(m.commit) == m.term:
            self.proven = True
        elif (m.term, m.commit) > (self.told[1], self.told[0]):
            self.told = (m.commit, m.term)

    def _vouches_for(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) holds what this unproven store
        was told is committed (always, once proven)."""
        if not self.store_guard or self.proven or self.told[0] == 0:
            return True
        index, term = self.told
        return last_term > term or (last_term == term and last_index >= index)

    # -- replication ----------------------------------------------------------------------

    def _maybe_commit(self) -> bool:
        """Commit the highest index a majority holds, if that entry is of this term (5.4.2).

        The leader holds its own entries once they are persisted: `log.offset - 1` is
        the last index the driver persisted (everything before `unstable`)."""
        self.progress[self.id].match = self.log.offset - 1
        probation = self.probation
        voters = self._voters
        matches = sorted(
            (pr.match for p, pr in self.progress.items() if p in voters and p not in probation),
            reverse=True,
        )
        q = self._quorum()
        if len(matches) < q:
            return False
        index = matches[q - 1]
        if index > self.log.committed and self.log.term_at(index) == self.term:
            self.proven = True
            self.log.commit_to(index)
            # Members on probation are lifted by an acknowledgement of an append that
            # announced a commit of this term (identity.judge_ack): they hear of it now.
            for p in sorted(probation):
                if p != self.id and p in self.progress:
                    self._send_append(p, even_if_empty=True)
            self._conf_committed()
            return True
        return False

    def _broadcast_append(self) -> None:
        for p in self._others():
            self._send_append(p, even_if_empty=True)

    def _send_append(self, to: str, even_if_empty: bool = False) -> None:
        pr = self.progress.get(to)
        if pr is None:
            return  # no longer leader, or `to` no longer a member
        if pr.probing and pr.paused:
            return
        if pr.next <= self.log.snapshot().index:
            self._send_snapshot(to, pr)
            return
        last = self.log.last_index()
        hi = min(last + 1, pr.next + self.max_entries_per_msg)
        entries = tuple(self.log.slice(pr.next, hi))
        if len(entries) > 1:
            size = 0
            for n, e in enumerate(entries):
                size += len(e.data or b"")
                if n and size > self.max_bytes_per_msg:
                    entries = entries[:n]
                    break
        if not entries and not even_if_empty:
            return
        prev = pr.next - 1
        self._msgs.append(
            Message(
                MsgType.APPEND,
                self.id,
                to,
                self.term,
                index=prev,
                log_term=self.log.term_at(prev),
                entries=entries,
                commit=self.log.committed,
            )
        )
        if pr.probing:
            pr.paused = True
        elif entries:
            pr.next = entries[-1].index + 1

    def _send_snapshot(self, to: str, pr: Progress) -> None:
        """The entries `to` needs are compacted: ask it to install a snapshot. Sent like
        a probe (one until it answers; a heartbeat's answer sends it again, so a lost
        request or a failed install is retried every heartbeat)."""
        snap = self.log.snapshot()
        self._send(
            MsgType.SNAPSHOT, to, index=snap.index, log_term=snap.term, commit=self.log.committed
        )
        pr.probing = True
        pr.paused = True

    # -- helpers --------------------------------------------------------------------------

    def _send(self, kind: MsgType, to: str, **fields: object) -> None:
        self._msgs.append(Message(kind, self.id, to, self.term, **fields))  # type: ignore[arg-type]

    def _others(self) -> list[str]:
        return [p for p in self.peers if p != self.id]

    def _quorum(self) -> int:
        return len(self._voters) // 2 + 1

    def _may_stand(self) -> bool:
        """Whether this member may stand for election: it votes in the configuration in
        use, or in the newest committed one. (A member whose log holds its own removal,
        not yet committed, may hold the most up-to-date log: it stands, wins on the votes
        of the configuration in use, commits its removal and steps down. Standing is no
        matter of safety, only which votes count is.)"""
        return self.id in self._voters or self.id in self.committed_conf.voters

    def _append(self, entries: Sequence[Entry]) -> None:
        """Appends to the log, and uses the configuration its entries end with: the
        newest of the log's, once an overwritten suffix took its own away."""
        first = entries[0].index
        self.log.append(entries)
        confs = self._confs
        changed = False
        while len(confs) > 1 and confs[-1][0] >= first:
            confs.pop()
            changed = True
        for e in entries:
            if e.data is not None and e.data.startswith(CONF_PREFIX):
                c = Conf.decode(e.data)
                assert c is not None
                confs.append((e.index, c))
                changed = True
        if changed:
            self._use_conf()

    def _use_conf(self) -> None:
        conf = self.conf
        self._voters = conf.voters
        self.peers = tuple(sorted(conf.members() | {self.id}))
        if self.role is Role.LEADER:
            last = self.log.last_index()
            for p in self.peers:
                if p not in self.progress:
                    self.progress[p] = Progress(next=last + 1)
            for p in list(self.progress):
                if p not in self.peers:
                    del self.progress[p]

    def _conf_committed(self) -> None:
        """The commit index moved: configurations it passed are settled (the one in use
        at the commit index is kept as the base), and a leader whose committed
        configuration leaves it out as a voter steps down."""
        committed = self.log.committed
        confs = self._confs
        while len(confs) > 1 and confs[1][0] <= committed:
            confs.pop(0)
        if (
            self.role is Role.LEADER
            and self.id not in self._voters
            and (self.conf_index <= committed)
        ):
            self._become_follower(self.term, None)

    def _random_timeout(self) -> int:
        return self._rng.randrange(self.election_ticks, 2 * self.election_ticks)
