"""Wire models and the pure functions that encode and check them.

Bodies are bytes everywhere inside zdmq. On JSON calls a body travels as text with an
`encoding`: "utf-8" when the bytes are valid UTF-8, else "base64". These functions
take and return plain values; they never touch sockets and are tested without them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
import sys
import uuid
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from itertools import accumulate, pairwise
from typing import Any

import orjson

from zdmq.errors import (
    BadRequest,
    BatchTooLarge,
    InvalidAttributes,
    InvalidMessage,
    InvalidQueueName,
    MessageTooLarge,
)

__all__ = [
    "BATCH_CONTENT_TYPE",
    "AckResult",
    "Batch",
    "Message",
    "Published",
    "QueueSettings",
    "QueueStats",
    "ReceivedMessage",
    "attributes_header",
    "content_dedup_id",
    "copy_message_id",
    "decode_attributes",
    "decode_batch",
    "decode_body",
    "dedup_message_id",
    "delivery_options",
    "encode_attributes",
    "encode_batch",
    "encode_body",
    "fifo_message_id",
    "group_key",
    "is_json_type",
    "make_receipt",
    "message_from_wire",
    "message_to_wire",
    "messages_of_batch",
    "new_message_id",
    "new_message_ids",
    "new_message_ids_on",
    "parse_receipt",
    "received_from_wire",
    "received_of_batch",
    "validate_body_type",
    "validate_content_type",
    "validate_group",
    "validate_message_id",
    "validate_queue_name",
]

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
# A media type as RFC 9110 §8.3.1 writes it: type "/" subtype *( OWS ";" OWS parameter ),
# parameter = token "=" ( token / quoted-string ), in visible ASCII and spaces only (no
# tabs, which RFC 9110 allows). A message's content type goes back out as a reply
# header, so nothing else may be stored.
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
_MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?: *; *{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*")
MAX_CONTENT_TYPE_CHARS = 256
ENCODINGS = ("utf-8", "base64")
# Base64 as RFC 4648 §4 writes it: whole quanta, the last one padded with "=", nothing
# else (no line breaks, no missing or extra padding, nothing after it).
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message."""

    id: str
    body: bytes
    content_type: str | None = None
    attributes: dict[str, str] = field(default_factory=dict, hash=False)
    priority: int = 0
    group: str | None = None  # its FIFO group (a FIFO queue's message)

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """One leased delivery: ack it with `receipt` before the lease runs out."""

    id: str
    body: bytes
    receipt: str
    receive_count: int
    content_type: str | None = None
    attributes: dict[str, str] = field(default_factory=dict, hash=False)
    priority: int = 0
    group: str | None = None  # its FIFO group (a FIFO queue's message)

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)


@dataclass(frozen=True, slots=True)
class AckResult:
    """The verdict on a batch of receipts (ack, nack or extend)."""

    done: int
    failed: dict[str, str] = field(default_factory=dict)  # receipt -> error code

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    messages: int
    nodes: tuple[str, ...]
    depth: dict[str, int]
    in_flight: int = 0
    delayed: int = 0
    dead_lettered: int = 0
    expired: int = 0

    @property
    def visible(self) -> int:
        return self.messages - self.in_flight - self.delayed


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish or a broadcast stored: `count` queues got copies of the `messages`
    message(s); `ids` names each queue's copies (in the order of the messages) and
    `duplicates` how many were repeats of a retry that stored nothing; `missing` names
    subscribed queues that no longer exist (skipped)."""

    count: int
    messages: int
    ids: dict[str, list[str]]
    duplicates: dict[str, int]
    missing: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, j: dict[str, Any]) -> Published:
        queues = j.get("queues", {})
        return cls(
            count=int(j["count"]),
            messages=int(j["messages"]),
            ids={q: list(v["ids"]) for q, v in queues.items()},
            duplicates={q: int(v["duplicates"]) for q, v in queues.items()},
            missing=tuple(j.get("missing", ())),
        )


# Bounds of the per-queue settings (SQS's where they exist).
MAX_VISIBILITY_S = 43_200.0
MAX_RETENTION_S = 14 * 86_400.0
MAX_DEDUP_WINDOW_S = 86_400.0
MAX_RECEIVES = 1_000
# Bounds of a receive and of a long poll.
MAX_RECEIVE = 100
MAX_WAIT_S = 20.0
# Bounds of a message's delivery options.
MAX_PRIORITY = 9
MAX_DELAY_S = 900.0
MAX_TTL_S = MAX_RETENTION_S
MAX_ATTRIBUTES = 16
MAX_ATTRIBUTE_KEY_CHARS = 128
MAX_ATTRIBUTE_VALUE_CHARS = 1024


def encode_attributes(attributes: Any) -> str | None:
    """The stored form (compact JSON) of a message's attributes, None for none;
    InvalidAttributes naming what is wrong otherwise."""
    if attributes is None or attributes == {}:
        return None
    if not isinstance(attributes, dict):
        raise InvalidAttributes("attributes: expected an object of string keys and values")
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidAttributes(
            f"attributes: {len(attributes)} pairs is over the limit of {MAX_ATTRIBUTES}"
        )
    for k, v in attributes.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidAttributes(f"attributes: {k!r}: keys and values must be strings")
        try:
            k.encode(), v.encode()
        except UnicodeEncodeError:
            raise InvalidAttributes(f"attributes: {k[:40]!r}: not valid UTF-8") from None
        # Lengths in characters (code points), as JSON Schema's minLength and maxLength
        # count them: the document's limits are the node's.
        if not 1 <= len(k) <= MAX_ATTRIBUTE_KEY_CHARS:
            raise InvalidAttributes(
                f"attributes: key {k[:40]!r}: expected 1..{MAX_ATTRIBUTE_KEY_CHARS} characters"
            )
        if len(v) > MAX_ATTRIBUTE_VALUE_CHARS:
            raise InvalidAttributes(
                f"attributes: value of {k[:40]!r}: {len(v)} characters is over "
                f"{MAX_ATTRIBUTE_VALUE_CHARS}"
            )
    return orjson.dumps(attributes).decode()


def decode_attributes(text: str | None) -> dict[str, str]:
    return orjson.loads(text) if text else {}


def attributes_header(text: str) -> str:
    """Stored attributes as a header value: the same JSON object in ASCII (non-ASCII
    characters as \\u escapes), since a header carries visible ASCII."""
    return json.dumps(orjson.loads(text), separators=(",", ":"))


def delivery_options(
    *,
    priority: Any = None,
    deadline: Any = None,
    ttl_s: Any = None,
    delay_s: Any = None,
    now: float,
) -> tuple[int, float, float]:
    """(priority, deadline or 0, delay_s) of a push, checked; BadRequest naming the bad
    one. Given a deadline and a ttl_s, the message expires at the earlier of the two."""
    p = 0
    if priority is not None:
        p = int(_number({"priority": priority}, "priority", 0, MAX_PRIORITY, True))
    d = 0.0
    if deadline is not None:
        d = _number({"deadline": deadline}, "deadline", 1.0, 1e11)
    if ttl_s is not None:
        expires = now + _number({"ttl_s": ttl_s}, "ttl_s", 0.001, MAX_TTL_S)
        d = min(d, expires) if d else expires
    delay = 0.0
    if delay_s is not None:
        delay = _number({"delay_s": delay_s}, "delay_s", 0.0, MAX_DELAY_S)
    return p, d, delay


# What an ack, nack or extend reply calls the count of receipts that took effect.
SETTLED_KEY = {"ack": "acked", "nack": "nacked", "extend": "extended"}


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's delivery settings, fixed when it is created."""

    visibility_timeout_s: float = 30.0
    max_receives: int | None = None
    dead_letter_queue: str | None = None
    retention_s: float = 4 * 86_400.0
    dedup_window_s: float = 300.0
    max_message_bytes: int | None = None  # None: the cluster's limit
    # A FIFO queue: every message has a group, delivered in push order one at a time.
    fifo: bool = False
    # (FIFO queues) a message without a dedup_id is deduplicated by a hash of its body.
    content_based_dedup: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, payload: Any, *, max_message_bytes: int | None = None) -> QueueSettings:
        """Checks a settings object from a create call; every bad field names itself."""
        if payload is None:
            return cls()
        if not isinstance(payload, dict):
            raise BadRequest("queue settings: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise BadRequest(f"queue settings: unknown field(s) {unknown}; known: {sorted(known)}")
        kw: dict[str, Any] = {}
        if "visibility_timeout_s" in payload:
            kw["visibility_timeout_s"] = _number(
                payload, "visibility_timeout_s", 0.0, MAX_VISIBILITY_S
            )
        if payload.get("max_receives") is not None:
            kw["max_receives"] = int(_number(payload, "max_receives", 1, MAX_RECEIVES, True))
        if payload.get("dead_letter_queue") is not None:
            dlq = payload["dead_letter_queue"]
            if not isinstance(dlq, str):
                raise BadRequest("dead_letter_queue: expected a queue name")
            try:
                kw["dead_letter_queue"] = validate_queue_name(dlq)
            except InvalidQueueName as e:
                raise BadRequest(f"dead_letter_queue: {e.message}") from None
        if "retention_s" in payload:
            kw["retention_s"] = _number(payload, "retention_s", 1.0, MAX_RETENTION_S)
        if "dedup_window_s" in payload:
            kw["dedup_window_s"] = _number(payload, "dedup_window_s", 0.0, MAX_DEDUP_WINDOW_S)
        if payload.get("max_message_bytes") is not None:
            hi = max_message_bytes if max_message_bytes is not None else 1 << 62
            kw["max_message_bytes"] = int(_number(payload, "max_message_bytes", 1, hi, True))
        for flag in ("fifo", "content_based_dedup"):
            if payload.get(flag) is not None:
                if not isinstance(payload[flag], bool):
                    raise BadRequest(f"{flag}: expected true or false, got {payload[flag]!r}")
                kw[flag] = payload[flag]
        settings = cls(**kw)
        if settings.content_based_dedup and not settings.fifo:
            raise BadRequest("content_based_dedup is a setting of FIFO queues: give fifo: true")
        if settings.max_receives is not None and settings.dead_letter_queue is None:
            raise BadRequest(
                "max_receives needs a dead_letter_queue: zdmq never drops a message "
                "for having been received too often"
            )
        return settings


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _number(
    payload: dict[str, Any], name: str, lo: float, hi: float, integer: bool = False
) -> float:
    value = payload[name]
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and integer and isinstance(value, float):
        ok = value.is_integer()  # JSON has one number type: 8.0 is the integer 8
    if not ok or not math.isfinite(value) or not lo <= value <= hi:
        raise BadRequest(f"{name}: expected {kind} in {_num(lo)}..{_num(hi)}, got {value!r}")
    return float(value)


def validate_queue_name(name: Any) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise InvalidQueueName(f"queue name {name!r} must match [A-Za-z0-9_.-]{{1,128}}")
    if name in (".", ".."):
        # URL paths normalise these away: /v1/queues/.. could never reach the queue.
        raise InvalidQueueName(f"queue name {name!r} is reserved (a URL path segment)")
    return name


def validate_content_type(value: Any) -> str:
    """`value` if it is a media type a reply header can carry as it is (`_MEDIA_TYPE`, at
    most MAX_CONTENT_TYPE_CHARS characters); InvalidMessage otherwise."""
    ok = isinstance(value, str) and len(value) <= MAX_CONTENT_TYPE_CHARS
    if ok and _MEDIA_TYPE.fullmatch(value):
        return value
    shown = repr(value[:80] if isinstance(value, str) else value)
    raise InvalidMessage(
        f"content_type {shown}: expected a media type such as 'text/plain; charset=utf-8' "
        f"(visible ASCII and spaces, at most {MAX_CONTENT_TYPE_CHARS} characters)"
    )


def is_json_type(ctype: str) -> bool:
    """Whether a media type is JSON: a subtype `json` or one with the `+json` suffix
    (RFC 6839), such as application/json or application/problem+json."""
    subtype = ctype.partition(";")[0].partition("/")[2].strip().lower()
    return subtype == "json" or subtype.endswith("+json")


def validate_body_type(body: bytes, ctype: str | None) -> None:
    """A body whose content type is JSON is JSON (RFC 8259), else InvalidMessage: a
    delivery hands it on with that content type, so it must be what the type says. Other
    bodies are bytes the node does not read."""
    if ctype is not None and is_json_type(ctype):
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError:
            raise InvalidMessage(
                f"body: the content type {ctype[:80]!r} says JSON, but the body is not JSON"
            ) from None


_urandom = os.urandom
# The variant nibble of a UUID4 is 10xx: 8, 9, a or b, keeping the random low two bits.
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def new_message_id() -> str:
    """A random (version 4) UUID in canonical form: `str(uuid.uuid4())` at about a third
    of its cost (no UUID object), with the version and variant bits set the same way."""
    return _uuid4_at(_urandom(16).hex(), 0)


def _uuid4_at(h: str, i: int) -> str:
    """The UUID4 made of the 32 random hex digits of `h` at `i`."""
    return (
        f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-"
        f"{_VARIANT[h[i + 16]]}{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}"
    )


# How many ids new_message_ids draws per id it returns, at most (on average).
DRAWS_PER_ID = 32


def new_message_ids(n: int, owner: Callable[[str], str]) -> list[str]:
    """`n` fresh random message ids (as `new_message_id`) that all have one owner.

    The first id is drawn like any other, so its owner, the batch's node, is as random
    as a single message's (each node in proportion to the partitions it owns); the rest
    are drawn until `owner` names that node, about N draws an id on N nodes. A batch of
    fresh messages is then one call to one node rather than a part for every node, and
    every id still lives where its hash says (zero hop: anyone finds it from the id).

    The draws stop at `DRAWS_PER_ID` an id on average: on a cluster of more nodes than
    that, the ids they did not find are drawn as single ids are, each on its own owner.
    """
    if n <= 0:
        return []
    first = new_message_id()
    ids = [first]
    node = owner(first)
    budget = DRAWS_PER_ID * n
    while len(ids) < n:
        if budget <= 0:
            ids += [new_message_id() for _ in range(n - len(ids))]
            break
        budget -= 64
        _draw_onto(ids, n, owner, node)
    return ids


def _draw_onto(ids: list[str], n: int, owner: Callable[[str], str], node: str) -> None:
    """Appends to `ids`, up to `n` in all, those of 64 fresh random ids (one read of the
    random source) that `owner` places on `node`."""
    h = _urandom(16 * 64).hex()  # 64 candidates a read
    for i in range(0, 32 * 64, 32):
        mid = _uuid4_at(h, i)
        if owner(mid) == node:
            ids.append(mid)
            if len(ids) == n:
                return


# Namespace of the ids derived from dedup ids (uuid5 of queue and dedup id).
_DEDUP_NAMESPACE = uuid.UUID("6d1c6a52-3f0b-5b7e-9a52-7a646d712d31")


def dedup_message_id(queue: str, dedup_id: Any) -> str:
    """The message id a `dedup_id` maps to: the same on every retry, so it lands on one node."""
    if not isinstance(dedup_id, str) or not 1 <= len(dedup_id) <= 256:
        raise InvalidMessage("dedup_id: expected a string of 1..256 characters")
    return str(uuid.uuid5(_DEDUP_NAMESPACE, f"{queue}\x00{dedup_id}"))


# Copies that a publish or a broadcast stores in each queue (docs/design.md, Topics):
# a namespace of their own, so no queue push's dedup id can map to a copy's id.
_COPY_NAMESPACE = uuid.uuid5(_DEDUP_NAMESPACE, "zdmq copies")


def copy_message_id(source: str, queue: str, dedup_id: Any) -> str:
    """The id of the copy that a publish to topic `source` (or a broadcast: `source` "")
    with `dedup_id` stores in `queue`: the same on every retry, and a different one in
    each queue, so a retried publish stores each copy once."""
    if not isinstance(dedup_id, str) or not 1 <= len(dedup_id) <= 256:
        raise InvalidMessage("dedup_id: expected a string of 1..256 characters")
    return str(uuid.uuid5(_COPY_NAMESPACE, f"{source}\x00{queue}\x00{dedup_id}"))


_GROUP = re.compile(r"[!-~]{1,128}")
# Namespace of the ids of FIFO messages derived from a dedup id (or a body's hash).
_FIFO_NAMESPACE = uuid.uuid5(_DEDUP_NAMESPACE, "zdmq fifo")


def validate_group(value: Any) -> str:
    """`value` if it is a FIFO group: 1..128 visible ASCII characters (it travels in a
    header); BadRequest otherwise."""
    if isinstance(value, str) and _GROUP.fullmatch(value):
        return value
    shown = repr(value[:40] if isinstance(value, str) else value)
    raise BadRequest(f"group {shown}: expected 1..128 visible ASCII characters")


def group_key(queue: str, group: str) -> str:
    """The key whose owner keeps every message of FIFO group `group` of `queue`."""
    return f"{queue}\x00{group}"


def content_dedup_id(body: bytes) -> str:
    """The dedup id of a message of a queue with `content_based_dedup`: its body's hash."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def fifo_message_id(
    queue: str, group: str, dedup_id: Any, owner: Callable[[str], str], node: str
) -> str:
    """The message id a FIFO message with `dedup_id` is stored under: the same on every
    retry, and one that `owner` places on `node` (the owner of the group): uuid5 of
    queue, group, dedup id and a counter, the first of the counter's values that lands
    there (about N tries on N nodes)."""
    if not isinstance(dedup_id, str) or not 1 <= len(dedup_id) <= 256:
        raise InvalidMessage("dedup_id: expected a string of 1..256 characters")
    for i in range(1_000_000):
        mid = str(uuid.uuid5(_FIFO_NAMESPACE, f"{queue}\x00{group}\x00{dedup_id}\x00{i}"))
        if owner(mid) == node:
            return mid
    raise AssertionError(f"no id lands on {node}")  # pragma: no cover - 1e6 misses


def new_message_ids_on(n: int, owner: Callable[[str], str], node: str) -> list[str]:
    """`n` fresh random message ids that `owner` places on `node` (a FIFO group's
    owner): drawn until they land there, about N draws an id on N nodes."""
    ids: list[str] = []
    while len(ids) < n:
        _draw_onto(ids, n, owner, node)
    return ids


def make_receipt(msg_id: str, token: str) -> str:
    """A receipt names its message id first, so it routes zero-hop to the message's node."""
    return f"{msg_id}.{token}"


def parse_receipt(receipt: Any) -> tuple[str, str]:
    """(message id, lease token) of a receipt; InvalidMessage if it is not one."""
    m = _RECEIPT.fullmatch(receipt) if isinstance(receipt, str) else None
    if m is None:
        raise InvalidMessage(f"receipt {receipt!r} is not a zdmq receipt")
    return m[1], m[2]


ReceiptRef = tuple[str, str, str]  # (receipt, message id, lease token)


def group_receipts(
    receipts: Iterable[Any], owner_of: Callable[[str], str]
) -> tuple[dict[str, list[ReceiptRef]], dict[str, str]]:
    """Receipts by the node that owns their message id, and the malformed ones
    (receipt -> "invalid_receipt"), which are reported rather than refused."""
    by_owner: dict[str, list[ReceiptRef]] = {}
    invalid: dict[str, str] = {}
    match = _RECEIPT.fullmatch
    for r in receipts:
        m = match(r) if isinstance(r, str) else None
        if m is None:
            invalid[str(r)] = "invalid_receipt"
            continue
        mid = m[1]
        owner = owner_of(mid)
        part = by_owner.get(owner)
        if part is None:
            part = by_owner[owner] = []
        part.append((r, mid, m[2]))
    return by_owner, invalid


_UUID_RE = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_CANONICAL_UUID = re.compile(_UUID_RE)
# A receipt: a canonical message id, a dot, a token of 1..64 ASCII letters and digits.
_RECEIPT = re.compile(f"({_UUID_RE})\\.([A-Za-z0-9]{{1,64}})")


def validate_message_id(value: Any) -> str:
    """Message ids are canonical (lower-case, hyphenated) UUID strings."""
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value):
        return value  # the hot path: one regex instead of a UUID round trip
    try:
        canonical = str(uuid.UUID(value))
    except (ValueError, TypeError, AttributeError):
        raise InvalidMessage(f"message id {value!r} is not a UUID") from None
    if canonical != value:
        raise InvalidMessage(f"message id {value!r} is not in canonical form ({canonical})")
    return value


def encode_body(body: bytes) -> tuple[str, str]:
    """The (text, encoding) form of a body for a JSON reply."""
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(body).decode("ascii"), "base64"


def decode_body(text: Any, encoding: Any, max_bytes: int) -> bytes:
    if not isinstance(text, str):
        raise InvalidMessage("body: expected a string")
    if encoding == "utf-8":
        body = text.encode("utf-8")
    elif encoding == "base64":
        # b64decode alone would also take missing or extra padding and data after it.
        if not _BASE64.fullmatch(text):
            raise InvalidMessage("body: not valid base64")
        try:
            body = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):  # pragma: no cover - the pattern is stricter
            raise InvalidMessage("body: not valid base64") from None
    else:
        raise InvalidMessage(f"encoding: expected 'utf-8' or 'base64', got {encoding!r}")
    if len(body) > max_bytes:
        raise MessageTooLarge(f"message of {len(body)} bytes is over the {max_bytes}-byte limit")
    return body


def message_to_wire(msg_id: str, body: bytes, content_type: str | None = None) -> dict[str, Any]:
    text, encoding = encode_body(body)
    m = {"id": msg_id, "body": text, "encoding": encoding}
    if content_type is not None:
        m["content_type"] = content_type
    return m


def message_from_wire(item: Any) -> Message:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise InvalidMessage("reply message: expected an object with id, body, encoding")
    body = decode_body(item.get("body"), item.get("encoding", "utf-8"), 1 << 62)
    attrs = item.get("attributes")
    group = item.get("group")
    return Message(
        item["id"],
        body,
        item.get("content_type"),
        attrs if isinstance(attrs, dict) else {},
        int(item.get("priority", 0)),
        group if isinstance(group, str) else None,
    )


def received_from_wire(item: Any) -> ReceivedMessage:
    m = message_from_wire(item)
    receipt, count = item.get("receipt"), item.get("receive_count")
    if not isinstance(receipt, str) or not isinstance(count, int):
        raise InvalidMessage("reply message: expected a receipt and a receive_count")
    return ReceivedMessage(
        m.id, m.body, receipt, count, m.content_type, m.attributes, m.priority, m.group
    )


# ---- the binary batch format ---------------------------------------------------------------
# Batches of messages (push_many, and the replies of receive and pop_many) and of receipts
# (ack, nack, extend) in a compact columnar frame, for clients that ask for it with
# `Content-Type` / `Accept: application/x-zdmq-batch` (docs/api.md). No JSON, no base64:
# a batch of n messages is a few list operations, not n objects to parse.
#
#   frame   = "ZQB1" | count u32 | fields u32 | one column per field bit set, in bit order
#   ids     = count x 36 bytes: canonical UUIDs in ASCII, or 36 NUL bytes for "no id"
#   strings = count x u32 lengths (0xFFFFFFFF: none) | the values, concatenated
#   counts  = count x u32
#   times   = count x f64 (IEEE 754 little-endian)
# Integers are unsigned little-endian; the frame ends exactly where its last column does.
BATCH_CONTENT_TYPE = "application/x-zdmq-batch"
BATCH_IDS = 1  # ids column: message ids
BATCH_BODIES = 2  # strings column, none absent: message bodies
BATCH_CONTENT_TYPES = 4  # strings column (UTF-8): content types
BATCH_DEDUP_IDS = 8  # strings column (UTF-8): dedup ids (a pushed message with one has no id)
BATCH_RECEIPTS = 16  # strings column (ASCII): receipts
BATCH_RECEIVE_COUNTS = 32  # counts column: receive counts
BATCH_PRIORITIES = 64  # counts column: priorities (0..9)
BATCH_DEADLINES = 128  # times column: deadlines in unix seconds (0: none)
BATCH_TTLS = 256  # times column: ttl_s, seconds from the push (0: none)
BATCH_DELAYS = 512  # times column: delay_s
BATCH_ATTRIBUTES = 1024  # strings column (UTF-8): attributes, each a JSON object
BATCH_GROUPS = 2048  # strings column (ASCII): FIFO groups
_BATCH_FIELDS = (
    BATCH_IDS | BATCH_BODIES | BATCH_CONTENT_TYPES | BATCH_DEDUP_IDS | BATCH_RECEIPTS
) | (
    BATCH_RECEIVE_COUNTS
    | BATCH_PRIORITIES
    | BATCH_DEADLINES
    | BATCH_TTLS
    | BATCH_DELAYS
    | BATCH_ATTRIBUTES
    | BATCH_GROUPS
)
_BATCH_MAGIC = b"ZQB1"
_BATCH_HEAD = 12
_NONE = 0xFFFFFFFF
_NO_ID = "\x00" * 36
_IDS_COLUMN = re.compile(f"(?:{_UUID_RE}|\x00{{36}})*".encode())
_SWAP = sys.byteorder != "little"
assert array("I").itemsize == 4


@dataclass(slots=True)
class Batch:
    """The columns of one batch frame; a column the frame does not have is None."""

    count: int
    ids: list[str | None] | None = None
    bodies: list[bytes] | None = None
    content_types: list[str | None] | None = None
    dedup_ids: list[str | None] | None = None
    receipts: list[str | None] | None = None
    receive_counts: list[int] | None = None
    priorities: list[int] | None = None
    deadlines: list[float] | None = None
    ttls: list[float] | None = None
    delays: list[float] | None = None
    attributes: list[str | None] | None = None
    groups: list[str | None] | None = None


def _f64s(values: Iterable[float]) -> bytes:
    a = array("d", values)
    if _SWAP:  # pragma: no cover - no big-endian machine here
        a.byteswap()
    return a.tobytes()


def _u32s(values: Iterable[int]) -> bytes:
    a = array("I", values)
    if _SWAP:  # pragma: no cover - no big-endian machine here
        a.byteswap()
    return a.tobytes()


def _strings(values: Sequence[bytes | str | None]) -> list[bytes]:
    """A strings column: its lengths table and its data."""
    data = [v.encode() if isinstance(v, str) else v for v in values]
    lengths = _u32s([_NONE if v is None else len(v) for v in data])
    return [lengths, b"".join([v for v in data if v is not None])]


def encode_batch(
    *,
    ids: Sequence[str | None] | None = None,
    bodies: Sequence[bytes] | None = None,
    content_types: Sequence[str | None] | None = None,
    dedup_ids: Sequence[str | None] | None = None,
    receipts: Sequence[str | None] | None = None,
    receive_counts: Sequence[int] | None = None,
    priorities: Sequence[int] | None = None,
    deadlines: Sequence[float] | None = None,
    ttls: Sequence[float] | None = None,
    delays: Sequence[float] | None = None,
    attributes: Sequence[str | None] | None = None,
    groups: Sequence[str | None] | None = None,
) -> bytes:
    """A batch frame of the columns given (all of the same length). A column of
    optional strings that holds only None is left out: a reader takes it as all None;
    so is a column of priorities or times that holds only zeros (a reader that knows
    no priorities and deadlines reads such a frame as it always did)."""
    columns = (
        ids,
        bodies,
        content_types,
        dedup_ids,
        receipts,
        receive_counts,
        priorities,
        deadlines,
        ttls,
        delays,
        attributes,
        groups,
    )
    given = [c for c in columns if c is not None]
    count = len(given[0]) if given else 0
    if any(len(c) != count for c in given):
        raise ValueError("the columns of a batch must all have one value per message")
    fields = 0
    parts: list[bytes] = []
    if ids is not None:
        fields |= BATCH_IDS
        parts.append("".join([_NO_ID if i is None else i for i in ids]).encode("ascii"))
    if bodies is not None:
        fields |= BATCH_BODIES
        parts.append(_u32s([len(b) for b in bodies]))
        parts += bodies  # joined once, below: a 1 MiB body is copied once
    for bit, column in (
        (BATCH_CONTENT_TYPES, content_types),
        (BATCH_DEDUP_IDS, dedup_ids),
        (BATCH_RECEIPTS, receipts),
    ):
        if column is not None and any(v is not None for v in column):
            fields |= bit
            parts += _strings(column)
    if receive_counts is not None:
        fields |= BATCH_RECEIVE_COUNTS
        parts.append(_u32s(receive_counts))
    if priorities is not None and any(priorities):
        fields |= BATCH_PRIORITIES
        parts.append(_u32s(priorities))
    for bit, times in ((BATCH_DEADLINES, deadlines), (BATCH_TTLS, ttls), (BATCH_DELAYS, delays)):
        if times is not None and any(times):
            fields |= bit
            parts.append(_f64s(times))
    if attributes is not None and any(v is not None for v in attributes):
        fields |= BATCH_ATTRIBUTES
        parts += _strings(attributes)
    if groups is not None and any(v is not None for v in groups):
        fields |= BATCH_GROUPS
        parts += _strings(groups)
    return b"".join([_BATCH_MAGIC, _u32s((count, fields)), *parts])


def messages_of_batch(b: Batch) -> list[Message]:
    """The messages of a pop's reply frame; ValueError for one without ids or bodies."""
    if not b.count:
        return []
    ids, bodies = b.ids, b.bodies
    if ids is None or bodies is None or None in ids:
        raise ValueError("a pop or receive reply frame without ids or bodies")
    ctypes, attrs, prios, groups = _options_of(b)
    return [
        Message(mid, body, ctype, a, p, g)
        for mid, body, ctype, a, p, g in zip(ids, bodies, ctypes, attrs, prios, groups, strict=True)
    ]


def received_of_batch(b: Batch) -> list[ReceivedMessage]:
    """The leased messages of a receive's reply frame, or of a stream's messages frame;
    ValueError for one without ids, bodies or receipts."""
    if not b.count:
        return []
    ids, bodies = b.ids, b.bodies
    if ids is None or bodies is None or None in ids:
        raise ValueError("a pop or receive reply frame without ids or bodies")
    receipts, counts = b.receipts, b.receive_counts
    if receipts is None or counts is None or None in receipts:
        raise ValueError("a receive reply frame without receipts")
    ctypes, attrs, prios, groups = _options_of(b)
    return [
        ReceivedMessage(mid, body, receipt, count, ctype, a, p, g)
        for mid, body, receipt, count, ctype, a, p, g in zip(
            ids, bodies, receipts, counts, ctypes, attrs, prios, groups, strict=True
        )
    ]


def _options_of(
    b: Batch,
) -> tuple[Sequence[str | None], list[dict[str, str]], Sequence[int], Sequence[str | None]]:
    """A frame's content types, attributes, priorities and groups, one per message."""
    ctypes = b.content_types or [None] * b.count
    attrs = [decode_attributes(a) for a in b.attributes] if b.attributes else [{}] * b.count
    return ctypes, attrs, b.priorities or [0] * b.count, b.groups or [None] * b.count


def decode_batch(frame: bytes, *, max_count: int | None = None) -> Batch:
    """The columns of a batch frame; BadRequest naming what is wrong with a bad one (a
    short or long frame, an unknown field, a bad id, a string that is not UTF-8), and
    BatchTooLarge when it holds more than `max_count` messages."""
    if len(frame) < _BATCH_HEAD or frame[:4] != _BATCH_MAGIC:
        raise BadRequest(f"a {BATCH_CONTENT_TYPE} body starts with {_BATCH_MAGIC!r}, count, fields")
    count, fields = _read_u32s(frame, 4, 2)
    if fields & ~_BATCH_FIELDS:
        raise BadRequest(f"batch frame: unknown field bits {fields & ~_BATCH_FIELDS:#x}")
    if max_count is not None and count > max_count:
        raise BatchTooLarge(f"{count} messages is over the batch limit of {max_count}")
    batch = Batch(count)
    pos = _BATCH_HEAD
    n = len(frame)
    if fields & BATCH_IDS:
        end = pos + 36 * count
        if end > n:
            raise BadRequest("batch frame: the ids column is cut short")
        region = frame[pos:end]
        if not _IDS_COLUMN.fullmatch(region):
            raise BadRequest(f"batch frame: {_bad_id(region)}")
        text = region.decode("ascii")
        ids: list[str | None] = [text[i : i + 36] for i in range(0, 36 * count, 36)]
        if "\x00" in text:
            ids = [None if i == _NO_ID else i for i in ids]
        batch.ids = ids
        pos = end
    if fields & BATCH_BODIES:
        values, pos = _read_strings(frame, pos, count, "bodies")
        if None in values:
            raise BadRequest("batch frame: a message has no body")
        batch.bodies = values  # type: ignore[assignment]  # none is None (checked)
    for bit, name in (
        (BATCH_CONTENT_TYPES, "content_types"),
        (BATCH_DEDUP_IDS, "dedup_ids"),
        (BATCH_RECEIPTS, "receipts"),
    ):
        if fields & bit:
            raw, pos = _read_strings(frame, pos, count, name)
            setattr(batch, name, _texts(raw, name))
    if fields & BATCH_RECEIVE_COUNTS:
        if pos + 4 * count > n:
            raise BadRequest("batch frame: the receive_counts column is cut short")
        batch.receive_counts = _read_u32s(frame, pos, count).tolist()
        pos += 4 * count
    if fields & BATCH_PRIORITIES:
        if pos + 4 * count > n:
            raise BadRequest("batch frame: the priorities column is cut short")
        batch.priorities = _read_u32s(frame, pos, count).tolist()
        pos += 4 * count
    for bit, name in (
        (BATCH_DEADLINES, "deadlines"),
        (BATCH_TTLS, "ttls"),
        (BATCH_DELAYS, "delays"),
    ):
        if fields & bit:
            if pos + 8 * count > n:
                raise BadRequest(f"batch frame: the {name} column is cut short")
            a = array("d")
            a.frombytes(frame[pos : pos + 8 * count])
            if _SWAP:  # pragma: no cover - no big-endian machine here
                a.byteswap()
            setattr(batch, name, a.tolist())
            pos += 8 * count
    if fields & BATCH_ATTRIBUTES:
        raw, pos = _read_strings(frame, pos, count, "attributes")
        batch.attributes = _texts(raw, "attributes")
    if fields & BATCH_GROUPS:
        raw, pos = _read_strings(frame, pos, count, "groups")
        batch.groups = _texts(raw, "groups")
    if pos != n:
        raise BadRequest(f"batch frame: {n - pos} bytes after its last column")
    return batch


def _read_u32s(frame: bytes, pos: int, k: int) -> array[int]:
    a = array("I")
    a.frombytes(frame[pos : pos + 4 * k])
    if _SWAP:  # pragma: no cover - no big-endian machine here
        a.byteswap()
    return a


def _read_strings(frame: bytes, pos: int, count: int, name: str) -> tuple[list[bytes | None], int]:
    table_end = pos + 4 * count
    if table_end > len(frame):
        raise BadRequest(f"batch frame: the {name} column is cut short")
    lengths = _read_u32s(frame, pos, count)
    absent = _NONE in lengths
    sizes = [0 if k == _NONE else k for k in lengths] if absent else lengths.tolist()
    end = table_end + sum(sizes)
    if end > len(frame):
        raise BadRequest(f"batch frame: the {name} column is cut short")
    # Each value sliced straight from the frame: one copy of each body, not two.
    values: list[bytes | None] = [
        frame[a:b] for a, b in pairwise(accumulate(sizes, initial=table_end))
    ]
    if absent:
        values = [None if k == _NONE else v for k, v in zip(lengths, values, strict=True)]
    return values, end


def _texts(raw: list[bytes | None], name: str) -> list[str | None]:
    try:
        return [None if v is None else v.decode() for v in raw]
    except UnicodeDecodeError:
        raise BadRequest(f"batch frame: a value of {name} is not UTF-8") from None


def _bad_id(region: bytes) -> str:
    """Which id of an ids column is bad (for the error message)."""
    for i in range(0, len(region), 36):
        slot = region[i : i + 36]
        if not _IDS_COLUMN.fullmatch(slot):
            return f"ids[{i // 36}]: {slot!r} is not a canonical UUID"
    return "a bad id"  # pragma: no cover - the column as a whole did not match
