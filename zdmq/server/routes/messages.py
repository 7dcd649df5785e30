"""The messages a call stores (a push, a publish, a tied push): read from headers, JSON or a
binary batch frame, checked, given the ids they are stored under (FIFO groups, dedup ids,
fresh ids), and stored on the nodes that own those ids."""

from __future__ import annotations

import asyncio
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import orjson

from zdmq.errors import (
    BadRequest,
    BatchTooLarge,
    FifoConflict,
    InvalidAttributes,
    InvalidMessage,
    MessageTooLarge,
    ZdmqError,
)
from zdmq.models import (
    MAX_PRIORITY,
    Batch,
    content_dedup_id,
    decode_attributes,
    decode_batch,
    decode_body,
    dedup_message_id,
    delivery_options,
    encode_attributes,
    encode_batch,
    fifo_message_id,
    group_key,
    is_json_type,
    message_to_wire,
    new_message_ids,
    new_message_ids_on,
    validate_body_type,
    validate_content_type,
    validate_group,
    validate_message_id,
)
from zdmq.server.http import Request
from zdmq.server.node import Node, PushItem
from zdmq.server.routes.common import (
    _DECIMAL,
    _FRAME,
    ATTRIBUTES_HEADER,
    DEADLINE_HEADER,
    DELAY_HEADER,
    PRIORITY_HEADER,
    TTL_HEADER,
    _integer,
    _known_fields,
)


def _group_item_id(
    queue: str,
    group: str,
    mid: Any,
    dedup_id: Any,
    owner: Callable[[str], str],
    forwarded: bool,
) -> str:
    """The id a FIFO message is stored under: the one its dedup id maps to on its group's
    owner, or "" (drawn later: `_fifo_ids`). Only a node forwarding the message gives
    its id: a client's own id would land anywhere, not on the group's owner (409
    FifoConflict: no queue takes a message with both a group and an id)."""
    if mid is not None and not forwarded:
        raise FifoConflict(
            "a message with a group (a FIFO queue's message) takes a dedup_id, not an id: "
            "its id is drawn on the node that owns its group"
        )
    if dedup_id is not None:
        if mid is not None:
            return validate_message_id(mid)
        return fifo_message_id(queue, group, dedup_id, owner, owner(group_key(queue, group)))
    return validate_message_id(mid) if mid is not None else ""


async def _fifo_ids(node: Node, queue: str, items: list[PushItem]) -> list[PushItem]:
    """The batch with ids for its FIFO messages that came without one: from a hash of
    the body on a queue with content_based_dedup (then deduplicated like a dedup id),
    else fresh; either way ids that land on the owner of the message's group. Refuses
    (FifoConflict) groups on a queue that is not FIFO, and a FIFO batch with a message
    without one."""
    if all([item.group is None for item in items]):
        return items
    settings = await node.queue_settings(queue)
    if not settings.fifo:
        raise FifoConflict(f"queue {queue!r} is not a FIFO queue: its messages take no group")
    owner = node.placement.owner
    out: list[PushItem] = []
    for i, item in enumerate(items):
        if item.group is None:
            raise FifoConflict(f"messages[{i}]: queue {queue!r} is a FIFO queue: give a group")
        if item.id:
            out.append(item)
            continue
        home = owner(group_key(queue, item.group))
        if settings.content_based_dedup:
            dedup = content_dedup_id(item.body)
            mid = fifo_message_id(queue, item.group, dedup, owner, home)
            out.append(item._replace(id=mid, dedup=True))
        else:
            [mid] = new_message_ids_on(1, owner, home)
            out.append(item._replace(id=mid))
    return out


def _header_number(request: Request, name: str) -> float | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    if not _DECIMAL.fullmatch(raw):
        raise BadRequest(f"{name}: expected a number, got {raw[:40]!r}")
    return float(raw)


def _header_options(request: Request) -> tuple[int, float, float, str | None]:
    """(priority, deadline, delay_s, attributes) of a single push, from its headers."""
    headers = request.headers
    raw_priority = headers.get(PRIORITY_HEADER)
    priority: Any = None
    if raw_priority is not None:
        priority = _integer(PRIORITY_HEADER, raw_priority, 0, MAX_PRIORITY)
    p, d, delay = delivery_options(
        priority=priority,
        deadline=_header_number(request, DEADLINE_HEADER),
        ttl_s=_header_number(request, TTL_HEADER),
        delay_s=_header_number(request, DELAY_HEADER),
        now=time.time(),
    )
    attrs = None
    raw_attrs = headers.get(ATTRIBUTES_HEADER)
    if raw_attrs is not None:
        try:
            parsed = orjson.loads(raw_attrs)
        except orjson.JSONDecodeError:
            raise InvalidAttributes(f"{ATTRIBUTES_HEADER}: expected a JSON object") from None
        attrs = encode_attributes(parsed)
    return p, d, delay, attrs


def _json_options(m: dict[str, Any], now: float) -> tuple[int, float, float, str | None]:
    """(priority, deadline, delay_s, attributes) of one message of a JSON batch."""
    p, d, delay = delivery_options(
        priority=m.get("priority"),
        deadline=m.get("deadline"),
        ttl_s=m.get("ttl_s"),
        delay_s=m.get("delay_s"),
        now=now,
    )
    return p, d, delay, encode_attributes(m.get("attributes"))


# The fields of a message in JSON: those of every message, and those of a queue's push
# (between nodes also `dedup`, a flag, and `tie`, a tied copy's token: _batch_wire), of a
# publish or broadcast, and of a tied copy. Any other field is refused (400), `null` or not.
_MESSAGE_FIELDS = frozenset(
    {"body", "encoding", "content_type", "priority", "deadline", "ttl_s", "delay_s", "attributes"}
)
_PUSH_FIELDS = _MESSAGE_FIELDS | {"id", "dedup_id", "group"}
_FORWARDED_FIELDS = _PUSH_FIELDS | {"dedup", "tie"}
_PUBLISH_FIELDS = _MESSAGE_FIELDS | {"dedup_id"}
_TIED_FIELDS = _MESSAGE_FIELDS | {"queue"}


def _batch_items(
    queue: str,
    payload: Any,
    max_messages: int,
    max_bytes: int,
    forwarded: bool,
    owner: Callable[[str], str],
    fields: frozenset[str] = _PUSH_FIELDS,
) -> list[PushItem]:
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        raise BadRequest('expected {"messages": [{"body": ..., "encoding": ...}, ...]}')
    _known_fields(payload, frozenset({"messages"}))
    if forwarded:
        fields |= _FORWARDED_FIELDS
    raw = payload["messages"]
    if not raw:
        raise BadRequest("messages: expected at least one message")
    if len(raw) > max_messages:
        raise BatchTooLarge(f"{len(raw)} messages is over the batch limit of {max_messages}")
    items: list[PushItem] = []
    now = time.time()
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidMessage(f"messages[{i}]: expected an object")
        _known_fields(m, fields, f"messages[{i}]: ")
        try:
            body = decode_body(m.get("body"), m.get("encoding", "utf-8"), max_bytes)
            dedup_id = m.get("dedup_id")
            group = m.get("group")
            if group is None:
                mid = _item_id(queue, m.get("id"), dedup_id)
            else:
                group = validate_group(group)
                mid = _group_item_id(queue, group, m.get("id"), dedup_id, owner, forwarded)
            options = _json_options(m, now)
        except ZdmqError as e:
            e.message = f"messages[{i}]: {e.message}"
            raise
        ctype = m.get("content_type")
        if ctype is not None:
            try:
                validate_content_type(ctype)
                validate_body_type(body, ctype)
            except ZdmqError as e:
                e.message = f"messages[{i}].{e.message}"
                raise
        # Between nodes a dedup message travels by id, flagged (see _batch_wire).
        dedup = dedup_id is not None or (forwarded and m.get("dedup") is True)
        # Between nodes a tied copy carries its tie's token (POST /v1/tied makes them).
        tie = _tie_token(m["tie"]) if forwarded and m.get("tie") is not None else None
        items.append(PushItem(mid, body, ctype, dedup, *options, group, tie))
    return items


def _frame_items(
    queue: str,
    raw: bytes,
    max_messages: int,
    max_bytes: int,
    forwarded: bool,
    owner: Callable[[str], str],
) -> list[PushItem]:
    """The messages of a binary push batch (docs/api.md), all checked before any is stored."""
    b = decode_batch(raw, max_count=max_messages)
    if b.count == 0:
        raise BadRequest("messages: expected at least one message")
    bodies = b.bodies
    if bodies is None or b.receipts is not None or b.receive_counts is not None:
        raise BadRequest(
            "a push batch frame has bodies and optionally ids, content_types and dedup_ids"
        )
    if max(map(len, bodies)) > max_bytes:
        i, body = next((i, x) for i, x in enumerate(bodies) if len(x) > max_bytes)
        raise MessageTooLarge(
            f"messages[{i}]: message of {len(body)} bytes is over the {max_bytes}-byte limit"
        )
    n = b.count
    ids = b.ids
    if b.content_types is not None:
        _check_content_types(b.content_types)
        _check_json_bodies(bodies, b.content_types)
    ctypes = b.content_types or [None] * n
    dedups = b.dedup_ids
    options = _frame_options(b)
    groups = b.groups
    if ids is not None and dedups is None and None not in ids and options is None and not groups:
        # The common case: the client gave every id.
        rows = zip(
            ids,
            bodies,
            ctypes,
            repeat(False),
            repeat(0),
            repeat(0.0),
            repeat(0.0),
            repeat(None),
            repeat(None),
            repeat(None),
        )
        return list(map(PushItem._make, rows))
    items: list[PushItem] = []
    for i in range(n):
        dedup_id = dedups[i] if dedups is not None else None
        group = groups[i] if groups is not None else None
        given = ids[i] if ids is not None else None
        try:
            if group is None:
                mid = _item_id(queue, given, dedup_id)
            else:
                group = validate_group(group)
                mid = _group_item_id(queue, group, given, dedup_id, owner, forwarded)
        except ZdmqError as e:
            e.message = f"messages[{i}]: {e.message}"
            raise
        extra = options[i] if options is not None else (0, 0.0, 0.0, None)
        items.append(PushItem(mid, bodies[i], ctypes[i], dedup_id is not None, *extra, group))
    return items


def _frame_options(b: Batch) -> list[tuple[int, float, float, str | None]] | None:
    """Each message's (priority, deadline, delay_s, attributes) of a push frame, checked;
    None when the frame has none of those columns."""
    columns = (b.priorities, b.deadlines, b.ttls, b.delays, b.attributes)
    if all(c is None for c in columns):
        return None
    n, now = b.count, time.time()
    out = []
    for i in range(n):
        try:
            deadline = b.deadlines[i] if b.deadlines is not None else 0.0
            ttl = b.ttls[i] if b.ttls is not None else 0.0
            delay = b.delays[i] if b.delays is not None else 0.0
            p, d, delay = delivery_options(
                priority=b.priorities[i] if b.priorities is not None else None,
                deadline=deadline or None,
                ttl_s=ttl or None,
                delay_s=delay or None,
                now=now,
            )
            attrs = None
            if b.attributes is not None and b.attributes[i] is not None:
                try:
                    parsed = orjson.loads(b.attributes[i] or "")
                except orjson.JSONDecodeError:
                    raise InvalidAttributes("attributes: expected a JSON object") from None
                attrs = encode_attributes(parsed)
        except ZdmqError as e:
            e.message = f"messages[{i}]: {e.message}"
            raise
        out.append((p, d, delay, attrs))
    return out


def _check_content_types(ctypes: Sequence[str | None]) -> None:
    """Every content type of a batch frame is a media type (`validate_content_type`),
    each distinct one checked once; the first bad one is named by its index."""
    for ctype in set(ctypes) - {None}:
        try:
            validate_content_type(ctype)
        except ZdmqError as e:
            e.message = f"messages[{ctypes.index(ctype)}].{e.message}"
            raise


def _check_json_bodies(bodies: Sequence[bytes], ctypes: Sequence[str | None]) -> None:
    """Every body of a batch frame whose content type is JSON is JSON (validate_body_type);
    the first that is not is named by its index."""
    json_types = {c for c in set(ctypes) - {None} if c is not None and is_json_type(c)}
    if not json_types:
        return
    for i, (body, ctype) in enumerate(zip(bodies, ctypes, strict=True)):
        if ctype in json_types:
            try:
                validate_body_type(body, ctype)
            except ZdmqError as e:
                e.message = f"messages[{i}].{e.message}"
                raise


def _item_id(queue: str, mid: Any, dedup_id: Any) -> str:
    """The id a batch item is stored under: its own (checked), its dedup id's, or ""
    for a fresh one (`_fresh_ids` draws those for the whole batch). Given both an id and
    a dedup id, the message keeps its id, deduplicated within the dedup window as a dedup
    id's would be (the dedup id is checked, and flags the item)."""
    derived = dedup_message_id(queue, dedup_id) if dedup_id is not None else ""
    return validate_message_id(mid) if mid is not None else derived


def _fresh_ids(items: list[PushItem], owner: Callable[[str], str]) -> list[PushItem]:
    """The batch with ids for the messages that came without one, all on one node drawn
    at random (new_message_ids): one call to one node stores them, not one per node."""
    n = sum(not item.id for item in items)
    if n == 0:
        return items
    fresh = iter(new_message_ids(n, owner))
    return [item if item.id else item._replace(id=next(fresh)) for item in items]


def _batch_wire(items: list[PushItem]) -> dict[str, Any]:
    wire = []
    for item in items:
        m: dict[str, Any] = message_to_wire(item.id, item.body, item.content_type)
        if item.dedup:
            m["dedup"] = True
        if item.priority:
            m["priority"] = item.priority
        if item.deadline:
            m["deadline"] = item.deadline
        if item.delay_s:
            m["delay_s"] = item.delay_s
        if item.attributes is not None:
            m["attributes"] = decode_attributes(item.attributes)
        if item.group is not None:
            m["group"] = item.group
        if item.tie is not None:
            m["tie"] = item.tie
        wire.append(m)
    return {"messages": wire}


async def _store_items(node: Node, queue: str, items: list[PushItem]) -> int:
    """Stores `items` in `queue` on the nodes that own their ids: here, and one call to
    each other owner, all in parallel. Returns how many were repeats (stored nothing)."""
    by_owner: defaultdict[str, list[PushItem]] = defaultdict(list)
    for item in items:
        by_owner[node.placement.owner(item.id)].append(item)

    async def store(owner: str, part: list[PushItem]) -> int:
        if owner == node.id:
            return sum(await node.push_local(queue, part))
        path = f"/v1/queues/{queue}/batch"
        if any([item.dedup for item in part]):
            # A frame carries a dedup id, not the id derived from it: JSON says "dedup".
            reply = await node.peer_call(owner, "POST", path, json=_batch_wire(part))
        else:
            ids, bodies, ctypes, _, prios, deadlines, delays, attrs, groups, _ = zip(
                *part, strict=True
            )
            frame = encode_batch(
                ids=ids,
                bodies=bodies,
                content_types=ctypes,
                priorities=prios,
                deadlines=deadlines,
                delays=delays,
                attributes=attrs,
                groups=groups,
            )
            reply = await node.peer_call(owner, "POST", path, data=frame, headers=_FRAME)
        return int(reply.json().get("duplicates", 0))

    return sum(await asyncio.gather(*(store(o, part) for o, part in by_owner.items())))


# A tie's token (POST /v1/tied), which each of its copies carries between nodes.
_TIE_TOKEN = re.compile(r"[A-Za-z0-9_\-]{1,64}")


def _tie_token(value: Any) -> str:
    if not isinstance(value, str) or not _TIE_TOKEN.fullmatch(value):
        raise BadRequest(f"token {str(value)[:80]!r}: expected 1..64 of [A-Za-z0-9_-]")
    return value
