"""Wire models and the pure functions that encode and check them.

Bodies are bytes everywhere inside zdmq. On JSON calls a body travels as text with an
`encoding`: "utf-8" when the bytes are valid UTF-8, else "base64". These functions
take and return plain values; they never touch sockets and are tested without them.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from zdmq.errors import BadRequest, InvalidMessage, InvalidQueueName, MessageTooLarge

__all__ = [
    "AckResult",
    "Message",
    "QueueSettings",
    "QueueStats",
    "ReceivedMessage",
    "decode_body",
    "dedup_message_id",
    "encode_body",
    "make_receipt",
    "message_from_wire",
    "message_to_wire",
    "new_message_id",
    "parse_receipt",
    "received_from_wire",
    "validate_message_id",
    "validate_queue_name",
]

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
ENCODINGS = ("utf-8", "base64")


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message."""

    id: str
    body: bytes
    content_type: str | None = None

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

    @property
    def visible(self) -> int:
        return self.messages - self.in_flight - self.delayed


# Bounds of the per-queue settings (SQS's where they exist).
MAX_VISIBILITY_S = 43_200.0
MAX_RETENTION_S = 14 * 86_400.0
MAX_DEDUP_WINDOW_S = 86_400.0
MAX_RECEIVES = 1_000
# Bounds of a receive and of a long poll.
MAX_RECEIVE = 100
MAX_WAIT_S = 20.0
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
        settings = cls(**kw)
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
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or not lo <= value <= hi:
        raise BadRequest(f"{name}: expected {kind} in {_num(lo)}..{_num(hi)}, got {value!r}")
    return float(value)


def validate_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise InvalidQueueName(f"queue name {name!r} must match [A-Za-z0-9_.-]{{1,128}}")
    if name in (".", ".."):
        # URL paths normalise these away: /v1/queues/.. could never reach the queue.
        raise InvalidQueueName(f"queue name {name!r} is reserved (a URL path segment)")
    return name


def new_message_id() -> str:
    return str(uuid.uuid4())


# Namespace of the ids derived from dedup ids (uuid5 of queue and dedup id).
_DEDUP_NAMESPACE = uuid.UUID("6d1c6a52-3f0b-5b7e-9a52-7a646d712d31")


def dedup_message_id(queue: str, dedup_id: str) -> str:
    """The message id a `dedup_id` maps to: the same on every retry, so it lands on one node."""
    if not isinstance(dedup_id, str) or not 1 <= len(dedup_id) <= 256:
        raise InvalidMessage("dedup_id: expected a string of 1..256 characters")
    return str(uuid.uuid5(_DEDUP_NAMESPACE, f"{queue}\x00{dedup_id}"))


def make_receipt(msg_id: str, token: str) -> str:
    """A receipt names its message id first, so it routes zero-hop to the message's node."""
    return f"{msg_id}.{token}"


def parse_receipt(receipt: Any) -> tuple[str, str]:
    """(message id, lease token) of a receipt; InvalidMessage if it is not one."""
    if not isinstance(receipt, str) or receipt.count(".") != 1:
        raise InvalidMessage(f"receipt {receipt!r} is not a zdmq receipt")
    mid, token = receipt.split(".")
    try:
        validate_message_id(mid)
    except InvalidMessage:
        raise InvalidMessage(f"receipt {receipt!r} is not a zdmq receipt") from None
    if not 1 <= len(token) <= 64 or not (token.isascii() and token.isalnum()):
        raise InvalidMessage(f"receipt {receipt!r} is not a zdmq receipt")
    return mid, token


ReceiptRef = tuple[str, str, str]  # (receipt, message id, lease token)


def group_receipts(
    receipts: Iterable[Any], owner_of: Callable[[str], str]
) -> tuple[dict[str, list[ReceiptRef]], dict[str, str]]:
    """Receipts by the node that owns their message id, and the malformed ones
    (receipt -> "invalid_receipt"), which are reported rather than refused."""
    by_owner: dict[str, list[ReceiptRef]] = {}
    invalid: dict[str, str] = {}
    for r in receipts:
        try:
            mid, token = parse_receipt(r)
        except InvalidMessage:
            invalid[str(r)] = "invalid_receipt"
            continue
        by_owner.setdefault(owner_of(mid), []).append((r, mid, token))
    return by_owner, invalid


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def validate_message_id(value: str) -> str:
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
        try:
            body = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidMessage("body: not valid base64") from None
    else:
        raise InvalidMessage(f"encoding: expected 'utf-8' or 'base64', got {encoding!r}")
    if len(body) > max_bytes:
        raise MessageTooLarge(f"message of {len(body)} bytes is over the {max_bytes}-byte limit")
    return body


def message_to_wire(msg_id: str, body: bytes, content_type: str | None = None) -> dict[str, str]:
    text, encoding = encode_body(body)
    m = {"id": msg_id, "body": text, "encoding": encoding}
    if content_type is not None:
        m["content_type"] = content_type
    return m


def message_from_wire(item: Any) -> Message:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise InvalidMessage("reply message: expected an object with id, body, encoding")
    body = decode_body(item.get("body"), item.get("encoding", "utf-8"), 1 << 62)
    return Message(item["id"], body, item.get("content_type"))


def received_from_wire(item: Any) -> ReceivedMessage:
    m = message_from_wire(item)
    receipt, count = item.get("receipt"), item.get("receive_count")
    if not isinstance(receipt, str) or not isinstance(count, int):
        raise InvalidMessage("reply message: expected a receipt and a receive_count")
    return ReceivedMessage(m.id, m.body, receipt, count, m.content_type)
