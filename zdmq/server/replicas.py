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
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from zdmq import _http
from zdmq.config import ClusterConfig
from zdmq.errors import BadRequest, NodeUnavailable, NotLeader
from zdmq.raft.core import NotLeader as RaftNotLeader
from zdmq.raft.driver import RaftHost, http_sender
from zdmq.raft.sqlite_storage import RaftLogStore
from zdmq.raft.storage import Entry
from zdmq.routing import GROUP_HEADER, GroupRouter, group_members
from zdmq.server.machine import Command, apply_command, decode_command, encode_command
from zdmq.server.storage import open_storage

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
# Raft messages to one peer travel in payloads of up to this many bytes (past the first).
PAYLOAD_BYTES = 4 << 20


class Member:
    """The replica groups one node process takes part in."""

    def __init__(self, config: ClusterConfig, node_id: str, secret: bytes) -> None:
        from zdmq.server.node import Node, node_pool  # node.py imports this module

        self.config = config
        self.id = node_id
        self.started_at = time.time()
        self.members = group_members(config.node_ids, config.replication)
        self.groups = [g for g, ms in self.members.items() if node_id in ms]
        self.urls = {n.id: n.url for n in config.nodes}
        data_dir = config.node_data_dir(node_id)
        self.nodes: dict[str, Node] = {
            g: Node(
                config,
                g,
                open_storage(config.durability, data_dir, group=g),
                secret=secret,
                member=self,
            )
            for g in self.groups
        }
        self.pool = node_pool(config, secret, node_id)
        self._raft_pool = node_pool(config, secret, node_id, timeout_s=1.0, limit_per_host=4)
        # Calls to other groups find their leaders: this member's own knowledge of the
        # groups it is in, 421 hints for the others.
        self.router = GroupRouter(self.members, self._leader_of)
        self.store: RaftLogStore | None = None
        self.raft: RaftHost | None = None
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
        applied = {g: node.storage.applied for g, node in self.nodes.items()}
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
        )
        self.raft.start()

    async def stop(self) -> None:
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
        """A committed entry of `group`, applied to this member's copy of its state."""
        node = self.nodes[group]
        result = None
        if entry.data is not None:
            result = apply_command(node.state, decode_command(entry.data))
        node.storage.note_applied(entry.index, node.state.clock)
        return result

    async def propose(self, group: str, cmd: Command) -> Any:
        """`cmd`'s result once it is committed in `group`'s log and applied here.

        Raises NotLeader when this member does not lead the group: nothing was proposed,
        so the call may go to the leader. If this member stops leading after proposing,
        before the command commits, the command may still commit under the next leader:
        that raises NodeUnavailable (the outcome is unknown), which a call that must not
        run twice (a pop) does not retry."""
        host = self.raft
        if host is None:
            raise NodeUnavailable(f"{self.id}: replication is not running")
        try:
            proposed = host.propose(group, encode_command(cmd))
        except RaftNotLeader as e:
            raise self.not_leader(group, e.leader) from None
        try:
            return await proposed
        except RaftNotLeader:
            raise NodeUnavailable(
                f"group {group} changed leader before this call committed: it may still take effect"
            ) from None

    def not_leader(self, group: str, leader: str | None = None) -> NotLeader:
        if leader is None and self.raft is not None:
            leader = self.raft.leader(group)[0]
        where = f"; {leader} leads it" if leader is not None and leader != self.id else ""
        return NotLeader(
            f"{self.id} does not lead group {group}{where}", group=group, leader=leader
        )

    def leads(self, group: str) -> bool:
        return self.raft is not None and group in self.nodes and self.raft.is_leader(group)

    def _leader_of(self, group: str) -> str | None:
        if self.raft is not None and group in self.nodes:
            return self.raft.leader(group)[0]
        return None

    def term(self, group: str) -> int:
        return self.raft.leader(group)[1] if self.raft is not None else 0

    async def serving(self, group: str | None) -> Node:
        """The node that serves a call for `group` here (None: the call named no group,
        so any group this member leads, its own first); NotLeader if there is none.

        While the group has no leader (an election runs: at start, or after its leader
        failed), the call waits for one, up to LEADER_WAIT_S, rather than send its caller
        away with nobody to go to."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            try:
                return self._serving(group)
            except NotLeader as e:
                # An election this member takes part in, with no leader known yet.
                electing = e.leader is None and (group is None or group in self.nodes)
                if not electing or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.05)

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
        pauses; `once` for a call that must not run twice)."""
        headers = {**headers, GROUP_HEADER: group}

        def send(target: str) -> Awaitable[_http.Reply]:
            return _http.call(self.pool, method, self.urls[target] + path, headers=headers, **kw)

        return await self.router.call(group, send, once=once)
