"""Changing the cluster's nodes (docs/api.md, "Cluster changes"; docs/design.md §19): an
admin adds, removes or replaces a node through any node, which passes the change to
the leader of the map's home group; that leader commits the new map, sends it to every
node, and its rebalancer moves replicas until the map's groups are where it asks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from zdmq import _http
from zdmq.cluster_map import NODE_ID, ClusterMap, MapError, check_address
from zdmq.errors import BadRequest, MapConflict, NodeConflict, RouteNotFound
from zdmq.server.http import Request, Response
from zdmq.server.rebalance import Rebalancer, map_change
from zdmq.server.replicas import Member
from zdmq.server.routes.common import MEMBER, NODE, TOPOLOGY, _json, _json_object
from zdmq.server.topology import Topology

__all__ = [
    "REBALANCER",
    "add_node",
    "internal_change",
    "internal_map",
    "internal_moves",
    "moves",
    "push_map",
    "remove_node",
    "replace_node",
]

log = logging.getLogger(__name__)

REBALANCER = "rebalancer"
PUSH_TIMEOUT_S = 2.0
# How long a node to be added may take to answer at its address.
PROBE_TIMEOUT_S = 2.0


def _member(request: Request) -> Member:
    member: Member | None = request.app[MEMBER]
    if member is None or member.raft is None:
        raise NodeConflict(
            f"{request.app[NODE].id}: a cluster with one copy of each message cannot change "
            "its nodes (replication must be 2 or more)"
        )
    return member


def _node_id(value: Any, where: str) -> str:
    """A node id, as cluster.yaml takes them (else 400)."""
    if not isinstance(value, str) or not NODE_ID.match(value):
        raise BadRequest(f"{where}: a node id is 1 to 64 characters of [A-Za-z0-9_.-]")
    return value


def _address(value: Any) -> str:
    """ "host:port" (else 400)."""
    try:
        check_address('"address"', value)
    except MapError as e:
        raise BadRequest(str(e)) from None
    assert isinstance(value, str)
    return value


_pushes: set[asyncio.Task[None]] = set()


def push_map(member: Member, m: ClusterMap, before: ClusterMap | None = None) -> None:
    """Sends `m` to every node it names, and to those of the map `before` it that it
    no longer names (a node drained and gone hears no more calls, so it would keep its
    last map, and relay what callers still send it by that), in the background (best
    effort: a node that misses it, paused or down, learns it from the epoch of the next
    reply it sees)."""
    left = [n for n in before.nodes if n not in m.nodes] if before is not None else []
    task = asyncio.ensure_future(_push(member, m, left))
    _pushes.add(task)
    task.add_done_callback(_pushes.discard)


async def _push(member: Member, m: ClusterMap, left: list[str]) -> None:
    body = {"map": m.to_dict()}
    urls = {n: member.urls[n] for n in [*m.nodes, *left] if n in member.urls}

    async def one(node: str) -> None:
        try:
            await _http.call(
                member.pool,
                "POST",
                urls[node] + "/v1/internal/cluster",
                json=body,
                timeout_s=PUSH_TIMEOUT_S,
            )
        except Exception as e:
            log.info("map epoch %d not sent to %s: %s", m.epoch, node, e)

    await asyncio.gather(*(one(n) for n in urls if n != member.id))


async def _on_home(request: Request, path: str, body: dict[str, Any] | None) -> Any:
    """The internal call `path` on the home group's leader (this node, if it leads)."""
    member = _member(request)
    method = "GET" if body is None else "POST"
    kw: dict[str, Any] = {"json": body} if body is not None else {}
    reply = await member.call(member.topology.home, method, path, headers={}, **kw)
    return reply.json()


def _changed(result: dict[str, Any]) -> Response:
    return _json(result, status=202 if result["changed"] else 200)


async def add_node(request: Request) -> Response:
    """`POST /v1/cluster/nodes` `{"id": ..., "address": "host:port"}`."""
    body = await _json_object(request)
    _fields(body)
    change = {
        "op": "add",
        "node": _node_id(body.get("id"), '"id"'),
        "address": _address(body.get("address")),
    }
    return _changed(await _on_home(request, "/v1/internal/cluster/changes", change))


async def remove_node(request: Request) -> Response:
    """`DELETE /v1/cluster/nodes/{node}`: drains the node, then it leaves the map."""
    change = {"op": "remove", "node": _node_id(request.match_info["node"], "the path's node")}
    return _changed(await _on_home(request, "/v1/internal/cluster/changes", change))


async def replace_node(request: Request) -> Response:
    """`POST /v1/cluster/nodes/{node}/replace` `{"id": ..., "address": "host:port"}`."""
    body = await _json_object(request)
    _fields(body)
    change = {
        "op": "replace",
        "node": _node_id(request.match_info["node"], "the path's node"),
        "new": _node_id(body.get("id"), '"id"'),
        "address": _address(body.get("address")),
    }
    return _changed(await _on_home(request, "/v1/internal/cluster/changes", change))


def _fields(body: dict[str, Any]) -> None:
    extra = sorted(set(body) - {"id", "address"})
    if extra:
        raise BadRequest(f"unknown field(s) {extra}: the body takes id and address")


async def moves(request: Request) -> Response:
    """`GET /v1/cluster/moves`: the rebalancer's progress, from the home group's leader
    (with one copy of each message nothing ever moves: an empty view)."""
    member: Member | None = request.app[MEMBER]
    if member is None or member.raft is None:
        topology: Topology = request.app[TOPOLOGY]
        return _json(
            {
                "epoch": topology.epoch,
                "leaving": [],
                "current": None,
                "pending_steps": 0,
                "done": [],
                "moves_done": 0,
                "last_error": None,
            }
        )
    return _json(await _on_home(request, "/v1/internal/cluster/moves", None))


# ---- on the home group's leader, and on every node --------------------------------------
async def internal_change(request: Request) -> Response:
    member = _member(request)
    member._serving(member.topology.home)  # 421 unless it leads the home group
    body = await _json_object(request)
    op = body.get("op")
    node = _node_id(body.get("node"), '"node"')
    address = _address(body.get("address")) if op in ("add", "replace") else None
    new = _node_id(body.get("new"), '"new"') if op == "replace" else None
    joining = node if op == "add" else new
    if joining is not None and address is not None and joining not in member.topology.map.nodes:
        await _answers(member, joining, address)
    for _ in range(5):
        m = member.topology.map
        changed = map_change(m, str(op), node, address, new)
        if changed is m:
            return _json({"changed": False, "epoch": m.epoch, "map": m.to_dict()})
        try:
            committed = await member.propose_map(m.epoch, changed)
        except MapConflict:
            continue
        rebalancer: Rebalancer | None = request.app[REBALANCER]
        if rebalancer is not None:
            rebalancer.wake()
        push_map(member, committed, m)
        return _json({"changed": True, "epoch": committed.epoch, "map": committed.to_dict()})
    raise MapConflict("the cluster map kept changing: try again")


async def _answers(member: Member, node: str, address: str) -> None:
    """Returns once `node` answers at `address` as itself; NodeConflict if it does not (a
    node added that does not run, or a mistyped address, would hold every move up)."""
    url = member.topology.url(address)
    try:
        reply = await _http.call(member.pool, "GET", url + "/v1/health", timeout_s=PROBE_TIMEOUT_S)
        answered = reply.json().get("node")
    except Exception as e:  # refused, unresolvable, timed out, not a node
        raise NodeConflict(
            f"node {node} does not answer at {address} ({type(e).__name__}): start it first "
            f"(zdmq node --node {node} --address {address})"
        ) from None
    if answered != node:
        raise NodeConflict(f"{address} is node {answered!r}, not {node}")


async def internal_moves(request: Request) -> Response:
    member = _member(request)
    member._serving(member.topology.home)
    rebalancer: Rebalancer | None = request.app[REBALANCER]
    if rebalancer is None:
        raise RouteNotFound("no rebalancer runs here")
    return _json(rebalancer.view())


async def internal_map(request: Request) -> Response:
    """`POST /v1/internal/cluster` `{"map": ...}`: a newer map, from the home group's
    leader; taken if newer than the one this node holds."""
    body = await _json_object(request)
    try:
        m = ClusterMap.from_dict(body.get("map"))
    except MapError as e:
        raise BadRequest(f"map: {e}") from None
    topology: Topology = request.app[TOPOLOGY]
    taken = topology.adopt(m)
    return _json({"epoch": topology.epoch, "taken": taken})
