"""Changing the cluster's nodes online: the operator's request, and the moves that follow.

An operator's change (`add`, `remove` or `replace` a node: `map_change`) only changes
the cluster map, in its home group's log: a node added holds nothing yet, a node
removed is marked leaving. Bringing the groups to what the map asks is the
`Rebalancer`'s work, which runs on the home group's leader: it plans the steps with
zdmq/cluster_plan.py from the map as it stands (`plan(map, staying nodes)`), carries out
the first (a replica moved through the group's log by moves.py, or a preferred leader
changed), records it in the map, and plans again, until there is nothing left to do;
a leaving node that holds nothing then leaves the map. It keeps nothing of its own: a
plan is a pure function of the map, and a move is read off the group's log, so when
the home group's leader changes (or the node driving a move dies) the next leader
picks up where the map and the logs stand. The steps run one at a time, so a node
receives at most one group's snapshot at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from zdmq import _http
from zdmq.cluster_map import ClusterMap, MapError, apply_step
from zdmq.cluster_plan import plan
from zdmq.errors import (
    BadRequest,
    MapConflict,
    NodeConflict,
    NodeNotFound,
    NotLeader,
    ZdmqError,
)
from zdmq.server.moves import MoveProgress, run_move

if TYPE_CHECKING:
    from zdmq.server.replicas import Member

__all__ = ["Rebalancer", "map_change"]

log = logging.getLogger(__name__)

IDLE_S = 0.5  # how often a home leader with nothing to do looks again
RETRY_S = 2.0  # the pause after a step that failed
DONE_KEPT = 100  # the moves done that are remembered (the view shows the last 20)


def map_change(
    m: ClusterMap, op: str, node: str, address: str | None, new: str | None
) -> ClusterMap:
    """The map after an operator's change, or `m` itself when it has taken effect already
    (each change is idempotent). NodeConflict for one the cluster's nodes refuse,
    NodeNotFound for a replace of a node the map does not hold, BadRequest for a change
    that is not one."""
    if op == "add":
        assert address is not None
        if node in m.nodes:
            if m.nodes[node] != address:
                raise NodeConflict(f"node {node} is in the cluster at {m.nodes[node]}")
            return m
        return _changed(lambda: m.with_node(node, address))
    if op == "remove":
        if node not in m.nodes or node in m.leaving:
            return m
        if len(m.staying()) - 1 < m.replication:
            raise NodeConflict(
                f"removing {node} would leave {len(m.staying()) - 1} nodes for "
                f"{m.replication} copies of every group"
            )
        return m.with_leaving(node)
    if op == "replace":
        assert new is not None and address is not None
        if node not in m.nodes:
            if new not in m.nodes:
                raise NodeNotFound(f"node {node} is not in the cluster")
            if m.nodes[new] != address:
                raise NodeConflict(f"node {new} is in the cluster at {m.nodes[new]}")
            return m  # done: the old node has left
        if new == node:
            raise NodeConflict(f"node {node} cannot take its own place")
        if new in m.nodes:
            if m.nodes[new] != address:
                raise NodeConflict(f"node {new} is in the cluster at {m.nodes[new]}")
            if node not in m.leaving:
                # Not a replace under way: a node of the cluster takes no other's place
                # (removing the old one drains it onto the others).
                raise NodeConflict(f"node {new} is in the cluster already; replace adds a new one")
            return m  # under way
        out = _changed(lambda: m.with_node(new, address))
        return out if node in out.leaving else out.with_leaving(node)
    raise BadRequest(f"unknown change {op!r}")


def _changed(change: Callable[[], ClusterMap]) -> ClusterMap:
    """`change()`; a map it cannot make (an address another node has) is a conflict."""
    try:
        return change()
    except MapError as e:
        raise NodeConflict(str(e)) from None


class Rebalancer:
    """Brings the groups to what the map asks, while this node leads the home group."""

    def __init__(self, member: Member, push: Callable[[ClusterMap, ClusterMap], None]) -> None:
        self.member = member
        self._push = push
        self.current: MoveProgress | None = None
        self.done: deque[MoveProgress] = deque(maxlen=DONE_KEPT)
        self.moves_done = 0
        self.pending = 0
        self.last_error: str | None = None
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def view(self) -> dict[str, Any]:
        """What `GET /v1/cluster/moves` shows."""
        m = self.member.topology.map

        def one(p: MoveProgress) -> dict[str, Any]:
            out = asdict(p)
            elapsed = max((p.finished or time.time()) - p.started, 1e-3)
            out["elapsed_s"] = round(elapsed, 3)
            out["entries_per_s"] = round(p.matched / elapsed, 1)
            out["bytes_per_s"] = round(p.bytes / elapsed, 1)
            return out

        # What is left to do, planned from the map now (a leader that has just taken
        # over has not planned yet, and the map may have changed since the last step).
        try:
            pending = self.pending if m.moving() else len(plan(m, m.staying()))
        except MapError:  # a map no plan fits (the step says why, in last_error)
            pending = self.pending
        return {
            "epoch": m.epoch,
            "leaving": list(m.leaving),
            "current": one(self.current) if self.current is not None else None,
            "pending_steps": pending,
            "done": [one(p) for p in list(self.done)[-20:]],
            "moves_done": self.moves_done,
            "last_error": self.last_error,
        }

    async def run(self) -> None:
        member = self.member
        while True:
            self._wake.clear()
            if not member.leads(member.topology.home):
                self.pending = 0
                await self._idle()
                continue
            try:
                worked = await self.step()
            except asyncio.CancelledError:
                raise
            except (ZdmqError, OSError) as e:
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("rebalance step failed: %s", self.last_error)
                await asyncio.sleep(RETRY_S)
                continue
            except Exception:
                log.exception("rebalance step failed")
                await asyncio.sleep(RETRY_S)
                continue
            if not worked:
                await self._idle()

    async def _idle(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), IDLE_S)

    async def step(self) -> bool:
        """Takes the next step the map asks for; False when there is none."""
        member = self.member
        m = member.topology.map
        if m.moving():  # a map that lists learners: the groups' logs decide, not it
            return False
        steps = plan(m, m.staying())
        self.pending = len(steps)
        if not steps:
            gone = [n for n in m.leaving if not m.holds(n)]
            if not gone:
                return False
            await self._commit(m, m.without_node(gone[0]))
            return True
        step = steps[0]
        if step.is_move:
            self.current = progress = MoveProgress(step.group, step.add, step.remove)
            try:
                await run_move(self._call, step.group, step.add, step.remove, progress=progress)
            finally:
                self.current = None
            self.done.append(progress)
            self.moves_done += 1
        await self._commit(m, apply_step(m, step))
        self.last_error = None
        return True

    async def _commit(self, m: ClusterMap, new: ClusterMap) -> None:
        try:
            committed = await self.member.propose_map(m.epoch, new)
        except (MapConflict, NotLeader):
            return  # another change, or another leader: plan again from what holds
        self._push(committed, m)

    async def _call(self, target: str | tuple[str, str], method: str, path: str, body: Any) -> Any:
        member = self.member
        kw: dict[str, Any] = {"json": body} if body is not None else {}
        if isinstance(target, tuple):
            reply = await member.call(target[1], method, path, headers={}, **kw)
        else:
            reply = await _http.call(member.pool, method, member.urls[target] + path, **kw)
        return reply.json() if reply.body else None
