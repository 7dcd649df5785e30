"""What the routes share: the keys under which make_app keeps the node's parts, the headers
a message travels with, who may call a route, how a request's parameters and body are read,
and how a call goes on to the node that owns it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson

from zdmq import _http
from zdmq.auth import NODE_AUTH_HEADER, ClientGuard, require, rights_on
from zdmq.errors import BadRequest, Misrouted
from zdmq.models import BATCH_CONTENT_TYPE, validate_queue_name
from zdmq.routing import GROUP_HEADER
from zdmq.server.http import Request, Response, json_response
from zdmq.server.node import FORWARDED_HEADER, Node
from zdmq.server.replicas import Member

# What make_app keeps in the app for the handlers: the node process's own `Node` and,
# with replication, its `Member`, and the rest.
NODE = "node"
MEMBER = "member"
BACKUPS = "backups"
CONFIG = "config"
CLIENTS = "clients"
METRICS = "metrics"
SAMPLER = "rate_sampler"
STATUS_POOL = "status_pool"
TOPOLOGY = "topology"
# `ZDMQ_METRICS=off` in a node's environment: no metrics kept, /metrics answers 404.
METRICS_ENV = "ZDMQ_METRICS"

# Who may call each route: OPEN (anyone), NODE_ONLY (another node), ANY_CLIENT (any
# valid token), CLUSTER_ADMIN (a token with `admin` on every queue: the prefix ""), or the
# right a token needs on the route's queue (docs/api.md).
OPEN, NODE_ONLY, ANY_CLIENT, CLUSTER_ADMIN = "open", "node", "any", "cluster_admin"
READ, WRITE, ADMIN = "read", "write", "admin"

ID_HEADER = "zdmq-id"
DEDUP_HEADER = "zdmq-dedup-id"
# A single push's delivery options, and a single pop's priority and attributes.
PRIORITY_HEADER = "zdmq-priority"
DEADLINE_HEADER = "zdmq-deadline"
TTL_HEADER = "zdmq-ttl-s"
DELAY_HEADER = "zdmq-delay-s"
ATTRIBUTES_HEADER = "zdmq-attributes"
# A FIFO queue's message's group (zdmq-group names a replica group: docs/design.md §15).
MESSAGE_GROUP_HEADER = "zdmq-message-group"
_OPTION_HEADERS = (PRIORITY_HEADER, DEADLINE_HEADER, TTL_HEADER, DELAY_HEADER, ATTRIBUTES_HEADER)


def _json(payload: Any, status: int = 200) -> Response:
    return json_response(payload, status)


async def _node(request: Request) -> Node:
    """The node that serves this call: the process's own, or with replication the replica
    group the call names (`zdmq-group`; else one this process leads). NotLeader when
    this process does not lead that group now: 421 to a caller that named the group, a
    relay to a leader for one that did not (relay.py)."""
    member: Member | None = request.app[MEMBER]
    if member is None:
        node: Node = request.app[NODE]
        return node
    return await member.serving(request.headers.get(GROUP_HEADER))


def _queue(request: Request) -> str:
    return validate_queue_name(request.match_info["queue"])


_DIGITS = re.compile(r"[0-9]{1,18}")
# What Python's repr() of a float can look like ("30.0", "1.5e-05", "0.0010000000000000002",
# "-0.0"): a range check follows, so of the negative ones only -0 passes it.
_DECIMAL = re.compile(r"-?(?:[0-9]{1,20}(?:\.[0-9]{0,24})?|\.[0-9]{1,24})(?:[eE][-+]?[0-9]{1,3})?")


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    return _integer(name, raw, lo, hi)


def _integer(name: str, raw: str, lo: int, hi: int) -> int:
    """An integer in a query parameter or a header: ASCII digits ("5"), or a decimal
    number that is a whole one ("5.0", "5e0": one number type, as in JSON). int() would
    also take "+5", "1_0", " 5" and non-ASCII digits."""
    if _DIGITS.fullmatch(raw):
        value = int(raw)
    elif _DECIMAL.fullmatch(raw) and (f := float(raw)).is_integer():
        value = int(f)
    else:
        raise BadRequest(f"{name}: expected an integer in {lo}..{hi}, got {raw[:40]!r}")
    if not lo <= value <= hi:
        raise BadRequest(f"{name}: expected an integer in {lo}..{hi}, got {raw[:40]}")
    return value


def _float_param(request: Request, name: str, lo: float, hi: float) -> float | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    # ASCII digits, an optional fraction and exponent: float() would also take "+5", "1_0",
    # "inf", "nan", spaces and non-ASCII digits.
    if not _DECIMAL.fullmatch(raw):
        raise BadRequest(f"{name}: expected a number in {lo:g}..{hi:g}, got {raw[:40]!r}")
    value = float(raw)
    if not lo <= value <= hi:
        raise BadRequest(f"{name}: expected a number in {lo:g}..{hi:g}, got {raw}")
    return value


def _float_field(payload: dict[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    value = payload.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise BadRequest(f"{name}: expected a number in {lo:g}..{hi:g}, got {value!r}")
    return float(value)


NO_BODY: Any = object()  # what `_json_body` gives for an empty body (JSON `null` is None)


async def _json_body(request: Request) -> Any:
    """The request body parsed as JSON, or `NO_BODY` when it is empty."""
    raw = await request.read()
    if not raw:
        return NO_BODY
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None


async def _json_object(request: Request) -> dict[str, Any]:
    """The request body, which must be a JSON object (else 400)."""
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


_FRAME = {"Content-Type": BATCH_CONTENT_TYPE}  # a node's batch frame to another node


def _is_frame(request: Request) -> bool:
    """Whether the request body is a binary batch frame (else JSON)."""
    ctype = request.headers.get("Content-Type")
    return ctype is not None and ctype.startswith(BATCH_CONTENT_TYPE)


def _wants_frame(request: Request) -> bool:
    """Whether the caller asked for a binary batch frame in reply (else JSON)."""
    accept = request.headers.get("Accept")
    return accept is not None and BATCH_CONTENT_TYPE in accept


def _forwarded(request: Request) -> bool:
    return FORWARDED_HEADER in request.headers


def _relay(reply: _http.Reply) -> Response:
    """A forwarded call's reply, passed back as it came."""
    headers = {}
    for name in (
        "Content-Type",
        ID_HEADER,
        "zdmq-receipt",
        "zdmq-receive-count",
        PRIORITY_HEADER,
        ATTRIBUTES_HEADER,
        MESSAGE_GROUP_HEADER,
    ):
        if name in reply.headers:
            headers[name] = reply.headers[name]
    return Response(status=reply.status, body=reply.body or None, headers=headers)


async def _forward(
    node: Node, owner: str, request: Request, body: bytes | None, *, on_behalf: bool = False
) -> Response:
    """Sends `request` on to `owner`, with this node's credential. `on_behalf`: with the
    caller's `Authorization` too, for a call whose right only the owner can check
    (`_check_rights` checks a token that comes with a node credential)."""
    if _forwarded(request):
        raise Misrouted(f"{node.id} does not own this call; {owner} does")
    headers = {}
    names = ("Content-Type", ID_HEADER, DEDUP_HEADER, *_OPTION_HEADERS)
    for name in (*names, "Authorization") if on_behalf else names:
        if name in request.headers:
            headers[name] = request.headers[name]
    reply = await node.peer_call(owner, request.method, request.path_qs, data=body, headers=headers)
    return _relay(reply)


def _visible(request: Request, names: list[str]) -> list[str]:
    """The queue or topic names a client's token has some right on (all of them for a
    node, or with auth off)."""
    clients: ClientGuard | None = request.app[CLIENTS]
    if clients is None or NODE_AUTH_HEADER in request.headers:
        return names
    token = clients.token(request.headers.get("Authorization"))
    return [n for n in names if rights_on(token, n)]


def _known_fields(payload: dict[str, Any], known: frozenset[str], where: str = "") -> None:
    """Refuses (400) a JSON object with a field the call does not read: a misspelt one
    must not be ignored in silence."""
    unknown = set(payload) - known
    if unknown:
        shown = [name[:40] for name in sorted(unknown)[:5]]
        raise BadRequest(f"{where}unknown field(s) {shown}; known: {sorted(known)}")


def _check_rights(request: Request, names: Iterable[str], right: str) -> None:
    """A client token's `right` on every queue in `names`. A node may do anything, unless
    it passes on its caller's token (`_forward(..., on_behalf=True)`): then that token's
    rights are checked here."""
    clients: ClientGuard | None = request.app[CLIENTS]
    if clients is None:
        return
    authorization = request.headers.get("Authorization")
    if NODE_AUTH_HEADER in request.headers and authorization is None:
        return
    token = clients.token(authorization)
    for name in names:
        require(token, name, right)
