"""zdmq: a distributed message queue on a zero-hop distributed hash table.

async with zdmq.Client.from_config("cluster.yaml") as c:
    await c.create_queue("jobs")
    await c.push("jobs", b"hello")
    msg = await c.pop("jobs")
"""

from zdmq.client import CallStats, Client, Consumer, Outcome
from zdmq.config import ClusterConfig, Limits, NodeConfig
from zdmq.errors import (
    BadRequest,
    BatchTooLarge,
    ConfigError,
    FifoConflict,
    Forbidden,
    InternalError,
    InvalidAttributes,
    InvalidMessage,
    InvalidQueueName,
    MessageIdConflict,
    MessageLeased,
    MessageNotFound,
    MessageTooLarge,
    MethodNotAllowed,
    Misrouted,
    NodeUnavailable,
    NotLeader,
    PublishIncomplete,
    QueueExists,
    QueueLimitReached,
    QueueNotFound,
    RequestTimeout,
    RouteNotFound,
    StorageFailed,
    SubscriptionNotFound,
    TieNotFound,
    TopicExists,
    TopicNotFound,
    Unauthorized,
    ZdmqError,
)
from zdmq.models import (
    AckResult,
    Message,
    Published,
    QueueSettings,
    QueueStats,
    ReceivedMessage,
)

__version__ = "0.1.0"

__all__ = [
    "AckResult",
    "BadRequest",
    "BatchTooLarge",
    "CallStats",
    "Client",
    "ClusterConfig",
    "ConfigError",
    "Consumer",
    "FifoConflict",
    "Forbidden",
    "InternalError",
    "InvalidAttributes",
    "InvalidMessage",
    "InvalidQueueName",
    "Limits",
    "Message",
    "MessageIdConflict",
    "MessageLeased",
    "MessageNotFound",
    "MessageTooLarge",
    "MethodNotAllowed",
    "Misrouted",
    "NodeConfig",
    "NodeUnavailable",
    "NotLeader",
    "Outcome",
    "PublishIncomplete",
    "Published",
    "QueueExists",
    "QueueLimitReached",
    "QueueNotFound",
    "QueueSettings",
    "QueueStats",
    "ReceivedMessage",
    "RequestTimeout",
    "RouteNotFound",
    "StorageFailed",
    "SubscriptionNotFound",
    "TieNotFound",
    "TopicExists",
    "TopicNotFound",
    "Unauthorized",
    "ZdmqError",
    "__version__",
]
