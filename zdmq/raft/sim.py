"""A seeded, deterministic simulation of a Raft group, in one process.

N `RaftCore`s talk over a simulated network that drops, duplicates, delays (and so
reorders) messages and cuts the group into partitions that later heal. Each node has a
simulated disk (`MemoryStorage`) that its driver writes from each `Ready`, as
`RaftHost` does: it takes the `Ready`, sends the leader's messages that may go before
the write (`SENT_BEFORE_PERSIST`) and applies its committed entries at once, then
writes it, often some steps later (the core steps and ticks meanwhile), and only then
sends the rest and `advance`s. A crash loses the write in progress (while the appends
it carries may already be out), and a restarted node comes back from its disk alone,
its state machine rebuilt by re-applying the log.
Nodes also pause (a stopped process: messages to it wait). Clients propose entries to
random nodes, following a `NotLeader` hint once. The entries are the queue's commands
(zdmq/server/machine.py: pushes, pops, receives, acks, nacks, expiries), and every node
applies what it applies to its own `NodeState`, rebuilt from its durable state when it
restarts or installs a snapshot; zdmq/raft/sim_queue.py draws the calls and checks, at
the end, what each client was told. `run(..., open_disk=...)` puts the disks
on another `WritableStorage` (the SQLite log, reopened from its file at each restart); a
run's outcome depends only on its seed, whatever the disk.

Disk loss: a crash may also lose the node's disk; it restarts empty, with a new store
identity, and its peer book and proven/told state (zdmq/raft/identity.py) gone with
it. The driver applies the same rule as `RaftHost`, from zdmq/raft/identity.py: every
message carries its sender's identity, a receiver puts a sender seen with a new one on
probation (`RaftCore.probation`, `PeerBook`) and lifts it with `judge_ack` or on its
leader's `LiftReport` (a leader adds reports on the stores it cleared to every message
it sends), and cores run with `store_guard` and keep `proven` / `told` on their disk
(lost with it).
The exact fault model for disks: a disk is lost whole, only on a crash, only while
every other node is proven (`RaftCore.proven`, which every member of a healthy group
is shortly after its first election), and only once every node that lost its disk
before has recovered (its commit index reached the highest index committed anywhere
when it lost it, and every other node has seen its new store and lifted its
probation); any number of other nodes may meanwhile crash, pause or be cut off, and
the old store's messages still in flight are delivered as any others. Disk losses
draw from their own random stream, so a seed's other faults are the same with or
without them. With `identity_rule=False` the drivers ignore identities (a leader
still starts over with a replaced follower, the mechanics of catching a new disk up),
as hosts without the rule would, and some seeds then lose a committed entry: see
`DISK_LOSS_WITHOUT_RULE`.

Compaction and snapshots: each node keeps a durable copy of its state machine (the
entries it applied, up to an index: what `group-<g>.sqlite3` is to a real member) and,
every few applied entries (a small threshold each seed draws, or never), checkpoints it
there and compacts its log up to a few entries short of it; it also writes it, often, as
it applies a Ready's committed entries, before the Ready's write records the commit index
(as a member writes its group state, and the commit index with its next write), so a
restart finds it ahead of the recorded commit at an entry the log holds: the log stays
(`--no-state-writes`: durable only at checkpoints). A follower the leader asks
for a snapshot (`take_snapshot_request`) pulls the leader's applied state a few steps
later (failing if the leader is down or cut off by then: the leader asks again),
installs it as `RaftHost` does (the state first, then the log reset, `restore`) and may
crash between the two: it then restarts with its state ahead of its log, and resets the
log after the state's index as the host does at start. Every entry a snapshot carries
is checked against the committed ones, and against what the node had applied already.

Checked all along: at most one leader per term; a node's term never goes back and its
vote never changes within a term on disk; a committed entry never changes (same index,
same term and data on every node that has it committed, checked as each node's commit
index moves and in every node's whole log every 50 steps); every node applies the same
entries in the same order. At the end the faults stop, and the group must converge:
every node applies every entry a node had applied (so every proposal whose commit was
acknowledged), each once; and the queue's checker (zdmq/raft/sim_queue.py) finds every
node's state equal to the entries' replay, every answered call's result equal to its
committed entry's, nothing acknowledged lost, no pop handed out twice and no ack
undone. After a run that lost a disk, the healed group must then end
every probation (the leader lifts its own and reports them; unless one remains that
the leader cannot report, see zdmq/raft/identity.py, and `SimResult.liveness_checked`
stays False), and once its leader goes down the others must elect and commit.

Everything random comes from one seed, so a failure replays exactly:

    python -m zdmq.raft.sim --seed 17 --steps 400 --nodes 5 [--trace]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from zdmq.raft.core import (
    SENT_BEFORE_PERSIST,
    Conf,
    ConfChangeRefused,
    Message,
    MsgType,
    NotLeader,
    RaftCore,
    Ready,
    Role,
    next_change,
)
from zdmq.raft.identity import LiftReport, PeerBook, readded, report_current
from zdmq.raft.sim_queue import QueueClients, QueueCounts, is_command, replay
from zdmq.raft.storage import (
    Entry,
    MemoryStorage,
    SnapshotMeta,
    WritableStorage,
    holds_entry,
)
from zdmq.server.machine import apply_command, decode_command
from zdmq.server.state import NodeState

__all__ = ["DiskOpener", "SimConfig", "SimFailure", "SimResult", "main", "run"]

#: Opens node `id`'s disk as last persisted (or, when the second argument is True, a new
#: empty one: the disk was lost); called at each start and restart of the node.
DiskOpener = Callable[[str, bool], WritableStorage]

#: A seed that loses a committed entry to a disk loss when the identity rule is off
#: (3 nodes, the default config): `python -m zdmq.raft.sim --seed N --no-identity-rule`.
DISK_LOSS_WITHOUT_RULE = 3

#: The default chance that a crash also loses the node's disk (the most a seed draws).
DISK_LOSS = 0.3

#: The group id the simulated nodes use in their peer books.
GROUP = "g"


def conf_at(entries: tuple[Entry, ...] | list[Entry], base: Conf) -> Conf:
    """The configuration after `entries` (the last one they hold, else `base`)."""
    for e in reversed(entries):
        conf = Conf.decode(e.data)
        if conf is not None:
            return conf
    return base


class SimFailure(AssertionError):
    """An invariant broke; the message ends with the command that replays the run."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The fault model. Rates are chances per simulated step (one tick of every node).

    Each seed draws its own rate for every fault, uniformly between 0 and the rate given
    here, and its own append size from `max_entries_per_msg` ("swarm testing"): a run
    calm on one fault and harsh on another reaches states a fixed mix rarely does.
    """

    nodes: int = 3
    steps: int = 400
    election_ticks: int = 10
    max_delay: int = 3
    drop: float = 0.15
    duplicate: float = 0.06
    crash: float = 0.012
    #: A leader's extra chance of crashing: new leaders that fail fast are what leave
    #: old-term entries half replicated (Raft's Figure 8).
    crash_leader: float = 0.08
    down_steps: tuple[int, int] = (2, 50)
    #: The chance that a crash also loses the node's disk (see the module docstring).
    disk_loss: float = DISK_LOSS
    #: Whether drivers apply zdmq/raft/identity.py's rule (off: to show the hazard).
    identity_rule: bool = True
    pause: float = 0.012
    pause_steps: tuple[int, int] = (3, 40)
    partition: float = 0.03
    partition_steps: tuple[int, int] = (3, 80)
    #: Chance a driver leaves its node's Ready's write for a later step (what a crash
    #: then loses).
    persist_lag: float = 0.5
    #: Chance a leader is asked to hand over to a random peer (transfer_leadership).
    transfer: float = 0.02
    propose: float = 0.3
    #: Chance, each step, that a leader steps down (`step_down`, as a driver has its
    #: leaders do after its node stalled). Drawn from a generator of its own; 0 leaves a
    #: seed's run as it was without it.
    step_down: float = 0.0
    #: Entries an append carries at most: small limits split a new leader's catch-up
    #: from its empty entry, which is where committing by counting an old term breaks.
    max_entries_per_msg: tuple[int, ...] = (1, 2, 3, 64)
    #: Steps the healed group gets to converge.
    heal_steps: int = 1500
    #: Applied entries past the last compaction at which a node compacts (0: never); a
    #: seed draws one, and the entries it keeps behind its applied index.
    compact_every: tuple[int, ...] = (0, 2, 4, 8)
    keep_entries: tuple[int, ...] = (0, 1, 3)
    #: The chance a node crashes in the middle of installing a snapshot.
    install_crash: float = 0.2
    #: The chance that a node's state machine is written as it applies a Ready's committed
    #: entries, before the Ready's write records the commit index (a member's group state
    #: file, and the commit index the host writes with its next write).
    state_writes: float = 0.8
    #: Steps a snapshot takes to arrive from the leader.
    fetch_steps: tuple[int, int] = (1, 6)
    #: Nodes besides the first `nodes` that membership changes may add (0: the group's
    #: members never change). With spares, a mover adds, promotes, removes and replaces
    #: members (3 to `max_voters` voters), one change at a time through the log.
    spares: int = 0
    max_voters: int = 5
    #: The chance, each step, that the mover takes its next step.
    reconfig: float = 0.3
    #: The chance that the mover crashes at a step (it forgets the move it was making; a
    #: later one first finishes or undoes what it left, as a rerun command does).
    mover_crash: float = 0.15

    def draw(self, rng: random.Random) -> SimConfig:
        """This config with every fault rate drawn in [0, rate] (one seed's mix)."""
        rates = (
            "drop", "duplicate", "crash", "crash_leader", "pause", "partition",
            "persist_lag", "transfer",
        )  # fmt: skip
        drawn: dict[str, Any] = {k: rng.uniform(0, getattr(self, k)) for k in rates}
        drawn["max_entries_per_msg"] = (rng.choice(self.max_entries_per_msg),)
        return replace(self, **drawn)


@dataclass(slots=True)
class SimResult:
    seed: int
    leaders: int = 0
    crashes: int = 0
    disk_losses: int = 0
    partitions: int = 0
    transfers: int = 0
    step_downs: int = 0
    proposed: int = 0
    acked: int = 0
    applied: int = 0
    messages: int = 0
    steps_to_converge: int = 0
    compactions: int = 0
    snapshots_installed: int = 0
    install_crashes: int = 0
    #: Whether the run checked that the group elects without its leader after healing.
    liveness_checked: bool = False
    #: Crashes that lost a leader's write whose appends had left already.
    lost_early_writes: int = 0
    #: Membership changes committed, moves finished, and crashes of the mover.
    conf_changes: int = 0
    moves: int = 0
    mover_crashes: int = 0
    #: The queue's clients: their calls and what they were told.
    queue: QueueCounts = field(default_factory=QueueCounts)


@dataclass(slots=True)
class _Node:
    id: str
    disk: WritableStorage = field(default_factory=MemoryStorage)
    core: RaftCore | None = None
    down_until: int = 0
    paused_until: int = 0
    applied: list[Entry] = field(default_factory=list)
    #: The group's queue state, as the entries in `applied` made it.
    machine: NodeState = field(default_factory=NodeState)
    #: Committed entries of this node's log already compared with the committed ones.
    checked: int = 0
    starts: int = 0
    #: The store's identity, and what its disk holds besides the log.
    identity: str = ""
    book: PeerBook = field(default_factory=PeerBook)
    proven: bool = False
    told: tuple[int, int] = (0, 0)
    #: Restarts with a new empty disk.
    lose_disk: bool = False
    #: While recovering from a lost disk: the commit index it must reach.
    recover_to: int | None = None
    #: The state machine as last made durable: (index, term, the entries applied).
    state: tuple[int, int, tuple[Entry, ...]] = (0, 0, ())
    #: A snapshot being pulled: (the step it arrives, the node it comes from).
    fetch: tuple[int, str] | None = None
    #: The `Ready` its driver took and has not written yet (lost by a crash).
    writing: Ready | None = None
    #: Whether it is a member: a spare joins when a move adds it, and leaves (its disk
    #: with it) once its removal is committed.
    joined: bool = True
    #: The configuration it starts from when its disk holds no state (a new learner's,
    #: or the cluster map's after a lost disk).
    start_conf: Conf | None = None


class _Sim:
    def __init__(
        self,
        seed: int,
        cfg: SimConfig,
        trace: Callable[[str], None] | None = None,
        open_disk: DiskOpener | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        # Disk losses draw from their own stream: a seed's other faults stay as they were.
        self.disk_rng = random.Random(f"{seed}/disks")
        self.asked = cfg
        self.cfg = cfg = replace(
            cfg.draw(self.rng), disk_loss=self.disk_rng.uniform(0, cfg.disk_loss)
        )
        self.trace = trace
        self.ids = [f"n{i}" for i in range(cfg.nodes + cfg.spares)]
        self.nodes = {i: _Node(i, joined=k < cfg.nodes) for k, i in enumerate(self.ids)}
        # The configuration at the start, and each committed configuration entry seen.
        self.base_conf = Conf(frozenset(self.ids[: cfg.nodes]))
        self.confs: dict[int, Conf] = {}
        # The move the mover is making: (kind, node to add, node to remove).
        self.move: tuple[str, str | None, str | None] | None = None
        # The mover draws from a stream of its own (and its rates too): a seed's other
        # faults are the same with or without membership changes.
        self.mover_rng = random.Random(f"{seed}/mover")
        self.step_down_rng = random.Random(f"{seed}/step-down")
        self.cfg = cfg = replace(
            cfg,
            reconfig=self.mover_rng.uniform(0, cfg.reconfig),
            mover_crash=self.mover_rng.uniform(0, cfg.mover_crash),
        )
        self.open_disk = open_disk
        self.now = 0
        self.healing = False
        # (due step, sequence, message, sender's identity, lift reports sent with it)
        self.net: list[tuple[int, int, Message, str, tuple[LiftReport, ...]]] = []
        self.seq = 0
        self.groups: dict[str, int] | None = None
        self.heal_at = 0
        self.leaders: dict[int, str] = {}
        self.committed: dict[int, tuple[int, bytes | None]] = {}
        self.proposals: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.queue = QueueClients(seed)
        self.result = SimResult(seed)
        self.batch = cfg.max_entries_per_msg[0]
        # Compaction draws from its own stream too: a seed that never compacts runs as
        # it would without it.
        self.snap_rng = random.Random(f"{seed}/snapshots")
        self.compact_every = self.snap_rng.choice(cfg.compact_every)
        self.keep = self.snap_rng.choice(cfg.keep_entries)
        # When a node's state machine is written as it applies (a member's group state
        # file), ahead of the commit index its log records: from a stream of its own.
        self.state_rng = random.Random(f"{seed}/state")
        for n in self.nodes.values():
            if n.joined:
                self._start(n)

    # -- running ----------------------------------------------------------------------

    def run(self) -> SimResult:
        for _ in range(self.cfg.steps):
            self._faults()
            self._step()
        self._heal()
        self.result.steps_to_converge = self._converge()
        if self.result.disk_losses and self.cfg.identity_rule:
            self._check_liveness()
            self._converge()
        self._check_logs()
        self._check_final()
        self.result.acked = len(self.acked)
        self.result.applied = len(self._members()[0].applied)
        self.result.queue = self.queue.counts()
        return self.result

    def _converge(self) -> int:
        """Steps until the group converges; the steps it took."""
        for extra in range(self.cfg.heal_steps):
            self._step()
            if extra % 10 == 0 and self._converged():
                return extra
        self._fail("the healed group did not converge")
        return 0

    def _check_liveness(self) -> None:
        """After lost disks, once healed and converged: every probation ends (the leader
        lifts its own and reports them, the others lift theirs on its reports), then the
        leader goes down, and the others must elect one of themselves and commit.

        Not checked (`SimResult.liveness_checked` False) when a probation remains that
        the leader cannot report: one held on a store the leader saw first, having never
        recorded that peer's old one (zdmq/raft/identity.py, the limit of the reports).
        A member that still records a voter's old store holds the new one on probation
        as soon as it hears from it (a follower hears a peer only when that peer stands
        for election, which may be only once the leader is down): it counts as holding
        it already."""
        settled = 0
        lead: _Node | None = None
        for _ in range(self.cfg.heal_steps):
            self._step()
            lead = next(
                (n for n in self.nodes.values() if n.core and n.core.role is Role.LEADER), None
            )
            if lead is not None and not self._held_on_probation():
                settled += 1
                if settled > 3 * self.cfg.election_ticks:
                    break
            else:
                settled = 0
        else:
            if lead is not None and not lead.book.probation:
                held = self._held_on_probation()
                if all(lead.book.reportable(GROUP, p) is None for p in held):
                    self._log(f"probations of {sorted(held)} remain that {lead.id} cannot report")
                    return
            self._fail("the healed group did not lift every probation")
        assert lead is not None
        self.result.liveness_checked = True
        old = lead
        old.core = None
        old.down_until = self.now + 10 * self.cfg.heal_steps
        self.result.crashes += 1
        self._log(f"{old.id} goes down: the others must elect and commit")
        others = [n for n in self._members() if n is not old]
        proposed: dict[bytes, tuple[str, int]] = {}
        for _ in range(self.cfg.heal_steps):
            self._step()
            lead = next((n for n in others if n.core and n.core.role is Role.LEADER), None)
            if lead is not None and lead.core is not None:
                at = (lead.id, lead.core.term)
                if at not in proposed.values():
                    data = self.queue.filler(self.now)
                    lead.core.propose(data)
                    self.proposals.add(data)
                    self.result.proposed += 1
                    proposed[data] = at
                    self._log(f"{lead.id} takes {data!r}")
            if all(any(e.data in proposed for e in n.applied) for n in others):
                break
        else:
            self._fail(f"with {old.id} down after healing, the others did not elect and commit")
        old.down_until = self.now

    def _held_on_probation(self) -> set[str]:
        """The members some member holds on probation, or will once it hears from them:
        it records another store of theirs than the one they have, and they vote."""
        members = self._members()
        held = {p for n in members for _, p in n.book.probation}
        for n in members:
            voters = n.core.conf.voters if n.core is not None else frozenset()
            for o in members:
                known = n.book.identities.get(o.id)
                if o is not n and o.id in voters and known not in (None, o.identity):
                    held.add(o.id)
        return held

    def _step(self) -> None:
        self.now += 1
        if self.groups is not None and self.now >= self.heal_at:
            self._log("partition heals")
            self.groups = None
        for n in self.nodes.values():
            if n.core is None and n.joined and self.now >= n.down_until:
                self._start(n)
        self._deliver()
        self._snapshots()
        for n in self._running():
            assert n.core is not None
            n.core.tick()
            self._check_leader(n)
        if not self.healing and self.rng.random() < self.cfg.propose:
            self._propose()
        if not self.healing and self.rng.random() < self.cfg.transfer:
            self._transfer()
        if not self.healing and self.step_down_rng.random() < self.cfg.step_down:
            self._step_down()
        if self.cfg.spares and not self.healing and self.mover_rng.random() < self.cfg.reconfig:
            self._mover()
        for n in self._running():
            self._handle_ready(n, self.healing or self.rng.random() >= self.cfg.persist_lag)
        if self.now % 50 == 0:
            self._check_logs()

    def map_conf(self) -> Conf:
        """The newest committed configuration (what the cluster map says)."""
        return self.confs[max(self.confs)] if self.confs else self.base_conf

    def _members(self) -> list[_Node]:
        """The nodes of the newest committed configuration."""
        members = self.map_conf().members()
        return [n for n in self.nodes.values() if n.joined and n.id in members]

    # -- membership changes -------------------------------------------------------------

    def _mover(self) -> None:
        """One step of the mover (what `zdmq cluster add-node` and its kin run): it
        finds the leader, and proposes the next change of its move once the last one
        is committed; a node whose removal is committed leaves. It may crash at any
        step, forgetting its move; the next one first finishes or undoes what is left."""
        if self.mover_rng.random() < self.cfg.mover_crash:
            if self.move is not None:
                self._log(f"the mover crashes during {self.move}")
                self.result.mover_crashes += 1
            self.move = None
            return
        lead = next(
            (n for n in self._running() if n.core is not None and n.core.role is Role.LEADER),
            None,
        )
        if lead is None or lead.core is None:
            return
        core = lead.core
        conf = self.map_conf()
        if core.conf_index > core.log.committed or core.conf != conf:
            return  # a change is under way, or this leader is behind the map
        adding = self.move[1] if self.move else None
        for n in self.nodes.values():
            if n.joined and n.id not in conf.members() and n.id != adding:
                self._leave(n)
        if self.move is None:
            self.move = self._next_move(conf)
            if self.move is None:
                return
            self._log(f"the mover starts {self.move}")
        _, add, remove = self.move
        change = next_change(conf, add, remove)
        if change is not None and change.kind != "remove" and not self.nodes[change.node].joined:
            # A new member's host starts the group (or starts it again: it left while
            # its addition was uncommitted).
            learners = conf.learners | {change.node}
            start = conf if change.kind == "promote" else Conf(conf.voters, learners)
            self._join(self.nodes[change.node], start)
        if change is None:
            self._log(f"the mover finished {self.move}")
            self.result.moves += 1
            self.move = None
            return
        try:
            index = core.propose_conf(change)
        except (ConfChangeRefused, NotLeader) as e:
            self._log(f"{lead.id} refuses {change}: {e}")
            return
        self._log(f"{lead.id} takes {change} at {index}")
        self._check_leader(lead)

    def _next_move(self, conf: Conf) -> tuple[str, str | None, str | None] | None:
        """A move from `conf`: finish a learner left behind (or drop it), else add,
        remove or replace a member, keeping 3 to `max_voters` voters."""
        rng = self.mover_rng
        if conf.learners:
            learner = min(conf.learners)
            if rng.random() < 0.7:
                return ("finish", learner, None)
            return ("drop", None, learner)
        spares = [i for i in self.ids if i not in conf.members() and not self.nodes[i].joined]
        voters = sorted(conf.voters)
        kinds = []
        if spares and len(voters) < self.cfg.max_voters:
            kinds.append("add")
        if len(voters) > 3:
            kinds.append("remove")
        if spares:
            kinds.append("replace")
        if not kinds:
            return None
        kind = rng.choice(kinds)
        add = rng.choice(spares) if kind in ("add", "replace") else None
        remove = rng.choice(voters) if kind in ("remove", "replace") else None
        return (kind, add, remove)

    def _join(self, n: _Node, conf: Conf) -> None:
        """`n` starts as a new member, with an empty disk (a new store)."""
        n.joined = True
        n.lose_disk = True
        n.state = (0, 0, ())
        n.start_conf = conf
        n.core = None
        n.down_until = self.now
        self._start(n)
        self._log(f"{n.id} joins as a learner")

    def _leave(self, n: _Node) -> None:
        """`n`, removed from the group, stops and drops its disk."""
        self.queue.went_down(n.id, self.now)
        n.core = None
        n.joined = False
        n.writing = None
        n.fetch = None
        n.start_conf = None
        n.recover_to = None
        self._log(f"{n.id} leaves the group")

    def _forget_departed(self, n: _Node, conf: Conf, readded: frozenset[str] = frozenset()) -> None:
        """`n` applied `conf` (committed): the peers it leaves out left the group, and
        their probations there go (`PeerBook.forget`, as the host does); so do those of
        `readded`, peers a snapshot's entries removed and added again."""
        # (A member replaying its log applies old configurations again: a peer the
        # configuration in use names is no departed one.)
        current = n.core.conf.members() if n.core is not None else frozenset()
        for peer in self.ids:
            if (peer not in conf.members() | current or peer in readded) and peer != n.id:
                n.book.forget(GROUP, peer, last=True)  # the one group it shares
        if n.core is not None and self.cfg.identity_rule:
            n.core.probation = n.book.on_probation(GROUP, self.ids)

    def _running(self) -> list[_Node]:
        return [n for n in self.nodes.values() if n.core is not None and self.now >= n.paused_until]

    # -- faults -----------------------------------------------------------------------

    def _faults(self) -> None:
        cfg, rng = self.cfg, self.rng
        for n in self.nodes.values():
            p = cfg.crash + (cfg.crash_leader if n.core and n.core.role is Role.LEADER else 0)
            if n.core is not None and rng.random() < p:
                if n.writing is not None and any(
                    m.type is MsgType.APPEND and m.entries for m in n.writing.messages
                ):
                    self.result.lost_early_writes += 1
                n.core = None
                n.down_until = self.now + rng.randint(*cfg.down_steps)
                self.result.crashes += 1
                self._log(f"{n.id} crashes until {n.down_until}")
                if self.disk_rng.random() < cfg.disk_loss and self._may_lose_disk(n):
                    n.lose_disk = True
                    n.recover_to = max(self.committed, default=0)
                    self.result.disk_losses += 1
                    self._log(f"{n.id} loses its disk (committed so far: {n.recover_to})")
            elif n.core is not None and self.now >= n.paused_until and rng.random() < cfg.pause:
                n.paused_until = self.now + rng.randint(*cfg.pause_steps)
                self._log(f"{n.id} pauses until {n.paused_until}")
        if self.groups is None and rng.random() < cfg.partition:
            cut = rng.randint(1, len(self.ids) - 1)
            side = set(rng.sample(self.ids, cut))
            self.groups = {i: int(i in side) for i in self.ids}
            self.heal_at = self.now + rng.randint(*cfg.partition_steps)
            self.result.partitions += 1
            self._log(f"partition {sorted(side)} until {self.heal_at}")

    def _may_lose_disk(self, n: _Node) -> bool:
        """Whether every other node that lost its disk has recovered: its log reached the
        commit index of its loss, and every other node has seen its new store and lifted
        its probation; and every other node is proven (`RaftCore.proven`: it held its
        leader's own-term commit once), so its log is not empty (two members with no log
        are a first boot) and it knows what it was told is committed."""
        joined = [o for o in self.nodes.values() if o.joined]  # learners may be voters soon
        if any(o is not n and not o.proven for o in joined):
            return False
        if any(o.book.probation for o in joined):
            # A probation not from a lost disk: a member seen rejoining with a new store
            # by a node that had not yet applied its removal.
            return False
        for o in joined:
            if o is n or o.recover_to is None:
                continue
            if o.core is None or o.core.log.committed < o.recover_to:
                return False
            for x in joined:
                if x is not o and (
                    x.book.identities.get(o.id) != o.identity or (GROUP, o.id) in x.book.probation
                ):
                    return False  # x has not seen o's new store yet, or not lifted it
            o.recover_to = None
        return True

    def _heal(self) -> None:
        self._log("faults stop; everything heals")
        self.healing = True
        self.groups = None
        for n in self.nodes.values():
            n.down_until = min(n.down_until, self.now)
            n.paused_until = min(n.paused_until, self.now)

    def _start(self, n: _Node) -> None:
        n.starts += 1
        self.queue.went_down(n.id, self.now)  # its callers never heard (if it was up)
        n.writing = None  # a write in progress when it went down is lost
        lost, n.lose_disk = n.lose_disk, False
        if self.open_disk is not None:
            n.disk = self.open_disk(n.id, lost)
        elif lost:
            n.disk = MemoryStorage()
        if lost or not n.identity:
            n.identity = f"{n.id}.{n.starts}"
            n.book = PeerBook()
            n.proven, n.told = False, (0, 0)
        n.book.departed.clear()  # kept in memory only
        if lost:
            n.state = (0, 0, ())
        n.fetch = None
        index, term, data = n.state
        if index > n.disk.hard_state().commit and not holds_entry(n.disk, index, term):
            # An install crashed after the state, before the log: the log starts after it.
            # (A state ahead of the recorded commit at an entry the log holds was written
            # as it applied, before the commit index: the log stays.)
            n.disk.restore(SnapshotMeta(index, term))
            self._log(f"{n.id} finishes installing the snapshot at {index}")
        rng = random.Random(f"{self.seed}/{n.id}/{n.starts}")
        # The configuration its state holds; with no state, the one it was started with
        # (a new learner) or the newest committed one (the map a host reads).
        conf = conf_at(data, n.start_conf or self.map_conf()) if data else None
        n.core = RaftCore(
            n.id,
            [],
            n.disk,
            rng,
            election_ticks=self.cfg.election_ticks,
            max_entries_per_msg=self.batch,
            store_guard=self.cfg.identity_rule,
            proven=n.proven,
            told=n.told,
            applied=index,
            conf=conf or n.start_conf or self.map_conf(),
        )
        if self.cfg.identity_rule:
            n.core.probation = n.book.on_probation(GROUP, self.ids)
        n.applied = list(data)  # the durable state; the log re-applies what follows
        n.machine = replay(data)
        n.checked = index
        if n.starts > 1:
            self._log(f"{n.id} restarts at term {n.core.term} with {n.disk.last_index()} entries")

    # -- network ----------------------------------------------------------------------

    def _send(self, m: Message, reports: tuple[LiftReport, ...] = ()) -> None:
        self.result.messages += 1
        if not self.healing and self.rng.random() < self.cfg.drop:
            return
        copies = 2 if not self.healing and self.rng.random() < self.cfg.duplicate else 1
        for _ in range(copies):
            self.seq += 1
            at = self.now + self.rng.randint(0, self.cfg.max_delay)
            heapq.heappush(self.net, (at, self.seq, m, self.nodes[m.src].identity, reports))

    def _deliver(self) -> None:
        later: list[tuple[int, int, Message, str, tuple[LiftReport, ...]]] = []
        while self.net and self.net[0][0] <= self.now:
            item = heapq.heappop(self.net)
            m, identity, reports = item[2], item[3], item[4]
            dst = self.nodes[m.dst]
            if dst.core is None:
                continue
            if self.groups is not None and self.groups[m.src] != self.groups[m.dst]:
                continue
            if self.now < dst.paused_until:
                later.append((dst.paused_until, item[1], m, identity, reports))
                continue
            self._identity_rule(dst, m, identity)
            dst.core.step(m)
            self._check_leader(dst)
            for r in reports:
                self._take_report(dst, r)
        for item in later:
            heapq.heappush(self.net, item)

    def _see(self, n: _Node, peer: str, identity: str) -> None:
        """`RaftHost._seen`: a payload (or report) naming `peer`'s store `identity`."""
        core = n.core
        assert core is not None
        known = n.book.identities.get(peer)
        # Probation discounts votes and acknowledgements: a learner has none to discount
        # (and is promoted only once caught up again, from the progress forgotten here).
        voter = peer in core.conf.voters
        voting = {GROUP: core.log.committed} if voter else {}
        learning = [GROUP] if peer in core.conf.learners else []
        replaced = n.book.see(peer, identity, voting, learning)
        if known is not None:
            core.forget_progress(peer)
            self._log(f"{n.id} sees {peer} replaced ({identity})")
        if replaced and not self.cfg.identity_rule:
            n.book.lift(GROUP, peer)
        elif replaced or learning:
            # (A learner seen again with another store is cleared: a probation it was
            # on since it voted, before it was removed and added again, goes too.)
            core.probation = n.book.on_probation(GROUP, self.ids)

    def _reports_for(self, n: _Node, dst: str) -> tuple[LiftReport, ...]:
        """`RaftHost._reports_for` (without its time bound): as leader, a report on every
        other member whose store `n` cleared (`PeerBook.reportable`)."""
        core = n.core
        assert core is not None
        if core.role is not Role.LEADER or not n.book.cleared:
            return ()
        out = []
        for peer in self.ids:
            ident = n.book.reportable(GROUP, peer) if peer not in (dst, n.id) else None
            pr = core.progress.get(peer)
            if ident is not None and pr is not None:
                out.append(LiftReport(n.id, GROUP, peer, ident, pr.match, core.term))
        return tuple(out)

    def _take_report(self, n: _Node, r: LiftReport) -> None:
        """`RaftHost._take_report`."""
        core = n.core
        assert core is not None
        if not report_current(r, term=core.term, leader=core.leader, probation=core.probation):
            return
        if n.book.identities.get(r.peer) != r.identity:
            self._see(n, r.peer, r.identity)
        if n.book.lift_reported(r):
            core.probation = n.book.on_probation(GROUP, self.ids)
            self._log(f"{n.id} lifts the probation of {r.peer} on {r.src}'s report")

    def _identity_rule(self, n: _Node, m: Message, identity: str) -> None:
        """What `RaftHost` does with a message's sender identity before stepping it.

        Without the identity rule, a leader still starts over with a replaced follower
        (`forget_progress`: the mechanics of catching a new disk up), but nobody is put
        on probation."""
        core = n.core
        assert core is not None
        if n.book.identities.get(m.src) != identity:
            self._see(n, m.src, identity)
        if not self.cfg.identity_rule:
            return
        if m.src not in core.probation or m.type is not MsgType.APPEND_RESP or m.reject:
            return
        since = n.book.since(GROUP, m.src)
        assert since is not None
        if core.judge_probation_ack(since, m) == "lift":
            n.book.lift(GROUP, m.src)
            core.probation = n.book.on_probation(GROUP, self.ids)
            self._log(f"{n.id} lifts the probation of {m.src} at commit {core.log.committed}")

    # -- clients ----------------------------------------------------------------------

    def _propose(self) -> None:
        running = self._running()
        if not running:
            return
        n = self.rng.choice(running)
        call, data = self.queue.command(self.now, n.machine)
        for _ in range(2):
            core = n.core
            assert core is not None
            try:
                index = core.propose(data)
            except NotLeader as e:
                hint = self.nodes.get(e.leader) if e.leader else None
                if hint is None or hint not in running:
                    break
                n = hint
                continue
            self.result.proposed += 1
            self.proposals.add(data)
            self.queue.proposed(call, n.id, index, core.term)
            self._log(f"{n.id} takes {data!r} at {index}")
            return
        self.queue.refused(call, self.now)

    def _leaders(self) -> list[_Node]:
        return [n for n in self._running() if n.core and n.core.role is Role.LEADER]

    def _step_down(self) -> None:
        leaders = self._leaders()
        if leaders:
            n = self.step_down_rng.choice(leaders)
            assert n.core is not None
            self._log(f"{n.id} steps down")
            n.core.step_down()
            self._check_leader(n)
            self.result.step_downs += 1

    def _transfer(self) -> None:
        leaders = self._leaders()
        if leaders:
            core = leaders[0].core
            assert core is not None
            to = self.rng.choice(sorted(core.conf.voters))
            self._log(f"{core.id} hands leadership to {to}")
            core.transfer_leadership(to)
            self._check_leader(leaders[0])
            self.result.transfers += 1

    # -- the driver -------------------------------------------------------------------

    def _handle_ready(self, n: _Node, write: bool) -> None:
        """Takes the node's `Ready` if no write is in progress (sending what may go
        before the write, applying what is committed), and, if `write`, writes the one
        in progress and finishes it."""
        core = n.core
        assert core is not None
        if n.writing is None:
            if not core.has_ready():
                return
            rd = n.writing = core.ready()
            for m in rd.messages:
                if m.type in SENT_BEFORE_PERSIST:
                    self._send(m, self._reports_for(n, m.dst) if self.cfg.identity_rule else ())
            for e in rd.committed:  # persisted and committed: applied before the write
                if e.index != len(n.applied) + 1:
                    self._fail(f"{n.id} applies index {e.index} after {len(n.applied)}")
                self._check_committed(n, e, "applies")
                n.applied.append(e)
                result = None
                if is_command(e):
                    assert e.data is not None
                    result = apply_command(n.machine, decode_command(e.data))
                elif (conf := Conf.decode(e.data)) is not None:
                    self._forget_departed(n, conf)
                self.queue.applied(n.id, e, result, self.now)
            if rd.committed and self.state_rng.random() < self.cfg.state_writes:
                # The state machine's own file has what it applied, while the commit index
                # waits for the Ready's write (which a crash may lose): a member's group
                # state and its lazily written commit index.
                n.state = (len(n.applied), n.applied[-1].term, tuple(n.applied))
                if e.data is not None and e.data in self.proposals:
                    self.acked.add(e.data)
        if not write:
            return
        rd, n.writing = n.writing, None
        if rd.hard_state is not None:
            old = n.disk.hard_state()
            new = rd.hard_state
            if new.term < old.term:
                self._fail(f"{n.id} persists term {new.term} after {old.term}")
            if new.term == old.term and old.vote is not None and new.vote != old.vote:
                self._fail(f"{n.id} changes its vote in term {new.term}: {old.vote} -> {new.vote}")
            if new.commit < old.commit:
                self._fail(f"{n.id} persists commit {new.commit} after {old.commit}")
        n.disk.persist(rd)
        for m in rd.messages:
            if m.type not in SENT_BEFORE_PERSIST:
                self._send(m, self._reports_for(n, m.dst) if self.cfg.identity_rule else ())
        core.advance(rd)
        n.proven, n.told = core.proven, core.told  # persisted with the Ready
        log = core.log
        if log.committed > n.checked:
            for e in log.slice(n.checked + 1, log.committed + 1):
                self._check_committed(n, e, "commits")
            n.checked = log.committed
        if rd.committed:
            self._maybe_compact(n)

    def _maybe_compact(self, n: _Node) -> None:
        """Checkpoints the state machine and compacts the log, every `compact_every`
        applied entries, keeping `keep` entries behind the applied index."""
        every = self.compact_every
        snap = n.disk.snapshot().index
        applied = len(n.applied)
        if not every or applied - snap < every + self.keep:
            return
        n.state = (applied, n.applied[-1].term, tuple(n.applied))  # durable at `applied`
        upto = applied - self.keep
        if upto > snap:
            n.disk.compact(upto)
            self.result.compactions += 1
            self._log(f"{n.id} compacts its log up to {upto}")

    def _snapshots(self) -> None:
        """Takes the leaders' snapshot requests, and installs the snapshots that arrive."""
        for n in self._running():
            core = n.core
            assert core is not None
            req = core.take_snapshot_request()
            if req is not None and n.fetch is None:
                n.fetch = (self.now + self.snap_rng.randint(*self.cfg.fetch_steps), req.src)
                self._log(f"{n.id} pulls a snapshot from {req.src} (its log starts at {req.index})")
        for n in self._running():
            # Installed between rounds, as RaftHost does: not while a Ready is taken
            # and its write is in progress.
            if n.fetch is not None and n.fetch[0] <= self.now and n.writing is None:
                src = self.nodes[n.fetch[1]]
                n.fetch = None
                self._install(n, src)

    def _install(self, n: _Node, src: _Node) -> None:
        """`n` gets `src`'s applied state, if `src` is up and reachable: what
        `Member.install_snapshot` and the host's install do, with a crash in between."""
        cut = self.groups is not None and self.groups[n.id] != self.groups[src.id]
        if src.core is None or self.now < src.paused_until or cut or not src.applied:
            self._log(f"{n.id} fails to pull a snapshot from {src.id}")
            return
        data = tuple(src.applied)
        index, term = len(data), data[-1].term
        core = n.core
        assert core is not None
        before = core.committed_conf
        if not core.restore(index, term, src.id, conf=conf_at(data, self.base_conf)):
            self._log(f"{n.id} has no use for {src.id}'s snapshot at {index}")
            self._check_leader(n)
            return
        if data[: len(n.applied)] != tuple(n.applied):
            self._fail(f"{n.id} installs a snapshot at {index} unlike what it applied")
        for e in data:
            self._check_committed(n, e, "installs")
        n.state = (index, term, data)  # 1. the state, made durable
        if self.snap_rng.random() < self.cfg.install_crash:
            n.core = None
            n.down_until = self.now + self.snap_rng.randint(*self.cfg.down_steps)
            self.result.crashes += 1
            self.result.install_crashes += 1
            self._log(f"{n.id} crashes installing the snapshot at {index}")
            return
        n.disk.restore(SnapshotMeta(index, term))  # 2. the log starts after it
        # A voter of the committed configuration that the snapshot's names a learner was
        # removed and added again by the entries the snapshot skipped (identity.readded).
        self._forget_departed(n, core.conf, readded(before, core.conf))
        n.applied = list(data)
        n.machine = replay(data)
        n.checked = max(n.checked, index)
        self.result.snapshots_installed += 1
        self._log(f"{n.id} installs {src.id}'s snapshot at {index} (term {term})")

    # -- invariants -------------------------------------------------------------------

    def _check_leader(self, n: _Node) -> None:
        core = n.core
        assert core is not None
        if core.role is Role.LEADER:
            first = self.leaders.setdefault(core.term, n.id)
            if first != n.id:
                self._fail(f"two leaders in term {core.term}: {first} and {n.id}")
            if first == n.id and len(self.leaders) > self.result.leaders:
                self.result.leaders = len(self.leaders)

    def _check_committed(self, n: _Node, e: Entry, doing: str) -> None:
        known = self.committed.get(e.index)
        if known is None:
            self.committed[e.index] = (e.term, e.data)
            conf = Conf.decode(e.data)
            if conf is not None:
                self.confs[e.index] = conf
                self.result.conf_changes += 1
        elif known is not None and known != (e.term, e.data):
            self._fail(
                f"{n.id} {doing} {e.index}=(term {e.term}, {e.data!r}) over the committed "
                f"(term {known[0]}, {known[1]!r})"
            )

    def _check_logs(self) -> None:
        for n in self.nodes.values():
            if n.core is None:
                continue
            log = n.core.log
            for e in log.slice(log.snapshot().index + 1, log.committed + 1):
                known = self.committed.get(e.index)
                if known is not None and known != (e.term, e.data):
                    self._fail(f"{n.id} holds {e} committed, not the committed {known}")

    def _converged(self) -> bool:
        leaders = [n for n in self.nodes.values() if n.core and n.core.role is Role.LEADER]
        if len(leaders) != 1:
            return False
        lead = leaders[0].core
        assert lead is not None
        last = lead.log.last_index()
        if lead.log.committed != last:
            return False
        return all(len(n.applied) == last for n in self._members())

    def _check_final(self) -> None:
        members = self._members()
        first = members[0].applied
        for n in members:
            if n.applied != first:
                self._fail(f"{n.id} applied another sequence than {members[0].id}")
        for n in self.nodes.values():  # those that left: a prefix of it
            if n.applied != first[: len(n.applied)]:
                self._fail(f"{n.id}, no longer a member, applied another sequence")
        datas = [e.data for e in first if is_command(e)]
        if len(datas) != len(set(datas)):
            self._fail("an entry was applied twice")
        missing = self.acked - set(datas)
        if missing:
            self._fail(f"acknowledged entries not applied everywhere: {sorted(missing)[:5]}")
        problems = self.queue.check(first, {n.id: n.machine for n in members})
        if problems:
            self._fail(f"the queue's clients were misled: {'; '.join(problems[:5])}")

    # -- reporting --------------------------------------------------------------------

    def _log(self, what: str) -> None:
        if self.trace is not None:
            self.trace(f"[{self.now:5}] {what}")

    def _fail(self, what: str) -> None:
        raise SimFailure(
            f"seed {self.seed}, step {self.now}: {what}\n  replay: "
            f"{replay_command(self.seed, self.asked)} --trace"
        )


def replay_command(seed: int, cfg: SimConfig) -> str:
    cmd = f"python -m zdmq.raft.sim --seed {seed} --steps {cfg.steps} --nodes {cfg.nodes}"
    if cfg.spares:
        cmd += f" --spares {cfg.spares}"
    if cfg.disk_loss != DISK_LOSS:
        cmd += f" --disk-loss {cfg.disk_loss}"
    if cfg.compact_every == (0,):
        cmd += " --no-compaction"
    if cfg.state_writes == 0:
        cmd += " --no-state-writes"
    return cmd if cfg.identity_rule else cmd + " --no-identity-rule"


def run(
    seed: int,
    cfg: SimConfig | None = None,
    trace: Callable[[str], None] | None = None,
    open_disk: DiskOpener | None = None,
) -> SimResult:
    """Simulate one group from `seed`; raises `SimFailure` if an invariant breaks.

    `open_disk` gives each node its disk at every start (default: one `MemoryStorage`
    per node, kept across restarts, and a new one when the disk is lost)."""
    return _Sim(seed, cfg or SimConfig(), trace, open_disk).run()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zdmq.raft.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    ap.add_argument("--steps", type=int, default=SimConfig().steps)
    ap.add_argument("--nodes", type=int, default=SimConfig().nodes)
    ap.add_argument(
        "--spares",
        type=int,
        default=0,
        help="nodes that membership changes may add (0: the members never change)",
    )
    ap.add_argument("--trace", action="store_true", help="print every fault and proposal")
    ap.add_argument(
        "--no-identity-rule",
        dest="identity_rule",
        action="store_false",
        help="drivers ignore store identities (shows what a lost disk does without the rule)",
    )
    ap.add_argument(
        "--disk-loss",
        type=float,
        default=DISK_LOSS,
        help="the chance a crash also loses the disk (the most a seed draws)",
    )
    ap.add_argument(
        "--no-compaction",
        dest="compaction",
        action="store_false",
        help="nodes never compact their logs (so no snapshots either)",
    )
    ap.add_argument(
        "--no-state-writes",
        dest="state_writes",
        action="store_false",
        help="a node's state machine is durable only at its checkpoints, never ahead of "
        "the commit index its log records",
    )
    args = ap.parse_args(argv)
    cfg = SimConfig(
        nodes=args.nodes,
        steps=args.steps,
        spares=args.spares,
        identity_rule=args.identity_rule,
        disk_loss=args.disk_loss,
    )
    if not args.compaction:
        cfg = replace(cfg, compact_every=(0,))
    if not args.state_writes:
        cfg = replace(cfg, state_writes=0.0)
    for seed in range(args.seed, args.seed + args.seeds):
        try:
            r = run(seed, cfg, print if args.trace else None)
        except SimFailure as e:
            print(f"FAIL {e}")
            return 1
        print(
            f"seed {seed}: ok, {r.leaders} terms with a leader, {r.crashes} crashes "
            f"({r.disk_losses} with a lost disk), "
            f"{r.partitions} partitions, {r.acked}/{r.proposed} proposals acknowledged, "
            f"{r.applied} entries applied, {r.messages} messages, "
            f"{r.compactions} compactions, {r.snapshots_installed} snapshots installed "
            f"({r.install_crashes} crashes installing), "
            f"{r.conf_changes} membership changes ({r.moves} moves finished, "
            f"{r.mover_crashes} mover crashes), "
            f"converged {r.steps_to_converge} steps after healing; queue calls "
            f"{r.queue.ok} ok, {r.queue.failed} failed, {r.queue.unknown} unknown: "
            f"{r.queue.pushed} pushed, {r.queue.delivered} delivered, {r.queue.acked} acked, "
            f"{r.queue.cancelled} cancelled, {r.queue.dead_lettered} dead-lettered"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
