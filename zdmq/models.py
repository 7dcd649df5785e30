"""Wire models and the pure functions that encode and check them.

Bodies are bytes everywhere inside zdmq. On JSON calls a body travels as text with an
`encoding`: "utf-8" when the bytes are valid UTF-8, else "base64". These functions
take and return plain values; they never touch sockets and are tested without them.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from dataclasses import dataclass
from typing import Any

from zdmq.errors import InvalidMessage, InvalidQueueName, MessageTooLarge

__all__ = [
    "Message",
    "QueueStats",
    "decode_body",
    "encode_body",
    "message_from_wire",
    "message_to_wire",
    "new_message_id",
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
class QueueStats:
    queue: str
    messages: int
    nodes: tuple[str, ...]
    depth: dict[str, int]


def validate_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise InvalidQueueName(f"queue name {name!r} must match [A-Za-z0-9_.-]{{1,128}}")
    if name in (".", ".."):
        # URL paths normalise these away: /v1/queues/.. could never reach the queue.
        raise InvalidQueueName(f"queue name {name!r} is reserved (a URL path segment)")
    return name


def new_message_id() -> str:
    return str(uuid.uuid4())


def validate_message_id(value: str) -> str:
    """Message ids are canonical (lower-case, hyphenated) UUID strings."""
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
