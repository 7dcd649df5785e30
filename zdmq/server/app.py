"""The node's HTTP API (REST v1): parse, check, call `Node`, reply.

Any node accepts any call. Calls that belong to another node (a push whose id hashes
elsewhere, a create or delete of a queue whose metadata lives elsewhere) are forwarded
once, marked with `zdmq-forwarded`; a forwarded call that still lands on a non-owner is
refused with 421 rather than bounced again. With replication, a call that names no
replica group and lands on a node that leads none (or stops leading the one serving it)
is relayed to a leader (relay.py); only callers that name the group, which route
themselves, are answered 421 `not_leader`. Paths under `/v1/internal/` are the
node-to-node protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from zdmq.auth import (
    NODE_AUTH_HEADER,
    ClientGuard,
    NodeVerifier,
    check_serving,
    node_secret,
    require,
    rights_on,
)
from zdmq.config import ClusterConfig
from zdmq.errors import BadRequest, Forbidden, RouteNotFound, Unauthorized
from zdmq.logs import RateLimitedLog
from zdmq.raft.driver import RAFT_PATH
from zdmq.server import membership
from zdmq.server import status as cluster_status
from zdmq.server.backup import BACKUP_COPY_HEADER, BackupCopies
from zdmq.server.http import App, Request, Response, json_response
from zdmq.server.membership import MEMBER, NODE
from zdmq.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from zdmq.server.metrics import NodeMetrics
from zdmq.server.node import FORWARDED_HEADER, Node, node_pool
from zdmq.server.relay import Relay
from zdmq.server.replicas import (
    SNAPSHOT_INDEX_HEADER,
    SNAPSHOT_SIZE_HEADER,
    SNAPSHOT_TERM_HEADER,
    Member,
)
from zdmq.server.routes.common import (
    ADMIN,
    ANY_CLIENT,
    BACKUPS,
    CLIENTS,
    CLUSTER_ADMIN,
    CONFIG,
    METRICS,
    METRICS_ENV,
    NODE_ONLY,
    OPEN,
    READ,
    SAMPLER,
    STATUS_POOL,
    WRITE,
    _int_param,
    _json,
)
from zdmq.server.routes.internal import (
    internal_claim,
    internal_depth,
    internal_owned,
    internal_owned_topics,
    internal_purge,
    internal_raft,
    internal_ready,
    internal_register,
    internal_snapshot,
    internal_sweep,
    internal_unregister,
)
from zdmq.server.routes.queues import (
    ack,
    cancel,
    create_queue,
    delete_queue,
    extend,
    get_queue,
    list_queues,
    nack,
    pop,
    push,
    push_batch,
    queue_metadata,
    receive,
)
from zdmq.server.routes.topics import (
    broadcast,
    cancel_tied,
    create_topic,
    delete_topic,
    get_topic,
    list_topics,
    publish,
    push_tied,
    subscribe,
    unsubscribe,
)
from zdmq.server.storage import open_storage

__all__ = ["HAND_OVER", "NODE", "make_app"]

log = logging.getLogger("zdmq.http")

# Set (True) for a graceful stop: the node hands the groups it leads over first, waiting
# up to HAND_OVER_S for them to take another leader.
HAND_OVER = "hand_over"
HAND_OVER_S = 3.0


# ---- public API --------------------------------------------------------------------------
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
    return _json(
        {
            "nodes": [{"id": n.id, "url": n.url} for n in config.nodes],
            "partitions": config.partitions,
            "replication": config.replication,
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


# The status page's files (zdmq/server/ui/), by the path each is served at.
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/status.css": ("status.css", "text/css; charset=utf-8"),
    "/ui/status.js": ("status.js", "text/javascript; charset=utf-8"),
}


def _own_status(request: Request) -> dict[str, Any]:
    return cluster_status.local_status(
        request.app[NODE].id, request.app[NODE], request.app[MEMBER], request.app[SAMPLER]
    )


async def status(request: Request) -> Response:
    """The whole cluster's status, as this node gathers it (zdmq/server/status.py)."""
    config = request.app[CONFIG]
    payload = await cluster_status.cluster_status(
        config, request.app[NODE].id, lambda: _own_status(request), request.app[STATUS_POOL]
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


def _unauthorized(err: Unauthorized, node_only: bool) -> Response:
    resp = json_response(err.to_wire(), status=err.status)
    if not node_only:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="zdmq"'
    return resp


def _guarded(
    handler: Callable[[Request], Any],
    need: str,
    nodes: NodeVerifier,
    clients: ClientGuard | None,
    refusals: RateLimitedLog | None = None,
) -> Callable[[Request], Any]:
    """`handler` behind the credential check `need` calls for; refusals are logged
    through `refusals` (rate-limited)."""
    if need == OPEN:
        return handler
    refused = refusals if refusals is not None else RateLimitedLog(log)
    node_only = need == NODE_ONLY

    def check(request: Request) -> None:
        headers = request.headers
        signed = headers.get(NODE_AUTH_HEADER)
        if signed is not None:  # another node: every right
            nodes.verify(signed, request.method, request.path_qs, request.body)
            return
        if node_only:
            if "Authorization" in headers:
                if clients is not None:
                    clients.token(headers.get("Authorization"))  # a bad token is 401
                raise Forbidden("internal routes take a node credential, not a client token")
            raise Unauthorized("internal routes need a node credential")
        if FORWARDED_HEADER in headers:
            raise Unauthorized("a forwarded call needs a node credential")
        if clients is None:
            return
        token = clients.token(headers.get("Authorization"))
        if need == CLUSTER_ADMIN:
            if ADMIN not in rights_on(token, ""):
                raise Forbidden(f"token {token.name!r} has no admin right on every queue")
        elif need != ANY_CLIENT:
            match = request.match_info
            require(token, match["topic"] if "topic" in match else match["queue"], need)

    async def guarded(request: Request) -> Response:
        try:
            check(request)
        except (Unauthorized, Forbidden) as e:
            refused.warning(
                "refused %s %s: %s",
                request.method,
                request.route,
                e,
                event="auth_refused",
                status=e.status,
                route=request.route,
            )
            if isinstance(e, Forbidden):
                raise
            return _unauthorized(e, node_only)
        result: Response = await handler(request)
        return result

    return guarded


Handler = Callable[[Request], Awaitable[Response]]


def _taking(params: frozenset[str], handler: Handler) -> Handler:
    """`handler`, refusing a query parameter it does not read or one given twice (400
    bad_request naming it): a misspelt `visibilty_s`, or the second `max`, must not be
    ignored in silence."""

    async def checked(request: Request) -> Response:
        if request.query_string:
            names = request.query_names
            unknown = set(names) - params
            if unknown:
                takes = ", ".join(sorted(params)) or "none"
                raise BadRequest(
                    f"unknown query parameter(s) {sorted(unknown)}; this call takes: {takes}"
                )
            if len(names) > len(request.query):
                repeated = sorted(k for k in set(names) if names.count(k) > 1)
                raise BadRequest(f"query parameter(s) {repeated} given more than once")
        return await handler(request)

    return checked


# The query parameters each public call reads; the others read none.
_QUERY: dict[Callable[..., Any], frozenset[str]] = {
    pop: frozenset({"max", "wait_s", "min_priority"}),
    receive: frozenset({"max", "visibility_s", "wait_s", "min_priority"}),
    ack: frozenset({"delay_s"}),
    nack: frozenset({"delay_s"}),
    extend: frozenset({"delay_s", "visibility_s"}),
    backup: frozenset({"offset", "copy"}),
}


def make_app(config: ClusterConfig, node_id: str, *, repair: bool = True) -> App:
    secret = node_secret(config)
    check_serving(config)
    clients = (
        ClientGuard(config.auth.client_tokens) if config.auth.client_tokens is not None else None
    )
    nodes = NodeVerifier(secret, config.node_ids)
    app = App(max_body=config.limits.max_request_bytes)
    app[CONFIG] = config
    app[CLIENTS] = clients
    tasks: list[asyncio.Task[None]] = []
    member: Member | None = None
    if config.replication > 1:
        # Replica groups (replicas.py): a Node per group this node is a member of.
        member = Member(config, node_id, secret)
        # A Raft payload carries entries up to a whole request each.
        app.max_body_of[RAFT_PATH] = member.max_payload_bytes
        served = list(member.nodes.values())
        app[NODE] = member.nodes[node_id]
    else:
        node = Node(
            config,
            node_id,
            open_storage(config.durability, config.node_data_dir(node_id)),
            secret=secret,
        )
        served = [node]
        app[NODE] = node
    app[MEMBER] = member
    app[HAND_OVER] = False
    relay = Relay(config, member) if member is not None else None
    app[BACKUPS] = BackupCopies(config.node_data_dir(node_id) / "backups")
    sampler = cluster_status.RateSampler(
        lambda: served if member is None else member.nodes.values()
    )
    app[SAMPLER] = sampler
    app[STATUS_POOL] = None
    node_metrics: NodeMetrics | None = None
    if os.environ.get(METRICS_ENV, "on").lower() not in ("off", "0", "false", "no"):
        node_metrics = NodeMetrics(node_id)
        app.observe = node_metrics.request
        app.on_serving = node_metrics.attach_connections
        if member is not None:
            m = member
            node_metrics.attach(lambda: [n for g, n in m.nodes.items() if m.leads(g)], m)
        else:
            node_metrics.attach(lambda: served, None)
        for n in served:
            n.metrics = node_metrics
            n.storage.on_commit = node_metrics.state_commit
    app[METRICS] = node_metrics

    async def startup(app: App) -> None:
        if member is not None:
            await member.start()
            if node_metrics is not None and member.raft is not None:
                member.raft.on_persist = node_metrics.raft_write
        else:
            await served[0].start()
        for n in served:
            tasks.append(asyncio.create_task(n.monitor_loop()))
            if repair:
                tasks.append(asyncio.create_task(n.repair_loop()))
        tasks.append(asyncio.create_task(sampler.run()))
        # The status's calls to every node, each given up on soon (a node down shows fast).
        app[STATUS_POOL] = node_pool(
            config, secret, node_id, timeout_s=cluster_status.NODE_TIMEOUT_S
        )

    async def cleanup(app: App) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if app[STATUS_POOL] is not None:
            await app[STATUS_POOL].close()
        if relay is not None:
            await relay.close()
        if member is not None:
            await member.stop()
        else:
            await served[0].stop()

    async def shutdown(app: App) -> None:
        # A graceful stop hands this node's groups over first: they keep serving, with
        # no election timeout to wait out (kill -9 has no such step).
        raft = member.raft if member is not None and app[HAND_OVER] else None
        if raft is not None and not await raft.hand_over(HAND_OVER_S):
            log.warning("%s still leads a group after %g s; stopping", node_id, HAND_OVER_S)

    app.on_startup.append(startup)
    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(cleanup)
    # A flood of refused calls logs at most 10 lines per 10 s (and how many it left out).
    refusals = RateLimitedLog(log, burst=10, period_s=10.0)
    for method, path, handler, need in ROUTES:
        if need != NODE_ONLY:
            handler = _taking(_QUERY.get(handler, frozenset()), handler)
            if relay is not None:  # a plain call this node cannot serve goes to a leader
                handler = relay.wrap(handler)
        app.route(method, path, _guarded(handler, need, nodes, clients, refusals))
    return app


# Every route, and who may call it.
ROUTES: tuple[tuple[str, str, Callable[[Request], Any], str], ...] = (
    ("GET", "/v1/health", health, OPEN),
    ("GET", "/v1/cluster", cluster, ANY_CLIENT),
    ("GET", "/v1/openapi.yaml", openapi, OPEN),
    ("GET", "/v1/status", status, ANY_CLIENT),
    *(("GET", path, status_page, OPEN) for path in PAGE_FILES),
    ("GET", "/metrics", metrics, OPEN),
    ("GET", "/v1/queues", list_queues, ANY_CLIENT),
    ("PUT", "/v1/queues/{queue}", create_queue, ADMIN),
    ("GET", "/v1/queues/{queue}", get_queue, READ),
    ("DELETE", "/v1/queues/{queue}", delete_queue, ADMIN),
    ("GET", "/v1/queues/{queue}/metadata", queue_metadata, READ),
    ("POST", "/v1/queues/{queue}/messages", push, WRITE),
    ("POST", "/v1/queues/{queue}/batch", push_batch, WRITE),
    ("DELETE", "/v1/queues/{queue}/messages/{id}", cancel, WRITE),
    ("POST", "/v1/queues/{queue}/pop", pop, READ),
    ("POST", "/v1/queues/{queue}/receive", receive, READ),
    ("POST", "/v1/queues/{queue}/ack", ack, READ),
    ("POST", "/v1/queues/{queue}/nack", nack, READ),
    ("POST", "/v1/queues/{queue}/extend", extend, READ),
    ("GET", "/v1/topics", list_topics, ANY_CLIENT),
    ("PUT", "/v1/topics/{topic}", create_topic, ADMIN),
    ("GET", "/v1/topics/{topic}", get_topic, READ),
    ("DELETE", "/v1/topics/{topic}", delete_topic, ADMIN),
    ("POST", "/v1/topics/{topic}/subscriptions", subscribe, ADMIN),
    ("DELETE", "/v1/topics/{topic}/subscriptions/{queue}", unsubscribe, ADMIN),
    ("POST", "/v1/topics/{topic}/messages", publish, WRITE),
    ("POST", "/v1/topics/{topic}/batch", publish, WRITE),
    ("POST", "/v1/broadcast", broadcast, ANY_CLIENT),
    ("GET", "/v1/backup/{group}", backup, CLUSTER_ADMIN),
    ("POST", "/v1/tied", push_tied, ANY_CLIENT),
    ("DELETE", "/v1/tied/{token}", cancel_tied, ANY_CLIENT),
    ("POST", "/v1/internal/claim", internal_claim, NODE_ONLY),
    ("POST", "/v1/internal/queues/{queue}/purge", internal_purge, NODE_ONLY),
    ("GET", "/v1/internal/queues/{queue}/depth", internal_depth, NODE_ONLY),
    ("GET", "/v1/internal/owned-queues", internal_owned, NODE_ONLY),
    ("GET", "/v1/internal/owned-topics", internal_owned_topics, NODE_ONLY),
    ("POST", "/v1/internal/sweep", internal_sweep, NODE_ONLY),
    ("POST", "/v1/internal/register", internal_register, NODE_ONLY),
    ("POST", "/v1/internal/unregister", internal_unregister, NODE_ONLY),
    ("POST", "/v1/internal/ready", internal_ready, NODE_ONLY),
    ("POST", "/v1/internal/raft", internal_raft, NODE_ONLY),
    ("GET", "/v1/internal/snapshots/{group}", internal_snapshot, NODE_ONLY),
    ("GET", "/v1/internal/groups/{group}", membership.conf_of_group, NODE_ONLY),
    ("PUT", "/v1/internal/groups/{group}", membership.join_group, NODE_ONLY),
    ("DELETE", "/v1/internal/groups/{group}", membership.leave_group, NODE_ONLY),
    ("POST", "/v1/internal/groups/{group}/changes", membership.change_group, NODE_ONLY),
    ("POST", "/v1/internal/groups/{group}/transfer", membership.transfer_group, NODE_ONLY),
    ("GET", "/v1/internal/status", internal_status, NODE_ONLY),
)
