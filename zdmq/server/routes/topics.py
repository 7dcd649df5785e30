"""Calls that store copies of a message in several queues: topics, their subscriptions and
publishes; a broadcast to named queues; tied messages, whose copies are delivered once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from zdmq.errors import (
    BadRequest,
    BatchTooLarge,
    FifoConflict,
    InvalidMessage,
    MessageTooLarge,
    Misrouted,
    PublishIncomplete,
    QueueNotFound,
    TieNotFound,
    ZdmqError,
)
from zdmq.models import (
    QueueSettings,
    copy_message_id,
    decode_batch,
    new_message_id,
    new_message_ids,
    validate_body_type,
    validate_content_type,
    validate_queue_name,
)
from zdmq.server.http import Request, Response
from zdmq.server.node import Node, PushItem
from zdmq.server.routes.common import (
    ADMIN,
    DEDUP_HEADER,
    ID_HEADER,
    WRITE,
    _check_rights,
    _forward,
    _forwarded,
    _is_frame,
    _json,
    _json_body,
    _known_fields,
    _node,
    _relay,
    _visible,
)
from zdmq.server.routes.messages import (
    _MESSAGE_FIELDS,
    _PUBLISH_FIELDS,
    _TIED_FIELDS,
    _batch_items,
    _frame_items,
    _header_options,
    _store_items,
    _tie_token,
)


# ---- topics and broadcast -----------------------------------------------------------------
# A topic's record lives with the metadata owner of its name (its own namespace: a topic
# and a queue may share a name). A publish goes to that owner, which reads the
# subscriptions and stores a copy of each message in every subscribed queue, each copy an
# ordinary push to the queue (docs/design.md, "Topics and broadcast").
def _topic(request: Request) -> str:
    return validate_queue_name(request.match_info["topic"])


async def _on_topic_owner(request: Request) -> tuple[Node, str, Response | None]:
    """(node, topic, None) on the topic's metadata owner; elsewhere the forwarded call's
    reply in place of None."""
    node, topic = await _node(request), _topic(request)
    owner = node.meta_owner(topic)
    if owner != node.id:
        return node, topic, await _forward(node, owner, request, await request.read())
    return node, topic, None


async def list_topics(request: Request) -> Response:
    topics = await (await _node(request)).list_topics()
    return _json({"topics": _visible(request, topics)})


async def create_topic(request: Request) -> Response:
    node, topic, forwarded = await _on_topic_owner(request)
    if forwarded is not None:
        return forwarded
    if await request.read():
        raise BadRequest("a topic takes no body")
    await node.create_topic(topic)
    return _json({"topic": topic, "subscriptions": []}, status=201)


async def get_topic(request: Request) -> Response:
    node, topic, forwarded = await _on_topic_owner(request)
    return forwarded or _json(node.topic(topic))


async def delete_topic(request: Request) -> Response:
    node, topic, forwarded = await _on_topic_owner(request)
    if forwarded is not None:
        return forwarded
    await node.drop_topic(topic)
    return Response(status=204)


async def subscribe(request: Request) -> Response:
    payload = await _json_body(request)
    if not isinstance(payload, dict) or set(payload) - {"queue", "settings"}:
        raise BadRequest('expected {"queue": "...", "settings": {...}} (settings optional)')
    queue = validate_queue_name(payload.get("queue"))
    # Checked before the call may go to the topic's owner, which takes the forwarding
    # node's credential for every right.
    _check_rights(request, [queue], ADMIN)
    node, topic, forwarded = await _on_topic_owner(request)
    if forwarded is not None:
        return forwarded
    raw = payload.get("settings")
    settings = None
    if raw is not None:
        settings = QueueSettings.from_wire(
            raw, max_message_bytes=node.config.limits.max_message_bytes
        )
    added, created = await node.subscribe(topic, queue, settings)
    return _json(
        {"topic": topic, "queue": queue, "subscribed": added, "queue_created": created},
        status=201 if added else 200,
    )


async def unsubscribe(request: Request) -> Response:
    queue = validate_queue_name(request.match_info["queue"])
    # Admin on the queue too, as to subscribe it: an unsubscribe purges the queue.
    _check_rights(request, [queue], ADMIN)
    node, topic, forwarded = await _on_topic_owner(request)
    if forwarded is not None:
        return forwarded
    purged, unavailable = await node.unsubscribe(topic, queue)
    return _json({"topic": topic, "queue": queue, "purged": purged, "unavailable": unavailable})


class _Copy(NamedTuple):
    """One message to fan out: its body, content type and delivery options (`item`, whose
    id each copy replaces), and the dedup id its copies' ids derive from (None: fresh
    ids, so a retry stores new copies)."""

    item: PushItem
    dedup_id: str | None


async def _publish_items(request: Request, node: Node) -> list[_Copy]:
    """The messages of a publish: one (the body, as a queue push) or a batch (the JSON
    or the frame of a queue batch). Message ids cannot be given: each copy has its own."""

    limits = node.config.limits
    if request.path.endswith("/messages"):
        body = await request.read()
        if len(body) > limits.max_message_bytes:
            raise MessageTooLarge(
                f"message of {len(body)} bytes is over the {limits.max_message_bytes}-byte limit"
            )
        if ID_HEADER in request.headers:
            raise BadRequest(f"a publish takes {DEDUP_HEADER}, not {ID_HEADER}")
        dedup_id = request.headers.get(DEDUP_HEADER)
        if dedup_id is not None:
            copy_message_id("", "q", dedup_id)  # checks it
        ctype = request.headers.get("Content-Type")
        if ctype is not None:
            validate_content_type(ctype)
            validate_body_type(body, ctype)
        return [_Copy(PushItem("", body, ctype, False, *_header_options(request)), dedup_id)]
    if _is_frame(request):
        b = decode_batch(request.body, max_count=limits.max_batch_messages)
        if b.ids is not None and any(i is not None for i in b.ids):
            raise BadRequest("a publish batch frame takes dedup_ids, not ids")
        items = _frame_items(
            "q",
            request.body,
            limits.max_batch_messages,
            limits.max_message_bytes,
            False,
            node.placement.owner,
        )
        dedups = b.dedup_ids or [None] * b.count
    else:
        payload = await _json_body(request)
        raw = payload.get("messages") if isinstance(payload, dict) else None
        if isinstance(raw, list) and any(isinstance(m, dict) and "id" in m for m in raw):
            raise BadRequest("a publish batch takes dedup_id, not id: each copy has its own")
        for m in raw if isinstance(raw, list) else ():
            if isinstance(m, dict):
                _no_group_field(m)
        items = _batch_items(
            "q",
            payload,
            limits.max_batch_messages,
            limits.max_message_bytes,
            False,
            node.placement.owner,
            _PUBLISH_FIELDS,
        )
        dedups = [m.get("dedup_id") for m in raw] if isinstance(raw, list) else []
    _no_groups(items)
    return [_Copy(item, d) for item, d in zip(items, dedups, strict=True)]


def _no_fifo(queues: Sequence[str], found: Sequence[Any]) -> None:
    """Copies of a broadcast or a tie have no group: none may go to a FIFO queue (409,
    before any is stored). `found` is each queue's metadata (or the error reading it)."""
    fifo = [
        q
        for q, meta in zip(queues, found, strict=True)
        if isinstance(meta, dict) and meta["settings"].get("fifo")
    ]
    if fifo:
        raise FifoConflict(
            f"queue(s) {sorted(set(fifo))} are FIFO queues, whose messages need a group: "
            "nothing was stored"
        )


async def _fit_queues(node: Node, queues: Sequence[str], items: Sequence[PushItem]) -> None:
    """Copies of a publish, broadcast or tie go to queues that may each have a size limit
    of their own (max_message_bytes): one that a copy would be over is 413, naming the
    queues, before anything is stored, rather than a publish stored in the others. (A
    queue whose settings cannot be read is left to the store, which reports it.)"""
    largest = max([len(item.body) for item in items], default=0)
    found = await asyncio.gather(*(node.queue_settings(q) for q in queues), return_exceptions=True)
    over = sorted(
        {
            q
            for q, s in zip(queues, found, strict=True)
            if isinstance(s, QueueSettings)
            and s.max_message_bytes is not None
            and largest > s.max_message_bytes
        }
    )
    if over:
        raise MessageTooLarge(
            f"a message of {largest} bytes is over the max_message_bytes of queue(s) {over}: "
            "nothing was stored"
        )


def _no_group_field(message: dict[str, Any]) -> None:
    """A publish's or broadcast's message takes no group (FIFO queues take pushes only)."""
    if "group" in message:
        raise BadRequest("a publish or broadcast takes no group: FIFO queues take pushes only")


def _no_groups(items: Iterable[PushItem]) -> None:
    """Copies of a publish or broadcast go to plain queues only: they take no group."""
    if any([item.group is not None for item in items]):
        raise BadRequest("a publish or broadcast takes no group: FIFO queues take pushes only")


async def _fan_out(
    node: Node, source: str, queues: Sequence[str], copies: list[_Copy]
) -> dict[str, Any]:
    """Stores a copy of every message in every queue, all queues in parallel; replies once
    every copy is committed. A copy's id derives from the message's dedup id, `source`
    and the queue (copy_message_id), so a retry stores none twice; without a dedup id
    it is fresh. A queue that does not exist (deleted meanwhile), or is now a FIFO queue
    (deleted and created again as one: its messages need a group), is skipped and named;
    any other failure fails the whole call (PublishIncomplete naming the queues)."""

    def items_for(queue: str) -> list[PushItem]:
        fresh = iter(new_message_ids(sum(c.dedup_id is None for c in copies), node.placement.owner))
        return [
            c.item._replace(id=copy_message_id(source, queue, c.dedup_id), dedup=True)
            if c.dedup_id is not None
            else c.item._replace(id=next(fresh), dedup=False)
            for c in copies
        ]

    await _fit_queues(node, queues, [c.item for c in copies])
    parts = {q: items_for(q) for q in queues}
    results = await asyncio.gather(
        *(_store_items(node, q, part) for q, part in parts.items()), return_exceptions=True
    )
    missing: list[str] = []
    failed: list[dict[str, str]] = []
    stored: dict[str, Any] = {}
    for (queue, part), r in zip(parts.items(), results, strict=True):
        if isinstance(r, QueueNotFound | FifoConflict):
            missing.append(queue)
        elif isinstance(r, ZdmqError):
            failed.append({"queue": queue, "code": r.code, "message": r.message})
        elif isinstance(r, BaseException):
            raise r
        else:
            stored[queue] = {"ids": [item.id for item in part], "duplicates": r}
    if failed:
        names = ", ".join(f["queue"] for f in failed)
        raise PublishIncomplete(
            f"copies not stored in {names} (the others are): retry with the same dedup id(s)",
            failed=failed,
        )
    return {"count": len(stored), "messages": len(copies), "queues": stored, "missing": missing}


def _fanned_out(result: dict[str, Any], **head: Any) -> Response:
    fresh = any(q["duplicates"] < result["messages"] for q in result["queues"].values())
    return _json({**head, **result}, status=201 if fresh else 200)


async def publish(request: Request) -> Response:
    node, topic, forwarded = await _on_topic_owner(request)
    if forwarded is not None:
        return forwarded
    copies = await _publish_items(request, node)
    queues = await node.publish_targets(topic)
    return _fanned_out(await _fan_out(node, topic, queues, copies), topic=topic)


async def broadcast(request: Request) -> Response:
    """One message into each of the named queues: every queue must exist (checked first;
    404 naming the missing ones, nothing stored), then the same fan-out as a publish."""
    node = await _node(request)
    payload = await _json_body(request)
    queues = payload.get("queues") if isinstance(payload, dict) else None
    if not isinstance(queues, list) or not queues:
        raise BadRequest('expected {"queues": ["...", ...], "body": ..., ...}')
    if len(queues) > node.config.limits.max_batch_messages:
        raise BatchTooLarge(f"{len(queues)} queues is over the batch limit")
    for q in queues:
        validate_queue_name(q)
    queues = list(dict.fromkeys(queues))  # a queue named twice gets one copy
    _check_rights(request, queues, WRITE)
    message = {k: v for k, v in payload.items() if k != "queues"}
    if "id" in message:
        raise BadRequest("a broadcast takes dedup_id, not id: each copy has its own")
    _no_group_field(message)
    [item] = _batch_items(
        "q",
        {"messages": [message]},
        1,
        node.config.limits.max_message_bytes,
        False,
        node.placement.owner,
        _PUBLISH_FIELDS,
    )
    _no_groups([item])
    copy = _Copy(item, message.get("dedup_id"))
    found = await asyncio.gather(
        *(node.metadata_via_owner(q) for q in queues), return_exceptions=True
    )
    missing = [q for q, r in zip(queues, found, strict=True) if isinstance(r, QueueNotFound)]
    if missing:
        raise QueueNotFound(f"queue(s) {missing} do not exist: nothing was stored")
    for r in found:
        if isinstance(r, BaseException):
            raise r
    _no_fifo(queues, found)
    return _fanned_out(await _fan_out(node, "", queues, [copy]))


# ---- tied messages --------------------------------------------------------------------------
_TIE_NAMESPACE = "tie:"  # a tie's copies' ids: copy_message_id(tie: + token, queue, index)


async def push_tied(request: Request) -> Response:
    """Stores copies of a message in several queues under one tie token, recorded first on
    the group that owns the token (a call elsewhere is forwarded there)."""
    node = await _node(request)
    payload = await _json_body(request)
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        raise BadRequest('expected {"messages": [{"queue": ..., "body": ...}, ...]}')
    _known_fields(payload, frozenset({"token", "messages"}))
    raw = payload["messages"]
    if not 1 <= len(raw) <= node.config.limits.max_batch_messages:
        raise BadRequest("messages: expected 1..max_batch_messages copies")
    queues: list[str] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidMessage(f"messages[{i}]: expected an object")
        for key in ("id", "dedup_id", "group"):
            if key in m:
                raise BadRequest(f"messages[{i}]: a tied copy takes no {key}")
        _known_fields(m, _TIED_FIELDS, f"messages[{i}]: ")
        queues.append(validate_queue_name(m.get("queue")))
    # A queue may hold several copies of a tie: as everywhere, one of them is delivered.
    _check_rights(request, queues, WRITE)
    token = _tie_token(payload["token"]) if payload.get("token") is not None else None
    if token is None:
        token = new_message_id().replace("-", "")
    owner = node.placement.owner(token)
    if owner != node.id:
        if _forwarded(request):
            raise Misrouted(f"tie {token} belongs to {owner}, not {node.id}")
        reply = await node.peer_call(owner, "POST", "/v1/tied", json={**payload, "token": token})
        return _relay(reply)
    items: list[PushItem] = []
    for i, m in enumerate(raw):
        body = {k: v for k, v in m.items() if k != "queue"}
        try:
            [item] = _batch_items(
                queues[i],
                {"messages": [body]},
                1,
                node.config.limits.max_message_bytes,
                False,
                node.placement.owner,
                _MESSAGE_FIELDS,
            )
        except ZdmqError as e:
            e.message = f"messages[{i}]: {e.message.removeprefix('messages[0]: ')}"
            raise
        mid = copy_message_id(_TIE_NAMESPACE + token, queues[i], str(i))
        items.append(item._replace(id=mid, dedup=True, tie=token))
    found = await asyncio.gather(
        *(node.metadata_via_owner(q) for q in queues), return_exceptions=True
    )
    missing = [q for q, r in zip(queues, found, strict=True) if isinstance(r, QueueNotFound)]
    if missing:
        raise QueueNotFound(f"queue(s) {missing} do not exist: nothing was stored")
    _no_fifo(queues, found)
    await _fit_queues(node, queues, items)
    copies = [(q, item.id) for q, item in zip(queues, items, strict=True)]
    await node.tie_local(token, copies)  # before any copy: every stored copy has its tie
    results = await asyncio.gather(
        *(_store_items(node, q, [item]) for q, item in zip(queues, items, strict=True)),
        return_exceptions=True,
    )
    failed = []
    for q, r in zip(queues, results, strict=True):
        if isinstance(r, ZdmqError):
            failed.append({"queue": q, "code": r.code, "message": r.message})
        elif isinstance(r, BaseException):
            raise r
    if failed:
        names = ", ".join(f["queue"] for f in failed)
        raise PublishIncomplete(
            f"tie {token}: copies not stored in {names} (the others are): retry with the "
            "same token",
            failed=failed,
        )
    return _json(
        {
            "token": token,
            "copies": [{"queue": q, "id": mid} for q, mid in copies],
            "duplicates": sum(r for r in results if isinstance(r, int)),
        },
        status=201,
    )


async def cancel_tied(request: Request) -> Response:
    """Cancels tie `token`: no copy of it is delivered from now on, and every copy still
    waiting is deleted."""
    node = await _node(request)
    token = _tie_token(request.match_info["token"])
    owner = node.placement.owner(token)
    if owner != node.id:
        # Only the owner knows the tie's queues: it checks the caller's token.
        return await _forward(node, owner, request, None, on_behalf=True)
    tie = node.state.ties.get(token)
    if tie is not None:
        _check_rights(request, [q for q, _ in tie.copies], WRITE)
    result = await node.untie_local(token)
    if result is None:
        raise TieNotFound(f"no tie {token} (never made, or forgotten)")
    copies, winner = result
    waiting = [(q, mid) for q, mid in copies if mid != winner]
    verdicts = await node._cancel_copies(waiting)
    return _json(
        {
            "token": token,
            "delivered": winner,
            "cancelled": sum(v == "cancelled" for v in verdicts),
        }
    )
