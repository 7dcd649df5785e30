"""The node-to-node protocol (paths under `/v1/internal/`): what a queue's metadata owner
hears from the other nodes (registrations, sweeps, ready notices), a node's purge, depth and
owned queues and topics, a tied copy's claim, and Raft messages and snapshots between the
members of a replica group. A group's membership changes are membership.py's; a node's part
of the cluster status is operations.py's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zdmq.auth import NODE_AUTH_HEADER
from zdmq.errors import BadRequest, Misrouted, RouteNotFound, ZdmqError
from zdmq.models import validate_message_id, validate_queue_name
from zdmq.raft.driver import RAFT_CONTENT_TYPE
from zdmq.server.http import Request, Response
from zdmq.server.node import Node
from zdmq.server.replicas import (
    SNAPSHOT_INDEX_HEADER,
    SNAPSHOT_SIZE_HEADER,
    SNAPSHOT_TERM_HEADER,
    Member,
)
from zdmq.server.routes.common import (
    MEMBER,
    NODE,
    TOPOLOGY,
    _int_param,
    _json,
    _json_body,
    _node,
    _queue,
)
from zdmq.server.topology import Topology


def _owner_only(node: Node, queue: str) -> None:
    if node.meta_owner(queue) != node.id:
        raise Misrouted(f"{node.id} is not the metadata owner of {queue!r}")


def _owner_of_all(node: Node, queues: Iterable[str]) -> None:
    """Refuses a batch of node-to-node calls unless every queue in it is valid and this
    node is its metadata owner."""
    for q in queues:
        validate_queue_name(q)
        _owner_only(node, q)


def _field(payload: Any, name: str) -> str:
    if not isinstance(payload, dict) or not isinstance(payload.get(name), str):
        raise BadRequest(f"{name}: expected a string")
    return str(payload[name])


def _calling_node(request: Request, payload: Any) -> str:
    """The `node` a registration, unregistration or ready notice is about: a node of
    the cluster, and the one whose credential the call carries (a node speaks only for
    itself). Else 400, before anything is stored."""
    node_id = _field(payload, "node")
    topology: Topology = request.app[TOPOLOGY]
    if node_id not in topology.map.groups:
        raise BadRequest(f"node: {node_id[:100]!r} is not a node of this cluster")
    caller = request.headers.get(NODE_AUTH_HEADER, "").partition(":")[0]
    member: Member | None = request.app[MEMBER]
    if member is not None:
        # With replication `node` is a replica group, which any of its members may lead.
        if caller not in member.members[node_id]:
            raise BadRequest(f"node: the calling node {caller!r} is not a member of {node_id!r}")
    elif node_id != caller:
        raise BadRequest(f"node: {node_id!r} is not the calling node {caller!r}")
    return node_id


async def _node_and_queues(request: Request) -> tuple[str, list[str]]:
    """(node, queues) of a batch of unregistrations or ready notices: queues this node
    is the metadata owner of, or the whole batch is refused."""
    node = await _node(request)
    payload = await _json_body(request)
    queues = payload.get("queues") if isinstance(payload, dict) else None
    if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
        raise BadRequest("queues: expected a list of queue names")
    _owner_of_all(node, queues)
    return _calling_node(request, payload), queues


async def internal_unregister(request: Request) -> Response:
    """Takes a node off the metadata lists of one queue or several."""
    node_id, queues = await _node_and_queues(request)
    await (await _node(request)).unregister_many(queues, node_id)
    return _json({"ok": True})


async def internal_ready(request: Request) -> Response:
    """A node has visible messages of these queues: their long polls wake."""
    node_id, queues = await _node_and_queues(request)
    (await _node(request)).nodes_ready(queues, node_id)
    return _json({"ok": True})


async def internal_purge(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    return _json({"purged": await node.purge_local(queue)})


async def internal_depth(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    return _json(node.depth(queue))


async def internal_owned(request: Request) -> Response:
    return _json({"queues": (await _node(request)).owned_queues()})


async def internal_owned_topics(request: Request) -> Response:
    return _json({"topics": (await _node(request)).owned_topics()})


async def _registrations(request: Request) -> tuple[Any, dict[str, str], dict[str, str]]:
    """(node, queue -> first_uuid, queue -> incarnation) of a sweep or a batch register."""
    node = await _node(request)
    payload = await _json_body(request)
    queues = payload.get("queues") if isinstance(payload, dict) else None
    if not isinstance(queues, dict) or not all(isinstance(u, str) for u in queues.values()):
        raise BadRequest("queues: expected an object of queue -> first_uuid")
    known = payload.get("incarnations", {})
    if not isinstance(known, dict):
        raise BadRequest("incarnations: expected an object of queue -> incarnation")
    _owner_of_all(node, queues)
    for q, first_uuid in queues.items():
        try:
            validate_message_id(first_uuid)
        except ZdmqError:
            raise BadRequest(
                f"queues[{q!r}]: first_uuid {first_uuid[:100]!r} is not a UUID"
            ) from None
    return _calling_node(request, payload), queues, known


async def internal_sweep(request: Request) -> Response:
    node_id, queues, known = await _registrations(request)
    return _json(await (await _node(request)).sweep(node_id, queues, known))


async def internal_register(request: Request) -> Response:
    """Registers a node for one queue, or for several: the registrations it made while
    its previous call to this owner was in flight."""
    node_id, queues, known = await _registrations(request)
    return _json(await (await _node(request)).sweep(node_id, queues, known, repair=False))


async def internal_claim(request: Request) -> Response:
    """A claim by the node delivering a tied copy, on the leader of the token's group."""
    node = await _node(request)
    payload = await _json_body(request)
    token, mid = _field(payload, "token"), _field(payload, "id")
    if node.placement.owner(token) != node.id:
        raise Misrouted(f"tie {token} belongs to {node.placement.owner(token)}, not {node.id}")
    verdict, copies = await node.claim_local(token, mid)
    return _json({"verdict": verdict, "copies": [list(c) for c in copies]})


async def internal_raft(request: Request) -> Response:
    """Raft messages from another node for this node's Raft groups (zdmq/raft/driver.py):
    once the Raft round that takes them is done, 200 with this node's messages for the
    caller (a payload of the same form: its answers) or 204 when it has none; a payload
    that is not well formed, or holds a message that is not from the calling node, is
    400 and changes nothing; 404 on a node that runs no Raft groups, 503 once its Raft
    host is stopped."""
    member: Member | None = request.app[MEMBER]
    host = member.raft if member is not None else None
    if host is None:
        raise RouteNotFound(f"{request.app[NODE].id} runs no Raft groups")
    # The calling node, as its (checked) credential names it: it speaks only for itself.
    caller = request.headers.get(NODE_AUTH_HEADER, "").partition(":")[0]
    answer = await host.exchange(request.body, caller)
    if answer is None:
        return Response(status=204)
    return Response(body=answer, content_type=RAFT_CONTENT_TYPE)


async def internal_snapshot(request: Request) -> Response:
    """A piece of this member's snapshot of a replica group (zdmq/server/replicas.py):
    `index` 0 (or none) makes a new one from the group's state now, and the reply names
    its index, term and size in headers; a later piece names that index. 404 for a
    group this node is not in, or a snapshot it no longer keeps."""
    member: Member | None = request.app[MEMBER]
    if member is None or member.raft is None:
        raise RouteNotFound(f"{request.app[NODE].id} runs no Raft groups")
    offset = _int_param(request, "offset", 0, 0, 1 << 50)
    index = _int_param(request, "index", 0, 0, 1 << 62)
    chunk = await member.snapshot_chunk(request.match_info["group"], offset, index)
    return Response(
        body=chunk.data,
        content_type="application/octet-stream",
        headers={
            SNAPSHOT_INDEX_HEADER: str(chunk.index),
            SNAPSHOT_TERM_HEADER: str(chunk.term),
            SNAPSHOT_SIZE_HEADER: str(chunk.size),
        },
    )
