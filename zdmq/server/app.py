"""The node's HTTP API (REST v1): every route, who may call it, and the app that serves
them (make_app). The handlers, in routes/ by what they serve, parse, check, call `Node`,
reply.

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
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from zdmq import _http
from zdmq.auth import (
    NODE_AUTH_HEADER,
    ClientGuard,
    NodeVerifier,
    check_serving,
    node_secret,
    require,
    rights_on,
)
from zdmq.cluster_map import ClusterMap
from zdmq.config import ClusterConfig
from zdmq.errors import BadRequest, Forbidden, Unauthorized
from zdmq.logs import RateLimitedLog
from zdmq.raft.driver import RAFT_PATH
from zdmq.server import status as cluster_status
from zdmq.server.backup import BackupCopies
from zdmq.server.http import App, Request, Response, json_response
from zdmq.server.metrics import NodeMetrics
from zdmq.server.node import FORWARDED_HEADER, Node, node_pool
from zdmq.server.rebalance import Rebalancer
from zdmq.server.relay import Relay
from zdmq.server.replicas import Member
from zdmq.server.routes import cluster as cluster_routes
from zdmq.server.routes import membership
from zdmq.server.routes.common import (
    ADMIN,
    ANY_CLIENT,
    BACKUPS,
    CLIENTS,
    CLUSTER_ADMIN,
    CONFIG,
    MEMBER,
    METRICS,
    METRICS_ENV,
    NODE,
    NODE_ONLY,
    OPEN,
    READ,
    SAMPLER,
    STATUS_POOL,
    TOPOLOGY,
    WRITE,
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
from zdmq.server.routes.operations import (
    PAGE_FILES,
    backup,
    cluster,
    health,
    internal_status,
    metrics,
    openapi,
    status,
    status_page,
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
from zdmq.server.routes.streams import STREAMS, close_streams, stream
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
from zdmq.server.topology import EPOCH_HEADER, Topology, map_of_view

__all__ = ["HAND_OVER", "NODE", "make_app"]

log = logging.getLogger("zdmq.http")

# Set (True) for a graceful stop: the node hands the groups it leads over first, waiting
# up to HAND_OVER_S for them to take another leader.
HAND_OVER = "hand_over"
HAND_OVER_S = 3.0


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
            nodes.verify(
                signed,
                request.method,
                request.path_qs,
                request.body,
                any_node=request.path == "/v1/cluster",
            )
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
    stream: frozenset({"credit", "visibility_s", "min_priority"}),
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
    app = App(max_body=config.limits.max_request_bytes)
    # The cluster map this node routes by (topology.py): every reply names its epoch.
    topology = Topology(config, config.node_data_dir(node_id))
    app[TOPOLOGY] = topology
    app[STREAMS] = set()  # consumers' open streams (routes/streams.py)

    def epoch_header(m: ClusterMap) -> None:
        app.reply_head = b"%s: %d\r\n" % (EPOCH_HEADER.encode(), m.epoch)

    epoch_header(topology.map)
    topology.on_change(epoch_header)
    # Another node is one the map names (or named): a node added since is known once
    # this node has its map, which a signed call from one it does not know has it fetch.
    relearning: list[asyncio.Task[None]] = []

    def unknown_node(node: str) -> None:
        member = app[MEMBER]
        if member is not None and not any(not t.done() for t in relearning):
            log.info("%s: a call from %s, not in its map: fetching the map", node_id, node)
            relearning[:] = [asyncio.ensure_future(_learn_map(member))]

    nodes = NodeVerifier(secret, topology.urls, unknown_node)
    app[CONFIG] = config
    app[CLIENTS] = clients
    tasks: list[asyncio.Task[None]] = []
    member: Member | None = None
    if config.replication > 1:
        # Replica groups (replicas.py): a Node per group this node is a member of.
        member = Member(config, node_id, secret, topology)
        # A Raft payload carries entries up to a whole request each.
        app.max_body_of[RAFT_PATH] = member.max_payload_bytes
        served = list(member.nodes.values())
        app[NODE] = member.nodes.get(node_id) or next(iter(served), None)
    else:
        node = Node(
            config,
            node_id,
            open_storage(config.durability, config.node_data_dir(node_id)),
            secret=secret,
            topology=topology,
        )
        served = [node]
        app[NODE] = node
    app[MEMBER] = member
    # On the home group's leader: brings the groups to what the map asks (rebalance.py).
    rebalancer = (
        Rebalancer(member, functools.partial(cluster_routes.push_map, member))
        if member is not None
        else None
    )
    app[cluster_routes.REBALANCER] = rebalancer
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
    app[METRICS] = node_metrics

    def node_tasks(n: Node) -> list[asyncio.Task[None]]:
        """A node (a replica group's, with replication) starts serving here: its metrics,
        and its monitor (leases, delays, housekeeping) and repair loops."""
        if node_metrics is not None:
            n.metrics = node_metrics
            n.storage.on_commit = node_metrics.state_commit
        started = [asyncio.create_task(n.monitor_loop())]
        if repair:
            started.append(asyncio.create_task(n.repair_loop()))
        return started

    if member is not None:
        # Also for the groups the node joins as replicas move to it; a group it leaves
        # stops its tasks.
        member.on_node = node_tasks

    async def startup(app: App) -> None:
        if member is not None:
            await member.start()
            if node_metrics is not None and member.raft is not None:
                member.raft.on_persist = node_metrics.raft_write
            member.start_node_tasks()
        else:
            await served[0].start()
            tasks.extend(node_tasks(served[0]))
        tasks.append(asyncio.create_task(sampler.run()))
        if member is not None:
            await _learn_map(member)
        if rebalancer is not None:
            tasks.append(asyncio.create_task(rebalancer.run()))
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
        # Streams end first: their consumers reopen them to the groups' next leaders.
        await close_streams(app[STREAMS])
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


async def _learn_map(member: Member) -> None:
    """At start: the newest map the nodes this one knows hold (a node that joins a
    running cluster knows only the seeds of its cluster file)."""
    urls = list(dict.fromkeys(u for n, u in member.urls.items() if n != member.id))

    async def one(url: str) -> None:
        try:
            reply = await _http.call(member.pool, "GET", url + "/v1/cluster", timeout_s=2.0)
            member.topology.adopt(map_of_view(reply.json()))
        except Exception as e:
            log.debug("no map from %s at start: %s", url, e)

    await asyncio.gather(*(one(u) for u in urls))


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
    ("GET", "/v1/queues/{queue}/stream", stream, READ),
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
    ("POST", "/v1/cluster/nodes", cluster_routes.add_node, CLUSTER_ADMIN),
    ("DELETE", "/v1/cluster/nodes/{node}", cluster_routes.remove_node, CLUSTER_ADMIN),
    ("POST", "/v1/cluster/nodes/{node}/replace", cluster_routes.replace_node, CLUSTER_ADMIN),
    ("GET", "/v1/cluster/moves", cluster_routes.moves, CLUSTER_ADMIN),
    ("POST", "/v1/internal/cluster", cluster_routes.internal_map, NODE_ONLY),
    ("POST", "/v1/internal/cluster/changes", cluster_routes.internal_change, NODE_ONLY),
    ("GET", "/v1/internal/cluster/moves", cluster_routes.internal_moves, NODE_ONLY),
)
