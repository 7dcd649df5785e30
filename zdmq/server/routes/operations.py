"""What an operator calls (docs/operations.md): a node's health, the cluster's layout, its
status (gathered from each node's part) and status page, metrics, the API's OpenAPI file,
and backup copies of a replica group's state."""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from zdmq.errors import BadRequest, RouteNotFound
from zdmq.server import status as cluster_status
from zdmq.server.backup import BACKUP_COPY_HEADER
from zdmq.server.http import Request, Response
from zdmq.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from zdmq.server.metrics import NodeMetrics
from zdmq.server.node import Node
from zdmq.server.replicas import (
    SNAPSHOT_INDEX_HEADER,
    SNAPSHOT_SIZE_HEADER,
    SNAPSHOT_TERM_HEADER,
    Member,
)
from zdmq.server.routes.cluster import REBALANCER
from zdmq.server.routes.common import (
    BACKUPS,
    CONFIG,
    MEMBER,
    METRICS,
    METRICS_ENV,
    NODE,
    SAMPLER,
    STATUS_POOL,
    TOPOLOGY,
    _int_param,
    _json,
)
from zdmq.server.topology import Topology


async def health(request: Request) -> Response:
    member: Member | None = request.app[MEMBER]
    if member is not None:
        return _member_health(member)
    node: Node = request.app[NODE]
    failed = node.storage.failed
    return _json(
        {
            "node": node.id,
            "status": "failed" if failed else "ok",
            "detail": failed,
            "messages": node.state.stored(),
            "queues_owned": len(node.state.meta),
            "uptime_s": round(time.time() - node.started_at, 3),
            "counters": dict(node.counters),
            "storage": {
                "commits": node.storage.commits,
                "ops": node.storage.ops_written,
                "rows_cached": node.storage.cache_hits,
                "rows_read": node.storage.cache_misses,
            },
        },
        status=503 if failed else 200,
    )


def _member_health(member: Member) -> Response:
    """A node with replication: its replica groups, each with its role, leader and term."""
    groups: dict[str, Any] = {}
    failed = [f"{g}: {n.storage.failed}" for g, n in member.nodes.items() if n.storage.failed]
    host = member.raft
    if host is not None and host.failed:
        failed.append(f"raft: {host.failed}")
    logs = member.log_sizes()
    for g, node in member.nodes.items():
        leader, term = host.leader(g) if host is not None else (None, 0)
        groups[g] = {
            **logs.get(g, {}),
            "role": host.role(g).value if host is not None else "stopped",
            "leader": leader,
            "term": term,
            "applied": node.storage.applied,
            # Members whose new store this member does not count yet (zdmq/raft/identity.py).
            "on_probation": sorted(host.on_probation(g)) if host is not None else [],
            "messages": node.state.stored(),
            "queues_owned": len(node.state.meta),
            "counters": dict(node.counters),
        }
    own = member.nodes.get(member.id)
    return _json(
        {
            "node": member.id,
            "status": "failed" if failed else "ok",
            "detail": "; ".join(failed) or None,
            "messages": own.state.stored() if own is not None else 0,
            "queues_owned": len(own.state.meta) if own is not None else 0,
            "counters": dict(own.counters) if own is not None else {},
            "uptime_s": round(time.time() - member.started_at, 3),
            "groups": groups,
            "raft": dict(host.counters) if host is not None else {},
        },
        status=503 if failed else 200,
    )


async def cluster(request: Request) -> Response:
    config = request.app[CONFIG]
    topology: Topology = request.app[TOPOLOGY]
    return _json(
        {
            **topology.view(),
            "limits": {
                "max_message_bytes": config.limits.max_message_bytes,
                "max_batch_messages": config.limits.max_batch_messages,
                "max_request_bytes": config.limits.max_request_bytes,
            },
        }
    )


async def metrics(request: Request) -> Response:
    """The node's metrics in Prometheus' text format (zdmq/server/metrics.py)."""
    m: NodeMetrics | None = request.app[METRICS]
    if m is None:
        raise RouteNotFound(f"metrics are off on this node (${METRICS_ENV})")
    return Response(body=m.exposition(), content_type=METRICS_CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    text = resources.files("zdmq.server").joinpath("openapi.yaml").read_bytes()
    return Response(body=text, content_type="application/yaml")


# ---- the cluster status and its page --------------------------------------------------------
# The status page's files (zdmq/server/ui/), by the path each is served at.
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/status.css": ("status.css", "text/css; charset=utf-8"),
    "/ui/status.js": ("status.js", "text/javascript; charset=utf-8"),
}


def _self_id(request: Request) -> str:
    # A node that joined holds no group at first: it has a Member but no Node yet.
    member: Member | None = request.app[MEMBER]
    return member.id if member is not None else request.app[NODE].id


def _own_status(request: Request) -> dict[str, Any]:
    return cluster_status.local_status(
        _self_id(request), request.app[NODE], request.app[MEMBER], request.app[SAMPLER]
    )


async def status(request: Request) -> Response:
    """The whole cluster's status, as this node gathers it (zdmq/server/status.py): of
    the nodes of the map it routes by, with the map's epoch and the rebalancer's moves."""
    config = request.app[CONFIG]
    topology: Topology = request.app[TOPOLOGY]
    m = topology.map
    pool = request.app[STATUS_POOL]
    payload = await cluster_status.cluster_status(
        config,
        _self_id(request),
        lambda: _own_status(request),
        pool,
        nodes=[(n, topology.url(address)) for n, address in m.nodes.items()],
        epoch=m.epoch,
        leaving=m.leaving,
        moves=cluster_status.moves_view(request.app[MEMBER], request.app[REBALANCER], pool),
    )
    return _json(payload)


async def internal_status(request: Request) -> Response:
    """This node's own part of the cluster status."""
    return _json(_own_status(request))


async def status_page(request: Request) -> Response:
    """The status page and its files: static, shipped in the package."""
    name, ctype = PAGE_FILES[request.path]
    body = resources.files("zdmq.server").joinpath("ui", name).read_bytes()
    return Response(body=body, content_type=ctype, headers={"Cache-Control": "no-cache"})


async def backup(request: Request) -> Response:
    """A piece of a consistent copy of a replica group's state (backup.py), from the
    group's leader: without `copy` a new copy made now, else the piece at `offset` of
    copy `copy`. With one copy (`replication: 1`) the groups are the nodes, each serving
    its own. 421 from a member that does not lead the group (naming its leader), 404 for
    a copy the node no longer keeps."""
    group = request.match_info["group"]
    member: Member | None = request.app[MEMBER]
    if member is None:
        node = request.app[NODE]
        if group != node.id:
            raise RouteNotFound(
                f"with one copy each node backs up its own state: ask node {group[:100]!r}"
            )
    else:
        if group not in member.members:
            raise RouteNotFound(f"no replica group {group[:100]!r}")
        node = await member.serving(group)
    offset = _int_param(request, "offset", 0, 0, 1 << 50)
    copy = request.query.get("copy")
    try:
        chunk = await request.app[BACKUPS].chunk(group, node.storage, offset, copy)
    except NotImplementedError:
        raise BadRequest("a node with durability memory keeps no state to back up") from None
    return Response(
        body=chunk.data,
        content_type="application/octet-stream",
        headers={
            BACKUP_COPY_HEADER: chunk.copy,
            SNAPSHOT_INDEX_HEADER: str(chunk.index),
            SNAPSHOT_TERM_HEADER: str(chunk.term),
            SNAPSHOT_SIZE_HEADER: str(chunk.size),
        },
    )
