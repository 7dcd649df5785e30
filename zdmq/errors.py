"""Every error zdmq raises on purpose, one class per wire code.

    ZdmqError                      base; `status`, `code`, `retriable`
    ├── ConfigError                a bad cluster.yaml (never on the wire)
    ├── BadRequest            400  malformed request
    │   ├── InvalidQueueName  400
    │   ├── InvalidMessage    400  bad body, encoding, id or JSON
    │   └── BatchTooLarge     400  more messages than limits.max_batch_messages
    ├── Unauthorized          401  no credential, or one the node does not accept
    ├── Forbidden             403  a valid credential without the right for this call
    ├── QueueNotFound         404
    ├── TopicNotFound         404
    ├── SubscriptionNotFound  404  the queue is not subscribed to the topic
    ├── RouteNotFound         404  no such endpoint
    ├── MethodNotAllowed      405
    ├── RequestTimeout        408  a request head or body did not arrive in time
    ├── QueueExists           409
    ├── TopicExists           409
    ├── QueueLimitReached     409  the metadata owner keeps limits.max_queues queues already
    ├── MessageIdConflict     409  a caller-chosen id is stored in another queue
    ├── FifoConflict          409  a message or subscription that does not fit the queue's
    │                              kind (FIFO or not)
    ├── MessageTooLarge       413  a body over limits.max_message_bytes
    ├── Misrouted             421  a forwarded call reached a node that does not own the key
    ├── NotLeader             421  the node does not lead the replica group the call needs;
    │                              `leader` names the one it knows of (retriable there)
    ├── NodeUnavailable       503  a node the call needs is down or timed out (retriable)
    ├── StorageFailed         503  the node's storage refused a write (retriable elsewhere)
    ├── PublishIncomplete     503  some copies of a publish were not stored; `failed`
    │                              names the subscriptions (retry with the same dedup id)
    └── InternalError         500

The server's middleware turns any of these into `{"error": {"code", "message"}}` with
the class's status; the client turns the code back into the same class with `from_wire`.
Callers retry on `retriable`, never on message text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

__all__ = [
    "BadRequest",
    "BatchTooLarge",
    "ConfigError",
    "FifoConflict",
    "Forbidden",
    "InternalError",
    "InvalidAttributes",
    "InvalidMessage",
    "InvalidQueueName",
    "MapConflict",
    "MessageIdConflict",
    "MessageLeased",
    "MessageNotFound",
    "MessageTooLarge",
    "MethodNotAllowed",
    "Misrouted",
    "NodeConflict",
    "NodeNotFound",
    "NodeUnavailable",
    "NotLeader",
    "PublishIncomplete",
    "QueueExists",
    "QueueLimitReached",
    "QueueNotFound",
    "RequestTimeout",
    "RouteNotFound",
    "StorageFailed",
    "SubscriptionNotFound",
    "TieNotFound",
    "TopicExists",
    "TopicNotFound",
    "Unauthorized",
    "UpgradeRequired",
    "ZdmqError",
    "error_classes",
    "from_wire",
]

_BY_CODE: dict[str, type[ZdmqError]] = {}


class ZdmqError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "error"
    retriable: ClassVar[bool] = False
    #: The epoch of the cluster map the reply was served under (its `zdmq-epoch`
    #: header), on an error read off a node's reply.
    epoch: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            assert cls.code not in _BY_CODE, f"duplicate error code {cls.code}"
            _BY_CODE[cls.code] = cls

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code)
        self.message = message or self.code

    def to_wire(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


class ConfigError(ZdmqError, ValueError):
    code = "config_error"


class BadRequest(ZdmqError):
    status = 400
    code = "bad_request"


class InvalidQueueName(BadRequest):
    code = "invalid_queue_name"


class InvalidMessage(BadRequest):
    code = "invalid_message"


class InvalidAttributes(BadRequest):
    code = "invalid_attributes"


class BatchTooLarge(BadRequest):
    code = "batch_too_large"


class UpgradeRequired(ZdmqError):
    """A call that is a WebSocket (a consumer's stream) made as a plain HTTP call."""

    status = 426
    code = "upgrade_required"


class Unauthorized(ZdmqError):
    status = 401
    code = "unauthorized"


class Forbidden(ZdmqError):
    status = 403
    code = "forbidden"


class QueueNotFound(ZdmqError):
    status = 404
    code = "queue_not_found"


class TopicNotFound(ZdmqError):
    status = 404
    code = "topic_not_found"


class SubscriptionNotFound(ZdmqError):
    status = 404
    code = "subscription_not_found"


class RouteNotFound(ZdmqError):
    status = 404
    code = "not_found"


class MethodNotAllowed(ZdmqError):
    """`allow`: the methods the path takes, sent back in the reply's `Allow` header."""

    status = 405
    code = "method_not_allowed"

    def __init__(self, message: str = "", allow: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.allow = tuple(allow)


class RequestTimeout(ZdmqError):
    status = 408
    code = "request_timeout"


class MessageNotFound(ZdmqError):
    status = 404
    code = "message_not_found"


class TieNotFound(ZdmqError):
    status = 404
    code = "tie_not_found"


class MessageLeased(ZdmqError):
    status = 409
    code = "message_leased"


class QueueExists(ZdmqError):
    status = 409
    code = "queue_exists"


class TopicExists(ZdmqError):
    status = 409
    code = "topic_exists"


class QueueLimitReached(ZdmqError):
    status = 409
    code = "queue_limit_reached"


class MessageIdConflict(ZdmqError):
    status = 409
    code = "message_id_conflict"


class FifoConflict(ZdmqError):
    """The queue's kind refuses the call: a message with a group for a queue that is not
    FIFO; for a FIFO queue a message without a group, or with an id, priority, deadline,
    ttl or delay; a FIFO queue as a topic's subscription or a copy's queue. Whether a
    queue is FIFO is its state, not the request's shape: hence 409, not 400."""

    status = 409
    code = "fifo_conflict"


class NodeNotFound(ZdmqError):
    """A cluster change names a node the cluster map does not hold."""

    status = 404
    code = "node_not_found"


class NodeConflict(ZdmqError):
    """A cluster change the cluster's nodes refuse: an id in the map at another address,
    an address another node has, a removal that would leave fewer nodes than copies, or
    any change of a cluster that keeps one copy of each message."""

    status = 409
    code = "node_conflict"


class MapConflict(ZdmqError):
    """A change of the cluster map made from a map that another change replaced
    meanwhile: read the map again (`GET /v1/cluster`) and retry."""

    status = 409
    code = "map_conflict"


class MessageTooLarge(ZdmqError):
    status = 413
    code = "message_too_large"


class Misrouted(ZdmqError):
    status = 421
    code = "misrouted"


class NotLeader(ZdmqError):
    """The call needs replica group `group`, which this node does not lead now. `leader` is
    the member it knows leads (None while an election runs): the call goes there, with
    the group named in the `zdmq-group` header."""

    status = 421
    code = "not_leader"
    retriable = True

    def __init__(self, message: str = "", *, group: str = "", leader: str | None = None) -> None:
        super().__init__(message)
        self.group = group
        self.leader = leader

    def to_wire(self) -> dict[str, Any]:
        wire = super().to_wire()
        wire["error"].update(group=self.group, leader=self.leader)
        return wire


class NodeUnavailable(ZdmqError):
    status = 503
    code = "node_unavailable"
    retriable = True
    # True when the call surely did not run (nothing listened; a node refused it before
    # it ran, saying so on the wire with `"unsent": true`): safe to send again even when
    # running it twice would not be (a pop).
    unsent = False

    def to_wire(self) -> dict[str, Any]:
        wire = super().to_wire()
        if self.unsent:
            wire["error"]["unsent"] = True
        return wire


class StorageFailed(ZdmqError):
    status = 503
    code = "storage_failed"
    retriable = True


class PublishIncomplete(ZdmqError):
    """A publish stored its copies in some subscriptions but not in those `failed` names
    (each {"queue", "code", "message"}). A retry with the same dedup id stores the missing
    copies and no second copy of the others."""

    status = 503
    code = "publish_incomplete"
    # Not retried on its own: a publish without a dedup id would store a second copy in
    # the subscriptions that have one. Its caller retries with the same dedup id.

    def __init__(self, message: str = "", *, failed: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.failed = failed or []

    def to_wire(self) -> dict[str, Any]:
        wire = super().to_wire()
        wire["error"]["failed"] = self.failed
        return wire


class InternalError(ZdmqError):
    status = 500
    code = "internal"


def error_classes() -> dict[str, type[ZdmqError]]:
    """Every wire code and its class (for tests and documentation)."""
    return dict(_BY_CODE)


def from_wire(status: int, payload: Any) -> ZdmqError:
    """The typed error for a non-2xx reply; unknown codes fall back on the status."""
    code, message = None, ""
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        code = payload["error"].get("code")
        message = str(payload["error"].get("message", ""))
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = {
            400: BadRequest,
            401: Unauthorized,
            403: Forbidden,
            404: RouteNotFound,
            405: MethodNotAllowed,
            408: RequestTimeout,
            409: QueueExists,
            413: MessageTooLarge,
            421: Misrouted,
            503: NodeUnavailable,
        }.get(status, InternalError)
        message = message or f"HTTP {status}"
    if cls is PublishIncomplete:
        failed = payload["error"].get("failed")
        return PublishIncomplete(message, failed=failed if isinstance(failed, list) else [])
    if cls is NodeUnavailable:
        unavailable = NodeUnavailable(message)
        wire = payload.get("error") if isinstance(payload, dict) else None
        unavailable.unsent = isinstance(wire, dict) and wire.get("unsent") is True
        return unavailable
    if cls is NotLeader:
        err = payload["error"]
        group, leader = err.get("group"), err.get("leader")
        return NotLeader(
            message,
            group=group if isinstance(group, str) else "",
            leader=leader if isinstance(leader, str) else None,
        )
    return cls(message)
