"""A node's replica groups: one Raft group per ring window, one `Node` per group.

With `replication: R` above 1 on N nodes there are N groups, one per node id: group `g`
holds the partitions whose replica set starts at node `g` (the ring window g, g+1, ...,
g+R-1 of `cluster.yaml`'s order), so a message, a UUID queue or a metadata list that
the placement puts on node `g` is kept by group `g` on R nodes. Each node is a member of
R groups, and hosts for each of them a `Node` whose id is the group id: the protocol of
node.py (UUID queues, metadata lists, routing) runs unchanged with groups where it had
nodes. The group's preferred leader is node `g` itself, so in steady state every group
is led by the node the placement names and a push is still one call, zero hops.

A group's `Node` changes its state only through commands (machine.py); `execute`
proposes the command to the group's log and returns its result once it is committed
(on a majority of the group, fsynced) and applied here. Every member applies every
committed command to its own copy of the group's state (`group-<g>.sqlite3`, no fsync:
the log is what is durable; the file records the log index it reflects, so a restart
applies only what follows). Only the leader serves: a call a member gets for a group it
does not lead is answered 421 `not_leader`, naming the leader it knows.

`Member` is the process side: it opens the groups' states and the Raft log
(`raft.sqlite3`), runs the Raft host over HTTP, applies committed entries, and finds the
leader of a group for calls to other nodes (the members' own knowledge, else the hint
of a 421, else the group's members in turn).

Compaction and snapshots (zdmq/raft/driver.py runs them; this is the state's side).
`checkpoint` makes a group's state file durable (commit, then a WAL checkpoint with its
syncs), so the host may compact the log up to the index it holds. `snapshot_chunk`
serves a group's state to a member that needs it: a copy made with `VACUUM INTO`
(`snapshots/serve-<g>-<index>-<term>.sqlite3`, one per group, made again once the log
no longer holds every entry after it), in chunks of
`SNAPSHOT_CHUNK` bytes, over `GET /v1/internal/snapshots/<g>?offset=&index=` (signed
like every node call). `pull` fetches it chunk by chunk into
`snapshots/incoming-<g>.sqlite3`, syncs it and checks it (SQLite's quick_check, and the
index it holds); `install` closes the group's state, replaces its file by the pulled one
(rename, directory synced) and reloads the group's `Node` from it. The host then resets
the group's log after the snapshot's index; if the node crashed between the two, the
state file is ahead of the log's commit index at the next start, and `start` resets the
log there before the host runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zdmq import _http
from zdmq.backup import check_state_copy, read_chunk, state_conf, sync_dir
from zdmq.cluster_map import ClusterMap
from zdmq.config import ClusterConfig
from zdmq.errors import (
    BadRequest,
    MapConflict,
    NodeUnavailable,
    NotLeader,
    RouteNotFound,
    StorageFailed,
    ZdmqError,
)
from zdmq.raft.core import Conf, ConfChange, ConfChangeRefused
from zdmq.raft.core import NotCommitted as RaftNotCommitted
from zdmq.raft.core import NotLeader as RaftNotLeader
from zdmq.raft.driver import PulledSnapshot, RaftHost, http_sender
from zdmq.raft.sqlite_storage import RaftLogStore
from zdmq.raft.storage import Entry, SnapshotMeta, holds_entry
from zdmq.routing import GROUP_HEADER, GroupRouter
from zdmq.server.machine import Command, apply_command, decode_command, encode_command
from zdmq.server.storage import open_storage
from zdmq.server.topology import MAP_PREFIX, MapEntry, Topology, map_of_view

if TYPE_CHECKING:
    from zdmq.server.node import Node

__all__ = ["Member"]

log = logging.getLogger("zdmq.replicas")

# Raft's clock: a tick every TICK_S; a follower campaigns after 1 to 2 election timeouts
# (ELECTION_TICKS ticks) without hearing from a leader.
TICK_S = 0.1
ELECTION_TICKS = 10
# How long a call waits for its group to elect a leader before it is answered 421.
LEADER_WAIT_S = 3.0
# A leader not heard from for this many ticks (5 heartbeats) is not sent calls to.
LIVE_TICKS = ELECTION_TICKS // 2
# A member whose Raft payload went unanswered this long is called last (routing.py).
SILENT_S = LIVE_TICKS * TICK_S
# Raft messages to one peer travel in payloads of up to this many bytes (past the first).
PAYLOAD_BYTES = 4 << 20
_INDEX_TERM = re.compile(r"([0-9]+)-([0-9]+)")
# A snapshot travels in chunks of this many bytes (one call each: bounded memory).
SNAPSHOT_CHUNK = 4 << 20
#: The route a member pulls another's snapshot of a group from (+ the group id).
SNAPSHOT_PATH = "/v1/internal/snapshots/"
SNAPSHOT_INDEX_HEADER = "zdmq-snapshot-index"
SNAPSHOT_TERM_HEADER = "zdmq-snapshot-term"
SNAPSHOT_SIZE_HEADER = "zdmq-snapshot-size"


class SnapshotChunk:
    """A piece of a group's snapshot file: `data` from `offset`, of a file of `size`
    bytes holding the log up to `index` (of `term`)."""

    __slots__ = ("data", "index", "offset", "size", "term")

    def __init__(self, index: int, term: int, size: int, offset: int, data: bytes) -> None:
        self.index, self.term, self.size, self.offset, self.data = index, term, size, offset, data


def voters_in_order(conf: Conf, order: Sequence[str]) -> tuple[str, ...]:
    """A group's voters as callers try them: in the map's `order` (its preferred leader
    first), then any the map does not name yet, sorted."""
    known = tuple(n for n in order if n in conf.voters)
    return known + tuple(sorted(conf.voters - set(known)))


def held_groups(data_dir: Path) -> list[str]:
    """The groups whose state files a node's data directory holds."""
    if not data_dir.is_dir():
        return []
    names = (p.name for p in data_dir.glob("group-*.sqlite3"))
    return sorted(n[len("group-") : -len(".sqlite3")] for n in names)


class Member:
    """The replica groups one node process takes part in."""

    def __init__(
        self,
        config: ClusterConfig,
        node_id: str,
        secret: bytes,
        topology: Topology | None = None,
    ) -> None:
        from zdmq.server.node import Node, node_pool  # node.py imports this module

        self.config = config
        self.id = node_id
        self.secret = secret
        self.started_at = time.time()
        if topology is None:
            topology = Topology(config, config.node_data_dir(node_id))
        self.topology = topology
        cmap = topology.map
        # Every group's members as callers try them: the map's, and for the groups this
        # member is in, those of the configuration it applied.
        self.members: dict[str, tuple[str, ...]] = {
            g: cmap.members(g) + cmap.learners(g) for g in cmap.groups
        }
        self.preferred = {g: cmap.preferred_leader(g) for g in cmap.groups}
        data_dir = config.node_data_dir(node_id)
        # The groups it keeps: those its data directory holds state of (it joined and
        # left groups as replicas moved), or on a new store those the map gives it.
        held = held_groups(data_dir) if config.durability != "memory" else []
        self.groups = held or [g for g, ms in self.members.items() if node_id in ms]
        self.urls = topology.urls
        self.data_dir = data_dir
        self.snap_dir = data_dir / "snapshots"
        self.nodes: dict[str, Node] = {
            g: Node(
                config,
                g,
                open_storage(config.durability, data_dir, group=g),
                secret=secret,
                member=self,
                topology=topology,
            )
            for g in self.groups
        }
        self.pool = node_pool(config, secret, node_id)
        self._raft_pool = node_pool(config, secret, node_id, timeout_s=1.0, limit_per_host=4)
        # Calls to other groups find their leaders: this member's own knowledge of the
        # groups it is in, 421 hints for the others.
        self.router = GroupRouter(self.members, self.live_leader, self.silent, self.urls)
        self._fetching: asyncio.Future[None] | None = None
        #: Starts the tasks of a group's Node as it serves here (the app's: monitor and
        #: repair loops, metrics); they are cancelled when the member leaves the group.
        self.on_node: Callable[[Node], list[asyncio.Task[None]]] | None = None
        #: Per group: (bytes of the last snapshot pulled so far, its size) while a
        #: replica moves here, for the mover's progress.
        self.pulled: dict[str, tuple[int, int]] = {}
        self._node_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self.store: RaftLogStore | None = None
        self.raft: RaftHost | None = None
        #: Per group: snapshots of its state this member began to send (for metrics).
        self.snapshots_sent: dict[str, int] = dict.fromkeys(self.groups, 0)
        # A payload of Raft messages: its first entry may hold a whole request (and its
        # encoding's overhead), the rest up to PAYLOAD_BYTES.
        self.max_payload_bytes = 2 * config.limits.max_request_bytes + PAYLOAD_BYTES

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        for node in self.nodes.values():
            await node.start()
        data_dir = self.config.node_data_dir(self.id)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.store = await asyncio.to_thread(
            RaftLogStore, data_dir / "raft.sqlite3", durability=self.config.durability
        )
        self._finish_installs()
        if self.snap_dir.exists():  # copies served and pulls cut short by the last stop
            for f in self.snap_dir.iterdir():
                f.unlink(missing_ok=True)
        applied = {g: node.storage.applied for g, node in self.nodes.items()}
        confs = {g: c for g, node in self.nodes.items() if (c := node.storage.conf) is not None}
        for g, conf in confs.items():
            self.members[g] = self._in_order(g, conf)
        home = self.nodes.get(self.topology.home)
        if home is not None and home.storage.map_json is not None:
            self.topology.adopt(ClusterMap.from_dict(json.loads(home.storage.map_json)))
        self.topology.on_change(self._new_map)
        self.raft = RaftHost(
            self.id,
            {g: self.members[g] for g in self.groups},
            self.store,
            http_sender(self._raft_pool, self.urls),
            self._apply,
            applied,
            tick_s=TICK_S,
            election_ticks=ELECTION_TICKS,
            max_payload_bytes=PAYLOAD_BYTES,
            max_queued_bytes=2 * self.max_payload_bytes,
            rng=random.Random(),
            snapshots=self if self.config.durability != "memory" else None,
            compact_entries=self.config.replication_log_entries,
            compact_bytes=self.config.replication_log_bytes,
            confs=confs,
            preferred=self.preferred,
        )
        self.raft.start()

    def start_node_tasks(self) -> None:
        """Starts the tasks of every group's Node (once started)."""
        for g, node in self.nodes.items():
            self._start_tasks(g, node)

    def _start_tasks(self, group: str, node: Node) -> None:
        if self.on_node is not None and group not in self._node_tasks:
            self._node_tasks[group] = self.on_node(node)

    async def _stop_tasks(self, group: str) -> None:
        for task in self._node_tasks.pop(group, []):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop(self) -> None:
        for group in list(self._node_tasks):
            await self._stop_tasks(group)
        if self.raft is not None:
            await self.raft.stop()
        for node in self.nodes.values():
            await node.stop()
        await self.pool.close()
        await self._raft_pool.close()
        if self.store is not None:
            self.store.close()

    # ---- the log -----------------------------------------------------------------------
    def _apply(self, group: str, entry: Entry) -> Any:
        """A committed entry of `group`, applied to this member's copy of its state (none
        once this member has left the group: the host drops it at its next round)."""
        node = self.nodes.get(group)
        if node is None:
            return None
        result = None
        data = entry.data
        if data is not None:
            conf = Conf.decode(data)
            if conf is not None:
                node.storage.note_conf(conf)
                self.members[group] = self._in_order(group, conf)
            elif data.startswith(MAP_PREFIX):
                result = self._apply_map(node, data)
            else:
                result = apply_command(node.state, decode_command(data))
        node.storage.note_applied(entry.index, node.state.clock, entry.term)
        return result

    def _apply_map(self, node: Node, data: bytes) -> Any:
        """A map entry of the home group: taken if it was made from the map the group
        holds (compare-and-set on the epoch), else a MapConflict result."""
        entry = MapEntry.decode(data)
        assert entry is not None
        held = node.storage.map_json
        epoch = json.loads(held)["epoch"] if held is not None else 1
        if entry.expect != epoch:
            return MapConflict(
                f"the cluster map changed meanwhile (epoch {epoch}, the change was made from "
                f"{entry.expect}): read it again and retry"
            )
        node.storage.note_map(json.dumps(entry.new.to_dict(), separators=(",", ":")))
        self.topology.adopt(entry.new)
        return entry.new

    def _in_order(self, group: str, conf: Conf) -> tuple[str, ...]:
        """`group`'s members as callers try them: voters in the map's order, then learners."""
        order = self.topology.map.members(group)
        return voters_in_order(conf, order) + tuple(sorted(conf.learners))

    def _new_map(self, m: ClusterMap) -> None:
        """A newer map: the members of the groups this member is not in, and every
        group's preferred leader, follow it (the groups it is in follow their logs)."""
        for g in m.groups:
            if g not in self.nodes:
                self.members[g] = m.members(g) + m.learners(g)
            self.preferred[g] = m.preferred_leader(g)
            if self.raft is not None and g in self.nodes:
                self.raft.set_preferred(g, m.preferred_leader(g))
        self.router.nodes = frozenset(self.urls)

    async def propose_map(self, expect: int, new: ClusterMap) -> ClusterMap:
        """As the home group's leader, commits `new` (made from the map of epoch
        `expect`); MapConflict if the map changed meanwhile."""
        host = self.raft
        home = self.topology.home
        if host is None:
            raise NodeUnavailable(f"{self.id}: replication is not running")
        self._serving(home)
        try:
            result = await host.propose(home, MapEntry(expect, new).encode())
        except (RaftNotLeader, RaftNotCommitted) as e:
            raise self.not_leader(home, e.leader) from None
        if isinstance(result, ZdmqError):
            raise result
        assert isinstance(result, ClusterMap)
        return result

    # ---- compaction and snapshots (the driver's SnapshotHooks) --------------------------
    def _finish_installs(self) -> None:
        """A group state ahead of its log's commit index, at an entry its log does not
        hold, is a snapshot installed by a process that stopped before it reset the log,
        or a state restored from a backup under a new log: the log starts after it. A
        state ahead of the commit index at an entry the log holds is the common case: the
        host applies entries once committed and persisted, and writes the commit index
        with its next write, so a kill in between leaves the log as it is (the host takes
        the state's index as committed). A state behind the log's compacted prefix
        cannot be rebuilt: StorageFailed."""
        assert self.store is not None
        for g, node in self.nodes.items():
            glog = self.store.group(g)
            applied = node.storage.applied
            if applied > glog.hard_state().commit and not holds_entry(
                glog, applied, node.storage.applied_term
            ):
                log.warning(
                    "%s: group %s's state holds index %d, its log is committed to %d: "
                    "the log now starts after the state (an install cut short)",
                    self.id,
                    g,
                    applied,
                    glog.hard_state().commit,
                )
                glog.restore(SnapshotMeta(applied, node.storage.applied_term))
                hard = glog.hard_state()
                if hard.term < node.storage.applied_term:
                    # A new log under a restored state (zdmq/backup.py): its terms start
                    # at the state's, so no later entry has a lower term than the one
                    # before it.
                    glog.set_hard_state(hard._replace(term=node.storage.applied_term, vote=None))
            elif applied < glog.snapshot().index:
                raise StorageFailed(
                    f"group {g}'s state holds index {applied}, but its log starts after "
                    f"{glog.snapshot().index}: the state file was lost or rolled back and "
                    "cannot be rebuilt from the log; move the node's data directory away and "
                    "start it again, to rejoin as a new store"
                )

    def checkpoint(self, group: str) -> int:
        node = self.nodes.get(group)
        return node.storage.checkpoint() if node is not None else 0

    async def snapshot_chunk(self, group: str, offset: int, index: int) -> SnapshotChunk:
        """`SNAPSHOT_CHUNK` bytes from `offset` of this member's snapshot of `group` at
        `index` (0: a new one, made from its state now). RouteNotFound for a group this
        member is not in, or a snapshot it no longer keeps (a newer one replaced it)."""
        node = self.nodes.get(group)
        if node is None:
            raise RouteNotFound(f"{self.id} is not a member of group {group[:100]!r}")
        self.snap_dir.mkdir(parents=True, exist_ok=True)
        if index == 0:
            # The copy kept serves while the log still holds every entry after it (a
            # member that installs it catches up from the log): members catching up at
            # once share one copy instead of replacing each other's.
            start = self.raft.log_bounds(group)[0] if self.raft is not None else 0
            kept = self._served(group)
            usable = [k for k in kept if k[0] >= start]
            if usable:
                index, term, path = max(usable)
            else:
                tmp = self.snap_dir / f"copy-{group}.sqlite3"
                index, term = node.storage.copy_to(tmp)
                path = self.snap_dir / f"serve-{group}-{index}-{term}.sqlite3"
                os.replace(tmp, path)
            for _, _, old in kept:
                if old != path:
                    old.unlink(missing_ok=True)
            self.snapshots_sent[group] += 1
            log.info(
                "%s sends its snapshot of group %s at %d",
                self.id,
                group,
                index,
                extra={"event": "snapshot_sent", "group": group, "index": index},
            )
        else:
            found = [(t, p) for i, t, p in self._served(group) if i == index]
            if not found:
                raise RouteNotFound(f"{self.id} keeps no snapshot of group {group} at {index}")
            term, path = found[0]

        size, data = await asyncio.to_thread(read_chunk, path, offset, SNAPSHOT_CHUNK)
        if offset > size:
            raise BadRequest(f"offset {offset} is past the snapshot's {size} bytes")
        return SnapshotChunk(index, term, size, offset, data)

    def _served(self, group: str) -> list[tuple[int, int, Path]]:
        """(index, term, path) of the copies of `group`'s state kept to serve."""
        out = []
        prefix = f"serve-{group}-"
        for p in self.snap_dir.glob("serve-*.sqlite3"):
            if p.stem.startswith(prefix):
                m = _INDEX_TERM.fullmatch(p.stem[len(prefix) :])
                if m is not None:
                    out.append((int(m[1]), int(m[2]), p))
        return out

    async def pull(self, group: str, src: str) -> PulledSnapshot:
        """`src`'s snapshot of `group`, chunk by chunk into a local file, synced and checked."""
        self.snap_dir.mkdir(parents=True, exist_ok=True)
        path = self.snap_dir / f"incoming-{group}.sqlite3"
        url = self.urls[src] + SNAPSHOT_PATH + group
        index = term = size = 0
        rate = self.config.move_bytes_per_s
        started = time.monotonic()
        try:
            with path.open("wb") as f:
                while True:
                    if rate and f.tell():  # the throttle: at most `rate` bytes a second
                        ahead = f.tell() / rate - (time.monotonic() - started)
                        if ahead > 0:
                            await asyncio.sleep(ahead)
                    reply = await _http.call(
                        self.pool, "GET", url, params={"offset": f.tell(), "index": index}
                    )
                    h = reply.headers
                    index = int(h.get(SNAPSHOT_INDEX_HEADER) or 0)
                    term = int(h.get(SNAPSHOT_TERM_HEADER) or 0)
                    size = int(h.get(SNAPSHOT_SIZE_HEADER) or 0)
                    if not index or not term or (not reply.body and f.tell() < size):
                        raise NodeUnavailable(f"{src} sent an empty piece of its snapshot")
                    await asyncio.to_thread(f.write, reply.body)
                    self.pulled[group] = (f.tell(), size)
                    if f.tell() >= size:
                        break
                await asyncio.to_thread(os.fsync, f.fileno())
            held = await asyncio.to_thread(
                check_state_copy, path, "the snapshot pulled", "a group state"
            )
            if held != (index, term):
                raise NodeUnavailable(f"{src}'s snapshot holds {held}, not {(index, term)}")
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        conf = await asyncio.to_thread(state_conf, path)
        return PulledSnapshot(group, src, index, term, path, conf)

    async def install(self, snap: PulledSnapshot) -> None:
        node = self.nodes.get(snap.group)
        if node is None:  # left the group meanwhile
            self.discard(snap)
            return
        target = self.data_dir / f"group-{snap.group}.sqlite3"
        await node.storage.close()  # commits, checkpoints and removes its WAL
        for suffix in ("-wal", "-shm", "-journal"):
            target.with_name(target.name + suffix).unlink(missing_ok=True)
        os.replace(snap.path, target)
        sync_dir(self.data_dir)
        storage = open_storage(self.config.durability, self.data_dir, group=snap.group)
        storage.on_commit = node.storage.on_commit
        node.state = await asyncio.to_thread(storage.load)
        node.storage = storage
        if storage.applied != snap.index:
            raise RuntimeError(f"installed {target} holds {storage.applied}, not {snap.index}")
        if storage.map_json is not None:  # the home group's: the map it holds
            self.topology.adopt(ClusterMap.from_dict(json.loads(storage.map_json)))

    def discard(self, snap: PulledSnapshot) -> None:
        snap.path.unlink(missing_ok=True)

    # ---- membership changes ------------------------------------------------------------
    async def change_membership(self, group: str, change: ConfChange) -> Conf:
        """As `group`'s leader, commits one change of its members (RaftHost.propose_conf)
        and returns the configuration it made. NotLeader when this member does not lead
        it; BadRequest for a change refused (one is under way, a learner not caught up,
        one that does not apply)."""
        host = self.raft
        if host is None:
            raise NodeUnavailable(f"{self.id}: replication is not running")
        self._serving(group)  # NotLeader unless it leads and serves
        try:
            await host.propose_conf(group, change)
        except ConfChangeRefused as e:
            raise BadRequest(f"group {group}: {e}") from None
        except RaftNotCommitted as e:
            raise self.not_leader(group, e.leader) from None
        except RaftNotLeader:
            raise NodeUnavailable(
                f"group {group} changed leader before the change committed: it may still "
                "take effect"
            ) from None
        return host.conf(group)

    def transfer(self, group: str, to: str) -> None:
        """As `group`'s leader, hands its lead to voter `to` (NotLeader if this member does
        not lead it; BadRequest if `to` does not vote)."""
        host = self.raft
        if host is None:
            raise NodeUnavailable(f"{self.id}: replication is not running")
        self._serving(group)
        try:
            host.transfer(group, to)
        except ConfChangeRefused as e:
            raise BadRequest(str(e)) from None

    async def join_group(self, group: str, conf: Conf) -> None:
        """Starts keeping `group`, which this member was added to (as a learner): an
        empty state, caught up by its leader with a snapshot and then the log."""
        from zdmq.server.node import Node  # node.py imports this module

        if group in self.nodes or self.raft is None:
            return
        node = Node(
            self.config,
            group,
            open_storage(self.config.durability, self.data_dir, group=group),
            secret=self.secret,
            member=self,
            topology=self.topology,
        )
        await node.start()
        self.nodes[group] = node
        self.groups.append(group)
        self.members[group] = self._in_order(group, conf)
        self.snapshots_sent.setdefault(group, 0)
        self.raft.add_group(group, conf)
        self._start_tasks(group, node)

    async def leave_group(self, group: str) -> None:
        """Stops keeping `group`, whose removal of this member is committed: its Raft log
        and its state file go."""
        node = self.nodes.pop(group, None)
        if node is None or self.raft is None:
            return
        await self._stop_tasks(group)
        self.raft.remove_group(group)
        self.groups.remove(group)
        await node.stop()
        target = self.data_dir / f"group-{group}.sqlite3"
        for suffix in ("", "-wal", "-shm", "-journal"):
            target.with_name(target.name + suffix).unlink(missing_ok=True)
        sync_dir(self.data_dir)

    async def propose(self, group: str, cmd: Command) -> Any:
        """`cmd`'s result once it is committed in `group`'s log and applied here.

        Raises NotLeader when this member does not lead the group: nothing was proposed,
        so the call may go to the leader. If this member stops leading after proposing,
        it waits for the command's outcome as a follower (the driver's `propose`): the
        result if the next leader committed it, NotLeader if that leader's log took its
        place (it never took effect). With no outcome in time the command may still
        commit: that raises NodeUnavailable (the outcome is unknown), which a call that
        must not run twice (a pop) does not retry."""
        host = self.raft
        if host is None:
            raise NodeUnavailable(f"{self.id}: replication is not running")
        try:
            proposed = host.propose(group, encode_command(cmd))
        except RaftNotLeader as e:
            raise self.not_leader(group, e.leader) from None
        try:
            return await proposed
        except RaftNotCommitted as e:  # e.leader: the leader, or the member handed to
            raise self.not_leader(group, e.leader) from None
        except RaftNotLeader:
            raise NodeUnavailable(
                f"group {group} changed leader before this call committed: it may still take effect"
            ) from None

    def not_leader(self, group: str, leader: str | None = None) -> NotLeader:
        """The refusal of a call for `group`, naming its leader if this member heard
        from it lately (a leader paused or cut off is not named: an election follows)."""
        if leader is None:
            leader = self.live_leader(group)
        where = f"; {leader} leads it" if leader is not None and leader != self.id else ""
        return NotLeader(
            f"{self.id} does not lead group {group}{where}", group=group, leader=leader
        )

    def leads(self, group: str) -> bool:
        """Whether this member serves `group`: it leads it and has applied all that
        earlier leaders committed (driver.py: `serves`)."""
        return self.raft is not None and group in self.nodes and self.raft.serves(group)

    def _catching_up(self, group: str | None) -> bool:
        """Whether this member leads `group` (None: any of its groups) but has not yet
        applied what earlier leaders committed: it serves in a moment."""
        if self.raft is None:
            return False
        groups = list(self.nodes) if group is None else [group] if group in self.nodes else []
        return any(self.raft.is_leader(g) and not self.raft.serves(g) for g in groups)

    def silent(self, node: str) -> bool:
        """Whether `node` stopped answering this node's Raft traffic (paused, cut off)."""
        return self.raft is not None and self.raft.peer_silent(node, SILENT_S)

    def live_leader(self, group: str) -> str | None:
        """The leader of `group` (one of this member's) it heard from in the last
        LIVE_TICKS ticks; None during an election or while its leader is silent."""
        if self.raft is None or group not in self.nodes:
            return None
        return self.raft.live_leader(group, LIVE_TICKS)

    def term(self, group: str) -> int:
        return self.raft.leader(group)[1] if self.raft is not None else 0

    async def serving(self, group: str | None) -> Node:
        """The node that serves a call for `group` here (None: the call named no group,
        so any group this member leads, its own first); NotLeader if there is none (a
        call that named no group is then relayed: relay.py).

        While a named group has no leader (an election runs: at start, or after its
        leader failed), the call waits for one, up to LEADER_WAIT_S, rather than send its
        caller away with nobody to go to. So does a call to a leader just elected, until
        it has applied what earlier leaders committed."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            try:
                return self._serving(group)
            except NotLeader as e:
                # An election this member takes part in, with no leader known yet.
                electing = e.leader is None and group is not None and group in self.nodes
                waiting = electing or self._catching_up(group)
                if not waiting or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.05)

    def log_sizes(self) -> dict[str, dict[str, int]]:
        """Per group: the index its log is compacted up to and its last index."""
        if self.raft is None:
            return {}
        out = {}
        for g in self.groups:
            start, last = self.raft.log_bounds(g)
            out[g] = {"log_start": start, "log_last": last}
        return out

    def _serving(self, group: str | None) -> Node:
        if group is None:
            own = self.nodes.get(self.id)
            if own is not None and own.leading:
                return own
            for node in self.nodes.values():
                if node.leading:
                    return node
            raise self.not_leader(self.id)
        found = self.nodes.get(group)
        if found is None:
            if group not in self.members:
                raise BadRequest(f"{GROUP_HEADER}: no replica group {group[:100]!r}")
            leader = self.router.hint(group)
            raise NotLeader(
                f"{self.id} is not a member of group {group}", group=group, leader=leader
            )
        found.check_leading()
        return found

    # ---- calls to other groups ----------------------------------------------------------
    async def follow(self, epoch: int | None, url: str) -> None:
        """A node at `url` replied under the map of `epoch`: if that is newer than this
        node's, takes the map from it first (one fetch at a time), so a retry routes by
        it. A fetch that fails leaves the map as it was (the push of the home group's
        leader, or the next reply, brings it)."""
        if epoch is None or epoch <= self.topology.epoch:
            return
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.ensure_future(self._fetch_map(url))
        await asyncio.shield(self._fetching)

    async def _fetch_map(self, url: str) -> None:
        try:
            reply = await _http.call(self.pool, "GET", url + "/v1/cluster", timeout_s=2.0)
            self.topology.adopt(map_of_view(reply.json()))
        except (ZdmqError, ValueError, KeyError, TypeError) as e:
            log.info("%s: no cluster map from %s: %s", self.id, url, e)

    async def call(
        self,
        group: str,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        once: bool = False,
        **kw: Any,
    ) -> _http.Reply:
        """A call to `group`'s leader, wherever it is (routing.py: hints, other members,
        pauses; `once` for a call that must not run twice). NodeUnavailable when no
        member took it as leader in the router's time (the call never ran)."""
        headers = {**headers, GROUP_HEADER: group}

        async def send(target: str) -> _http.Reply:
            url = self.urls[target]
            try:
                reply = await _http.call(self.pool, method, url + path, headers=headers, **kw)
            except ZdmqError as e:
                await self.follow(e.epoch, url)
                raise
            await self.follow(_http.reply_epoch(reply), url)
            return reply

        try:
            return await self.router.call(group, send, once=once)
        except NotLeader as e:
            # Not this call's caller's business to route: the group it named is another.
            err = NodeUnavailable(f"group {group} has no leader to take the call: {e}")
            err.unsent = True
            raise err from None
