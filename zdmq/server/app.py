"""The node's HTTP API (REST v1): parse, check, call `Node`, reply.

Any node accepts any call. Calls that belong to another node (a push whose id hashes
elsewhere, a create or delete of a queue whose metadata lives elsewhere) are forwarded
once, marked with `zdmq-forwarded`; a forwarded call that still lands on a non-owner is
refused with 421 rather than bounced again. Paths under `/v1/internal/` are the
node-to-node protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from zdmq import _http
from zdmq.config import ClusterConfig
from zdmq.errors import (
    BadRequest,
    BatchTooLarge,
    InternalError,
    InvalidMessage,
    MessageTooLarge,
    MethodNotAllowed,
    Misrouted,
    NodeUnavailable,
    RouteNotFound,
    ZdmqError,
)
from zdmq.models import (
    decode_body,
    message_to_wire,
    new_message_id,
    validate_message_id,
    validate_queue_name,
)
from zdmq.server.node import FORWARDED_HEADER, LISTED_HEADER, ROUTE_HEADER, Node, PushItem
from zdmq.server.storage import open_storage

__all__ = ["NODE", "make_app"]

log = logging.getLogger("zdmq.http")

NODE = web.AppKey("node", Node)
ID_HEADER = "zdmq-id"
OCTET = "application/octet-stream"


# ---- replies and request parsing ----------------------------------------------------------
def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _error(err: ZdmqError) -> web.Response:
    return _json(err.to_wire(), status=err.status)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ZdmqError as e:
        return _error(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        mapped: ZdmqError
        if e.status == 404:
            mapped = RouteNotFound(f"no route {request.method} {request.path}")
        elif e.status == 405:
            mapped = MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        elif e.status == 413:
            mapped = MessageTooLarge(e.text or "request body too large")
        else:
            mapped = BadRequest(e.text or e.reason)
        return _error(mapped)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(InternalError(f"{type(e).__name__}: {e}"))


def _queue(request: web.Request) -> str:
    return validate_queue_name(request.match_info["queue"])


def _int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected an integer in {lo}..{hi}, got {raw!r}") from None
    if not lo <= value <= hi:
        raise BadRequest(f"{name}: expected an integer in {lo}..{hi}, got {value}")
    return value


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None


def _forwarded(request: web.Request) -> bool:
    return FORWARDED_HEADER in request.headers


def _relay(reply: _http.Reply) -> web.Response:
    """A forwarded call's reply, passed back as it came."""
    headers = {}
    for name in ("Content-Type", ID_HEADER):
        if name in reply.headers:
            headers[name] = reply.headers[name]
    return web.Response(status=reply.status, body=reply.body or None, headers=headers)


async def _forward(
    node: Node, owner: str, request: web.Request, body: bytes | None
) -> web.Response:
    if _forwarded(request):
        raise Misrouted(f"{node.id} does not own this call; {owner} does")
    headers = {}
    for name in ("Content-Type", ID_HEADER):
        if name in request.headers:
            headers[name] = request.headers[name]
    reply = await node.peer_call(
        owner, request.method, request.rel_url.path_qs, data=body, headers=headers
    )
    return _relay(reply)


# ---- public API --------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    node = request.app[NODE]
    failed = node.storage.failed
    return _json(
        {
            "node": node.id,
            "status": "failed" if failed else "ok",
            "detail": failed,
            "messages": len(node.state.messages),
            "queues_owned": len(node.state.meta),
            "uptime_s": round(time.time() - node.started_at, 3),
            "counters": dict(node.counters),
            "storage": {"commits": node.storage.commits, "ops": node.storage.ops_written},
        },
        status=503 if failed else 200,
    )


async def cluster(request: web.Request) -> web.Response:
    config = request.app[NODE].config
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


async def openapi(request: web.Request) -> web.Response:
    text = resources.files("zdmq.server").joinpath("openapi.yaml").read_bytes()
    return web.Response(body=text, content_type="application/yaml")


async def list_queues(request: web.Request) -> web.Response:
    return _json({"queues": await request.app[NODE].list_queues()})


async def create_queue(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    owner = node.meta_owner(queue)
    if owner != node.id:
        return await _forward(node, owner, request, await request.read())
    await node.create_queue(queue)
    return _json({"queue": queue}, status=201)


async def get_queue(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    return _json(await node.stats(queue))


async def delete_queue(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    owner = node.meta_owner(queue)
    if owner != node.id:
        return await _forward(node, owner, request, None)
    await node.drop_queue(queue)
    return web.Response(status=204)


async def queue_metadata(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    owner = node.meta_owner(queue)
    if owner != node.id:
        return await _forward(node, owner, request, None)
    return _json(node.metadata(queue))


async def push(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    limit = node.config.limits.max_message_bytes
    if request.content_length is not None and request.content_length > limit:
        raise MessageTooLarge(
            f"message of {request.content_length} bytes is over the {limit}-byte limit"
        )
    body = await request.read()
    if len(body) > limit:
        raise MessageTooLarge(f"message of {len(body)} bytes is over the {limit}-byte limit")
    raw_id = request.headers.get(ID_HEADER)
    msg_id = validate_message_id(raw_id) if raw_id is not None else new_message_id()
    owner = node.placement.owner(msg_id)
    if owner != node.id:
        if _forwarded(request):
            raise Misrouted(f"message {msg_id} belongs to {owner}, not {node.id}")
        headers = {ID_HEADER: msg_id}
        if "Content-Type" in request.headers:
            headers["Content-Type"] = request.headers["Content-Type"]
        reply = await node.peer_call(
            owner, "POST", f"/v1/queues/{queue}/messages", data=body, headers=headers
        )
        return _relay(reply)
    ctype = request.headers.get("Content-Type")
    await node.push_local(queue, [(msg_id, body, ctype)])
    return _json({"id": msg_id}, status=201)


def _batch_items(payload: Any, max_messages: int, max_bytes: int) -> list[PushItem]:
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        raise BadRequest('expected {"messages": [{"body": ..., "encoding": ...}, ...]}')
    raw = payload["messages"]
    if not raw:
        raise BadRequest("messages: expected at least one message")
    if len(raw) > max_messages:
        raise BatchTooLarge(f"{len(raw)} messages is over the batch limit of {max_messages}")
    items: list[PushItem] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidMessage(f"messages[{i}]: expected an object")
        try:
            body = decode_body(m.get("body"), m.get("encoding", "utf-8"), max_bytes)
            mid = m.get("id")
            mid = validate_message_id(mid) if mid is not None else new_message_id()
        except ZdmqError as e:
            e.message = f"messages[{i}]: {e.message}"
            raise
        ctype = m.get("content_type")
        if ctype is not None and not isinstance(ctype, str):
            raise InvalidMessage(f"messages[{i}].content_type: expected a string")
        items.append((mid, body, ctype))
    return items


def _batch_wire(items: list[PushItem]) -> dict[str, Any]:
    return {"messages": [message_to_wire(mid, body, ctype) for mid, body, ctype in items]}


async def push_batch(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    limits = node.config.limits
    items = _batch_items(
        await _json_body(request), limits.max_batch_messages, limits.max_message_bytes
    )
    by_owner: defaultdict[str, list[PushItem]] = defaultdict(list)
    for item in items:
        by_owner[node.placement.owner(item[0])].append(item)
    if _forwarded(request) and set(by_owner) != {node.id}:
        raise Misrouted(f"a forwarded batch holds messages {node.id} does not own")

    async def store(owner: str, part: list[PushItem]) -> None:
        if owner == node.id:
            await node.push_local(queue, part)
        else:
            await node.peer_call(owner, "POST", f"/v1/queues/{queue}/batch", json=_batch_wire(part))

    await asyncio.gather(*(store(o, part) for o, part in by_owner.items()))
    return _json({"ids": [mid for mid, _, _ in items]}, status=201)


async def pop(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    batch = "max" in request.query
    limit = _int_param(request, "max", 1, 1, node.config.limits.max_batch_messages)
    if request.transport is None or request.transport.is_closing():
        # The caller hung up (a pop that timed out while it waited in the socket's queue):
        # removing messages now would hand them to nobody.
        raise NodeUnavailable("the caller closed the connection before the pop ran")
    if request.headers.get(ROUTE_HEADER) == "local" or _forwarded(request):
        got = await node.pop_local(queue, limit, listed=request.headers.get(LISTED_HEADER) == "1")
    else:
        got = await node.routed_pop(queue, limit)
    if batch:
        return _json({"messages": [message_to_wire(mid, m.body, m.content_type) for mid, m in got]})
    if not got:
        return web.Response(status=204)
    mid, m = got[0]
    return web.Response(
        body=m.body, headers={ID_HEADER: mid, "Content-Type": m.content_type or OCTET}
    )


# ---- node-to-node protocol ----------------------------------------------------------------
def _owner_only(node: Node, queue: str) -> None:
    if node.meta_owner(queue) != node.id:
        raise Misrouted(f"{node.id} is not the metadata owner of {queue!r}")


def _field(payload: Any, name: str) -> str:
    if not isinstance(payload, dict) or not isinstance(payload.get(name), str):
        raise BadRequest(f"{name}: expected a string")
    return str(payload[name])


async def internal_register(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    _owner_only(node, queue)
    payload = await _json_body(request)
    inc = await node.register(queue, _field(payload, "node"), _field(payload, "first_uuid"))
    return _json({"incarnation": inc})


async def internal_unregister(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    _owner_only(node, queue)
    await node.unregister(queue, _field(await _json_body(request), "node"))
    return _json({"ok": True})


async def internal_purge(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    return _json({"purged": await node.purge_local(queue)})


async def internal_depth(request: web.Request) -> web.Response:
    node, queue = request.app[NODE], _queue(request)
    return _json({"depth": node.depth(queue)})


async def internal_owned(request: web.Request) -> web.Response:
    return _json({"queues": request.app[NODE].owned_queues()})


async def internal_sweep(request: web.Request) -> web.Response:
    node = request.app[NODE]
    payload = await _json_body(request)
    queues = payload.get("queues") if isinstance(payload, dict) else None
    if not isinstance(queues, dict):
        raise BadRequest("queues: expected an object of queue -> first_uuid")
    for q in queues:
        validate_queue_name(q)
        _owner_only(node, q)
    return _json({"missing": await node.sweep(_field(payload, "node"), queues)})


# ---- the application ----------------------------------------------------------------------
def make_app(config: ClusterConfig, node_id: str, *, repair: bool = True) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=config.limits.max_request_bytes)
    node = Node(config, node_id, open_storage(config.durability, config.node_data_dir(node_id)))
    app[NODE] = node

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await node.start()
        sweeper = asyncio.create_task(node.repair_loop()) if repair else None
        yield
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        await node.stop()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_get("/v1/health", health)
    r.add_get("/v1/cluster", cluster)
    r.add_get("/v1/openapi.yaml", openapi)
    r.add_get("/v1/queues", list_queues)
    r.add_put("/v1/queues/{queue}", create_queue)
    r.add_get("/v1/queues/{queue}", get_queue)
    r.add_delete("/v1/queues/{queue}", delete_queue)
    r.add_get("/v1/queues/{queue}/metadata", queue_metadata)
    r.add_post("/v1/queues/{queue}/messages", push)
    r.add_post("/v1/queues/{queue}/batch", push_batch)
    r.add_post("/v1/queues/{queue}/pop", pop)
    r.add_post("/v1/internal/queues/{queue}/register", internal_register)
    r.add_post("/v1/internal/queues/{queue}/unregister", internal_unregister)
    r.add_post("/v1/internal/queues/{queue}/purge", internal_purge)
    r.add_get("/v1/internal/queues/{queue}/depth", internal_depth)
    r.add_get("/v1/internal/owned-queues", internal_owned)
    r.add_post("/v1/internal/sweep", internal_sweep)
    return app
