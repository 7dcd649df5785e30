"""A queue's calls: create, read, list and delete queues; push a message or a batch; pop,
receive, and ack, nack or extend what was received; cancel a message not yet delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from zdmq.errors import (
    BadRequest,
    BatchTooLarge,
    MessageLeased,
    MessageNotFound,
    MessageTooLarge,
    Misrouted,
    NodeUnavailable,
    ZdmqError,
)
from zdmq.models import (
    BATCH_CONTENT_TYPE,
    MAX_PRIORITY,
    MAX_RECEIVE,
    MAX_VISIBILITY_S,
    MAX_WAIT_S,
    SETTLED_KEY,
    QueueSettings,
    attributes_header,
    decode_attributes,
    decode_batch,
    dedup_message_id,
    encode_batch,
    group_receipts,
    message_to_wire,
    new_message_id,
    validate_body_type,
    validate_content_type,
    validate_group,
    validate_message_id,
)
from zdmq.server.http import Request, Response
from zdmq.server.node import LISTED_HEADER, ROUTE_HEADER, Delivery, Node, PushItem
from zdmq.server.routes.common import (
    _FRAME,
    ATTRIBUTES_HEADER,
    DEADLINE_HEADER,
    DEDUP_HEADER,
    DELAY_HEADER,
    ID_HEADER,
    MESSAGE_GROUP_HEADER,
    NO_BODY,
    PRIORITY_HEADER,
    _float_field,
    _float_param,
    _forward,
    _forwarded,
    _int_param,
    _is_frame,
    _json,
    _json_body,
    _known_fields,
    _node,
    _queue,
    _relay,
    _visible,
    _wants_frame,
)
from zdmq.server.routes.messages import (
    _batch_items,
    _fifo_ids,
    _frame_items,
    _fresh_ids,
    _group_item_id,
    _header_options,
    _store_items,
)

OCTET = "application/octet-stream"


async def list_queues(request: Request) -> Response:
    queues = await (await _node(request)).list_queues()
    return _json({"queues": _visible(request, queues)})


async def create_queue(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    owner = node.meta_owner(queue)
    if owner != node.id:
        return await _forward(node, owner, request, await request.read())
    payload = await _json_body(request)
    if payload is None:  # settings left out are an empty body, not `null`
        raise BadRequest("queue settings: expected a JSON object, got null")
    settings = QueueSettings.from_wire(
        None if payload is NO_BODY else payload,
        max_message_bytes=node.config.limits.max_message_bytes,
    )
    await node.create_queue(queue, settings)
    return _json({"queue": queue, "settings": settings.to_wire()}, status=201)


async def get_queue(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    return _json(await node.stats(queue))


async def delete_queue(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    owner = node.meta_owner(queue)
    if owner != node.id:
        return await _forward(node, owner, request, None)
    await node.drop_queue(queue)
    return Response(status=204)


async def queue_metadata(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    owner = node.meta_owner(queue)
    if owner != node.id:
        return await _forward(node, owner, request, None)
    return _json(node.metadata(queue))


async def push(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    limit = node.config.limits.max_message_bytes
    if request.content_length is not None and request.content_length > limit:
        raise MessageTooLarge(
            f"message of {request.content_length} bytes is over the {limit}-byte limit"
        )
    body = await request.read()
    if len(body) > limit:
        raise MessageTooLarge(f"message of {len(body)} bytes is over the {limit}-byte limit")
    raw_id = request.headers.get(ID_HEADER)
    dedup_id = request.headers.get(DEDUP_HEADER)
    raw_group = request.headers.get(MESSAGE_GROUP_HEADER)
    if raw_group is not None:
        return await _push_to_group(request, node, queue, body, raw_id, dedup_id, raw_group)
    derived = dedup_message_id(queue, dedup_id) if dedup_id is not None else None
    if raw_id is not None:
        # With a dedup id as well, the message keeps the caller's id, and that id is
        # deduplicated within the dedup window as a dedup id's would be.
        msg_id = validate_message_id(raw_id)
    else:
        msg_id = derived if derived is not None else new_message_id()
    ctype = request.headers.get("Content-Type")
    if ctype is not None:
        validate_content_type(ctype)
        validate_body_type(body, ctype)
    options = _header_options(request)
    owner = node.placement.owner(msg_id)
    if owner != node.id:
        if _forwarded(request):
            raise Misrouted(f"message {msg_id} belongs to {owner}, not {node.id}")
        headers = {ID_HEADER: msg_id}
        if dedup_id is not None:
            headers[DEDUP_HEADER] = dedup_id
        if ctype is not None:
            headers["Content-Type"] = ctype
        priority, deadline, delay_s, attrs = options
        if priority:
            headers[PRIORITY_HEADER] = str(priority)
        if deadline:  # a ttl_s counts from here: it travels as a deadline
            headers[DEADLINE_HEADER] = repr(deadline)
        if delay_s:
            headers[DELAY_HEADER] = repr(delay_s)
        if attrs is not None:
            headers[ATTRIBUTES_HEADER] = attributes_header(attrs)
        reply = await node.peer_call(
            owner, "POST", f"/v1/queues/{queue}/messages", data=body, headers=headers
        )
        return _relay(reply)
    item = PushItem(msg_id, body, ctype, dedup_id is not None, *options)
    [dup] = await node.push_local(queue, [item])
    return _json({"id": msg_id, "duplicate": dup}, status=200 if dup else 201)


async def _push_to_group(
    request: Request,
    node: Node,
    queue: str,
    body: bytes,
    raw_id: str | None,
    dedup_id: str | None,
    raw_group: str,
) -> Response:
    """A single push of a FIFO queue's message: stored on the owner of its group."""
    group = validate_group(raw_group)
    ctype = request.headers.get("Content-Type")
    if ctype is not None:
        validate_content_type(ctype)
        validate_body_type(body, ctype)
    owner = node.placement.owner
    await node.queue_settings(queue)  # a queue that does not exist is 404 first
    mid = _group_item_id(queue, group, raw_id, dedup_id, owner, _forwarded(request))
    item = PushItem(mid, body, ctype, dedup_id is not None, *_header_options(request), group)
    items = await _fifo_ids(node, queue, [item])
    if _forwarded(request) and owner(items[0].id) != node.id:
        raise Misrouted(f"message {items[0].id} belongs to {owner(items[0].id)}, not {node.id}")
    dups = await _store_items(node, queue, items)
    return _json({"id": items[0].id, "duplicate": dups > 0}, status=200 if dups else 201)


async def push_batch(request: Request) -> Response:
    node, queue = await _node(request), _queue(request)
    limits = node.config.limits
    owner = node.placement.owner
    if _is_frame(request):
        items = _frame_items(
            queue,
            request.body,
            limits.max_batch_messages,
            limits.max_message_bytes,
            _forwarded(request),
            owner,
        )
    else:
        items = _batch_items(
            queue,
            await _json_body(request),
            limits.max_batch_messages,
            limits.max_message_bytes,
            _forwarded(request),
            owner,
        )
    items = _fresh_ids(await _fifo_ids(node, queue, items), owner)
    if _forwarded(request) and {owner(item.id) for item in items} != {node.id}:
        raise Misrouted(f"a forwarded batch holds messages {node.id} does not own")
    dups = await _store_items(node, queue, items)
    return _json({"ids": [item.id for item in items], "duplicates": dups}, status=201)


def _deliveries(request: Request, got: list[Delivery], *, receive: bool) -> Response:
    """A pop's or receive's messages: JSON, or a batch frame when the caller asks for one."""
    if not _wants_frame(request):
        return _json({"messages": [_delivery_wire(d) for d in got]})
    if not got:
        frame = encode_batch(ids=[], bodies=[])
    else:
        ids, bodies, ctypes, receipts, counts, attrs, prios, groups = zip(*got, strict=True)
        frame = encode_batch(
            ids=ids,
            bodies=bodies,
            content_types=ctypes,
            receipts=receipts if receive else None,
            receive_counts=counts if receive else None,
            attributes=attrs,
            priorities=prios,
            groups=groups,
        )
    return Response(body=frame, content_type=BATCH_CONTENT_TYPE)


def _delivery_wire(d: Delivery) -> dict[str, Any]:
    m: dict[str, Any] = message_to_wire(d.id, d.body, d.content_type)
    if d.receipt is not None:
        m["receipt"] = d.receipt
        m["receive_count"] = d.receive_count
    if d.priority:
        m["priority"] = d.priority
    if d.attributes is not None:
        m["attributes"] = decode_attributes(d.attributes)
    if d.group is not None:
        m["group"] = d.group
    return m


# zdmq-route: "local" acts on this node's own UUID queue only; "owner" marks a long poll a
# node hands to the queue's metadata owner (routed as if the header were absent).
_ROUTES = frozenset({None, "local", "owner"})


async def _take(request: Request, *, receive: bool) -> list[Delivery]:
    node, queue = await _node(request), _queue(request)
    hi = MAX_RECEIVE if receive else node.config.limits.max_batch_messages
    limit = _int_param(request, "max", 1, 1, hi)
    lease_s = _float_param(request, "visibility_s", 0.0, MAX_VISIBILITY_S) if receive else None
    wait_s = _float_param(request, "wait_s", 0.0, MAX_WAIT_S) or 0.0
    min_priority = _int_param(request, "min_priority", 0, 0, MAX_PRIORITY)
    if request.transport is None or request.transport.is_closing():
        # The caller reset the connection (zdmq's client resets a call it gave up on, a
        # timeout or a cancel, perhaps while it waited in the socket's queue): taking
        # messages now would hand them to nobody. A caller that only half-closed is
        # still waiting, and is answered.
        raise NodeUnavailable("the caller closed the connection before the call ran")
    route = request.headers.get(ROUTE_HEADER)
    if route not in _ROUTES:
        raise BadRequest(f"{ROUTE_HEADER}: expected local or owner, got {route!r}")
    listed_raw = request.headers.get(LISTED_HEADER)
    if listed_raw not in (None, "1"):
        raise BadRequest(f"{LISTED_HEADER}: expected 1, got {listed_raw!r}")
    if route == "local":
        listed = listed_raw == "1"
        got = await node.take_local(
            queue, limit, lease_s=lease_s, receive=receive, listed=listed, min_priority=min_priority
        )
    elif _forwarded(request) and node.meta_owner(queue) != node.id:
        raise Misrouted(f"{node.id} is not the metadata owner of {queue!r}")
    else:
        got = await node.routed_take(
            queue,
            limit,
            receive=receive,
            lease_s=lease_s,
            wait_s=wait_s,
            min_priority=min_priority,
        )
    if receive and got and request.transport.is_closing():
        # The caller reset the connection while its receive ran (a long poll it gave up
        # on, a consumer shutting down): nobody will handle these, so they are visible
        # again at once rather than after their visibility timeout.
        receipts = [d.receipt for d in got if d.receipt is not None]
        await _settle_receipts(node, queue, "nack", receipts)
        raise NodeUnavailable("the caller closed the connection before its receive replied")
    return got


async def pop(request: Request) -> Response:
    got = await _take(request, receive=False)
    if "max" in request.query:
        return _deliveries(request, got, receive=False)
    if not got:
        return Response(status=204)
    d = got[0]
    headers = {ID_HEADER: d.id, "Content-Type": d.content_type or OCTET}
    if d.priority:
        headers[PRIORITY_HEADER] = str(d.priority)
    if d.attributes is not None:
        headers[ATTRIBUTES_HEADER] = attributes_header(d.attributes)
    if d.group is not None:
        headers[MESSAGE_GROUP_HEADER] = d.group
    return Response(body=d.body, headers=headers)


async def cancel(request: Request) -> Response:
    """Cancels a message not yet delivered, on the node (group) that owns its id."""
    node, queue = await _node(request), _queue(request)
    mid = validate_message_id(request.match_info["id"])
    owner = node.placement.owner(mid)
    if owner != node.id:
        return await _forward(node, owner, request, None)
    verdict = await node.cancel_local(queue, mid)
    if verdict == "leased":
        raise MessageLeased(f"message {mid} is leased: ack or nack it, or wait for its lease")
    if verdict == "unknown":
        raise MessageNotFound(
            f"queue {queue!r} holds no message {mid} waiting for delivery (never stored, "
            "delivered, or cancelled too long ago)"
        )
    return Response(status=204)


async def receive(request: Request) -> Response:
    got = await _take(request, receive=True)
    return _deliveries(request, got, receive=True)


async def _settle(request: Request, action: str) -> Response:
    node, queue = await _node(request), _queue(request)
    limit = node.config.limits.max_batch_messages
    given: Callable[[str], float | None]  # a number the caller gave, None if not given
    if _is_frame(request):
        # A frame holds the receipts only; delay_s and visibility_s are query parameters.
        receipts: list[Any] = _frame_receipts(request.body, limit)

        def given(name: str) -> float | None:
            return _float_param(request, name, 0.0, MAX_VISIBILITY_S)

    else:
        payload = await _json_body(request)
        if not isinstance(payload, dict) or not isinstance(payload.get("receipts"), list):
            raise BadRequest('expected {"receipts": ["...", ...]}')
        _known_fields(payload, _SETTLE_FIELDS[action])
        receipts = payload["receipts"]
        if len(receipts) > limit:
            raise BatchTooLarge(f"{len(receipts)} receipts is over the batch limit of {limit}")

        def given(name: str) -> float | None:
            # The number may come as a field of the body or, as with a frame, in the query;
            # given in both (each checked), the body's is the one used.
            query = _float_param(request, name, 0.0, MAX_VISIBILITY_S)
            if name not in payload:
                return query
            return _float_field(payload, name, 0.0, MAX_VISIBILITY_S, 0.0)

    delay_s = given("delay_s") or 0.0
    visibility_s = 0.0
    if action == "extend":
        vis = given("visibility_s")
        if vis is None:  # a lease as long as a receive's that gives none
            vis = (await node.queue_settings(queue)).visibility_timeout_s
        visibility_s = vis
    if not receipts:
        raise BadRequest("receipts: expected at least one receipt")
    if _forwarded(request):
        by_owner, _ = group_receipts(receipts, node.placement.owner)
        if set(by_owner) - {node.id}:
            raise Misrouted(f"a forwarded {action} holds receipts {node.id} does not own")
    done, failed = await _settle_receipts(
        node, queue, action, receipts, delay_s=delay_s, visibility_s=visibility_s
    )
    return _json(
        {
            SETTLED_KEY[action]: done,
            "failed": [{"receipt": r, "code": c} for r, c in failed.items()],
        }
    )


# The fields of a JSON ack, nack or extend (ack and extend ignore delay_s, but check it).
_SETTLE_FIELDS = {
    "ack": frozenset({"receipts", "delay_s"}),
    "nack": frozenset({"receipts", "delay_s"}),
    "extend": frozenset({"receipts", "delay_s", "visibility_s"}),
}


def _frame_receipts(raw: bytes, limit: int) -> list[Any]:
    b = decode_batch(raw, max_count=limit)
    others = (b.ids, b.bodies, b.receive_counts, b.content_types, b.dedup_ids)
    if (b.count and b.receipts is None) or any(c is not None for c in others):
        raise BadRequest("an ack, nack or extend batch frame has a receipts column only")
    receipts = b.receipts or []
    if None in receipts:
        raise BadRequest(f"receipts[{receipts.index(None)}]: missing")
    return receipts


async def _settle_receipts(
    node: Node,
    queue: str,
    action: str,
    receipts: list[Any],
    *,
    delay_s: float = 0.0,
    visibility_s: float = 0.0,
) -> tuple[int, dict[str, str]]:
    """Acks, nacks or extends receipts on the nodes that store their messages (this
    one locally, the others with one call each); returns (done, failed receipt -> code)."""
    by_owner, failed = group_receipts(receipts, node.placement.owner)

    async def settle_on(owner: str, part: list[tuple[str, str, str]]) -> int:
        if owner == node.id:
            done, why = await node.settle_local(
                queue, action, part, delay_s=delay_s, visibility_s=visibility_s
            )
            failed.update(why)
            return done
        # A frame of the receipts; the numbers go in the query string.
        params = {"delay_s": repr(delay_s)}
        if action == "extend":
            params["visibility_s"] = repr(visibility_s)
        try:
            reply = await node.peer_call(
                owner,
                "POST",
                f"/v1/queues/{queue}/{action}",
                data=encode_batch(receipts=[r for r, _, _ in part]),
                headers=_FRAME,
                params=params,
            )
        except ZdmqError as e:
            failed.update((r, e.code) for r, _, _ in part)
            return 0
        j = reply.json()
        failed.update((f["receipt"], f["code"]) for f in j["failed"])
        return int(j[SETTLED_KEY[action]])

    done = await asyncio.gather(*(settle_on(o, part) for o, part in by_owner.items()))
    return sum(done), failed


async def ack(request: Request) -> Response:
    return await _settle(request, "ack")


async def nack(request: Request) -> Response:
    return await _settle(request, "nack")


async def extend(request: Request) -> Response:
    return await _settle(request, "extend")
