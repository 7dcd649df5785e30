"""Which peers' votes and acknowledgements a node counts: the rule for replaced stores.

Raft's safety rests on promises kept on disk: a node that acknowledged an entry holds
it, and a node that voted in a term (or saw a term) remembers it. A node whose store is
lost (a new disk, a deleted or corrupt file) breaks them while keeping its name. With
group {A, B, C}, entry e committed on A and B only: B loses its disk and restarts
empty, A is down; C (which lacks e) campaigns, B's empty log makes C look up to date,
B grants, C wins with {B, C} and e is lost. A replaced node's acknowledgements are no
safer: it has forgotten its term, so it acknowledges a deposed leader that a majority
(counting its old store) had already left behind, and that leader then commits over
entries of a later term.

Every store has an identity, a random id written when its file is created
(`RaftLogStore.identity`), and every payload a node sends carries its own. Each node
keeps a `PeerBook`, durably in its store: the identity it last saw for each peer, and
the (group, peer) pairs on *probation*.

Replacement. A payload whose identity differs from the one recorded for its sender
(when one is recorded) means the sender's store was replaced: the book records the new
identity and puts the sender on probation in every group the two share, noting this
node's commit index there (`since`). A first sighting records the identity and nothing
else, so a new cluster, where nobody recorded anything, elects as usual. A late
message of the old store (seen after the new one) counts as one more replacement:
probation starts again, which only delays.

Probation. The core (`RaftCore.probation`) does not count a grant from a peer on
probation (it counts as a rejection), leaves its matched index out when counting
replicas to commit, does not count it as heard from for CheckQuorum, and does not
vote for it (a replaced node with a partial log would otherwise win with the vote of a
member as far behind as itself, without an entry its old store helped commit); it still
replicates to it, and a leader that sees a follower replaced forgets what it knew of
that follower's log (`RaftCore.forget_progress`) and probes it from scratch. So until
lifted, the group runs as if that peer were down, which is safe by Raft's own argument
as long as a majority of the others keep their stores.

Lifting (`caught_up`, `judge_ack`): on this node, in one group, when this node leads it
in term U, its commit index c is past `since` and is an entry of term U, and the peer
accepts an append in term U up to at least c. Why that is enough: c was committed after
the replacement was seen, by a quorum Q not counting the peer. (1) No leader of a term
above U was elected before Q's acknowledgements: its voters would meet Q in a node
that then acknowledged term U after voting in a higher one. So every entry the old
store helped commit is of a term <= U and, by Leader Completeness (terms < U) or
because this leader counted it itself (term U; `c` is past it), lies in this leader's
log at or below c. (2) The peer acknowledged term U up to c: its new store holds all of
those entries and is at term U, so its grants and acknowledgements are as good as any
member's again. A deposed leader cannot lift: it cannot commit in its term without the
majority that left it. When a quiet group has nothing to commit, the leader appends an
empty entry once the peer holds its whole log ("nudge"), so the lift does not wait for
traffic. A lift lost in a crash only means probation again.

Snapshots. A new store whose leader has compacted its log catches up from a snapshot of
the group's state (zdmq/raft/core.py) before the log. A snapshot holds committed entries
only, up to its index, and a follower acknowledges it only once it is installed (the state
file synced and renamed, the log reset after it): that acknowledgement, an accepted append
up to the snapshot's index in the leader's term, says what an acknowledgement of those
entries would, so `judge_ack` takes it like any other. A store caught up by a snapshot is
thus caught up as of the snapshot's index, and its probation lifts once it acknowledges
the leader's commit index of its own term (usually with the entries after the snapshot).

Lift reports (`LiftReport`, `report_current`, `PeerBook.lift_reported`). A node that
lifts a probation, itself or on a report, records the peer's store as *cleared* in that
group (`PeerBook.cleared`, durable). A leader of group g in term U reports to g's
other members, with every payload it sends them (for a bounded time after its term
starts or it lifts a probation there), each other member P whose store X it cleared
in g and still records, not on probation again: (g, P, X, the index i that X has
acknowledged in term U, U). A member F takes a report only from the leader it
follows in its current term (report term = F's term, sender = F's leader) and does
not hold on probation there (a sender's store F sees replaced vouches for nothing
until it is lifted itself), then:
  * if F records another identity for P than X (or none), it records X first,
    exactly as if a payload of X had arrived: probation in every group F shares with
    P, noting F's commit index (a first sighting: nothing);
  * it lifts its probation of P in g if its recorded identity for P is X and
    i >= F's `since` for P in g, and records X as cleared in g. Other groups'
    probations stay.
Why F may trust it. A lift establishes a fact about the store X, not about the node
that lifted it: (1) and (2) above show that X holds, and acknowledged at term U0 (the
lifting leader's term), every entry any earlier store of P helped commit (those
stores' acknowledgements all precede X, which precedes the lifting leader seeing X,
which precedes the quorum that committed c), and that X is at term >= U0. A store
never loses a committed entry it holds nor goes back in term while it keeps its
identity (a loss is a new identity), so the fact holds from then on, wherever and
whenever it is read: a report delayed, duplicated or reordered says nothing false,
and a node that took
the fact on a report may pass it on (by induction, every report's term is >= U0: a
node takes a report only at the report's term and leads later only in higher
terms). i >= F's `since` adds F's own view: X holds every entry F knew committed
when it put P on probation. What F must not do is count anything X said before it
caught up: X's grants and acknowledgements of then are of terms <= U0 <= the
report's term U, and F takes the report at term U, following a leader of U, so
afterwards F is a candidate or a leader only in terms > U (terms only grow) and
never counts them. This is why a report is only taken from F's current leader at
F's current term: a report of U read by F at a later term would be just as true,
but F may have been a candidate between, and the argument no longer covers it. A
deposed leader cannot lift (it commits nothing in its term), and its reports are of
a term F has left. A report on an older identity X of P, read after F recorded a
newer one Y, makes F record X (probation in every shared group, as a replacement)
and lift it in g, as the fact about X allows; Y's next payload is a replacement
again, checked before anything of it counts: it only delays, as a late message of an
old store does. A report never lifts a probation in another group or of another peer.

What reports do not cover (liveness only). A leader reports only stores it cleared:
one it saw first, having never recorded that peer's old store, it never had on
probation (see Known limits) and cannot vouch for, so a member that holds that peer
on probation keeps it until it leads while the peer catches up, or another leader
that cleared it reports it. The same for a member that missed every report (down
for their whole time): it waits for the next leader's term. While it lasts, that
member cannot count the peer's grant, so a group that has then lost another member
may have to wait for it.

The replaced node itself, which has no record of what it lost, guards its own vote
with `RaftCore.store_guard` (this covers the candidates that never heard from the old
store and so have nothing recorded for it: followers of a stable leader never talk to
each other):
  * a node whose log is empty grants a vote only to a candidate whose log is empty
    too. In the example above, B refuses C even if C has no identity recorded for B.
    A first boot still elects, since every log is empty. A node whose log is empty and
    that is no voter of its configuration (a member just added to a running group, as
    a learner) grants none: a replaced member whose configuration is stale enough to
    count it a voter would otherwise win on two empty logs, as on a first boot.
  * `RaftCore.proven` / `told` (kept per group in the store, `raft_self`): a store
    that has not yet held everything up to a commit index its leader made in its own
    term is not proven; meanwhile it remembers the highest commit index (and that
    leader's term) a leader announced to it, and grants a vote, or campaigns, only for
    a log at least as up to date as that. A wiped store that got part of the log back
    therefore does not vouch for a candidate missing entries it was told are
    committed. A store that was told nothing yet (a first boot before the first
    commit) votes as usual.

The fault model this is built for (and zdmq/raft/sim.py checks): a store is lost
whole; a member loses its store only when no other member is still recovering from a
lost one (its log has reached the commit index of its loss, and every member has seen
its new store and lifted its probation) and every other member is proven (it has held
its leader's own-term commit once, as every member of a healthy group does shortly
after its first election; a lost log and one that never received anything look
alike, and two of them are a first boot); messages may be lost, duplicated, delayed
and reordered, including those of the old store; any number of members may crash,
pause or be cut off meanwhile. With a member down as well, a group may then stop
electing until it comes back, as it must: it may be the only one left holding some
committed entry.

Known limits. A store restored from a copy keeps its identity: its rollback is not
seen. A leader that never received anything from a peer's old store has nothing
recorded for it, so it counts the new store's acknowledgements at once; if that leader
was also deposed by a majority that counted the old store, the new store (which has
forgotten the higher term) could help it commit. That takes a leader cut off from one
member for that member's whole life, and the simulation has not reached it, but the
argument above does not exclude it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zdmq.raft.core import Conf

__all__ = ["LiftReport", "PeerBook", "caught_up", "judge_ack", "readded", "report_current"]


def caught_up(
    since: int,
    *,
    leading: bool,
    term: int,
    commit: int,
    commit_term: int,
    ack_term: int,
    acked: int,
) -> bool:
    """Whether a peer on probation since commit index `since` has caught up: this node
    leads (`leading`) in `term`, its commit index `commit` (an entry of `commit_term`)
    is past `since` and of this term, and the peer accepted an append of this term
    (`ack_term`) up to `acked` >= `commit`. The module docstring says why that is safe."""
    return leading and commit > since and commit_term == term == ack_term and acked >= commit


def judge_ack(
    since: int,
    *,
    leading: bool,
    term: int,
    commit: int,
    commit_term: int,
    last_index: int,
    ack_term: int,
    acked: int,
) -> str | None:
    """What a node does with an accepted append acknowledgement from a peer on
    probation since `since`: "lift" the probation (`caught_up`), "nudge" (it leads, the
    peer holds its whole log, but the commit index has not moved since the replacement
    and nothing is in flight to move it: append an empty entry, so a quiet group lifts
    too), or None (wait)."""
    if caught_up(
        since,
        leading=leading,
        term=term,
        commit=commit,
        commit_term=commit_term,
        ack_term=ack_term,
        acked=acked,
    ):
        return "lift"
    if leading and ack_term == term and commit <= since and acked >= last_index == commit:
        return "nudge"
    return None


def readded(before: Conf, after: Conf) -> frozenset[str]:
    """The peers that a snapshot, installed over a log whose committed configuration
    was `before`, shows removed and added again: voters of `before` that the snapshot's
    configuration `after` names learners (a voter becomes a learner no other way). The
    node forgets them as at their removal (`PeerBook.forget`), which the entries the
    snapshot stands for would have made it do."""
    return before.voters & after.learners


@dataclass(frozen=True, slots=True)
class LiftReport:
    """A leader's word that it lifted the probation of `peer` in `group`: the peer's
    store `identity` accepted appends of the leader's term `term` up to `index` (the
    leader's matched index for it when the report was sent). `src` is the leader."""

    src: str
    group: str
    peer: str
    identity: str
    index: int
    term: int


def report_current(
    report: LiftReport, *, term: int, leader: str | None, probation: Iterable[str] = ()
) -> bool:
    """Whether a node at `term`, following `leader` (None: it knows none), holding the
    peers `probation` on probation in the report's group, takes `report` at all: it
    comes from the leader this node follows in its current term, not on probation."""
    return report.term == term and leader == report.src and report.src not in probation


@dataclass(slots=True)
class PeerBook:
    """What a node knows of its peers' stores: identities and probations (module doc).

    The driver applies the changes it makes (`take_changes`) to durable storage.
    """

    #: Peer -> the store identity last seen from it.
    identities: dict[str, str] = field(default_factory=dict)
    #: (group, peer) -> this node's commit index in that group when the peer was replaced.
    probation: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (group, peer) -> the peer's store identity whose probation this node lifted there
    #: (itself, or on a report): what it reports as that group's leader.
    cleared: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Peer -> the identity of its store that left every group this node shares with it
    #: (`forget`): a late message of that store is not a sighting. Kept in memory only.
    departed: dict[str, str] = field(default_factory=dict)
    _dirty_ids: set[str] = field(default_factory=set)
    _dirty_prob: set[tuple[str, str]] = field(default_factory=set)
    _dirty_clear: set[tuple[str, str]] = field(default_factory=set)

    def see(
        self,
        peer: str,
        identity: str,
        commits: Mapping[str, int],
        learning: Iterable[str] = (),
    ) -> list[str]:
        """A payload from `peer` carrying `identity`; `commits` maps each group this node
        shares with `peer` where the peer votes to this node's commit index in it, and
        `learning` names those where it is a learner. Returns the groups in which the
        peer was put on probation now (empty unless its store was replaced).

        A learner's store, first seen or replaced, is cleared at once where it learns:
        its acknowledgements never counted, and it is caught up from scratch before it
        may be promoted; so a leader that saw it reports it, and members that see it only
        after its promotion (followers hear a peer only when it stands for election) lift
        their probation on that report."""
        known = self.identities.get(peer)
        if known == identity:
            return []
        if known is None and self.departed.get(peer) == identity:
            return []  # a late message of a store that left: nothing to record
        self.departed.pop(peer, None)
        self.identities[peer] = identity
        self._dirty_ids.add(peer)
        for gid in learning:
            self.probation.pop((gid, peer), None)
            self.cleared[(gid, peer)] = identity
            self._dirty_prob.add((gid, peer))
            self._dirty_clear.add((gid, peer))
        if known is None:
            return []
        for gid, commit in commits.items():
            self.probation[(gid, peer)] = commit
            self._dirty_prob.add((gid, peer))
            if self.cleared.pop((gid, peer), None) is not None:
                self._dirty_clear.add((gid, peer))
        return list(commits)

    def on_probation(self, group: str, peers: Iterable[str]) -> frozenset[str]:
        """Which of `peers` (members of `group`) are on probation in it."""
        return frozenset(p for p in peers if (group, p) in self.probation)

    def since(self, group: str, peer: str) -> int | None:
        """The commit index noted when `peer` went on probation in `group`, or None."""
        return self.probation.get((group, peer))

    def lift(self, group: str, peer: str) -> None:
        """Ends the probation of `peer` in `group`, and records its store as cleared there."""
        if self.probation.pop((group, peer), None) is not None:
            self._dirty_prob.add((group, peer))
            self.cleared[(group, peer)] = self.identities[peer]
            self._dirty_clear.add((group, peer))

    def forget(self, group: str, peer: str, *, last: bool) -> None:
        """`peer` left `group` (its removal committed): its probation and clearance there
        go, and, when it was the `last` group this node shared with it, its store's
        identity too. A store that joins again is a new member, caught up as a learner
        before it votes: a store seen again after that is not a replaced one."""
        key = (group, peer)
        if self.probation.pop(key, None) is not None:
            self._dirty_prob.add(key)
        if self.cleared.pop(key, None) is not None:
            self._dirty_clear.add(key)
        if last and (gone := self.identities.pop(peer, None)) is not None:
            self._dirty_ids.add(peer)
            self.departed[peer] = gone

    def reportable(self, group: str, peer: str) -> str | None:
        """The identity of `peer`'s store if this node cleared it in `group` (lifted its
        probation there, itself or on a report) and it is still the one recorded and not
        on probation: what a leader of `group` reports (module doc), else None."""
        ident = self.cleared.get((group, peer))
        if ident is None or ident != self.identities.get(peer) or (group, peer) in self.probation:
            return None
        return ident

    def lift_reported(self, report: LiftReport) -> bool:
        """Lifts the probation `report` (already found current, `report_current`) is
        about, if the peer's recorded identity is the report's and the peer acknowledged
        at least up to the commit index this node noted when it put it on probation;
        returns whether it did."""
        since = self.since(report.group, report.peer)
        if since is None or self.identities.get(report.peer) != report.identity:
            return False
        if report.index < since:
            return False
        self.lift(report.group, report.peer)
        return True

    def take_changes(
        self,
    ) -> tuple[
        dict[str, str | None],
        dict[tuple[str, str], int | None],
        dict[tuple[str, str], str | None],
    ]:
        """(identities, probations and cleared stores to write or, where None, to delete)
        since the last call."""
        ids = {p: self.identities.get(p) for p in self._dirty_ids}
        prob = {k: self.probation.get(k) for k in self._dirty_prob}
        clear = {k: self.cleared.get(k) for k in self._dirty_clear}
        self._dirty_ids.clear()
        self._dirty_prob.clear()
        self._dirty_clear.clear()
        return ids, prob, clear

    def has_changes(self) -> bool:
        return bool(self._dirty_ids or self._dirty_prob or self._dirty_clear)
